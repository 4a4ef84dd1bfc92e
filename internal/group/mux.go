// Package group carries many streams over one link, as SMC-R's link groups
// carry many sockets over one RDMA connection per pair of hosts: a stream
// costs no queue pair, no rdma_cm exchange and no registration of its own.
//
// A Mux runs over one or more base links to the same peer (link.Carriers:
// link.Pipe on the host, RDMA queue pairs in the lab, one per path) and
// makes Streams, each a link.Link of its own, so that the stream engine
// (internal/stream) and rdmanet.Conn run over a stream as over any link.
// A new stream opens on the link with the fewest (Config.Spread); when a
// link fails, its streams move to another (Config.MoveTimeout, move.go). Each stream has its own rings, window and
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
// Each base link's send queue, control slots and receives are its streams':
//
//   - A stream posts into a queue of its own in the mux; the mux posts the
//     streams' requests onto the base link round robin, one request at a
//     time, so a large writer never starves a small one. A stream that
//     starts sending goes first (baseLink.fresh), and the data in flight
//     on the base link is bounded (Config.LinkInFlight), so that turns
//     are taken here and not in the device's queue.
//   - The base link's receives are a pool: a stream's peer holds credit
//     (link.Caps.RecvCredit and RecvGrant), granted from the pool as it
//     streams (link.PoolGrant), so a stream never sends a message that
//     finds no receive. A message beyond its credit fails that stream
//     alone (ReasonRNR).
//   - The group's own messages are requests (open, close), at most
//     groupRequests outstanding from each side, and their answers, so the
//     group reserves twice that many receives for them and needs no credit.
//
// A stream's Wait sleeps in its base link's Wait as that link's leader
// and hands each completion it takes to its stream; with no Wait, the base
// link's notify wakes the link's service goroutine, which does it, and
// which ends when the link is idle (baseLink.kick). A stream's
// name (its tag) is the group's, not a link's, so it keeps it when it
// moves.
package group

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmanet/sdk/internal/connfd"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// groupRequests is how many group requests (StreamOpen, StreamClose,
// StreamMove) each side may have unanswered on a link; the receives
// reserved for the group's messages are twice that (the peer's requests,
// and the answers to this side's). A failover moves every stream of a
// link at once: 32 moves a round trip.
const groupRequests = 32

// Config sizes a group's streams.
type Config struct {
	// SendRing and RecvRing are each stream's ring sizes.
	SendRing, RecvRing int
	// Features are what the group's two sides agreed on for the streams'
	// engines beyond the group's own (wire.FeatureRetain): the mux only
	// keeps them, for Stream.Features.
	Features wire.Features
	// SendDepth and ControlDepth are each stream's Caps: its requests
	// outstanding, of which control messages.
	SendDepth, ControlDepth int
	// FirstGrant is the credit a stream's peer holds at first (its
	// Caps.RecvDepth), and again on each link it moves to; MaxGrant the
	// most it may hold.
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
	// group ends other than by Close (its last link failed or was
	// disconnected, or the peer broke the protocol): the owner closes it.
	OnEnd func(error)

	// Spread picks the link a new stream opens on (SpreadLeastStreams
	// unless set).
	Spread Spread
	// MoveTimeout, if positive, makes a link's failure a move rather than
	// the group's end: its streams are suspended (their Failed completion
	// matches link.ErrDown, and a resumable engine waits), the dialer of
	// the group (Mover) moves each to another link (StreamMove), and both
	// report link.Resumed there. A stream that has not moved within
	// MoveTimeout ends (link.Ended, a *MoveError); so does the group, if it
	// has no link left then. Zero: a link's failure ends the group.
	MoveTimeout time.Duration
	// Mover is set at the side that made the links (the dialer): it moves
	// the streams, the other side waits for its StreamMoves.
	Mover bool
	// PeerLeftWait, at the side that does not move streams: when the
	// group's last working link was disconnected (the peer's process may
	// have died: its kernel disconnects), how long the group waits for the
	// peer to come back with a link or a move before its streams end as
	// their peer's close (as a plain connection's do when its peer dies).
	// Zero: MoveTimeout, as for any failure.
	PeerLeftWait time.Duration
	// OnMove, if set, is called for every stream that moved (MoveFailover,
	// MoveRebalance) or could not (MoveFailed), under the group's lock: it
	// only counts.
	OnMove func(MoveKind)
	// OnLinkDown, if set, is called on a goroutine of its own when one of
	// the group's links (base) fails while the group goes on
	// (MoveTimeout): the owner may make another on its path (AddLink).
	OnLinkDown func(base link.Carrier, err error)
	// LinkInFlight bounds the data a base link has posted that has not
	// completed, in bytes (a write larger than it goes alone); 0: only
	// its send queue bounds it. Past it, the streams' writes wait in the
	// mux, whose turns are fair, rather than in the device's queue, which
	// is first come first served: with a deep queue, a stream that starts
	// (or moves, or answers) waits behind everything the others queued
	// there (255 writes of up to 64 KiB).
	LinkInFlight int
	// OpenPoll is how long an Open polls its link for the peer's answer
	// before it sleeps in the link's Wait, as a connection's Read polls
	// for its answer (adaptive polling, connfd): an answer caught while
	// polling raises no completion event at the opener and wakes no
	// goroutine. 0: it sleeps at once. It takes one of the process's
	// spin slots, and sleeps at once if none is free.
	OpenPoll time.Duration
}

