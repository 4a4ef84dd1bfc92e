package rdmanet

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/internal/proto"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// Conn is an RDMA connection. It implements net.Conn.
//
// Bytes written are copied into a registered transmit ring and sent as RDMA
// writes with immediate data into the peer's receive buffer; the caller's
// slice is never handed to the device. Received bytes are copied out of a
// registered receive buffer by Read. A blocked Read or Write takes the
// completions it waits for itself; otherwise one goroutine per connection
// takes them (parked in the netpoller between them), and one waits for the
// connection manager's events.
type Conn struct {
	id  *cm.ID
	res *resources
	cfg Config

	local, remote *Addr
	server        bool // answers GetServerFeature

	features wire.Features // the extensions both sides agreed on; 0 is Valkey's protocol

	mu       sync.Mutex // guards everything below, and the rings' contents
	recv     proto.Receiver
	send     proto.Sender
	sq       *proto.SendQueue
	ctlFree  []int           // free control send slots
	ctlQueue []wire.Message  // control messages waiting for a slot
	reposts  []verbs.RecvWR  // receives to post again, batched per completion sweep
	post     [1]verbs.SendWR // the request being posted: a field, so posting does not allocate

	// Bytes of small Writes held back while a signaled request is in
	// flight, to go out as one RDMA write when it completes (see Write):
	// where they are in the transmit ring and where they go. The send
	// queue's accounting counts them (Hold).
	corkOff, corkRemote uint64
	corkRKey            uint32
	arrived             bool // data arrived from the peer since this side last posted data

	// The completion channel has one poller at a time, its owner (see
	// "Who takes completions" below): the engine, or a blocked Read or
	// Write, which then sweeps with ownerWCs.
	owner    pollOwner
	wanting  int  // blocked Reads and Writes waiting for the poller's role
	poked    bool // the channel's deadline was forced into the past to wake its owner
	busy     bool // the owner's last sleep on the channel was short (BusyPoll)
	ownerWCs [32]verbs.WorkCompletion
	// Completions a Read or Write sweeps for itself with BusyPoll while
	// another goroutine polls (one array per direction: both may wait).
	readSpin, writeSpin [8]verbs.WorkCompletion
	err                 error // why the connection failed, if it did
	peerGone            bool  // the peer disconnected
	peerDone            bool  // the peer shut down its sending side (Shutdown)
	wrDone              bool  // this side shut down its sending side (CloseWrite)
	closing             bool  // Close has begun
	sentData            bool  // something was posted since the last keepalive tick
	flushed             bool  // the queue pair went to error (flushed completions seen)

	keepalive *time.Timer

	readable   chan struct{} // a Read may make progress (capacity 1)
	writable   chan struct{} // a Write may make progress (capacity 1)
	pollerFree chan struct{} // the poller's role is free for a waiter that wants it (capacity 1)
	engineKick chan struct{} // the poller's role is free for the engine (capacity 1)
	closed     chan struct{} // closed by Close

	readDeadline, writeDeadline deadline
	readMu, writeMu             sync.Mutex // one Read and one Write at a time, as net.Conn's stream semantics need

	engineDone, eventsDone chan struct{}
}

// wr_id layout: receives carry recvTag and their slot; sends carry the id the
// send queue accounting gave them.
const recvTag = 1 << 63

