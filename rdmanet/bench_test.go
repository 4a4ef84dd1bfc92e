package rdmanet_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/internal/labenv"
)

// Benchmarks on the lab's RDMA pair, per rdmanet mode (benchkit.Modes), with
// the measurements `make bench` compares with rsockets, perftest and TCP
// (BENCHMARKS.md). Run them in the lab:
//
//	go build -o bin/rdmanet-lab ./cmd/rdmanet-lab
//	go test -exec $PWD/bin/rdmanet-lab -run '^$' -bench . ./rdmanet/
//
// Under the lab's emulated CPU only ratios between figures of one run mean
// anything.

// benchDeadline bounds a benchmark's connection, so that a stall fails it
// instead of running into the test binary's timeout.
const benchDeadline = 5 * time.Minute

// benchPair connects a client on the lab's address A to a listener on B in
// mode m; the connection closes when b ends.
func benchPair(b *testing.B, env labenv.Env, m benchkit.Mode) (client, server net.Conn) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, server, err := m.Pair(ctx, env.AddrA, env.AddrB)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		client.Close()
		server.Close()
	})
	dl := time.Now().Add(benchDeadline)
	client.SetDeadline(dl)
	server.SetDeadline(dl)
	return client, server
}

// benchName is a sub-benchmark's name: mode/size ("valkey/64KiB").
func benchName(m benchkit.Mode, size int) string {
	return m.Name + "/" + strings.ReplaceAll(benchkit.SizeName(size), " ", "")
}

// BenchmarkStream streams b.N writes of each size from one end of a
// connection to the other, which reads them into a 256 KiB buffer
// (benchkit.Stream).
func BenchmarkStream(b *testing.B) {
	env := labenv.RequireRDMA(b)
	for _, m := range benchkit.Modes {
		for _, size := range benchkit.StreamSizes {
			b.Run(benchName(m, size), func(b *testing.B) {
				client, server := benchPair(b, env, m)
				b.SetBytes(int64(size))
				b.ResetTimer()
				if _, err := benchkit.Stream(client, server, size, int64(b.N)*int64(size)); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// BenchmarkPingPong measures b.N round trips of a message of each size
// echoed by the other end (benchkit.PingPong); ns/op is the mean round trip,
// p50-ns and p99-ns its percentiles.
func BenchmarkPingPong(b *testing.B) {
	env := labenv.RequireRDMA(b)
	for _, m := range benchkit.Modes {
		for _, size := range benchkit.PingPongSizes {
			b.Run(benchName(m, size), func(b *testing.B) {
				client, server := benchPair(b, env, m)
				b.ResetTimer()
				l, err := benchkit.PingPong(client, server, size, b.N)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				b.ReportMetric(float64(l.Percentile(50).Nanoseconds()), "p50-ns")
				b.ReportMetric(float64(l.Percentile(99).Nanoseconds()), "p99-ns")
			})
		}
	}
}
