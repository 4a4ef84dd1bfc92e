// Command benchtable turns `go test -bench` output (standard input) into a
// Markdown table for BENCHMARKS.md: one row per benchmark, each metric the
// median of its runs (-count), with the number of runs. `make bench` uses it
// for the host benchmarks, which run outside the lab:
//
//	go test -run '^$' -bench 'Host' -benchmem -count 5 ./rdmanet/ | benchtable
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

// result is one benchmark's runs: metric unit -> values.
type result struct {
	name    string
	runs    int
	metrics map[string][]float64
	units   []string // in the order first seen
}

func run(in io.Reader, out io.Writer) error {
	results, err := parse(in)
	if err != nil {
		return err
	}
	if len(results) == 0 {
		return fmt.Errorf("no benchmark results in the input")
	}
	write(out, results)
	return nil
}

// parse reads benchmark lines ("BenchmarkX-2  1000  123 ns/op  0 B/op ...")
// and ignores everything else.
func parse(in io.Reader) ([]*result, error) {
	var order []*result
	byName := map[string]*result{}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := strings.TrimPrefix(f[0], "Benchmark")
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i] // the GOMAXPROCS suffix
			}
		}
		r := byName[name]
		if r == nil {
			r = &result{name: name, metrics: map[string][]float64{}}
			byName[name] = r
			order = append(order, r)
		}
		r.runs++
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("benchmark %s: value %q: %v", name, f[i], err)
			}
			unit := f[i+1]
			if _, seen := r.metrics[unit]; !seen {
				r.units = append(r.units, unit)
			}
			r.metrics[unit] = append(r.metrics[unit], v)
		}
	}
	return order, sc.Err()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// write prints the table; the columns are every unit seen, in order.
func write(out io.Writer, results []*result) {
	var units []string
	for _, r := range results {
		for _, u := range r.units {
			if !slices.Contains(units, u) {
				units = append(units, u)
			}
		}
	}
	fmt.Fprintf(out, "| benchmark | runs | %s |\n", strings.Join(units, " | "))
	fmt.Fprintf(out, "|---|---:|%s\n", strings.Repeat("---:|", len(units)))
	for _, r := range results {
		cells := make([]string, len(units))
		for i, u := range units {
			if v, ok := r.metrics[u]; ok {
				cells[i] = format(median(v))
			}
		}
		fmt.Fprintf(out, "| %s | %d | %s |\n", r.name, r.runs, strings.Join(cells, " | "))
	}
}

// format prints a figure of 100 or more as a whole number, a smaller one
// with three significant digits.
func format(v float64) string {
	if v >= 100 || v == float64(int64(v)) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
