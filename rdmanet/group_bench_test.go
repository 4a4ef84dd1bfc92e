package rdmanet_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// Link groups (issue 25) beside what they replace, in one run in the lab:
//
//	go test -exec $PWD/bin/rdmanet-lab -run '^$' -bench LabGroup ./rdmanet/
//
// BenchmarkLabGroupDial: one connection opened (dial, accept, one byte
// each way) and closed per op: Go's TCP, rdmanet's connection of its own,
// and a stream of a group that exists. ns/op is the inverse of the rate.
func BenchmarkLabGroupDial(b *testing.B) {
	env := labenv.RequireRDMA(b)
	local := netip.AddrPortFrom(env.AddrA, 0)
	plain := rdmanet.Config{NoLinkGroups: true}
	for _, tc := range []struct {
		name   string
		listen func() (net.Listener, error)
		dial   func(ctx context.Context, addr string) (net.Conn, error)
	}{
		{"tcp", func() (net.Listener, error) { return net.Listen("tcp", netip.AddrPortFrom(env.AddrB, 0).String()) },
			func(ctx context.Context, addr string) (net.Conn, error) {
				d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local)}
				return d.DialContext(ctx, "tcp", addr)
			}},
		{"rdmanet", groupBenchListen(env, plain), groupBenchDial(local, plain)},
		{"group stream", groupBenchListen(env, rdmanet.Config{}), groupBenchDial(local, rdmanet.Config{})},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ln, err := tc.listen()
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						io.CopyN(c, c, 1)
					}()
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), benchDeadline)
			defer cancel()
			one := func() {
				c, err := tc.dial(ctx, ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				buf := []byte{1}
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
			one() // the group's link, the device's first use
			b.ResetTimer()
			for range b.N {
				one()
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "conns/s")
		})
	}
}

// BenchmarkLabGroupPingPong and BenchmarkLabGroupStream: a group's stream
// beside a connection of its own, 64-byte round trips and 64 KiB writes.
func BenchmarkLabGroupPingPong(b *testing.B) {
	env := labenv.RequireRDMA(b)
	for _, m := range groupBenchModes() {
		b.Run(m.Name, func(b *testing.B) {
			client, server := benchPair(b, env, m)
			b.ResetTimer()
			l, err := benchkit.PingPong(client, server, 64, b.N)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(l.Percentile(50).Nanoseconds()), "p50-ns")
		})
	}
}

func BenchmarkLabGroupStream(b *testing.B) {
	env := labenv.RequireRDMA(b)
	for _, m := range groupBenchModes() {
		b.Run(m.Name, func(b *testing.B) {
			client, server := benchPair(b, env, m)
			b.SetBytes(64 << 10)
			b.ResetTimer()
			if _, err := benchkit.Stream(client, server, 64<<10, int64(b.N)<<16); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// groupBenchModes: rdmanet's default, its rings capped at a stream's 64
// KiB (what a stream has), and a group's stream.
func groupBenchModes() []benchkit.Mode {
	return []benchkit.Mode{
		{Name: "rdmanet", Config: rdmanet.Config{NoLinkGroups: true}, Protocol: rdmanet.ProtocolRdmanet},
		{Name: "rdmanet 64KiB rings", Config: rdmanet.Config{RecvBuffer: 64 << 10, SendBuffer: 64 << 10, FixedRings: true}, Protocol: rdmanet.ProtocolRdmanet},
		{Name: "group stream", Config: rdmanet.Config{}, Protocol: rdmanet.ProtocolRdmanet},
	}
}

func groupBenchListen(env labenv.Env, cfg rdmanet.Config) func() (net.Listener, error) {
	return func() (net.Listener, error) {
		lc := rdmanet.ListenConfig{Config: cfg}
		return lc.Listen(context.Background(), "rdma", netip.AddrPortFrom(env.AddrB, 0).String())
	}
}

func groupBenchDial(local netip.AddrPort, cfg rdmanet.Config) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		d := rdmanet.Dialer{LocalAddr: &rdmanet.Addr{AddrPort: local}, Config: cfg, Timeout: 20 * time.Second}
		return d.DialContext(ctx, "rdma", addr)
	}
}
