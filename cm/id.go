package cm

import (
	"context"
	"errors"
	"fmt"
	"github.com/rdmanet/sdk/internal/guard"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/internal/pollfd"
	"github.com/rdmanet/sdk/internal/rdmacore"
	"github.com/rdmanet/sdk/verbs"
)

// liveIDs counts IDs created and not yet closed (each with its event channel).
var liveIDs atomic.Int64

// LiveIDs returns how many IDs (and so event channels) are open in this process.
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

// ID is an rdma_cm identifier with its own event channel: a listener, or one
// side of a connection.
type ID struct {
	raw  rdmacore.CMID
	ch   rdmacore.EventChannel
	poll *pollfd.FD

	g  guard.Guard
	qp *verbs.QP

	waitMu sync.Mutex       // one wait at a time (pollfd's rule)
	ev     rdmacore.CMEvent // the event the last wait took

	requestMu     sync.Mutex         // one GetRequest at a time: rdma_migrate_id forbids polling meanwhile
	requestReject func(error) []byte // under requestMu; see SetRequestReject
}

// NewID creates an ID with its own event channel.
func NewID() (*ID, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	ch, fd, err := rdmacore.CreateEventChannel()
	if err != nil {
		return nil, noDevice(err)
	}
	raw, err := rdmacore.CreateID(ch)
	if err != nil {
		rdmacore.DestroyEventChannel(ch)
		return nil, err
	}
	return wrapID(raw, ch, fd, nil)
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

// wrapID makes raw, on ch (whose descriptor is fd), an ID. On failure it
// destroys both, after reject (non-nil for a connection request's ID).
func wrapID(raw rdmacore.CMID, ch rdmacore.EventChannel, fd int, reject func(rdmacore.CMID, error)) (*ID, error) {
	id := &ID{raw: raw, ch: ch}
	var err error
	if id.poll, err = pollfd.New(fd, "rdma_cm event channel", id.getEvent); err != nil {
		if reject != nil { // refused, rather than left for its dialer to time out on
			reject(raw, err)
		}
		rdmacore.DestroyID(raw)
		rdmacore.DestroyEventChannel(ch)
		return nil, err
	}
	liveIDs.Add(1)
	return id, nil
}

// getEvent takes one event if there is one (pollfd's read function).
func (id *ID) getEvent() (bool, error) {
	ev, err := rdmacore.GetCMEvent(id.ch)
	if err == syscall.EAGAIN {
		return false, nil
	}
	id.ev = ev
	return err == nil, err
}

// Close destroys the ID's queue pair (if any), the ID and its channel. Pending
// waits return ErrClosed. A second Close returns nil.
func (id *ID) Close() error {
	id.poll.Close() // wake waiters, which are inside Use
	var err error
	id.g.Close(func() error {
		if id.qp != nil {
			id.qp.Close()
		}
		err = rdmacore.DestroyID(id.raw)
		rdmacore.DestroyEventChannel(id.ch)
		liveIDs.Add(-1)
		return nil // the ID is gone whatever rdma_destroy_id reported
	})
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
	err := id.poll.Wait(ctx)
	ev := id.ev
	id.waitMu.Unlock()
	if errors.Is(err, os.ErrClosed) {
		return ev, ErrClosed
	}
	return ev, err
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
	ev, err := id.await(ctx, "connect", EventEstablished, func() error {
		return rdmacore.Connect(id.raw, &cp)
	})
	var ee *EventError
	if errors.Is(err, syscall.ECONNREFUSED) && !errors.As(err, &ee) {
		// iWARP connects over TCP within rdma_connect, so nothing
		// listening is refused at once rather than by an event (siw).
		return ConnParam{}, &EventError{Op: "connect", Event: EventRejected, Status: -int(syscall.ECONNREFUSED)}
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

// Listen starts listening on a bound ID.
func (id *ID) Listen(backlog int) error {
	if !id.g.Use() {
		return ErrClosed
	}
	defer id.g.Done()
	return rdmacore.Listen(id.raw, backlog)
}

// Request is a connection request a listener received.
type Request struct {
	ID    *ID       // the new connection's ID, on a channel of its own; Accept or Reject it
	Param ConnParam // what the peer offered, with its private data
}

// SetRequestReject sets what a listening ID tells a peer whose request it
// cannot take (it has no descriptor for the request's event channel, say):
// the reject's private data is data(err). Without it the reject says
// nothing.
func (id *ID) SetRequestReject(data func(error) []byte) {
	id.requestMu.Lock()
	id.requestReject = data
	id.requestMu.Unlock()
}

// rejectRequestLocked refuses a request this listening ID cannot take, for err.
func (id *ID) rejectRequestLocked(raw rdmacore.CMID, err error) {
	var data []byte
	if id.requestReject != nil {
		data = id.requestReject(err)
	}
	rdmacore.Reject(raw, data)
}

// GetRequest waits for the next connection request on a listening ID.
func (id *ID) GetRequest(ctx context.Context) (*Request, error) {
	if !id.g.Use() {
		return nil, ErrClosed
	}
	defer id.g.Done()
	id.requestMu.Lock()
	defer id.requestMu.Unlock()
	for {
		ev, err := id.next(ctx)
		if err != nil {
			return nil, err
		}
		switch EventType(ev.Type) {
		case EventConnectRequest:
		case EventDeviceRemoval, EventAddrChange:
			return nil, &EventError{Op: "listen", Event: EventType(ev.Type), Status: ev.Status}
		default:
			continue // nothing else concerns a listener
		}
		ch, fd, err := rdmacore.CreateEventChannel()
		if err != nil {
			id.rejectRequestLocked(ev.ID, err)
			rdmacore.DestroyID(ev.ID)
			return nil, err
		}
		if err := rdmacore.MigrateID(ev.ID, ch); err != nil {
			id.rejectRequestLocked(ev.ID, err)
			rdmacore.DestroyID(ev.ID)
			rdmacore.DestroyEventChannel(ch)
			return nil, err
		}
		nid, err := wrapID(ev.ID, ch, fd, id.rejectRequestLocked)
		if err != nil {
			return nil, err
		}
		return &Request{ID: nid, Param: connParamOf(ev.Param)}, nil
	}
}

// Accept accepts a request's ID (with its QP created) and waits until the
// connection is established.
func (id *ID) Accept(ctx context.Context, p ConnParam) error {
	cp := p.core()
	_, err := id.await(ctx, "accept", EventEstablished, func() error {
		return rdmacore.Accept(id.raw, &cp)
	})
	return err
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
	raw, got, err := rdmacore.CreateQP(id.raw, pd.Raw(), cqRaw(cfg.SendCQ), cqRaw(cfg.RecvCQ), cfg.Cap, cfg.SignalAll)
	if err != nil {
		return nil, err
	}
	idRaw := id.raw
	id.qp = verbs.AdoptQP(raw, got, func() { rdmacore.DestroyQP(idRaw) })
	return id.qp, nil
}

func cqRaw(cq *verbs.CQ) rdmacore.CQ {
	if cq == nil {
		return nil
	}
	return cq.Raw()
}
