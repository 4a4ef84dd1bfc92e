package link

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Pipe is one end of an in-memory link: two connected ends that behave like
// an RDMA reliable connection (ordered, no loss, no duplication, receives
// consumed by messages, remote writes checked against the peer's announced
// ring), so the engine and net.Conn's contract are tested on any machine.
// Faults are injected with SetDelay, StopReposting, Silence, Cut and FailNext
// (pipe_faults.go).
//
// Both ends share one mutex: a request's landing touches both ends at once
// (the peer's ring, receives and completions, then this end's SendDone), and
// one lock keeps that atomic without a lock order to get wrong. The pipe is
// for tests, where contention on it costs nothing that matters.
type Pipe struct {
	pair *pair
	peer *Pipe
	cfg  PipeConfig

	send, recv    []byte
	addr          uint64
	rkey          uint32
	rings         []pipeRing        // receive rings made by NewRecvRing (pipe_rings.go)
	ringBytes     int               // bytes of rings made and not yet given back
	ringCount     uint32            // rings made, for their addresses
	recvGone      bool              // the first receive ring was given back
	replacedSend  bool              // the transmit ring is one ReplaceSendRing made (it counts in ringBytes)
	streamSends   map[uint32][]byte // stream transmit rings by key (NewSendRing, ShareSendRing)
	sharedSends   map[uint32]bool   // those ShareSendRing registered
	streamKeys    uint32            // SendKeys given
	local, remote netip.AddrPort

	// What this end sent and has not yet landed, in post order. The head
	// gates everything behind it: a delayed or receiver-not-ready request
	// holds up the ones after it, as a queue pair's send queue does.
	flight   []request
	timer    *time.Timer // lands flight's head when it becomes due
	timerSet bool
	timerDue time.Time
	delay    time.Duration
	failNext error // set by FailNext, taken by the next request posted
	// failRegisterMem: RegisterMem fails (FailRegisterMem).
	failRegisterMem bool

	// Outstanding requests: seq numbers every counted request; retired is the
	// seq of the last signaled request whose SendDone Poll took (it retires
	// everything up to it). controls holds the seqs of outstanding
	// SendControl requests, oldest first.
	seq, retired  uint64
	controls      []uint64
	disconnecting bool // Disconnect was called: later requests are flushed

	heard      bool // a request of the peer's landed here (SpeakSecond)
	recvPosted int  // receives posted now (without a RecvPool)
	held       int  // with a RecvPool: the credit the peer holds (Grant)
	taken      int  // with a RecvPool: receives the peer's messages took, not posted again
	withheld   int  // receives PostRecv accepted while StopReposting
	stopRepost bool // StopReposting(true)

	cq    []entry   // completions for Poll, in order
	down  bool      // the Disconnected or Failed completion was queued (it is last)
	armed bool      // Arm was called and no completion has arrived since
	event bool      // a completion arrived while armed: the next Wait returns
	woken bool      // Wake was called: the next Wait returns ErrWoken
	cond  sync.Cond // Wait sleeps on it; its lock is pair.mu
	// waits counts the Waits running; notify is SetNotify's function, called
	// instead when an event finds none.
	waits  int
	notify func()
	closed bool

	stats PipeStats
}

var _ Link = (*Pipe)(nil)

// pair is what both ends of a pipe share: the connection.
type pair struct {
	mu sync.Mutex
	// over: the connection ended (disconnected or failed). Nothing more
	// lands in either direction; what is still in flight never completes.
	over bool
	// silent: the path went silent (Silence). Nothing more lands, nothing
	// completes, nothing is reported, not even a Disconnect or Close.
	silent bool
}

// request is one posted send request in flight.
type request struct {
	wr     SendWR
	seq    uint64
	due    time.Time // when it may land (post time plus the end's delay)
	fail   error     // FailNext: it fails instead of landing
	waited bool      // it found no receive at the peer and was counted
	data   []byte    // with EarlyCompletion, SendData's bytes as posted
}

// entry is a queued completion; seq is the request a SendDone completes.
type entry struct {
	c   Completion
	seq uint64
}

