// Package group carries many streams over one link, as SMC-R's link groups
// carry many sockets over one RDMA connection per pair of hosts: a stream
// costs no queue pair, no rdma_cm exchange and no registration of its own.
//
// A Mux runs over a base link (a link.Carrier: link.Pipe on the host, an
// RDMA queue pair in the lab) and makes Streams, each a link.Link of its
// own, so that the stream engine (internal/stream) and rdmanet.Conn run
// over a stream as over any link. Each stream has its own rings, window and
// credit, so one slow reader never holds up the others. The wire
// (docs/protocol.md, "Link groups"):
//
//   - A stream's data writes name it in the immediate (SendWR.Tag): its
//     slot at the receiver and the slot's generation (wire.StreamTag). The
//     byte count is the receive's own length.
//   - Its control messages name it in bytes 4-7, which the mux clears
//     before the stream's engine sees them.
//   - The group's own messages (wire.GroupMessage: open, accept, refuse,
//     close, closed) name stream 0 there.
//
// The base link's send queue, control slots and receives are the group's:
//
//   - A stream posts into a queue of its own in the mux; the mux posts the
//     streams' requests onto the base link round robin, one request at a
//     time, so a large writer never starves a small one.
//   - The base link's receives are a pool: a stream's peer holds credit
//     (link.Caps.RecvCredit and RecvGrant), granted from the pool as it
//     streams (link.PoolGrant), so a stream never sends a message that
//     finds no receive. A message beyond its credit fails that stream
//     alone (ReasonRNR).
//   - The group's own messages are requests (open, close), at most
//     groupRequests outstanding from each side, and their answers, so the
//     group reserves twice that many receives for them and needs no credit.
//
// One goroutine a group waits on the base link and hands each completion
// to its stream; a stream with no Read or Write in flight has none.
package group

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// groupRequests is how many group requests (StreamOpen, StreamClose) each
// side may have unanswered; the receives reserved for the group's messages
// are twice that (the peer's requests, and the answers to this side's).
const groupRequests = 8

// Config sizes a group's streams.
type Config struct {
	// SendRing and RecvRing are each stream's ring sizes.
	SendRing, RecvRing int
	// SendDepth and ControlDepth are each stream's Caps: its requests
	// outstanding, of which control messages.
	SendDepth, ControlDepth int
	// FirstGrant is the credit a stream's peer holds at first (its
	// Caps.RecvDepth), MaxGrant the most it may hold.
	FirstGrant, MaxGrant int
	// MaxStreams bounds the streams open at once (both sides' together);
	// past it, opens are refused with ReasonLimit.
	MaxStreams int
	// Backlog bounds the streams the peer opened that wait for Accept; 0
	// refuses every stream the peer opens (ReasonNoListener).
	Backlog int
	// Accepts, if set, says whether a stream for the listener's port may
	// be accepted; the others are refused with ReasonNoListener.
	Accepts func(port uint16) bool
	// IdleClose, if positive, closes the group once it has had no stream
	// for that long (a dialer's: its link holds a queue pair and a pool of
	// receives at both ends).
	IdleClose time.Duration
	// OnEnd, if set, is called once, on a goroutine of its own, when the
	// group ends other than by Close (its link failed or was
	// disconnected, or the peer broke the protocol): the owner closes it.
	OnEnd func(error)
}

// DefaultConfig is what a group's streams have unless told otherwise.
func DefaultConfig() Config {
	return Config{
		SendRing: 64 << 10, RecvRing: 64 << 10,
		SendDepth: 16, ControlDepth: 4,
		FirstGrant: 8, MaxGrant: 64,
		MaxStreams: 4096, Backlog: 128,
	}
}

// ErrDown is matched by the errors of a group whose base link ended, and
// by its streams' Failed completions then.
var ErrDown = errors.New("group: down")

// ErrClosed is matched by the errors of calls on a Mux that was closed.
var ErrClosed = fmt.Errorf("group: %w", net.ErrClosed)

// RefusedError is Open's error when the peer refused the stream.
type RefusedError struct{ Reason uint32 }

func (e *RefusedError) Error() string {
	return "group: stream refused: " + reasonText(e.Reason)
}

// ErrLimit is matched by Open's error when this side's own bound
// (MaxStreams, or receives for the first grant) refused the stream.
var ErrLimit = errors.New("group: stream limit reached")

