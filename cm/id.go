package cm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/internal/guard"
	"github.com/rdmanet/sdk/internal/rdmacore"
	"github.com/rdmanet/sdk/verbs"
)

// liveIDs counts IDs created and not yet closed.
var liveIDs atomic.Int64

// LiveIDs returns how many IDs are open in this process.
func LiveIDs() int64 { return liveIDs.Load() }

// DefaultResolveTimeout bounds each attempt at address resolution, and
// route resolution, when the context has no earlier deadline. A destination
// whose route leaves through a netdev without RDMA fails at once with
// ENODEV; one with no ARP answer takes this long, and then Resolve tries
// again (see resolveAttempts).
const DefaultResolveTimeout = 2 * time.Second

// resolveAttempts is how many times Resolve asks for an address that got
// no neighbour answer (ARP or ND) in time, within the context's deadline.
// One lost ARP exchange, or one answered late by a busy host, is a passing
// error; the kernel itself sends three probes a second apart before it
// gives a neighbour up, longer than one attempt. Three attempts (6 s with
// no earlier deadline) outlast that, and a host that is really gone still
// fails in bounded time.
const resolveAttempts = 3

// minResolveAttempt is the least time left worth another attempt.
const minResolveAttempt = 100 * time.Millisecond

// retryResolve reports whether address resolution should be tried again
// after err: the neighbour did not answer in time (ADDR_ERROR with
// ETIMEDOUT), attempts are left, and so is time.
func retryResolve(ctx context.Context, err error, attempt int) bool {
	var ev *EventError
	if attempt >= resolveAttempts || !errors.As(err, &ev) || ev.Event != EventAddrError || ev.Status != -int(syscall.ETIMEDOUT) {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < minResolveAttempt {
		return false
	}
	return ctx.Err() == nil
}

// ID is an rdma_cm identifier on the process's event channel (channel.go):
// a listener, or one side of a connection.
type ID struct {
	raw rdmacore.CMID
	ch  *channel

	g  guard.Guard
	qp *verbs.QP
	// connecting: a Connect or Accept began and took no answer (its wait
	// ended first), so librdmacm may still move the queue pair when the
	// answer comes (the peer's accept, or its reject: to the error state);
	// its destroy then waits out the channel's read (destroyQP).
	connecting atomic.Bool

	waitMu sync.Mutex // one wait at a time

	mu       sync.Mutex
	events   []rdmacore.CMEvent // delivered and not yet taken, oldest first
	requests []*Request         // a listener's requests not yet taken (at most backlog)
	backlog  int                // set by Listen
	handler  func(Event)        // see HandleEvents
	isClosed bool               // Close began
	// requestReject: see SetRequestReject.
	requestReject func(error) []byte
	ready         chan struct{} // an event or request was queued (capacity 1)
	closed        chan struct{} // closed when Close begins

	handlerMu sync.Mutex // held while the handler runs: Close waits out a call
}

func newID(raw rdmacore.CMID, ch *channel) *ID {
	return &ID{raw: raw, ch: ch, ready: make(chan struct{}, 1), closed: make(chan struct{})}
}

// NewID creates an ID on the process's event channel.
func NewID() (*ID, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	ch, err := acquire()
	if err != nil {
		return nil, err
	}
	// No event can be for the new ID before a call on it, after NewID.
	raw, err := rdmacore.CreateID(ch.raw)
	if err != nil {
		ch.release()
		return nil, err
	}
	id := newID(raw, ch)
	ch.mu.Lock()
	ch.ids[raw] = id
	ch.mu.Unlock()
	liveIDs.Add(1)
	return id, nil
}

// noDevice marks librdmacm's "no RDMA device at all" (ENODEV from its first
// call, which opens every device) as verbs.ErrNoDevice, unless the process
// was out of file descriptors, which fails that call too.
func noDevice(err error) error {
	if e, ok := err.(*rdmacore.CallError); ok && e.Descriptors == nil && (e.Errno == syscall.ENODEV || e.Errno == syscall.ENOSYS) {
		return fmt.Errorf("%w: %w", verbs.ErrNoDevice, err)
	}
	return err
}

// deliver gives the dispatcher's event to id: to its handler, or to the
// queue its waits take from. It never blocks on a waiter.
func (id *ID) deliver(ev rdmacore.CMEvent) {
	id.handlerMu.Lock()
	defer id.handlerMu.Unlock()
	id.mu.Lock()
	if id.isClosed {
		id.mu.Unlock()
		return
	}
	if h := id.handler; h != nil {
		id.mu.Unlock()
		h(eventOf(ev))
		return
	}
	if len(id.events) == maxQueuedEvents {
		popFront(&id.events) // nobody takes them: the oldest concerns nobody any more
	}
	id.events = append(id.events, ev)
	id.mu.Unlock()
	notify(id.ready)
}

func eventOf(ev rdmacore.CMEvent) Event {
	return Event{Type: EventType(ev.Type), Status: ev.Status, Param: connParamOf(ev.Param)}
}

// popFront takes the head of a queue that is not empty, keeping its array.
func popFront[T any](q *[]T) T {
	v := (*q)[0]
	*q = (*q)[:copy(*q, (*q)[1:])]
	return v
}

// notify wakes a waiter without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// HandleEvents hands every event of the ID from now on to h, first those
// already queued, instead of queuing them for WaitEvent: a connection
// watches for its end this way without a goroutine of its own. h runs on
// the process's event dispatcher and must not block or close the ID; it
// may call Disconnect. Close waits for a call of h in progress, and none
// follows it.
func (id *ID) HandleEvents(h func(Event)) {
	id.handlerMu.Lock()
	defer id.handlerMu.Unlock()
	id.mu.Lock()
	if id.isClosed {
		id.mu.Unlock()
		return
	}
	queued := id.events
	id.events = nil
	id.handler = h
	id.mu.Unlock()
	for _, ev := range queued {
		h(eventOf(ev))
	}
}

// Close destroys the ID's queue pair (if any) and the ID. Pending waits
// return ErrClosed, requests a listener had not handed out are refused,
// and no event reaches the ID's handler after Close returns. A second
// Close returns nil.
func (id *ID) Close() error {
	id.mu.Lock()
	first := !id.isClosed
	var requests []*Request
	if first {
		id.isClosed = true
		close(id.closed) // wake waiters, which are inside Use
		requests, id.requests = id.requests, nil
		id.events = nil
	}
	id.mu.Unlock()
	if !first {
		return nil
	}
	id.handlerMu.Lock() // a handler's call in progress ends first
	id.handler = nil
	id.handlerMu.Unlock()
	for _, r := range requests {
		id.refuse(r.ID, ErrClosed)
	}
	id.ch.unregister(id)
	var err error
	id.g.Close(func() error {
		if id.qp != nil {
			id.qp.Close()
		}
		err = id.ch.destroyRaw(id.raw)
		liveIDs.Add(-1)
		return nil // the ID is gone whatever rdma_destroy_id reported
	})
	id.ch.release()
	return err
}

// WaitEvent returns the next event on this ID's channel.
func (id *ID) WaitEvent(ctx context.Context) (Event, error) {
	if !id.g.Use() {
		return Event{}, ErrClosed
	}
	defer id.g.Done()
	ev, err := id.next(ctx)
	return Event{Type: EventType(ev.Type), Status: ev.Status, Param: connParamOf(ev.Param)}, err
}

// next takes one raw event; the caller holds the read lock.
func (id *ID) next(ctx context.Context) (rdmacore.CMEvent, error) {
	id.waitMu.Lock()
	defer id.waitMu.Unlock()
	for {
		id.mu.Lock()
		if len(id.events) > 0 {
			ev := popFront(&id.events)
			id.mu.Unlock()
			return ev, nil
		}
		id.mu.Unlock()
		if err := id.wait(ctx); err != nil {
			return rdmacore.CMEvent{}, err
		}
	}
}

// wait waits for something to be queued for id, its Close or ctx's end.
func (id *ID) wait(ctx context.Context) error {
	select {
	case <-id.ready:
		return nil
	case <-id.closed:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// await runs start, then waits for the event want; any other event becomes
// an *EventError for op.
func (id *ID) await(ctx context.Context, op string, want EventType, start func() error) (rdmacore.CMEvent, error) {
	if !id.g.Use() {
		return rdmacore.CMEvent{}, ErrClosed
	}
	defer id.g.Done()
	if err := start(); err != nil {
		return rdmacore.CMEvent{}, err
	}
	ev, err := id.next(ctx)
	if err != nil {
		if ctx.Err() != nil {
			// Say which step the caller's time ran out in (an address
			// resolution that never completes, or a peer that never
			// answers, are not the same trouble); errors.Is still
			// matches the context's error.
			err = fmt.Errorf("cm: %s: no %v event: %w", op, want, err)
		}
		return ev, err
	}
	if EventType(ev.Type) != want {
		return ev, &EventError{Op: op, Event: EventType(ev.Type), Status: ev.Status, PrivateData: ev.Param.PrivateData}
	}
	return ev, nil
}

// resolveTimeoutMs is the smaller of DefaultResolveTimeout and ctx's time left.
func resolveTimeoutMs(ctx context.Context) int {
	d := DefaultResolveTimeout
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < d {
			d = left
		}
	}
	if d < time.Millisecond {
		d = time.Millisecond
	}
	return int(d / time.Millisecond)
}

// Resolve resolves dst to an RDMA device and a route to it. src, when valid,
// picks the local address (and so device); otherwise the routing table does.
func (id *ID) Resolve(ctx context.Context, src netip.Addr, dst netip.AddrPort) error {
	dstSA := rdmacore.EncodeSockaddr(dst)
	var srcSA *rdmacore.Sockaddr
	if src.IsValid() {
		s := rdmacore.EncodeSockaddr(netip.AddrPortFrom(src, 0))
		srcSA = &s
	}
	for attempt := 1; ; attempt++ {
		_, err := id.await(ctx, "resolve address "+dst.String(), EventAddrResolved, func() error {
			return rdmacore.ResolveAddr(id.raw, srcSA, &dstSA, resolveTimeoutMs(ctx))
		})
		if err == nil {
			break
		}
		if !retryResolve(ctx, err, attempt) {
			return err
		}
	}
	_, err := id.await(ctx, "resolve route to "+dst.String(), EventRouteResolved, func() error {
		return rdmacore.ResolveRoute(id.raw, resolveTimeoutMs(ctx))
	})
	return err
}

// Connect connects a resolved ID (with its QP created) and returns what the
// peer sent with its accept. It fails with an *EventError matching ErrRejected
// or ErrUnreachable, or with ctx's error; after a failed Connect, Close the ID.
func (id *ID) Connect(ctx context.Context, p ConnParam) (ConnParam, error) {
	cp := p.core()
	ev, err := id.handshake(ctx, "connect", func() error { return rdmacore.Connect(id.raw, &cp) })
	var ee *EventError
	if errors.Is(err, syscall.ECONNREFUSED) && !errors.As(err, &ee) {
		// iWARP connects over TCP within rdma_connect, so nothing
		// listening is refused at once rather than by an event (siw).
		return ConnParam{}, &EventError{Op: "connect", Event: EventRejected, Status: -int(syscall.ECONNREFUSED)}
	}
	if errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.As(err, &ee) {
		// iWARP's TCP connection, made within rdma_connect, found its
		// local port's connection to the peer still in the kernel.
		return ConnParam{}, fmt.Errorf("%w: %w", ErrLocalPortBusy, err)
	}
	return connParamOf(ev.Param), err
}

// Bind binds the ID to a local address (port 0 picks one). Binding to an
// address also binds the ID to that address's RDMA device.
func (id *ID) Bind(addr netip.AddrPort) error {
	if !id.g.Use() {
		return ErrClosed
	}
	defer id.g.Done()
	sa := rdmacore.EncodeSockaddr(addr)
	return rdmacore.BindAddr(id.raw, &sa)
}

// Listen starts listening on a bound ID. backlog bounds both rdma_cm's
// queue and the requests the ID holds that GetRequest has not taken: a
// request beyond them is refused with ErrBacklogFull.
func (id *ID) Listen(backlog int) error {
	if !id.g.Use() {
		return ErrClosed
	}
	defer id.g.Done()
	id.mu.Lock()
	id.backlog = backlog
	id.mu.Unlock()
	return rdmacore.Listen(id.raw, backlog)
}

// Request is a connection request a listener received.
type Request struct {
	ID    *ID       // the new connection's ID; Accept or Reject it, then Close it if it fails
	Param ConnParam // what the peer offered, with its private data
}

// SetRequestReject sets what a listening ID tells a peer whose request it
// cannot take (its backlog is full, ErrBacklogFull): the reject's private
// data is data(err). Without it the reject says nothing.
func (id *ID) SetRequestReject(data func(error) []byte) {
	id.mu.Lock()
	id.requestReject = data
	id.mu.Unlock()
}

// queueRequest queues r for GetRequest, or says why it cannot.
func (id *ID) queueRequest(r *Request) error {
	id.mu.Lock()
	defer id.mu.Unlock()
	switch {
	case id.isClosed:
		return ErrClosed
	case len(id.requests) >= max(id.backlog, 1):
		return ErrBacklogFull
	}
	id.requests = append(id.requests, r)
	notify(id.ready)
	return nil
}

// refuse rejects a request's ID that this listening ID cannot take, for
// err, and closes it.
func (id *ID) refuse(req *ID, err error) {
	id.mu.Lock()
	reject := id.requestReject
	id.mu.Unlock()
	var data []byte
	if reject != nil {
		data = reject(err)
	}
	id.ch.rejectRaw(req.raw, data)
	req.Close()
}

// GetRequest waits for the next connection request on a listening ID.
func (id *ID) GetRequest(ctx context.Context) (*Request, error) {
	if !id.g.Use() {
		return nil, ErrClosed
	}
	defer id.g.Done()
	id.waitMu.Lock()
	defer id.waitMu.Unlock()
	for {
		id.mu.Lock()
		if len(id.requests) > 0 {
			r := popFront(&id.requests)
			id.mu.Unlock()
			return r, nil
		}
		for len(id.events) > 0 {
			ev := popFront(&id.events)
			if t := EventType(ev.Type); t == EventDeviceRemoval || t == EventAddrChange {
				id.mu.Unlock()
				return nil, &EventError{Op: "listen", Event: t, Status: ev.Status}
			}
			// Nothing else concerns a listener.
		}
		id.mu.Unlock()
		if err := id.wait(ctx); err != nil {
			return nil, err
		}
	}
}

// Accept accepts a request's ID (with its QP created) and waits until the
// connection is established.
func (id *ID) Accept(ctx context.Context, p ConnParam) error {
	cp := p.core()
	_, err := id.handshake(ctx, "accept", func() error { return rdmacore.Accept(id.raw, &cp) })
	return err
}

// handshake is await for Connect and Accept (start sends the request or
// the accept): the ID is connecting from start until the peer's answer
// (ESTABLISHED, or an event that refuses), for librdmacm moves the queue
// pair as it reads that answer (a dialer that gave up after an accept
// rejects it: the error state), and a destroy meanwhile must wait out the
// read (destroyQP).
func (id *ID) handshake(ctx context.Context, op string, start func() error) (rdmacore.CMEvent, error) {
	ev, err := id.await(ctx, op, EventEstablished, func() error {
		id.connecting.Store(true)
		return start()
	})
	var ee *EventError
	if err == nil || errors.As(err, &ee) {
		id.connecting.Store(false) // the answer came: librdmacm is done with the queue pair
	}
	return ev, err
}

// Reject refuses a request's ID, sending privateData; Close the ID afterwards.
func (id *ID) Reject(privateData []byte) error {
	if !id.g.Use() {
		return ErrClosed
	}
	defer id.g.Done()
	return rdmacore.Reject(id.raw, privateData)
}

// Disconnect starts tearing the connection down and flushes outstanding work
// requests. The side that gets EventDisconnected first must call Disconnect
// too: that sends the answer (DREP) the other side's EventDisconnected waits
// for, which otherwise comes only when the request times out.
func (id *ID) Disconnect() error {
	if !id.g.Use() {
		return ErrClosed
	}
	defer id.g.Done()
	return rdmacore.Disconnect(id.raw)
}

// Context is the device the ID is bound to: set after Resolve, on a request's
// ID, or after Bind to a device's address; nil before. librdmacm owns it.
func (id *ID) Context() *verbs.Context {
	if !id.g.Use() {
		return nil
	}
	defer id.g.Done()
	raw := rdmacore.IDContext(id.raw)
	if raw == nil {
		return nil
	}
	return verbs.AdoptContext(raw)
}

// SetAckTimeout sets how long the queue pair waits for an acknowledgement
// before sending a packet again, as 4.096 us * 2^exp (exp 14 is 67 ms); after
// the connect's RetryCount retries the work request fails. Set it before
// Connect or Accept. Without it rdma_cm leaves the transport's default, which
// for some devices (rxe) means a packet is never retried and a dead peer is
// never noticed.
func (id *ID) SetAckTimeout(exp uint8) error {
	if !id.g.Use() {
		return ErrClosed
	}
	defer id.g.Done()
	return rdmacore.SetAckTimeout(id.raw, exp)
}

// Port is the device port the ID is bound to.
func (id *ID) Port() uint8 {
	if !id.g.Use() {
		return 0
	}
	defer id.g.Done()
	return rdmacore.IDPortNum(id.raw)
}

// LocalAddr and RemoteAddr are the ID's addresses as rdma_cm knows them.
func (id *ID) LocalAddr() netip.AddrPort  { return id.addr(rdmacore.IDLocalAddr) }
func (id *ID) RemoteAddr() netip.AddrPort { return id.addr(rdmacore.IDPeerAddr) }

func (id *ID) addr(get func(rdmacore.CMID) *rdmacore.Sockaddr) netip.AddrPort {
	if !id.g.Use() {
		return netip.AddrPort{}
	}
	defer id.g.Done()
	return rdmacore.DecodeSockaddr(get(id.raw))
}

// QPConfig sizes a queue pair.
type QPConfig struct {
	SendCQ, RecvCQ *verbs.CQ
	Cap            verbs.QPCap // requested; the QP reports the actual sizes
	SignalAll      bool        // every send completes with a completion entry
	// SRQ, if set, is where the queue pair's receives come from (its own
	// receive queue is not made: Cap's receive sizes are ignored). It must
	// be in the same protection domain.
	SRQ *verbs.SRQ
}

// CreateQP creates the ID's reliable-connected queue pair in pd, which must
// belong to the ID's device (Context). Close of the ID destroys it too.
func (id *ID) CreateQP(pd *verbs.PD, cfg QPConfig) (*verbs.QP, error) {
	if !id.g.Use() {
		return nil, ErrClosed
	}
	defer id.g.Done()
	if id.qp != nil {
		return nil, fmt.Errorf("cm: ID already has a queue pair")
	}
	var srq rdmacore.SRQ
	if cfg.SRQ != nil {
		srq = cfg.SRQ.Raw()
	}
	raw, got, err := rdmacore.CreateQP(id.raw, pd.Raw(), cqRaw(cfg.SendCQ), cqRaw(cfg.RecvCQ), srq, cfg.Cap, cfg.SignalAll)
	if err != nil {
		return nil, err
	}
	idRaw, ch := id.raw, id.ch
	id.qp = verbs.AdoptQP(raw, got, func() {
		if id.connecting.Load() {
			ch.destroyQP(idRaw)
			return
		}
		// Not under the channel's lock: a destroy can take rxe a while
		// (its packets on a netdev that went down), and the events of
		// every other ID must not wait for it.
		rdmacore.DestroyQP(idRaw)
	})
	return id.qp, nil
}

func cqRaw(cq *verbs.CQ) rdmacore.CQ {
	if cq == nil {
		return nil
	}
	return cq.Raw()
}
