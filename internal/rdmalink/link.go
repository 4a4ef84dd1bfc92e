// Package rdmalink is the RDMA edge of rdmanet: one reliable connection
// (an rdma_cm ID, its queue pair on a completion queue shared with other
// links, and the registered rings) as a link.Link, which rdmanet's connection engine
// drives. It is tested in the lab, on real queue pairs (Soft-RoCE); the
// engine above it is tested on any machine over link.Pipe.
package rdmalink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// Link is a link.Link over one RDMA reliable connection: an rdma_cm ID,
// its queue pair, a slot on a completion queue that it shares with other
// links of the device (cqshare.go), and the registered rings (resources). Data goes as RDMA_WRITE_WITH_IMM (the immediate is the
// byte count), or, with write notices (an iWARP device has no immediate
// data), as an RDMA_WRITE followed by a SEND of a Written message from a
// notice slot; control messages go as SENDs from a slot of the control
// buffer, and receives land in slots of the same buffer.
//
// The link also owns the connection manager's events for its ID: a
// DISCONNECTED from the peer (answered at once, so the peer's own
// disconnect completes) or a device or address event ends it, and Poll
// reports that after the completions before it. Requests flushed by a
// queue pair that went to error with no event to explain it fail the link
// after flushGrace.
type Link struct {
	id  *cm.ID
	res *resources

	caps        link.Caps
	local, peer netip.AddrPort

	// Receive slots the peer's messages consumed, oldest first: PostRecv
	// posts them again. consumed and the scratch slices of work requests
	// grow with use: an idle connection holds a few of each, not its
	// queues' depths (20 KiB with the defaults).
	consumed []int
	recvWRs  []verbs.RecvWR
	unposted int // the first receive slot never posted (Config.PostFirst)
	sendWRs  []verbs.SendWR
	wcs      [pollBatch]verbs.WorkCompletion
	emptied  bool // the last Poll drained the shared queue and took all it had (Emptied)
	// tag is the slot and generation every work request's id carries
	// (wrTag); sendIDs are the engine's ids of the sends posted, by their
	// place in the send queue (sendNext is the next's), so that a send's
	// id is the index.
	tag      uint64
	sendIDs  []uint64
	sendNext int
	// Outstanding requests (link.Link's PostSend): posted counts the
	// engine's requests and ctlNext its control requests; sendMarks
	// holds, by place in the send queue, both counts as they stood once
	// the request there was posted, so that a SendDone retires every
	// request up to its own (retired, ctlRetired). Counts wrap.
	// Requests posted after Disconnect, or once the queue pair flushed,
	// are flushed and not counted (uncounted).
	posted, retired uint32
	ctlRetired      uint32
	sendMarks       []sendMark
	disconnecting   bool

	// pend: completions taken from the shared queue for this link, not
	// yet Polled (pend[pendHead:]); armed: Arm was called and the link
	// was not told of a completion since.
	pmu      sync.Mutex
	pend     []verbs.WorkCompletion
	pendHead int
	armed    atomic.Bool
	ctlNext  uint64 // control messages posted, ever: the next one's slot is ctlNext % ControlDepth

	// needs are the link features this end cannot do without: its
	// device's and Config.Needs (ownNeeds), and a shared receive queue's;
	// notice, whether data goes with write notices on this connection
	// (Established); noticeNext numbers them, as ctlNext control messages.
	needs      wire.Features
	ownNeeds   wire.Features
	notice     bool
	noticeNext uint64
	// carrier: both ends agreed on wire.FeatureGroup, and the link carries
	// a group's streams (carrier.go): immediates name streams. sendRings
	// are the streams' transmit rings, by key (sendKeys is the last given).
	carrier   bool
	sendRings map[uint32]*region
	sendKeys  uint32

	flushedAt time.Time // when the first flushed completion (or refused post) was seen
	// flushTimer wakes the link flushGrace after flushedAt; Close stops
	// it, so that no timer's goroutine outlives the link.
	flushTimer atomic.Pointer[time.Timer]
	postErr    error // the first post the provider refused (postFailed)
	reported   bool  // Disconnected or Failed was reported

	mu     sync.Mutex  // guards what the event handler sets, and waking
	ended  atomic.Bool // down is set (read without mu by PostSend)
	down   link.CompletionKind
	why    error
	woken  bool
	closed bool // Wake does nothing after Close (a flush-grace timer may fire late)
	// gone: Close began; every call but Close and Wake then fails with
	// net.ErrClosed (read without mu, on every call).
	gone atomic.Bool

	// events: a completion event for the link's queue came while another
	// link read the shared channel; wakes: Wake was called (compshare.go).
	events, wakes chan struct{}
	// waits counts the Waits running; notifyFn is SetNotify's function,
	// called when an event or the link's end finds none (tell).
	waits    atomic.Int32
	notifyFn atomic.Pointer[func()]

	// The link's place in the registry of asynchronous events (asyncev.go),
	// from StartEvents to Close. amu is not mu: the registry's reader
	// holds its own lock when it calls Fail, which takes mu.
	amu         sync.Mutex
	unwatched   bool // Close began: StartEvents registers no more
	asyncKey    any
	asyncMember *asyncMember
}

