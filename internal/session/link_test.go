package session

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// The session link over in-memory pipes, with no engine: the tests take
// its completions themselves and tell it of a lost path (Lost) as the
// connection does.

const hangGuard = 10 * time.Second

// pipeOver is a new pipe whose first end runs over rings tx and rx (a
// session's), as every path of a session does.
func pipeOver(tx, rx []byte) (*link.Pipe, *link.Pipe) {
	c := link.PipeConfig{SendRing: 4096, RecvRing: 4096, SendDepth: 4, RecvDepth: 4, ControlDepth: 2, RNRRetry: 7}
	a := c
	a.SendMem, a.RecvMem = tx, rx
	return link.NewPipe(a, c)
}

// tracked counts its Closes and Disconnects.
type tracked struct {
	link.Link
	closes, disconnects atomic.Int32
}

func (t *tracked) Close() error      { t.closes.Add(1); return t.Link.Close() }
func (t *tracked) Disconnect() error { t.disconnects.Add(1); return t.Link.Disconnect() }

// endError is what the tests' GiveUp makes.
type endError struct{ End }

func (e *endError) Error() string { return fmt.Sprintf("test: no resume: %v", e.Cause) }

var errNothingListens = errors.New("test: nothing listens")

// rig is a session under test and what its hooks saw.
type rig struct {
	l      *Link
	moves  chan Move
	closed atomic.Int32
	kicks  atomic.Int32
}

func newRig(t *testing.T, first link.Link, cfg Config) *rig {
	t.Helper()
	r := &rig{moves: make(chan Move, 16)}
	cfg.ID = wire.SessionID{1, 2, 3}
	cfg.PathName = func(l link.Link, name string) string { return name }
	cfg.GiveUp = func(e End) error { return &endError{e} }
	cfg.NothingListens = func(err error) bool { return errors.Is(err, errNothingListens) }
	cfg.Moved = func(m Move) { r.moves <- m }
	cfg.Closed = func() { r.closed.Add(1) }
	if cfg.Timeout == 0 {
		cfg.Timeout = hangGuard
	}
	if cfg.FailbackInterval == 0 {
		cfg.FailbackInterval = -1
	}
	r.l = New(first, cfg)
	r.l.SetNotify(func() { r.kicks.Add(1) })
	t.Cleanup(func() { r.l.Close() })
	return r
}

// pollFor polls l until a completion of kind comes, and returns it; it
// fails on any other kind but those in skip.
func pollFor(t *testing.T, l *Link, kind link.CompletionKind, skip ...link.CompletionKind) link.Completion {
	t.Helper()
	var cs [8]link.Completion
	for end := time.Now().Add(hangGuard); time.Now().Before(end); time.Sleep(time.Millisecond) {
		n, err := l.Poll(cs[:])
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		for _, c := range cs[:n] {
			switch {
			case c.Kind == kind:
				return c
			case !containsKind(skip, c.Kind):
				t.Fatalf("completion %v (%v) while waiting for %v", c.Kind, c.Err, kind)
			}
		}
	}
	t.Fatalf("no %v completion", kind)
	return link.Completion{}
}