func newConn(id *cm.ID, cfg Config, server bool) (*Conn, error) {
	res, err := newResources(id, cfg)
	if err != nil {
		return nil, err
	}
	c := &Conn{
		id:            id,
		res:           res,
		cfg:           cfg,
		server:        server,
		sq:            proto.NewSendQueue(cfg.sendDepth(), uint64(cfg.SendBuffer)),
		reposts:       make([]verbs.RecvWR, 0, cfg.RecvDepth),
		ctlQueue:      make([]wire.Message, 0, controlSlots),
		readable:      make(chan struct{}, 1),
		writable:      make(chan struct{}, 1),
		pollerFree:    make(chan struct{}, 1),
		engineKick:    make(chan struct{}, 1),
		closed:        make(chan struct{}),
		readDeadline:  newDeadline(),
		writeDeadline: newDeadline(),
		engineDone:    make(chan struct{}),
		eventsDone:    make(chan struct{}),
	}
	for i := 0; i < controlSlots; i++ {
		c.ctlFree = append(c.ctlFree, i)
	}
	c.readDeadline.wake = c.deadlinePassed
	c.writeDeadline.wake = c.deadlinePassed
	// Every receive is posted before connecting or accepting, as Valkey does:
	// the peer may send the moment the connection is established.
	wrs := make([]verbs.RecvWR, cfg.RecvDepth)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: recvTag | uint64(i), Local: res.recvSlot(i)}
	}
	if err := res.qp.PostRecv(wrs); err != nil {
		res.close()
		return nil, err
	}
	return c, nil
}

// start runs once the connection is established with the extensions both
// sides agreed on and the peer's Hello (zero for a Valkey peer): it announces
// the receive buffer and starts the goroutines that take completions and
// events.
func (c *Conn) start(features wire.Features, peer wire.Hello) {
	c.local = &Addr{c.id.LocalAddr()}
	c.remote = &Addr{c.id.RemoteAddr()}
	c.features = features
	announce := wire.Message{Op: wire.OpRegisterXferMemory, Addr: c.res.rxMR.Addr(), Length: uint32(c.res.rx.Len()), RKey: c.res.rxMR.RKey()}
	if features&wire.FeatureRing != 0 {
		c.recv, c.send = proto.NewRecvRing(announce.Length), &proto.SendRing{}
	} else {
		c.recv, c.send = proto.NewRecvWindow(announce), &proto.SendWindow{}
	}
	c.mu.Lock()
	c.sendControl(announce)
	if c.cfg.KeepAlive > 0 {
		c.keepalive = time.AfterFunc(c.cfg.KeepAlive, c.tick)
	}
	c.mu.Unlock()
	go c.engine()
	go c.events()
}

// discard releases a connection that was never started (its handshake
// failed); the caller has closed or will close its cm ID.
func (c *Conn) discard() { c.res.close() }

// tick sends Keepalive if nothing else was sent since the last tick. The
// message is signaled: to a peer that is gone it fails once the transport's
// retries run out, and that failure ends the connection.
func (c *Conn) tick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || c.err != nil || c.peerGone {
		return
	}
	if !c.sentData {
		c.sendControl(wire.Message{Op: wire.OpKeepalive})
	}
	c.sentData = false
	c.keepalive.Reset(c.cfg.KeepAlive)
}

// ---- completions -------------------------------------------------------------

// Who takes completions. One goroutine at a time polls the completion queue
// and sleeps on the completion channel: the poller. A Read or Write that has
// to wait becomes the poller itself when the role is free, so the completion
// it waits for wakes it directly from the netpoller, with no hand-off through
// another goroutine (under the lab's emulation each hand-off between threads
// costs hundreds of microseconds). When no Read or Write waits, the engine
// goroutine is the poller, so that receives are reposted, credit is returned
// and failures are noticed while the application does something else. A
// waiter that finds someone else polling waits for it to notify or to hand
// the role on (with BusyPoll it sweeps meanwhile). A waiter that polls is
// poked awake (the channel's deadline forced into the past) when its
// deadline passes or the connection fails. All of this is decided under
// c.mu, and completions are handled under c.mu in queue order whoever takes
// them (sweep). With BusyPoll only the waiter spins, never the engine: one
// spinner per connection.

type pollOwner int8

const (
	ownerNone pollOwner = iota
	ownerEngine
	ownerWaiter
)

// handOffLocked gives a free poller's role to a waiter that wants it or
// else to the engine; c.mu is held.
func (c *Conn) handOffLocked() {
	if c.owner != ownerNone {
		return
	}
	if c.wanting > 0 {
		notify(c.pollerFree)
	} else {
		notify(c.engineKick)
	}
}