var (
	_ link.Link        = (*Link)(nil)
	_ link.PathWatcher = (*Link)(nil)
)

// pollBatch is how many work completions one Poll takes at most.
const pollBatch = 32

// flushGrace is how long a queue pair that went to error may wait for the
// event that explains it (DISCONNECTED) before the link fails on its own.
const flushGrace = 2 * time.Second

// Config sizes a link.
type Config struct {
	SendBuffer, RecvBuffer int // the transmit and receive rings, in bytes (rounded up to pages)
	// SendMem and RecvMem, when set, are the rings: memory the caller owns
	// (a resumable session's, which outlives its links). The link
	// registers them and deregisters them at Close, and never unmaps them.
	SendMem, RecvMem *verbs.Buffer
	// Release, if set, is called once the link has SendMem and RecvMem
	// registered no more: by the first Close or Discard, or by New when it
	// fails. The owner unmaps them only after every link over them
	// released them.
	Release              func()
	SendDepth, RecvDepth int // send queue slots; receives kept posted
	ControlDepth         int // control messages that may be in flight
	// PeerBound is the most bytes the links with the same peer on the
	// device and the same PeerBound may register together (pools and
	// rings of their own; 0: DefaultPeerBound, negative: no bound). Beyond
	// it New, and a ring's growth, fail with a *BoundError.
	PeerBound int64
	// Needs adds to the link features the device needs (DeviceNeeds):
	// tests run the iWARP data path on Soft-RoCE with it.
	Needs wire.Features
	// SharedRecv: the link takes its peer's messages into receives of its
	// peer group's shared receive queue (sharedrecv.go), not receives of
	// its own, and so needs receive credit and grants of the peer: its
	// Caps' RecvDepth is its first grant, and RecvDepth the most it
	// grants. Not on a device that needs write notices (iWARP), where it
	// is ignored.
	SharedRecv bool
	// PostFirst, if positive and below RecvDepth, is how many receives New
	// posts; Established posts the rest. A listener posts before it
	// answers, so its posting is in the dialer's wait for the answer
	// (RDMATimeout): for a group's link of 16,384 receives it took 0.06 s
	// quiet and up to 1.8 s with the lab loaded. The peer sends no more
	// than the first before the link is established here: what it may
	// send before that is bounded by the protocol above (a group's
	// requests), which PostFirst must cover.
	PostFirst int
}

// New makes the verbs objects of a connection on id and posts every
// receive (or Config.PostFirst of them), before connect or accept, as
// Valkey does: the peer may send the moment the connection is
// established. Established and StartEvents
// follow once it is; Discard releases a link whose connection never was.
func New(id *cm.ID, cfg Config) (*Link, error) {
	ctx := id.Context()
	if ctx == nil {
		return nil, errors.New("rdmanet: connection has no RDMA device")
	}
	needs := DeviceNeeds(ctx.Transport()) | cfg.Needs
	res, err := newResources(id, cfg, needs&wire.FeatureWriteNotice != 0)
	if err != nil {
		return nil, err
	}
	l := &Link{
		id: id, res: res, needs: needs, ownNeeds: needs,
		caps: link.Caps{
			SendDepth: cfg.SendDepth, RecvDepth: cfg.RecvDepth, ControlDepth: cfg.ControlDepth,
			MaxInline: int(res.maxInline), Name: res.name, Transport: "rdma",
		},
		events:    make(chan struct{}, 1),
		wakes:     make(chan struct{}, 1),
		sendIDs:   make([]uint64, res.sendWRs),
		sendMarks: make([]sendMark, res.sendWRs),
		tag:       wrTag(res.slot, res.gen),
	}
	if res.shared != nil {
		// Its receives are the shared queue's, its peer's credit granted.
		l.needs |= wire.FeatureRecvCredit | wire.FeatureRecvGrant
		l.caps.RecvDepth = firstGrant
		res.cq.attach(res.slot, l, res.qpNum)
		return l, nil
	}
	res.cq.attach(res.slot, l, 0)
	l.unposted = cfg.RecvDepth
	if cfg.PostFirst > 0 {
		l.unposted = min(cfg.PostFirst, cfg.RecvDepth)
	}
	if err := l.postFresh(0, l.unposted); err != nil {
		res.close()
		return nil, err
	}
	return l, nil
}

