package cm

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmanet/sdk/internal/rdmacore"
)

// The dispatcher's side of the shared event channel, on the host: events
// and requests are handed to IDs made on a channel without a descriptor,
// with raw IDs that are only names, and rdma-core's reject and destroy
// recorded instead of called.

type fakeCore struct {
	mu        sync.Mutex
	destroyed []rdmacore.CMID
	rejected  map[rdmacore.CMID]string
}

func newFakeChannel(t *testing.T) (*channel, *fakeCore) {
	t.Helper()
	f := &fakeCore{rejected: map[rdmacore.CMID]string{}}
	c := newChannel()
	c.destroyRaw = func(raw rdmacore.CMID) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.destroyed = append(f.destroyed, raw)
		return nil
	}
	c.rejectRaw = func(raw rdmacore.CMID, data []byte) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.rejected[raw] = string(data)
		return nil
	}
	base := liveIDs.Load()
	t.Cleanup(func() {
		if n := liveIDs.Load(); n != base {
			t.Errorf("%d IDs live after the test, %d before", n, base)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.refs != 0 || len(c.ids) != 0 {
			t.Errorf("the channel holds %d references and %d IDs after the test", c.refs, len(c.ids))
		}
	})
	return c, f
}

func fakeRaw() rdmacore.CMID { return rdmacore.CMID(unsafe.Pointer(new(uint64))) }

// fakeID makes an ID on c as NewID does, without rdma-core.
func fakeID(c *channel) *ID {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.registerLocked(fakeRaw())
}

func ev(id *ID, t EventType) rdmacore.CMEvent { return rdmacore.CMEvent{ID: id.raw, Type: int(t)} }

// dispatch hands ev to the ID it is for now, as serve does with a read's.
func (c *channel) dispatch(ev rdmacore.CMEvent) { c.dispatchTo(ev, c.target(ev)) }

