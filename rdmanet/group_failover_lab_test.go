package rdmanet_test

import (
	"context"
	"crypto/sha256"
	"flag"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/leakcheck"
	"github.com/rdmanet/sdk/rdmanet"
	"github.com/rdmanet/sdk/verbs"
)

var (
	groupStreams = flag.Int("group.streams", 1000, "TestLabGroupFailover: streams in the group")
	groupKiB     = flag.Int("group.kib", 4, "TestLabGroupFailover: KiB each stream carries each way")
	groupOnePath = flag.Bool("group.onepath", false, "TestLabGroupFailover: no failover address (with -group.nodrop)")
	groupNoDrop  = flag.Bool("group.nodrop", false, "TestLabGroupFailover: stream without dropping path 1 (to tell its faults from the streams')")
)

// TestLabGroupFailover: a group between the lab's hosts has a link on
// each rxe path, and its 1,000 streams spread over both (those opened
// before the second link joined move onto it). Path 1 drops everything
// while every stream carries bytes both ways: the streams on it move to
// path 2, and every byte arrives once (SHA-256 at both ends). Once path 1
// heals, the group makes its link there again and half the streams move
// back, and work. scripts/lab-test runs it without the race detector (in
// the VM of the 256 MiB session failovers): under it and the lab's
// emulated CPU, 1,000 streams stall rxe for longer than the keepalive
// allows; the host's TestGroupFailover runs the group's moves with it.
func TestLabGroupFailover(t *testing.T) {
	env := labenv.RequireRDMA(t)
	checkLeaks(t)
	paths := env.Paths()
	gl := openGroupLab(t, env, *groupStreams, !*groupOnePath, rdmanet.Config{})
	n := *groupStreams
	g := waitGroup(t, "two links", func(g rdmanet.GroupInfo) bool { return *groupOnePath || spread(g, n) })
	t.Logf("group: %+v", g)
	if qps := verbs.Resources().QPs; qps != 4 && !*groupOnePath {
		t.Errorf("%d queue pairs, want the group's 4 (a link on each path, at each end)", qps)
	}
	gl.streamThrough(t, *groupKiB<<10, func() {
		if !*groupNoDrop {
			paths[0].DropAll(t)
		}
	})
	if *groupNoDrop {
		return
	}
	before := g.Moved
	// A stream is on its new link once its move is asked, and moved once
	// answered: wait for both.
	g = waitGroup(t, "a link left", func(g rdmanet.GroupInfo) bool {
		return len(g.Links) == 1 && g.Suspended == 0 && g.Moved-before >= uint64(n/2)
	})
	t.Logf("after the drop: %+v", g)
	// Under the race detector the emulated CPU can stall rxe for longer
	// than the keepalive allows: path 2's link may be found dead too, and
	// made again. Its streams move, as the bytes above show.
	if g.LinksDown < 1 || g.MovesFailed != 0 || g.Links[0].Streams != n {
		t.Errorf("group %+v: want its streams moved to path 2, none lost", g)
	}
	if g.LinksDown > 1 {
		t.Logf("%d links failed: path 2's was found dead too, and made again", g.LinksDown)
	}
	movedBefore := g.Moved
	paths[0].Heal(t)
	healed := time.Now()
	g = waitGroup(t, "its link on path 1 again, and half the streams", func(g rdmanet.GroupInfo) bool {
		return spread(g, n) && g.Moved-movedBefore >= uint64(n/2)
	})
	t.Logf("path 1's link back, with half the streams, %v after the heal: %+v", time.Since(healed).Round(time.Millisecond), g)
	gl.echo(t, "after the failback")
}

