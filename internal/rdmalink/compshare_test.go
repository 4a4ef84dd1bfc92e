package rdmalink

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/verbs"
)

// The shared completion channel's reading role, on the host: links with
// queues that are only names, over a fake channel that hands out the
// events a test sends and honours deadlines as the netpoller does.

type fakeCompChannel struct {
	events  chan *verbs.CQ
	mu      sync.Mutex
	expired chan struct{} // closed while the deadline is in the past
	waiting atomic.Int32  // Waits in progress: at most one, the role's
}

func newFakeCompChannel() *fakeCompChannel {
	return &fakeCompChannel{events: make(chan *verbs.CQ, 1024), expired: make(chan struct{})}
}

func (f *fakeCompChannel) Wait(ctx context.Context) (*verbs.CQ, error) {
	if f.waiting.Add(1) != 1 {
		panic("two Waits on the completion channel at once")
	}
	defer f.waiting.Add(-1)
	f.mu.Lock()
	expired := f.expired
	f.mu.Unlock()
	select {
	case <-expired:
		return nil, os.ErrDeadlineExceeded
	default:
	}
	select {
	case cq := <-f.events:
		return cq, nil
	case <-expired:
		return nil, os.ErrDeadlineExceeded
	}
}

func (f *fakeCompChannel) SetDeadline(t time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	past := !t.IsZero() && t.Before(time.Now())
	select {
	case <-f.expired:
		if !past {
			f.expired = make(chan struct{})
		}
	default:
		if past {
			close(f.expired)
		}
	}
	return nil
}

func (f *fakeCompChannel) Close() error { return nil }

// fakeCQ is a completion queue whose completions a test adds.
type fakeCQ struct {
	mu      sync.Mutex
	wcs     []verbs.WorkCompletion
	arms    atomic.Int32
	polls   atomic.Int32
	pollErr error
	refill  func() []verbs.WorkCompletion // completions that keep coming
	// afterPoll runs after each poll, outside f.mu: what happens between
	// a poll that found the queue empty and the poller's next step.
	afterPoll func()
}

func (f *fakeCQ) add(wcs ...verbs.WorkCompletion) {
	f.mu.Lock()
	f.wcs = append(f.wcs, wcs...)
	f.mu.Unlock()
}

func (f *fakeCQ) Poll(wcs []verbs.WorkCompletion) (int, error) {
	f.polls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pollErr != nil {
		return 0, f.pollErr
	}
	if f.refill != nil && len(f.wcs) < len(wcs) {
		f.wcs = append(f.wcs, f.refill()...)
	}
	n := copy(wcs, f.wcs)
	f.wcs = f.wcs[n:]
	if after := f.afterPoll; after != nil {
		f.mu.Unlock()
		after()
		f.mu.Lock()
	}
	return n, nil
}

func (f *fakeCQ) RequestNotify(bool) error { f.arms.Add(1); return nil }

// fakeLink makes a link with a slot on q, as New does.
func fakeLink(s *compShare, q *sharedCQ, need int) *Link {
	slot, gen, ok := q.take(cqNeed{entries: need})
	if !ok {
		panic("no room on the queue")
	}
	l := &Link{res: &resources{share: s, cq: q, slot: slot, gen: gen, need: cqNeed{entries: need}},
		events: make(chan struct{}, 1), wakes: make(chan struct{}, 1),
		tag: wrTag(slot, gen), sendIDs: make([]uint64, need)}
	q.attach(slot, l, 0)
	return l
}

// fakeLinks makes n links on one share, each with a queue of its own.
func fakeLinks(n int) (*compShare, *fakeCompChannel, []*Link, []*verbs.CQ) {
	ch := newFakeCompChannel()
	s := newCompShare("device", ch)
	links, cqs := make([]*Link, n), make([]*verbs.CQ, n)
	for i := range links {
		cqs[i] = new(verbs.CQ)
		q := newSharedCQ(&fakeCQ{}, 64)
		q.vcq = cqs[i]
		s.cqs[cqs[i]] = q
		s.queues = append(s.queues, q)
		links[i] = fakeLink(s, q, 8)
	}
	return s, ch, links, cqs
}

// complete makes a completion for l (a receive) and sends its queue's
// event, as a device does for an armed queue.
func complete(ch *fakeCompChannel, l *Link) {
	l.res.cq.cq.(*fakeCQ).add(verbs.WorkCompletion{ID: l.recvID(0)})
	ch.events <- l.res.cq.vcq
}

// armAndWait is what a link's user does before it sleeps (connfd.FD):
// arm, take what came already, and Wait only if nothing did. It reports
// nil when completions came.
func armAndWait(l *Link) error {
	if err := l.Arm(); err != nil {
		return err
	}
	if l.takePending(make([]verbs.WorkCompletion, 64)) > 0 {
		return nil
	}
	err := l.Wait()
	l.takePending(make([]verbs.WorkCompletion, 64))
	return err
}

// waitAsync runs armAndWait in a goroutine.
func waitAsync(l *Link) <-chan error {
	done := make(chan error, 1)
	go func() { done <- armAndWait(l) }()
	return done
}