func reasonText(r uint32) string {
	switch r {
	case wire.ReasonNoListener:
		return "nothing listens on the port"
	case wire.ReasonLimit:
		return "the peer's bound on streams or receives"
	case wire.ReasonMemory:
		return "the peer has no rings for it"
	case wire.ReasonBacklog:
		return "the listener's accept queue is full"
	case wire.ReasonRemoteAccess:
		return "a write outside the peer's rings"
	case wire.ReasonRNR:
		return "a message beyond the credit given"
	case wire.ReasonProtocol:
		return "a protocol error"
	}
	return fmt.Sprintf("reason %d", r)
}

// Stats are a group's counters.
type Stats struct {
	Streams                  int    // open now
	Opened, Accepted         uint64 // streams this side opened, and the peer opened
	Refused                  uint64 // opens this side refused
	Posted                   uint64 // requests posted on the base link
	MostQueued               int    // the most stream requests waiting in the mux at once
	Granted, Pool            int    // receives committed to streams, and the pool's size
	GroupMessages, Malformed uint64
}

// Mux is one side of a link group: the streams over one base link.
type Mux struct {
	base link.Carrier
	cfg  Config
	bc   link.Caps // the base link's
	pool int       // the base's receives for streams (the rest are the group's)
	done chan struct{}

	mu      sync.Mutex
	slots   []*Stream // by slot; slot 0 is never used
	gens    []uint8
	free    []uint32
	ports   uint16 // the last port given to a stream this side opened
	granted int    // receives committed to streams: credit held and receives taken

	// Sending: base requests outstanding, oldest first (fifo, head, n: a
	// ring of SendDepth), the base ID of the oldest, and who waits.
	fifo        []sent
	head, n     int
	firstID     uint64
	controls    int
	sinceSignal int
	ready       []*Stream           // streams with requests queued, in turn
	groupq      []wire.GroupMessage // group messages to post, before any stream's
	groupOut    int                 // this side's group requests unanswered
	groupWait   []wire.GroupMessage // requests waiting for groupOut to drop
	batch       []link.SendWR
	pumping     bool
	draining    bool
	cs          []link.Completion
	queued      int
	accepts     []*Stream // streams the peer opened, for Accept
	acceptReady chan struct{}

	err        error // the group ended: why
	closed     bool
	linkClosed bool // the base link was closed (closeLinkLocked)
	retiring   bool // Retire: no stream is accepted, and the last one's end closes the group
	idleSince  time.Time
	idleTimer  *time.Timer
	sent, hear time.Time // the last send completed and message arrived on the base
	stats      Stats
}

// sent is one base request outstanding.
type sent struct {
	s        *Stream // nil: a group message
	seq      uint64  // the stream's own sequence number of the request
	id       uint64  // the stream's ID for it
	signaled bool    // signaled at the stream
	control  bool
}

// New starts a group over base, whose receives are all posted and whose
// peer runs New too. It takes base over: Close closes it.
func New(base link.Carrier, cfg Config) (*Mux, error) {
	bc := base.Caps()
	if bc.SendDepth < 2 || bc.ControlDepth < 1 || bc.RecvDepth <= 2*groupRequests+cfg.FirstGrant {
		return nil, fmt.Errorf("group: base link %s too small: %+v", bc.Name, bc)
	}
	if cfg.SendRing <= 0 || cfg.RecvRing <= 0 || cfg.SendDepth <= 0 || cfg.ControlDepth <= 0 ||
		cfg.FirstGrant <= 0 || cfg.MaxGrant < cfg.FirstGrant || cfg.MaxStreams <= 0 || cfg.Backlog < 0 {
		return nil, fmt.Errorf("group: config %+v", cfg)
	}
	m := &Mux{
		base: base, cfg: cfg, bc: bc,
		pool:        bc.RecvDepth - 2*groupRequests,
		done:        make(chan struct{}),
		slots:       []*Stream{nil},
		gens:        []uint8{0},
		fifo:        make([]sent, bc.SendDepth),
		firstID:     1,
		acceptReady: make(chan struct{}, 1),
	}
	go m.run()
	return m, nil
}

