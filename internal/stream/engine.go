package stream

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// Config is what an Engine is made with: what both sides agreed on and
// what the link has.
type Config struct {
	// Features are the extensions both sides agreed on; 0 is Valkey's protocol.
	Features wire.Features
	// Peer is the peer's Hello, if it sent one (PeerHello): its limits.
	Peer      wire.Hello
	PeerHello bool
	// Server: this side answers GetServerFeature, as a Valkey server does.
	Server bool
	// Caps are the link's.
	Caps link.Caps
	// SendRing and RecvRing are the link's rings (link.Link's SendRing and
	// RecvRing): Write copies into the first, Read out of the second.
	SendRing, RecvRing []byte
	// RecvAddr and RecvKey name RecvRing to the peer (link.Link.RecvRingKey).
	RecvAddr uint64
	RecvKey  uint32
	// MaxSendRing and MaxRecvRing are the largest rings the connection
	// grows to (grow.go): SendRing and RecvRing are its first. They grow
	// on a link that can replace its rings (link.Rings); the receive ring
	// with wire.FeatureGrow, or in Valkey's protocol at a wrap. 0: the
	// first sizes.
	MaxSendRing, MaxRecvRing int
	// ShrinkAfter is how long a connection may move no data before its
	// rings go back to their first sizes (0: never; Valkey's buffer never
	// shrinks). It is checked on Tick, so it needs KeepAlive.
	ShrinkAfter time.Duration
	// KeepAlive is how long this side may go without posting anything
	// before it sends Keepalive; 0 disables keepalive and dead-path
	// detection. A signaled request that has not completed deadFactor x
	// KeepAlive after the last send completion means the path is dead
	// (*PathDeadError).
	KeepAlive time.Duration
	// PeerRing, with wire.FeatureRing, is the peer's receive ring when it
	// was named before the stream began (a link group's open and accept
	// carry it, docs/protocol.md): data may go at once, and the peer's own
	// RegisterXferMemory, which must name the same ring, changes nothing.
	// With wire.FeatureOpenRing the open and its answer were both sides'
	// announcements: the peer sends none, and neither does this side at
	// Start.
	PeerRing *wire.Message
	// Clock is the engine's time source (default time.Now); tests move it.
	Clock func() time.Time
}

// deadFactor times KeepAlive without a send completion, while requests are
// outstanding, is a dead path. It is a backstop for a device that goes
// silent (the transport's own retries report a lost path sooner on a
// device that does not): a busy machine must not look like one. Under the
// lab's emulated CPU, with 2,000 queue pairs and the race detector, a send
// took 3.4 s to complete; with the default KeepAlive of 3 s the bound is 6 s.
const deadFactor = 2

// lateFactor times KeepAlive is how long a connection's own requests may
// wait while other links on the same path make progress (PathProgress):
// its requests are queued behind theirs on a busy device, not lost. (On
// siw in the lab, 10,000 ends with a keepalive every 3 s delayed one
// connection's messages by more than 6 s while the others' came.) Longer
// than that, a connection whose own link is cut off alone (a TCP flow
// that siw's queue pair uses, dropped by a middlebox) is dead too.
const lateFactor = 10

// idleFactor times KeepAlive is the longest an idle connection goes
// without its own keepalive (or, where only the peer's messages count,
// without asking for one) while its path is busy: sends complete and
// messages arrive on other connections to the same peer on the device
// (PathProgress). Those prove the device and the peer alive, so 10,000
// idle ends need not each send every KeepAlive: in the lab, on a loaded
// host, that many keepalives overloaded rxe (docs/engine.md, "Keepalives
// at scale"). A keepalive every idleFactor x KeepAlive keeps the peer's
// waits for this connection far under their lateFactor cap. Once the path
// is quiet for half a KeepAlive, every connection sends each KeepAlive
// again, so a path that dies is found within 3 x KeepAlive as before.
const idleFactor = 4

// valkeyRecvDepth is how many receives a Valkey peer keeps posted (its
// queue pair's max_recv_wr). A peer without a Hello is taken to keep that
// many; rdmanet peers say theirs.
const valkeyRecvDepth = 1024

// corkLimit is how many bytes of small Writes may be held back (coalescing).
const corkLimit = 32 << 10

// maxFeatureReplies bounds GetServerFeature replies waiting for a control
// slot: a peer that asks faster than the link carries the answers is
// flooding, and gets a protocol error rather than unbounded memory.
const maxFeatureReplies = 8

// ErrWouldBlock is Read's and Write's answer when nothing can be done now;
// the caller waits for a completion (Engine.Readable or Writable tells when)
// and calls again.
var ErrWouldBlock = errors.New("stream: would block")

// Errors that end or limit a stream. The connection wraps them in
// *net.OpError.
var (
	// ErrPeerClosed: a Write after the peer disconnected (as EPIPE is for TCP).
	ErrPeerClosed = errors.New("rdmanet: connection closed by peer")
	// ErrWriteShutdown: a Write after CloseWrite.
	ErrWriteShutdown = errors.New("rdmanet: write after CloseWrite")
	// ErrHalfCloseUnsupported: CloseWrite needs a peer that negotiated
	// orderly half-close; Valkey's protocol has none.
	ErrHalfCloseUnsupported = errors.New("rdmanet: the peer does not support half-close")
	// ErrPeerLeftLink: in a session whose peers say when they close
	// (wire.FeatureClose), the peer's end of the link ended without its
	// Close. The peer suspended the session (its keepalive took a stall
	// for a dead path, or its device failed), or it died: either way the
	// link is lost, not closed, and the session resumes or times out.
	ErrPeerLeftLink = fmt.Errorf("rdmanet: the peer left the link without closing the connection: %w", link.ErrDown)
)

// PathDeadError: a request posted to the link did not complete within the
// bound (2 x Config.KeepAlive after the last completion), whatever the
// device did. It is a timeout (net.Error's Timeout reports true) and matches
// link.ErrDown, so a session layer may try another path.
type PathDeadError struct {
	Outstanding time.Duration // how long requests had been waiting
	// Waited is what did not come: "no send completed", "no credit came"
	// (receive credit), or "nothing heard from the peer" (receive credit,
	// where a completed send proves nothing).
	Waited string
}

