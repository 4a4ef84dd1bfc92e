package rdmanet

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
)

// movingGroups makes two groups over two pipes each that move their
// streams when a link fails, a the dialer, with Retain agreed (as
// between two rdmanet peers); it returns each path's pipes.
func movingGroups(t testing.TB, streams int, oneLink bool) (a, b *group.Mux, path1, path2 [2]*link.Pipe) {
	t.Helper()
	cfg, _ := Config{}.withDefaults()
	gc := groupStreamConfig(cfg)
	gc.MoveTimeout = 10 * time.Second
	gc.Features = groupStreamOffer // as two rdmanet peers agree on it
	ga, gb := gc, gc
	ga.Mover = true
	pc := groupBase(streams)
	p1a, p1b := linktest.NewPipes(t, pc, pc)
	p2a, p2b := linktest.NewPipes(t, pc, pc)
	a, b = groupsOver(t, ga, gb, p1a, p1b)
	if oneLink {
		return a, b, [2]*link.Pipe{p1a, p1b}, [2]*link.Pipe{p2a, p2b}
	}
	if err := b.AddLink(p2b); err != nil {
		t.Fatal(err)
	}
	if err := a.AddLink(p2a); err != nil {
		t.Fatal(err)
	}
	return a, b, [2]*link.Pipe{p1a, p1b}, [2]*link.Pipe{p2a, p2b}
}

// TestGroupFailover: 100 connections stream both ways over a group's two
// links, with bytes in flight on the first when it fails or the group's
// links change:
//   - cut: an error at both ends; its connections move to the second;
//   - silent: nothing lands, nothing says why, and the connections'
//     keepalives find it;
//   - cut and healed: after the cut, a new link on the first path (as the
//     dialer makes it again) takes half the streams back from the second;
//   - added: the second link comes only then, and takes half the streams
//     from the first, which works on.
//
// Every byte arrives in order and once (SHA-256 at both ends).
func TestGroupFailover(t *testing.T) {
	const conns = 100
	heal := func(t *testing.T, a, b *group.Mux) {
		pc := groupBase(conns)
		qa, qb := linktest.NewPipes(t, pc, pc)
		if err := b.AddLink(qb); err != nil {
			t.Fatal(err)
		}
		if err := a.AddLink(qa); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []groupFailoverCase{
		{"cut", false, func(t *testing.T, a, b *group.Mux, path [2]*link.Pipe) { path[0].Cut(errors.New("test: port down")) },
			conns / 2, 1, 1},
		{"silent", false, func(t *testing.T, a, b *group.Mux, path [2]*link.Pipe) { path[0].Silence() }, conns / 2, 1, 1},
		{"cut and healed", false, func(t *testing.T, a, b *group.Mux, path [2]*link.Pipe) {
			path[0].Cut(errors.New("test: port down"))
			deadline := time.Now().Add(linktest.HangGuard)
			for a.Stats().Moved < conns/2 || b.Stats().Moved < conns/2 {
				if time.Now().After(deadline) {
					t.Fatalf("no move: %+v", a.Stats())
				}
				time.Sleep(time.Millisecond)
			}
			heal(t, a, b)
		}, conns, 1, 2},
		{"added", true, func(t *testing.T, a, b *group.Mux, path [2]*link.Pipe) { heal(t, a, b) }, conns / 2, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) { testGroupFailover(t, conns, tc) })
	}
}

// groupFailoverCase is what breaks or changes, once every connection
// streams, and the counters each side has then: streams moved, links
// that failed, links left.
type groupFailoverCase struct {
	name    string
	oneLink bool // the group starts with one link
	fail    func(t *testing.T, a, b *group.Mux, path [2]*link.Pipe)
	moved   uint64
	down    uint64
	links   int
}