// run waits on the base link and hands its completions to the streams,
// until the link ends or the mux closes.
func (m *Mux) run() {
	defer close(m.done)
	for {
		if !m.drain() {
			return
		}
		if err := m.base.Arm(); err != nil {
			m.end(err)
			return
		}
		if !m.drain() {
			return
		}
		err := m.base.Wait()
		m.mu.Lock()
		closed := m.closed
		m.mu.Unlock()
		if closed {
			return
		}
		if err != nil && !errors.Is(err, link.ErrWoken) {
			m.end(err)
			return
		}
	}
}

// drain polls the base link until it has nothing more; false once the
// group ended.
func (m *Mux) drain() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.drainLocked()
	return m.err == nil
}

// drainLocked hands every completion the base link has to its stream,
// then posts what waits.
func (m *Mux) drainLocked() {
	if m.draining {
		return // a stream's call from within a completion: the drain goes on after it
	}
	m.draining = true
	defer func() { m.draining = false }()
	if m.cs == nil {
		m.cs = make([]link.Completion, 64)
	}
	for m.err == nil {
		k, err := m.base.Poll(m.cs)
		if err != nil {
			m.endLocked(err)
			break
		}
		if k == 0 {
			break
		}
		for i := range k {
			m.completeLocked(&m.cs[i])
		}
		clear(m.cs[:k])
	}
	m.pumpLocked()
}

// completeLocked takes one completion of the base link.
func (m *Mux) completeLocked(c *link.Completion) {
	switch c.Kind {
	case link.SendDone:
		m.sent = time.Now()
		m.retireLocked(c.ID)
	case link.DataArrived:
		m.hear = time.Now()
		s, err := m.streamLocked(wire.StreamTag(c.Tag))
		if err == nil && s.peerDone() {
			err = fmt.Errorf("stream %#x after its peer's close", c.Tag)
		}
		if err != nil {
			m.protocolLocked(fmt.Errorf("data write: %w", err))
			return
		}
		s.arriveLocked(link.Completion{Kind: link.DataArrived, N: c.N})
	case link.ControlArrived:
		m.hear = time.Now()
		tag := wire.StreamOf(&c.Msg)
		if tag == 0 {
			m.groupMessageLocked(&c.Msg)
			return
		}
		s, err := m.streamLocked(tag)
		if err == nil && s.peerDone() {
			err = fmt.Errorf("stream %#x after its peer's close", uint32(tag))
		}
		if err != nil {
			m.protocolLocked(fmt.Errorf("control message: %w", err))
			return
		}
		if wire.IsGroupOp(wire.Opcode(uint16(c.Msg[0])<<8 | uint16(c.Msg[1]))) {
			m.protocolLocked(fmt.Errorf("a group message names stream %#x", uint32(tag)))
			return
		}
		msg := c.Msg
		wire.SetStream(&msg, 0)
		s.snoopLocked(&msg)
		s.arriveLocked(link.Completion{Kind: link.ControlArrived, Msg: msg})
	case link.Disconnected:
		m.endLocked(disconnected{fmt.Errorf("%w: %s disconnected", ErrDown, m.bc.Name)})
	case link.Failed:
		m.endLocked(fmt.Errorf("%w: %w", ErrDown, c.Err))
	default:
		m.endLocked(fmt.Errorf("%w: %s: completion %v", ErrDown, m.bc.Name, c.Kind))
	}
}

// streamLocked is the stream a tag names: a stream of this side whose
// peer may still send on it.
func (m *Mux) streamLocked(tag wire.StreamTag) (*Stream, error) {
	slot := tag.Slot()
	if slot == 0 || slot >= uint32(len(m.slots)) || m.slots[slot] == nil || m.gens[slot] != tag.Gen() {
		return nil, fmt.Errorf("stream %#x is not open", uint32(tag))
	}
	return m.slots[slot], nil
}

// protocolLocked ends the group for a message the protocol does not allow.
func (m *Mux) protocolLocked(err error) {
	m.stats.Malformed++
	m.endLocked(fmt.Errorf("group: %s: %w", m.bc.Name, &wire.ProtocolError{Reason: err.Error()}))
	m.base.Disconnect()
}

// repostLocked gives back n receives that messages took and no stream keeps.
func (m *Mux) repostLocked(n int) {
	if n > 0 && m.err == nil {
		if err := m.base.PostRecv(n); err != nil {
			m.endLocked(err)
		}
	}
}

