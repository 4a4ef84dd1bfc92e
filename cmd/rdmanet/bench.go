package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/rdmanet/sdk/fallback"
)

// benchJSON is `rdmanet bench --json`. MB are 10^6 bytes, Gb 10^9 bits.
type benchJSON struct {
	Command string     `json:"command"` // "bench"
	Addr    string     `json:"addr"`
	Policy  policyInfo `json:"policy"`
	connInfo
	Direction string `json:"direction"` // "send" (to the server) or "receive" (-reverse)
	Op        string `json:"op"`        // what ops counts: "write" (send) or "read" (receive)
	OpSize    int    `json:"op_size"`   // -s: bytes per write (the server's, with -reverse)
	// DurationS is -d; Seconds is how long the run took, up to the
	// server's confirmation of what it received when sending.
	DurationS   float64 `json:"duration_s"`
	Seconds     float64 `json:"seconds"`
	Bytes       uint64  `json:"bytes"`
	Ops         uint64  `json:"ops"`
	MBPerS      float64 `json:"mb_per_s"`
	GbPerS      float64 `json:"gb_per_s"`
	OpsPerS     float64 `json:"ops_per_s"`
	ServerBytes *uint64 `json:"server_bytes"` // what the server says it received (send only)
	// Intervals are the progress lines: about one a second.
	Intervals   []intervalJSON `json:"intervals"`
	Interrupted bool           `json:"interrupted"`
	Session     *sessionJSON   `json:"session"` // null unless -resume made one
	Error       string         `json:"error,omitempty"`
	ExitCode    int            `json:"exit_code"`
}

type intervalJSON struct {
	StartS  float64 `json:"start_s"`
	EndS    float64 `json:"end_s"`
	Bytes   uint64  `json:"bytes"`
	Ops     uint64  `json:"ops"`
	MBPerS  float64 `json:"mb_per_s"`
	GbPerS  float64 `json:"gb_per_s"`
	OpsPerS float64 `json:"ops_per_s"`
}

func rates(bytes, ops uint64, d time.Duration) (mbps, gbps, opsps float64) {
	s := d.Seconds()
	if s <= 0 {
		return 0, 0, 0
	}
	return float64(bytes) / 1e6 / s, float64(bytes) * 8 / 1e9 / s, float64(ops) / s
}

