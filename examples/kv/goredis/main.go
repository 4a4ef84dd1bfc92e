// Command goredis shows an unchanged Redis client library, go-redis, on
// rdmanet: its Dialer hook dials with rdmanet.Dialer, which connects over
// RDMA where the server and the path support it and over TCP where not.
//
//	cd examples   # a module of its own
//	go run ./kv/goredis -addr 198.18.0.2:6379
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rdmanet/sdk/rdmanet"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "the kv server's `host:port`")
	flag.Parse()
	if err := run(*addr); err != nil {
		fmt.Fprintln(os.Stderr, "goredis:", err)
		os.Exit(1)
	}
}

func run(addr string) error {
	// The connections go-redis makes, to show what kind they are (it may
	// dial from goroutines of its own).
	var conns struct {
		sync.Mutex
		list []net.Conn
	}
	client := redis.NewClient(&redis.Options{
		Addr: addr,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d rdmanet.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				conns.Lock()
				conns.list = append(conns.list, c)
				conns.Unlock()
			}
			return c, err
		},
	})
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const key = "rdmanet:example"
	if err := client.Set(ctx, key, "hello over "+addr, 0).Err(); err != nil {
		return fmt.Errorf("SET: %w", err)
	}
	v, err := client.Get(ctx, key).Result()
	if err != nil {
		return fmt.Errorf("GET: %w", err)
	}
	fmt.Printf("GET %s = %q\n", key, v)

	conns.Lock()
	defer conns.Unlock()
	for _, c := range conns.list {
		transport, why := rdmanet.TransportOf(c)
		fmt.Printf("connection %v -> %v: %s", c.LocalAddr(), c.RemoteAddr(), transport)
		if why != nil {
			fmt.Printf(" (fell back: %v)", why)
		}
		fmt.Println()
	}
	return nil
}