func expect(t *testing.T, done <-chan error, want error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, want) && err != want {
			t.Fatalf("%s: Wait returned %v, want %v", what, err, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: Wait did not return", what)
	}
}

func roleFree(t *testing.T, s *compShare) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); len(s.role) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the role was not given back")
		}
	}
}

func TestCompShareOwnEvent(t *testing.T) {
	s, ch, links, _ := fakeLinks(1)
	done := waitAsync(links[0])
	complete(ch, links[0])
	expect(t, done, nil, "an event for the reader's own queue")
	roleFree(t, s)
	if links[0].armed.Load() || links[0].res.cq.armedLinks.Load() != 0 {
		t.Fatal("a link's Wait returned and left it armed")
	}
}

// An event for another link wakes it, and the reader gives the role up and
// waits on; the role then serves whoever waits, the first reader too.
func TestCompShareHandsEventsOn(t *testing.T) {
	s, ch, links, _ := fakeLinks(2)
	a := waitAsync(links[0])
	for end := time.Now().Add(5 * time.Second); ch.waiting.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("nobody reads the channel")
		}
	}
	b := waitAsync(links[1])
	eventually(t, "the second link did not arm", func() bool { return links[1].armed.Load() })
	complete(ch, links[1])
	expect(t, b, nil, "an event for a link that does not read")
	select {
	case err := <-a:
		t.Fatalf("the reader's Wait returned %v for another link's event", err)
	case <-time.After(20 * time.Millisecond):
	}
	complete(ch, links[0])
	expect(t, a, nil, "the first reader's own event, after it gave the role up")
	roleFree(t, s)
	// A link whose completion came while it did not wait finds it when
	// it arms next.
	other := waitAsync(links[0])
	complete(ch, links[1])
	eventually(t, "the completion was not taken from the queue", links[1].hasPending)
	expect(t, waitAsync(links[1]), nil, "a completion that came before the Wait")
	links[0].Wake()
	expect(t, other, link.ErrWoken, "the reader, woken")
}

func TestCompShareWake(t *testing.T) {
	s, ch, links, _ := fakeLinks(2)
	reader := waitAsync(links[0])
	for ch.waiting.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	follower := waitAsync(links[1])
	links[1].Wake()
	expect(t, follower, link.ErrWoken, "a woken link that does not read")
	links[0].Wake()
	expect(t, reader, link.ErrWoken, "a woken reader")
	roleFree(t, s)
	// The reader's deadline is cleared: the next reader waits for events.
	done := waitAsync(links[1])
	select {
	case err := <-done:
		t.Fatalf("Wait after a cleared wake-up returned %v at once", err)
	case <-time.After(20 * time.Millisecond):
	}
	ch.events <- new(verbs.CQ) // nobody's queue: dropped
	complete(ch, links[1])
	expect(t, done, nil, "an event after one for nobody")
	// A wake-up before the Wait stands.
	links[0].Wake()
	expect(t, waitAsync(links[0]), link.ErrWoken, "a wake-up that came before the Wait")
	// A link that has ended returns at once, every time.
	links[1].Fail(errors.New("gone"))
	expect(t, waitAsync(links[1]), link.ErrWoken, "an ended link")
	expect(t, waitAsync(links[1]), link.ErrWoken, "an ended link, again")
}

// Many links waiting, woken and sent events at random (run with -race):
// every event reaches its link, never two readers at once (the fake
// panics), and the role is free at the end.
// With the dispatcher, it takes the role whenever nobody waits, and gives
// it up to every Wait.
func TestCompShareManyLinks(t *testing.T) {
	t.Run("waiters", func(t *testing.T) { manyLinks(t, false) })
	t.Run("dispatcher", func(t *testing.T) { manyLinks(t, true) })
}

func manyLinks(t *testing.T, dispatcher bool) {
	const n, rounds = 32, 200
	s, ch, links, cqs := fakeLinks(n)
	if dispatcher {
		s.startDispatcher()
		defer s.stopDispatcher()
	}
	var wg sync.WaitGroup
	got := make([]atomic.Int64, n)
	pending := make([]atomic.Int64, n)
	buf := make([][]verbs.WorkCompletion, n)
	for i, l := range links {
		wg.Add(1)
		buf[i] = make([]verbs.WorkCompletion, 64)
		go func() {
			defer wg.Done()
			for got[i].Load() < rounds {
				if err := l.Arm(); err != nil {
					t.Error(err)
					return
				}
				k := l.takePending(buf[i])
				if k == 0 {
					if err := l.Wait(); err == nil {
						k = l.takePending(buf[i])
					}
				}
				pending[i].Add(-int64(k))
				got[i].Add(int64(k))
			}
		}()
	}
	for range rounds {
		for _, i := range rand.Perm(n) {
			if got[i].Load()+pending[i].Load() < rounds {
				pending[i].Add(1)
				complete(ch, links[i])
			}
			if rand.IntN(4) == 0 {
				links[rand.IntN(n)].Wake()
			}
		}
		time.Sleep(100 * time.Microsecond)
	}
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	// Every completion reaches its link: none is lost to a wake-up or to
	// another link's reading.
	select {
	case <-finished:
		if !dispatcher {
			roleFree(t, s)
		}
	case <-time.After(30 * time.Second):
		for i := range links {
			t.Errorf("link %d: %d completions taken, %d pending", i, got[i].Load(), pending[i].Load())
		}
		t.Fatal("completions were lost")
	}
	_ = cqs
}