// postFresh posts receive slots [from, end), which were never posted,
// from a slice it does not keep (PostRecv reposts a few at a time).
func (l *Link) postFresh(from, end int) error {
	if from >= end {
		return nil
	}
	wrs := make([]verbs.RecvWR, end-from)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: l.recvID(from + i), Local: l.res.recvSlot(from + i)}
	}
	return l.res.qp.PostRecv(wrs)
}

// DeviceNeeds are the link features a device of transport t cannot work
// without: iWARP has no immediate data (write notices instead) and no
// receiver-not-ready retry (receive credit instead).
func DeviceNeeds(t verbs.Transport) wire.Features {
	if t == verbs.TransportIWARP {
		return wire.FeatureWriteNotice | wire.FeatureRecvCredit
	}
	return 0
}

// Data paths (DataPath).
const (
	DataPathImmediate = "write-with-immediate"
	DataPathNotice    = "write-and-notice"
)

// DataPath says how data reaches the peer: RDMA writes with immediate
// data, or writes each followed by a Written notice (iWARP).
func (l *Link) DataPath() string {
	if l.notice {
		return DataPathNotice
	}
	return DataPathImmediate
}

// Needs are the link features this end cannot work without: what a
// dialer's Hello says it needs, and what a listener must agree on.
func (l *Link) Needs() wire.Features { return l.needs }

// Established records the connection's addresses once it is established,
// and the link features both ends agreed on. The accepting end of a link
// that needs receive credit (iWARP) speaks second, as MPA wants.
func (l *Link) Established(features wire.Features, accepted bool) error {
	l.local, l.peer = l.id.LocalAddr(), l.id.RemoteAddr()
	if features&wire.FeatureWriteNotice != 0 && !l.res.notices {
		return fmt.Errorf("rdmanet: the peer needs write notices, and %s was made for immediate data", l.res.name)
	}
	if l.res.shared == nil {
		if err := l.postFresh(l.unposted, l.res.recvDepth); err != nil {
			return err
		}
		l.unposted = l.res.recvDepth
	}
	l.notice = features&wire.FeatureWriteNotice != 0
	l.carrier = features&wire.FeatureGroup != 0
	l.caps.RecvCredit = features&wire.FeatureRecvCredit != 0
	l.caps.RecvGrant = features&wire.FeatureRecvGrant != 0
	// MPA's rule (iWARP): not a shared receive queue's credit.
	l.caps.SpeakSecond = accepted && l.ownNeeds&wire.FeatureRecvCredit != 0
	return nil
}

// StartEvents starts taking the connection manager's events (through a
// handler on the ID, with no goroutine of the link's), and the device's
// asynchronous events about the link's queue pair, CQ and port.
func (l *Link) StartEvents() {
	l.id.HandleEvents(l.event)
	if err := l.watchAsync(); err != nil {
		// The connection works without them: a port going down then ends
		// it through its keepalive, as before.
		slog.Warn("rdmanet: cannot read the device's asynchronous events", "device", l.res.device, "err", err)
	}
}

// Discard releases a link whose connection was never established; the
// caller closes the ID.
func (l *Link) Discard() { l.res.close() }

func (l *Link) Caps() link.Caps  { return l.caps }
func (l *Link) SendRing() []byte { return l.res.tx.Bytes() }
func (l *Link) RecvRing() []byte { return l.res.rx.Bytes() }
func (l *Link) RecvRingKey() (uint64, uint32) {
	return l.res.rx.Addr(), l.res.rx.RKey()
}
func (l *Link) Addrs() (local, remote netip.AddrPort) { return l.local, l.peer }

// Endpoint returns the RDMA device and port the link uses and its queue
// pair's number, as rdma_cm chose them, for diagnostics.
func (l *Link) Endpoint() (device string, port uint8, qpNum uint32) {
	return l.res.device, l.res.port, l.res.qpNum
}