// TestLabGroupToTCP: both rxe paths drop everything while a group's 100
// streams carry bytes both ways: the group makes one TCP connection to
// the listener's port, every stream moves onto it, and every byte
// arrives once. Once path 1 heals, every stream moves back to RDMA and
// the TCP link is retired. It runs under the race detector.
//
// A KeepAlive of 30 s: the links fail by their queue pairs' retries (a
// group link's ACK timeout, about a second into the loss), with bytes in
// flight. With the default 3 s, make test under load (the race detector
// and two busy loops) once took both paths for dead in a stall ("nothing
// heard from the peer for 9.84s"), moved the streams to TCP and made
// both RDMA links again around the drop: they stayed up, with no stream
// and nothing posted, and the group never had the one TCP link this test
// waits for.
func TestLabGroupToTCP(t *testing.T) {
	env := labenv.RequireRDMA(t)
	checkLeaks(t)
	paths := env.Paths()
	const n = 100
	gl := openGroupLab(t, env, n, true, rdmanet.Config{KeepAlive: 30 * time.Second})
	waitGroup(t, "two links", func(g rdmanet.GroupInfo) bool { return spread(g, n) })
	gl.streamThrough(t, 16<<10, func() {
		paths[0].DropAll(t)
		paths[1].DropAll(t)
	})
	onTCP := func(g rdmanet.GroupInfo) bool {
		return len(g.Links) == 1 && g.Links[0].Transport == "tcp" && g.Links[0].Streams == n && g.Suspended == 0
	}
	g := waitGroup(t, "every stream on one TCP link", onTCP)
	t.Logf("after both paths dropped: %+v", g)
	if g.MovesFailed != 0 {
		t.Errorf("group %+v: streams that found no link", g)
	}
	waitGroupSide(t, "accepted", "every stream on one TCP link", onTCP)
	gl.echo(t, "on TCP")
	paths[0].Heal(t)
	healed := time.Now()
	onRDMA := func(g rdmanet.GroupInfo) bool {
		return len(g.Links) == 1 && g.Links[0].Transport == "rdma" && g.Links[0].Streams == n && g.Suspended == 0
	}
	g = waitGroup(t, "every stream back on RDMA, and no TCP link", onRDMA)
	t.Logf("back on path 1 %v after the heal: %+v", time.Since(healed).Round(time.Millisecond), g)
	waitGroupSide(t, "accepted", "every stream back on RDMA, and no TCP link", onRDMA)
	gl.echo(t, "after the failback")
}

// TestLabGroupLinkAckTimeout: path 1 loses every packet for 5 s while 20
// streams of a group send over both paths, with a KeepAlive (30 s) too
// long to notice. A group's link waits 134 ms for an acknowledgement
// (groupAckTimeout), so its queue pair gives up after its retries, about
// a second into sending into the loss, and the group moves path 1's
// streams to path 2 before the loss ends; with rdma_cm's default (about
// 2.1 s a try, 14.5 s in all in the lab) the link outlived the loss and
// its streams waited for the heal. Every byte arrives once.
func TestLabGroupLinkAckTimeout(t *testing.T) {
	env := labenv.RequireRDMA(t)
	checkLeaks(t)
	paths := env.Paths()
	const n, loss = 20, 5 * time.Second
	gl := openGroupLab(t, env, n, true, rdmanet.Config{KeepAlive: 30 * time.Second})
	g := waitGroup(t, "two links", func(g rdmanet.GroupInfo) bool { return spread(g, n) })
	down := g.LinksDown
	linksDown := func() uint64 {
		for _, g := range rdmanet.Groups() {
			if g.Side == "dialed" {
				return g.LinksDown
			}
		}
		return 0
	}
	var dropped time.Time
	var foundDead atomic.Int64 // after the drop, in ns; 0: not yet
	healed := make(chan error, 1)
	downAtHeal := make(chan uint64, 1)
	gl.streamThrough(t, 1<<20, func() {
		heal, dead, err := paths[0].Drop()
		if err != nil {
			t.Fatal(err)
		}
		dropped = dead
		t.Cleanup(func() { heal() })
		go func() {
			for end := dead.Add(loss); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				if linksDown() != down {
					foundDead.Store(int64(time.Since(dead)))
					break
				}
			}
			time.Sleep(time.Until(dead.Add(loss)))
			downAtHeal <- linksDown()
			healed <- heal()
		}()
	})
	if err := <-healed; err != nil {
		t.Fatal(err)
	}
	t.Logf("path 1's link found dead %v after the drop (0: not within the %v loss); healed %v after it",
		time.Duration(foundDead.Load()).Round(time.Millisecond), loss, time.Since(dropped).Round(time.Millisecond))
	if got := <-downAtHeal; got == down {
		t.Errorf("path 1's link still up after %v of loss, with streams sending on it", loss)
	}
	g = waitGroup(t, "no stream suspended", func(g rdmanet.GroupInfo) bool { return g.Suspended == 0 })
	t.Logf("after the loss: %+v", g)
	if g.MovesFailed != 0 {
		t.Errorf("group %+v: streams that found no link", g)
	}
	gl.echo(t, "after the loss")
}

// checkLeaks is leakcheck.Check for a test whose connections may be
// groups' streams (groups are on by default between rdmanet peers): what
// a group's links hold goes with the group, within
// benchkit.GroupsEndBound, which is longer than leakcheck's 15 s (a loaded
// run's group took 22 s to learn that its peer's had ended).
func checkLeaks(t *testing.T) {
	t.Helper()
	leakcheck.CheckWithin(t, benchkit.GroupsEndBound)
}

