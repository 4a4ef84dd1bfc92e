package rdmanet

import (
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
)

// movingGroups makes two groups over two pipes each that move their
// streams when a link fails, a the dialer; it returns each path's pipes.
func movingGroups(t testing.TB, streams int) (a, b *group.Mux, path1, path2 [2]*link.Pipe) {
	t.Helper()
	cfg, _ := Config{}.withDefaults()
	gc := groupStreamConfig(cfg)
	gc.MoveTimeout = 10 * time.Second
	ga, gb := gc, gc
	ga.Mover = true
	pc := groupBase(streams)
	p1a, p1b := linktest.NewPipes(t, pc, pc)
	p2a, p2b := linktest.NewPipes(t, pc, pc)
	var err error
	if a, err = group.New(p1a, ga); err != nil {
		t.Fatal(err)
	}
	if b, err = group.New(p1b, gb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	if err := b.AddLink(p2b); err != nil {
		t.Fatal(err)
	}
	if err := a.AddLink(p2a); err != nil {
		t.Fatal(err)
	}
	return a, b, [2]*link.Pipe{p1a, p1b}, [2]*link.Pipe{p2a, p2b}
}

// TestGroupFailover: 100 connections stream both ways over a group's two
// links; the first link fails with bytes in flight on it: cut (an error
// at both ends), or silent (nothing lands, nothing says why, and the
// connections' keepalives find it). Its connections move to the second
// and every byte arrives in order and once (SHA-256 at both ends).
func TestGroupFailover(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(path [2]*link.Pipe)
	}{
		{"cut", func(path [2]*link.Pipe) { path[0].Cut(errors.New("test: port down")) }},
		{"silent", func(path [2]*link.Pipe) { path[0].Silence() }},
	} {
		t.Run(tc.name, func(t *testing.T) { testGroupFailover(t, tc.fail) })
	}
}

func testGroupFailover(t *testing.T, fail func(path [2]*link.Pipe)) {
	goroutineCheck(t)
	const conns, size = 100, 64 << 10
	cfg := Config{KeepAlive: 200 * time.Millisecond}
	a, b, path1, _ := movingGroups(t, conns)
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
	if ls := a.Links(); len(ls) != 2 || ls[0].Streams != conns/2 {
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
	fail(path1)
	wg.Wait()
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		st := m.Stats()
		if st.Moved != conns/2 || st.LinksDown != 1 || st.Links != 1 || st.MovesFailed != 0 {
			t.Errorf("%s: %+v, want %d streams moved off the link that failed", who, st, conns/2)
		}
	}
	for _, p := range pairs {
		if err := errors.Join(p.x.eng.Err(), p.y.eng.Err()); err != nil {
			t.Errorf("connection failed: %v", err)
		}
		closeAndWait(t, p.x)
		closeAndWait(t, p.y)
	}
}
