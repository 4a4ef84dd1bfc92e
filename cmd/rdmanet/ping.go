package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/rdmanet/sdk/fallback"
)

// pingJSON is `rdmanet ping --json`.
type pingJSON struct {
	Command string     `json:"command"` // "ping"
	Addr    string     `json:"addr"`
	Policy  policyInfo `json:"policy"`
	connInfo
	Size        int          `json:"size"`  // bytes per message
	Count       int          `json:"count"` // -c, 0: until interrupted
	IntervalMS  float64      `json:"interval_ms"`
	Sent        int          `json:"sent"`
	Received    int          `json:"received"`
	Samples     []pingSample `json:"samples"`
	RTT         *rttJSON     `json:"rtt_ms"` // null without replies
	Seconds     float64      `json:"seconds"`
	Interrupted bool         `json:"interrupted"` // stopped by SIGINT or SIGTERM
	Session     *sessionJSON `json:"session"`     // null unless -resume made one
	Error       string       `json:"error,omitempty"`
	ExitCode    int          `json:"exit_code"`
}

type pingSample struct {
	Seq    int     `json:"seq"`
	Bytes  int     `json:"bytes"`
	TimeMS float64 `json:"time_ms"`
}

type rttJSON struct {
	Min float64 `json:"min"`
	Avg float64 `json:"avg"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func runPing(ctx context.Context, g *globals, fs *flag.FlagSet, args []string) int {
	var df dialFlags
	df.register(fs, "on each round trip")
	count := fs.Int("c", 0, "`count` of round trips (0: until interrupted)")
	size := fs.Int("s", 56, "`bytes` per message")
	interval := fs.Duration("i", time.Second, "`interval` between round trips")
	requireRDMA := fs.Bool("require-rdma", false, "exit with 3 if the connection is not RDMA")
	pos, code, ok := parse(g, fs, args, 1)
	if !ok {
		return code
	}
	switch {
	case *count < 0:
		return usageError(g, fs, "-c %d: want 0 or more", *count)
	case *size < 1 || *size > maxSize:
		return usageError(g, fs, "-s %d: want 1 to %d", *size, maxSize)
	case *interval < 0:
		return usageError(g, fs, "-i %v: want 0 or more", *interval)
	}
	d, network, err := df.dialer()
	if err != nil {
		return usageError(g, fs, "%v", err)
	}
	pol, err := effectivePolicy(df.policy.p)
	if err != nil {
		fmt.Fprintf(g.stderr, "rdmanet ping: %v\n", err)
		return exitUsage
	}
	addr := pos[0]
	out := pingJSON{Command: "ping", Addr: addr, Policy: pol, Size: *size, Count: *count, IntervalMS: ms(*interval), Samples: []pingSample{}}
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
		p.printf("PING %s over %s, from %s: %d data bytes\n", addr, out.connInfo.human(), out.Local, *size)
	}
	stopCancel := cancelOnDone(ctx, c)
	defer stopCancel()

	start := time.Now()
	var lines *printer
	if !g.json {
		lines = p
	}
	watch := watchSession(c, start, lines)
	msg := make([]byte, *size)
	reply := make([]byte, *size)
	c.SetDeadline(time.Now().Add(df.timeout))
	_, err = c.Write(encodeHeader(modePing, *size))
	for seq := 1; err == nil && (*count == 0 || seq <= *count); seq++ {
		if seq > 1 && *interval > 0 {
			t := time.NewTimer(*interval)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		if ctx.Err() != nil {
			break
		}
		fillPattern(msg, uint64(seq))
		if len(msg) >= 8 {
			binary.BigEndian.PutUint64(msg, uint64(seq))
		}
		c.SetDeadline(time.Now().Add(df.timeout))
		if ctx.Err() != nil { // the cancel's deadline may have been overwritten
			break
		}
		t0 := time.Now()
		out.Sent++
		if _, err = c.Write(msg); err != nil {
			break
		}
		if _, err = io.ReadFull(c, reply); err != nil {
			break
		}
		rtt := time.Since(t0)
		if !bytes.Equal(msg, reply) {
			err = fmt.Errorf("reply %d differs from the message sent", seq)
			break
		}
		out.Received++
		out.Samples = append(out.Samples, pingSample{Seq: seq, Bytes: *size, TimeMS: ms(rtt)})
		if !g.json {
			p.printf("%d bytes from %s: seq=%d time=%.3f ms\n", *size, out.Remote, seq, ms(rtt))
		}
	}
	out.Seconds = time.Since(start).Seconds()
	out.Session = watch.end()
	out.Interrupted = ctx.Err() != nil
	code = exitOK
	if err != nil && !out.Interrupted {
		out.Error = err.Error()
		code = exitFailure
	}
	out.RTT = rttStats(out.Samples)
	if code == exitOK && *requireRDMA && out.Transport != fallback.RDMA {
		code = exitNoRDMA
	}
	if !g.json {
		printPingSummary(p, &out, code, *requireRDMA)
	}
	if out.Error != "" && !g.json {
		fmt.Fprintf(g.stderr, "rdmanet ping: %s\n", out.Error)
	}
	return finish(code)
}

func rttStats(samples []pingSample) *rttJSON {
	if len(samples) == 0 {
		return nil
	}
	t := make([]float64, len(samples))
	sum := 0.0
	for i, s := range samples {
		t[i] = s.TimeMS
		sum += s.TimeMS
	}
	slices.Sort(t)
	return &rttJSON{Min: t[0], Avg: sum / float64(len(t)), P50: percentile(t, 50), P99: percentile(t, 99), Max: t[len(t)-1]}
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []float64, p float64) float64 {
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func printPingSummary(p *printer, out *pingJSON, code int, requireRDMA bool) {
	p.printf("\n--- %s rdmanet ping statistics ---\n", out.Addr)
	p.printf("%d sent, %d received, time %.2f s%s\n", out.Sent, out.Received, out.Seconds, map[bool]string{true: ", interrupted"}[out.Interrupted])
	if r := out.RTT; r != nil {
		p.printf("rtt min/avg/p50/p99/max = %.3f/%.3f/%.3f/%.3f/%.3f ms\n", r.Min, r.Avg, r.P50, r.P99, r.Max)
	}
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