// PipeConfig is one end's resources.
type PipeConfig struct {
	// SendRing and RecvRing are the sizes in bytes of this end's transmit
	// and receive rings.
	SendRing, RecvRing int
	// SendMem and RecvMem, when set, are the rings (their lengths are the
	// sizes): memory that outlives the pipe, as a resumable session's rings
	// outlive a link. After Close, the pipe touches them no more.
	SendMem, RecvMem []byte
	// SendDepth, RecvDepth and ControlDepth are this end's Caps.
	SendDepth, RecvDepth, ControlDepth int
	// RNRRetry is what a message from this end does when the peer has no
	// receive posted. 0: this end's link fails (a Failed completion wrapping
	// ErrRNR), and so does the peer's, as a queue pair with rnr_retry 0 does.
	// Anything else: the message, and everything posted after it, waits until
	// the peer posts a receive, as rnr_retry 7 ("forever") does; the finite
	// retry counts 1 to 6 are not modelled and wait forever too.
	RNRRetry int
	// RecvCredit and SpeakSecond are reported in Caps, as an iWARP link
	// reports them. With SpeakSecond, a request posted before the peer's
	// first request landed at this end fails the connection (ErrSpokeFirst),
	// which is the worst an MPA peer may do with it.
	RecvCredit, SpeakSecond bool
	// RecvGrant is reported in Caps: both ends agreed on credit grants.
	RecvGrant bool
	// RecvPool, when set, is where the peer's messages to this end take
	// their receives (recvpool.go): RecvDepth is then the end's first
	// grant, and it needs RecvCredit and RecvGrant.
	RecvPool *RecvPool
	// EarlyCompletion completes a signaled request when it is posted, not
	// when it lands, as siw does once the kernel's TCP took the bytes: the
	// sender may run ahead of the peer's receives, and a completion proves
	// nothing about the path. The request's bytes are read at post time
	// then, and a Disconnect delivers what was posted before it, as TCP
	// delivers what it took before its FIN.
	EarlyCompletion bool
	// RingLimit bounds the bytes of rings NewRecvRing and ReplaceSendRing
	// may hold beyond the first two (0: no bound): past it they fail with
	// ErrRingsExhausted, as a registered pool that ran dry.
	RingLimit int
	// Device, when set, is the in-memory device the end is on: its
	// completions count against the device's one completion queue, and
	// its notify function is called from the device's goroutine (device.go).
	Device *Device
}

// ErrRNR is matched by the Err of a Failed completion when a message found no
// receive posted at the peer and the sender's RNRRetry was 0.
var ErrRNR = errors.New("link: receiver not ready, retries exhausted")

// ErrSpokeFirst is matched by the Err of a Failed completion when an end
// configured with SpeakSecond posted a request before the peer's first one
// landed.
var ErrSpokeFirst = errors.New("link: the passive side sent before the active side's first message")

// ErrRemoteAccess is matched by the Err of a Failed completion when a SendData
// or SendMarker wrote outside the peer's announced ring or with the wrong key.
var ErrRemoteAccess = errors.New("link: remote access error")

// ringBase is where the fake addresses of the receive rings start: a
// user-space-looking address, so a ring offset passed as an address fails.
const ringBase = 0x7f00_0000_0000

// endCount numbers the ends made, for their addresses and ring addresses.
var endCount atomic.Uint32

// NewPipe returns two connected ends, a with config a and b with config b.
// Each has all its RecvDepth receives posted, so either may send at once.
func NewPipe(a, b PipeConfig) (*Pipe, *Pipe) {
	p := &pair{}
	ea, eb := newEnd(p, a), newEnd(p, b)
	ea.peer, eb.peer = eb, ea
	ea.remote, eb.remote = eb.local, ea.local
	// On a device once whole: a device whose queue overran fails an end
	// at once, from another goroutine, and that reaches the peer.
	for _, e := range [2]*Pipe{ea, eb} {
		if d := e.cfg.Device; d != nil {
			d.add(e)
		}
	}
	return ea, eb
}

func newEnd(p *pair, cfg PipeConfig) *Pipe {
	if cfg.SendRing < 0 || cfg.RecvRing < 0 || cfg.SendDepth < 0 || cfg.RecvDepth < 0 ||
		cfg.ControlDepth < 0 || cfg.RNRRetry < 0 {
		// A test's own mistake, not the engine's: fail loudly.
		panic(fmt.Sprintf("link: NewPipe: negative value in %+v", cfg))
	}
	if cfg.RecvPool != nil && (!cfg.RecvCredit || !cfg.RecvGrant) {
		panic("link: NewPipe: a RecvPool without RecvCredit and RecvGrant")
	}
	// The id only labels the end: its address, and where its ring seems to be.
	id := endCount.Add(1) & 0xff_ffff
	e := &Pipe{
		pair:       p,
		cfg:        cfg,
		send:       cfg.SendMem,
		recv:       cfg.RecvMem,
		addr:       ringBase + uint64(id)<<32,
		rkey:       rand.Uint32(),
		local:      netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(id >> 16), byte(id >> 8), byte(id)}), uint16(1024+id%64512)),
		recvPosted: cfg.RecvDepth,
	}
	if e.send == nil {
		e.send = make([]byte, cfg.SendRing)
	}
	if e.recv == nil {
		e.recv = make([]byte, cfg.RecvRing)
	}
	if pool := cfg.RecvPool; pool != nil {
		e.recvPosted, e.held = 0, cfg.RecvDepth
		pool.join(cfg.RecvDepth)
	}
	e.cond.L = &p.mu
	return e
}