// PostSend turns the engine's requests into work requests and posts them
// in one call. It checks them all first, and posts none of them if one
// breaks link.Link's contract (link.ErrMisuse): a data range outside its
// transmit ring would send whatever the ring's slab holds next to it, and
// requests beyond the depths would overrun the send queue, or a control
// slot still in flight.
func (l *Link) PostSend(wrs []link.SendWR) error {
	if l.gone.Load() {
		return closedError("PostSend")
	}
	controls := 0
	for i := range wrs {
		wr := &wrs[i]
		switch wr.Kind {
		case link.SendData:
			if _, err := l.sendLocal(wr); err != nil {
				return err
			}
		case link.SendControl:
			if !wr.Signaled {
				return fmt.Errorf("rdmanet: request %d: an unsignaled control request: %w", i, link.ErrMisuse)
			}
			controls++
		case link.SendMarker:
		default:
			return fmt.Errorf("rdmanet: request %d: send request of kind %v: %w", i, wr.Kind, link.ErrMisuse)
		}
	}
	if l.uncounted() {
		// The queue pair flushes whatever is posted now, and Poll takes
		// a flushed request for nothing: not posting it is the same,
		// and keeps the places (sendIDs) of the requests still in
		// flight, whose completions may yet come, from being taken by
		// requests beyond the depth.
		return nil
	}
	if err := l.checkDepths(len(wrs), controls); err != nil {
		return err
	}
	out := l.sendWRs[:0]
	for i := range wrs {
		wr := &wrs[i]
		l.posted++
		var v verbs.SendWR
		if wr.Signaled {
			v.Flags |= verbs.SendSignaled
		}
		switch wr.Kind {
		case link.SendData:
			v.Opcode, v.RemoteAddr, v.RKey, v.Imm = verbs.OpRDMAWriteWithImm, wr.Remote, wr.RKey, wr.N
			if l.carrier {
				v.Imm = wr.Tag // the receive's byte_len gives the length
			}
			v.Local, _ = l.sendLocal(wr)
			if wr.N <= l.res.maxInline {
				v.Flags |= verbs.SendInline
			}
			if l.notice {
				// The write, silent, then its notice, which carries the
				// engine's id and signal and consumes the peer's receive:
				// a reliable connection places the write before the
				// notice's receive completes.
				v.ID = l.sendID(wr.ID)
				v.Opcode, v.Imm = verbs.OpRDMAWrite, 0
				v.Flags &^= verbs.SendSignaled
				out = append(out, v)
				v = verbs.SendWR{}
				if wr.Signaled {
					v.Flags |= verbs.SendSignaled
				}
				slot := int(l.noticeNext % uint64(l.caps.SendDepth))
				l.noticeNext++
				m := wire.Message{Op: wire.OpWritten, Length: wr.N}
				m.Encode(l.res.noticeSlotBytes(slot))
				if l.carrier {
					wire.SetStream(l.res.noticeSlotBytes(slot), wire.StreamTag(wr.Tag))
				}
				v.Opcode, v.Local = verbs.OpSend, l.res.noticeSlot(slot)
				if wire.MessageSize <= l.res.maxInline {
					v.Flags |= verbs.SendInline
				}
			}
		case link.SendControl:
			slot := int(l.ctlNext % uint64(l.caps.ControlDepth))
			l.ctlNext++
			*l.res.sendSlotBytes(slot) = wr.Msg
			v.Opcode, v.Local = verbs.OpSend, l.res.sendSlot(slot)
			if wire.MessageSize <= l.res.maxInline {
				v.Flags |= verbs.SendInline
			}
		case link.SendMarker:
			v.Opcode, v.RemoteAddr, v.RKey = verbs.OpRDMAWrite, wr.Remote, wr.RKey
		}
		v.ID = l.sendID(wr.ID)
		out = append(out, v)
	}
	err := l.res.qp.PostSend(out)
	clear(out)
	l.sendWRs = out[:0]
	return l.postFailed(err)
}

// checkDepths fails a PostSend of n requests, controls of them control
// requests, that would leave more outstanding than the link's Caps allow.
func (l *Link) checkDepths(n, controls int) error {
	out, ctlOut := int(l.posted-l.retired), int(uint32(l.ctlNext)-l.ctlRetired)
	if out+n <= l.caps.SendDepth && ctlOut+controls <= l.caps.ControlDepth {
		return nil
	}
	if out+n > l.caps.SendDepth {
		return fmt.Errorf("rdmanet: %d requests outstanding and %d more, SendDepth %d: %w", out, n, l.caps.SendDepth, link.ErrMisuse)
	}
	return fmt.Errorf("rdmanet: %d control requests outstanding and %d more, ControlDepth %d: %w", ctlOut, controls, l.caps.ControlDepth, link.ErrMisuse)
}