func containsKind(ks []link.CompletionKind, k link.CompletionKind) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// TestDialerResumes: the dialer's path fails; the session lets go of it,
// closes it before it dials the next one over the same rings, reports the
// new one (Resumed), and takes the server's generation.
func TestDialerResumes(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	first := &tracked{Link: a1}
	var second *link.Pipe
	var closedBeforeDial atomic.Bool
	paths := []Path{{Name: "memory", Dial: func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error) {
		if !h.Resume || h.Session != (wire.SessionID{1, 2, 3}) || h.Generation != 4 || h.RingSize != 4096 {
			return nil, wire.Hello{}, fmt.Errorf("the dialer asked for %+v", h)
		}
		closedBeforeDial.Store(first.closes.Load() == 1)
		a, b := pipeOver(a1.SendRing(), a1.RecvRing())
		b.Close()
		second = a
		return a, wire.Hello{Generation: 5}, nil
	}}}
	r := newRig(t, first, Config{Gen: 4, Hello: wire.Hello{RingSize: 4096}, Paths: paths})
	l := r.l
	if s := l.Snapshot(); s.Path != "memory" || s.Suspended || s.State != Active || s.Generation != 4 {
		t.Fatalf("a new session: %+v", s)
	}
	local, remote := a1.Addrs()
	a1.Cut(errors.New("test: cable pulled"))
	c := pollFor(t, l, link.Failed)
	if !errors.Is(c.Err, link.ErrDown) || !l.Lost(c.Err) {
		t.Fatalf("the path's end %v: not a failure the session counts", c.Err)
	}
	if l.Lost(c.Err) {
		t.Errorf("a second Lost counted again")
	}
	c = pollFor(t, l, link.Resumed)
	if !closedBeforeDial.Load() {
		t.Errorf("the next path was dialed before the lost one was closed")
	}
	s := l.Snapshot()
	if s.Path != "memory" || s.Suspended || s.Failovers != 1 || s.Generation != 5 || s.State != Active {
		t.Errorf("after the resume: %+v", s)
	}
	if l.Path() != link.Link(second) || l.Caps().SendDepth != 4 || &l.SendRing()[0] != &a1.SendRing()[0] {
		t.Errorf("the session runs on %v, caps %+v", l.Path(), l.Caps())
	}
	if addr, key := l.RecvRingKey(); addr == 0 && key == 0 {
		t.Errorf("the new path's ring key is zero")
	}
	select {
	case m := <-r.moves:
		if MoveReason(m.Cause) != "link-down" || m.From != "memory" || m.To != "memory" || m.ToPath != "memory" || !strings.Contains(m.Cause.Error(), "cable pulled") {
			t.Errorf("move %+v", m)
		}
	default:
		t.Errorf("the move was not reported")
	}
	if !errors.Is(l.Why(), link.ErrDown) {
		t.Errorf("Why: %v", l.Why())
	}
	if r.kicks.Load() == 0 {
		t.Errorf("the connection was never told of the session's completions")
	}
	if h := l.Hello(); h.Generation != 5 || !h.Resume {
		t.Errorf("the next resume asks for %+v", h)
	}
	if l2, r2 := l.Addrs(); l2 == local && r2 == remote {
		t.Errorf("addresses %v -> %v, the lost path's", l2, r2)
	} else if l3, r3 := second.Addrs(); l2 != l3 || r2 != r3 {
		t.Errorf("addresses %v -> %v, want the new path's %v -> %v", l2, r2, l3, r3)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.Discard()
	if n := r.closed.Load(); n != 1 {
		t.Errorf("Closed ran %d times", n)
	}
}

// TestSessionWithoutPath: between paths the session refuses posts, has
// no ring key, keeps the last path's addresses, and a Wait sleeps until
// Wake or a completion of the session's own.
func TestSessionWithoutPath(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	hold := make(chan struct{})
	paths := []Path{{Name: "memory", Dial: func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error) {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, wire.Hello{}, ctx.Err()
		}
		a, b := pipeOver(a1.SendRing(), a1.RecvRing())
		b.Close()
		return a, wire.Hello{}, nil
	}}}
	r := newRig(t, a1, Config{Paths: paths})
	l := r.l
	local, remote := a1.Addrs()
	l.Lost(fmt.Errorf("test: %w", link.ErrDown))
	if s := l.Snapshot(); !s.Suspended || s.Path != "" || s.State != Suspended {
		t.Errorf("suspended: %+v", s)
	}
	if l.Path() != nil || l.Caps().Name != "none" {
		t.Errorf("a path %v, caps %+v", l.Path(), l.Caps())
	}
	if err := l.PostSend(nil); err != errNoPath {
		t.Errorf("PostSend: %v", err)
	}
	if err := l.PostRecv(1); err != errNoPath {
		t.Errorf("PostRecv: %v", err)
	}
	if addr, key := l.RecvRingKey(); addr != 0 || key != 0 || l.Arm() != nil {
		t.Errorf("ring key %#x/%#x", addr, key)
	}
	if l2, r2 := l.Addrs(); l2 != local || r2 != remote {
		t.Errorf("addresses %v -> %v, want the last path's", l2, r2)
	}
	var cs [4]link.Completion
	if n, err := l.Poll(cs[:]); n != 0 || err != nil {
		t.Errorf("Poll: %d, %v", n, err)
	}
	woke := make(chan error, 1)
	go func() { woke <- l.Wait() }()
	time.Sleep(10 * time.Millisecond)
	select {
	case err := <-woke:
		t.Fatalf("Wait returned %v with nothing to report", err)
	default:
	}
	l.Wake()
	if err := <-woke; err != link.ErrWoken {
		t.Errorf("Wait after Wake: %v", err)
	}
	close(hold)
	for end := time.Now().Add(hangGuard); l.Path() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no new path")
		}
	}
	if err := l.Wait(); err != nil {
		t.Errorf("Wait with the Resumed completion waiting: %v", err)
	}
	pollFor(t, l, link.Resumed)
}

