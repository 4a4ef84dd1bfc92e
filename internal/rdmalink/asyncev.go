package rdmalink

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/rdmacore"
	"github.com/rdmanet/sdk/verbs"
)

// Asynchronous events (ibv_get_async_event) are read once per device
// context, not per connection: rdma_cm opens each device once per process
// and every cm ID on it shares that context, and each event goes to one
// reader. asyncEvents is the process's registry of the links on each
// context. The first link on a context starts its reader, a goroutine
// parked in the netpoller on the context's async descriptor; the last link
// to go stops it. It does not live as long as the process because the
// context is librdmacm's: it is guaranteed open only while an ID on it
// exists (librdmacm may close a removed device's context once its last ID
// is gone), and reading a closed context's descriptor would be a use after
// free. Events that arrive while a context has no reader wait in the kernel
// for the next one; the kernel drops those of destroyed queue pairs and
// CQs, so only port events can be stale, and a PORT_ERR fails connections
// only if the port is still not active when it is read.
//
// Dispatch: a queue pair event goes to the link with that queue pair (by
// number and handle); CQ_ERR to every link on that (shared) CQ; PORT_ERR to every
// link on that port of the device, DEVICE_FATAL to every link on the
// device. The link fails (Fail) as on a device removal: its end matches
// link.ErrDown when another path may cure it, so a resumable session moves.
// Nothing here is on the completion path: a link registers once, when it
// starts, and leaves when it closes.

// AsyncEventError is the error of a connection that a device's
// asynchronous event ended: a queue pair or CQ error, or the port or
// device going down. It matches link.ErrDown (a path failure, which a
// session may cure by moving) unless the event blames the requests
// themselves (QP_REQ_ERR, QP_ACCESS_ERR: a bug or a hostile peer;
// QP_ACCESS_ERR matches link.ErrRemoteAccess).
type AsyncEventError struct {
	Device string
	Port   uint8
	Event  verbs.AsyncEventType
	QPNum  uint32 // queue pair events
}

func (e *AsyncEventError) Error() string {
	var what string
	switch e.Event {
	case verbs.EventPortErr:
		what = "the port went down"
	case verbs.EventDeviceFatal:
		what = "the device failed"
	case verbs.EventCQErr:
		what = "the completion queue overran or failed"
	case verbs.EventQPFatal:
		what = "the queue pair failed"
	case verbs.EventQPReqErr:
		what = "the queue pair's requests broke the transport's rules"
	case verbs.EventQPAccessErr:
		what = "the queue pair's peer broke the access rules"
	case verbs.EventPathMigErr:
		what = "the queue pair could not migrate to its alternate path"
	default:
		what = "the connection ended"
	}
	s := fmt.Sprintf("rdmanet: %s port %d: %v: %s", e.Device, e.Port, e.Event, what)
	if e.Event.IsQP() {
		s += fmt.Sprintf(" (QP %d)", e.QPNum)
	}
	return s
}

// Unwrap is link.ErrDown for events another path may cure, and
// link.ErrRemoteAccess for QP_ACCESS_ERR: the peer wrote outside what
// this end registered for it (siw raises it at the end written to).
func (e *AsyncEventError) Unwrap() error {
	switch e.Event {
	case verbs.EventQPReqErr:
		return nil
	case verbs.EventQPAccessErr:
		return link.ErrRemoteAccess
	}
	return link.ErrDown
}

// asyncCounts counts the events read, by type; the last, unknown types.
var asyncCounts [verbs.NumAsyncEventTypes + 1]atomic.Uint64

// AsyncEventCounts returns how many asynchronous events of each type this
// process read, by type name (verbs.AsyncEventType's String), with
// "unknown" for types this package does not know.
func AsyncEventCounts() map[string]uint64 {
	m := make(map[string]uint64, len(asyncCounts))
	for _, t := range verbs.AllAsyncEventTypes() {
		m[t.String()] = asyncCounts[t].Load()
	}
	m["unknown"] = asyncCounts[len(asyncCounts)-1].Load()
	return m
}

func countAsync(t verbs.AsyncEventType) {
	if t.Known() {
		asyncCounts[t].Add(1)
		return
	}
	asyncCounts[len(asyncCounts)-1].Add(1)
}