// notified counts a link's notify calls.
func notified(l *Link) *atomic.Int32 {
	var n atomic.Int32
	l.SetNotify(func() { n.Add(1) })
	return &n
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal(what)
		}
	}
}

// While no link waits, the dispatcher reads the channel and tells a link
// of its event through its notify function; a link's Wait takes the role
// from it, and reads its own events with no hand-off; the dispatcher takes
// the role back once nobody waits, and stops.
func TestCompShareDispatcher(t *testing.T) {
	s, ch, links, _ := fakeLinks(2)
	s.startDispatcher()
	n0, n1 := notified(links[0]), notified(links[1])
	eventually(t, "the dispatcher does not read the channel", func() bool { return ch.waiting.Load() == 1 })
	links[0].Arm() // as an idle connection leaves its link
	complete(ch, links[0])
	eventually(t, "an event for an idle link did not call its notify function", func() bool { return n0.Load() == 1 })
	if n1.Load() != 0 {
		t.Fatal("another link was told")
	}
	// The event stands for the link's next Wait, as before.
	expect(t, waitAsync(links[0]), nil, "a Wait after the event")

	// A Wait takes the role: its own event ends it, and no notify
	// function is called for a link whose Wait runs.
	done := waitAsync(links[1])
	eventually(t, "the waiting link does not read the channel", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.reader == links[1]
	})
	complete(ch, links[1])
	expect(t, done, nil, "the waiter's own event")
	if n1.Load() != 0 {
		t.Fatalf("a link whose Wait ran was told %d times", n1.Load())
	}
	// Nobody waits: the dispatcher reads again.
	eventually(t, "the dispatcher did not take the role back", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.dispatching && ch.waiting.Load() == 1
	})
	links[1].Arm()
	complete(ch, links[1])
	eventually(t, "an event after the Wait did not call the notify function", func() bool { return n1.Load() == 1 })
	// An ended link is told too, with no Wait running.
	links[0].Fail(errors.New("gone"))
	eventually(t, "a link's end did not call its notify function", func() bool { return n0.Load() == 2 })
	s.stopDispatcher()
	if ch.waiting.Load() != 0 {
		t.Fatal("the dispatcher still reads after its stop")
	}
	roleFree(t, s)
}

// While the device's links wait again within the linger (a connection
// answering requests one at a time), the dispatcher leaves the channel
// alone: no Wait has to take the role back from it, and nobody but the
// waiter wakes for its event. TestCompShareDispatcher has it take the
// role once the links stop waiting.
func TestCompShareDispatcherLingers(t *testing.T) {
	s, ch, links, _ := fakeLinks(1)
	s.linger = time.Hour
	s.startDispatcher()
	var before int // the reads of the dispatcher's start, before the first Wait
	for i := range 50 {
		done := waitAsync(links[0])
		eventually(t, "the waiting link does not read the channel", func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.reader == links[0]
		})
		if i == 0 {
			s.mu.Lock()
			before = s.takes
			s.mu.Unlock()
		}
		complete(ch, links[0])
		expect(t, done, nil, "the waiter's own event")
		time.Sleep(time.Millisecond) // the request's work, before the next Wait
	}
	s.stopDispatcher()
	if n := s.takes - before; n != 0 {
		t.Fatalf("the dispatcher read the channel %d times between Waits", n)
	}
	roleFree(t, s)
}

// A channel that fails under the dispatcher fails every Wait after it, and
// tells the links nobody waits on.
func TestCompShareDispatcherChannelFails(t *testing.T) {
	s, ch, links, _ := fakeLinks(1)
	s.ch = &failingChannel{fakeCompChannel: ch, err: errors.New("channel broke")}
	n := notified(links[0])
	s.startDispatcher()
	eventually(t, "the links were not told the channel failed", func() bool { return n.Load() == 1 })
	expect(t, waitAsync(links[0]), s.err, "a Wait after the channel failed")
	s.stopDispatcher()
}

type failingChannel struct {
	*fakeCompChannel
	err error
}

func (f *failingChannel) Wait(context.Context) (*verbs.CQ, error) { return nil, f.err }

// An event handed to a link while it did not wait ends its next Wait, even
// when the role is free too: the Wait must not read the channel past it
// (select picks at random among ready cases; this hung a lab connection's
// Read with five completions in its queue).
func TestCompShareHandedEventBeatsRole(t *testing.T) {
	s, _, links, _ := fakeLinks(1)
	for range 64 {
		roleFree(t, s)
		links[0].arrived()
		expect(t, waitAsync(links[0]), nil, "a Wait after an event was handed over")
	}
	roleFree(t, s)
}