func TestDispatchQueuesEventsForTheirID(t *testing.T) {
	c, _ := newFakeChannel(t)
	a, b := fakeID(c), fakeID(c)
	defer a.Close()
	defer b.Close()
	c.dispatch(ev(a, EventAddrResolved))
	c.dispatch(ev(b, EventRouteResolved))
	c.dispatch(ev(a, EventEstablished))
	c.dispatch(rdmacore.CMEvent{ID: fakeRaw(), Type: int(EventDisconnected)}) // nobody's
	ctx := context.Background()
	for _, want := range []struct {
		id *ID
		t  EventType
	}{{a, EventAddrResolved}, {a, EventEstablished}, {b, EventRouteResolved}} {
		got, err := want.id.WaitEvent(ctx)
		if err != nil || got.Type != want.t {
			t.Fatalf("WaitEvent: %v, %v; want %v", got.Type, err, want.t)
		}
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if got, err := a.WaitEvent(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitEvent with nothing queued: %v, %v", got.Type, err)
	}
}

// An event goes to the ID it was for when read (the read looks it up
// before the ack), not to an ID made since in the memory of one closed
// meanwhile: that ID would get an event of another connection's.
func TestDispatchToTheIDOfTheRead(t *testing.T) {
	c, _ := newFakeChannel(t)
	old := fakeID(c)
	var reused *ID
	reads := 0
	wait := func() error { // as read does: the event, and its ID, then the ack
		if reads++; reads > 1 {
			return os.ErrClosed
		}
		e := ev(old, EventConnectResponse)
		c.ev, c.to = e, c.target(e)
		old.Close()
		c.mu.Lock()
		reused = c.registerLocked(old.raw) // librdmacm gave the memory to a new ID
		c.mu.Unlock()
		return nil
	}
	c.serve(wait, func(time.Duration) {})
	defer reused.Close()
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if got, err := reused.WaitEvent(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the new ID got %v, %v: the closed one's event", got.Type, err)
	}
}

func TestDispatchBoundsAnIDsQueue(t *testing.T) {
	c, _ := newFakeChannel(t)
	a := fakeID(c)
	defer a.Close()
	for i := 0; i < 3*maxQueuedEvents; i++ {
		c.dispatch(rdmacore.CMEvent{ID: a.raw, Type: int(EventDisconnected), Status: -i})
	}
	a.mu.Lock()
	n, oldest := len(a.events), a.events[0].Status
	a.mu.Unlock()
	if n != maxQueuedEvents || oldest != -2*maxQueuedEvents {
		t.Fatalf("%d events queued, the oldest %d; want the newest %d", n, oldest, maxQueuedEvents)
	}
}

func TestWaitEventEndsWithClose(t *testing.T) {
	c, _ := newFakeChannel(t)
	a := fakeID(c)
	done := make(chan error, 1)
	go func() {
		_, err := a.WaitEvent(context.Background())
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	a.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("WaitEvent after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake WaitEvent")
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestHandleEvents(t *testing.T) {
	c, _ := newFakeChannel(t)
	a := fakeID(c)
	c.dispatch(ev(a, EventEstablished))
	c.dispatch(ev(a, EventDisconnected))
	var mu sync.Mutex
	var got []EventType
	a.HandleEvents(func(e Event) {
		mu.Lock()
		got = append(got, e.Type)
		mu.Unlock()
	})
	c.dispatch(ev(a, EventTimewaitExit))
	mu.Lock()
	if want := []EventType{EventEstablished, EventDisconnected, EventTimewaitExit}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("the handler saw %v, want %v (queued ones first)", got, want)
	}
	mu.Unlock()
	a.Close()
	c.dispatch(ev(a, EventDisconnected))
	mu.Lock()
	if len(got) != 3 {
		t.Errorf("the handler ran after Close: %v", got)
	}
	mu.Unlock()
}

// Close returns only after a call of the handler in progress: a link frees
// what its handler touches once Close has returned.
func TestCloseWaitsForTheHandler(t *testing.T) {
	c, _ := newFakeChannel(t)
	a := fakeID(c)
	entered, release := make(chan struct{}), make(chan struct{})
	a.HandleEvents(func(Event) {
		close(entered)
		<-release
	})
	go c.dispatch(ev(a, EventDisconnected))
	<-entered
	closed := make(chan struct{})
	go func() {
		a.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while the handler ran")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return after the handler did")
	}
}

// fakeListener is an ID listening with backlog, whose refusals say why.
func fakeListener(c *channel, backlog int) *ID {
	ln := fakeID(c)
	ln.backlog = backlog
	ln.SetRequestReject(func(err error) []byte { return []byte("refused: " + err.Error()) })
	return ln
}

func request(ln *ID) (rdmacore.CMEvent, rdmacore.CMID) {
	raw := fakeRaw()
	return rdmacore.CMEvent{ID: raw, ListenID: ln.raw, Type: int(EventConnectRequest), Param: rdmacore.ConnParam{PrivateData: []byte("hello")}}, raw
}

func TestRequestsUpToTheBacklog(t *testing.T) {
	c, f := newFakeChannel(t)
	ln := fakeListener(c, 2)
	defer ln.Close()
	var raws []rdmacore.CMID
	for range 3 {
		e, raw := request(ln)
		raws = append(raws, raw)
		c.dispatch(e)
	}
	f.mu.Lock()
	why, refused := f.rejected[raws[2]]
	f.mu.Unlock()
	if !refused || why != "refused: "+ErrBacklogFull.Error() || !errors.Is(ErrBacklogFull, syscall.EAGAIN) {
		t.Fatalf("the request beyond the backlog: refused %v with %q", refused, why)
	}
	for _, raw := range raws[:2] {
		r, err := ln.GetRequest(context.Background())
		if err != nil || r.ID.raw != raw || string(r.Param.PrivateData) != "hello" {
			t.Fatalf("GetRequest: %+v, %v", r, err)
		}
		// The request's ID gets its own events.
		c.dispatch(ev(r.ID, EventEstablished))
		if e, err := r.ID.WaitEvent(context.Background()); err != nil || e.Type != EventEstablished {
			t.Fatalf("the request's ID: %v, %v", e.Type, err)
		}
		r.ID.Close()
	}
	// Room again.
	e, raw := request(ln)
	c.dispatch(e)
	if r, err := ln.GetRequest(context.Background()); err != nil || r.ID.raw != raw {
		t.Fatalf("GetRequest after the backlog emptied: %+v, %v", r, err)
	} else {
		r.ID.Close()
	}
}

func TestClosedListenerRefusesItsRequests(t *testing.T) {
	c, f := newFakeChannel(t)
	ln := fakeListener(c, 4)
	e, queued := request(ln)
	c.dispatch(e)
	ln.Close()
	e, late := request(ln)
	c.dispatch(e) // the listener is gone: its request's ID is destroyed
	f.mu.Lock()
	defer f.mu.Unlock()
	if why := f.rejected[queued]; why != "refused: "+ErrClosed.Error() {
		t.Errorf("a queued request when its listener closed: refused with %q", why)
	}
	destroyed := map[rdmacore.CMID]bool{}
	for _, raw := range f.destroyed {
		destroyed[raw] = true
	}
	if !destroyed[queued] || !destroyed[late] || !destroyed[ln.raw] {
		t.Errorf("destroyed %v; want the queued request's, the late one's and the listener's", f.destroyed)
	}
}

func TestListenerEndsOnDeviceRemoval(t *testing.T) {
	c, _ := newFakeChannel(t)
	ln := fakeListener(c, 4)
	defer ln.Close()
	c.dispatch(ev(ln, EventDisconnected)) // nothing to a listener
	c.dispatch(rdmacore.CMEvent{ID: ln.raw, Type: int(EventDeviceRemoval), Status: -int(syscall.ENODEV)})
	_, err := ln.GetRequest(context.Background())
	var ee *EventError
	if !errors.As(err, &ee) || ee.Event != EventDeviceRemoval {
		t.Fatalf("GetRequest after DEVICE_REMOVAL: %v", err)
	}
}

// Events, requests and Closes from many goroutines at once (run with -race).
func TestDispatchRacesClose(t *testing.T) {
	c, _ := newFakeChannel(t)
	ln := fakeListener(c, 8)
	var wg sync.WaitGroup
	ids := make([]*ID, 64)
	for i := range ids {
		ids[i] = fakeID(c)
		ids[i].HandleEvents(func(Event) {})
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range 1000 {
			c.dispatch(ev(ids[i%len(ids)], EventDisconnected))
			e, _ := request(ln)
			c.dispatch(e)
		}
	}()
	go func() {
		defer wg.Done()
		for _, id := range ids {
			id.Close()
		}
		for range 100 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			if r, err := ln.GetRequest(ctx); err == nil {
				r.ID.Close()
			}
			cancel()
		}
	}()
	wg.Wait()
	ln.Close()
}