// TestDialerGivesUp: every path fails until the timeout: the session ends
// with GiveUp's error, naming each path tried, and refuses resumes after.
func TestDialerGivesUp(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	fail := func(err error) func(context.Context, wire.Hello) (link.Link, wire.Hello, error) {
		return func(context.Context, wire.Hello) (link.Link, wire.Hello, error) { return nil, wire.Hello{}, err }
	}
	paths := []Path{{Name: "rdma", Dial: fail(errors.New("test: no route"))}, {Name: "tcp", TCP: true, Dial: fail(errors.New("test: refused"))}}
	r := newRig(t, a1, Config{Paths: paths, Timeout: 200 * time.Millisecond})
	l := r.l
	cause := fmt.Errorf("test: %w", link.ErrDown)
	start := time.Now()
	l.Lost(cause)
	c := pollFor(t, l, link.Ended)
	var ee *endError
	if !errors.As(c.Err, &ee) || ee.Cause != cause || ee.Refused || len(ee.Attempts) != 2 || ee.Attempts[0].Path != "rdma" || ee.Attempts[1].Path != "tcp" || ee.Attempts[0].Tries < 2 {
		t.Fatalf("the end: %v (%+v)", c.Err, ee)
	}
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Errorf("gave up after %v, before the timeout", waited)
	}
	if s := l.Snapshot(); s.State != Ended || s.Suspended {
		t.Errorf("ended: %+v", s)
	}
	if _, err := l.BeginResume(0); !errors.Is(err, ErrRefused) {
		t.Errorf("a resume of an ended session: %v", err)
	}
}

// TestDialerRefused: the server refuses the session: it ends at once, not
// at the timeout.
func TestDialerRefused(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	paths := []Path{{Name: "rdma", Dial: func(context.Context, wire.Hello) (link.Link, wire.Hello, error) {
		return nil, wire.Hello{}, fmt.Errorf("%w: unknown session", ErrRefused)
	}}}
	r := newRig(t, a1, Config{Paths: paths, Timeout: time.Hour})
	r.l.Lost(fmt.Errorf("test: %w", link.ErrDown))
	c := pollFor(t, r.l, link.Ended)
	var ee *endError
	if !errors.As(c.Err, &ee) || !ee.Refused || ee.Attempts[0].Tries != 1 {
		t.Fatalf("the end: %v", c.Err)
	}
}

// TestDialerPeerLeft: the server left the path without closing, and
// nothing listens where it was: the session ends as the peer's close.
func TestDialerPeerLeft(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	var tries atomic.Int32
	paths := []Path{
		{Name: "first", Dial: func(context.Context, wire.Hello) (link.Link, wire.Hello, error) {
			tries.Add(1)
			return nil, wire.Hello{}, errNothingListens
		}},
		{Name: "second", Dial: func(context.Context, wire.Hello) (link.Link, wire.Hello, error) {
			t.Error("the other path was tried first")
			return nil, wire.Hello{}, errors.New("test: no")
		}},
	}
	r := newRig(t, a1, Config{Paths: paths, Timeout: time.Hour})
	if r.l.Lost(stream.ErrPeerLeftLink) {
		t.Errorf("the peer's leaving counted as a failure")
	}
	if c := pollFor(t, r.l, link.Ended); c.Err != stream.ErrPeerLeftLink || tries.Load() != 1 {
		t.Fatalf("the end: %v after %d tries", c.Err, tries.Load())
	}
}