// uncounted reports whether the queue pair flushes what is posted now:
// Disconnect was called, or it went to error (a flush or a refused post
// was seen, or an event ended the link). Such requests never complete,
// so they count against no depth (link.Link's Disconnect).
func (l *Link) uncounted() bool {
	return l.disconnecting || l.reported || !l.flushedAt.IsZero() || l.ended.Load()
}

// sendMark is what had been posted once the request at a place of the
// send queue was: the engine's requests, and its control requests.
type sendMark struct{ posted, ctls uint32 }

// retire ends the requests outstanding up to the one at place i, whose
// SendDone Poll takes.
func (l *Link) retire(i int) {
	if i < len(l.sendMarks) {
		m := l.sendMarks[i]
		l.retired, l.ctlRetired = m.posted, m.ctls
	}
}

// closedError is the error of a call after Close.
func closedError(op string) error {
	return fmt.Errorf("rdmanet: %s after Close: %w", op, net.ErrClosed)
}

// sendID is the work request id of the next send, whose completion
// stands for the engine's id: its place in the send queue names it in
// sendIDs (a queue pair never has more sends outstanding than places),
// and in sendMarks what its SendDone retires.
// A write that its notice follows gets one too, unsignaled: only a flush
// completes it, and a flushed completion carries nothing.
func (l *Link) sendID(engineID uint64) uint64 {
	i := l.sendNext
	l.sendIDs[i] = engineID
	if i < len(l.sendMarks) {
		l.sendMarks[i] = sendMark{l.posted, uint32(l.ctlNext)}
	}
	if l.sendNext++; l.sendNext == len(l.sendIDs) {
		l.sendNext = 0
	}
	return l.tag | uint64(i)
}

// recvID is the work request id of a receive into slot.
func (l *Link) recvID(slot int) uint64 { return wrRecv | l.tag | uint64(slot) }

// postFailed takes a post the provider refused as the queue pair's flush.
// A queue pair that leaves RTS takes requests and flushes them on rxe and
// on hardware; siw refuses them while it closes (its doorbell fails with
// ENOTCONN, and ibv_post_send returns -1). Either way the event that
// explains it (DISCONNECTED: the peer closed) ends the link, after the
// completions before it, so a Read still gets what arrived before the
// peer's close; with no such event the link fails after flushGrace, with
// the post's error.
func (l *Link) postFailed(err error) error {
	if err == nil {
		return nil
	}
	if l.postErr == nil {
		l.postErr = err
	}
	l.flushed()
	return nil
}

// flushed notes that the queue pair went to error, once: flushGrace from
// now, a link with no event to explain it fails.
func (l *Link) flushed() {
	if l.flushedAt.IsZero() {
		l.flushedAt = time.Now()
		l.flushTimer.Store(time.AfterFunc(flushGrace, l.wakeForEnd))
	}
}

// PostRecv posts again the n receive slots consumed longest ago.
func (l *Link) PostRecv(n int) error {
	if l.gone.Load() {
		return closedError("PostRecv")
	}
	if n < 0 || n > len(l.consumed) {
		return fmt.Errorf("rdmanet: %d receives to post again, %d were consumed: %w", n, len(l.consumed), link.ErrMisuse)
	}
	if s := l.res.shared; s != nil {
		err := s.post(l.consumed[:n])
		l.consumed = l.consumed[:copy(l.consumed, l.consumed[n:])]
		return err
	}
	wrs := l.recvWRs[:0]
	for _, slot := range l.consumed[:n] {
		wrs = append(wrs, verbs.RecvWR{ID: l.recvID(slot), Local: l.res.recvSlot(slot)})
	}
	l.consumed = l.consumed[:copy(l.consumed, l.consumed[n:])]
	err := l.res.qp.PostRecv(wrs)
	l.recvWRs = wrs[:0]
	return l.postFailed(err)
}

// Poll takes completions and says what they mean. The link's end comes
// once, after everything before it. It returns 0 only when nothing is
// left: completions that carry nothing (flushed requests) are taken and
// the queue polled again, so that an end behind them is not left for a
// next Poll that nothing may call (a link nobody waits on is told of its
// end once).
func (l *Link) Poll(cs []link.Completion) (int, error) {
	for {
		n, took, err := l.pollOnce(cs)
		if n > 0 || !took || err != nil {
			return n, err
		}
	}
}

// Emptied reports whether the last Poll drained the shared queue and took
// all the link had then (link.Emptier): a Poll that took only what other
// links' polls set aside for it says false.
func (l *Link) Emptied() bool { return l.emptied }