// MoveKind says how a stream's move went, for OnMove.
type MoveKind uint8

const (
	MoveFailover  MoveKind = iota // its link failed, and it moved
	MoveRebalance                 // it moved off a link that works
	MoveFailed                    // its link failed, and no link took it
)

func (k MoveKind) String() string {
	switch k {
	case MoveFailover:
		return "failover"
	case MoveRebalance:
		return "rebalance"
	case MoveFailed:
		return "failed"
	}
	return fmt.Sprintf("move(%d)", uint8(k))
}

// Spread is how a group picks the link a new stream opens on.
type Spread uint8

const (
	// SpreadLeastStreams opens a stream on the link that carries the
	// fewest, the first among equals: the group's paths share its load.
	SpreadLeastStreams Spread = iota
	// SpreadFirstLink opens every stream on the first link that works;
	// the others stand by, for moves (active-backup, as a bond's).
	SpreadFirstLink
)

func (p Spread) String() string {
	switch p {
	case SpreadLeastStreams:
		return "least-streams"
	case SpreadFirstLink:
		return "first-link"
	}
	return fmt.Sprintf("spread(%d)", uint8(p))
}

// DefaultConfig is what a group's streams have unless told otherwise.
func DefaultConfig() Config {
	return Config{
		SendRing: 64 << 10, RecvRing: 64 << 10,
		SendDepth: 16, ControlDepth: 4,
		FirstGrant: 8, MaxGrant: 256,
		MaxStreams: 4096, Backlog: 128,
		LinkInFlight: DefaultLinkInFlight,
	}
}

// DefaultLinkInFlight is Config.LinkInFlight unless told otherwise: what
// a 100 Gb/s port sends in 84 us, longer than a completion takes to come
// back while the link is busy; the lab's rxe sends it in tens of
// milliseconds, which is then the longest a stream's turn waits in the
// device (BENCHMARKS.md, the group's failover).
const DefaultLinkInFlight = 1 << 20

// ErrDown is matched by the errors of a group whose base link ended, and
// by its streams' Failed completions then.
var ErrDown = errors.New("group: down")

// ErrOpenLost is matched by Open's error when the link the stream was
// opening on failed before the peer's answer came, while the group may
// still have others: the opener may open again. Whether the StreamOpen
// arrived is not known; if it did, the peer holds a stream nobody opened
// here, which waits for a move that never comes and fails after its
// MoveTimeout (its Accept may have returned it, as a TCP listener may
// return a connection its client reset).
var ErrOpenLost = errors.New("group: the stream's link failed before its open was answered")

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
	case wire.ReasonGone:
		return "the stream ended at the peer before it could move"
	}
	return fmt.Sprintf("reason %d", r)
}