func testGroupFailover(t *testing.T, conns int, tc groupFailoverCase) {
	goroutineCheck(t)
	const size = 64 << 10
	// A keepalive that finds the silent path in a second or two, and
	// takes no stall of a busy test machine for a dead path (which would
	// fail the other link too: here nothing makes it again).
	cfg := Config{KeepAlive: time.Second}
	before := ReadMetrics().GroupMoves
	a, b, path1, _ := movingGroups(t, conns, tc.oneLink)
	// Requests on the first path land a while after they are posted, so
	// that the cut finds some in flight.
	path1[0].SetDelay(2 * time.Millisecond)
	path1[1].SetDelay(2 * time.Millisecond)
	type pair struct{ x, y *Conn }
	pairs := make([]pair, conns)
	for i := range pairs {
		x, y := groupConnPair(t, cfg, a, b)
		pairs[i] = pair{x, y}
	}
	if ls := a.Links(); !tc.oneLink && (len(ls) != 2 || ls[0].Streams != conns/2) {
		t.Fatalf("links %+v, want the streams spread over two", ls)
	}
	var wg sync.WaitGroup
	var progress sync.WaitGroup
	progress.Add(conns)
	for _, p := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A first exchange, so that every connection is mid-stream
			// when the link is cut.
			first := []byte("hello")
			if _, err := p.x.Write(first); err != nil {
				t.Error(err)
			}
			if _, err := io.ReadFull(p.y, first); err != nil {
				t.Error(err)
			}
			progress.Done()
			<-streamBothWays(t, p.x, p.y, size)
		}()
	}
	progress.Wait()
	tc.fail(t, a, b, path1)
	// A hang guard that says where each connection stands, rather than
	// go test's panic ten minutes on.
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(linktest.HangGuard):
		for i, p := range pairs {
			t.Logf("connection %d: %+v\n\tpeer: %+v", i, p.x.Info(), p.y.Info())
		}
		t.Fatalf("connections still streaming %v after the failure; groups %+v, %+v", linktest.HangGuard, a.Stats(), b.Stats())
	}
	// A machine busy enough to stall the other link's completions for
	// 2 x KeepAlive takes it for dead as well (under -race beside a lab
	// VM, once): its streams move too, and every byte still arrives (the
	// checks above and below), but the counts are not the case's.
	extra := a.Stats().LinksDown - tc.down
	if extra > 0 {
		t.Logf("%d more links found dead than the case broke: the machine stalled them past 2 x KeepAlive; %+v", extra, a.Stats())
	}
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		st := m.Stats()
		if extra > 0 {
			if st.LinksDown < tc.down || st.Moved < tc.moved || st.MovesFailed != 0 {
				t.Errorf("%s: %+v, want %d streams moved or more, %d links down or more, none lost", who, st, tc.moved, tc.down)
			}
			continue
		}
		if st.Moved != tc.moved || st.LinksDown != tc.down || st.Links != tc.links || st.MovesFailed != 0 {
			t.Errorf("%s: %+v, want %d streams moved, %d links down, %d left", who, st, tc.moved, tc.down, tc.links)
		}
		if ls := m.Links(); tc.links == 2 && (len(ls) != 2 || ls[0].Streams != conns/2) {
			t.Errorf("%s: links %+v, want the streams spread over two", who, ls)
		}
	}
	for _, p := range pairs {
		if err := errors.Join(p.x.eng.Err(), p.y.eng.Err()); err != nil {
			t.Errorf("connection failed: %v", err)
		}
		closeAndWait(t, p.x)
		closeAndWait(t, p.y)
	}
	// Both sides are this process's: each move counts twice.
	after := ReadMetrics().GroupMoves
	if moved := after["failover"] + after["rebalance"] - before["failover"] - before["rebalance"]; (moved != 2*tc.moved && extra == 0) || moved < 2*tc.moved || after["failed"] != before["failed"] {
		t.Errorf("metrics: %v moves after, %v before; want %d more moved, none failed", after, before, 2*tc.moved)
	}
	// With every stream gone, every receive of the links that work is
	// posted again: a move leaks none.
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		deadline := time.Now().Add(linktest.HangGuard)
		for m.Stats().Streams > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		for _, ls := range m.Links() {
			p := ls.Base.(*link.Pipe)
			if got, want := p.Stats().RecvPosted, p.Caps().RecvDepth; got != want {
				t.Errorf("%s: %d receives posted on a link with no stream, want all %d", who, got, want)
			}
		}
	}
}

// TestGroupPartition: when a group's only link fails and no other takes
// its streams within the move timeout (a partition), a blocked Read at
// each end returns a *GroupMoveError, a net.Error whose Timeout() is
// true, as a session's *ResumeError is.
func TestGroupPartition(t *testing.T) {
	goroutineCheck(t)
	cfg, _ := Config{}.withDefaults()
	gc := groupStreamConfig(cfg)
	gc.MoveTimeout = 200 * time.Millisecond
	ga, gb := gc, gc
	ga.Mover = true
	a, b, pa, _ := groupPipeMuxes(t, ga, gb, groupBase(1))
	x, y := groupConnPair(t, Config{}, a, b)
	defer x.Close()
	defer y.Close()
	pa.Cut(errors.New("test: every path down"))
	for who, c := range map[string]*Conn{"dialer": x, "listener": y} {
		c.SetReadDeadline(time.Now().Add(linktest.HangGuard))
		_, err := c.Read(make([]byte, 1))
		var me *GroupMoveError
		var ne net.Error
		if !errors.As(err, &me) || me.Refused || !errors.As(err, &ne) || !ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: Read after a partition: %v (%T), want a *GroupMoveError that is a timeout", who, err, err)
		}
	}
}