// waitGroupsGone waits up to bound for every group of the process to end,
// and fails t if one did not.
func waitGroupsGone(t *testing.T, bound time.Duration) {
	t.Helper()
	start := time.Now()
	for len(rdmanet.Groups()) != 0 && time.Since(start) < bound {
		time.Sleep(20 * time.Millisecond)
	}
	if left := rdmanet.Groups(); len(left) != 0 {
		t.Errorf("%d groups left %v after the streams and the listener closed: %+v", len(left), bound, left)
		return
	}
	t.Logf("every group ended %v after the streams and the listener closed", time.Since(start).Round(time.Millisecond))
}

// groupLab is a group's n streams between the lab's hosts, each client
// paired with the server end it reached.
type groupLab struct {
	clients, servers []net.Conn
}

// openGroupLab listens on every address (the group's second link comes to
// the server's address on path 2), on RDMA and TCP (the group's last
// path), and dials n streams from path 1's
// address, 16 at a time, with path 2 as the failover address if
// twoPaths. Everything is closed when t ends.
func openGroupLab(t *testing.T, env labenv.Env, n int, twoPaths bool, cfg rdmanet.Config) *groupLab {
	t.Helper()
	paths := env.Paths()
	lc := rdmanet.ListenConfig{Config: cfg}
	ln, err := lc.Listen(context.Background(), "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	// Run after the listener's Close and the streams' (cleanups run last
	// registered first): the groups end, at both sides, before leakcheck
	// counts what they held (its 15 s are shorter than the groups' bound).
	t.Cleanup(func() { waitGroupsGone(t, benchkit.GroupsEndBound) })
	t.Cleanup(func() { ln.Close() })
	port := netip.MustParseAddrPort(ln.Addr().String()).Port()
	d := rdmanet.Dialer{
		LocalAddr: &rdmanet.Addr{AddrPort: netip.AddrPortFrom(paths[0].A, 0)},
		Config:    cfg,
		Timeout:   20 * time.Second,
	}
	if twoPaths {
		d.FailoverAddrs = []string{paths[1].B.String()}
	}
	guard := time.AfterFunc(hangGuard, func() { ln.Close() })
	t.Cleanup(func() { guard.Stop() })

	gl := &groupLab{clients: make([]net.Conn, n), servers: make([]net.Conn, n)}
	t.Cleanup(func() {
		for i := range n {
			for _, c := range []net.Conn{gl.clients[i], gl.servers[i]} {
				if c != nil {
					c.Close()
				}
			}
		}
	})
	dialed := time.Now()
	// Accepted streams come in any order, and may include one whose open
	// was lost with its link (the dial opened it again): each client is
	// paired with the server end it reached, by address.
	accepted := make(chan net.Conn, 2*n)
	acceptErr := make(chan error, 1)
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for c := range accepted { // accepted and not paired
			c.Close()
		}
	})
	// The first dial makes the group; its second link follows.
	dst := netip.AddrPortFrom(paths[0].B, port).String()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := d.Dial("rdma", dst)
			if err != nil {
				t.Error(err)
				return
			}
			gl.clients[i] = c
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d streams open in %v", n, time.Since(dialed).Round(time.Millisecond))
	byLocal := map[string]int{}
	for i, c := range gl.clients {
		byLocal[c.LocalAddr().String()] = i
	}
	var lost []net.Conn
	t.Cleanup(func() {
		for _, c := range lost {
			c.Close()
		}
	})
	timeout := time.NewTimer(d.Timeout)
	defer timeout.Stop()
	for paired := 0; paired < n; {
		select {
		case c, ok := <-accepted:
			if !ok {
				t.Fatalf("accepting: %v", <-acceptErr)
			}
			if i, ok := byLocal[c.RemoteAddr().String()]; ok && gl.servers[i] == nil {
				gl.servers[i] = c
				paired++
			} else {
				lost = append(lost, c)
			}
		case <-timeout.C:
			for i, c := range gl.clients {
				if gl.servers[i] == nil {
					t.Errorf("no server end for %v: %+v", c.LocalAddr(), c.(*rdmanet.Conn).Info())
				}
			}
			t.Logf("%d accepted not paired; listener %+v", len(lost), ln.Stats())
			for _, g := range rdmanet.Groups() {
				t.Logf("group %+v", g)
			}
			t.FailNow()
		}
	}
	if len(lost) > 0 {
		t.Logf("%d streams accepted whose open was lost with its link", len(lost))
	}
	for i, c := range gl.clients {
		for _, end := range []*rdmanet.Conn{c.(*rdmanet.Conn), gl.servers[i].(*rdmanet.Conn)} {
			if !rdmanet.GroupStream(end) {
				t.Fatalf("connection %d is not a group's stream: %+v", i, end.Info())
			}
		}
	}
	return gl
}