// asyncSource is one device context's events: verbs.AsyncEvents, or a
// fake in tests.
type asyncSource interface {
	// Wait returns the next event, or an error once closed.
	Wait() (verbs.AsyncEvent, error)
	// Close ends Wait and returns when nothing reads the context any more.
	Close() error
	// PortDown says whether port is not active now.
	PortDown(port uint8) bool
}

// asyncTarget is what the registry fails: a *Link.
type asyncTarget interface{ Fail(err error) }

// asyncMember is one registered link.
type asyncMember struct {
	t     asyncTarget
	port  uint8
	qpNum uint32
	qp    rdmacore.QP
	cq    rdmacore.CQ
	queue *sharedCQ    // cq, shared with other links (nil in tests)
	srq   rdmacore.SRQ // the shared receive queue its receives come from, if any
}

// asyncDevice is one context's reader and links.
type asyncDevice struct {
	name    string
	src     asyncSource
	members map[*asyncMember]struct{}
	byQP    map[uint32]*asyncMember
	stopped bool
}

type asyncRegistry struct {
	mu   sync.Mutex
	devs map[any]*asyncDevice
}

var asyncEvents = asyncRegistry{devs: make(map[any]*asyncDevice)}

// add registers m on the context key (device name); open makes the
// context's source when it has no reader yet.
func (r *asyncRegistry) add(key any, name string, open func() (asyncSource, error), m *asyncMember) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.devs[key]
	if d == nil {
		src, err := open()
		if err != nil {
			return err
		}
		d = &asyncDevice{name: name, src: src, members: make(map[*asyncMember]struct{}), byQP: make(map[uint32]*asyncMember)}
		r.devs[key] = d
		go r.run(key, d)
	}
	d.members[m] = struct{}{}
	d.byQP[m.qpNum] = m
	return nil
}

// remove forgets m; the context's reader stops with its last link, and
// remove returns only once it reads the context no more.
func (r *asyncRegistry) remove(key any, m *asyncMember) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.devs[key]
	if d == nil {
		return
	}
	if _, ok := d.members[m]; !ok {
		return
	}
	delete(d.members, m)
	if d.byQP[m.qpNum] == m {
		delete(d.byQP, m.qpNum)
	}
	if len(d.members) == 0 {
		delete(r.devs, key)
		d.stopped = true
		d.src.Close()
	}
}

// run reads one context's events until its source is closed.
func (r *asyncRegistry) run(key any, d *asyncDevice) {
	for {
		ev, err := d.src.Wait()
		if err != nil {
			r.mu.Lock()
			stopped := d.stopped
			if !stopped {
				// The descriptor failed (a device that went away reads
				// EIO): its links learn it from rdma_cm (DEVICE_REMOVAL).
				// A link that starts on the context later starts a reader
				// afresh.
				slog.Warn("rdmanet: reading the device's asynchronous events failed", "device", d.name, "err", err)
				delete(r.devs, key)
				d.stopped = true
				d.src.Close()
			}
			r.mu.Unlock()
			return
		}
		r.mu.Lock()
		if d.stopped {
			r.mu.Unlock()
			return
		}
		r.dispatchLocked(d, ev)
		r.mu.Unlock()
	}
}

