package main

import (
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	in := `goos: linux
BenchmarkHostPipeRoundTrip64-2   	   50000	     21000 ns/op	       0 B/op	       0 allocs/op
BenchmarkHostPipeRoundTrip64-2   	   50000	     25000 ns/op	       0 B/op	       0 allocs/op
BenchmarkHostPipeRoundTrip64-2   	   50000	     20000 ns/op	       0 B/op	       0 allocs/op
BenchmarkHostTCPStream64K-2      	    1000	     50123 ns/op	1307.50 MB/s	      12 B/op	       1 allocs/op
PASS
ok  	github.com/rdmanet/sdk/rdmanet	3.2s
`
	var out strings.Builder
	if err := run(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	want := `| benchmark | runs | ns/op | B/op | allocs/op | MB/s |
|---|---:|---:|---:|---:|---:|
| HostPipeRoundTrip64 | 3 | 21000 | 0 | 0 |  |
| HostTCPStream64K | 1 | 50123 | 12 | 1 | 1308 |
`
	if got := out.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestMedianEven(t *testing.T) {
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median = %v, want 2.5", m)
	}
}

func TestNoResults(t *testing.T) {
	var out strings.Builder
	if err := run(strings.NewReader("PASS\n"), &out); err == nil {
		t.Error("no error for input without benchmarks")
	}
}