// retireLocked ends the base requests up to id, whose SendDone came.
func (m *Mux) retireLocked(id uint64) {
	for m.n > 0 && m.firstID <= id {
		e := m.fifo[m.head]
		m.fifo[m.head] = sent{}
		m.head = (m.head + 1) % len(m.fifo)
		m.n--
		m.firstID++
		if e.control {
			m.controls--
		}
		if s := e.s; s != nil {
			s.inflight--
			if e.signaled {
				s.pushLocked(link.Completion{Kind: link.SendDone, ID: e.id}, e.seq)
			}
			s.settleLocked()
		}
	}
}

// sendGroupLocked sends a group message: an answer at once, a request when
// fewer than groupRequests are unanswered.
func (m *Mux) sendGroupLocked(g wire.GroupMessage) {
	if g.Op == wire.OpStreamOpen || g.Op == wire.OpStreamClose {
		if m.groupOut >= groupRequests {
			m.groupWait = append(m.groupWait, g)
			return
		}
		m.groupOut++
	}
	m.groupq = append(m.groupq, g)
	m.pumpLocked()
}

// answeredLocked: the peer answered one of this side's requests.
func (m *Mux) answeredLocked() error {
	if m.groupOut == 0 {
		return errors.New("an answer to no request")
	}
	m.requestDoneLocked()
	return nil
}

// requestDoneLocked frees a request's place among the groupRequests: the
// first request waiting for one takes it.
func (m *Mux) requestDoneLocked() {
	m.groupOut--
	if len(m.groupWait) > 0 {
		m.groupq = append(m.groupq, m.groupWait[0])
		m.groupWait = m.groupWait[1:]
		m.groupOut++
	}
}

// pumpLocked posts what waits, in one batch, while the base link has room:
// the group's messages first, then the streams' requests, one from each
// stream in turn. A group message that waits for a control slot holds the
// streams back too: an accepted stream's first message must not overtake
// its StreamAccept.
func (m *Mux) pumpLocked() {
	if m.err != nil || m.pumping {
		return
	}
	m.pumping = true
	defer func() { m.pumping = false }()
	m.batch = m.batch[:0]
	for m.n < len(m.fifo) {
		if len(m.groupq) > 0 {
			if m.controls >= m.bc.ControlDepth {
				break
			}
			m.postGroupLocked()
			continue
		}
		if !m.roundLocked() {
			break
		}
	}
	if len(m.batch) == 0 {
		return
	}
	m.stats.Posted += uint64(len(m.batch))
	if err := m.base.PostSend(m.batch); err != nil {
		m.endLocked(err)
	}
	clear(m.batch)
}

// postGroupLocked posts the first group message waiting.
func (m *Mux) postGroupLocked() {
	g := m.groupq[0]
	m.groupq = m.groupq[1:]
	var wr link.SendWR
	wr.Kind, wr.Signaled = link.SendControl, true
	g.Encode(&wr.Msg)
	m.postLocked(wr, sent{control: true})
	m.stats.GroupMessages++
	if g.Op != wire.OpStreamAccept {
		return
	}
	// The stream's own requests may follow now.
	if s, err := m.streamLocked(g.From); err == nil {
		s.announced = true
		if len(s.queued) > 0 && !s.inReady {
			s.inReady = true
			m.ready = append(m.ready, s)
		}
	}
}

// roundLocked posts one request of each stream that has one, in turn, as
// long as the base link has room; false if it posted nothing. A stream
// whose next request is a control message with no control slot free, or a
// StreamClose with too many group requests out, waits its next turn.
func (m *Mux) roundLocked() bool {
	posted := false
	for range len(m.ready) {
		if m.n >= len(m.fifo) || len(m.groupq) > 0 {
			break
		}
		s := m.ready[0]
		m.ready = m.ready[1:]
		if len(s.queued) == 0 {
			s.inReady = false
			continue
		}
		q := &s.queued[0]
		switch {
		case q.close != 0:
			// The stream's failure, told the peer in its order: after
			// every request it posted before.
			m.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamClose, To: s.peer, From: s.tag, Reason: q.close})
			s.closeSent = true
		case q.wr.Kind == link.SendControl && m.controls >= m.bc.ControlDepth:
			m.ready = append(m.ready, s)
			continue
		default:
			m.postLocked(q.wr, sent{s: s, seq: q.seq, id: q.wr.ID, signaled: q.wr.Signaled, control: q.wr.Kind == link.SendControl})
			s.inflight++
		}
		posted = true
		s.queued = s.queued[1:]
		m.queued--
		if len(s.queued) > 0 {
			m.ready = append(m.ready, s)
		} else {
			s.inReady = false
			s.queued = nil
			s.settleLocked()
		}
	}
	return posted
}