// takeLocked makes the caller the poller; c.mu is held.
func (c *Conn) takeLocked(who pollOwner) {
	c.owner = who
	c.unpokeLocked()
}

// pokeLocked wakes the poller from its sleep on the completion channel;
// c.mu is held.
func (c *Conn) pokeLocked() {
	if !c.poked && !c.closing && c.owner != ownerNone {
		c.poked = true
		c.res.ch.SetDeadline(time.Unix(1, 0))
	}
}

// unpokeLocked clears a poke before the poller sleeps again; c.mu is held.
// Close's own deadline stays.
func (c *Conn) unpokeLocked() {
	if c.poked && !c.closing {
		c.poked = false
		c.res.ch.SetDeadline(time.Time{})
	}
}

// deadlinePassed wakes a Read or Write that polls, when its deadline passes.
func (c *Conn) deadlinePassed() {
	c.mu.Lock()
	if c.owner == ownerWaiter {
		c.pokeLocked()
	}
	c.mu.Unlock()
}

// sleep arms the completion queue, polls once more, and sleeps on the
// completion channel until an event or a poke; it reports whether it took
// completions instead of sleeping, and the channel's error (a poke is
// os.ErrDeadlineExceeded). Completion events are one-shot: arming after
// the queue was found empty and polling once more before sleeping is what
// keeps a completion that landed in between from going unannounced.
func (c *Conn) sleep(wcs []verbs.WorkCompletion) (took bool, err error) {
	if err := c.res.cq.RequestNotify(false); err != nil {
		c.fail(err)
		return false, err
	}
	if c.sweep(wcs) {
		return true, nil
	}
	slept := time.Now()
	_, err = c.res.ch.Wait(context.Background())
	if err == nil && c.cfg.BusyPoll > 0 {
		short := time.Since(slept) < 10*c.cfg.BusyPoll
		c.mu.Lock()
		c.busy = short
		c.mu.Unlock()
	}
	return false, err
}