// TestServerResumes: the server checks the dialer's generation, takes one
// resume at a time, lets go of the path it still has when the dialer
// resumed elsewhere, and moves to the generation it gave out once the
// dialer speaks on the new path.
func TestServerResumes(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer a1.Close()
	first := &tracked{Link: b1}
	r := newRig(t, first, Config{ClientIP: netip.MustParseAddr("192.0.2.1")})
	l := r.l
	if !l.MayResumeFrom(netip.MustParseAddr("192.0.2.1")) || l.MayResumeFrom(netip.MustParseAddr("192.0.2.9")) {
		t.Errorf("MayResumeFrom: the dialer's address only, while the session has a path")
	}
	if _, err := l.BeginResume(3); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "generation 3") {
		t.Errorf("a stale generation: %v", err)
	}
	next, err := l.BeginResume(0)
	if err != nil || next != 1 {
		t.Fatalf("BeginResume: %d, %v", next, err)
	}
	if _, err := l.BeginResume(0); err != ErrBusy {
		t.Errorf("a second resume at once: %v", err)
	}
	// A waiter asleep on the old path is woken, and the path is closed
	// only once it left.
	woke := make(chan error, 1)
	go func() { woke <- l.Wait() }()
	a2, b2 := pipeOver(b1.SendRing(), b1.RecvRing())
	defer a2.Close()
	ended := make(chan error, 1)
	go func() { ended <- l.EndResume(b2, "memory#2") }()
	c := pollFor(t, l, link.Failed)
	if MoveReason(c.Err) != "peer-resumed" || l.Lost(c.Err) {
		t.Fatalf("the old path's end %v", c.Err)
	}
	if err := <-woke; err != link.ErrWoken && err != nil {
		t.Errorf("the waiter on the old path: %v", err)
	}
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	pollFor(t, l, link.Resumed)
	if first.closes.Load() != 1 {
		t.Errorf("the old path closed %d times", first.closes.Load())
	}
	if s := l.Snapshot(); s.Path != "memory#2" || s.Generation != 0 || s.Failovers != 1 {
		t.Errorf("resumed, unconfirmed: %+v", s)
	}
	if err := a2.PostSend([]link.SendWR{{Kind: link.SendControl, Signaled: true, ID: 1}}); err != nil {
		t.Fatal(err)
	}
	pollFor(t, l, link.ControlArrived)
	if s := l.Snapshot(); s.Generation != 1 {
		t.Errorf("after the dialer's first message the generation is %d, want 1", s.Generation)
	}
	if _, err := l.BeginResume(0); !errors.Is(err, ErrRefused) {
		t.Errorf("a resume at the generation before the confirmed one: %v", err)
	}
}

// TestServerGivesUp: no resume comes in time: the session ends; and a
// dialer that left its path without closing is waited for only
// PeerLeftWait, unless it knocked.
func TestServerGivesUp(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		a1, b1 := pipeOver(nil, nil)
		defer a1.Close()
		r := newRig(t, b1, Config{Timeout: 100 * time.Millisecond})
		cause := fmt.Errorf("test: %w", link.ErrDown)
		r.l.Lost(cause)
		if !r.l.MayResumeFrom(netip.MustParseAddr("192.0.2.77")) {
			t.Errorf("a session without a path refuses a resume from a new address")
		}
		c := pollFor(t, r.l, link.Ended)
		var ee *endError
		if !errors.As(c.Err, &ee) || ee.Cause != cause || len(ee.Attempts) != 0 {
			t.Errorf("the end: %v", c.Err)
		}
	})
	t.Run("peer left", func(t *testing.T) {
		a1, b1 := pipeOver(nil, nil)
		defer a1.Close()
		r := newRig(t, b1, Config{Timeout: time.Hour, PeerLeftWait: 20 * time.Millisecond})
		r.l.Lost(stream.ErrPeerLeftLink)
		if c := pollFor(t, r.l, link.Ended); c.Err != stream.ErrPeerLeftLink {
			t.Errorf("the end: %v", c.Err)
		}
	})
	t.Run("peer left and knocked", func(t *testing.T) {
		a1, b1 := pipeOver(nil, nil)
		defer a1.Close()
		r := newRig(t, b1, Config{Timeout: 300 * time.Millisecond, PeerLeftWait: 20 * time.Millisecond})
		r.l.Lost(stream.ErrPeerLeftLink)
		if _, err := r.l.BeginResume(0); err != nil {
			t.Fatal(err)
		}
		r.l.EndResume(nil, "")
		c := pollFor(t, r.l, link.Ended)
		var ee *endError
		if !errors.As(c.Err, &ee) || ee.Waited < 300*time.Millisecond {
			t.Errorf("a dialer that knocked: the end %v, want the timeout's", c.Err)
		}
	})
}

