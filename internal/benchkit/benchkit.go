// Package benchkit holds what rdmanet's benchmarks measure and how, so that
// the Go benchmarks (rdmanet/bench_test.go) and the lab's comparison with
// other tools (internal/cmd/labbench, run by `make bench`) measure the same
// thing the same way: the sizes, the rdmanet modes, how a connected pair is
// made, a stream ([Stream]) and a ping-pong ([PingPong]).
package benchkit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/rdmanet/sdk/rdmanet"
)

// Mode is one of rdmanet's wire modes, as benchmarked: a name for the
// results, the configuration that selects it, and the protocol its
// connections must speak (checked, so that no figure is labelled wrongly).
type Mode struct {
	Name     string
	Config   rdmanet.Config
	Protocol rdmanet.Protocol
}

// Modes are the rdmanet modes every benchmark runs, in order. Adding a mode
// (or a configuration worth comparing) is one line here.
var Modes = []Mode{
	{Name: "valkey", Config: rdmanet.Config{ValkeyCompatible: true}, Protocol: rdmanet.ProtocolValkey},
	{Name: "rdmanet", Config: rdmanet.Config{}, Protocol: rdmanet.ProtocolRdmanet}, // the default between rdmanet peers
	// Issue 24's reference for the default's rings, which start small and
	// grow: rings of the full size from the start.
	{Name: "fixed rings", Config: rdmanet.Config{FixedRings: true}, Protocol: rdmanet.ProtocolRdmanet},
	{Name: "busy-poll 1 ms", Config: rdmanet.Config{BusyPoll: time.Millisecond}, Protocol: rdmanet.ProtocolRdmanet},
	// The reference for the default's adaptive polling (issue 26): a
	// blocked Read or Write that always sleeps, as every one did before.
	{Name: "no polling", Config: rdmanet.Config{BusyPoll: -1}, Protocol: rdmanet.ProtocolRdmanet},
}

// Pair connects a pair in mode m (see RDMAPair) and checks that both ends
// speak m's protocol.
func (m Mode) Pair(ctx context.Context, a, b netip.Addr) (client, server net.Conn, err error) {
	client, server, err = RDMAPair(ctx, a, b, m.Config)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range []net.Conn{client, server} {
		rc, ok := c.(*rdmanet.Conn)
		if !ok || rc.Protocol() != m.Protocol {
			client.Close()
			server.Close()
			if !ok {
				return nil, nil, fmt.Errorf("benchkit: mode %s: connection of type %T", m.Name, c)
			}
			return nil, nil, fmt.Errorf("benchkit: mode %s: connection speaks %q, want %q", m.Name, rc.Protocol(), m.Protocol)
		}
	}
	return client, server, nil
}

// StreamSizes are the write sizes of the stream benchmarks.
var StreamSizes = []int{64, 4 << 10, 64 << 10, 1 << 20}

// PingPongSizes are the message sizes of the ping-pong benchmarks.
var PingPongSizes = []int{64, 4 << 10}

// SizeName is a size as the results show it: "64 B", "4 KiB", "1 MiB".
func SizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// readBuffer is the size of the buffer the reading side of a stream reads
// into, whatever the write size: the same for every transport.
const readBuffer = 256 << 10

// StreamResult is what one stream moved and how long it took.
type StreamResult struct {
	Bytes   int64
	Elapsed time.Duration // from the first Write to the last byte read
}

// MBps is the throughput in megabytes (10^6 bytes) per second.
func (r StreamResult) MBps() float64 { return float64(r.Bytes) / r.Elapsed.Seconds() / 1e6 }

// Gbps is the throughput in gigabits (10^9 bits) per second.
func (r StreamResult) Gbps() float64 { return r.MBps() * 8 / 1e3 }

// Stream writes total bytes to w, in writes of size bytes (the last one
// shorter if total is not a multiple), from a goroutine, while it reads them
// from r into a 256 KiB buffer. It returns once every byte has been read.
//
// If reading fails, Stream returns at once and the writing goroutine may
// still be blocked in Write: the caller ends it by closing the connection.
// Set deadlines to bound a stream that stalls.
func Stream(w io.Writer, r io.Reader, size int, total int64) (StreamResult, error) {
	if size <= 0 || total <= 0 {
		return StreamResult{}, fmt.Errorf("benchkit: stream of %d bytes in writes of %d", total, size)
	}
	msg := make([]byte, size)
	for i := range msg {
		msg[i] = byte(i)
	}
	buf := make([]byte, readBuffer)
	return stream(size, total,
		func(n int) error { _, err := w.Write(msg[:n]); return err },
		func(left int64) (int, error) { return r.Read(buf[:min(int64(len(buf)), left)]) })
}

