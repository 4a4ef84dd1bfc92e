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
	"testing"
	"time"

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
	leakcheck.Check(t)
	paths := env.Paths()
	cfg := rdmanet.WithGroups(rdmanet.Config{})
	lc := rdmanet.ListenConfig{Config: cfg}
	// Every address: the group's second link comes to the server's
	// address on path 2.
	ln, err := lc.Listen(context.Background(), "rdma", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := netip.MustParseAddrPort(ln.Addr().String()).Port()
	d := rdmanet.Dialer{
		LocalAddr:     &rdmanet.Addr{AddrPort: netip.AddrPortFrom(paths[0].A, 0)},
		Config:        cfg,
		Timeout:       20 * time.Second,
		FailoverAddrs: []string{paths[1].B.String()},
	}
	if *groupOnePath {
		d.FailoverAddrs = nil
	}
	n, size := *groupStreams, *groupKiB<<10
	guard := time.AfterFunc(hangGuard, func() { ln.Close() })
	defer guard.Stop()

	// The first dial makes the group; its second link follows.
	clients, servers := make([]net.Conn, n), make([]net.Conn, n)
	dialed := time.Now()
	var wg sync.WaitGroup
	accepted := make(chan error, 1)
	go func() {
		for i := range n {
			c, err := ln.Accept()
			if err != nil {
				accepted <- err
				return
			}
			servers[i] = c
		}
		accepted <- nil
	}()
	dst := netip.AddrPortFrom(paths[0].B, port).String()
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
			clients[i] = c
		}()
	}
	wg.Wait()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d streams open in %v", n, time.Since(dialed).Round(time.Millisecond))
	// Accepts come in any order: pair each client with its server.
	byPeer := map[string]net.Conn{}
	for _, c := range servers {
		byPeer[c.RemoteAddr().String()] = c
	}
	for i, c := range clients {
		if servers[i] = byPeer[c.LocalAddr().String()]; servers[i] == nil {
			t.Fatalf("no server end for %v", c.LocalAddr())
		}
	}
	// The streams opened before the second link joined spread onto it.
	g := waitGroup(t, "two links", func(g rdmanet.GroupInfo) bool { return *groupOnePath || spread(g, n) })
	t.Logf("group: %+v", g)
	if qps := verbs.Resources().QPs; qps != 4 {
		t.Errorf("%d queue pairs, want the group's 4 (a link on each path, at each end)", qps)
	}
	for i, c := range clients {
		if !rdmanet.GroupStream(c.(*rdmanet.Conn)) || !rdmanet.GroupStream(servers[i].(*rdmanet.Conn)) {
			t.Fatalf("connection %d is not a group's stream", i)
		}
	}

	// Every stream carries size bytes each way: a quarter of them, then,
	// once every stream wrote its quarter, path 1 drops everything and the
	// writers go on (1,000 streams writing at once over TCG overwhelm
	// rxe; this keeps bytes in flight at the drop and after it).
	var done sync.WaitGroup
	wrote := make(chan struct{}, 2*n)
	gate := make(chan struct{})
	sums := make([][2][32]byte, 2*n)
	for i := range n {
		for dir, ends := range [][2]net.Conn{{clients[i], servers[i]}, {servers[i], clients[i]}} {
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
	if !*groupNoDrop {
		paths[0].DropAll(t)
	}
	broke := time.Now()
	close(gate)
	done.Wait()
	t.Logf("every stream done %v after path 1 dropped", time.Since(broke).Round(time.Millisecond))
	for k := range sums {
		if sums[k][0] != sums[k][1] {
			t.Errorf("stream %d direction %d: SHA-256 differs", k/2, k%2)
		}
	}
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
	// The streams that moved back work.
	for i := range n {
		msg := []byte{byte(i), 9}
		clients[i].SetDeadline(time.Now().Add(hangGuard))
		servers[i].SetDeadline(time.Now().Add(hangGuard))
		if _, err := clients[i].Write(msg); err != nil {
			t.Fatalf("stream %d after the failback: %v", i, err)
		}
		got := make([]byte, 2)
		if _, err := io.ReadFull(servers[i], got); err != nil || string(got) != string(msg) {
			t.Fatalf("stream %d after the failback: read %x, %v", i, got, err)
		}
	}
	for i := range n {
		clients[i].Close()
		servers[i].Close()
	}
}

// spread reports whether g has two links, each with half the n streams.
func spread(g rdmanet.GroupInfo, n int) bool {
	return len(g.Links) == 2 && g.Links[0].Streams >= n/2 && g.Links[1].Streams >= n/2 && g.Suspended == 0
}

// waitGroup waits for the dialer's group to satisfy ok, and returns it.
func waitGroup(t *testing.T, what string, ok func(rdmanet.GroupInfo) bool) rdmanet.GroupInfo {
	t.Helper()
	var last []rdmanet.GroupInfo
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		last = rdmanet.Groups()
		for _, g := range last {
			if g.Side == "dialed" && ok(g) {
				return g
			}
		}
	}
	t.Fatalf("no dialed group with %s: %+v", what, last)
	return rdmanet.GroupInfo{}
}