// dispatchLocked counts ev and fails the links it concerns; r.mu is held
// (so a link that left is never failed, and the context stays open for
// PortDown).
func (r *asyncRegistry) dispatchLocked(d *asyncDevice, ev verbs.AsyncEvent) {
	countAsync(ev.Type)
	fail := func(m *asyncMember) {
		m.t.Fail(&AsyncEventError{Device: d.name, Port: m.port, Event: ev.Type, QPNum: m.qpNum})
	}
	switch ev.Type {
	case verbs.EventQPFatal, verbs.EventQPReqErr, verbs.EventQPAccessErr, verbs.EventPathMigErr:
		if m := d.byQP[ev.QPNum]; m != nil && (ev.QP == nil || m.qp == nil || ev.QP == m.qp) {
			slog.Debug("rdmanet: queue pair event", "device", d.name, "event", ev.Type.String(), "qp", ev.QPNum)
			fail(m)
		}
	case verbs.EventCQErr:
		// A shared queue: every link on it fails, and no link joins it
		// any more.
		for m := range d.members {
			if m.cq != nil && m.cq == ev.CQ {
				if m.queue != nil {
					m.queue.setFailed(&AsyncEventError{Device: d.name, Port: m.port, Event: ev.Type})
				}
				fail(m)
			}
		}
	case verbs.EventSRQErr:
		// A shared receive queue failed: every link taking its receives
		// from it fails.
		for m := range d.members {
			if m.srq != nil && m.srq == ev.SRQ {
				fail(m)
			}
		}
	case verbs.EventPortErr:
		if !d.src.PortDown(ev.Port) {
			slog.Info("rdmanet: RDMA port reported down, and is active again: no connection failed", "device", d.name, "port", ev.Port)
			return
		}
		n := 0
		for m := range d.members {
			if m.port == ev.Port {
				fail(m)
				n++
			}
		}
		slog.Warn("rdmanet: RDMA port down; its connections fail or move", "device", d.name, "port", ev.Port, "connections", n)
	case verbs.EventDeviceFatal:
		for m := range d.members {
			fail(m)
		}
		slog.Error("rdmanet: RDMA device failed (DEVICE_FATAL); its connections fail or move", "device", d.name, "connections", len(d.members))
	case verbs.EventPortActive:
		// A session's failback (internal/session/failback.go) keeps its own
		// schedule: it may find the port back sooner than this says.
		slog.Info("rdmanet: RDMA port active", "device", d.name, "port", ev.Port)
	default:
		if ev.Type.IsPort() {
			slog.Info("rdmanet: RDMA port event", "device", d.name, "port", ev.Port, "event", ev.Type.String())
		}
		// PATH_MIG, COMM_EST, SQ_DRAINED, SRQ_LIMIT_REACHED (not
		// armed: credit grants keep a shared queue from running dry),
		// QP_LAST_WQE_REACHED (a shared queue's receive a queue pair that
		// went took comes back through the completion queue), WQ_FATAL
		// and unknown types: counted only.
	}
}

// verbsSource is a context's verbs.AsyncEvents.
type verbsSource struct {
	ctx *verbs.Context
	ev  *verbs.AsyncEvents
}

func (s verbsSource) Wait() (verbs.AsyncEvent, error) { return s.ev.Wait(context.Background()) }
func (s verbsSource) Close() error                    { return s.ev.Close() }
func (s verbsSource) PortDown(port uint8) bool {
	a, err := s.ctx.QueryPort(port)
	return err != nil || a.State != verbs.PortActive
}

// watchAsync registers l with its context's reader, unless the link is
// closing already (a session's Close may race with a resume's start).
func (l *Link) watchAsync() error {
	l.amu.Lock()
	defer l.amu.Unlock()
	if l.unwatched {
		return nil
	}
	ctx := l.id.Context()
	if ctx == nil {
		return nil
	}
	m := &asyncMember{t: l, port: l.res.port, qpNum: l.res.qpNum, qp: l.res.qp.Raw(), cq: l.res.cq.vcq.Raw(), queue: l.res.cq}
	if s := l.res.shared; s != nil {
		m.srq = s.srq.Raw()
	}
	key := ctx.Raw()
	err := asyncEvents.add(key, ctx.Name(), func() (asyncSource, error) {
		ev, err := ctx.NewAsyncEvents()
		if err != nil {
			return nil, err
		}
		return verbsSource{ctx: ctx, ev: ev}, nil
	}, m)
	if err != nil {
		return err
	}
	l.asyncKey, l.asyncMember = key, m
	return nil
}

// unwatchAsync takes l out of the registry for good, before its ID goes.
func (l *Link) unwatchAsync() {
	l.amu.Lock()
	defer l.amu.Unlock()
	l.unwatched = true
	if l.asyncMember != nil {
		asyncEvents.remove(l.asyncKey, l.asyncMember)
		l.asyncMember = nil
	}
}

// Fail ends the link with err, as a device event does: Poll reports it
// (link.Failed) once the completions before it are taken, and a sleeping
// poller is woken for it. The first end the link learns of is kept.
func (l *Link) Fail(err error) {
	l.mu.Lock()
	if l.down == 0 {
		l.down, l.why = link.Failed, err
	}
	l.mu.Unlock()
	l.ended.Store(true)
	l.wakeForEnd()
}