// TestFailback: a dialer on its second path moves back to the first once
// it works: tries that fail change nothing; the one that works lets go of
// the second path (a move) and resumes on the first.
func TestFailback(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	var broken atomic.Bool
	var failed atomic.Int32
	var mu sync.Mutex
	var others []*link.Pipe
	dial := func(context.Context, wire.Hello) (link.Link, wire.Hello, error) {
		a, b := pipeOver(a1.SendRing(), a1.RecvRing())
		mu.Lock()
		others = append(others, b)
		mu.Unlock()
		return a, wire.Hello{}, nil
	}
	defer func() {
		for _, b := range others {
			b.Close()
		}
	}()
	paths := []Path{
		{Name: "primary", Dial: func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error) {
			if broken.Load() {
				failed.Add(1)
				return nil, wire.Hello{}, errors.New("test: the first path is down")
			}
			return dial(ctx, h)
		}},
		{Name: "secondary", Dial: dial},
	}
	r := newRig(t, a1, Config{Paths: paths, FailbackInterval: 5 * time.Millisecond})
	l := r.l
	broken.Store(true)
	l.Lost(fmt.Errorf("test: %w", link.ErrDown))
	pollFor(t, l, link.Resumed)
	if s := l.Snapshot(); s.Path != "secondary" {
		t.Fatalf("resumed on %q", s.Path)
	}
	for end := time.Now().Add(hangGuard); failed.Load() < 4; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no failback tries")
		}
	}
	if s := l.Snapshot(); s.Path != "secondary" || s.Failbacks != 0 {
		t.Errorf("failed failbacks changed the session: %+v", s)
	}
	broken.Store(false)
	c := pollFor(t, l, link.Failed)
	if MoveReason(c.Err) != "failback" || l.Lost(c.Err) {
		t.Fatalf("the second path's end: %v", c.Err)
	}
	pollFor(t, l, link.Resumed)
	for end := time.Now().Add(hangGuard); l.Snapshot().Failbacks != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no failback: %+v", l.Snapshot())
		}
	}
	if s := l.Snapshot(); s.Path != "primary" || MoveReason(s.LastMove.Cause) != "failback" || s.LastMove.FromPath != "secondary" {
		t.Errorf("after the failback: %+v", s)
	}
}

// TestFailbackFromTCP: a session that went to TCP because every RDMA path
// failed moves to the first RDMA path that works again, not only to its
// first path, and from there back to the first once that works too.
func TestFailbackFromTCP(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	var mu sync.Mutex
	var others []*link.Pipe
	defer func() {
		for _, b := range others {
			b.Close()
		}
	}()
	var broken [2]atomic.Bool
	var tries [2]atomic.Int32
	path := func(name string, i int, tcp bool) Path {
		return Path{Name: name, TCP: tcp, Dial: func(context.Context, wire.Hello) (link.Link, wire.Hello, error) {
			if !tcp {
				tries[i].Add(1)
				if broken[i].Load() {
					return nil, wire.Hello{}, errors.New("test: " + name + " is down")
				}
			}
			a, b := pipeOver(a1.SendRing(), a1.RecvRing())
			mu.Lock()
			others = append(others, b)
			mu.Unlock()
			return a, wire.Hello{}, nil
		}}
	}
	paths := []Path{path("primary", 0, false), path("secondary", 1, false), path("tcp", 0, true)}
	r := newRig(t, a1, Config{Paths: paths, FailbackInterval: 5 * time.Millisecond})
	l := r.l
	broken[0].Store(true)
	broken[1].Store(true)
	l.Lost(fmt.Errorf("test: %w", link.ErrDown))
	pollFor(t, l, link.Resumed)
	if s := l.Snapshot(); s.Path != "tcp" {
		t.Fatalf("resumed on %q, want tcp", s.Path)
	}
	// Failback tries the first path, then the second, each time.
	for end := time.Now().Add(hangGuard); tries[1].Load() < 4; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("failback tried the second path %d times", tries[1].Load())
		}
	}
	if s := l.Snapshot(); s.Path != "tcp" || s.Failbacks != 0 {
		t.Errorf("failed failbacks changed the session: %+v", s)
	}
	broken[1].Store(false)
	backTo := func(want string, failbacks int) {
		t.Helper()
		c := pollFor(t, l, link.Failed)
		if MoveReason(c.Err) != "failback" || l.Lost(c.Err) {
			t.Fatalf("the old path's end: %v", c.Err)
		}
		pollFor(t, l, link.Resumed)
		for end := time.Now().Add(hangGuard); l.Snapshot().Failbacks != failbacks; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("no failback: %+v", l.Snapshot())
			}
		}
		if s := l.Snapshot(); s.Path != want || MoveReason(s.LastMove.Cause) != "failback" {
			t.Errorf("after the failback: %+v; want on %s", s, want)
		}
	}
	backTo("secondary", 1)
	// On the second path, failback tries only the first.
	before, first := tries[1].Load(), tries[0].Load()
	for end := time.Now().Add(hangGuard); tries[0].Load() < first+3; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no failback tries from the second path")
		}
	}
	if n := tries[1].Load(); n != before {
		t.Errorf("on the second path, failback dialed it %d times more", n-before)
	}
	broken[0].Store(false)
	backTo("primary", 2)
}