// pollOnce is one pass of Poll; took says whether it took completions,
// even if none of them meant anything.
func (l *Link) pollOnce(cs []link.Completion) (n int, took bool, err error) {
	if l.gone.Load() {
		return 0, false, closedError("Poll")
	}
	if l.reported {
		return 0, false, nil
	}
	// With completions of its own pending (its Wait's reader or another
	// link's poll moved them), the link takes those first and polls the
	// queue on its next Poll: a round trip pays one poll of the queue, as
	// with a queue of its own.
	//
	// The end is read before the queue is drained: every completion of the
	// link's from before it (a completion precedes the event of the peer's
	// disconnect that follows it) is on the queue by then, and this drain,
	// or the one that holds the queue as it begins, moves it to pending. An
	// end recorded after the drain may have completions that came after it
	// on the queue still: it waits for the next Poll.
	drained := !l.hasPending()
	l.emptied = false
	var end link.Completion
	ended := false
	if drained {
		end, ended = l.end()
		if err := l.res.cq.drain(l); err != nil {
			return 0, false, err
		}
	}
	wcs := l.wcs[:min(len(cs), len(l.wcs))]
	got := l.takePending(wcs)
	took = got > 0
	l.emptied = drained && got < len(wcs)
	sent, heard := false, false // recorded on the peer group, once a Poll
	for i := range wcs[:got] {
		wc := &wcs[i]
		if wc.Status == verbs.WCWRFlushErr {
			// The queue pair is in error: flushed requests carry nothing.
			// The event that explains it (DISCONNECTED), or flushGrace,
			// ends the link. A shared queue's receive goes back to it.
			if wc.ID&wrShared != 0 {
				giveBackShared(wc.ID)
			}
			l.flushed()
			continue
		}
		if err := wc.Err(); err != nil {
			if wc.ID&wrShared != 0 {
				giveBackShared(wc.ID)
			}
			switch {
			case pathFailure(wc.Status):
				err = fmt.Errorf("%w (%w)", err, link.ErrDown)
			case wc.Status == verbs.WCRemAccessErr:
				// A write outside the peer's rings, or with a key it
				// does not have (at the writer; rxe reports it on the
				// peer's receive too).
				err = fmt.Errorf("%w (%w)", err, link.ErrRemoteAccess)
			case wc.Status == verbs.WCRNRRetryExcErr:
				err = fmt.Errorf("%w (%w)", err, link.ErrRNR)
			}
			cs[n] = link.Completion{Kind: link.Failed, Err: err}
			l.reported = true
			return n + 1, took, nil
		}
		c := &cs[n]
		if wc.ID&wrRecv == 0 {
			*c = link.Completion{Kind: link.SendDone, ID: l.sendIDs[wc.ID&wrIndexMask]}
			l.retire(int(wc.ID & wrIndexMask))
			n++
			if !sent {
				sent = true
				l.res.group.progressed(true)
			}
			continue
		}
		if !heard {
			heard = true
			l.res.group.progressed(false)
		}
		slot := int(wc.ID & wrIndexMask)
		l.consumed = append(l.consumed, slot)
		switch wc.Opcode {
		case verbs.WCRecvRDMAWithImm:
			*c = link.Completion{Kind: link.DataArrived, N: wc.Imm}
			if l.carrier {
				*c = link.Completion{Kind: link.DataArrived, N: wc.ByteLen, Tag: wc.Imm}
			}
		case verbs.WCRecv:
			if wc.ByteLen != wire.MessageSize {
				*c = link.Completion{Kind: link.Failed, Err: &wire.ProtocolError{Reason: fmt.Sprintf("control message of %d bytes", wc.ByteLen)}}
				l.reported = true
				return n + 1, took, nil
			}
			msg := l.res.recvMsg(wc.ID)
			if l.notice && wire.Opcode(binary.BigEndian.Uint16(msg)) == wire.OpWritten {
				m, err := wire.Decode(msg, true)
				if err != nil {
					*c = link.Completion{Kind: link.Failed, Err: err}
					l.reported = true
					return n + 1, took, nil
				}
				*c = link.Completion{Kind: link.DataArrived, N: m.Length}
				if l.carrier {
					c.Tag = noticeStream(msg)
				}
				break
			}
			*c = link.Completion{Kind: link.ControlArrived}
			copy(c.Msg[:], msg)
		default:
			*c = link.Completion{Kind: link.Failed, Err: &wire.ProtocolError{Reason: "unexpected completion " + wc.Opcode.String()}}
			l.reported = true
			return n + 1, took, nil
		}
		n++
	}
	if n < len(cs) && got < len(wcs) && ended {
		// Nothing of the link's is left: its completions are taken, and
		// the shared queue was polled empty after its end was recorded;
		// the end is next.
		cs[n] = end
		l.reported = true
		n++
	}
	return n, took, nil
}