// TestGroupOpenLostWithItsLink: the link a dial's stream opens on fails
// after its StreamOpen arrived and before the answer did. The dial opens
// it again on the group's link that works (openStream), and the group
// and the connection it already had live on; before, the dial took the
// lost open for a group that was down and closed it, with every stream
// on its other link.
func TestGroupOpenLostWithItsLink(t *testing.T) {
	goroutineCheck(t)
	cfg, _ := Config{}.withDefaults()
	a, b, _, path2 := movingGroups(t, 4, false)
	x, y := groupConnPair(t, cfg, a, b) // on the first link: the next open goes to the second
	defer x.Close()
	defer y.Close()
	path2[1].SetDelay(time.Hour) // the listener's answers on path 2 never land
	ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
	defer cancel()
	type result struct {
		s   *group.Stream
		err error
	}
	opened := make(chan result, 1)
	go func() {
		s, err := openStream(ctx, a, 7)
		opened <- result{s, err}
	}()
	lost, err := b.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lost.Close() // it ends after the move timeout: nothing opened it
	path2[0].Cut(errors.New("test: port down"))
	r := <-opened
	if r.err != nil {
		t.Fatalf("openStream after its link failed: %v", r.err)
	}
	again, err := b.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cx, cy := testStreamConn(t, r.s, cfg, false), testStreamConn(t, again, cfg, true)
	defer cx.Close()
	defer cy.Close()
	for _, p := range [][2]*Conn{{x, y}, {cx, cy}} {
		msg := []byte("over the link that works")
		if _, err := p[0].Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(p[1], got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("read %q, %v; want %q", got, err, msg)
		}
	}
	if err := a.Err(); err != nil {
		t.Errorf("the dialer's group ended: %v", err)
	}
	if ls := a.Links(); len(ls) != 1 || ls[0].Streams != 2 {
		t.Errorf("links %+v, want one with both streams", ls)
	}
}

// TestGroupOpensLostUpToABound: a dial whose opens are each lost with
// their link (every link fails under it in turn) opens again
// openLostRetries times, then gives up with group.ErrOpenLost, which
// dialStream answers with a connection of its own.
func TestGroupOpensLostUpToABound(t *testing.T) {
	goroutineCheck(t)
	a, b, path1, path2 := movingGroups(t, 4, false)
	paths := [][2]*link.Pipe{path1, path2}
	for len(paths) < openLostRetries+1 {
		pc := groupBase(4)
		qa, qb := linktest.NewPipes(t, pc, pc)
		if err := b.AddLink(qb); err != nil {
			t.Fatal(err)
		}
		if err := a.AddLink(qa); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, [2]*link.Pipe{qa, qb})
	}
	for _, p := range paths {
		p[1].SetDelay(time.Hour) // the listener's answers never land
	}
	ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
	defer cancel()
	opened := make(chan error, 1)
	go func() {
		s, err := openStream(ctx, a, 7)
		if s != nil {
			s.Close()
		}
		opened <- err
	}()
	posted := make([]uint64, len(paths))
	for lost := range len(paths) {
		s, err := b.Accept(ctx)
		if err != nil {
			t.Fatalf("open %d: %v", lost+1, err)
		}
		defer s.Close()
		// The link the open came on: the one whose dialer's end posted.
		on := -1
		for i, p := range paths {
			if n := p[0].Stats().Posted; n > posted[i] {
				posted[i], on = n, i
			}
		}
		if on < 0 {
			t.Fatalf("open %d came on no link", lost+1)
		}
		paths[on][0].Cut(errors.New("test: port down"))
	}
	if err := <-opened; !errors.Is(err, group.ErrOpenLost) {
		t.Errorf("openStream after %d opens lost: %v, want group.ErrOpenLost", len(paths), err)
	}
	if st := b.Stats(); st.Accepted != uint64(len(paths)) {
		t.Errorf("the listener accepted %d streams, want %d", st.Accepted, len(paths))
	}
}
