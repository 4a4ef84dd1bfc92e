//go:build linux

package kvserver

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// countingListener counts the connections it accepts, and those that are
// streams of a link group.
type countingListener struct {
	net.Listener
	accepted, streams atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
		if rc, ok := c.(*rdmanet.Conn); ok && rc.Info().Stream != 0 {
			l.streams.Add(1)
		}
	}
	return c, err
}

// poolClient is how a client pool dials: Go's TCP, or rdmanet with its
// defaults (link groups), counting the dials and the group streams.
type poolClient struct {
	name           string
	dial           func(ctx context.Context, addr string) (net.Conn, error)
	dials, streams atomic.Int64
}

func poolClients(env labenv.Env) []*poolClient {
	local := &net.TCPAddr{IP: env.AddrA.AsSlice()}
	tcp := &poolClient{name: "tcp"}
	tcp.dial = func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: local}
		return d.DialContext(ctx, "tcp", addr)
	}
	rdma := &poolClient{name: "rdmanet"}
	rdma.dial = func(ctx context.Context, addr string) (net.Conn, error) {
		d := rdmanet.Dialer{LocalAddr: local}
		c, err := d.DialContext(ctx, "rdma", addr)
		if err == nil && c.(*rdmanet.Conn).Info().Stream != 0 {
			rdma.streams.Add(1)
		}
		return c, err
	}
	return []*poolClient{tcp, rdma}
}

func (p *poolClient) dialCounted(ctx context.Context, addr string) (net.Conn, error) {
	p.dials.Add(1)
	return p.dial(ctx, addr)
}

// TestLabPoolsOverGroups: connection pools that open a connection
// whenever none is idle (go-redis with a pool of 50, net/http's Transport
// with no MaxConnsPerHost) against servers on rdmanet's defaults, where
// every connection is a stream of a link group, opened in one round trip:
// they open about as many connections over RDMA as over Go's TCP in the
// same run (slow dials made net/http open 4x as many before link groups),
// and every one is a stream at both ends.
func TestLabPoolsOverGroups(t *testing.T) {
	env := labenv.RequireRDMA(t)
	t.Run("go-redis", func(t *testing.T) {
		ln := listenCounting(t, env)
		serveKV(t, ln)
		counts := map[string]int64{}
		for _, pc := range poolClients(env) {
			client := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), PoolSize: 50, MinIdleConns: 0,
				Dialer: func(ctx context.Context, _, addr string) (net.Conn, error) { return pc.dialCounted(ctx, addr) }})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			var wg sync.WaitGroup
			// More workers than the pool holds: each pool fills.
			for w := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 8 {
						k := pc.name + strconv.Itoa(w) + ":" + strconv.Itoa(i)
						if err := client.Set(ctx, k, k, time.Minute).Err(); err != nil {
							t.Errorf("%s: %v", pc.name, err)
							return
						}
						if got, err := client.Get(ctx, k).Result(); err != nil || got != k {
							t.Errorf("%s: Get %s = %q, %v", pc.name, k, got, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			cancel()
			client.Close()
			counts[pc.name] = pc.dials.Load()
			checkStreams(t, pc, ln)
		}
		comparePools(t, counts)
	})
	t.Run("net/http", func(t *testing.T) {
		ln := listenCounting(t, env)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, r.URL.Path)
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		counts := map[string]int64{}
		for _, pc := range poolClients(env) {
			tr := &http.Transport{
				DialContext:         func(ctx context.Context, _, addr string) (net.Conn, error) { return pc.dialCounted(ctx, addr) },
				MaxIdleConnsPerHost: 16,
			}
			client := &http.Client{Transport: tr, Timeout: time.Minute}
			var wg sync.WaitGroup
			for w := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 50 {
						path := fmt.Sprintf("/%s/%d/%d", pc.name, w, i)
						resp, err := client.Get("http://" + ln.Addr().String() + path)
						if err != nil {
							t.Errorf("%s: %v", pc.name, err)
							return
						}
						body, err := io.ReadAll(resp.Body)
						resp.Body.Close()
						if err != nil || string(body) != path {
							t.Errorf("%s: GET %s = %q, %v", pc.name, path, body, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			tr.CloseIdleConnections()
			counts[pc.name] = pc.dials.Load()
			checkStreams(t, pc, ln)
		}
		comparePools(t, counts)
	})
}

// listenCounting listens on both transports (rdmanet's "tcp") on the lab's
// server address, counting what it accepts.
func listenCounting(t *testing.T, env labenv.Env) *countingListener {
	t.Helper()
	inner, err := rdmanet.Listen("tcp", netip.AddrPortFrom(env.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: inner}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// checkStreams checks that every rdmanet connection the pool dialed, and
// every one the server accepted since the last check, is a group stream.
func checkStreams(t *testing.T, pc *poolClient, ln *countingListener) {
	t.Helper()
	accepted, streams := ln.accepted.Swap(0), ln.streams.Swap(0)
	if pc.name == "tcp" {
		if streams != 0 {
			t.Errorf("tcp: the server took %d of %d connections for group streams", streams, accepted)
		}
		return
	}
	if pc.streams.Load() != pc.dials.Load() || streams != accepted {
		t.Errorf("rdmanet: %d of %d connections dialed and %d of %d accepted are group streams, want all",
			pc.streams.Load(), pc.dials.Load(), streams, accepted)
	}
}

// comparePools checks that the pool opened about as many connections
// over rdmanet as over Go's TCP: at most twice as many, with a little
// room for the emulated CPU's scheduling (the counts are logged).
func comparePools(t *testing.T, counts map[string]int64) {
	t.Helper()
	t.Logf("connections opened: Go's TCP %d, rdmanet %d", counts["tcp"], counts["rdmanet"])
	if counts["tcp"] == 0 || counts["rdmanet"] > 2*counts["tcp"]+4 {
		t.Errorf("rdmanet opened %d connections where Go's TCP opened %d", counts["rdmanet"], counts["tcp"])
	}
}
