package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/rdmanet"
)

// Round trips between two processes (issue 26): the rdmanet rows run both
// ends in labbench's one process, where one Go runtime serves both; users
// and blockstore run a client and a server apart, and on the lab's two
// emulated CPUs every thread that a wake-up runs in either process delays
// the other (docs/lab.md, "A round trip between two processes"). This row
// runs each end in a child labbench of its own, with the default Config
// (a link group's stream, what users get between rdmanet peers), beside
// ib_send_lat -e, which waits on completion events as rdmanet does.

const processesID = "rdmanet-processes"

func (b *bench) processesImpl() impl {
	return impl{id: processesID, label: "rdmanet, client and server in two processes (default Config)", role: roleBaseline,
		pingpong: func(ctx context.Context, size, n int) figure {
			self, err := os.Executable()
			if err != nil {
				return figure{missing: "os.Executable: " + err.Error()}
			}
			addr := net.JoinHostPort(b.env.AddrB.String(), b.port(17400))
			server := []string{self, "-echo-child", fmt.Sprintf("%s %d %d", addr, size, n)}
			client := []string{self, "-ping-child", fmt.Sprintf("%s %s %d %d", b.env.AddrA, addr, size, n)}
			return b.toolFigure(ctx, server, client, parsePingChild)
		}}
}

// childTimeout bounds a child's whole run (the parent's context kills it
// sooner when a measurement's timeout passes).
const childTimeout = 10 * time.Minute

// echoChild is labbench run with -echo-child "ADDR SIZE N": it listens on
// ADDR over RDMA and echoes N round trips (and the warm-up's) of SIZE
// bytes on the first connection that carries them all.
func echoChild(args string) int {
	f, size, n, ok := childRoundTrips(args, 3)
	if !ok {
		fmt.Fprintln(os.Stderr, "labbench: -echo-child wants \"ADDR SIZE N\"")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	lc := rdmanet.ListenConfig{Policy: fallback.RDMAOnly}
	ln, err := lc.Listen(ctx, "tcp", f[0])
	if err != nil {
		fmt.Println("echo child:", err)
		return 1
	}
	defer ln.Close()
	context.AfterFunc(ctx, func() { ln.Close() })
	for {
		c, err := ln.Accept()
		if err != nil {
			fmt.Println("echo child:", err)
			return 1
		}
		c.SetDeadline(time.Now().Add(childTimeout))
		err = benchkit.Echo(c, size, n)
		c.Close()
		if err == nil {
			return 0
		}
		// A client that failed half-way is retried (serverClient).
		fmt.Println("echo child:", err)
	}
}

// pingChild is labbench run with -ping-child "LOCAL ADDR SIZE N": it dials
// ADDR over RDMA from LOCAL and prints the N round trips' figures
// (pingLine).
func pingChild(args string) int {
	f, size, n, ok := childRoundTrips(args, 4)
	var local netip.Addr
	var err error
	if ok {
		local, err = netip.ParseAddr(f[0])
	}
	if !ok || err != nil {
		fmt.Fprintln(os.Stderr, "labbench: -ping-child wants \"LOCAL ADDR SIZE N\"")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	d := rdmanet.Dialer{Policy: fallback.RDMAOnly, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))}
	c, err := d.DialContext(ctx, "tcp", f[1])
	if err != nil {
		fmt.Println("ping child:", err)
		return 1
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(childTimeout))
	transport, _ := rdmanet.TransportOf(c)
	stream := false
	if rc, ok := c.(*rdmanet.Conn); ok {
		stream = rc.Info().Stream != 0
	}
	l, err := benchkit.Ping(c, size, n)
	if err != nil {
		fmt.Println("ping child:", err)
		return 1
	}
	fmt.Println(pingLine(l, transport, stream))
	return 0
}

// childRoundTrips splits a child's arguments, which must be want fields
// ending in "SIZE N", and parses those two.
func childRoundTrips(args string, want int) (f []string, size, n int, ok bool) {
	f = strings.Fields(args)
	if len(f) != want {
		return f, 0, 0, false
	}
	size, errS := strconv.Atoi(f[want-2])
	n, errN := strconv.Atoi(f[want-1])
	return f, size, n, errS == nil && errN == nil
}

// pingLine is what -ping-child prints: the figures in nanoseconds, and
// what carried them.
func pingLine(l benchkit.Latency, transport fallback.Transport, stream bool) string {
	return fmt.Sprintf("round trips: %d p50 %d p99 %d mean %d ns over %s (a group's stream: %v)",
		l.N(), l.Percentile(50).Nanoseconds(), l.Percentile(99).Nanoseconds(), l.Mean().Nanoseconds(), transport, stream)
}

// parsePingChild reads pingLine from a -ping-child's output.
func parsePingChild(r toolRun) (figure, error) {
	for _, line := range strings.Split(r.clientOut, "\n") {
		var n int
		var p50, p99, mean int64
		var transport string
		var stream bool
		if _, err := fmt.Sscanf(line, "round trips: %d p50 %d p99 %d mean %d ns over %s (a group's stream: %t)", &n, &p50, &p99, &mean, &transport, &stream); err != nil {
			continue
		}
		if transport != string(fallback.RDMA) {
			return figure{}, fmt.Errorf("the connection was %s, not RDMA", transport)
		}
		us := func(ns int64) float64 { return float64(ns) / 1e3 }
		f := figure{p50: us(p50), p99: us(p99), mean: us(mean), hasPct: true}
		if !stream {
			f.note = "not a group's stream"
		}
		return f, nil
	}
	return figure{}, fmt.Errorf("no line of round trips in the output")
}
