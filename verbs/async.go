package verbs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/rdmanet/sdk/internal/pollfd"
	"github.com/rdmanet/sdk/internal/rdmacore"
)

// AsyncEventType is enum ibv_event_type: what an asynchronous event says.
type AsyncEventType int

const (
	EventCQErr AsyncEventType = iota
	EventQPFatal
	EventQPReqErr
	EventQPAccessErr
	EventCommEst
	EventSQDrained
	EventPathMig
	EventPathMigErr
	EventDeviceFatal
	EventPortActive
	EventPortErr
	EventLIDChange
	EventPKeyChange
	EventSMChange
	EventSRQErr
	EventSRQLimitReached
	EventQPLastWQEReached
	EventClientReregister
	EventGIDChange
	EventWQFatal

	// NumAsyncEventTypes is how many types this package knows.
	NumAsyncEventTypes = int(EventWQFatal) + 1
)

var asyncEventNames = [NumAsyncEventTypes]string{
	"CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED",
	"PATH_MIG", "PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE", "PORT_ERR",
	"LID_CHANGE", "PKEY_CHANGE", "SM_CHANGE", "SRQ_ERR", "SRQ_LIMIT_REACHED",
	"QP_LAST_WQE_REACHED", "CLIENT_REREGISTER", "GID_CHANGE", "WQ_FATAL",
}

func (t AsyncEventType) String() string {
	if t >= 0 && int(t) < len(asyncEventNames) {
		return asyncEventNames[t]
	}
	return fmt.Sprintf("event(%d)", int(t))
}

// Known reports whether t is one of the types above.
func (t AsyncEventType) Known() bool { return t >= 0 && int(t) < len(asyncEventNames) }

// AllAsyncEventTypes lists the known event types in their enum's order.
func AllAsyncEventTypes() []AsyncEventType {
	out := make([]AsyncEventType, len(asyncEventNames))
	for i := range out {
		out[i] = AsyncEventType(i)
	}
	return out
}

// IsQP reports whether the event is about a queue pair (QPNum, QP and CQ
// are set); IsPort, about a port (Port).
func (t AsyncEventType) IsQP() bool {
	switch t {
	case EventQPFatal, EventQPReqErr, EventQPAccessErr, EventCommEst, EventSQDrained,
		EventPathMig, EventPathMigErr, EventQPLastWQEReached:
		return true
	}
	return false
}

func (t AsyncEventType) IsPort() bool {
	switch t {
	case EventPortActive, EventPortErr, EventLIDChange, EventPKeyChange, EventSMChange,
		EventClientReregister, EventGIDChange:
		return true
	}
	return false
}

// AsyncEvent is one asynchronous event of a device (struct ibv_async_event),
// already acknowledged. The handles identify objects (compare CQ with
// (*CQ).Raw()); the objects may be gone by the time it is read.
type AsyncEvent struct {
	Type  AsyncEventType
	Port  uint8        // port events
	QPNum uint32       // queue pair events
	QP    rdmacore.QP  // queue pair events
	CQ    rdmacore.CQ  // CQ_ERR's CQ; a queue pair event's send CQ
	SRQ   rdmacore.SRQ // SRQ events' queue (compare with (*SRQ).Raw())
}

func (e AsyncEvent) String() string {
	switch {
	case e.Type.IsPort():
		return fmt.Sprintf("%v (port %d)", e.Type, e.Port)
	case e.Type.IsQP():
		return fmt.Sprintf("%v (QP %d)", e.Type, e.QPNum)
	}
	return e.Type.String()
}

// Raw is the rdma-core context: an identity for maps (librdmacm opens each
// device once per process, and every cm ID on it shares its context).
func (c *Context) Raw() rdmacore.Context { return c.raw }

// AsyncEvents reads a device context's asynchronous events (ibv_get_async_event),
// waiting in Go's netpoller. Each event is acknowledged as it is read. One
// reader per context is enough and intended: every event goes to one reader.
// The context must stay open until Close.
type AsyncEvents struct {
	raw  rdmacore.Context
	poll *pollfd.FD

	mu  sync.Mutex // one Wait at a time (pollfd's rule)
	got AsyncEvent

	// rmu is held across each read of the descriptor, so that Close
	// returns only when none is in C (pollfd's first read runs outside
	// the netpoller, which its Close does not wait for).
	rmu    sync.Mutex
	closed bool
}

// NewAsyncEvents makes the context's asynchronous event descriptor
// non-blocking (for every user of the context: rdma-core reads it only in
// ibv_get_async_event) and registers a duplicate with the netpoller.
func (c *Context) NewAsyncEvents() (*AsyncEvents, error) {
	if !c.g.Use() {
		return nil, ErrClosed
	}
	defer c.g.Done()
	a := &AsyncEvents{raw: c.raw}
	var err error
	if a.poll, err = pollfd.New(rdmacore.AsyncFD(c.raw), "ibv_async_fd "+c.name, a.read); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *AsyncEvents) read() (bool, error) {
	a.rmu.Lock()
	defer a.rmu.Unlock()
	if a.closed {
		return false, ErrClosed
	}
	ev, err := rdmacore.GetAsyncEvent(a.raw)
	if err == syscall.EAGAIN {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	a.got = AsyncEvent{Type: AsyncEventType(ev.Type), Port: ev.Port, QPNum: ev.QPNum, QP: ev.QP, CQ: ev.CQ, SRQ: ev.SRQ}
	return true, nil
}

// Wait returns the next event. It returns ErrClosed once Close was called,
// and ctx's error when ctx ends first.
func (a *AsyncEvents) Wait(ctx context.Context) (AsyncEvent, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.poll.Wait(ctx); err != nil {
		if errors.Is(err, os.ErrClosed) || errors.Is(err, ErrClosed) {
			return AsyncEvent{}, ErrClosed
		}
		return AsyncEvent{}, err
	}
	return a.got, nil
}

// Close ends every Wait and returns once none is reading the context's
// descriptor: the context may be closed then.
func (a *AsyncEvents) Close() error {
	a.rmu.Lock()
	a.closed = true
	a.rmu.Unlock()
	return a.poll.Close()
}