var _ RecvGranter = (*Pipe)(nil)

// Grant is the credit this end gives for n receives the peer's messages
// took (RecvGranter): without a RecvPool, the n posted again; with one,
// what the pool has for it.
func (e *Pipe) Grant(held, n int) int {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	pool := e.cfg.RecvPool
	if pool == nil || e.closed {
		return n
	}
	g := pool.grant(held, n, e.cfg.RecvDepth)
	e.held = held + g
	return g
}

// takeRecv takes a receive at this end for a message landing, or reports
// that none is posted.
func (e *Pipe) takeRecv() bool {
	if pool := e.cfg.RecvPool; pool != nil {
		if !pool.take() {
			return false
		}
		e.taken++
		return true
	}
	if e.recvPosted == 0 {
		return false
	}
	e.recvPosted--
	return true
}

// poolRetry is how long a message that found a RecvPool dry waits before
// it tries again, as a receiver-not-ready timer (the pool's PostRecv is
// another pipe's, and cannot wake this one).
const poolRetry = time.Millisecond

// Caps returns the configured depths; nothing is sent inline, and the name
// is "memory".
func (e *Pipe) Caps() Caps {
	return Caps{
		SendDepth:    e.cfg.SendDepth,
		RecvDepth:    e.cfg.RecvDepth,
		ControlDepth: e.cfg.ControlDepth,
		Name:         "memory",
		Transport:    "memory",
		RecvCredit:   e.cfg.RecvCredit,
		RecvGrant:    e.cfg.RecvGrant,
		SpeakSecond:  e.cfg.SpeakSecond,
	}
}

// SendRing returns this end's transmit ring. A request's bytes are read when
// it lands, not when it is posted, as an RDMA device reads them: changing
// them before the request's completion is taken changes what the peer gets.
func (e *Pipe) SendRing() []byte { return e.send }

// RecvRing returns the ring the peer's SendData requests write into.
func (e *Pipe) RecvRing() []byte { return e.recv }

// RecvRingKey returns RecvRing's fake address (distinct for every end) and its
// random key, which the peer's requests must use.
func (e *Pipe) RecvRingKey() (addr uint64, rkey uint32) { return e.addr, e.rkey }

// Addrs returns labels from 127.0.0.0/8, distinct for every end; nothing
// is sent to them.
func (e *Pipe) Addrs() (local, remote netip.AddrPort) { return e.local, e.remote }

// PostSend validates every request first and posts all or none of them.
func (e *Pipe) PostSend(wrs []SendWR) error {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	e.stats.Calls.PostSend++
	if e.closed {
		return closedError("PostSend")
	}
	controls := 0
	for i := range wrs {
		wr := &wrs[i]
		switch wr.Kind {
		case SendData:
			src, ok := e.dataSrc(wr)
			if !ok {
				return misuse("PostSend: request %d: no stream ring %d", i, wr.Ring)
			}
			if wr.Mem != nil {
				if err := e.registerLocked(wr.Mem); err != nil {
					return fmt.Errorf("link: memory: PostSend: request %d: %w", i, err)
				}
			}
			if uint64(wr.Off)+uint64(wr.N) > uint64(len(src)) {
				return misuse("PostSend: request %d: data [%d, %d) outside the %d-byte send ring",
					i, wr.Off, uint64(wr.Off)+uint64(wr.N), len(src))
			}
		case SendControl:
			if !wr.Signaled {
				return misuse("PostSend: request %d: unsignaled control", i)
			}
			controls++
		case SendMarker:
		default:
			return misuse("PostSend: request %d: kind %d", i, wr.Kind)
		}
	}
	if e.disconnecting || e.pair.over {
		// The queue pair is disconnecting or in the error state: it flushes
		// requests. They never complete, so they do not count against the
		// depths either.
		e.stats.Posted += uint64(len(wrs))
		return nil
	}
	if out := e.seq - e.retired; out+uint64(len(wrs)) > uint64(e.cfg.SendDepth) {
		return misuse("PostSend: %d requests outstanding and %d more, SendDepth %d",
			out, len(wrs), e.cfg.SendDepth)
	}
	if len(e.controls)+controls > e.cfg.ControlDepth {
		return misuse("PostSend: %d control requests outstanding and %d more, ControlDepth %d",
			len(e.controls), controls, e.cfg.ControlDepth)
	}
	e.stats.Posted += uint64(len(wrs))
	due := time.Now().Add(e.delay)
	for _, wr := range wrs {
		e.seq++
		r := request{wr: wr, seq: e.seq, due: due}
		if wr.Kind == SendControl {
			e.controls = append(e.controls, e.seq)
		}
		if e.failNext != nil {
			r.fail, e.failNext = e.failNext, nil
		}
		if e.cfg.EarlyCompletion {
			if wr.Kind == SendData {
				src, _ := e.dataSrc(&wr)
				r.data = append([]byte(nil), src[wr.Off:wr.Off+wr.N]...)
			}
			if wr.Signaled {
				e.push(Completion{Kind: SendDone, ID: wr.ID}, e.seq)
			}
		}
		e.flight = append(e.flight, r)
	}
	e.pump()
	return nil
}