// streamThrough has every stream carry size bytes each way: a quarter of
// them, then, once every stream wrote its quarter, breakPaths runs and
// the writers go on (1,000 streams writing at once over TCG overwhelm
// rxe; this keeps bytes in flight at the break and after it). Every byte
// must arrive once (SHA-256 at both ends).
func (gl *groupLab) streamThrough(t *testing.T, size int, breakPaths func()) {
	t.Helper()
	n := len(gl.clients)
	var done sync.WaitGroup
	wrote := make(chan struct{}, 2*n)
	gate := make(chan struct{})
	sums := make([][2][32]byte, 2*n)
	for i := range n {
		for dir, ends := range [][2]net.Conn{{gl.clients[i], gl.servers[i]}, {gl.servers[i], gl.clients[i]}} {
			k := 2*i + dir
			done.Add(2)
			go func() {
				defer done.Done()
				rng := rand.New(rand.NewPCG(uint64(k), 1))
				buf := make([]byte, size)
				for j := range buf {
					buf[j] = byte(rng.Uint32())
				}
				sums[k][0] = sha256.Sum256(buf)
				ends[0].SetWriteDeadline(time.Now().Add(hangGuard))
				_, err := ends[0].Write(buf[:size/4])
				wrote <- struct{}{}
				<-gate
				for off := size / 4; off < size && err == nil; off += 4096 {
					_, err = ends[0].Write(buf[off:min(off+4096, size)])
				}
				if err != nil {
					t.Errorf("stream %d direction %d: write: %v", i, dir, err)
				}
			}()
			go func() {
				defer done.Done()
				got := make([]byte, size)
				ends[1].SetReadDeadline(time.Now().Add(hangGuard))
				if n, err := io.ReadFull(ends[1], got); err != nil {
					t.Errorf("stream %d direction %d: read %d bytes: %v", i, dir, n, err)
				}
				sums[k][1] = sha256.Sum256(got)
				if sums[k][1] != sums[k][0] {
					rng := rand.New(rand.NewPCG(uint64(k), 1))
					for j := range got {
						if b := byte(rng.Uint32()); got[j] != b {
							t.Logf("stream %d direction %d: differs from byte %d: %x", i, dir, j, got[j:min(j+8, size)])
							break
						}
					}
				}
			}()
		}
	}
	for range 2 * n {
		<-wrote
	}
	breakPaths()
	broke := time.Now()
	close(gate)
	done.Wait()
	t.Logf("every stream done %v after the break", time.Since(broke).Round(time.Millisecond))
	for k := range sums {
		if sums[k][0] != sums[k][1] {
			t.Errorf("stream %d direction %d: SHA-256 differs", k/2, k%2)
		}
	}
}

// echo checks that every stream carries a message from client to server.
func (gl *groupLab) echo(t *testing.T, when string) {
	t.Helper()
	for i, c := range gl.clients {
		msg := []byte{byte(i), 9}
		c.SetDeadline(time.Now().Add(hangGuard))
		gl.servers[i].SetDeadline(time.Now().Add(hangGuard))
		if _, err := c.Write(msg); err != nil {
			t.Fatalf("stream %d %s: %v", i, when, err)
		}
		got := make([]byte, 2)
		if _, err := io.ReadFull(gl.servers[i], got); err != nil || string(got) != string(msg) {
			t.Fatalf("stream %d %s: read %x, %v", i, when, got, err)
		}
	}
}

// spread reports whether g has two links, each with half the n streams.
func spread(g rdmanet.GroupInfo, n int) bool {
	return len(g.Links) == 2 && g.Links[0].Streams >= n/2 && g.Links[1].Streams >= n/2 && g.Suspended == 0
}

// waitGroup waits for the dialer's group to satisfy ok, and returns it.
func waitGroup(t *testing.T, what string, ok func(rdmanet.GroupInfo) bool) rdmanet.GroupInfo {
	t.Helper()
	return waitGroupSide(t, "dialed", what, ok)
}

// waitGroupSide waits for a group of side to satisfy ok, and returns it.
func waitGroupSide(t *testing.T, side, what string, ok func(rdmanet.GroupInfo) bool) rdmanet.GroupInfo {
	t.Helper()
	var last []rdmanet.GroupInfo
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		last = rdmanet.Groups()
		for _, g := range last {
			if g.Side == side && ok(g) {
				return g
			}
		}
	}
	t.Fatalf("no %s group with %s: %+v", side, what, last)
	return rdmanet.GroupInfo{}
}
