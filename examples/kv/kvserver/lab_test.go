//go:build linux

package kvserver

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestLabGoRedisOverRDMA: go-redis, unchanged but for its Dialer hook,
// against the server on rdmanet.Listen, over each of the lab's RDMA pairs
// (Soft-RoCE, and Soft-iWARP, where rdmanet writes without immediate
// data); and, on Soft-RoCE, a plain TCP client on the same port at the
// same time. iWARP takes TCP's port numbers, so there the server listens
// on network "rdma" and serves no TCP on its port.
func TestLabGoRedisOverRDMA(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, p := range env.Pairs() {
		t.Run(p.Provider, func(t *testing.T) { goRedisOverRDMA(t, p) })
	}
}

func goRedisOverRDMA(t *testing.T, env labenv.Pair) {
	network := "tcp" // both transports on one port
	if env.Provider == labenv.ProviderSIW {
		network = "rdma"
	}
	ln, err := rdmanet.Listen(network, netip.AddrPortFrom(env.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	serveKV(t, ln)

	var mu sync.Mutex
	var transports []fallback.Transport
	var dataPaths []string
	client := redis.NewClient(&redis.Options{
		Addr: ln.Addr().String(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := rdmanet.Dialer{LocalAddr: &net.TCPAddr{IP: env.AddrA.AsSlice()}}
			c, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				tr, _ := rdmanet.TransportOf(c)
				mu.Lock()
				transports = append(transports, tr)
				if rc, ok := c.(*rdmanet.Conn); ok {
					dataPaths = append(dataPaths, rc.Info().DataPath)
				}
				mu.Unlock()
			}
			return c, err
		},
	})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: more than one RDMA window
	if err := client.Set(ctx, "big", big, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := client.Get(ctx, "big").Bytes(); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("Get big: %d bytes, %v; want the 1 MiB value", len(got), err)
	}
	pipe := client.Pipeline()
	for range 1000 {
		pipe.Incr(ctx, "n")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := client.Get(ctx, "n").Int(); err != nil || n != 1000 {
		t.Fatalf("after 1000 pipelined INCR: %d, %v", n, err)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				k := "w" + strconv.Itoa(w) + ":" + strconv.Itoa(i)
				if err := client.Set(ctx, k, k, time.Minute).Err(); err != nil {
					t.Error(err)
					return
				}
				if got, err := client.Get(ctx, k).Result(); err != nil || got != k {
					t.Errorf("Get %s = %q, %v", k, got, err)
					return
				}
			}
		}()
	}
	wg.Wait()

	if network == "tcp" {
		// A TCP client on the same port, at the same time.
		tcp := redis.NewClient(&redis.Options{Addr: ln.Addr().String()})
		defer tcp.Close()
		if got, err := tcp.Get(ctx, "n").Int(); err != nil || got != 1000 {
			t.Errorf("over TCP: GET n = %d, %v", got, err)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	if len(transports) == 0 {
		t.Fatal("go-redis dialed nothing")
	}
	for _, tr := range transports {
		if tr != fallback.RDMA {
			t.Errorf("go-redis connections used %v, want RDMA only", transports)
			break
		}
	}
	want := "write-with-immediate"
	if env.Provider == labenv.ProviderSIW {
		want = "write-and-notice" // iWARP has no immediate data
	}
	if len(dataPaths) != len(transports) {
		t.Errorf("%d of go-redis's %d connections are rdmanet's", len(dataPaths), len(transports))
	}
	for _, dp := range dataPaths {
		if dp != want {
			t.Errorf("go-redis connections' data paths %v, want %s", dataPaths, want)
			break
		}
	}
	t.Logf("go-redis made %d connections, all over RDMA (%s)", len(transports), want)
}

// TestLabGoRedisFailover: go-redis on a resumable session (both sides set
// ResumeTimeout) whose RDMA path dies under a stream of pipelined INCRs.
// After 20 of 100 batches of 1,000, path 1 starts dropping every packet
// (netem on both of its netdevs); the keepalive finds it dead, the dialer
// resumes the session on path 2 (Dialer.FailoverAddrs), and go-redis, on
// one connection it may neither retry on (MaxRetries -1) nor replace
// (PoolSize 1, and one dial), sees only a pause: every batch succeeds with
// the counts it should have, and the key ends at exactly 100000.
func TestLabGoRedisFailover(t *testing.T) {
	env := labenv.RequireRDMA(t)
	paths := env.Paths()
	cfg := rdmanet.Config{KeepAlive: time.Second, ResumeTimeout: 30 * time.Second}
	// Every address, RDMA and TCP: the session resumes on the server's
	// other address.
	lc := rdmanet.ListenConfig{Config: cfg}
	ln, err := lc.Listen(context.Background(), "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).AddrPort().Port()
	serveKV(t, ln)

	var mu sync.Mutex
	var dialed []net.Conn
	client := redis.NewClient(&redis.Options{
		Addr: netip.AddrPortFrom(paths[0].B, port).String(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := rdmanet.Dialer{
				LocalAddr:     &rdmanet.Addr{AddrPort: netip.AddrPortFrom(paths[0].A, 0)},
				Config:        cfg,
				FailoverAddrs: []string{paths[1].B.String()},
				Timeout:       20 * time.Second,
			}
			c, err := d.DialContext(ctx, "rdma", addr)
			if err == nil {
				mu.Lock()
				dialed = append(dialed, c)
				mu.Unlock()
			}
			return c, err
		},
		// One connection, no retries: a command lost in the failover
		// would fail its batch, not be sent again.
		PoolSize:     1,
		MaxRetries:   -1,
		ReadTimeout:  60 * time.Second,
		WriteTimeout: 60 * time.Second,
	})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	const batches, perBatch, breakAfter = 100, 1000, 20
	var broke time.Time
	var breaking sync.WaitGroup
	defer breaking.Wait() // before the test ends, even on a Fatal
	took := make([]time.Duration, batches)
	ended := make([]time.Time, batches)
	failovers := make([]int, batches) // the dialer's, after each batch
	for b := range batches {
		if b == breakAfter {
			// From a goroutine: the batches go on while the path breaks.
			breaking.Add(1)
			go func() {
				defer breaking.Done()
				heal, dead, err := paths[0].Drop()
				if err != nil {
					t.Error(err)
					return
				}
				t.Cleanup(func() { heal() })
				mu.Lock()
				broke = dead
				mu.Unlock()
			}()
		}
		start := time.Now()
		cmds, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for range perBatch {
				p.Incr(ctx, "n")
			}
			return nil
		})
		ended[b] = time.Now()
		took[b] = ended[b].Sub(start)
		if err != nil {
			t.Fatalf("batch %d of %d, after %v: %v", b+1, batches, took[b].Round(time.Millisecond), err)
		}
		// Each INCR's reply is the count so far: nothing lost, nothing
		// applied twice, nothing out of order.
		for i, cmd := range cmds {
			if got, want := cmd.(*redis.IntCmd).Val(), int64(b*perBatch+i+1); got != want {
				t.Fatalf("batch %d, command %d: INCR = %d, want %d", b+1, i+1, got, want)
			}
		}
		mu.Lock()
		if len(dialed) > 0 {
			failovers[b] = dialed[0].(*rdmanet.Conn).Session().Failovers
		}
		mu.Unlock()
	}
	breaking.Wait()
	if n, err := client.Get(ctx, "n").Int(); err != nil || n != batches*perBatch {
		t.Fatalf("after %d INCR: GET n = %d, %v", batches*perBatch, n, err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(dialed) != 1 {
		t.Fatalf("go-redis dialed %d connections, want 1 (the session should have carried it)", len(dialed))
	}
	c := dialed[0].(*rdmanet.Conn)
	st := c.Session()
	tr, why := rdmanet.TransportOf(c)
	t.Logf("session after the run: %+v, on %s; listener: %+v", st, tr, ln.Stats())
	if st.Failovers < 1 {
		t.Errorf("session %+v: want a failover", st)
	}
	if tr != fallback.RDMA || !strings.Contains(st.Path, paths[1].B.String()) {
		t.Errorf("on %s (%v), session %+v; want RDMA over path 2 (%v)", tr, why, st, paths[1].B)
	}
	if b := slices.IndexFunc(failovers, func(n int) bool { return n > 0 }); b >= 0 {
		sorted := slices.Clone(took)
		slices.Sort(sorted)
		t.Logf("batch %d straddled the failover: %v, ending %v after path 1 broke (median batch %v)",
			b+1, took[b].Round(time.Millisecond), ended[b].Sub(broke).Round(time.Millisecond), sorted[len(sorted)/2].Round(time.Millisecond))
	}
}

// serveKV serves a kv server on ln until the test ends, and fails the test
// if Serve returns an error then.
func serveKV(t *testing.T, ln net.Listener) {
	srv := New(Options{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
}