// engine is the poller whenever no Read or Write is, until the connection
// closes.
func (c *Conn) engine() {
	defer close(c.engineDone)
	for {
		c.mu.Lock()
		for (c.owner != ownerNone || c.wanting > 0) && !c.closing {
			c.mu.Unlock()
			select {
			case <-c.engineKick:
			case <-c.closed:
				return
			}
			c.mu.Lock()
		}
		if c.closing {
			c.mu.Unlock()
			return
		}
		c.takeLocked(ownerEngine)
		c.mu.Unlock()
		err := c.enginePoll()
		c.mu.Lock()
		c.owner = ownerNone
		if c.wanting > 0 {
			notify(c.pollerFree)
		}
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// enginePoll polls as the poller until a waiter wants the role (nil) or the
// connection ends (an error).
func (c *Conn) enginePoll() error {
	wcs := c.ownerWCs[:]
	for {
		c.mu.Lock()
		c.unpokeLocked()
		closing, wanted := c.closing, c.wanting > 0
		c.mu.Unlock()
		if closing {
			return net.ErrClosed
		}
		if wanted {
			return nil
		}
		if c.sweep(wcs) {
			continue
		}
		if _, err := c.sleep(wcs); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
	}
}

// sweep polls one batch of completions and handles them; it reports whether
// there were any. The poller and the events goroutine may both sweep:
// polling under c.mu makes them take and handle batches one at a time, in
// the queue's order, which the send queue's accounting and the stream (a
// Shutdown after its data) rely on.
func (c *Conn) sweep(wcs []verbs.WorkCompletion) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.res.cq.Poll(wcs)
	if err != nil {
		c.failLocked(err)
		return false
	}
	if n == 0 {
		return false
	}
	for i := range wcs[:n] {
		c.handle(&wcs[i])
	}
	if c.sq.Held() > 0 && !c.sq.SignaledPending() && c.err == nil && !c.closing {
		// What the held bytes waited for completed: send them, signaled,
		// so that Writes meanwhile hold theirs behind them.
		c.postHeld(true)
	}
	if len(c.reposts) > 0 && !c.closing {
		if err := c.res.qp.PostRecv(c.reposts); err != nil {
			c.failLocked(err)
		}
	}
	c.reposts = c.reposts[:0]
	return true
}

// handle processes one completion; c.mu is held.
func (c *Conn) handle(wc *verbs.WorkCompletion) {
	if wc.Status == verbs.WCWRFlushErr {
		// The queue pair is in error: flushed requests carry nothing. After a
		// disconnect the DISCONNECTED event, which may be taken a moment
		// later, ends the stream with EOF; if none comes, the queue pair
		// failed on its own (a local error) and the connection fails.
		if !c.flushed && !c.closing && !c.peerGone {
			c.flushed = true
			time.AfterFunc(flushGrace, func() {
				c.mu.Lock()
				if !c.peerGone {
					c.failLocked(errQueuePairDown)
				}
				c.mu.Unlock()
			})
		}
		return
	}
	if err := wc.Err(); err != nil {
		c.failLocked(err)
		return
	}
	if wc.ID&recvTag == 0 {
		slot, err := c.sq.Complete(wc.ID)
		if err != nil {
			c.failLocked(err)
			return
		}
		if slot >= 0 {
			c.ctlFree = append(c.ctlFree, slot)
			c.flushControl()
		}
		notify(c.writable)
		return
	}
	slot := int(wc.ID &^ recvTag)
	c.reposts = append(c.reposts, verbs.RecvWR{ID: wc.ID, Local: c.res.recvSlot(slot)})
	switch wc.Opcode {
	case verbs.WCRecvRDMAWithImm:
		if err := c.recv.Arrived(wc.Imm); err != nil {
			c.failLocked(err)
			return
		}
		c.arrived = true
		notify(c.readable)
	case verbs.WCRecv:
		if wc.ByteLen != wire.MessageSize {
			c.failLocked(&wire.ProtocolError{Reason: "control message of the wrong size"})
			return
		}
		m, err := wire.Decode(c.res.recvSlotBytes(slot), c.features != 0)
		if err != nil {
			c.failLocked(err)
			return
		}
		c.control(m)
	default:
		c.failLocked(&wire.ProtocolError{Reason: "unexpected completion " + wc.Opcode.String()})
	}
}

// control acts on a control message from the peer; c.mu is held.
func (c *Conn) control(m wire.Message) {
	switch m.Op {
	case wire.OpRegisterXferMemory:
		if err := c.send.Announce(m); err != nil {
			c.failLocked(err)
			return
		}
		notify(c.writable)
	case wire.OpCredit:
		if err := c.send.Credit(m); err != nil {
			c.failLocked(err)
			return
		}
		notify(c.writable)
	case wire.OpShutdown:
		if c.features&wire.FeatureShutdown == 0 {
			c.failLocked(&wire.ProtocolError{Reason: "Shutdown without the half-close extension"})
			return
		}
		c.peerDone = true
		notify(c.readable)
	case wire.OpGetServerFeature:
		if c.server {
			c.sendControl(wire.Message{Op: wire.OpGetServerFeature})
		}
	case wire.OpSetClientFeature, wire.OpKeepalive:
	}
}

// sendControl sends m now if a control slot and a queue slot are free, and
// otherwise queues it for the next completion; c.mu is held.
func (c *Conn) sendControl(m wire.Message) {
	c.ctlQueue = append(c.ctlQueue, m)
	c.flushControl()
}

func (c *Conn) flushControl() {
	for len(c.ctlQueue) > 0 && len(c.ctlFree) > 0 && c.sq.SlotsFree() > 0 && c.err == nil && !c.closing {
		slot := c.ctlFree[len(c.ctlFree)-1]
		c.ctlFree = c.ctlFree[:len(c.ctlFree)-1]
		m := c.ctlQueue[0]
		// Pop by shifting, so the queue reuses its array instead of
		// walking through memory and reallocating.
		c.ctlQueue = c.ctlQueue[:copy(c.ctlQueue, c.ctlQueue[1:])]
		m.Encode(c.res.sendSlotBytes(slot))
		id := c.sq.PostControl(slot)
		c.post[0] = verbs.SendWR{ID: id, Local: c.res.sendSlot(slot), Opcode: verbs.OpSend, Flags: verbs.SendSignaled}
		if err := c.res.qp.PostSend(c.post[:]); err != nil {
			c.failLocked(err)
			return
		}
	}
}

// ---- connection manager events ----------------------------------------------

// events waits for the connection manager's events: a disconnect from the
// peer ends the stream (after the data that arrived before it).
func (c *Conn) events() {
	defer close(c.eventsDone)
	for {
		ev, err := c.id.WaitEvent(context.Background())
		if err != nil {
			return // Close closed the ID
		}
		switch ev.Type {
		case cm.EventDisconnected, cm.EventDeviceRemoval, cm.EventTimewaitExit:
			// Completions for data the peer sent before disconnecting are
			// already queued (its Close waited for them): take them first.
			c.sweep(make([]verbs.WorkCompletion, 32))
			c.mu.Lock()
			c.peerGone = true
			closing := c.closing
			c.wakeWaitersLocked()
			c.mu.Unlock()
			if !closing {
				// Answer, so the peer's own disconnect completes at once.
				c.id.Disconnect()
			}
			return
		}
	}
}

// ---- failure and wake-ups -----------------------------------------------------

func (c *Conn) fail(err error) {
	c.mu.Lock()
	c.failLocked(err)
	c.mu.Unlock()
}

// failLocked records the first error that ends the connection; c.mu is held.
func (c *Conn) failLocked(err error) {
	if c.err == nil && !c.closing {
		c.err = err
	}
	c.wakeWaitersLocked()
}

// wakeWaitersLocked wakes blocked Reads and Writes to look at the
// connection's state again, the one polling included; c.mu is held.
func (c *Conn) wakeWaitersLocked() {
	notify(c.readable)
	notify(c.writable)
	if c.owner == ownerWaiter {
		c.pokeLocked()
	}
}

// notify wakes one waiter without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wait releases c.mu until ready fires, the deadline passes or the connection
// closes; it returns the error that ends the wait, if any. c.mu is held on
// entry and on return. The waiter becomes the poller if it can (see "Who
// takes completions"), and otherwise waits for the poller to notify it or
// to hand it the role.
func (c *Conn) wait(ready chan struct{}, dl *deadline) error {
	for {
		if c.owner == ownerNone {
			return c.pollFor(ready, dl)
		}
		// Someone else polls. Waking the engine to take over costs more
		// than it saves (two hand-offs, and its sleep is cut short), so
		// wait for it to notify; with BusyPoll, sweep meanwhile, so that
		// a completion does not have to wait for the netpoller, which
		// busy CPUs look at seldom.
		if c.cfg.BusyPoll > 0 && c.busy {
			if err, ok := c.spinFor(ready, dl); ok {
				return err
			}
			if c.owner == ownerNone {
				continue
			}
		}
		c.wanting++
		expired := dl.expired()
		c.mu.Unlock()
		var err error
		free := false
		select {
		case <-ready:
		case <-expired:
			err = os.ErrDeadlineExceeded
		case <-c.closed:
			err = net.ErrClosed
		case <-c.pollerFree:
			free = true
		}
		c.mu.Lock()
		c.wanting--
		if !free {
			c.handOffLocked()
			return err
		}
	}
}

// spinFor sweeps for up to Config.BusyPoll while another goroutine is the
// poller; ok reports that the wait ended (with err). c.mu is held on entry
// and on return.
func (c *Conn) spinFor(ready chan struct{}, dl *deadline) (err error, ok bool) {
	wcs := c.readSpin[:]
	if ready == c.writable {
		wcs = c.writeSpin[:]
	}
	for end := time.Now().Add(c.cfg.BusyPoll); c.owner != ownerNone && time.Now().Before(end); {
		select {
		case <-ready:
			return nil, true
		case <-dl.expired():
			return os.ErrDeadlineExceeded, true
		case <-c.closed:
			return net.ErrClosed, true
		default:
		}
		c.mu.Unlock()
		if !c.sweep(wcs) {
			runtime.Gosched()
		}
		c.mu.Lock()
	}
	return nil, false
}

// pollFor is wait as the poller: it polls the completion queue (first for
// up to Config.BusyPoll, when the connection is busy) and sleeps on the
// completion channel until ready fires, the deadline passes or the
// connection closes; then it hands the role on. c.mu is held on entry and
// on return.
func (c *Conn) pollFor(ready chan struct{}, dl *deadline) error {
	c.takeLocked(ownerWaiter)
	wcs := c.ownerWCs[:]
	var spinUntil time.Time
	if c.cfg.BusyPoll > 0 && c.busy {
		spinUntil = time.Now().Add(c.cfg.BusyPoll)
	}
	var err error
loop:
	for {
		c.unpokeLocked()
		done := true
		select {
		case <-ready:
		case <-dl.expired():
			err = os.ErrDeadlineExceeded
		case <-c.closed:
			err = net.ErrClosed
		default:
			done = false
		}
		if done {
			break loop
		}
		c.mu.Unlock()
		switch {
		case c.sweep(wcs):
		case !spinUntil.IsZero() && time.Now().Before(spinUntil):
			// One spinner per connection, and it yields between polls:
			// the peer, rxe and the engine may need this CPU.
			runtime.Gosched()
		default:
			spinUntil = time.Time{}
			if _, werr := c.sleep(wcs); werr != nil && !errors.Is(werr, os.ErrDeadlineExceeded) {
				// Arming failed and the connection failed with it (the
				// caller finds c.err), or the channel is closed.
				c.mu.Lock()
				if c.err == nil {
					err = net.ErrClosed
				}
				break loop
			}
		}
		c.mu.Lock()
	}
	c.owner = ownerNone
	c.handOffLocked()
	return err
}

func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: Network, Source: c.local, Addr: c.remote, Err: err}
}