// PostRecv posts n receives, or withholds them while StopReposting.
func (e *Pipe) PostRecv(n int) error {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return closedError("PostRecv")
	}
	if n < 0 {
		return misuse("PostRecv(%d)", n)
	}
	if pool := e.cfg.RecvPool; pool != nil {
		if n > e.taken {
			return misuse("PostRecv: %d to post again, %d taken from the pool", n, e.taken)
		}
		e.taken -= n
		return pool.post(n)
	}
	// Withheld receives count: the caller believes they are posted.
	if posted := e.recvPosted + e.withheld; posted+n > e.cfg.RecvDepth {
		return misuse("PostRecv: %d posted and %d more, RecvDepth %d", posted, n, e.cfg.RecvDepth)
	}
	if e.stopRepost {
		e.withheld += n
		return nil
	}
	e.recvPosted += n
	e.peer.pump() // a message waiting for a receive may land now
	return nil
}

// Poll takes queued completions. Once it has returned the Disconnected or
// Failed completion, which is always the last, it returns 0.
func (e *Pipe) Poll(cs []Completion) (int, error) {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	e.stats.Calls.Poll++
	if len(e.cq) == 0 {
		e.stats.Calls.EmptyPoll++
	}
	if e.closed {
		return 0, closedError("Poll")
	}
	n := 0
	for n < len(cs) && n < len(e.cq) {
		en := e.cq[n]
		cs[n] = en.c
		n++
		if en.c.Kind == SendDone {
			e.retire(en.seq)
		}
	}
	// Shift what is left to the front: the array is reused, so a steady
	// stream of completions allocates nothing (benchmarks count allocations).
	clear(e.cq[copy(e.cq, e.cq[n:]):])
	e.cq = e.cq[:len(e.cq)-n]
	if d := e.cfg.Device; d != nil {
		d.taken(n)
	}
	return n, nil
}

// retire ends the outstanding requests up to seq, whose SendDone was taken.
func (e *Pipe) retire(seq uint64) {
	e.retired = seq
	for len(e.controls) > 0 && e.controls[0] <= seq {
		e.controls = e.controls[1:]
	}
}

// Arm makes the next completion end a Wait; one that arrived before does not.
func (e *Pipe) Arm() error {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	e.stats.Calls.Arm++
	if e.closed {
		return closedError("Arm")
	}
	e.armed, e.event = true, false
	return nil
}

// Wait returns nil after a completion arrived while armed, or at once while
// the link is down (its Disconnected or Failed completion queued or taken:
// nothing more will arrive, and sleeping would hang the caller); ErrWoken
// after Wake; an error wrapping net.ErrClosed once the end is closed.
func (e *Pipe) Wait() error {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	e.stats.Calls.Wait++
	e.waits++
	defer func() { e.waits-- }()
	for {
		switch {
		case e.closed:
			return closedError("Wait")
		case e.woken:
			e.woken = false
			return ErrWoken
		case e.event:
			e.event = false
			return nil
		case e.down:
			return nil
		}
		e.cond.Wait()
	}
}