// postLocked adds one request to the batch, with the base ID that names it
// in the fifo. A request the stream did not signal is signaled anyway
// every half send queue, so that the base queue never fills with requests
// nothing retires.
func (m *Mux) postLocked(wr link.SendWR, e sent) {
	m.sinceSignal++
	if e.control || e.signaled || m.sinceSignal >= len(m.fifo)/2 {
		wr.Signaled = true
		m.sinceSignal = 0
	}
	wr.ID = m.firstID + uint64(m.n)
	m.fifo[(m.head+m.n)%len(m.fifo)] = e
	m.n++
	if e.control {
		m.controls++
	}
	m.batch = append(m.batch, wr)
}

// groupMessageLocked takes one of the group's own messages.
func (m *Mux) groupMessageLocked(b *[wire.MessageSize]byte) {
	m.repostLocked(1) // the group's receives are reserved, not credited
	g, err := wire.DecodeGroup(b)
	if err != nil {
		m.protocolLocked(err)
		return
	}
	switch g.Op {
	case wire.OpStreamOpen:
		m.openedByPeerLocked(g)
	case wire.OpStreamAccept, wire.OpStreamRefuse:
		if err := m.answeredLocked(); err != nil {
			m.protocolLocked(fmt.Errorf("%v: %w", g.Op, err))
			return
		}
		s, err := m.streamLocked(g.To)
		if err != nil || s.state != opening {
			m.protocolLocked(fmt.Errorf("%v for %#x, which opens nothing", g.Op, uint32(g.To)))
			return
		}
		if g.Op == wire.OpStreamRefuse {
			s.state = refused
			s.openErr = &RefusedError{Reason: g.Reason}
			s.peerClosed = true
			close(s.opened)
			if s.abandoned {
				s.closed = true // its opener gave up: nobody else will close it
			}
			m.maybeFreeLocked(s)
			return
		}
		s.acceptedLocked(g)
		s.announced = true
		close(s.opened)
		if s.abandoned {
			s.disconnectLocked()
			s.closed = true
		}
	case wire.OpStreamClose:
		s, err := m.streamLocked(g.To)
		if err != nil || s.peer != g.From || s.state != open || s.peerClosed {
			m.protocolLocked(fmt.Errorf("StreamClose for %#x from %#x: %v", uint32(g.To), uint32(g.From), err))
			return
		}
		s.peerClosed = true
		s.disconnecting = true
		m.dropQueuedLocked(s)
		m.unsendCloseLocked(s)
		if g.Reason == wire.ReasonNone {
			s.terminateLocked(link.Completion{Kind: link.Disconnected})
		} else {
			s.terminateLocked(link.Completion{Kind: link.Failed, Err: reasonError(g.Reason, "the peer")})
		}
		m.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamClosed, To: g.From, From: s.tag})
		m.maybeFreeLocked(s)
	case wire.OpStreamClosed:
		if err := m.answeredLocked(); err != nil {
			m.protocolLocked(fmt.Errorf("StreamClosed: %w", err))
			return
		}
		s, err := m.streamLocked(g.To)
		if err != nil || !s.closeSent || s.closeAnswered || s.peer != g.From {
			m.protocolLocked(fmt.Errorf("StreamClosed for %#x, which sent no StreamClose", uint32(g.To)))
			return
		}
		s.closeAnswered = true
		m.maybeFreeLocked(s)
	}
}

