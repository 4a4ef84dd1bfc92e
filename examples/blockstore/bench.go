package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/rdmanet/sdk/examples/blockstore/nbd"
	"github.com/rdmanet/sdk/examples/blockstore/workload"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
)

// benchCommand is `blockstore bench`: it connects to an export and runs a
// workload on it through one nbd.Client.
func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("blockstore bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:10809", "the server's `host:port`")
	name := fs.String("name", "", "the export's `name`")
	rw := fs.String("rw", "randread", "read, write, randread or randwrite (writes overwrite the export with random data)")
	bsFlag := fs.String("bs", "4k", "block `size` of each request")
	qd := fs.Int("qd", 32, "queue depth: requests in flight at once")
	duration := fs.Duration("duration", 10*time.Second, "how long to run (0: until -bytes)")
	bytesFlag := fs.String("bytes", "", "stop after this many `bytes` (SIZE), if before -duration")
	policyFlag := fs.String("policy", "auto", "transports: auto (RDMA, else TCP), rdma or tcp")
	localFlag := fs.String("local", "", "dial from this local `address` (which picks the RDMA device on a host with several)")
	jsonOut := fs.Bool("json", false, "print the result as one JSON object instead of text")
	noInPlace := fs.Bool("no-in-place", false, "write requests and read replies through buffers of the client's own, not in place in the connection's rings")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	bad := func(err error) int {
		fmt.Fprintf(stderr, "blockstore bench: %v\n%s", err, usage)
		return 2
	}
	local, err := localAddr(*localFlag)
	if err != nil {
		return bad(err)
	}
	if fs.NArg() > 0 {
		return bad(fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	policy, err := fallback.ParsePolicy(*policyFlag)
	if err != nil {
		return bad(err)
	}
	cfg := workload.Config{QueueDepth: *qd, Duration: *duration, Seed: uint64(time.Now().UnixNano())}
	switch *rw {
	case "read":
	case "write":
		cfg.Write = true
	case "randread":
		cfg.Random = true
	case "randwrite":
		cfg.Write, cfg.Random = true, true
	default:
		return bad(fmt.Errorf("-rw %q: want read, write, randread or randwrite", *rw))
	}
	bs, err := parseSize(*bsFlag)
	if err != nil || bs <= 0 || bs > 32<<20 {
		return bad(fmt.Errorf("-bs %q: want a size from 1 byte to 32 MiB", *bsFlag))
	}
	cfg.BlockSize = int(bs)
	if *bytesFlag != "" {
		if cfg.Bytes, err = parseSize(*bytesFlag); err != nil {
			return bad(err)
		}
	}
	if cfg.Duration <= 0 && cfg.Bytes <= 0 {
		return bad(fmt.Errorf("give a -duration or -bytes"))
	}

	d := rdmanet.Dialer{Policy: policy, Timeout: 30 * time.Second, LocalAddr: local}
	nc, err := d.DialContext(ctx, "tcp", *addr)
	if err != nil {
		fmt.Fprintln(stderr, "blockstore bench:", err)
		return 1
	}
	transport, why := rdmanet.TransportOf(nc)
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c, err := nbd.NewClient(hctx, nc, nbd.ClientOptions{ExportName: *name, NoInPlace: *noInPlace})
	cancel()
	if err != nil {
		fmt.Fprintln(stderr, "blockstore bench:", err)
		return 1
	}
	defer c.Close()
	info := c.Info()
	if info.MaxPayload > 0 && uint64(bs) > uint64(info.MaxPayload) {
		fmt.Fprintf(stderr, "blockstore bench: -bs %s is more than the server takes (%s)\n", formatSize(bs), formatSize(int64(info.MaxPayload)))
		return 2
	}
	if !*jsonOut {
		fmt.Fprintf(stdout, "blockstore bench: export of %s at %s over %s", formatSize(c.Size()), *addr, transport)
		if why != nil {
			fmt.Fprintf(stdout, " (fell back: %v)", why)
		}
		fmt.Fprintln(stdout)
	}

	r, err := workload.Run(ctx, c, cfg)
	if *jsonOut {
		res := benchResult{
			Transport: string(transport), RW: *rw, BlockSize: bs, QueueDepth: cfg.QueueDepth,
			Requests: r.Ops, Bytes: r.Bytes, Seconds: r.Elapsed.Seconds(),
			BytesPerSecond: r.BytesPerSecond(), IOPS: r.OpsPerSecond(),
			LatencyNS: benchLatency{Mean: r.Latency.Mean.Nanoseconds(), P50: r.Latency.P50.Nanoseconds(), P99: r.Latency.P99.Nanoseconds(), Max: r.Latency.Max.Nanoseconds()},
		}
		if why != nil {
			res.FellBackBecause = why.Error()
		}
		if err != nil {
			res.Error = err.Error()
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if e := enc.Encode(res); e != nil && err == nil {
			err = e
		}
	} else {
		fmt.Fprintf(stdout, "%s %s, queue depth %d: %d requests in %v: %.1f MiB/s, %.0f IOPS; latency mean %v, p50 %v, p99 %v, max %v\n",
			*rw, formatSize(bs), cfg.QueueDepth, r.Ops, r.Elapsed.Round(time.Millisecond),
			r.BytesPerSecond()/(1<<20), r.OpsPerSecond(),
			round(r.Latency.Mean), round(r.Latency.P50), round(r.Latency.P99), round(r.Latency.Max))
	}
	if err != nil {
		fmt.Fprintln(stderr, "blockstore bench:", err)
		return 1
	}
	return 0
}

// benchResult is what `bench -json` prints: one run's figures, for
// scripts (labbench's storage table reads it).
type benchResult struct {
	Transport       string       `json:"transport"`                   // "rdma" or "tcp"
	FellBackBecause string       `json:"fell_back_because,omitempty"` // why not RDMA, if TCP
	RW              string       `json:"rw"`
	BlockSize       int64        `json:"block_size"`
	QueueDepth      int          `json:"queue_depth"`
	Requests        int64        `json:"requests"` // completed
	Bytes           int64        `json:"bytes"`
	Seconds         float64      `json:"seconds"`
	BytesPerSecond  float64      `json:"bytes_per_second"`
	IOPS            float64      `json:"iops"`
	LatencyNS       benchLatency `json:"latency_ns"`
	Error           string       `json:"error,omitempty"` // the run stopped early; the figures cover what completed
}

type benchLatency struct {
	Mean int64 `json:"mean"`
	P50  int64 `json:"p50"`
	P99  int64 `json:"p99"`
	Max  int64 `json:"max"`
}

// localAddr parses -local: empty for none, else an IP address.
func localAddr(s string) (*net.TCPAddr, error) {
	if s == "" {
		return nil, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return nil, fmt.Errorf("-local %q: want an IP address", s)
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(a, 0)), nil
}

// round keeps three significant digits or so of a latency.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(time.Microsecond)
	case d >= 10*time.Microsecond:
		return d.Round(100 * time.Nanosecond)
	}
	return d
}