// ---- net.Conn ------------------------------------------------------------------

// Read reads received bytes into b. It returns io.EOF once the peer has closed
// and everything it sent has been read.
func (c *Conn) Read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closing {
			return 0, c.opError("read", net.ErrClosed)
		}
		if isClosed(c.readDeadline.expired()) {
			return 0, c.opError("read", os.ErrDeadlineExceeded)
		}
		if len(b) == 0 {
			return 0, nil
		}
		if off, n := c.recv.Readable(); n > 0 {
			k := copy(b, c.res.rx.Bytes()[off:off+n])
			if reply, send := c.recv.Consume(uint32(k)); send {
				c.sendControl(reply)
			}
			if _, more := c.recv.Readable(); more > 0 {
				notify(c.readable) // pass the wake-up on
			}
			return k, nil
		}
		if c.err != nil {
			return 0, c.opError("read", c.err)
		}
		if c.peerGone || c.peerDone {
			return 0, io.EOF
		}
		if err := c.wait(c.readable, &c.readDeadline); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return 0, c.opError("read", net.ErrClosed)
			}
			return 0, c.opError("read", err)
		}
	}
}

// Write sends b. It returns once every byte is in the transmit ring and
// posted to the device, or held to go out with the next completion (small
// Writes coalesce while earlier ones are in flight), splitting b as the
// rings and the peer's window allow.
func (c *Conn) Write(b []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	written := 0
	for {
		if c.closing {
			return written, c.opError("write", net.ErrClosed)
		}
		if isClosed(c.writeDeadline.expired()) {
			return written, c.opError("write", os.ErrDeadlineExceeded)
		}
		if c.err != nil {
			return written, c.opError("write", c.err)
		}
		if c.peerGone {
			return written, c.opError("write", errPeerClosed)
		}
		if c.wrDone {
			return written, c.opError("write", errWriteShutdown)
		}
		if written == len(b) {
			return written, nil
		}
		room := c.send.Room()
		off, space := c.sq.RingSpace()
		if room == 0 || space == 0 {
			// Nothing held may wait with the writer.
			c.postHeld(false)
			if err := c.wait(c.writable, &c.writeDeadline); err != nil {
				return written, c.opError("write", err)
			}
			continue
		}
		n := min(uint64(len(b)-written), uint64(room), space)
		copy(c.res.tx.Bytes()[off:], b[written:written+int(n)])
		remote, rkey, _ := c.send.Take(uint32(n))
		if held := c.sq.Held(); held > 0 && (off != c.corkOff+held || remote != c.corkRemote+held || rkey != c.corkRKey) {
			// Not contiguous with the held bytes (a ring wrapped).
			c.postHeld(false)
		}
		if c.sq.Held() == 0 {
			c.corkOff, c.corkRemote, c.corkRKey = off, remote, rkey
		}
		c.sq.Hold(n)
		written += int(n)
		// Coalescing: bytes of a small Write (under corkLimit) wait while a
		// signaled request is in flight, and go out with the Writes after them when it
		// completes (sweep), as one RDMA write. A Write with nothing in
		// flight before it (a lone one, or one answering the peer) is
		// posted at once; a Write that follows unacknowledged ones posted
		// without a completion requested asks for one, so that the Writes
		// after it can wait for it.
		small := len(b) < corkLimit && c.sq.Held() < corkLimit
		if small && c.sq.SignaledPending() {
			continue
		}
		stream := small && !c.sq.SignaledPending() && !c.sq.Idle() && !c.arrived
		if err := c.postHeld(stream); err != nil {
			continue
		}
	}
}