// unsendCloseLocked takes back a StreamClose of s's that waits to be
// posted, when the peer's StreamClose came first: the answer this side
// sends to it is an answer, posted before any waiting request, and once
// the peer has it the peer gives the slot back, so a StreamClose after it
// would name a stream that is not open. The peer's close ends the stream
// for both sides; only one that already went is answered.
func (m *Mux) unsendCloseLocked(s *Stream) {
	if !s.closeSent {
		return
	}
	isMine := func(g wire.GroupMessage) bool { return g.Op == wire.OpStreamClose && g.From == s.tag }
	if i := slices.IndexFunc(m.groupWait, isMine); i >= 0 {
		m.groupWait = slices.Delete(m.groupWait, i, i+1)
		s.closeSent = false
		return
	}
	if i := slices.IndexFunc(m.groupq, isMine); i >= 0 {
		m.groupq = slices.Delete(m.groupq, i, i+1)
		s.closeSent = false
		m.requestDoneLocked() // it had its place
	}
}

// reasonError is a stream's error for a failure reason.
func reasonError(r uint32, who string) error {
	switch r {
	case wire.ReasonRemoteAccess:
		return fmt.Errorf("group: stream failed at %s: %w", who, link.ErrRemoteAccess)
	case wire.ReasonRNR:
		return fmt.Errorf("group: stream failed at %s: %w", who, link.ErrRNR)
	case wire.ReasonProtocol:
		return fmt.Errorf("group: stream failed at %s: %w", who, wire.ErrProtocol)
	}
	return fmt.Errorf("group: stream failed at %s: %s", who, reasonText(r))
}

// openedByPeerLocked makes the stream a StreamOpen asks for, or refuses it.
func (m *Mux) openedByPeerLocked(g wire.GroupMessage) {
	refuse := func(reason uint32) {
		m.stats.Refused++
		m.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamRefuse, To: g.From, Reason: reason})
	}
	switch {
	case m.cfg.Backlog == 0 || m.retiring || m.cfg.Accepts != nil && !m.cfg.Accepts(g.Port):
		refuse(wire.ReasonNoListener)
		return
	case len(m.accepts) >= m.cfg.Backlog:
		refuse(wire.ReasonBacklog)
		return
	}
	s, reason := m.newStreamLocked()
	if s == nil {
		refuse(reason)
		return
	}
	s.acceptedLocked(g)
	l, r := m.base.Addrs()
	s.local, s.remote = netip.AddrPortFrom(l.Addr(), g.Port), netip.AddrPortFrom(r.Addr(), g.FromPort)
	s.port = g.Port
	m.stats.Accepted++
	m.sendGroupLocked(s.ringMessage(wire.OpStreamAccept, g.From))
	m.accepts = append(m.accepts, s)
	select {
	case m.acceptReady <- struct{}{}:
	default:
	}
}

// newStreamLocked makes a stream with a slot, rings and its first grant,
// or says why not.
func (m *Mux) newStreamLocked() (*Stream, uint32) {
	if m.stats.Streams >= m.cfg.MaxStreams || m.granted+m.cfg.FirstGrant > m.pool {
		return nil, wire.ReasonLimit
	}
	send, sendKey, err := m.base.NewSendRing(m.cfg.SendRing)
	if err != nil {
		return nil, wire.ReasonMemory
	}
	recv, recvAddr, recvKey, err := m.base.NewRecvRing(m.cfg.RecvRing)
	if err != nil {
		m.base.ReleaseSendRing(sendKey)
		return nil, wire.ReasonMemory
	}
	var slot uint32
	if k := len(m.free); k > 0 {
		slot, m.free = m.free[k-1], m.free[:k-1]
	} else {
		if len(m.slots) > wire.MaxStreamSlot {
			m.base.ReleaseSendRing(sendKey)
			m.base.ReleaseRecvRing(recv)
			return nil, wire.ReasonLimit
		}
		slot = uint32(len(m.slots))
		m.slots, m.gens = append(m.slots, nil), append(m.gens, 0)
	}
	m.gens[slot]++
	if m.gens[slot] == 0 {
		m.gens[slot] = 1
	}
	s := &Stream{m: m, tag: wire.MakeStreamTag(slot, m.gens[slot]), avail: m.cfg.FirstGrant, opened: make(chan struct{}),
		send: send, sendKey: sendKey, recv: recv, recvAddr: recvAddr, recvKey: recvKey}
	s.cond.L = &m.mu
	s.caps = link.Caps{
		SendDepth: m.cfg.SendDepth, RecvDepth: m.cfg.FirstGrant, ControlDepth: m.cfg.ControlDepth,
		Name: m.bc.Name + " stream", Transport: m.bc.Transport, RecvCredit: true, RecvGrant: true,
	}
	m.slots[slot] = s
	m.granted += m.cfg.FirstGrant
	m.stats.Streams++
	return s, 0
}

