package rdmanet

import (
	"io"
	"net"
	"testing"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/wire"
)

// The engine's own cost, on the host, over the in-memory link (no device,
// no kernel: what rdmanet's code costs per operation), beside Go's TCP over
// loopback in the same run. make bench puts the table in BENCHMARKS.md:
//
//	go test -run '^$' -bench Host -benchmem -count 5 ./rdmanet/ | go run ./internal/cmd/benchtable

// hostPairs are the connections compared: rdmanet's two protocols over the
// in-memory link (rdmanet's with rings that start small and grow, and with
// fixed rings of Config's size, issue 24's reference), a stream of a link
// group over it (issue 25: the group's framing, credit and pump beside a
// connection of its own), and TCP over loopback.
func hostPairs(b *testing.B) []struct {
	name string
	make func() (net.Conn, net.Conn, func())
} {
	return []struct {
		name string
		make func() (net.Conn, net.Conn, func())
	}{
		{"mem-rdmanet", memHostPair(b, Config{}, hostModes[0].features)},
		{"mem-rdmanet-fixed", memHostPair(b, Config{FixedRings: true}, hostModes[0].features)},
		{"mem-valkey", memHostPair(b, Config{}, 0)},
		{"mem-group-stream", groupHostPair(b)},
		{"tcp-loopback", func() (net.Conn, net.Conn, func()) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				c, _ := ln.Accept()
				accepted <- c
			}()
			a, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			c := <-accepted
			return a, c, func() { a.Close(); c.Close() }
		}},
	}
}

// memHostPair makes a pair over the in-memory link with cfg and features,
// and its stop, for hostPairs.
func memHostPair(b *testing.B, cfg Config, features wire.Features) func() (net.Conn, net.Conn, func()) {
	return func() (net.Conn, net.Conn, func()) {
		a, c, _, _ := memPair(b, cfg, features)
		return a, c, func() { closeAndWait(b, a); closeAndWait(b, c) }
	}
}

// groupHostPair makes pairs of streams in one pair of groups over the
// in-memory link, made at the first pair (as a dialer's streams open in
// the group that exists), for hostPairs.
func groupHostPair(b *testing.B) func() (net.Conn, net.Conn, func()) {
	var x, y *group.Mux
	return func() (net.Conn, net.Conn, func()) {
		if x == nil {
			// Room for BenchmarkHostOpenPair's 100 open pairs and one more.
			cfg, _ := Config{}.withDefaults()
			x, y = groupMuxes(b, groupStreamConfig(cfg), groupBase(128))
		}
		a, c := groupConnPair(b, Config{}, x, y)
		return a, c, func() { closeAndWait(b, a); closeAndWait(b, c) }
	}
}

// BenchmarkHostPingPong64: a 64-byte request and its 64-byte answer.
func BenchmarkHostPingPong64(b *testing.B) {
	for _, p := range hostPairs(b) {
		b.Run(p.name, func(b *testing.B) {
			client, server, stop := p.make()
			defer stop()
			go func() {
				buf := make([]byte, 64)
				for {
					if _, err := io.ReadFull(server, buf); err != nil {
						return
					}
					if _, err := server.Write(buf); err != nil {
						return
					}
				}
			}()
			buf := make([]byte, 64)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := client.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(client, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHostStream64K: 64 KiB writes one way, read as they come.
func BenchmarkHostStream64K(b *testing.B) {
	for _, p := range hostPairs(b) {
		b.Run(p.name, func(b *testing.B) {
			client, server, stop := p.make()
			defer stop()
			const size = 64 << 10
			done := make(chan error, 1)
			go func() {
				_, err := io.CopyN(io.Discard, server, int64(size)*int64(b.N))
				done <- err
			}()
			buf := make([]byte, size)
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := client.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkHostOpenPair: opening a connection pair, one 32-byte round
// trip, and closing a pair, with 100 open. B/op is what a pair allocates on
// the Go heap: both ends, with the in-memory link's rings (20 KiB an end
// as a connection starts; a device's are registered memory instead) and
// the link's own state. TCP's buffers are the kernel's, not counted.
func BenchmarkHostOpenPair(b *testing.B) {
	const open = 100
	for _, p := range hostPairs(b) {
		b.Run(p.name, func(b *testing.B) {
			msg, buf := make([]byte, 32), make([]byte, 32)
			var stops []func()
			defer func() {
				for _, stop := range stops {
					stop()
				}
			}()
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				client, server, stop := p.make()
				stops = append(stops, stop)
				if _, err := client.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(server, buf); err != nil {
					b.Fatal(err)
				}
				if _, err := server.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(client, buf); err != nil {
					b.Fatal(err)
				}
				if len(stops) > open {
					stops[0]()
					stops = stops[1:]
				}
			}
		})
	}
}
