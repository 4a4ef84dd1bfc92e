package rdmanet

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
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
// registered receive buffer by Read. One goroutine per connection takes
// completions (parked in the netpoller between them) and one waits for the
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

	// Completions a blocked Read or Write polls for itself with BusyPoll
	// (one array per direction: a Read and a Write may wait at once).
	readSpin, writeSpin [8]verbs.WorkCompletion
	err                 error // why the connection failed, if it did
	peerGone            bool  // the peer disconnected
	peerDone            bool  // the peer shut down its sending side (Shutdown)
	wrDone              bool  // this side shut down its sending side (CloseWrite)
	closing             bool  // Close has begun
	sentData            bool  // something was posted since the last keepalive tick
	flushed             bool  // the queue pair went to error (flushed completions seen)

	keepalive *time.Timer

	readable chan struct{} // a Read may make progress (capacity 1)
	writable chan struct{} // a Write may make progress (capacity 1)
	closed   chan struct{} // closed by Close

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
		closed:        make(chan struct{}),
		readDeadline:  newDeadline(),
		writeDeadline: newDeadline(),
		engineDone:    make(chan struct{}),
		eventsDone:    make(chan struct{}),
	}
	for i := 0; i < controlSlots; i++ {
		c.ctlFree = append(c.ctlFree, i)
	}
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
// sides agreed on: it announces the receive buffer and starts the goroutines
// that take completions and events.
func (c *Conn) start(features wire.Features) {
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

// engine takes completions until the connection closes. Completion events are
// one-shot, so after each wake-up it polls until the queue is empty, re-arms,
// and polls once more before sleeping, or a completion that landed in between
// would never be announced.
func (c *Conn) engine() {
	defer close(c.engineDone)
	wcs := make([]verbs.WorkCompletion, 32)
	busy := false // the last sleep was short: worth polling before the next
	for {
		if c.sweep(wcs) {
			continue
		}
		if busy && c.spin(wcs) {
			continue
		}
		if err := c.res.cq.RequestNotify(false); err != nil {
			c.fail(err)
			return
		}
		if c.sweep(wcs) {
			continue
		}
		slept := time.Now()
		if _, err := c.res.ch.Wait(context.Background()); err != nil {
			// Close sets the channel's deadline to wake this goroutine.
			return
		}
		busy = c.cfg.BusyPoll > 0 && time.Since(slept) < 10*c.cfg.BusyPoll
	}
}

// spin polls for up to Config.BusyPoll and reports whether completions came.
func (c *Conn) spin(wcs []verbs.WorkCompletion) bool {
	for end := time.Now().Add(c.cfg.BusyPoll); time.Now().Before(end); {
		if c.sweep(wcs) {
			return true
		}
	}
	return false
}

// sweep polls one batch of completions and handles them; it reports whether
// there were any. The engine, the events goroutine and (with BusyPoll) a
// blocked Read or Write may all sweep: polling under c.mu makes them take
// and handle batches one at a time, in the queue's order, which the send
// queue's accounting and the stream (a Shutdown after its data) rely on.
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
			c.mu.Unlock()
			notify(c.readable)
			notify(c.writable)
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
	notify(c.readable)
	notify(c.writable)
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
// entry and on return. With Config.BusyPoll the waiter first polls the
// completion queue itself for that long, so what it waits for can be taken
// without waking the engine and then this goroutine in turn.
func (c *Conn) wait(ready chan struct{}, dl *deadline) error {
	expired := dl.expired()
	c.mu.Unlock()
	defer c.mu.Lock()
	if c.cfg.BusyPoll > 0 {
		spin := c.readSpin[:]
		if ready == c.writable {
			spin = c.writeSpin[:]
		}
		for end := time.Now().Add(c.cfg.BusyPoll); time.Now().Before(end); {
			select {
			case <-ready:
				return nil
			case <-expired:
				return os.ErrDeadlineExceeded
			case <-c.closed:
				return net.ErrClosed
			default:
			}
			c.sweep(spin)
		}
	}
	select {
	case <-ready:
		return nil
	case <-expired:
		return os.ErrDeadlineExceeded
	case <-c.closed:
		return net.ErrClosed
	}
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
// posted to the device, splitting b as the rings and the peer's window allow.
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
			if err := c.wait(c.writable, &c.writeDeadline); err != nil {
				return written, c.opError("write", err)
			}
			continue
		}
		n := min(uint64(len(b)-written), uint64(room), space)
		copy(c.res.tx.Bytes()[off:], b[written:written+int(n)])
		remote, rkey, _ := c.send.Take(uint32(n))
		id, signaled := c.sq.PostData(n)
		flags := verbs.SendFlags(0)
		if signaled {
			flags |= verbs.SendSignaled
		}
		if uint32(n) <= c.res.maxInline {
			flags |= verbs.SendInline
		}
		c.post[0] = verbs.SendWR{
			ID: id, Local: c.res.txMR.Slice(int(off), int(n)), Opcode: verbs.OpRDMAWriteWithImm,
			Flags: flags, RemoteAddr: remote, RKey: rkey, Imm: uint32(n),
		}
		if err := c.res.qp.PostSend(c.post[:]); err != nil {
			c.failLocked(err)
			continue
		}
		written += int(n)
		c.sentData = true
	}
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