// corkLimit is how many bytes of small Writes may be held back (coalescing).
const corkLimit = 32 << 10

// postHeld posts the bytes held in the transmit ring as one RDMA write with
// immediate data, signaled if signal is set or the send queue's accounting
// wants it; c.mu is held.
func (c *Conn) postHeld(signal bool) error {
	if c.sq.Held() == 0 || c.sq.SlotsFree() == 0 {
		// With no slot free, signaled requests are in flight, and the
		// sweep that takes their completions posts what is held.
		return nil
	}
	n, id, signaled := c.sq.PostHeld(signal)
	flags := verbs.SendFlags(0)
	if signaled {
		flags |= verbs.SendSignaled
	}
	if uint32(n) <= c.res.maxInline {
		flags |= verbs.SendInline
	}
	c.post[0] = verbs.SendWR{
		ID: id, Local: c.res.txMR.Slice(int(c.corkOff), int(n)), Opcode: verbs.OpRDMAWriteWithImm,
		Flags: flags, RemoteAddr: c.corkRemote, RKey: c.corkRKey, Imm: uint32(n),
	}
	if err := c.res.qp.PostSend(c.post[:]); err != nil {
		c.failLocked(err)
		return err
	}
	c.sentData = true
	c.arrived = false
	return nil
}

// errQueuePairDown: the queue pair went to error with no disconnect from the peer.
var errQueuePairDown = errors.New("rdmanet: connection's queue pair failed")