func (e *PathDeadError) Error() string {
	waited := cmp.Or(e.Waited, waitedSend)
	return "rdmanet: the path to the peer is dead: " + waited + " for " + e.Outstanding.Round(time.Millisecond).String()
}

// PathDeadError.Waited.
const (
	waitedSend   = "no send completed"
	waitedCredit = "no credit came"
	waitedHeard  = "nothing heard from the peer"
)

func (e *PathDeadError) Timeout() bool     { return true }
func (e *PathDeadError) Temporary() bool   { return false }
func (e *PathDeadError) Is(err error) bool { return err == link.ErrDown }

// Engine is one side of a stream over a link. It is not safe for concurrent
// use: the connection calls it under its lock.
type Engine struct {
	cfg  Config
	recv Receiver
	send Sender
	sq   *SendQueue
	ctl  controlQueue
	grow growth // rings that follow traffic (grow.go)

	// peerRingKnown: Config.PeerRing was taken, and the peer's own
	// announcement of it has not come yet.
	peerRingKnown bool

	out     []link.SendWR // requests to post (Flush); grows with the batches posted, so an idle connection holds a few
	reposts int           // receives the peer's messages consumed, to post again

	// rc accounts for the peer's receives on a link without
	// receiver-not-ready retries (link.Caps.RecvCredit); creditShort is
	// when a message first had to wait for its credit (zero: none waits),
	// which Tick bounds as it bounds a request's completion.
	rc          recvCredit
	creditShort time.Time
	// On such a link a send may complete before the peer took it (siw
	// completes once its TCP has the bytes), so completions prove nothing
	// about the path: the peer's messages do. lastHeard is when one last
	// arrived; probed, that a Keepalive went to ask for one since (the
	// peer answers it with a Credit).
	lastHeard time.Time
	probed    bool
	// pathSent and pathHeard are when a send last completed and a message
	// last arrived on any link of the same path (PathProgress): while
	// they move, this connection's own waits are late, not dead, up to
	// lateFactor x KeepAlive.
	pathSent, pathHeard time.Time
	// tickDue is when NextTick last said to Tick (zero once a Tick took
	// it): a Tick much later than that ran on a machine that stalled.
	tickDue time.Time
	// muted: this end accepted on a link whose passive side speaks second
	// (link.Caps.SpeakSecond), and nothing has arrived yet: Flush posts
	// no requests until something does.
	muted bool

	// Bytes of small Writes held back while a signaled request is in
	// flight, to go out as one data request when it completes: where they
	// are in the transmit ring and where they go. The send queue's
	// accounting counts them (Hold).
	corkOff, corkRemote uint64
	corkRKey            uint32
	arrived             bool // data arrived from the peer since this side last posted data

	// Zero-copy (view.go): the views handed out and not all released,
	// oldest first; bytes a View copied before it had them all, which
	// the next Read or View takes first; how many bytes a waiting View
	// needs (Readable); and the write buffer held, if any, and whether
	// it is in the transmit ring.
	views          []heldView
	pending        []byte
	viewWant       int
	viewInPlace    bool
	reserveWant    int
	reserved       []byte
	reservedInRing bool
	spare          []byte // a copy's memory, given back, for the next (view.go)
	// Registered memory sent from and still in use, oldest first, and
	// whether a writer waits for it (mem.go).
	mems    []memSeg
	memWant bool

	err      error // why the stream failed, if it did
	peerGone bool  // the peer disconnected
	peerDone bool  // the peer shut down its sending side (Shutdown)
	// peerClosed: the peer closed the connection (Close, with
	// wire.FeatureClose); the end of the link that follows is the end of
	// the session, not a lost link.
	peerClosed bool
	wrDone     bool // this side shut down its sending side (CloseWrite)
	draining   bool // the connection is closing: nothing new is sent but what drains

	// A resumable session (wire.FeatureResume) outlives its link: a link
	// failure that another link may cure (link.ErrDown) suspends the
	// stream (lost) until Relink gives it a new link. On that link each
	// side first says what it received (Resume); until the peer's comes
	// (resuming) and the bytes after what it received are sent again
	// (resend), nothing new is written.
	resumable  bool
	relinked   bool // Relink ran: the peer's announcements name its current ring
	lost       error
	resuming   bool
	resend     uint64
	reshutdown bool // Shutdown goes again after the bytes sent again

	// Counts for diagnostics (State): requests posted by the send queues
	// of earlier links, and messages that arrived.
	postedBefore, arrivedMsgs uint64

	lastPost     time.Time // when anything was last posted (keepalive is due KeepAlive after)
	lastProgress time.Time // when a send last completed, or a signaled request was posted with none outstanding
}