// TestCloseDuringRecovery: Close stops a dial under way and returns once
// it has; a path that comes after is refused and closed.
func TestCloseDuringRecovery(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	dialing := make(chan struct{})
	var once sync.Once
	paths := []Path{{Name: "memory", Dial: func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error) {
		once.Do(func() { close(dialing) })
		<-ctx.Done()
		return nil, wire.Hello{}, ctx.Err()
	}}}
	r := newRig(t, a1, Config{Paths: paths})
	r.l.Lost(fmt.Errorf("test: %w", link.ErrDown))
	<-dialing
	done := make(chan struct{})
	go func() {
		r.l.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatal("Close hangs on the dial")
	}
	if r.closed.Load() != 1 {
		t.Errorf("Closed ran %d times", r.closed.Load())
	}
	a2, b2 := pipeOver(a1.SendRing(), a1.RecvRing())
	defer b2.Close()
	late := &tracked{Link: a2}
	if err := r.l.attach(late, wire.Hello{}, "late", 0); err == nil || late.closes.Load() != 1 {
		t.Errorf("a path after Close: %v, closed %d times", err, late.closes.Load())
	}
	if _, err := r.l.BeginResume(0); !errors.Is(err, ErrRefused) {
		t.Errorf("a resume after Close: %v", err)
	}
}

// TestDisconnectEndsTheSession: the connection failed: its path is
// disconnected, and the session resumes no more.
func TestDisconnectEndsTheSession(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	first := &tracked{Link: a1}
	r := newRig(t, first, Config{})
	if err := r.l.Disconnect(); err != nil || first.disconnects.Load() != 1 {
		t.Errorf("Disconnect: %v, the path's %d", err, first.disconnects.Load())
	}
	if err := r.l.EndResume(b1, "x"); !errors.Is(err, ErrRefused) {
		t.Errorf("EndResume after Disconnect: %v", err)
	}
	r.l.StopFailback()
	if err := r.l.Close(); err != nil || first.closes.Load() != 1 {
		t.Errorf("Close: %v, the path closed %d times", err, first.closes.Load())
	}
}

// TestMovesRewriteTheOldPathsEnd: during a move, the old path's end,
// which the peer caused, is the move, not the peer's close.
func TestMovesRewriteTheOldPathsEnd(t *testing.T) {
	l := &Link{cfg: Config{ID: wire.SessionID{9}}}
	for _, tc := range []struct {
		state State
		want  string
	}{{Moving, "failback"}, {Attaching, "peer-resumed"}} {
		l.state = tc.state
		cs := []link.Completion{{Kind: link.Disconnected}}
		l.watchLocked(cs)
		if cs[0].Kind != link.Failed || MoveReason(cs[0].Err) != tc.want {
			t.Errorf("%v: %v %v", tc.state, cs[0].Kind, cs[0].Err)
		}
	}
	l.state = Active
	cs := []link.Completion{{Kind: link.Disconnected}}
	if l.watchLocked(cs); cs[0].Kind != link.Disconnected {
		t.Errorf("active: %v", cs[0].Kind)
	}
}

