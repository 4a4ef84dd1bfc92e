// Package portstat reads an RDMA port's counters, the ones `rdma statistic`
// shows, from sysfs: the InfiniBand port counters (ports/N/counters) and
// the driver's hardware counters (ports/N/hw_counters). It turns two
// readings into rates, and says what the counters that signal trouble mean
// under each driver's own names.
package portstat

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// SysfsRoot is where the kernel lists RDMA devices.
const SysfsRoot = "/sys/class/infiniband"

// Counter sources.
const (
	SourcePort     = "counters"    // ports/N/counters: the IB port counters
	SourceHW       = "hw_counters" // ports/N/hw_counters: the driver's own
	SourceNetdevHW = "ethtool"     // the netdev's driver statistics (pause, discards)
)

// Counter is one counter's value at a reading.
type Counter struct {
	Source string `json:"source"`
	Name   string `json:"name"`
	Value  uint64 `json:"value"`
}

func (c Counter) key() string { return c.Source + "/" + c.Name }

// Reading is a port's counters at one time.
type Reading struct {
	Time     time.Time
	Counters []Counter // sorted by source, then name
}

// notCounters are files of hw_counters that are settings, not counts.
var notCounters = map[string]bool{"lifespan": true}

// ReadPort reads port's counters of device dev under root (SysfsRoot, or
// a test's fake tree). A file that cannot be read or does not hold a
// number is left out; a port with neither directory is an error.
func ReadPort(root, dev string, port int) (Reading, error) {
	r := Reading{Time: time.Now()}
	dir := filepath.Join(root, dev, "ports", strconv.Itoa(port))
	found := false
	for _, src := range []string{SourcePort, SourceHW} {
		ents, err := os.ReadDir(filepath.Join(dir, src))
		if err != nil {
			continue
		}
		found = true
		for _, e := range ents {
			if e.IsDir() || notCounters[e.Name()] {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, src, e.Name()))
			if err != nil {
				continue
			}
			v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				continue
			}
			r.Counters = append(r.Counters, Counter{Source: src, Name: e.Name(), Value: v})
		}
	}
	if !found {
		return r, fmt.Errorf("portstat: %s port %d: no counters or hw_counters in %s", dev, port, dir)
	}
	return r, nil
}

// Ports lists the devices under root and their ports, as "dev" and port
// numbers.
func Ports(root string) (map[string][]int, error) {
	devs, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	out := map[string][]int{}
	for _, d := range devs {
		ports, err := os.ReadDir(filepath.Join(root, d.Name(), "ports"))
		if err != nil {
			continue
		}
		for _, p := range ports {
			if n, err := strconv.Atoi(p.Name()); err == nil && n > 0 {
				out[d.Name()] = append(out[d.Name()], n)
			}
		}
		sort.Ints(out[d.Name()])
	}
	return out, nil
}

// Rate is one counter over an interval.
type Rate struct {
	Counter
	Delta uint64 `json:"delta"`
	// PerSecond is Delta over the interval; null in JSON when the counter
	// went down (a reset or a wrap), when the interval tells nothing.
	PerSecond *float64 `json:"per_second"`
	Reset     bool     `json:"reset,omitempty"`
	Meaning   string   `json:"meaning,omitempty"` // for counters that signal trouble
}

// Interval is what changed between two readings of a port.
type Interval struct {
	Seconds float64 `json:"seconds"`
	Rates   []Rate  `json:"counters"`
	// Vanished are counters of the first reading missing from the second
	// (a driver reloaded, a port gone).
	Vanished []string `json:"vanished"`
}

// Rates compares two readings of the same port. A counter that went down
// was reset or wrapped: its rate is unknown for this interval and Reset is
// set, rather than a huge or negative rate. A counter new in cur starts
// from zero.
func Rates(prev, cur Reading) Interval {
	secs := cur.Time.Sub(prev.Time).Seconds()
	iv := Interval{Seconds: secs, Rates: []Rate{}, Vanished: []string{}}
	old := make(map[string]uint64, len(prev.Counters))
	for _, c := range prev.Counters {
		old[c.key()] = c.Value
	}
	seen := make(map[string]bool, len(cur.Counters))
	for _, c := range cur.Counters {
		seen[c.key()] = true
		r := Rate{Counter: c, Meaning: Meaning(c.Name)}
		was, ok := old[c.key()]
		switch {
		case ok && c.Value < was:
			r.Reset = true
		case secs > 0:
			if ok {
				r.Delta = c.Value - was
			}
			ps := float64(r.Delta) / secs
			r.PerSecond = &ps
		}
		iv.Rates = append(iv.Rates, r)
	}
	for _, c := range prev.Counters {
		if !seen[c.key()] {
			iv.Vanished = append(iv.Vanished, c.key())
		}
	}
	return iv
}