// maybeFreeLocked gives a stream's slot and rings back once its side
// closed it and nothing of the peer's can land in its ring any more.
func (m *Mux) maybeFreeLocked(s *Stream) {
	// The peer may still write into its ring until it sent StreamClose or
	// answered this side's; and the answer to this side's StreamClose
	// names the slot, which must not be another stream's by then.
	if s.freed || !s.closed || m.err == nil && (!s.peerDone() || s.closeSent && !s.closeAnswered) {
		return
	}
	s.freed = true
	if m.err == nil {
		s.releaseRingsLocked()
	}
	m.granted -= s.avail + s.taken
	m.repostLocked(s.taken)
	slot := s.tag.Slot()
	m.slots[slot] = nil
	m.free = append(m.free, slot)
	m.stats.Streams--
	if m.closed && m.stats.Streams == 0 {
		// Close ran: the link goes with the last stream, once run has
		// stopped polling it.
		go func() {
			<-m.done
			m.mu.Lock()
			defer m.mu.Unlock()
			m.closeLinkLocked()
		}()
	}
	if m.retiring && m.stats.Streams == 0 {
		go m.Close() // not under the lock, and not on the run goroutine, which Close waits for
	}
	if m.cfg.IdleClose > 0 && m.stats.Streams == 0 {
		m.idleSince = time.Now()
		if m.idleTimer == nil {
			m.idleTimer = time.AfterFunc(m.cfg.IdleClose, m.closeIfIdle)
		} else {
			m.idleTimer.Reset(m.cfg.IdleClose)
		}
	}
}

// closeIfIdle closes a group that has had no stream for IdleClose.
func (m *Mux) closeIfIdle() {
	m.mu.Lock()
	idle := m.stats.Streams == 0 && !m.closed && m.err == nil
	if idle && time.Since(m.idleSince) < m.cfg.IdleClose {
		// A stream came and went since: wait from its end.
		m.idleTimer.Reset(m.cfg.IdleClose - time.Since(m.idleSince))
		idle = false
	}
	m.mu.Unlock()
	if idle {
		m.Close()
	}
}

// Retire stops accepting streams (the peer's opens are refused with
// ReasonNoListener, and Accept returns ErrClosed once its queue is empty)
// and closes the group once its last stream is closed: a listener that
// closed leaves the connections it accepted open, as net's do.
func (m *Mux) Retire() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.retiring {
		return
	}
	m.retiring = true
	select {
	case m.acceptReady <- struct{}{}:
	default:
	}
	// Streams nobody accepted end as a listener's unaccepted connections do.
	queued := m.accepts
	m.accepts = nil
	for _, s := range queued {
		s.disconnectLocked()
		s.closed = true
		m.maybeFreeLocked(s)
	}
	if m.stats.Streams == 0 {
		go m.Close()
	}
}

// dropQueuedLocked flushes what a stream queued and the mux did not post.
func (m *Mux) dropQueuedLocked(s *Stream) {
	m.queued -= len(s.queued)
	s.queued = nil
}

// endLocked ends the group: every stream reports err's end, opens fail,
// Accept returns.
func (m *Mux) endLocked(err error) {
	if m.err != nil {
		return
	}
	m.err = err
	for _, s := range m.slots {
		if s == nil {
			continue
		}
		s.disconnecting = true
		m.dropQueuedLocked(s)
		if s.state == opening {
			s.state, s.openErr = refused, err
			close(s.opened)
		}
		if s.abandoned {
			s.closed = true // its opener gave up: nobody else will close it
		}
		if errors.Is(err, ErrClosed) || Disconnected(err) {
			s.terminateLocked(link.Completion{Kind: link.Disconnected})
		} else {
			s.terminateLocked(link.Completion{Kind: link.Failed, Err: err})
		}
	}
	// Streams the peer opened that nobody accepted are nobody's to close.
	for _, s := range m.accepts {
		s.closed = true
	}
	m.accepts = nil
	for _, s := range m.slots {
		if s != nil {
			m.maybeFreeLocked(s)
		}
	}
	m.ready, m.groupq, m.groupWait = nil, nil, nil
	m.base.Wake() // run may sleep on a link that says nothing more
	if !m.closed && m.cfg.OnEnd != nil {
		go m.cfg.OnEnd(err)
	}
	select {
	case m.acceptReady <- struct{}{}:
	default:
	}
}