// errWriteShutdown is a Write after CloseWrite.
var errWriteShutdown = errors.New("rdmanet: write after CloseWrite")

// errPeerClosed is a Write after the peer disconnected (as EPIPE is for TCP).
var errPeerClosed = errors.New("rdmanet: connection closed by peer")

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// lingerTimeout bounds how long Close waits for sent data to be acknowledged.
const lingerTimeout = 5 * time.Second

// Close closes the connection. Bytes already written are delivered first (Close
// waits up to 5 s for the peer to acknowledge them), then the connection is
// disconnected and its resources are released. Pending Reads and Writes
// return net.ErrClosed.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return c.opError("close", net.ErrClosed)
	}
	c.drainLocked()
	c.closing = true
	if c.keepalive != nil {
		c.keepalive.Stop()
	}
	c.mu.Unlock()
	close(c.closed)

	c.id.Disconnect()
	// Wake the engine; it exits on the deadline error.
	c.res.ch.SetDeadline(time.Unix(1, 0))
	<-c.engineDone
	c.id.Close() // destroys the QP; wakes the events goroutine
	<-c.eventsDone
	return c.res.close()
}

// drainLocked waits until every posted work request has completed, so that
// disconnecting flushes nothing the caller wrote. c.mu is held.
func (c *Conn) drainLocked() {
	if c.err != nil || c.peerGone {
		return
	}
	c.postHeld(true)
	// Unsignaled writes complete only with a later signaled request: post a
	// zero-length write into the peer's window (data writes imply it exists).
	if addr, rkey, ok := c.send.Target(); ok && c.sq.Unsignaled() && c.sq.SlotsFree() > 0 {
		id := c.sq.PostMarker()
		c.post[0] = verbs.SendWR{ID: id, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled, RemoteAddr: addr, RKey: rkey}
		if err := c.res.qp.PostSend(c.post[:]); err != nil {
			return
		}
	}
	timeout := time.NewTimer(lingerTimeout)
	defer timeout.Stop()
	for !c.sq.Idle() && c.err == nil && !c.peerGone {
		c.mu.Unlock()
		select {
		case <-c.writable:
		case <-timeout.C:
			c.mu.Lock()
			return
		}
		c.mu.Lock()
	}
}

