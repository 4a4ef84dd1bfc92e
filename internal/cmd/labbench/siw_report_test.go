package main

import (
	"io"
	"strings"
	"testing"
)

// The siw rows go in their own section, with rdmanet's ratios to perftest
// on siw, and leave the rxe tables and targets as they were.
func TestReportSIW(t *testing.T) {
	md := fakeReport(func(res map[key]figure) {
		res[key{"siw/rdmanet/rdmanet", stream, 64 << 10}] = figure{mbps: 5}
		res[key{"siw/rdmanet/rdmanet", pingpong, 64}] = figure{p50: 150, p99: 300, mean: 160, hasPct: true}
		res[key{"siw/perftest", stream, 1 << 20}] = figure{missing: "Failed to modify QP to RTS"}
	}).markdown()
	rxe, siw, ok := strings.Cut(md, "## On Soft-iWARP (siw)\n")
	if !ok {
		t.Fatalf("no siw section in\n%s", md)
	}
	if strings.Contains(rxe, "on siw") {
		t.Errorf("siw rows before the siw section:\n%s", rxe)
	}
	if strings.Contains(siw, "valkey") && !strings.Contains(siw, "the valkey mode is not here") || strings.Contains(siw, "| valkey |") {
		t.Errorf("a valkey row on siw, where rdmanet refuses Valkey's protocol:\n%s", siw)
	}
	for _, want := range []string{
		"| rdmanet (rdmanet) on siw | 10.0 MB/s (0.0800 Gb/s) | 10.0 MB/s (0.0800 Gb/s) | 5.00 MB/s (0.0400 Gb/s) | 10.0 MB/s (0.0800 Gb/s) |",
		"| perftest (ib_write_bw -R) on siw | 10.0 MB/s (0.0800 Gb/s) | 10.0 MB/s (0.0800 Gb/s) | 10.0 MB/s (0.0800 Gb/s) | **missing** |",
		"| rdmanet (rdmanet) on siw | 150 µs | 300 µs | 160 µs | 100 µs | 200 µs | 110 µs |",
		"| perftest (ib_send_lat -R) on siw | 100 µs | 200 µs | 110 µs |",
		"| rdmanet | 1.00 | 1.00 | 0.50 | – | 1.50 | 1.00 |",
		"| busy-poll 1 ms | 1.00 | 1.00 | 1.00 | – | 1.00 | 1.00 |",
		"- **missing**: stream 1 MiB, perftest (ib_write_bw -R) on siw: Failed to modify QP to RTS",
	} {
		if !strings.Contains(siw, want) {
			t.Errorf("no %q in the siw section:\n%s", want, siw)
		}
	}
	checkTables(t, md)
}

// -only siw runs the siw section alone: no rxe tables or targets.
func TestOnlySIW(t *testing.T) {
	b := newBench(noEnv, options{scale: 1, rounds: 1}, io.Discard)
	if err := b.only([]string{"siw", "siw/perftest"}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, im := range b.impls {
		ids = append(ids, im.id)
	}
	if got, want := strings.Join(ids, ","), "siw/rdmanet/rdmanet,siw/rdmanet/busy-poll 1 ms,siw/perftest"; got != want {
		t.Errorf("-only siw kept %s, want %s", got, want)
	}
	if b.withFailover || b.withStorage {
		t.Error("-only siw kept the failover or storage section")
	}
	r := fakeReport(nil)
	r.impls = b.impls
	md := r.markdown()
	for _, absent := range []string{"## Targets", "## Stream throughput", "## Round trips", "Every client is on"} {
		if strings.Contains(md, absent) {
			t.Errorf("%q in a siw-only report:\n%s", absent, md)
		}
	}
	if !strings.Contains(md, "## On Soft-iWARP (siw)") || !strings.HasSuffix(md, endMarker+"\n") {
		t.Errorf("no siw section or no end marker:\n%s", md)
	}
	checkTables(t, md)
}