// SetNotify makes f be called when a completion or the end finds no Wait.
func (e *Pipe) SetNotify(f func()) {
	e.pair.mu.Lock()
	e.notify = f
	e.pair.mu.Unlock()
}

// signal ends a Wait, or calls the notify function if none runs.
func (e *Pipe) signal() {
	e.cond.Broadcast()
	if e.waits == 0 && e.notify != nil {
		if d := e.cfg.Device; d != nil {
			d.call(e.notify)
		} else {
			e.notify()
		}
	}
}

// Wake makes the current or the next Wait return ErrWoken.
func (e *Pipe) Wake() {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	e.woken = true
	e.cond.Broadcast()
}

// Disconnect ends the connection as rdma_disconnect does: this end's queue
// pair goes to the error state, so what it posted and had not landed yet is
// flushed (it never lands nor completes), and the disconnect request
// travels through the connection manager, not behind the data: both ends
// get Disconnected at once, after what already landed. A connection that
// wants its data delivered waits for the completions first. Requests
// posted after it are flushed. A second Disconnect does nothing.
func (e *Pipe) Disconnect() error {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return closedError("Disconnect")
	}
	if e.disconnecting {
		return nil
	}
	e.disconnecting = true
	if e.pair.over || e.pair.silent {
		return nil
	}
	if e.cfg.EarlyCompletion {
		e.land(true)
		if e.pair.over {
			return nil
		}
	}
	d := Completion{Kind: Disconnected}
	e.pair.shut(e, d, d)
	return nil
}

// Close releases the end. Unless the connection already ended or went
// silent, the peer gets Disconnected at once, after what already landed, as
// when a process dies and its kernel disconnects for it: what this end still
// had in flight is lost. A Wait in progress returns. Close is idempotent.
func (e *Pipe) Close() error {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	e.flight = nil
	e.stopTimer()
	e.poisonRings()
	if d := e.cfg.Device; d != nil {
		d.remove(e, len(e.cq))
	}
	if pool := e.cfg.RecvPool; pool != nil {
		// The receives its peer's messages took go back with it, as an
		// application posts its buffers again when a queue pair goes.
		pool.leave(e.held)
		pool.post(e.taken)
	}
	if !e.pair.over && !e.pair.silent {
		e.pair.shut(e, Completion{}, Completion{Kind: Disconnected})
	}
	e.cond.Broadcast()
	return nil
}

// pump lands this end's requests at the peer, in order, for as long as the
// head of the queue can land: it is due, and a message finds a receive
// posted. Called with the mutex held, whenever that may have changed: a
// post, a receive posted at the peer, the delay timer.
func (e *Pipe) pump() { e.land(false) }

// land lands what pump lands; now lands it whether due or not.
func (e *Pipe) land(now bool) {
	t := e.peer
	for len(e.flight) > 0 && !e.pair.over && !e.pair.silent {
		r := &e.flight[0]
		if !now && time.Now().Before(r.due) {
			e.armTimer(r.due)
			return
		}
		if r.fail != nil {
			e.failRequest(r, r.fail)
			return
		}
		if e.cfg.SpeakSecond && !e.heard {
			e.failRequest(r, ErrSpokeFirst)
			return
		}
		var dst []byte
		if r.wr.Kind != SendControl {
			n := r.wr.N
			if r.wr.Kind == SendMarker {
				n = 0 // a marker writes nothing, whatever N says
			}
			var ok bool
			if dst, ok = t.ringAt(r.wr.Remote, r.wr.RKey, n); !ok {
				e.failRequest(r, fmt.Errorf("%w: [%#x, +%d) with key %#x: in none of the peer's rings (the first is [%#x, +%d) with key %#x)",
					ErrRemoteAccess, r.wr.Remote, n, r.wr.RKey, t.addr, len(t.recv), t.rkey))
				return
			}
		}
		if r.wr.Kind != SendMarker && !t.takeRecv() {
			if e.cfg.RNRRetry == 0 {
				e.failRequest(r, ErrRNR)
				return
			}
			if !r.waited {
				r.waited = true
				e.stats.RNRWaits++
			}
			if t.cfg.RecvPool != nil {
				e.armTimer(time.Now().Add(poolRetry))
			}
			return // PostRecv at the peer pumps again
		}

		t.heard = true
		switch r.wr.Kind {
		case SendData:
			if r.data != nil {
				copy(dst, r.data)
			} else {
				src, _ := e.dataSrc(&r.wr)
				copy(dst, src[r.wr.Off:r.wr.Off+r.wr.N])
			}
			t.push(Completion{Kind: DataArrived, N: r.wr.N, Tag: r.wr.Tag}, 0)
			e.stats.BytesLanded += uint64(r.wr.N)
		case SendControl:
			t.push(Completion{Kind: ControlArrived, Msg: r.wr.Msg}, 0)
		}
		if r.wr.Signaled && !e.cfg.EarlyCompletion {
			e.push(Completion{Kind: SendDone, ID: r.wr.ID}, r.seq)
		}
		// Shift, to reuse the array (see Poll).
		clear(e.flight[copy(e.flight, e.flight[1:]):])
		e.flight = e.flight[:len(e.flight)-1]
	}
}