// TestServeRetriesFailedReads: the dispatcher's retry loop. A read that
// fails is retried after a pause that doubles up to lastReadPause; a read
// that succeeds dispatches its event and ends the back-off; a closed
// channel ends the loop.
func TestServeRetriesFailedReads(t *testing.T) {
	c, _ := newFakeChannel(t)
	id := fakeID(c)
	defer id.Close()
	failed := errors.New("rdma_get_cm_event: no memory")
	// What each read does: fail, or read an event for id.
	reads := []error{failed, failed, failed, nil, failed}
	for range 10 {
		reads = append(reads, failed) // far enough to reach the last pause
	}
	var pauses []time.Duration
	wait := func() error {
		if len(reads) == 0 {
			return os.ErrClosed
		}
		err := reads[0]
		reads = reads[1:]
		if err == nil {
			c.ev, c.to = ev(id, EventEstablished), id
		}
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.serve(wait, func(d time.Duration) { pauses = append(pauses, d) })
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not return once the channel closed")
	}
	want := []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
		5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond,
		160 * time.Millisecond, 320 * time.Millisecond, 640 * time.Millisecond, time.Second, time.Second, time.Second}
	if !slices.Equal(pauses, want) {
		t.Errorf("pauses %v, want %v", pauses, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got, err := id.WaitEvent(ctx); err != nil || got.Type != EventEstablished {
		t.Errorf("the event read between failures: %+v, %v", got, err)
	}
}

// TestAwaitSaysWhichStepTimedOut: a set-up step whose event never comes
// fails, when the caller's context ends, with an error that names the step
// and the event it waited for, and still matches the context's error.
func TestAwaitSaysWhichStepTimedOut(t *testing.T) {
	c, _ := newFakeChannel(t)
	id := fakeID(c)
	defer id.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err := id.await(ctx, "connect", EventEstablished, func() error { return nil })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connect") || !strings.Contains(err.Error(), EventEstablished.String()) {
		t.Errorf("await past the deadline: %v; want the step, its event and context.DeadlineExceeded", err)
	}
	// An event that comes in time is no error.
	c.dispatch(ev(id, EventEstablished))
	if _, err := id.await(context.Background(), "connect", EventEstablished, func() error { return nil }); err != nil {
		t.Errorf("await with its event queued: %v", err)
	}
}
