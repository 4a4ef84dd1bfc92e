package rdmanet

import (
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
)

// postLog is a group's base link that notes what the mux posts on it:
// each data write's stream (its tag at the peer) and the data in flight,
// retired by the completions the mux polls.
type postLog struct {
	*link.Pipe
	mu       sync.Mutex
	tags     []uint32 // each data write's, in order
	pending  []posted // data writes not retired, oldest first
	inFlight int
	most     int
}

type posted struct {
	id uint64
	n  int
}

func (p *postLog) PostSend(wrs []link.SendWR) error {
	p.mu.Lock()
	for _, wr := range wrs {
		if wr.Kind == link.SendData {
			p.tags = append(p.tags, wr.Tag)
			p.pending = append(p.pending, posted{wr.ID, int(wr.N)})
			p.inFlight += int(wr.N)
			p.most = max(p.most, p.inFlight)
		}
	}
	p.mu.Unlock()
	return p.Pipe.PostSend(wrs)
}

func (p *postLog) Poll(cs []link.Completion) (int, error) {
	n, err := p.Pipe.Poll(cs)
	p.mu.Lock()
	for _, c := range cs[:n] {
		if c.Kind != link.SendDone {
			continue
		}
		for len(p.pending) > 0 && p.pending[0].id <= c.ID {
			p.inFlight -= p.pending[0].n
			p.pending = p.pending[1:]
		}
	}
	p.mu.Unlock()
	return n, err
}

// writesSince is the data writes posted since the first i.
func (p *postLog) writesSince(i int) []uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.tags[i:])
}

func (p *postLog) writes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.tags)
}

// loggedGroups makes two groups with gc over a pipe whose requests land
// (and complete) delay after they were posted, the dialer's base link
// logged.
func loggedGroups(t *testing.T, gc group.Config, streams int, delay time.Duration) (a, b *group.Mux, log *postLog) {
	t.Helper()
	pc := groupBase(streams)
	pa, pb := linktest.NewPipes(t, pc, pc)
	pa.SetDelay(delay)
	log = &postLog{Pipe: pa}
	a, b = groupsOver(t, gc, gc, log, pb)
	return a, b, log
}

// TestGroupLinkInFlight: 8 streams carry data both ways at full speed
// (SHA-256 checked) over one link whose requests complete 2 ms after they
// are posted. With LinkInFlight, the
// data posted and not completed stays within it (and one write more: a
// write goes whole); without it, the same streams put several times as
// much in flight, which shows that the bound is what held it.
func TestGroupLinkInFlight(t *testing.T) {
	goroutineCheck(t)
	const (
		streams = 8
		size    = 2 << 20
		bound   = 256 << 10
		write   = 64 << 10 // a stream's largest write: a quarter of its grown ring
	)
	for _, limit := range []int{bound, 0} {
		cfg, _ := Config{}.withDefaults()
		gc := groupStreamConfig(cfg)
		gc.LinkInFlight = limit
		a, b, log := loggedGroups(t, gc, streams, 2*time.Millisecond)
		clients, servers := make([]*Conn, streams), make([]*Conn, streams)
		for i := range streams {
			clients[i], servers[i] = groupConnPair(t, Config{}, a, b)
		}
		var done []<-chan struct{}
		for i := range streams {
			done = append(done, streamBothWays(t, clients[i], servers[i], size))
		}
		for _, d := range done {
			<-d
		}
		for i := range streams {
			closeAndWait(t, clients[i])
			closeAndWait(t, servers[i])
		}
		log.mu.Lock()
		most := log.most
		log.mu.Unlock()
		switch {
		case limit > 0 && most > limit+write:
			t.Errorf("LinkInFlight %d: %d bytes of data in flight at most, want at most %d", limit, most, limit+write)
		case limit == 0 && most <= bound+write:
			t.Errorf("no LinkInFlight: %d bytes of data in flight at most; the test needs more than %d to show the bound", most, bound+write)
		}
		t.Logf("LinkInFlight %d: %d bytes in flight at most", limit, most)
	}
}

// TestGroupFreshStreamFirst: while 16 streams keep the link's data in
// flight at its bound, a stream that sends less than once a round (it
// writes a byte once two rounds of the others' writes went since its
// last) writes 20 times. Its write is posted before the others' next
// ones: the median of the others' writes posted between its Write and
// its own is at most 2 (a round of the others' is 16).
func TestGroupFreshStreamFirst(t *testing.T) {
	goroutineCheck(t)
	const bulk = 16
	cfg, _ := Config{}.withDefaults()
	gc := groupStreamConfig(cfg)
	gc.LinkInFlight = 256 << 10
	a, b, log := loggedGroups(t, gc, bulk+1, 2*time.Millisecond)
	clients, servers := make([]*Conn, bulk+1), make([]*Conn, bulk+1)
	for i := range clients {
		clients[i], servers[i] = groupConnPair(t, Config{}, a, b)
	}
	defer func() {
		for i := range clients {
			closeAndWait(t, clients[i])
			closeAndWait(t, servers[i])
		}
	}()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range bulk {
		wg.Add(2)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			for {
				select {
				case <-stop:
					clients[i].CloseWrite()
					return
				default:
				}
				if _, err := clients[i].Write(buf); err != nil {
					t.Errorf("bulk stream %d: %v", i, err)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := io.Copy(io.Discard, servers[i]); err != nil {
				t.Errorf("bulk stream %d: read: %v", i, err)
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	// The bulk streams fill the link first.
	for log.writes() < 4*bulk {
		time.Sleep(time.Millisecond)
	}
	small, smallServer := clients[bulk], servers[bulk]
	tag := smallServer.Info().Stream
	var ahead []int
	for range 20 {
		for last := log.writes(); log.writes() < last+2*bulk; {
			time.Sleep(time.Millisecond)
		}
		from := log.writes()
		if _, err := small.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(smallServer, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		since := log.writesSince(from)
		i := slices.Index(since, tag)
		if i < 0 {
			t.Fatalf("the small stream's write (tag %#x) was not posted on the logged link", tag)
		}
		ahead = append(ahead, i)
	}
	slices.Sort(ahead)
	if med := ahead[len(ahead)/2]; med > 2 {
		t.Errorf("the others' writes posted before the small stream's: median %d (all: %v), want at most 2", med, ahead)
	}
	t.Logf("the others' writes posted before the small stream's: %v", ahead)
}