// stream times total bytes written in writes of up to size bytes (write,
// from a goroutine) and read (read, which may take up to left bytes),
// from the first write to the last byte read: Stream and StreamZeroCopy.
func stream(size int, total int64, write func(n int) error, read func(left int64) (int, error)) (StreamResult, error) {
	wrote := make(chan error, 1)
	start := time.Now()
	go func() {
		for sent := int64(0); sent < total; {
			n := int(min(int64(size), total-sent))
			if err := write(n); err != nil {
				wrote <- fmt.Errorf("write after %d bytes: %w", sent, err)
				return
			}
			sent += int64(n)
		}
		wrote <- nil
	}()
	var got int64
	for got < total {
		n, err := read(total - got)
		got += int64(n)
		if err != nil && got < total {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return StreamResult{Bytes: got}, fmt.Errorf("read after %d of %d bytes: %w", got, total, err)
		}
	}
	elapsed := time.Since(start)
	if err := <-wrote; err != nil {
		return StreamResult{Bytes: got}, err
	}
	return StreamResult{Bytes: got, Elapsed: elapsed}, nil
}

// StreamZeroCopy is Stream with rdmanet's zero-copy calls: each write is
// a write buffer committed whole, and the reader takes a view of what
// arrived, in place (ReadViewUpTo, up to readBuffer bytes), and releases
// it, as a streaming consumer of views would. Neither
// side touches the bytes, as ib_write_bw does not: it measures the
// transport alone.
func StreamZeroCopy(w, r *rdmanet.Conn, size int, total int64) (StreamResult, error) {
	if size <= 0 || total <= 0 {
		return StreamResult{}, fmt.Errorf("benchkit: stream of %d bytes in writes of %d", total, size)
	}
	return stream(size, total,
		func(n int) error {
			if _, err := w.WriteBuffer(n); err != nil {
				return fmt.Errorf("write buffer: %w", err)
			}
			_, err := w.Commit(n)
			return err
		},
		func(left int64) (int, error) {
			v, err := r.ReadViewUpTo(int(min(readBuffer, left)))
			if len(v) > 0 {
				r.ReleaseView(v)
			}
			return len(v), err
		})
}

// StreamFromMemory is Stream with each write sent from memory registered
// once (rdmanet.Memory), read with Read: PostFrom from fromMemories
// Memories in turn, each reused once Idle, as a streaming writer would
// (WriteFrom waits for each write's completion).
func StreamFromMemory(w *rdmanet.Conn, r io.Reader, size int, total int64) (StreamResult, error) {
	if size <= 0 || total <= 0 {
		return StreamResult{}, fmt.Errorf("benchkit: stream of %d bytes in writes of %d", total, size)
	}
	var mems [fromMemories]*rdmanet.Memory
	for i := range mems {
		m, err := rdmanet.NewMemory(size)
		if err != nil {
			return StreamResult{}, err
		}
		defer m.Close(context.Background())
		for j := range m.Bytes() {
			m.Bytes()[j] = byte(j)
		}
		mems[i] = m
	}
	next := 0
	buf := make([]byte, readBuffer)
	return stream(size, total,
		func(n int) error {
			m := mems[next%fromMemories]
			next++
			<-m.Idle()
			_, err := w.PostFrom(m, m.Bytes()[:n])
			return err
		},
		func(left int64) (int, error) { return r.Read(buf[:min(int64(len(buf)), left)]) })
}

// fromMemories is how many Memories StreamFromMemory writes from in turn.
const fromMemories = 4

// warmUp is how many round trips PingPong makes before it measures.
const warmUp = 20

// PingPong measures n round trips: a writes a message of size bytes, b reads
// all of it and writes it back, a reads all of it back. Each sample is the
// time from a's Write to the end of its read. warmUp round trips that are not
// counted come first.
//
// If a round trip fails, PingPong returns the error; the echoing goroutine
// may still be blocked on b until the caller closes the connection.
func PingPong(a, b io.ReadWriter, size, n int) (Latency, error) {
	if err := checkRoundTrips(size, n); err != nil {
		return Latency{}, err
	}
	echoed := make(chan error, 1)
	go func() { echoed <- Echo(b, size, n) }()
	l, err := Ping(a, size, n)
	if err != nil {
		return Latency{}, err
	}
	if err := <-echoed; err != nil {
		return Latency{}, err
	}
	return l, nil
}

// Ping is PingPong's side that writes and measures, for an echo in another
// process (Echo with the same size and n).
func Ping(a io.ReadWriter, size, n int) (Latency, error) {
	if err := checkRoundTrips(size, n); err != nil {
		return Latency{}, err
	}
	msg := make([]byte, size)
	for i := range msg {
		msg[i] = byte(i)
	}
	back := make([]byte, size)
	samples := make([]time.Duration, 0, n)
	for i := range warmUp + n {
		start := time.Now()
		if _, err := a.Write(msg); err != nil {
			return Latency{}, fmt.Errorf("write of round trip %d: %w", i, err)
		}
		if _, err := io.ReadFull(a, back); err != nil {
			return Latency{}, fmt.Errorf("read of round trip %d: %w", i, err)
		}
		if i >= warmUp {
			samples = append(samples, time.Since(start))
		}
	}
	return NewLatency(samples), nil
}