// Stats are a group's counters.
type Stats struct {
	Streams                  int    // open now
	Opened, Accepted         uint64 // streams this side opened, and the peer opened
	Refused                  uint64 // opens this side refused
	Posted                   uint64 // requests posted on the base links
	MostQueued               int    // the most stream requests waiting on a link at once
	Granted, Pool            int    // receives committed to streams, and the pools' size
	GroupMessages, Malformed uint64
	Links                    int    // links that work
	LinksDown                uint64 // links that failed while the group went on
	Suspended                int    // streams waiting for a move now
	Moved                    uint64 // streams moved to another link
	MovesFailed              uint64 // streams that ended for want of a move
}

// LinkStats are one link's share of a group.
type LinkStats struct {
	Base    link.Link
	Name    string
	Streams int // streams on it now
	Posted  uint64
	Granted int
	Pool    int
}

// Mux is one side of a link group: the streams over its base links.
type Mux struct {
	cfg  Config
	done chan struct{} // closed once the group ended and no link's run polls any more

	mu      sync.Mutex
	links   []*baseLink // in the order added; a link that failed leaves once nothing holds it
	added   int
	slots   []*Stream // by slot; slot 0 is never used
	gens    []uint8
	free    []uint32
	ports   uint16 // the last port given to a stream this side opened
	accepts []*Stream
	// acceptReady is signaled when accepts gains a stream or the group
	// ends or retires (acceptSignalLocked); acceptLeads is the link an
	// Accept leads while it waits, and acceptScratch its signals to give.
	acceptReady   chan struct{}
	acceptLeads   *baseLink
	acceptScratch []wakeup

	// deferTo is the link that a leader or a service drains now, holding
	// the lock: the streams' signals wait in its list until the lock is
	// let go (takeSignalsLocked).
	deferTo *baseLink

	suspended []*Stream // waiting for a move, oldest first
	moveTimer *time.Timer
	leftTimer *time.Timer // PeerLeftWait
	lastDown  error       // the last link failure, for a group that ends with no link

	err       error // the group ended: why
	closed    bool
	retiring  bool // Retire: no stream is accepted, and the last one's end closes the group
	idleSince time.Time
	idleTimer *time.Timer
	stats     Stats
}

// New starts a group over base, whose receives are all posted and whose
// peer runs New too. It takes base over: Close closes it.
func New(base link.Carrier, cfg Config) (*Mux, error) {
	if cfg.SendRing <= 0 || cfg.RecvRing <= 0 || cfg.SendDepth <= 0 || cfg.ControlDepth <= 0 ||
		cfg.FirstGrant <= 0 || cfg.MaxGrant < cfg.FirstGrant || cfg.MaxStreams <= 0 || cfg.Backlog < 0 || cfg.MoveTimeout < 0 {
		return nil, fmt.Errorf("group: config %+v", cfg)
	}
	if err := checkBase(base, cfg); err != nil {
		return nil, err
	}
	m := &Mux{
		cfg:         cfg,
		done:        make(chan struct{}),
		slots:       []*Stream{nil},
		gens:        []uint8{0},
		acceptReady: make(chan struct{}, 1),
	}
	m.mu.Lock()
	m.addLocked(base)
	m.mu.Unlock()
	return m, nil
}

func checkBase(base link.Carrier, cfg Config) error {
	bc := base.Caps()
	if bc.SendDepth < 2 || bc.ControlDepth < 1 || bc.RecvDepth <= 2*groupRequests+cfg.FirstGrant {
		return fmt.Errorf("group: base link %s too small: %+v", bc.Name, bc)
	}
	return nil
}

// AddLink adds a link to the group, another path to the same peer, whose
// receives are all posted and whose peer adds it too. New streams spread
// onto it, and the Mover moves the streams that wait for a link onto it.
func (m *Mux) AddLink(base link.Carrier) error {
	if err := checkBase(base, m.cfg); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	l := m.addLocked(base)
	if m.cfg.Mover && m.cfg.MoveTimeout > 0 {
		m.moveSuspendedLocked()
		m.rebalanceLocked(l)
	}
	return nil
}

