package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// The external tools: perftest's ib_write_bw and ib_send_lat, and rdma-core's
// rstream (rsockets, or kernel TCP with -T s). Each run starts the tool's
// server on address B, then its client on A, and parses the client's output.

// toolRun is what one server/client run of a tool produced.
type toolRun struct {
	client, server []string // command lines
	clientOut      string
	serverOut      string
	wall           time.Duration // the successful client's run time, start to exit
}

// commandLines are the run's commands, for the report.
func (r toolRun) commandLines() string {
	return "`" + strings.Join(r.server, " ") + "` then `" + strings.Join(r.client, " ") + "`"
}

// raw is both outputs, for a report that cannot parse them.
func (r toolRun) raw() string {
	return "$ " + strings.Join(r.client, " ") + "\n" + r.clientOut +
		"$ " + strings.Join(r.server, " ") + " (server)\n" + r.serverOut
}

const (
	// serverStart is how long the server gets to listen before the first
	// client starts; a client that fails is retried while the server runs.
	serverStart   = 300 * time.Millisecond
	clientRetries = 10
	retryPause    = 500 * time.Millisecond
	// serverExit is how long the server may take to exit after its client.
	serverExit = 10 * time.Second
)

// serverClient runs server, then client against it, within ctx. It returns
// the outputs, and an error if the client did not succeed (the outputs are
// then in the toolRun for the report). A server still running after its
// client is killed; that alone is not an error.
func serverClient(ctx context.Context, server, client []string) (toolRun, error) {
	run := toolRun{client: client, server: server}
	var srvOut bytes.Buffer
	srv := exec.CommandContext(ctx, server[0], server[1:]...)
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	srv.WaitDelay = time.Second
	if err := srv.Start(); err != nil {
		return run, err
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Wait() }()
	stopServer := func() error {
		select {
		case err := <-srvDone:
			return err
		case <-time.After(serverExit):
			srv.Process.Kill()
			<-srvDone
			return fmt.Errorf("server still running %v after its client; killed", serverExit)
		}
	}

	var cliErr error
	select {
	case <-time.After(serverStart):
	case <-ctx.Done():
	}
	for attempt := 1; ; attempt++ {
		var out bytes.Buffer
		cli := exec.CommandContext(ctx, client[0], client[1:]...)
		cli.Stdout, cli.Stderr = &out, &out
		cli.WaitDelay = time.Second
		start := time.Now()
		cliErr = cli.Run()
		run.wall = time.Since(start)
		run.clientOut = out.String()
		if cliErr == nil || ctx.Err() != nil || attempt == clientRetries {
			break
		}
		select {
		case err := <-srvDone: // the server gave up: retrying cannot help
			srvDone <- err
		case <-time.After(retryPause):
			continue
		}
		break
	}
	if cliErr != nil {
		srv.Process.Kill()
	}
	srvErr := stopServer()
	run.serverOut = srvOut.String()
	switch {
	case ctx.Err() != nil:
		return run, fmt.Errorf("timed out (%w)", context.Cause(ctx))
	case cliErr != nil:
		return run, fmt.Errorf("client: %v", cliErr)
	}
	if srvErr != nil {
		var ee *exec.ExitError
		if !errors.As(srvErr, &ee) {
			run.serverOut += "\n(labbench: " + srvErr.Error() + ")\n"
		}
	}
	return run, nil
}

// ---- perftest ---------------------------------------------------------------

// perftestTable finds perftest's result table in out (a header line with
// "#bytes", then a line of numbers) and returns it as column -> value. Header
// names may span several words ("BW average[MB/sec]", "99% percentile[usec]"):
// words are joined until the name has a unit in brackets or starts with '#'.
func perftestTable(out string) (map[string]float64, error) {
	lines := strings.Split(out, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.Contains(lines[i], "#bytes") {
			continue
		}
		var cols []string
		cur := ""
		for _, w := range strings.Fields(lines[i]) {
			if cur != "" {
				cur += " "
			}
			cur += w
			if strings.HasPrefix(cur, "#") || strings.Contains(cur, "[") {
				cols = append(cols, cur)
				cur = ""
			}
		}
		if cur != "" {
			cols = append(cols, cur)
		}
		for _, l := range lines[i+1:] {
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			if len(f) != len(cols) {
				return nil, fmt.Errorf("perftest: %d columns in the header, %d values: %q", len(cols), len(f), strings.TrimSpace(l))
			}
			m := make(map[string]float64, len(cols))
			for j, c := range cols {
				v, err := strconv.ParseFloat(f[j], 64)
				if err != nil {
					return nil, fmt.Errorf("perftest: column %q: %v", c, err)
				}
				m[c] = v
			}
			return m, nil
		}
		return nil, errors.New("perftest: no values after the #bytes header")
	}
	return nil, errors.New("perftest: no result table (#bytes header) in the output")
}

