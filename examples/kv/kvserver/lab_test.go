//go:build linux

package kvserver

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestLabGoRedisOverRDMA: go-redis, unchanged but for its Dialer hook,
// against the server on rdmanet.Listen, over the lab's RDMA pair; and a
// plain TCP client on the same port at the same time.
func TestLabGoRedisOverRDMA(t *testing.T) {
	env := labenv.RequireRDMA(t)
	ln, err := rdmanet.Listen("tcp", netip.AddrPortFrom(env.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := New(Options{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Close()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()

	var mu sync.Mutex
	var transports []fallback.Transport
	client := redis.NewClient(&redis.Options{
		Addr: ln.Addr().String(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := rdmanet.Dialer{LocalAddr: &net.TCPAddr{IP: env.AddrA.AsSlice()}}
			c, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				tr, _ := rdmanet.TransportOf(c)
				mu.Lock()
				transports = append(transports, tr)
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

	// A TCP client on the same port, at the same time.
	tcp := redis.NewClient(&redis.Options{Addr: ln.Addr().String()})
	defer tcp.Close()
	if got, err := tcp.Get(ctx, "n").Int(); err != nil || got != 1000 {
		t.Errorf("over TCP: GET n = %d, %v", got, err)
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
	t.Logf("go-redis made %d connections, all over RDMA", len(transports))
}