// PathProgress is when a send last completed and a message last arrived
// on any link to the same peer on the same device (link.PathWatcher).
func (l *Link) PathProgress() (sent, heard time.Time) {
	g := l.res.group
	if g == nil {
		return time.Time{}, time.Time{}
	}
	return pathEpoch.Add(time.Duration(g.sent.Load())), pathEpoch.Add(time.Duration(g.heard.Load()))
}

// end is the completion that reports the link's end, once the queue is
// empty: the event the event handler recorded, or a queue pair that flushed
// with no event for flushGrace.
func (l *Link) end() (link.Completion, bool) {
	l.mu.Lock()
	down, why := l.down, l.why
	l.mu.Unlock()
	switch {
	case down != 0:
		return link.Completion{Kind: down, Err: why}, true
	case !l.flushedAt.IsZero() && time.Since(l.flushedAt) >= flushGrace:
		if l.postErr != nil {
			return link.Completion{Kind: link.Failed, Err: fmt.Errorf("%w: %w", errQueuePairDown, l.postErr)}, true
		}
		return link.Completion{Kind: link.Failed, Err: errQueuePairDown}, true
	}
	return link.Completion{}, false
}

// errQueuePairDown: the queue pair went to error with no disconnect from
// the peer and no device event. It matches link.ErrDown: a path failure.
var errQueuePairDown = fmt.Errorf("rdmanet: the connection's queue pair failed: %w", link.ErrDown)

// Arm asks for the next completion's event: the link is told when one of
// its completions reaches it (cqshare.go), and the shared queue raises an
// event for its next completion unless it will already.
func (l *Link) Arm() error {
	if l.gone.Load() {
		return closedError("Arm")
	}
	if l.armed.CompareAndSwap(false, true) {
		l.res.cq.armedLinks.Add(1)
	}
	return l.res.cq.arm()
}

// disarm: the link was told, or its Wait returned; it wants no event
// until it arms again.
func (l *Link) disarm() {
	if l.armed.CompareAndSwap(true, false) {
		l.res.cq.armedLinks.Add(-1)
	}
}

// deliver adds a completion the shared queue had for the link.
func (l *Link) deliver(wc *verbs.WorkCompletion) {
	l.pmu.Lock()
	if l.pendHead > 0 && len(l.pend) == cap(l.pend) {
		// Room at the front: move down before the slice grows, so it
		// stays as long as the most completions pending at once (at most
		// the link's reservation).
		l.pend = l.pend[:copy(l.pend, l.pend[l.pendHead:])]
		l.pendHead = 0
	}
	l.pend = append(l.pend, *wc)
	l.pmu.Unlock()
}

// takePending moves the oldest pending completions into wcs.
func (l *Link) takePending(wcs []verbs.WorkCompletion) int {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	n := copy(wcs, l.pend[l.pendHead:])
	if l.pendHead += n; l.pendHead == len(l.pend) {
		l.pend, l.pendHead = l.pend[:0], 0
	}
	return n
}

// hasPending reports whether completions wait for the link's Poll.
func (l *Link) hasPending() bool {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	return l.pendHead < len(l.pend)
}

// Wait sleeps until the link's queue has a completion event, the link is
// woken, or it ends (compshare.go: the device's channel is shared).
func (l *Link) Wait() error {
	// Counted before Close is looked for: a Close that finds no Wait
	// running has set gone for this one to see.
	l.waits.Add(1)
	defer l.waits.Add(-1)
	if l.gone.Load() {
		return closedError("Wait")
	}
	defer l.disarm()
	err := l.res.share.wait(l)
	if l.gone.Load() {
		return closedError("Wait")
	}
	return err
}

// SetNotify makes f be called when a completion event or the link's end
// finds no Wait running (link.Link).
func (l *Link) SetNotify(f func()) {
	if f == nil {
		l.notifyFn.Store(nil)
		return
	}
	l.notifyFn.Store(&f)
}

// tell calls the notify function if no Wait runs: a Wait that runs, or
// starts, sees the event or the wake-up itself.
func (l *Link) tell() {
	if l.waits.Load() != 0 {
		return
	}
	if f := l.notifyFn.Load(); f != nil {
		(*f)()
	}
}