func (m *Mux) addLocked(base link.Carrier) *baseLink {
	bc := base.Caps()
	l := &baseLink{
		m: m, base: base, bc: bc, index: m.added,
		done:       make(chan struct{}),
		pool:       bc.RecvDepth - 2*groupRequests,
		fifo:       make([]sent, bc.SendDepth),
		firstID:    1,
		lastResort: bc.Transport == "tcp",
	}
	l.emptier, _ = base.(link.Emptier)
	m.added++
	m.links = append(m.links, l)
	l.kicks, l.quit = make(chan struct{}, 1), make(chan struct{})
	base.SetNotify(l.kick)
	l.kick() // a service arms it and takes what came
	return l
}

// pickLocked is the link a new stream goes on (Spread), among those that
// work and have receives for it, never a TCP link; nil if none.
func (m *Mux) pickLocked() *baseLink {
	var best *baseLink
	for _, l := range m.links {
		if l.err != nil || l.lastResort || !m.roomForNewLocked(l) {
			continue
		}
		if m.cfg.Spread == SpreadFirstLink {
			return l
		}
		if best == nil || l.streams < best.streams {
			best = l
		}
	}
	return best
}

// reserveLocked is how many of l's receives the group keeps for the first
// grants of streams on its other links, which may move to l: a group that
// moves its streams never grants more on a link than leaves room for every
// one of them (the engine needs its first grant again after a move).
func (m *Mux) reserveLocked(l *baseLink) int {
	if m.cfg.MoveTimeout <= 0 {
		return 0
	}
	return m.cfg.FirstGrant * (m.stats.Streams - l.streams)
}

// freeLocked is what l's pool may grant beyond first grants.
func (m *Mux) freeLocked(l *baseLink) int { return l.pool - l.granted - m.reserveLocked(l) }

// roomForNewLocked reports whether a new stream on l has its first grant
// there, and, in a group that moves its streams, room on every other link
// that works, to move to.
func (m *Mux) roomForNewLocked(l *baseLink) bool {
	if m.freeLocked(l) < m.cfg.FirstGrant {
		return false
	}
	if m.cfg.MoveTimeout > 0 {
		for _, o := range m.links {
			if o != l && o.err == nil && m.freeLocked(o) < m.cfg.FirstGrant {
				return false
			}
		}
	}
	return true
}

// onlyLastResortLocked reports whether the links that work are TCP links.
func (m *Mux) onlyLastResortLocked() bool {
	tcp := false
	for _, l := range m.links {
		if l.err == nil {
			if !l.lastResort {
				return false
			}
			tcp = true
		}
	}
	return tcp
}

// liveLocked reports whether some link works.
func (m *Mux) liveLocked() bool {
	for _, l := range m.links {
		if l.err == nil {
			return true
		}
	}
	return false
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

// protocolLocked ends the group for a message the protocol does not allow
// on l.
func (m *Mux) protocolLocked(l *baseLink, err error) {
	m.stats.Malformed++
	m.endLocked(fmt.Errorf("group: %s: %w", l.name(), &wire.ProtocolError{Reason: err.Error()}))
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

// openedByPeerLocked makes the stream a StreamOpen on l asks for, or
// refuses it.
func (m *Mux) openedByPeerLocked(l *baseLink, g wire.GroupMessage) {
	refuse := func(reason uint32) {
		m.stats.Refused++
		l.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamRefuse, To: g.From, Reason: reason})
	}
	switch {
	case m.cfg.Backlog == 0 || m.retiring || m.cfg.Accepts != nil && !m.cfg.Accepts(g.Port):
		refuse(wire.ReasonNoListener)
		return
	case len(m.accepts) >= m.cfg.Backlog:
		refuse(wire.ReasonBacklog)
		return
	}
	s, reason := m.newStreamLocked(l)
	if s == nil {
		refuse(reason)
		return
	}
	s.acceptedLocked(g)
	local, remote := l.base.Addrs()
	s.local, s.remote = netip.AddrPortFrom(local.Addr(), g.Port), netip.AddrPortFrom(remote.Addr(), g.FromPort)
	s.port = g.Port
	m.stats.Accepted++
	l.sendGroupLocked(s.ringMessage(wire.OpStreamAccept, g.From))
	m.accepts = append(m.accepts, s)
	m.acceptSignalLocked()
}

