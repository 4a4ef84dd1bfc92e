package rdmalink

import (
	"errors"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/rdmacore"
	"github.com/rdmanet/sdk/verbs"
)

// fakeSource is a device context's asynchronous events, fed by the test.
type fakeSource struct {
	events chan verbs.AsyncEvent
	done   chan struct{}
	once   sync.Once

	mu   sync.Mutex
	down map[uint8]bool
}

func newFakeSource() *fakeSource {
	return &fakeSource{events: make(chan verbs.AsyncEvent), done: make(chan struct{}), down: map[uint8]bool{}}
}

func (s *fakeSource) Wait() (verbs.AsyncEvent, error) {
	select {
	case ev := <-s.events:
		return ev, nil
	case <-s.done:
		return verbs.AsyncEvent{}, verbs.ErrClosed
	}
}

func (s *fakeSource) Close() error { s.once.Do(func() { close(s.done) }); return nil }

func (s *fakeSource) PortDown(port uint8) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down[port]
}

func (s *fakeSource) setDown(port uint8, down bool) {
	s.mu.Lock()
	s.down[port] = down
	s.mu.Unlock()
}

// send hands ev to the reader, and waits until it was dispatched (the
// reader takes the next Wait only after).
func (s *fakeSource) send(t *testing.T, ev verbs.AsyncEvent) {
	t.Helper()
	select {
	case s.events <- ev:
	case <-time.After(5 * time.Second):
		t.Fatalf("the reader did not take %v", ev)
	}
	// A second, harmless event: once it is taken, the first was dispatched.
	select {
	case s.events <- verbs.AsyncEvent{Type: verbs.EventCommEst, QPNum: 1 << 30}:
	case <-time.After(5 * time.Second):
		t.Fatalf("the reader did not come back after %v", ev)
	}
}

// fakeTarget records how it was failed.
type fakeTarget struct {
	mu   sync.Mutex
	errs []error
}

func (f *fakeTarget) Fail(err error) {
	f.mu.Lock()
	f.errs = append(f.errs, err)
	f.mu.Unlock()
}

func (f *fakeTarget) failed() []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]error(nil), f.errs...)
}

// handles are distinct fake rdma-core objects, by number.
var (
	handlesMu sync.Mutex
	handles   = map[int]*byte{}
)

func handle[T ~unsafe.Pointer](n int) T {
	handlesMu.Lock()
	defer handlesMu.Unlock()
	if handles[n] == nil {
		handles[n] = new(byte)
	}
	return T(unsafe.Pointer(handles[n]))
}

// newTestRegistry is an empty registry whose readers are fake sources,
// listed in opened as they are made.
func newTestRegistry() (r *asyncRegistry, open func() (asyncSource, error), opened *[]*fakeSource) {
	r = &asyncRegistry{devs: make(map[any]*asyncDevice)}
	opened = new([]*fakeSource)
	open = func() (asyncSource, error) {
		s := newFakeSource()
		*opened = append(*opened, s)
		return s, nil
	}
	return r, open, opened
}