// The table: ended is final, and nothing moves to itself.
func TestTransitions(t *testing.T) {
	for to := range NumStates {
		if Transitions[Ended][to] {
			t.Errorf("ended may move to %v", to)
		}
	}
	for from := range NumStates {
		if Transitions[from][from] {
			t.Errorf("%v moves to itself", from)
		}
	}
	if NumStates.String() != "State(?)" || Moving.String() != "moving" {
		t.Errorf("names: %v, %v", NumStates, Moving)
	}
	if MoveReason(&stream.PathDeadError{}) != "dead-path" || MoveReason(stream.ErrPeerLeftLink) != "peer-left" {
		t.Errorf("reasons")
	}
}

// TestWakeBeforeWait: a Wake that comes before a Wait sleeps (the
// connection let go of its lock, and the Wait has not reached the path
// yet) ends that Wait; none is lost, with a path or without.
func TestWakeBeforeWait(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	r := newRig(t, a1, Config{})
	for _, path := range []bool{true, false} {
		if !path {
			r.l.Lost(fmt.Errorf("test: %w", link.ErrDown))
		}
		r.l.Wake()
		done := make(chan error, 1)
		go func() { done <- r.l.Wait() }()
		select {
		case err := <-done:
			if err != link.ErrWoken {
				t.Errorf("path %v: Wait after Wake: %v", path, err)
			}
		case <-time.After(hangGuard):
			t.Fatalf("path %v: a Wake before the Wait was lost", path)
		}
	}
}

// TestCloseDuringFailback: Close ends a failback's dial under way and
// returns once it has, not when the dial would have timed out.
func TestCloseDuringFailback(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	dialing := make(chan struct{})
	var once sync.Once
	var others []*link.Pipe
	defer func() {
		for _, b := range others {
			b.Close()
		}
	}()
	paths := []Path{
		{Name: "primary", Dial: func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error) {
			// (The recovery tries the other path first.)
			once.Do(func() { close(dialing) })
			<-ctx.Done()
			return nil, wire.Hello{}, ctx.Err()
		}},
		{Name: "secondary", Dial: func(context.Context, wire.Hello) (link.Link, wire.Hello, error) {
			a, b := pipeOver(a1.SendRing(), a1.RecvRing())
			others = append(others, b)
			return a, wire.Hello{}, nil
		}},
	}
	r := newRig(t, a1, Config{Paths: paths, FailbackInterval: time.Millisecond})
	r.l.Lost(fmt.Errorf("test: %w", link.ErrDown))
	pollFor(t, r.l, link.Resumed)
	<-dialing
	start := time.Now()
	r.l.Close()
	if d := time.Since(start); d > failbackAnswerWait/2 {
		t.Errorf("Close took %v with a failback's dial under way", d)
	}
}

// TestServerGivesUpDuringAttach: the server's wait ends while a resume is
// under way: the resume that then completes is refused, its path closed,
// and the session stays ended.
func TestServerGivesUpDuringAttach(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer a1.Close()
	r := newRig(t, b1, Config{Timeout: 50 * time.Millisecond})
	r.l.Lost(fmt.Errorf("test: %w", link.ErrDown))
	if _, err := r.l.BeginResume(0); err != nil {
		t.Fatal(err)
	}
	pollFor(t, r.l, link.Ended)
	a2, b2 := pipeOver(b1.SendRing(), b1.RecvRing())
	defer a2.Close()
	late := &tracked{Link: b2}
	if err := r.l.EndResume(late, "late"); !errors.Is(err, ErrRefused) || late.closes.Load() != 1 {
		t.Errorf("a resume completed after the session ended: %v, its path closed %d times", err, late.closes.Load())
	}
	if s := r.l.Snapshot(); s.State != Ended || s.Path != "" {
		t.Errorf("after the late resume: %+v", s)
	}
}