// ringAt checks a write of n bytes at addr with rkey against this end's
// receive rings and returns where it lands.
func (e *Pipe) ringAt(addr uint64, rkey uint32, n uint32) ([]byte, bool) {
	if !e.recvGone {
		if b, ok := within(e.recv, e.addr, e.rkey, addr, rkey, n); ok {
			return b, true
		}
	}
	for _, r := range e.rings {
		if b, ok := within(r.mem, r.addr, r.rkey, addr, rkey, n); ok {
			return b, true
		}
	}
	return nil, false
}

// within is [addr, addr+n) of mem, which is named base and key, if it is
// inside.
func within(mem []byte, base uint64, key uint32, addr uint64, rkey uint32, n uint32) ([]byte, bool) {
	if rkey != key || addr < base {
		return nil, false
	}
	off := addr - base
	if off > uint64(len(mem)) || uint64(n) > uint64(len(mem))-off {
		return nil, false
	}
	return mem[off : off+uint64(n)], true
}

// failRequest fails the connection because request r of this end failed:
// this end's Failed completion comes after the SendDones before r, and the
// peer's after what landed before r, as when a queue pair's error ends the
// connection for both.
func (e *Pipe) failRequest(r *request, cause error) {
	err := fmt.Errorf("link: memory: %v request ID %d failed: %w", r.wr.Kind, r.wr.ID, cause)
	e.pair.shut(e,
		Completion{Kind: Failed, Err: err},
		Completion{Kind: Failed, Err: fmt.Errorf("link: memory: connection failed at the peer: %w", err)})
}

// push queues a completion and ends a Wait if the end is armed.
func (e *Pipe) push(c Completion, seq uint64) {
	e.enqueue(entry{c: c, seq: seq})
	if e.armed {
		e.stats.Events++
		e.armed, e.event = false, true
		e.signal()
	}
}

// shut ends the connection: nothing more lands in either direction, and what
// is still in flight never completes. e gets the terminal completion ce and
// its peer ct, each after what it already has, unless closed or already
// down. Called with the mutex held.
func (p *pair) shut(e *Pipe, ce, ct Completion) {
	p.over = true
	for _, x := range [2]*Pipe{e, e.peer} {
		x.flight = nil
		x.stopTimer()
	}
	e.terminate(ce)
	e.peer.terminate(ct)
}

// terminate queues the end's last completion, which ends any Wait.
func (e *Pipe) terminate(c Completion) {
	if e.closed || e.down {
		return
	}
	e.down = true
	e.enqueue(entry{c: c})
	e.signal()
}

// enqueue adds a completion to the end's queue, and to its device's count.
func (e *Pipe) enqueue(en entry) {
	e.cq = append(e.cq, en)
	if d := e.cfg.Device; d != nil {
		d.queued()
	}
}

// armTimer makes the timer pump this end when due arrives. One timer per end
// suffices: only the head of the queue is ever waited for.
func (e *Pipe) armTimer(due time.Time) {
	if e.timerSet && e.timerDue.Equal(due) {
		return
	}
	if e.timer == nil {
		e.timer = time.AfterFunc(time.Until(due), e.tick)
	} else {
		e.timer.Reset(time.Until(due))
	}
	e.timerSet, e.timerDue = true, due
}

// tick is the timer's function. It may run after the end was closed or the
// connection ended; pump then finds nothing to do.
func (e *Pipe) tick() {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	e.timerSet = false
	e.pump()
}

func (e *Pipe) stopTimer() {
	if e.timer != nil {
		e.timer.Stop()
	}
	e.timerSet = false
}

func closedError(op string) error {
	return fmt.Errorf("link: memory: %s: %w", op, net.ErrClosed)
}

func misuse(format string, args ...any) error {
	return fmt.Errorf("link: memory: %s: %w", fmt.Sprintf(format, args...), ErrMisuse)
}
