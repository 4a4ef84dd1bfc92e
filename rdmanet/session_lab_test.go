//go:build linux

package rdmanet_test

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/leakcheck"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestLabSessionFailover: a resumable session streams both ways over the
// lab's path 1 while path 1 starts dropping every packet (netem on both of
// its netdevs: the "RDMA path dead" fault that leaves rxe usable, see the
// README's lab faults). Both sides find the path dead by their keepalive,
// the dialer resumes on path 2 (Dialer.FailoverAddrs), and the streams go
// on: every byte arrives once, in order (SHA-256 on both sides).
func TestLabSessionFailover(t *testing.T) {
	env := labenv.RequireRDMA(t)
	paths := env.Paths()
	t.Run("to path 2", func(t *testing.T) {
		failover(t, env, []labenv.Path{paths[0]}, func(t *testing.T, name string, c *rdmanet.Conn) {
			st := c.Session()
			if tr, _ := rdmanet.TransportOf(c); tr != fallback.RDMA || !strings.Contains(st.Path, paths[1].B.String()) {
				t.Errorf("%s: on %s, session %+v; want RDMA over path 2 (%v)", name, tr, st, paths[1].B)
			}
		})
	})
	// Every RDMA path drops everything; TCP between the lab's addresses
	// goes through lo and keeps working.
	t.Run("to TCP", func(t *testing.T) {
		failover(t, env, paths[:], func(t *testing.T, name string, c *rdmanet.Conn) {
			st := c.Session()
			tr, why := rdmanet.TransportOf(c)
			if tr != fallback.TCP || why == nil || !strings.HasPrefix(st.Path, "tcp") {
				t.Errorf("%s: on %s (%v), session %+v; want TCP", name, tr, why, st)
			}
		})
	})
}

// failover streams both ways over a session on path 1, breaks the paths
// given, and checks that every byte arrived, that each side failed over,
// and what check says of where each side ended up.
func failover(t *testing.T, env labenv.Env, broken []labenv.Path, check func(t *testing.T, name string, c *rdmanet.Conn)) {
	leakcheck.Check(t)
	paths := env.Paths()
	cfg := rdmanet.Config{KeepAlive: time.Second, ResumeTimeout: 30 * time.Second}
	lc := rdmanet.ListenConfig{Config: cfg}
	// Every address, RDMA and TCP: the session resumes on the server's
	// other address, or over TCP to the same port.
	ln, err := lc.Listen(context.Background(), "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).AddrPort().Port()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	d := rdmanet.Dialer{
		LocalAddr:     &rdmanet.Addr{AddrPort: netip.AddrPortFrom(paths[0].A, 0)},
		Timeout:       20 * time.Second,
		Config:        cfg,
		FailoverAddrs: []string{paths[1].B.String()},
	}
	client, err := d.Dial("rdma", netip.AddrPortFrom(paths[0].B, port).String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server := <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	defer server.Close()

	const size = 24 << 20
	var wg sync.WaitGroup
	sums := make([][2][32]byte, 2)
	progress := make(chan struct{}, 2)
	for i, ends := range [][2]net.Conn{{client, server}, {server, client}} {
		wg.Add(2)
		go func() {
			defer wg.Done()
			var err error
			if sums[i][0], err = stream(ends[0], size, uint64(i), 256<<10); err != nil {
				t.Errorf("direction %d: write: %v", i, err)
			}
		}()
		go func() {
			defer wg.Done()
			var n int64
			var err error
			first := &countingReader{r: ends[1], at: 1 << 20, reached: progress}
			if sums[i][1], n, err = drain(first, size); err != nil || n != size {
				t.Errorf("direction %d: read %d bytes: %v", i, n, err)
			}
		}()
	}
	// Once both directions flow, the paths break.
	<-progress
	<-progress
	for _, p := range broken {
		for _, dev := range []string{p.NetdevA, p.NetdevB} {
			if out, err := exec.Command("tc", "qdisc", "add", "dev", dev, "root", "netem", "loss", "100%").CombinedOutput(); err != nil {
				t.Fatalf("tc netem on %s: %v\n%s", dev, err, out)
			}
			t.Cleanup(func() { exec.Command("tc", "qdisc", "del", "dev", dev, "root").Run() })
		}
	}
	broke := time.Now()
	wg.Wait()
	t.Logf("streams done %v after path 1 broke", time.Since(broke).Round(time.Millisecond))
	for i := range sums {
		if sums[i][0] != sums[i][1] {
			t.Errorf("direction %d: SHA-256 differs", i)
		}
	}
	for name, c := range map[string]net.Conn{"client": client, "server": server} {
		st := c.(*rdmanet.Conn).Session()
		t.Logf("%s: %+v", name, st)
		if st.Failovers < 1 {
			t.Errorf("%s: session %+v; want a failover", name, st)
		}
		check(t, name, c.(*rdmanet.Conn))
	}
}

// countingReader signals reached once at bytes have been read.
type countingReader struct {
	r       net.Conn
	n, at   int
	reached chan struct{}
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	if c.n < c.at && c.n+n >= c.at {
		c.reached <- struct{}{}
	}
	c.n += n
	return n, err
}