func runBench(ctx context.Context, g *globals, fs *flag.FlagSet, args []string) int {
	var df dialFlags
	df.register(fs, "on a stalled write or read")
	duration := fs.Duration("d", 10*time.Second, "`duration` of the stream")
	size := fs.Int("s", 64<<10, "`bytes` per write")
	reverse := fs.Bool("reverse", false, "stream from the server instead of to it")
	requireRDMA := fs.Bool("require-rdma", false, "exit with 3 if the connection is not RDMA")
	pos, code, ok := parse(g, fs, args, 1)
	if !ok {
		return code
	}
	switch {
	case *duration <= 0:
		return usageError(g, fs, "-d %v: want more than 0", *duration)
	case *size < 1 || *size > maxSize:
		return usageError(g, fs, "-s %d: want 1 to %d", *size, maxSize)
	}
	d, network, err := df.dialer()
	if err != nil {
		return usageError(g, fs, "%v", err)
	}
	pol, err := effectivePolicy(df.policy.p)
	if err != nil {
		fmt.Fprintf(g.stderr, "rdmanet bench: %v\n", err)
		return exitUsage
	}
	addr := pos[0]
	out := benchJSON{Command: "bench", Addr: addr, Policy: pol, Direction: "send", Op: "write", OpSize: *size,
		DurationS: duration.Seconds(), Intervals: []intervalJSON{}}
	if *reverse {
		out.Direction, out.Op = "receive", "read"
	}
	finish := func(code int) int {
		out.ExitCode = code
		if g.json {
			writeJSON(g.stdout, out)
		}
		return code
	}

	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		out.Error = err.Error()
		f, code := dialFailed(g, err)
		out.Fallback = f
		return finish(code)
	}
	defer c.Close()
	out.connInfo = connInfoOf(c)
	p := &printer{w: g.stdout}
	if !g.json {
		what := fmt.Sprintf("sending %d-byte writes", *size)
		if *reverse {
			what = fmt.Sprintf("receiving the server's %d-byte writes", *size)
		}
		p.printf("BENCH %s over %s, from %s: %s for %v\n", addr, out.connInfo.human(), out.Local, what, *duration)
		p.printf("%-15s %10s %9s %11s\n", "interval", "MB/s", "Gb/s", out.Op+"s/s")
	}
	stopInterrupt := cancelOnDone(ctx, c)
	defer stopInterrupt()

	r := &benchRun{ctx: ctx, c: c, stopInterrupt: stopInterrupt, out: &out, p: p, human: !g.json, size: *size, timeout: df.timeout}
	var lines *printer
	if !g.json {
		lines = p
	}
	watch := watchSession(c, time.Now(), lines)
	if *reverse {
		err = r.receive(*duration)
	} else {
		err = r.send(*duration)
	}
	out.Session = watch.end()
	out.Interrupted = ctx.Err() != nil
	out.MBPerS, out.GbPerS, out.OpsPerS = rates(out.Bytes, out.Ops, time.Duration(out.Seconds*float64(time.Second)))
	code = exitOK
	if err != nil {
		out.Error = err.Error()
		code = exitFailure
	}
	if code == exitOK && *requireRDMA && out.Transport != fallback.RDMA {
		code = exitNoRDMA
	}
	if !g.json {
		printBenchSummary(p, &out, code, *requireRDMA)
		if out.Error != "" {
			fmt.Fprintf(g.stderr, "rdmanet bench: %s\n", out.Error)
		}
	}
	return finish(code)
}

type benchRun struct {
	ctx           context.Context
	c             net.Conn
	stopInterrupt func() // from cancelOnDone
	out           *benchJSON
	p             *printer
	human         bool
	size          int
	timeout       time.Duration

	start, last  time.Time
	lastB, lastO uint64
}

// tick emits the progress line of the interval that ends at now.
func (r *benchRun) tick(now time.Time) {
	b, o := r.out.Bytes-r.lastB, r.out.Ops-r.lastO
	iv := intervalJSON{StartS: r.last.Sub(r.start).Seconds(), EndS: now.Sub(r.start).Seconds(), Bytes: b, Ops: o}
	iv.MBPerS, iv.GbPerS, iv.OpsPerS = rates(b, o, now.Sub(r.last))
	r.out.Intervals = append(r.out.Intervals, iv)
	if r.human {
		r.p.printf("%-15s %10.2f %9.3f %11.0f\n", fmt.Sprintf("%5.2f-%.2f s", iv.StartS, iv.EndS), iv.MBPerS, iv.GbPerS, iv.OpsPerS)
	}
	r.last, r.lastB, r.lastO = now, r.out.Bytes, r.out.Ops
}

// loop runs op from start until d has passed, the context ends or op
// fails, emitting a progress line each second and one for the last part of
// a second.
func (r *benchRun) loop(start time.Time, d time.Duration, op func() (int, error)) error {
	r.start = start
	r.last = r.start
	end := r.start.Add(d)
	next := r.start.Add(time.Second)
	var err error
	for {
		now := time.Now()
		if !now.Before(end) || r.ctx.Err() != nil {
			break
		}
		var n int
		n, err = op()
		r.out.Bytes += uint64(n)
		if err == nil {
			r.out.Ops++
		}
		now = time.Now()
		if !now.Before(next) {
			r.tick(now)
			for !now.Before(next) {
				next = next.Add(time.Second)
			}
		}
		if err != nil {
			break
		}
	}
	if now := time.Now(); now.Sub(r.last) >= 50*time.Millisecond || len(r.out.Intervals) == 0 {
		r.tick(now)
	}
	if r.ctx.Err() != nil {
		return nil // interrupted: whatever the I/O returned, it was told to stop
	}
	return err
}