// newStreamLocked makes a stream on l with a slot, rings and its first
// grant, or says why not.
func (m *Mux) newStreamLocked(l *baseLink) (*Stream, uint32) {
	if m.stats.Streams >= m.cfg.MaxStreams || !m.roomForNewLocked(l) {
		return nil, wire.ReasonLimit
	}
	send, sendKey, err := l.base.NewSendRing(m.cfg.SendRing)
	if err != nil {
		return nil, wire.ReasonMemory
	}
	recv, recvAddr, recvKey, err := l.base.NewRecvRing(m.cfg.RecvRing)
	if err != nil {
		l.base.ReleaseSendRing(sendKey)
		return nil, wire.ReasonMemory
	}
	var slot uint32
	if k := len(m.free); k > 0 {
		slot, m.free = m.free[k-1], m.free[:k-1]
	} else {
		if len(m.slots) > wire.MaxStreamSlot {
			l.base.ReleaseSendRing(sendKey)
			l.base.ReleaseRecvRing(recv)
			return nil, wire.ReasonLimit
		}
		slot = uint32(len(m.slots))
		m.slots, m.gens = append(m.slots, nil), append(m.gens, 0)
	}
	m.gens[slot]++
	if m.gens[slot] == 0 {
		m.gens[slot] = 1
	}
	s := &Stream{m: m, l: l, tag: wire.MakeStreamTag(slot, m.gens[slot]), avail: m.cfg.FirstGrant, opened: make(chan struct{}),
		send:    streamRing{mem: send, regs: []ringReg{{on: l, key: sendKey}}},
		recv:    []streamRing{{mem: recv, regs: []ringReg{{on: l, addr: recvAddr, key: recvKey}}}},
		recvMem: recv}
	l.regs += 2
	s.cond.L = &m.mu
	s.caps = link.Caps{
		SendDepth: m.cfg.SendDepth, RecvDepth: m.cfg.FirstGrant, ControlDepth: m.cfg.ControlDepth,
		Name: l.bc.Name + " stream", Transport: l.bc.Transport, RecvCredit: true, RecvGrant: true,
	}
	m.slots[slot] = s
	l.granted += m.cfg.FirstGrant
	l.streams++
	m.stats.Streams++
	return s, 0
}

// maybeFreeLocked gives a stream's slot and rings back once its side
// closed it and nothing of the peer's can land in its ring any more.
func (m *Mux) maybeFreeLocked(s *Stream) {
	// The peer may still write into its ring until it sent StreamClose or
	// answered this side's; and the answer to this side's StreamClose
	// names the slot, which must not be another stream's by then.
	if s.freed || !s.closed || m.err == nil && !s.settledLocked() {
		return
	}
	s.freed = true
	m.dropSuspendedLocked(s)
	s.detachLocked()
	// Registrations on the links it moved to go before the memory does
	// (the links close only after the last stream).
	s.releaseRingsLocked()
	slot := s.tag.Slot()
	m.slots[slot] = nil
	m.free = append(m.free, slot)
	m.stats.Streams--
	if m.closed && m.stats.Streams == 0 {
		// Close ran: the links go with the last stream, once no leader
		// sleeps in them.
		go func() {
			<-m.done
			m.mu.Lock()
			defer m.mu.Unlock()
			m.closeLinksLocked()
		}()
	}
	if m.retiring && m.stats.Streams == 0 {
		go m.Close() // not under the lock, and not on a leader's goroutine, which Close waits for
	}
	if m.cfg.IdleClose > 0 && m.stats.Streams == 0 {
		m.idleSince = time.Now()
		armTimer(&m.idleTimer, m.cfg.IdleClose, m.closeIfIdle)
	}
}