func TestAsyncDispatch(t *testing.T) {
	r, open, opened := newTestRegistry()
	type conn struct {
		name string
		t    *fakeTarget
		m    *asyncMember
	}
	mk := func(name string, port uint8, qp uint32) conn {
		t := &fakeTarget{}
		return conn{name, t, &asyncMember{t: t, port: port, qpNum: qp, qp: handle[rdmacore.QP](0x1000 + int(qp)), cq: handle[rdmacore.CQ](0x2000 + int(qp))}}
	}
	a, b, c := mk("a", 1, 10), mk("b", 1, 11), mk("c", 2, 12)
	// Another device, whose events are its own.
	other := mk("other", 1, 10)
	for _, x := range []conn{a, b, c} {
		if err := r.add("rxe0", "rxe0", open, x.m); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.add("rxe1", "rxe1", open, other.m); err != nil {
		t.Fatal(err)
	}
	if len(*opened) != 2 {
		t.Fatalf("%d readers for two devices", len(*opened))
	}
	src := (*opened)[0]
	before := AsyncEventCounts()
	expect := func(step string, want map[string]verbs.AsyncEventType) {
		t.Helper()
		for _, x := range []conn{a, b, c, other} {
			errs := x.t.failed()
			w, ok := want[x.name]
			switch {
			case !ok && len(errs) > 0:
				t.Errorf("%s: %s failed: %v", step, x.name, errs)
			case ok && len(errs) == 0:
				t.Errorf("%s: %s did not fail", step, x.name)
			case ok:
				var ae *AsyncEventError
				if !errors.As(errs[len(errs)-1], &ae) || ae.Event != w || ae.QPNum != x.m.qpNum || ae.Port != x.m.port || ae.Device != "rxe0" {
					t.Errorf("%s: %s failed with %v; want %v", step, x.name, errs[len(errs)-1], w)
				}
			}
		}
	}
	reset := func() {
		for _, x := range []conn{a, b, c, other} {
			x.t.mu.Lock()
			x.t.errs = nil
			x.t.mu.Unlock()
		}
	}

	// A queue pair event fails the link with that queue pair, not one with
	// the same number and another handle, nor the other device's.
	src.send(t, verbs.AsyncEvent{Type: verbs.EventQPFatal, QPNum: 11, QP: handle[rdmacore.QP](0x1000 + 11)})
	expect("QP_FATAL", map[string]verbs.AsyncEventType{"b": verbs.EventQPFatal})
	reset()
	src.send(t, verbs.AsyncEvent{Type: verbs.EventQPFatal, QPNum: 11, QP: handle[rdmacore.QP](0x9999)})
	expect("QP_FATAL of another handle", nil)
	src.send(t, verbs.AsyncEvent{Type: verbs.EventQPAccessErr, QPNum: 10, QP: handle[rdmacore.QP](0x1000 + 10)})
	expect("QP_ACCESS_ERR", map[string]verbs.AsyncEventType{"a": verbs.EventQPAccessErr})
	if err := a.t.failed()[0]; errors.Is(err, link.ErrDown) {
		t.Errorf("QP_ACCESS_ERR's error %v matches link.ErrDown: a session would move for a peer's violation", err)
	}
	reset()

	// CQ_ERR: the link with that CQ.
	src.send(t, verbs.AsyncEvent{Type: verbs.EventCQErr, CQ: handle[rdmacore.CQ](0x2000 + 12)})
	expect("CQ_ERR", map[string]verbs.AsyncEventType{"c": verbs.EventCQErr})
	reset()

	// PORT_ERR on port 1, still down: both links on port 1, with an error
	// that matches link.ErrDown (a session moves).
	src.setDown(1, true)
	src.send(t, verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 1})
	expect("PORT_ERR", map[string]verbs.AsyncEventType{"a": verbs.EventPortErr, "b": verbs.EventPortErr})
	if err := a.t.failed()[0]; !errors.Is(err, link.ErrDown) {
		t.Errorf("PORT_ERR's error %v does not match link.ErrDown", err)
	} else {
		t.Logf("PORT_ERR: %v", err)
	}
	reset()
	// A PORT_ERR read when the port is active again (stale, or a flap):
	// nothing fails.
	src.setDown(2, false)
	src.send(t, verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 2})
	expect("stale PORT_ERR", nil)

	// Counted only.
	for _, ty := range []verbs.AsyncEventType{verbs.EventPortActive, verbs.EventSRQLimitReached, verbs.EventQPLastWQEReached, verbs.EventPathMig, 77} {
		src.send(t, verbs.AsyncEvent{Type: ty, Port: 1, QPNum: 10})
	}
	expect("counted only", nil)

	// DEVICE_FATAL: every link on the device.
	src.send(t, verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
	expect("DEVICE_FATAL", map[string]verbs.AsyncEventType{"a": verbs.EventDeviceFatal, "b": verbs.EventDeviceFatal, "c": verbs.EventDeviceFatal})
	reset()

	after := AsyncEventCounts()
	for name, want := range map[string]uint64{
		"QP_FATAL": 2, "QP_ACCESS_ERR": 1, "CQ_ERR": 1, "PORT_ERR": 2, "PORT_ACTIVE": 1, "SRQ_LIMIT_REACHED": 1,
		"QP_LAST_WQE_REACHED": 1, "PATH_MIG": 1, "unknown": 1, "DEVICE_FATAL": 1,
	} {
		if got := after[name] - before[name]; got != want {
			t.Errorf("%s counted %d times; want %d", name, got, want)
		}
	}

	// A link that left is failed no more; the reader stops with the
	// device's last link, and the next link starts another.
	r.remove("rxe0", a.m)
	src.setDown(1, true)
	src.send(t, verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 1})
	expect("PORT_ERR after a left", map[string]verbs.AsyncEventType{"b": verbs.EventPortErr})
	reset()
	r.remove("rxe0", b.m)
	r.remove("rxe0", b.m) // twice: harmless
	select {
	case <-src.done:
		t.Fatal("the reader stopped while c is on the device")
	default:
	}
	r.remove("rxe0", c.m)
	select {
	case <-src.done:
	default:
		t.Fatal("the reader goes on with no link on the device")
	}
	if err := r.add("rxe0", "rxe0", open, a.m); err != nil {
		t.Fatal(err)
	}
	if len(*opened) != 3 {
		t.Fatalf("%d sources opened; want a third for rxe0's new link", len(*opened))
	}
	(*opened)[2].setDown(1, true)
	(*opened)[2].send(t, verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 1})
	expect("PORT_ERR on the new reader", map[string]verbs.AsyncEventType{"a": verbs.EventPortErr})
	r.remove("rxe0", a.m)
	r.remove("rxe1", other.m)
	for i, s := range *opened {
		select {
		case <-s.done:
		default:
			t.Errorf("source %d still open", i)
		}
	}
}

// A reader whose descriptor fails leaves the registry; its links can be
// removed afterwards, and a new link starts a new reader.
func TestAsyncReaderFails(t *testing.T) {
	r, open, opened := newTestRegistry()
	m := &asyncMember{t: &fakeTarget{}, port: 1, qpNum: 5}
	if err := r.add("d", "d", open, m); err != nil {
		t.Fatal(err)
	}
	(*opened)[0].Close() // Wait fails as an EIO would
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		n := len(r.devs)
		r.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the failed reader stayed registered")
		}
		time.Sleep(time.Millisecond)
	}
	r.remove("d", m)
	m2 := &asyncMember{t: &fakeTarget{}, port: 1, qpNum: 6}
	if err := r.add("d", "d", open, m2); err != nil || len(*opened) != 2 {
		t.Fatalf("add after a failed reader: %v, %d sources", err, len(*opened))
	}
	r.remove("d", m2)
	if err := r.add("e", "e", func() (asyncSource, error) { return nil, errors.New("no") }, m2); err == nil {
		t.Error("add succeeded though its source could not be opened")
	}
}