// arrived is a completion event for l's queue that another goroutine read
// from the shared channel: l's next Wait returns at once, and with no Wait
// running the notify function is called.
func (l *Link) arrived() {
	notify(l.events)
	l.tell()
}

// wakeForEnd wakes a Wait, or with none running calls the notify function,
// for the link's end (a cm or device event, or a flush with no event).
func (l *Link) wakeForEnd() {
	l.Wake()
	l.tell()
}

// takeWoken reports whether the link was woken or has ended, and clears
// the wake-up: a Wait returns link.ErrWoken for it.
func (l *Link) takeWoken() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.woken || l.down != 0 {
		l.woken = false
		return true
	}
	return false
}

// isWoken is takeWoken without clearing.
func (l *Link) isWoken() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.woken || l.down != 0
}

// Wake ends the current or next Wait.
func (l *Link) Wake() {
	l.mu.Lock()
	if l.woken || l.closed {
		l.mu.Unlock()
		return
	}
	l.woken = true
	l.mu.Unlock()
	notify(l.wakes)
	l.res.share.wake(l)
}

// event is the ID's event handler (cm's dispatcher calls it): the events
// that end the connection are recorded for Poll, and a sleeping poller is
// woken to take them.
func (l *Link) event(ev cm.Event) {
	var kind link.CompletionKind
	var why error
	switch ev.Type {
	case cm.EventDisconnected, cm.EventTimewaitExit:
		kind = link.Disconnected
		// Answer, so the peer's own disconnect completes at once.
		l.id.Disconnect()
	case cm.EventDeviceRemoval, cm.EventAddrChange:
		kind, why = link.Failed, fmt.Errorf("rdmanet: %v: %w", ev.Type, link.ErrDown)
	default:
		return
	}
	l.mu.Lock()
	if l.down == 0 {
		l.down, l.why = kind, why
	}
	l.mu.Unlock()
	l.ended.Store(true)
	l.wakeForEnd()
}

// Disconnect starts rdma_cm's disconnect: the queue pair flushes what it
// holds, and what is posted after (which counts against no depth).
func (l *Link) Disconnect() error {
	if l.gone.Load() {
		return closedError("Disconnect")
	}
	l.disconnecting = true
	return l.id.Disconnect()
}

// Close ends a Wait that runs (it returns net.ErrClosed, as every call
// after Close does), destroys the ID (and with it the queue pair; no
// event reaches the link after it), then the rest. A second Close does
// nothing.
func (l *Link) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	// gone before woken: a Wait that takes the wake-up must find the
	// link gone, and say closed, not woken.
	l.gone.Store(true)
	l.closed, l.woken = true, true
	l.mu.Unlock()
	if t := l.flushTimer.Load(); t != nil {
		t.Stop()
	}
	notify(l.wakes)
	l.res.share.wake(l)
	for l.waits.Load() != 0 {
		// It returns as soon as it runs again: woken, it reads nothing.
		time.Sleep(100 * time.Microsecond)
	}
	l.unwatchAsync()
	err := l.id.Close()
	shared := l.res.shared
	if shared != nil {
		// The receives its peer's messages took and the engine did not
		// post again go back to the shared queue (the rest come back as
		// the completion queue is drained, res.close).
		err = errors.Join(err, shared.post(l.consumed))
		l.consumed = l.consumed[:0]
	}
	err = errors.Join(err, l.res.close())
	if shared != nil {
		// So do those whose completions it did not take: after res.close,
		// which left the completion queue, so that none another link's
		// drain delivered meanwhile is missed.
		l.pmu.Lock()
		for _, wc := range l.pend[l.pendHead:] {
			if wc.ID&wrShared != 0 && wc.ID&wrRecv != 0 {
				giveBackShared(wc.ID)
			}
		}
		l.pend, l.pendHead = l.pend[:0], 0
		l.pmu.Unlock()
	}
	return err
}

// pathFailure reports whether a work request that failed with status
// failed because of the path, so that another path may work (its error
// matches link.ErrDown): the local queue pair could not send (rxe says so
// when its netdev goes down or its address is deleted, docs/lab.md), or the
// transport's retries ran out. An access or protection error is a bug or a
// hostile peer, and a receiver not ready for ever is the peer's doing:
// neither is cured by another path.
func pathFailure(status verbs.WCStatus) bool {
	switch status {
	case verbs.WCLocQPOpErr, verbs.WCRetryExcErr:
		return true
	}
	return false
}