// TestFailbackLosesItsPath: the path a failback moves from ends while it
// dials (the server died: its end is taken for the move's), and the dial
// fails: the session resumes for that loss, not for an older one (here
// the peer's leaving, which would end it at once as the peer's close).
func TestFailbackLosesItsPath(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer b1.Close()
	release := make(chan struct{})
	var block, dialing atomic.Bool
	var mu sync.Mutex
	var servers []*link.Pipe
	defer func() {
		for _, b := range servers {
			b.Close()
		}
	}()
	var secondaryUp atomic.Bool
	secondaryUp.Store(true)
	paths := []Path{
		{Name: "primary", Dial: func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error) {
			if block.Load() && dialing.CompareAndSwap(false, true) {
				select { // the failback's dial
				case <-release:
				case <-ctx.Done():
				}
			}
			return nil, wire.Hello{}, errors.New("test: primary down")
		}},
		{Name: "secondary", Dial: func(context.Context, wire.Hello) (link.Link, wire.Hello, error) {
			if !secondaryUp.Load() {
				return nil, wire.Hello{}, errNothingListens
			}
			a, b := pipeOver(a1.SendRing(), a1.RecvRing())
			mu.Lock()
			servers = append(servers, b)
			mu.Unlock()
			return a, wire.Hello{}, nil
		}},
	}
	r := newRig(t, a1, Config{Paths: paths, FailbackInterval: time.Millisecond, Timeout: 200 * time.Millisecond})
	l := r.l
	l.Lost(stream.ErrPeerLeftLink) // the older loss: the peer left and came back
	pollFor(t, l, link.Resumed)
	block.Store(true)
	for end := time.Now().Add(hangGuard); !dialing.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no failback")
		}
	}
	secondaryUp.Store(false)
	mu.Lock()
	servers[len(servers)-1].Disconnect()
	mu.Unlock()
	c := pollFor(t, l, link.Failed, link.SendDone, link.DataArrived, link.ControlArrived)
	if MoveReason(c.Err) != "failback" {
		t.Fatalf("the end during the move: %v", c.Err)
	}
	l.Lost(c.Err)
	close(release)
	c = pollFor(t, l, link.Ended)
	var ee *endError
	if !errors.As(c.Err, &ee) || ee.Cause != errFailback {
		t.Errorf("the session ended with %v, want a timeout for the move's loss", c.Err)
	}
}

// TestServerConfirmsOnlyTheNewPath: a message that arrives on the path a
// resume is about to replace (the dialer sent it before it gave the path
// up) confirms nothing: the generation the server gives out next is the
// one it confirms once the dialer speaks on the new path. (A late message
// once took the generation the resume had just given out and left the
// session at 0, refusing every resume after.)
func TestServerConfirmsOnlyTheNewPath(t *testing.T) {
	a1, b1 := pipeOver(nil, nil)
	defer a1.Close()
	r := newRig(t, b1, Config{ClientIP: netip.MustParseAddr("192.0.2.1")})
	l := r.l
	// attach ends the resume on b, as the connection does: the old path's
	// end is the session's to take (Lost), then the new one is reported.
	attach := func(b *link.Pipe, name string) {
		t.Helper()
		ended := make(chan error, 1)
		go func() { ended <- l.EndResume(b, name) }()
		c := pollFor(t, l, link.Failed)
		l.Lost(c.Err)
		if err := <-ended; err != nil {
			t.Fatal(err)
		}
		pollFor(t, l, link.Resumed)
	}
	resume := func(gen uint32, name string) (*link.Pipe, uint32) {
		t.Helper()
		next, err := l.BeginResume(gen)
		if err != nil {
			t.Fatalf("BeginResume(%d): %v", gen, err)
		}
		a, b := pipeOver(b1.SendRing(), b1.RecvRing())
		t.Cleanup(func() { a.Close() })
		attach(b, name)
		return a, next
	}
	speak := func(a *link.Pipe) {
		t.Helper()
		if err := a.PostSend([]link.SendWR{{Kind: link.SendControl, Signaled: true, ID: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	a2, next := resume(0, "memory#2")
	// The dialer gives up path 2 before a word and resumes with the
	// generation it was given; meanwhile its word on path 2 arrives.
	if _, err := l.BeginResume(next); err != nil {
		t.Fatalf("BeginResume(%d): %v", next, err)
	}
	speak(a2)
	pollFor(t, l, link.ControlArrived)
	a3, b3 := pipeOver(b1.SendRing(), b1.RecvRing())
	defer a3.Close()
	attach(b3, "memory#3")
	speak(a3)
	pollFor(t, l, link.ControlArrived)
	if s := l.Snapshot(); s.Generation != next+1 {
		t.Fatalf("after the dialer spoke on path 3 the generation is %d, want %d", s.Generation, next+1)
	}
	if _, err := l.BeginResume(next + 1); err != nil {
		t.Fatalf("the next resume: %v", err)
	}
}