// endIfEmptyLocked ends a group that has no stream and no working link
// (the last failed, err): it has nothing to move and nobody to wait for,
// and a link made again only to sit idle would hold memory and retry a
// peer that may be gone. The next dial makes a new group, with the same
// one rdma_cm exchange a new link would take.
func (m *Mux) endIfEmptyLocked(err error) bool {
	if m.err != nil || m.closed || m.stats.Streams > 0 || m.liveLocked() {
		return false
	}
	m.endLocked(err)
	return true
}

// armTimer starts *t to call f after d, or sets the one it holds to.
func armTimer(t **time.Timer, d time.Duration, f func()) {
	if *t == nil {
		*t = time.AfterFunc(d, f)
		return
	}
	(*t).Reset(d)
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
	m.acceptSignalLocked()
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

// endLocked ends the group: every stream reports err's end, opens fail,
// Accept returns.
func (m *Mux) endLocked(err error) {
	if m.err != nil {
		return
	}
	m.err = err
	if m.moveTimer != nil {
		m.moveTimer.Stop()
	}
	if m.leftTimer != nil {
		m.leftTimer.Stop()
	}
	for _, s := range m.slots {
		if s == nil {
			continue
		}
		s.disconnecting = true
		s.dropQueuedLocked()
		if s.state == opening {
			s.state, s.openErr = refused, err
			s.openedLocked()
		}
		if s.abandoned {
			s.closed = true // its opener gave up: nobody else will close it
		}
		switch {
		case s.lostLocked() && errors.Is(err, errPeerLeft):
			// As when the peer's process dies under a plain connection.
			s.endedLocked(stream.ErrPeerLeftLink)
		case s.lostLocked():
			// Suspended: its engine waits for a move, and takes only its end.
			s.endedLocked(err)
		case errors.Is(err, ErrClosed) || Disconnected(err):
			s.terminateLocked(link.Completion{Kind: link.Disconnected})
		default:
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
	m.suspended = nil
	dones := make([]chan struct{}, 0, len(m.links))
	for _, l := range m.links {
		l.ready.reset()
		l.fresh.reset()
		l.groupq, l.groupWait = nil, nil
		l.base.Disconnect() // the peer's end of each link learns at once
		l.base.Wake()       // a leader may sleep on a link that says nothing more
		l.finishLocked()
		dones = append(dones, l.done)
	}
	go func() {
		for _, d := range dones {
			<-d
		}
		close(m.done)
	}()
	if !m.closed && m.cfg.OnEnd != nil {
		go m.cfg.OnEnd(err)
	}
	m.acceptSignalLocked()
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

// End ends the group with err, as a failure of its links would: its
// owner found the peer gone (it refused every link).
func (m *Mux) End(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.endLocked(err)
}

// Open opens a stream to the peer's listener on port, on the link Spread
// picks, and returns it once the peer accepted it. A refused stream is a
// *RefusedError; a bound of this side's, ErrLimit.
func (m *Mux) Open(ctx context.Context, port uint16) (*Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // as net.Dialer: not even the open goes
	}
	m.mu.Lock()
	if m.err != nil {
		err := m.err
		m.mu.Unlock()
		return nil, err
	}
	l := m.pickLocked()
	if l == nil {
		err := fmt.Errorf("%w: no link with room for a stream", ErrLimit)
		if m.onlyLastResortLocked() {
			err = fmt.Errorf("%w: only the TCP link works, which takes no new stream", ErrLimit)
		}
		if !m.liveLocked() {
			err = fmt.Errorf("%w: no link works: %w", ErrDown, m.lastDown)
		}
		m.mu.Unlock()
		return nil, err
	}
	s, reason := m.newStreamLocked(l)
	if s == nil {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrLimit, reasonText(reason))
	}
	m.ports++
	if m.ports < 1024 {
		m.ports = 1024
	}
	s.state, s.port = opening, port
	local, remote := l.base.Addrs()
	s.local, s.remote = netip.AddrPortFrom(local.Addr(), m.ports), netip.AddrPortFrom(remote.Addr(), port)
	m.stats.Opened++
	g := s.ringMessage(wire.OpStreamOpen, 0)
	g.Port, g.FromPort = port, m.ports
	l.sendGroupLocked(g)
	answered := func() bool { return s.state != opening || s.l != l || ctx.Err() != nil }
	if m.cfg.OpenPoll > 0 && connfd.TakeSpinSlot() {
		l.pollLocked(answered, m.cfg.OpenPoll)
		connfd.ReleaseSpinSlot()
	}
	if !answered() && l.leadableLocked() {
		// Wait for the answer as the link's leader: it wakes this
		// goroutine, not a service's and then this one.
		stop := context.AfterFunc(ctx, l.base.Wake)
		s.leads = l
		l.leadLocked(answered, true, &s.scratch)
		s.leads = nil
		stop()
	}
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
				m.acceptSignalLocked()
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
		if l := m.acceptLinkLocked(); l != nil {
			// Wait for an open as a link's leader (as Open waits for its
			// answer); acceptReady tells what ended it.
			stop := context.AfterFunc(ctx, l.base.Wake)
			m.acceptLeads = l
			l.leadLocked(func() bool { return len(m.accepts) > 0 || m.err != nil || m.retiring || ctx.Err() != nil }, true, &m.acceptScratch)
			m.acceptLeads = nil
			stop()
		}
		m.mu.Unlock()
		select {
		case <-m.acceptReady:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// acceptLinkLocked is a link an Accept may lead while it waits: the first
// that works and has no leader, unless another Accept leads one.
func (m *Mux) acceptLinkLocked() *baseLink {
	if m.acceptLeads != nil {
		return nil
	}
	for _, l := range m.links {
		if l.leadableLocked() && !l.resting {
			return l
		}
	}
	return nil
}

// acceptSignalLocked tells a waiting Accept that accepts gained a stream,
// or the group ended or retires: through acceptReady, and by waking the
// link it leads.
func (m *Mux) acceptSignalLocked() {
	select {
	case m.acceptReady <- struct{}{}:
	default:
	}
	if l := m.acceptLeads; l != nil && l.asleep {
		l.base.Wake()
	}
}

// Stats returns the group's counters.
func (m *Mux) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.stats
	for _, l := range m.links {
		st.Posted += l.posted
		st.MostQueued = max(st.MostQueued, l.mostQueued)
		if l.err == nil {
			st.Links++
			st.Granted += l.granted
			st.Pool += l.pool
		}
	}
	st.Suspended = len(m.suspended)
	return st
}

// Links returns the share of each link that works.
func (m *Mux) Links() []LinkStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []LinkStats
	for _, l := range m.links {
		if l.err == nil {
			out = append(out, LinkStats{Base: l.base, Name: l.name(), Streams: l.streams, Posted: l.posted, Granted: l.granted, Pool: l.pool})
		}
	}
	return out
}

// Done is closed once the group ended (Err says why) and stopped taking
// its links' completions.
func (m *Mux) Done() <-chan struct{} { return m.done }

// Base is the group's first link that works (or its first, if none does).
func (m *Mux) Base() link.Link {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.links {
		if l.err == nil {
			return l.base
		}
	}
	if len(m.links) > 0 {
		return m.links[0].base
	}
	return nil
}

// Err is why the group ended, or nil.
func (m *Mux) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Close ends the group and disconnects its links: every stream reports
// Disconnected, as when its peer closed it. The links, which own the
// streams' rings, are closed once the last stream is closed too: a
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
	m.mu.Unlock()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closeLinksLocked()
}

// closeLinksLocked closes the base links once the group is closed and no
// stream holds their rings; a later call (the last stream's Close) does it
// otherwise.
func (m *Mux) closeLinksLocked() error {
	if !m.closed || m.stats.Streams > 0 {
		return nil
	}
	var errs []error
	for _, l := range m.links {
		if !l.closed {
			l.closed = true
			errs = append(errs, l.base.Close())
		}
	}
	return errors.Join(errs...)
}