// send streams writes to a sink, then half-closes and checks the count the
// server received.
func (r *benchRun) send(d time.Duration) error {
	buf := make([]byte, r.size)
	fillPattern(buf, 0)
	r.c.SetDeadline(time.Now().Add(d + r.timeout))
	if _, err := r.c.Write(encodeHeader(modeSink, r.size)); err != nil {
		return err
	}
	err := r.loop(time.Now(), d, func() (int, error) { return r.c.Write(buf) })
	defer func() { r.out.Seconds = time.Since(r.start).Seconds() }()
	if err != nil {
		return err
	}
	cw, ok := r.c.(interface{ CloseWrite() error })
	if !ok {
		return fmt.Errorf("connection of type %T cannot half-close: the server's count is unknown", r.c)
	}
	wait := r.timeout
	if r.ctx.Err() != nil {
		wait = min(wait, 2*time.Second)
	}
	// The interrupt's deadline is in the past; the count gets a fresh one,
	// which an interrupt being delivered now must not overwrite.
	r.stopInterrupt()
	r.c.SetDeadline(time.Now().Add(wait))
	if err := cw.CloseWrite(); err != nil {
		return fmt.Errorf("half-close: %w", err)
	}
	var b [8]byte
	if _, err := io.ReadFull(r.c, b[:]); err != nil {
		return fmt.Errorf("reading the server's count: %w", err)
	}
	n := binary.BigEndian.Uint64(b[:])
	r.out.ServerBytes = &n
	if n != r.out.Bytes {
		return fmt.Errorf("the server received %d bytes, %d were sent", n, r.out.Bytes)
	}
	return nil
}

// receive reads a source's stream for d.
func (r *benchRun) receive(d time.Duration) error {
	r.c.SetDeadline(time.Now().Add(r.timeout))
	if _, err := r.c.Write(encodeHeader(modeSource, r.size)); err != nil {
		return err
	}
	buf := make([]byte, r.size)
	// Reads end at the run's end: a deadline, not an error. The run starts
	// at the instant the deadline is counted from, so its firing always
	// means the run is over.
	start := time.Now()
	r.c.SetDeadline(start.Add(d))
	err := r.loop(start, d, func() (int, error) { return r.c.Read(buf) })
	r.out.Seconds = time.Since(r.start).Seconds()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = nil
	}
	if err == io.EOF {
		err = errors.New("the server closed the stream")
	}
	return err
}

func printBenchSummary(p *printer, out *benchJSON, code int, requireRDMA bool) {
	p.printf("\n--- %s rdmanet bench statistics (MB = 10^6 bytes) ---\n", out.Addr)
	verb := "sent"
	if out.Direction == "receive" {
		verb = "received"
	}
	p.printf("%s %d bytes (%s) in %.2f s, %d %ss", verb, out.Bytes, iec(out.Bytes), out.Seconds, out.Ops, out.Op)
	if out.ServerBytes != nil {
		p.printf("; the server received %d bytes", *out.ServerBytes)
	}
	if out.Interrupted {
		p.printf("; interrupted")
	}
	p.printf("\n%-15s %10s %9s %11s\n", "", "MB/s", "Gb/s", out.Op+"s/s")
	p.printf("%-15s %10.2f %9.3f %11.0f\n", "total", out.MBPerS, out.GbPerS, out.OpsPerS)
	p.printf("transport: %s\n", out.connInfo.human())
	if out.Fallback != nil {
		var b lineBuffer
		printFallback(&b, "  ", out.Fallback)
		p.printf("%s", b)
	}
	printSessionSummary(p, out.Session)
	if code == exitNoRDMA && requireRDMA {
		p.printf("-require-rdma: the connection is not RDMA (exit %d)\n", exitNoRDMA)
	}
}