// Echo is PingPong's side that echoes: the warmUp+n round trips of a Ping
// with the same size and n.
func Echo(b io.ReadWriter, size, n int) error {
	if err := checkRoundTrips(size, n); err != nil {
		return err
	}
	buf := make([]byte, size)
	for i := range warmUp + n {
		if _, err := io.ReadFull(b, buf); err != nil {
			return fmt.Errorf("echo: read of round trip %d: %w", i, err)
		}
		if _, err := b.Write(buf); err != nil {
			return fmt.Errorf("echo: write of round trip %d: %w", i, err)
		}
	}
	return nil
}

// checkRoundTrips refuses what Ping and Echo cannot do: a size or a count
// below 1 (an echo child's arguments come from its command line).
func checkRoundTrips(size, n int) error {
	if size <= 0 || n <= 0 {
		return fmt.Errorf("benchkit: %d round trips of %d bytes", n, size)
	}
	return nil
}

// Latency is a set of round-trip times.
type Latency struct {
	sorted []time.Duration
}

// NewLatency returns the Latency of samples (which it sorts in place).
func NewLatency(samples []time.Duration) Latency {
	slices.Sort(samples)
	return Latency{sorted: samples}
}

// N is the number of samples.
func (l Latency) N() int { return len(l.sorted) }

// Percentile returns the p-th percentile (0 < p <= 100) by the nearest-rank
// method (see NearestRank).
func (l Latency) Percentile(p float64) time.Duration { return NearestRank(l.sorted, p) }

// NearestRank returns the p-th percentile (0 < p <= 100) of sorted (in
// ascending order) by the nearest-rank method: the smallest value that at
// least p% of the values do not exceed; the zero value if there is none.
// With fewer than 100 values, the 99th percentile is the largest.
func NearestRank[T cmp.Ordered](sorted []T, p float64) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	// The small allowance keeps 200*0.99 (198.00000000000003) at rank 198.
	rank := int(math.Ceil(float64(len(sorted))*p/100 - 1e-9))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

// Mean is the average sample.
func (l Latency) Mean() time.Duration {
	if len(l.sorted) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range l.sorted {
		sum += d
	}
	return sum / time.Duration(len(l.sorted))
}

// ---- connected pairs ------------------------------------------------------------

// RDMAPair connects an rdmanet client on a to a listener on b (any free
// port) with cfg on both sides, and returns both ends. ctx bounds the set-up.
func RDMAPair(ctx context.Context, a, b netip.Addr, cfg rdmanet.Config) (client, server net.Conn, err error) {
	lc := rdmanet.ListenConfig{Config: cfg}
	ln, err := lc.Listen(ctx, "rdma", netip.AddrPortFrom(b, 0).String())
	if err != nil {
		return nil, nil, err
	}
	d := rdmanet.Dialer{LocalAddr: &rdmanet.Addr{AddrPort: netip.AddrPortFrom(a, 0)}, Config: cfg}
	return pair(ctx, ln, func() (net.Conn, error) {
		return d.DialContext(ctx, "rdma", ln.Addr().String())
	})
}

// TCPPair connects a TCP client (Go's net package) on a to a listener on b
// (any free port) and returns both ends. ctx bounds the set-up.
func TCPPair(ctx context.Context, a, b netip.Addr) (client, server net.Conn, err error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", netip.AddrPortFrom(b, 0).String())
	if err != nil {
		return nil, nil, err
	}
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(a, 0))}
	return pair(ctx, ln, func() (net.Conn, error) {
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	})
}

// pair accepts one connection on ln while dial makes one, then closes ln.
// Accept is not bound by ctx; if the dial fails, closing ln ends it.
func pair(ctx context.Context, ln net.Listener, dial func() (net.Conn, error)) (client, server net.Conn, err error) {
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		ch <- accepted{c, err}
	}()
	client, err = dial()
	if err != nil {
		ln.Close()
		if r := <-ch; r.c != nil {
			r.c.Close()
		}
		return nil, nil, fmt.Errorf("dial: %w", err)
	}
	var r accepted
	select {
	case r = <-ch:
		ln.Close()
	case <-ctx.Done():
		ln.Close()
		go func() { // a connection accepted just now must not stay open
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		r.err = context.Cause(ctx)
	}
	if r.err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("accept: %w", r.err)
	}
	return client, r.c, nil
}
