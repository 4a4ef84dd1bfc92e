package rdmanet_test

import (
	"io"
	"net"
	"testing"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
)

// The TCP path's cost: a fallen-back connection against a bare
// *net.TCPConn, on loopback, and the cost of deciding to fall back. Run:
//
//	go test -run '^$' -bench 'TCPPath|FallbackDial' -count 5 ./rdmanet/
//
// Issue 4 asks for throughput and latency within 2% of net.TCPConn.

// tcpServer serves loopback TCP with handle until the benchmark ends.
func tcpServer(b *testing.B, handle func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// tcpClients are the two ways to get a client connection to addr.
var tcpClients = []struct {
	name string
	dial func(addr string) (net.Conn, error)
}{
	{"net.TCPConn", func(addr string) (net.Conn, error) { return net.Dial("tcp", addr) }},
	{"rdmanet.TCPConn", func(addr string) (net.Conn, error) {
		d := rdmanet.Dialer{Policy: fallback.TCPOnly}
		return d.Dial("tcp", addr)
	}},
}

func BenchmarkTCPPath(b *testing.B) {
	for _, cl := range tcpClients {
		b.Run(cl.name+"/stream-64KiB", func(b *testing.B) {
			addr := tcpServer(b, func(c net.Conn) { io.Copy(io.Discard, c) })
			c, err := cl.dial(addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			buf := make([]byte, 64<<10)
			b.SetBytes(int64(len(buf)))
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(cl.name+"/pingpong-64B", func(b *testing.B) {
			addr := tcpServer(b, func(c net.Conn) { io.Copy(c, c) })
			c, err := cl.dial(addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			buf := make([]byte, 64)
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFallbackDial is the dial itself: net.Dial, rdmanet with the
// TCP-only policy (no RDMA checks), and rdmanet deciding (Auto: the checks
// of this host and of the route, then TCP).
func BenchmarkFallbackDial(b *testing.B) {
	addr := tcpServer(b, func(c net.Conn) {})
	for _, d := range []struct {
		name string
		dial func() (net.Conn, error)
	}{
		{"net.Dial", func() (net.Conn, error) { return net.Dial("tcp", addr) }},
		{"rdmanet-tcp-only", func() (net.Conn, error) {
			d := rdmanet.Dialer{Policy: fallback.TCPOnly}
			return d.Dial("tcp", addr)
		}},
		{"rdmanet-auto", func() (net.Conn, error) { return rdmanet.Dial("tcp", addr) }},
	} {
		b.Run(d.name, func(b *testing.B) {
			for range b.N {
				c, err := d.dial()
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}