// disconnected marks a base link that was disconnected, not failed: its
// streams end as their peer's close would end them.
type disconnected struct{ error }

func (d disconnected) Unwrap() error { return d.error }

// Disconnected reports whether a group's end (Err) was its link's
// disconnection: its peer closed it, rather than the link failing.
func Disconnected(err error) bool {
	var d disconnected
	return errors.As(err, &d)
}

func (m *Mux) end(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.endLocked(err)
}

// Open opens a stream to the peer's listener on port, and returns it once
// the peer accepted it. A refused stream is a *RefusedError; a bound of
// this side's, ErrLimit.
func (m *Mux) Open(ctx context.Context, port uint16) (*Stream, error) {
	m.mu.Lock()
	if m.err != nil {
		err := m.err
		m.mu.Unlock()
		return nil, err
	}
	s, reason := m.newStreamLocked()
	if s == nil {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrLimit, reasonText(reason))
	}
	m.ports++
	if m.ports < 1024 {
		m.ports = 1024
	}
	s.state, s.port = opening, port
	l, r := m.base.Addrs()
	s.local, s.remote = netip.AddrPortFrom(l.Addr(), m.ports), netip.AddrPortFrom(r.Addr(), port)
	m.stats.Opened++
	g := s.ringMessage(wire.OpStreamOpen, 0)
	g.Port, g.FromPort = port, m.ports
	m.sendGroupLocked(g)
	m.mu.Unlock()

	select {
	case <-s.opened:
	case <-ctx.Done():
		m.mu.Lock()
		defer m.mu.Unlock()
		if s.state == opening {
			// The answer may still come: the stream closes then.
			s.abandoned = true
			return nil, ctx.Err()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.state != open {
		err := s.openErr
		s.closed = true
		m.maybeFreeLocked(s)
		return nil, err
	}
	return s, nil
}

// Accept returns the next stream the peer opened.
func (m *Mux) Accept(ctx context.Context) (*Stream, error) {
	for {
		m.mu.Lock()
		if len(m.accepts) > 0 {
			s := m.accepts[0]
			m.accepts = m.accepts[1:]
			if len(m.accepts) > 0 {
				select {
				case m.acceptReady <- struct{}{}:
				default:
				}
			}
			m.mu.Unlock()
			return s, nil
		}
		if m.err != nil || m.retiring {
			err := m.err
			if err == nil {
				err = ErrClosed
			}
			m.mu.Unlock()
			return nil, err
		}
		m.mu.Unlock()
		select {
		case <-m.acceptReady:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Stats returns the group's counters.
func (m *Mux) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.stats
	st.Granted, st.Pool = m.granted, m.pool
	return st
}

// Done is closed once the group ended (Err says why) and stopped taking
// its link's completions.
func (m *Mux) Done() <-chan struct{} { return m.done }

// Base is the link the group runs over.
func (m *Mux) Base() link.Link { return m.base }

// Err is why the group ended, or nil.
func (m *Mux) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Close ends the group and disconnects its base link: every stream
// reports Disconnected, as when its peer closed it. The link, which owns
// the streams' rings, is closed once the last stream is closed too: a
// connection may still read what arrived before (its engine reads the
// ring's memory), as over a link of its own that was disconnected.
func (m *Mux) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	if m.idleTimer != nil {
		m.idleTimer.Stop()
	}
	m.endLocked(ErrClosed)
	m.base.Disconnect()
	m.mu.Unlock()
	m.base.Wake()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closeLinkLocked()
}

// closeLinkLocked closes the base link once the group is closed and no
// stream holds its rings; a later call (the last stream's Close) does it
// otherwise.
func (m *Mux) closeLinkLocked() error {
	if !m.closed || m.linkClosed || m.stats.Streams > 0 {
		return nil
	}
	m.linkClosed = true
	return m.base.Close()
}