// CloseWrite shuts down the sending side: the peer reads what was written,
// then io.EOF, and may still write to this side. It needs the half-close
// extension, which two rdmanet peers negotiate; with a Valkey peer (or
// Config.ValkeyCompatible) it returns ErrHalfCloseUnsupported.
func (c *Conn) CloseWrite() error {
	if c.features&wire.FeatureShutdown == 0 {
		return c.opError("close", ErrHalfCloseUnsupported)
	}
	c.writeMu.Lock() // after any Write in progress
	defer c.writeMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closing:
		return c.opError("close", net.ErrClosed)
	case c.err != nil:
		return c.opError("close", c.err)
	case c.wrDone:
		return nil
	}
	c.wrDone = true
	c.postHeld(false)
	// A send after the data writes: the reliable connection delivers it after them.
	c.sendControl(wire.Message{Op: wire.OpShutdown})
	return nil
}

// Protocol names the wire protocol of a connection.
type Protocol string

const (
	// ProtocolValkey is Valkey's RDMA transport: the peer is Valkey (or
	// libvalkey), or one side set Config.ValkeyCompatible.
	ProtocolValkey Protocol = "valkey"
	// ProtocolRdmanet is Valkey's transport with rdmanet's extensions (a ring
	// with continuous credit return, half-close), agreed between two rdmanet peers.
	ProtocolRdmanet Protocol = "rdmanet"
)

// Protocol reports which wire protocol the connection speaks.
func (c *Conn) Protocol() Protocol {
	if c.features != 0 {
		return ProtocolRdmanet
	}
	return ProtocolValkey
}

// LocalAddr returns the local address (*Addr).
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's address (*Addr).
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both the read and the write deadline.
func (c *Conn) SetDeadline(t time.Time) error {
	c.readDeadline.set(t)
	c.writeDeadline.set(t)
	return nil
}

// SetReadDeadline sets the deadline for pending and future Reads.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.readDeadline.set(t)
	return nil
}

// SetWriteDeadline sets the deadline for pending and future Writes.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.writeDeadline.set(t)
	return nil
}