// New returns an engine for a stream that has just been established. It
// checks the peer's Hello against what this side can do.
func New(cfg Config) (*Engine, error) {
	peerDepth := valkeyRecvDepth
	if cfg.PeerHello {
		peerDepth = int(cfg.Peer.RecvDepth)
		if cfg.Features&wire.FeatureRing != 0 && cfg.Peer.RingSize == 0 {
			return nil, protocolErrorf("peer offers a ring of 0 bytes")
		}
	}
	if cfg.Caps.SendDepth < 1 || cfg.Caps.ControlDepth < 1 || len(cfg.SendRing) == 0 || len(cfg.RecvRing) == 0 {
		return nil, errors.New("stream: link without send slots, control slots or rings")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	e := &Engine{cfg: cfg, resumable: cfg.Features&wire.FeatureResume != 0}
	if e.resumable && (cfg.Features&wire.FeatureRing == 0 || !cfg.PeerHello) {
		return nil, errors.New("stream: a resumable session needs the ring and the peer's Hello")
	}
	if need := wire.FeatureRing | wire.FeatureShutdown; cfg.Features&wire.FeatureEndAt != 0 && cfg.Features&need != need {
		return nil, errors.New("stream: end positions need the ring and half-close")
	}
	if cfg.Features&wire.FeatureOpenRing != 0 && (cfg.Features&wire.FeatureRing == 0 || cfg.PeerRing == nil) {
		return nil, errors.New("stream: rings named by the open need the ring and the peer's named ring")
	}
	e.sq = NewSendQueue(sendDepth(cfg.Caps, peerDepth), uint64(len(cfg.SendRing)))
	if cfg.Caps.RecvCredit && (cfg.Features&wire.FeatureRing == 0 || !cfg.PeerHello) {
		return nil, errors.New("stream: receive credit needs the ring and the peer's Hello")
	}
	var err error
	if e.rc, err = newRecvCredit(cfg.Caps.RecvCredit, cfg.Caps.RecvGrant, peerDepth, cfg.Caps.RecvDepth); err != nil {
		return nil, err
	}
	e.muted = cfg.Caps.SpeakSecond
	announce := wire.Message{Op: wire.OpRegisterXferMemory, Addr: cfg.RecvAddr, Length: uint32(len(cfg.RecvRing)), RKey: cfg.RecvKey}
	if cfg.Features&wire.FeatureRing != 0 {
		var peerRetain uint32
		if e.resumable {
			e.sq.Retain()
			peerRetain = cfg.Peer.SendRing
		}
		r := NewRecvRing(announce.Length, peerRetain)
		r.mem = cfg.RecvRing
		r.views = &e.views
		send := &SendRing{}
		e.recv, e.send = r, send
		if cfg.PeerRing != nil {
			if err := send.Announce(*cfg.PeerRing); err != nil {
				return nil, err
			}
			// Without FeatureOpenRing the peer's engine announces the
			// ring too, which must be the one named.
			e.peerRingKnown = cfg.Features&wire.FeatureOpenRing == 0
		}
	} else {
		w := NewRecvWindow(announce)
		w.mem = cfg.RecvRing
		e.recv, e.send = w, &SendWindow{}
	}
	e.grow = newGrowth(cfg)
	e.ctl = controlQueue{announce: announce, slots: cfg.Caps.ControlDepth}
	return e, nil
}

// Start announces this side's receive buffer and starts the keepalive clock.
func (e *Engine) Start() {
	now := e.cfg.Clock()
	e.lastPost, e.lastProgress, e.lastHeard = now, now, now
	e.grow.markAt, e.grow.lastTraffic = now, now
	if e.cfg.Features&wire.FeatureOpenRing == 0 {
		e.ctl.want |= wantAnnounce // else the open announced it
	}
	e.flushControl()
}

// Features are the extensions both sides agreed on.
func (e *Engine) Features() wire.Features { return e.cfg.Features }

// Err is why the stream failed, or nil.
func (e *Engine) Err() error { return e.err }

// Fail ends the stream with err (the first error is kept). Reads still
// return what already arrived, then err. In a resumable session, a link
// failure that another link may cure (err matches link.ErrDown) suspends
// the stream instead (Lost), unless it is closing. After the peer's Close,
// such a failure is the peer gone: there is nothing left to resume.
func (e *Engine) Fail(err error) {
	switch {
	case e.err != nil || e.lost != nil:
	case e.resumable && e.peerClosed && errors.Is(err, link.ErrDown):
		e.peerGone = true
	case e.resumable && !e.peerGone && errors.Is(err, link.ErrDown):
		e.lost = err
	default:
		e.err = err
	}
}

// Resuming reports whether a relinked stream waits for the peer's Resume.
func (e *Engine) Resuming() bool { return e.resuming }

// End fails a suspended session for good (it could not resume), or any
// stream, with err.
func (e *Engine) End(err error) {
	if e.err == nil {
		e.err, e.lost = err, nil
	}
}

// PeerLeft ends a suspended session whose peer left its link and did not
// come back: as the peer's close, which is what a plain connection sees
// when its peer's process dies. Reads return what arrived, then io.EOF;
// Writes fail with ErrPeerClosed. The session decides it, whatever the
// engine saw of the link's end (a move's end hides a peer's death).
func (e *Engine) PeerLeft() {
	if e.lost != nil && e.err == nil {
		e.lost, e.peerGone = nil, true
	}
}

// PeerGone reports whether the peer is gone for good (it disconnected, or
// a session's peer left after its Close): nothing more can arrive, and no
// completion is left to take.
func (e *Engine) PeerGone() bool { return e.peerGone }

// Lost is the link failure that suspended a resumable session, until
// Relink; nil otherwise. Reads return what arrived, Writes wait.
func (e *Engine) Lost() error { return e.lost }

// RecvWriteMem is the receive ring the peer's bytes land in now (nil
// outside ring mode): what Relink announces, by the key the new link gives
// it (link.RingKeyer).
func (e *Engine) RecvWriteMem() []byte {
	if r, ok := e.recv.(*RecvRing); ok {
		return r.WriteMem()
	}
	return nil
}

// Relink resumes a suspended session over a new link with caps, whose
// receive ring is named by recvAddr and recvKey. The session's rings are
// the same memory: the new link was made over them, and the bytes this side
// sent and the peer may not have received are still there. This side says
// what it received (Resume), announces its ring again, and once the peer's
// Resume comes, sends again what the peer did not receive.
func (e *Engine) Relink(caps link.Caps, recvAddr uint64, recvKey uint32) error {
	if e.lost == nil || e.err != nil {
		return errors.New("stream: Relink of a stream that is not suspended")
	}
	if caps.SendDepth < 1 || caps.ControlDepth < 1 {
		return errors.New("stream: link without send or control slots")
	}
	rc, err := newRecvCredit(caps.RecvCredit, caps.RecvGrant, int(e.cfg.Peer.RecvDepth), caps.RecvDepth)
	if err != nil {
		return err
	}
	ring := e.recv.(*RecvRing)
	e.cfg.Caps, e.cfg.RecvAddr, e.cfg.RecvKey = caps, recvAddr, recvKey
	e.rc, e.creditShort, e.muted = rc, time.Time{}, caps.SpeakSecond
	// Bytes sent from registered memory are sent again from the ring.
	e.placeMems()
	// Bytes still to be sent again from an earlier Relink go with this one.
	e.postedBefore += e.sq.posted
	e.sq = e.sq.Relink(sendDepth(caps, int(e.cfg.Peer.RecvDepth)), e.resend)
	e.send.(*SendRing).Relink(e.resend)
	clear(e.out)
	e.out = e.out[:0]
	e.reposts = 0
	e.corkOff, e.corkRemote, e.corkRKey = 0, 0, 0
	e.arrived = false
	// The ring the peer writes into now, which grew since the first
	// perhaps: its address and key on the new link are the caller's
	// (RecvWriteMem).
	announce := e.ctl.announce
	announce.Addr, announce.RKey, announce.Length = recvAddr, recvKey, uint32(len(ring.WriteMem()))
	received, consumed := ring.Totals()
	ring.Relinked()
	e.relinked = true
	e.grow.relinked(e.cfg)
	// The peer's own announcement of the ring it named at the open (on
	// the lost link) may never come: on the new link it announces the
	// ring with that link's key, which the transmit ring takes as any
	// announcement (a group's stream moved before the first one came).
	e.peerRingKnown = false
	want := wantResume | wantAnnounce
	if e.draining && e.cfg.Features&wire.FeatureClose != 0 {
		// The Close sent on the lost link may not have arrived.
		want |= wantClose
	}
	e.ctl = controlQueue{
		want:     want,
		announce: announce,
		resume:   wire.Message{Op: wire.OpResume, ReceivedBytes: received, ConsumedBytes: consumed},
		slots:    caps.ControlDepth,
	}
	e.queueRetain() // one sent on the lost link may not have arrived either
	e.lost, e.resuming, e.resend = nil, true, 0
	e.reshutdown = e.wrDone
	now := e.cfg.Clock()
	e.lastPost, e.lastProgress, e.lastHeard, e.probed = now, now, now, false
	e.pathSent, e.pathHeard = time.Time{}, time.Time{} // the old link's path is not the new one's
	e.flushControl()
	return nil
}

// Readable reports whether a Read would return something other than
// ErrWouldBlock: bytes, end of stream, or an error.
func (e *Engine) Readable() bool {
	_, n := e.recv.Readable()
	if e.viewWant > 0 {
		return e.viewReady(n)
	}
	return n > 0 || len(e.pending) > 0 || e.ended() || e.viewsBlock()
}

// Writable reports whether a Write would return something other than
// ErrWouldBlock.
func (e *Engine) Writable() bool {
	if e.err != nil || e.peerGone || e.peerClosed || e.wrDone {
		return true
	}
	if e.memWant {
		return !e.MemHeld()
	}
	if e.suspended() || e.grow.wantSend > 0 {
		return false
	}
	if e.reserveWant > 0 {
		// A write buffer waits for as many free bytes in the ring.
		_, free, _ := e.sq.contiguous()
		return free >= uint64(e.reserveWant)
	}
	_, space := e.sq.RingSpace()
	return e.send.Room() > 0 && space > 0 && e.rc.canData()
}

// Read copies received bytes into b. It returns ErrWouldBlock when nothing
// arrived, io.EOF after the peer closed or shut down and everything it
// sent was read, and the stream's error after a failure (once what arrived
// before it was read).
func (e *Engine) Read(b []byte) (int, error) {
	e.viewWant = 0
	if len(b) == 0 {
		return 0, nil
	}
	if len(e.pending) > 0 {
		k := copy(b, e.pending)
		e.pending = e.pending[k:]
		return k, nil
	}
	return e.readRecv(b)
}

// readRecv is Read from the receive ring (or window).
func (e *Engine) readRecv(b []byte) (int, error) {
	if off, n := e.recv.Readable(); n > 0 {
		k := copy(b, e.recv.Mem()[off:off+n])
		if reply, send := e.recv.Consume(uint32(k)); send {
			if reply.Op == wire.OpRegisterXferMemory && e.grow.wantRecv > 0 && !e.draining {
				// Valkey's buffer was read whole: a larger one is
				// announced in its place (Flush).
				e.grow.wrapped = true
			} else {
				e.queueReply(reply)
			}
		}
		return k, nil
	}
	switch {
	case e.err != nil:
		return 0, e.err
	case e.peerGone || e.peerDone:
		return 0, io.EOF
	}
	return 0, e.recvBlocked(false)
}

// queueReply queues what Consume gives back to the peer: the window's
// announcement again (Valkey's mode) or a Credit (ring mode).
func (e *Engine) queueReply(m wire.Message) {
	if e.draining || e.err != nil || e.peerGone {
		return
	}
	// While the link is lost, the consumed total goes with Resume.
	switch m.Op {
	case wire.OpRegisterXferMemory:
		e.ctl.want |= wantAnnounce
	case wire.OpCredit:
		e.ctl.want |= wantCredit
		e.ctl.credit = m
	}
	e.flushControl()
}

// Write copies as much of b as the rings and the peer's window allow into
// the transmit ring and queues it to be posted (or holds it, to coalesce
// with the Writes after it). It returns how much it took, with
// ErrWouldBlock if that is not all of b: the caller waits until Writable.
//
// Coalescing: bytes of a small Write (under corkLimit) wait while a
// signaled request is in flight, and go out with the Writes after them
// when it completes, as one data request. A Write with nothing in flight
// before it (a lone one, or one answering the peer) is posted at once; a
// Write that follows unacknowledged ones posted without a completion
// requested asks for one, so that the Writes after it can wait for it.
func (e *Engine) Write(b []byte) (int, error) {
	written := 0
	e.reserveWant, e.memWant = 0, false
	// A committed write buffer in the ring is posted from where it is,
	// and the ring is not replaced under it (view.go).
	owns := e.ownsReserved(b)
	if e.reserved != nil && !owns && len(b) > 0 {
		return 0, ErrBufferHeld
	}
	commit := owns && e.reservedInRing
	if !commit {
		e.sendLarge(len(b))
	}
	for {
		if stop, err := e.writeStops(written, len(b), !commit); stop {
			return written, err
		}
		room := e.send.Room()
		off, space := e.sq.RingSpace()
		if room == 0 || space == 0 || !e.rc.canData() {
			if room > 0 && space == 0 && e.sq.SlotsFree() > 0 {
				e.sendFull()
			}
			// Nothing held may wait with the writer.
			e.postHeld(false)
			return written, ErrWouldBlock
		}
		n := min(uint64(len(b)-written), uint64(room), space)
		if dst := e.cfg.SendRing[off:]; !inPlace(dst, b[written:]) {
			copy(dst, b[written:written+int(n)])
		}
		remote, rkey, _ := e.send.Take(uint32(n))
		if held := e.sq.Held(); held > 0 && (off != e.corkOff+held || remote != e.corkRemote+held || rkey != e.corkRKey) {
			// Not contiguous with the held bytes (a ring wrapped).
			e.postHeld(false)
		}
		if e.sq.Held() == 0 {
			e.corkOff, e.corkRemote, e.corkRKey = off, remote, rkey
		}
		e.sq.Hold(n)
		written += int(n)
		small := len(b) < corkLimit && e.sq.Held() < corkLimit
		if small && e.sq.SignaledPending() {
			continue
		}
		stream := small && !e.sq.SignaledPending() && !e.sq.Idle() && !e.arrived
		e.postHeld(stream)
	}
}

// writeStops says whether a write of n bytes, written of them taken,
// returns now: with nil once all are, with its error, or with
// ErrWouldBlock while the stream is suspended or, where the write puts
// bytes in the transmit ring's accounting (grows), the ring waits to be
// replaced.
func (e *Engine) writeStops(written, n int, grows bool) (bool, error) {
	if err := e.sendErr(); err != nil {
		return true, err
	}
	switch {
	case written == n:
		return true, nil
	case e.suspended():
		return true, ErrWouldBlock
	case e.grow.wantSend > 0 && grows:
		// The transmit ring is replaced once what it holds completed.
		e.postSignaled()
		return true, ErrWouldBlock
	}
	return false, nil
}

// sendErr is the error of a Write now, if the stream can take no more
// bytes: its failure, the peer gone or closed, or this side's CloseWrite.
func (e *Engine) sendErr() error {
	switch {
	case e.err != nil:
		return e.err
	case e.peerGone || e.peerClosed:
		return ErrPeerClosed
	case e.wrDone:
		return ErrWriteShutdown
	}
	return nil
}

// postSignaled posts what is held, and a signaled marker after requests
// posted unsignaled: a completion comes for everything in flight, which a
// writer (or a drain) waits for.
func (e *Engine) postSignaled() {
	e.postHeld(true)
	e.signalTail()
}

// postHeld queues the held bytes as one data request, signaled if signal
// is set or the send queue's accounting wants it.
func (e *Engine) postHeld(signal bool) {
	if e.sq.Held() == 0 || e.sq.SlotsFree() == 0 || e.lost != nil {
		// With no slot free, signaled requests are in flight, and the
		// completion that frees one posts what is held (AfterCompletions).
		return
	}
	if !e.rc.canData() {
		// The peer's Credit posts them (AfterCompletions).
		e.waitCredit()
		return
	}
	e.rc.spend()
	n, id, signaled := e.sq.PostHeld(signal)
	e.out = append(e.out, link.SendWR{
		Kind: link.SendData, Signaled: signaled, ID: id,
		Off: uint32(e.corkOff), N: uint32(n), Remote: e.corkRemote, RKey: e.corkRKey,
	})
	e.posted(signaled)
	e.arrived = false
}

// posted notes that a request was queued (signaled, if it was). A signaled
// request that is now the only one outstanding starts the clock of the
// path's progress (see Tick).
func (e *Engine) posted(signaled bool) {
	now := e.cfg.Clock()
	e.lastPost = now
	if signaled && e.sq.SignaledOutstanding() == 1 {
		e.lastProgress = now
	}
}

// CloseWrite shuts down the sending side: held bytes go out, then
// Shutdown, which the link delivers after them. It needs the half-close
// extension.
func (e *Engine) CloseWrite() error {
	switch {
	case e.cfg.Features&wire.FeatureShutdown == 0:
		return ErrHalfCloseUnsupported
	case e.err != nil:
		return e.err
	case e.wrDone:
		return nil
	}
	e.wrDone = true
	e.postHeld(false)
	if e.suspended() {
		// It goes after the bytes that are sent again (resendData).
		e.reshutdown = true
		return nil
	}
	if !e.peerGone {
		e.ctl.want |= wantShutdown
		e.flushControl()
	}
	return nil
}

// Handle takes one completion from the link. After a batch, the caller
// calls AfterCompletions, then Flush.
func (e *Engine) Handle(c *link.Completion) {
	switch c.Kind {
	case link.SendDone:
		control, err := e.sq.Complete(c.ID)
		if err != nil {
			e.Fail(err)
			return
		}
		e.lastProgress = e.cfg.Clock()
		if control {
			e.ctl.outstanding--
		}
	case link.DataArrived:
		e.reposts++
		e.arrivedMsgs++
		e.heard()
		if e.resuming {
			e.Fail(protocolErrorf("data before the peer's Resume on a resumed link"))
			return
		}
		if err := e.recv.Arrived(c.N); err != nil {
			e.Fail(err)
			return
		}
		e.arrived = true
		e.dataArrived()
	case link.ControlArrived:
		e.reposts++
		e.arrivedMsgs++
		e.heard()
		m, err := wire.Decode(c.Msg[:], e.cfg.Features != 0)
		if err != nil {
			e.Fail(err)
			return
		}
		e.control(m)
	case link.Disconnected:
		if e.resumable && e.cfg.Features&wire.FeatureClose != 0 && !e.peerClosed {
			e.Fail(ErrPeerLeftLink)
			return
		}
		e.peerGone = true
	case link.Failed:
		e.Fail(c.Err)
	default:
		e.Fail(protocolErrorf("unknown completion %v", c.Kind))
	}
}

// control acts on a control message from the peer.
func (e *Engine) control(m wire.Message) {
	switch {
	case e.resuming && m.Op != wire.OpResume:
		e.Fail(protocolErrorf("%v before the peer's Resume on a resumed link", m.Op))
		return
	case !e.resuming && m.Op == wire.OpResume:
		e.Fail(protocolErrorf("Resume on a link that was not resumed"))
		return
	}
	switch m.Op {
	case wire.OpResume:
		if !e.resumable {
			e.Fail(protocolErrorf("Resume without the session extension"))
			return
		}
		sent := e.send.(*SendRing).Sent()
		if err := e.send.(*SendRing).Rewind(m.ReceivedBytes, m.ConsumedBytes); err != nil {
			e.Fail(err)
			return
		}
		e.sq.Rewind(m.ReceivedBytes, m.ConsumedBytes)
		e.resuming, e.resend = false, sent-m.ReceivedBytes
	case wire.OpRegisterXferMemory:
		// After a Relink, the peer announces the ring this side's bytes
		// land in now, which may have grown since its Hello.
		if e.cfg.Features&wire.FeatureRing != 0 && e.cfg.PeerHello && m.Length != e.cfg.Peer.RingSize && !e.relinked {
			e.Fail(protocolErrorf("peer announced a %d-byte ring after offering %d bytes", m.Length, e.cfg.Peer.RingSize))
			return
		}
		if e.peerRingKnown {
			// The peer's own announcement of the ring named before.
			e.peerRingKnown = false
			if p := e.cfg.PeerRing; m.Addr != p.Addr || m.Length != p.Length || m.RKey != p.RKey {
				e.Fail(protocolErrorf("peer announced a ring (%d bytes at %#x) other than the one it named (%d bytes at %#x)", m.Length, m.Addr, p.Length, p.Addr))
			}
			return
		}
		if err := e.send.Announce(m); err != nil {
			e.Fail(err)
		}
	case wire.OpCredit:
		if err := e.send.Credit(m); err != nil {
			e.Fail(err)
			return
		}
		e.sq.Ack(m.ConsumedBytes)
		before := e.rc.available()
		if err := e.rc.peerReport(m.Receives); err != nil {
			e.Fail(err)
			return
		}
		if e.rc.available() > before {
			e.creditShort = time.Time{}
		}
	case wire.OpShutdown:
		if e.cfg.Features&wire.FeatureShutdown == 0 {
			e.Fail(protocolErrorf("Shutdown without the half-close extension"))
			return
		}
		if err := e.endAt(m); err != nil {
			e.Fail(err)
			return
		}
		e.peerDone = true
	case wire.OpClose:
		if e.cfg.Features&wire.FeatureClose == 0 {
			e.Fail(protocolErrorf("Close without the close extension"))
			return
		}
		if err := e.endAt(m); err != nil {
			e.Fail(err)
			return
		}
		// Nothing follows it: the peer's stream ends here too.
		e.peerDone, e.peerClosed = true, true
	case wire.OpGetServerFeature:
		if e.cfg.Server {
			if e.ctl.featureReplies >= maxFeatureReplies {
				e.Fail(protocolErrorf("peer asked for server features %d times without waiting for the answers", e.ctl.featureReplies+1))
				return
			}
			e.ctl.featureReplies++
		}
	case wire.OpWritten:
		// A link with write notices turns them into arrivals: one that
		// reaches the engine came on a link that agreed on none.
		e.Fail(protocolErrorf("Written on a link without write notices"))
	case wire.OpKeepalive:
		if e.rc.on {
			// The peer learns from the answer that the path works.
			e.ctl.want |= wantCredit
		}
	case wire.OpRing:
		e.ringOffered(m)
	case wire.OpRingAt:
		e.ringAt(m)
	case wire.OpRetain:
		e.retainTold(m)
	case wire.OpSetClientFeature:
	}
}

// endAt checks, with FeatureEndAt, that every byte the peer's Shutdown or
// Close says it sent arrived: a lost arrival is an error, not an early EOF.
func (e *Engine) endAt(m wire.Message) error {
	if e.cfg.Features&wire.FeatureEndAt == 0 {
		return nil
	}
	if arrived := e.received(); m.At != arrived {
		return protocolErrorf("%v at %d bytes; %d arrived before it", m.Op, m.At, arrived)
	}
	return nil
}

// heard notes a message from the peer: a passive side that waited for the
// first may speak now, and the path works.
func (e *Engine) heard() {
	e.muted = false
	e.lastHeard, e.probed = e.cfg.Clock(), false
}

// AfterCompletions runs after a batch of completions: held bytes whose
// signaled request completed go out, and control messages waiting for a
// slot take the ones that came free.
func (e *Engine) AfterCompletions() {
	if e.err != nil || e.peerGone {
		// The link's requests were flushed: none reads the memory.
		e.DropMems()
	}
	if e.err != nil || e.lost != nil {
		return
	}
	e.releaseMems()
	e.resendData()
	if e.sq.Held() > 0 && !e.sq.SignaledPending() {
		// What the held bytes waited for completed: send them, signaled,
		// so that Writes meanwhile hold theirs behind them.
		e.postHeld(true)
	}
	e.flushControl()
}

// flushControl queues the control messages that have a control slot and a
// send queue slot, in a fixed order (the announcement first: the peer may
// send nothing before it).
func (e *Engine) flushControl() {
	for e.err == nil && e.lost == nil && e.ctl.outstanding < e.ctl.slots && e.sq.SlotsFree() > 0 {
		if !e.rc.canControl(true) {
			if e.ctl.pending(e.draining, e.controlOrder()) {
				e.waitCredit()
			}
			return
		}
		m, ok := e.ctl.next(e.draining, !e.rc.canControl(false), e.controlOrder())
		if !ok {
			if e.ctl.pending(e.draining, e.controlOrder()) {
				e.waitCredit()
			}
			return
		}
		if m.Op == wire.OpRingAt {
			// Every byte before it is posted (dataFirst): what follows goes
			// to the new ring.
			m = e.send.(*SendRing).Switch()
		}
		if (m.Op == wire.OpShutdown || m.Op == wire.OpClose) && e.cfg.Features&wire.FeatureEndAt != 0 {
			// Every byte before it is posted (dataFirst): they end here.
			m.At = e.send.(*SendRing).Sent()
		}
		if m.Op == wire.OpCredit {
			// The newest totals: what was read, and the receives posted
			// again, which may have grown since the Credit was queued.
			if r, ok := e.recv.(*RecvRing); ok {
				_, m.ConsumedBytes = r.Totals()
			}
			e.rc.stamp(&m)
		}
		e.rc.spend()
		wr := link.SendWR{Kind: link.SendControl, Signaled: true, ID: e.sq.PostControl()}
		m.Encode(&wr.Msg)
		e.out = append(e.out, wr)
		e.ctl.outstanding++
		e.posted(true)
	}
}

// Flush posts what the engine queued: requests, then the receives to post
// again. A link error fails the stream.
func (e *Engine) Flush(l Poster) error {
	if e.lost != nil {
		// Nothing goes to a lost link; Relink starts the new one afresh.
		clear(e.out)
		e.out, e.reposts = e.out[:0], 0
		return nil
	}
	if e.growthDue() && e.err == nil {
		e.applyGrowth(l)
	}
	// Receives first: a Credit due for them goes in this Flush.
	if e.reposts > 0 && !e.draining && e.err == nil {
		n := e.reposts
		e.reposts = 0
		if err := l.PostRecv(n); err != nil {
			e.Fail(err)
			return err
		}
		g := n
		if gr, ok := l.(link.RecvGranter); ok && e.rc.grants {
			held := e.rc.outstanding(n)
			if held < 0 {
				// Its messages took receives of a pool that other links
				// share: beyond its credit, they were other links'.
				err := protocolErrorf("the peer sent %d messages beyond the credit it was granted", -held)
				e.Fail(err)
				return err
			}
			g = e.rc.grant(n, gr.Grant(held, n))
		}
		if e.rc.postedAgain(n, g) {
			e.ctl.want |= wantCredit
			e.flushControl()
		}
	}
	if len(e.out) > 0 && !e.muted {
		err := l.PostSend(e.out)
		clear(e.out)
		e.out = e.out[:0]
		if err != nil {
			e.Fail(err)
			return err
		}
	}
	return nil
}

// waitCredit notes that a message waits for the peer's receive credit.
func (e *Engine) waitCredit() {
	if e.creditShort.IsZero() {
		e.creditShort = e.cfg.Clock()
	}
}

// Poster is what Flush posts on: a link.Link.
type Poster interface {
	PostSend(wrs []link.SendWR) error
	PostRecv(n int) error
}

// Tick is called when the time NextTick returned comes (later is fine).
// It sends Keepalive on a connection that posted nothing for KeepAlive
// (longer while its path is busy: idleFactor), and
// fails the stream with a *PathDeadError when requests have been
// outstanding with no completion for deadFactor x KeepAlive.
func (e *Engine) Tick() {
	now := e.cfg.Clock()
	if e.cfg.KeepAlive <= 0 || e.err != nil || e.lost != nil || e.peerGone {
		return
	}
	e.skipStall(now)
	if e.sq.SignaledPending() && !now.Before(e.deadAt(e.lastProgress, e.pathSent)) {
		e.Fail(&PathDeadError{Outstanding: now.Sub(e.lastProgress), Waited: waitedSend})
		return
	}
	// A peer that takes messages posts their receives again at once:
	// credit that does not come is a dead path too.
	if !e.creditShort.IsZero() && !now.Before(e.deadAt(e.creditShort, e.pathHeard)) {
		e.Fail(&PathDeadError{Outstanding: now.Sub(e.creditShort), Waited: waitedCredit})
		return
	}
	if e.rc.on {
		silent := now.Sub(e.lastHeard)
		if !now.Before(e.deadAt(e.lastHeard, e.pathHeard)) {
			e.Fail(&PathDeadError{Outstanding: silent, Waited: waitedHeard})
			return
		}
		if !e.probed && !e.draining && !now.Before(e.idleDue(e.lastHeard, now)) {
			e.probed = true
			e.ctl.want |= wantKeepalive
			e.flushControl()
		}
	}
	e.shrinkIdle(now)
	if !e.draining && !now.Before(e.idleDue(e.lastPost, now)) {
		e.ctl.want |= wantKeepalive
		e.flushControl()
		e.lastPost = now // one Keepalive per period, even while it waits for a slot
	}
}

// idleDue is when an idle wait that began at since (the last post, for a
// keepalive; the last message heard, for a probe) next needs a Tick:
// KeepAlive after since, or, while the path is busy, half a KeepAlive
// later each time it is still busy then (so that a path that goes quiet
// gets its keepalives no later than before), up to idleFactor x
// KeepAlive after since. Tick sends when it is not after now.
func (e *Engine) idleDue(since, now time.Time) time.Time {
	ka := e.cfg.KeepAlive
	due := since.Add(ka)
	if now.Before(due) || !e.pathBusy(now) {
		return due
	}
	return minTime(now.Add(ka/2), since.Add(idleFactor*ka))
}

// pathBusy: a send completed and a message arrived on the connection's
// path (PathProgress) within the last half KeepAlive. Both: a path that
// carries one way only is not well.
func (e *Engine) pathBusy(now time.Time) bool {
	half := e.cfg.KeepAlive / 2
	return !e.pathSent.IsZero() && !e.pathHeard.IsZero() && now.Sub(e.pathSent) < half && now.Sub(e.pathHeard) < half
}

// skipStall takes out of every wait the time this side could not run: a
// Tick more than half a KeepAlive later than NextTick said ran on a
// machine that stalled (a loaded host, a virtual machine descheduled),
// and a wait it could not watch is no evidence of a dead path: what came
// meanwhile may not have been polled yet, and the peer's keepalive may be
// about to go. Every wait is moved on by the stall, and so that it has
// half a KeepAlive at least left before it counts as a dead path.
func (e *Engine) skipStall(now time.Time) {
	due := e.tickDue
	e.tickDue = time.Time{}
	ka := e.cfg.KeepAlive
	late := now.Sub(due)
	if due.IsZero() || late <= ka/2 {
		return
	}
	for _, t := range []*time.Time{&e.lastProgress, &e.lastHeard, &e.creditShort, &e.pathSent, &e.pathHeard} {
		if !t.IsZero() && t.Before(due) {
			moved := t.Add(late)
			if least := now.Add(ka/2 - deadFactor*ka); moved.Before(least) {
				moved = least
			}
			*t = minTime(moved, now)
		}
	}
}

// deadAt is when a wait that began at since counts as a dead path:
// deadFactor x KeepAlive after it, or, while the path made progress since
// (path: its latest), deadFactor x KeepAlive after that progress, but no
// later than lateFactor x KeepAlive after since.
func (e *Engine) deadAt(since, path time.Time) time.Time {
	ka := e.cfg.KeepAlive
	dead := since.Add(deadFactor * ka)
	if byPath := path.Add(deadFactor * ka); byPath.After(dead) {
		dead = minTime(byPath, since.Add(lateFactor*ka))
	}
	return dead
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// PathProgress tells the engine when a send last completed (sent) and a
// message last arrived (heard) on any link of the same path: the same
// device and peer (link.PathWatcher). Tick and NextTick use the latest it
// was told, so a connection that waits behind others on a busy device is
// not taken for dead while they progress; a path that goes silent still
// ends every connection on it within deadFactor x KeepAlive.
func (e *Engine) PathProgress(sent, heard time.Time) {
	if sent.After(e.pathSent) {
		e.pathSent = sent
	}
	if heard.After(e.pathHeard) {
		e.pathHeard = heard
	}
}

// NextTick is when Tick has something to check: the next keepalive, or the
// moment outstanding requests would count as a dead path. Zero: never.
func (e *Engine) NextTick() time.Time {
	if e.cfg.KeepAlive <= 0 || e.err != nil || e.lost != nil || e.peerGone {
		return time.Time{}
	}
	now := e.cfg.Clock()
	next := e.idleDue(e.lastPost, now)
	if e.sq.SignaledPending() {
		if dead := e.deadAt(e.lastProgress, e.pathSent); dead.Before(next) || e.draining {
			next = dead
		}
	}
	if !e.creditShort.IsZero() {
		if dead := e.deadAt(e.creditShort, e.pathHeard); dead.Before(next) {
			next = dead
		}
	}
	if e.rc.on {
		probe := e.idleDue(e.lastHeard, now)
		if e.probed || e.draining {
			probe = e.deadAt(e.lastHeard, e.pathHeard)
		}
		if probe.Before(next) {
			next = probe
		}
	}
	// A Tick is due then, or at once if that has passed.
	e.tickDue = next
	if now.After(next) {
		e.tickDue = now
	}
	return next
}

// Drain starts an orderly close: nothing new is sent (no credit, no
// keepalive) but held bytes, and, if requests were posted unsignaled, a
// signaled marker after them, so that Idle tells when all have completed.
func (e *Engine) Drain() {
	e.draining = true
	if e.err != nil || e.lost != nil || e.peerGone {
		return
	}
	e.postSignaled()
	if e.cfg.Features&wire.FeatureClose != 0 {
		e.ctl.want |= wantClose
		e.flushControl()
	}
}

// signalTail posts a signaled marker after requests posted unsignaled, so
// that a completion comes for them: Idle and Completed then tell when all
// have.
func (e *Engine) signalTail() {
	if addr, rkey, ok := e.send.Target(); ok && e.sq.Unsignaled() && e.sq.SlotsFree() > 0 {
		e.out = append(e.out, link.SendWR{Kind: link.SendMarker, Signaled: true, ID: e.sq.PostMarker(), Remote: addr, RKey: rkey})
		e.posted(true)
	}
}

// controlOrder is what control messages wait for now: the messages that
// end the stream (Shutdown, Close) wait for bytes that may still be to post
// (held, or, on a resumed link, to be sent again, which the peer's Resume
// tells); RingAt only for those held and the Resume (controlOrder).
func (e *Engine) controlOrder() controlOrder {
	held := e.sq.Held() > 0 || e.resuming
	return controlOrder{dataFirst: held || e.resend > 0, heldFirst: held}
}

// Drained reports whether an orderly close may disconnect now: every
// request completed (and no control message waits), or the stream ended.
func (e *Engine) Drained() bool {
	switch {
	case e.err != nil || e.peerGone:
		return true
	case e.lost != nil || e.resuming || e.resend > 0:
		return false // a session that lost its link resumes to deliver
	}
	return (e.sq.Idle() && e.sq.Held() == 0 && !e.ctl.pending(true, controlOrder{}))
}

// suspended reports whether new bytes must wait: the link is lost, or a
// new one has not yet resumed where the peer's stream ends.
func (e *Engine) suspended() bool { return e.lost != nil || e.resuming || e.resend > 0 }

// resendData sends again, after the peer's Resume, the bytes it did not
// receive. They are still in the transmit ring, at the same positions (the
// ring keeps what the peer has not consumed), and go to the same positions
// of the peer's ring. Then a Shutdown that was sent or due goes again.
func (e *Engine) resendData() {
	for e.resend > 0 && e.lost == nil && !e.resuming {
		room := e.send.Room()
		off, space := e.sq.RingSpace()
		if room == 0 || space == 0 || !e.rc.canData() {
			return
		}
		n := min(e.resend, uint64(room), space)
		remote, rkey, _ := e.send.Take(uint32(n))
		e.corkOff, e.corkRemote, e.corkRKey = off, remote, rkey
		e.sq.Hold(n)
		e.resend -= n
		e.postHeld(e.resend == 0)
	}
	if e.resend == 0 && !e.resuming && e.reshutdown {
		e.reshutdown = false
		e.ctl.want |= wantShutdown
		e.flushControl()
	}
}

// sendDepth is the send queue's depth on a link with caps toward a peer
// whose Hello says it keeps peerDepth receives posted. It honours the
// peer's receives: never more requests in flight than it keeps posted, so
// none finds the peer without a receive (an RNR wait for an rdmanet peer, a
// fatal error for a peer that accepted with an RNR retry count of 0, as
// Valkey's clients get). With grants, peerDepth is only the peer's first
// grant (a group stream's 8), which grows: the credit already keeps every
// message within the receives given, and a depth of 8 would signal every
// other request (a send completion in each round trip).
func sendDepth(caps link.Caps, peerDepth int) int {
	if caps.RecvCredit && caps.RecvGrant {
		return caps.SendDepth
	}
	return min(caps.SendDepth, peerDepth)
}