// column finds the column whose name starts with prefix and returns its
// value and the unit in its brackets.
func column(t map[string]float64, prefix string) (v float64, unit string, err error) {
	for name, v := range t {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		if i, j := strings.Index(name, "["), strings.LastIndex(name, "]"); i >= 0 && j > i {
			unit = name[i+1 : j]
		}
		return v, unit, nil
	}
	return 0, "", fmt.Errorf("perftest: no %q column", prefix)
}

// checkSize verifies that the table is for size bytes.
func checkSize(t map[string]float64, size int) error {
	if got, ok := t["#bytes"]; !ok || got != float64(size) {
		return fmt.Errorf("perftest: table for %v bytes, want %d", got, size)
	}
	return nil
}

// parseWriteBW returns ib_write_bw's average bandwidth in MB/s (10^6 bytes).
// perftest's "MB/sec" is 2^20 bytes per second (newer versions say MiB/sec);
// with --report_gbits it reports Gb/sec.
func parseWriteBW(out string, size int) (float64, error) {
	t, err := perftestTable(out)
	if err != nil {
		return 0, err
	}
	if err := checkSize(t, size); err != nil {
		return 0, err
	}
	v, unit, err := column(t, "BW average[")
	if err != nil {
		return 0, err
	}
	switch unit {
	case "MB/sec", "MiB/sec":
		v *= 1 << 20 / 1e6
	case "Gb/sec":
		v *= 1e3 / 8
	default:
		return 0, fmt.Errorf("perftest: unknown bandwidth unit %q", unit)
	}
	if !(v > 0) {
		return 0, fmt.Errorf("perftest: bandwidth %v", v)
	}
	return v, nil
}

// sendLat is ib_send_lat's result as round trips in microseconds. perftest
// reports half a round trip for send latency (it divides each interval
// between two of its sends by 2); these are doubled back.
type sendLat struct {
	typical, p99, avg float64
}

func parseSendLat(out string, size int) (sendLat, error) {
	t, err := perftestTable(out)
	if err != nil {
		return sendLat{}, err
	}
	if err := checkSize(t, size); err != nil {
		return sendLat{}, err
	}
	var r sendLat
	for _, c := range []struct {
		prefix string
		v      *float64
	}{{"t_typical[", &r.typical}, {"t_avg[", &r.avg}, {"99% percentile[", &r.p99}} {
		v, unit, err := column(t, c.prefix)
		if err != nil {
			return sendLat{}, err
		}
		if unit != "usec" {
			return sendLat{}, fmt.Errorf("perftest: %s in %q, want usec", c.prefix, unit)
		}
		if !(v > 0) {
			return sendLat{}, fmt.Errorf("perftest: %s %v", c.prefix, v)
		}
		*c.v = 2 * v
	}
	return r, nil
}

// ---- rstream ----------------------------------------------------------------

// parseRstream returns rstream's "usec/xfer": the elapsed time of its
// exchange divided by the number of transfers, both directions counted.
// The output is a header line ("name bytes xfers iters total time Gb/sec
// usec/xfer") and a line of values.
func parseRstream(out string) (float64, error) {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		h := strings.Fields(l)
		if len(h) == 0 || h[0] != "name" || h[len(h)-1] != "usec/xfer" {
			continue
		}
		for _, l := range lines[i+1:] {
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			if len(f) != len(h) {
				return 0, fmt.Errorf("rstream: %d columns in the header, %d values: %q", len(h), len(f), strings.TrimSpace(l))
			}
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				return 0, fmt.Errorf("rstream: usec/xfer: %v", err)
			}
			if !(v > 0) {
				return 0, fmt.Errorf("rstream: usec/xfer %v", v)
			}
			return v, nil
		}
		return 0, errors.New("rstream: no values after the header")
	}
	return 0, errors.New("rstream: no result header in the output")
}
