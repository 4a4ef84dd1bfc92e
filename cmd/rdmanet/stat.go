package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/rdmanet/sdk/internal/lossless"
	"github.com/rdmanet/sdk/internal/portstat"
	"github.com/rdmanet/sdk/verbs"
)

// statSysfsRoot is where stat reads devices; host tests point it at a fake
// tree.
var statSysfsRoot = portstat.SysfsRoot

// statJSON is one line of `rdmanet stat --json`: one object per interval.
type statJSON struct {
	Command string         `json:"command"` // "stat"
	Time    time.Time      `json:"time"`    // the end of the interval
	Ports   []statPortJSON `json:"ports"`
}

type statPortJSON struct {
	Device string `json:"device"`
	Port   int    `json:"port"`
	Netdev string `json:"netdev"` // "" when unknown; its pause and discard statistics are the "ethtool" counters
	portstat.Interval
	// Lacks are the kinds of trouble counter (portstat.Signals) the device
	// has no counter for: "local-ack-timeout", "cnp-sent", "pause", ...
	Lacks []string `json:"lacks"`
	Error string   `json:"error,omitempty"` // reading the port failed
}

type statPort struct {
	dev, netdev string
	port        int
}

func runStat(ctx context.Context, g *globals, fs *flag.FlagSet, args []string) int {
	interval := fs.Duration("i", time.Second, "the `interval` between readings; rates are per second over it")
	count := fs.Int("n", 0, "stop after `N` intervals (0: until interrupted)")
	pos, code, ok := parseRange(g, fs, args, 0, 1)
	if !ok {
		return code
	}
	if *interval <= 0 || *count < 0 {
		return usageError(g, fs, "-i must be positive and -n not negative")
	}
	all, err := portstat.Ports(statSysfsRoot)
	if err != nil || len(all) == 0 {
		fmt.Fprintf(g.stderr, "rdmanet stat: no RDMA devices in %s\n", statSysfsRoot)
		return exitNoRDMA
	}
	netdevs := map[string]string{}
	if links, err := verbs.Links(); err == nil {
		for _, l := range links {
			netdevs[fmt.Sprintf("%s/%d", l.Device, l.Port)] = l.Netdev
		}
	}
	var ports []statPort
	for dev, ps := range all {
		if len(pos) == 1 && dev != pos[0] {
			continue
		}
		for _, p := range ps {
			ports = append(ports, statPort{dev: dev, port: p, netdev: netdevs[fmt.Sprintf("%s/%d", dev, p)]})
		}
	}
	if len(ports) == 0 {
		fmt.Fprintf(g.stderr, "rdmanet stat: no RDMA device %q in %s\n", pos[0], statSysfsRoot)
		return exitNoRDMA
	}
	sort.Slice(ports, func(i, j int) bool {
		if ports[i].dev != ports[j].dev {
			return ports[i].dev < ports[j].dev
		}
		return ports[i].port < ports[j].port
	})

	prev := readStatPorts(ports)
	t := time.NewTicker(*interval)
	defer t.Stop()
	for n := 0; *count == 0 || n < *count; n++ {
		select {
		case <-ctx.Done():
			return exitOK
		case <-t.C:
		}
		cur := readStatPorts(ports)
		out := statJSON{Command: "stat", Time: time.Now(), Ports: []statPortJSON{}}
		for i, p := range ports {
			pj := statPortJSON{Device: p.dev, Port: p.port, Netdev: p.netdev}
			switch {
			case cur[i].err != nil:
				pj.Error = cur[i].err.Error()
			case prev[i].err != nil:
				pj.Error = "no earlier reading: " + prev[i].err.Error()
			default:
				pj.Interval = portstat.Rates(prev[i].r, cur[i].r)
				pj.Lacks = portstat.Lacks(cur[i].r)
			}
			out.Ports = append(out.Ports, pj)
		}
		if g.json {
			writeJSONLine(g.stdout, out)
		} else {
			printStat(g.stdout, &out, n == 0)
		}
		prev = cur
	}
	return exitOK
}

type statReading struct {
	r   portstat.Reading
	err error
}

// readStatPorts reads every port's counters and its netdev's pause and
// discard statistics.
func readStatPorts(ports []statPort) []statReading {
	out := make([]statReading, len(ports))
	for i, p := range ports {
		r, err := portstat.ReadPort(statSysfsRoot, p.dev, p.port)
		if err == nil && p.netdev != "" {
			c := lossless.ReadCounters(p.netdev)
			for _, s := range append(c.Pause, c.Discards...) {
				r.Counters = append(r.Counters, portstat.Counter{Source: portstat.SourceNetdevHW, Name: s.Name, Value: s.Value})
			}
		}
		out[i] = statReading{r, err}
	}
	return out
}

func printStat(w io.Writer, out *statJSON, first bool) {
	for _, p := range out.Ports {
		fmt.Fprintf(w, "%s  %s port %d, netdev %s", out.Time.Format("15:04:05"), p.Device, p.Port, orDash(p.Netdev))
		if p.Error != "" {
			fmt.Fprintf(w, ": error: %s\n", p.Error)
			continue
		}
		fmt.Fprintf(w, ", over %.2f s\n", p.Seconds)
		fmt.Fprintf(w, "  %-36s %14s %10s %12s\n", "counter", "total", "delta", "per second")
		for _, r := range p.Rates {
			name := r.Name
			if r.Source == portstat.SourceNetdevHW {
				name = "ethtool " + name
			}
			rate := "reset"
			if r.PerSecond != nil {
				rate = fmt.Sprintf("%.1f", *r.PerSecond)
			}
			line := fmt.Sprintf("  %-36s %14d %10d %12s", name, r.Value, r.Delta, rate)
			if r.Meaning != "" && (r.Delta > 0 || r.Reset || first) {
				line += "  " + r.Meaning
			}
			fmt.Fprintln(w, line)
		}
		if len(p.Vanished) > 0 {
			fmt.Fprintf(w, "  vanished: %s\n", strings.Join(p.Vanished, ", "))
		}
		if first && len(p.Lacks) > 0 {
			fmt.Fprintf(w, "  %s has no counter for: %s\n", p.Device, strings.Join(p.Lacks, ", "))
		}
	}
	fmt.Fprintln(w)
}
