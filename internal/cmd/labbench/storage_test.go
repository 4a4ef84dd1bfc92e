package main

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// TestParseFio: fio 3.33's JSON reports (made with --lat_percentiles), of
// reads and of writes, and what is wrong with broken ones.
func TestParseFio(t *testing.T) {
	for _, c := range []struct {
		file, rw string
	}{{"testdata/fio-read.json", "read"}, {"testdata/fio-randwrite.json", "randwrite"}} {
		data, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		mbps, mean, p99, err := parseFio(string(data), c.rw)
		if err != nil || !(mbps > 0 && mean > 0 && p99 >= mean/10) {
			t.Errorf("%s: %v MB/s, mean %v µs, p99 %v µs, %v", c.file, mbps, mean, p99, err)
		}
		// The other direction did nothing.
		other := "write"
		if strings.Contains(c.rw, "write") {
			other = "read"
		}
		if _, _, _, err := parseFio(string(data), other); err == nil || !strings.Contains(err.Error(), "no I/O") {
			t.Errorf("%s read as %s: %v", c.file, other, err)
		}
		// Notes before the JSON are skipped.
		if _, _, _, err := parseFio("fio: a note\n"+string(data), c.rw); err != nil {
			t.Errorf("%s after a note: %v", c.file, err)
		}
	}
	for in, want := range map[string]string{
		"":                                     "unexpected end",
		`{"jobs": []}`:                         "0 jobs",
		`{"jobs": [{"error": 5, "read": {}}]}`: "error 5",
		`{"jobs": [{"read": {"total_ios": 3, "lat_ns": {"mean": 1}}}]}`: "no 99th percentile",
	} {
		if _, _, _, err := parseFio(in, "read"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseFio(%q) = %v, want an error with %q", in, err, want)
		}
	}
}

// fakeStorage is a storage section with every figure but one, the RDMA
// figures at half the TCP throughput and twice the latency.
func fakeStorage() *storageRun {
	run := &storageRun{duration: 3 * time.Second, rounds: 3, figures: map[storageClient][]storageFigure{}}
	for _, c := range storageClients {
		for range storageWorkloads {
			f := storageFigure{mbps: 20, mean: 500, p99: 900, how: "`" + c.id + "`"}
			if c.transport == "rdma" {
				f = storageFigure{mbps: 10, mean: 1000, p99: 2000, how: "`" + c.id + "`"}
			}
			if c == directTCP {
				f.mean = 400
			}
			if c == nvmeRDMA {
				f = storageFigure{mbps: 16, mean: 250, p99: 400, how: "`" + c.id + "`"}
			}
			run.figures[c] = append(run.figures[c], f)
		}
	}
	run.figures[bridgeRDMA][5] = storageFigure{missing: "fio: exit status 1", raw: "fio: something broke\n"}
	return run
}

func TestStorageReport(t *testing.T) {
	r := fakeReport(nil)
	r.storage = fakeStorage()
	md := r.markdown()
	for _, want := range []string{
		"## Storage: an NBD server over RDMA and TCP",
		"each figure one run of 3s",
		"| workload | QD | RDMA | TCP | RDMA ÷ TCP throughput | RDMA ÷ TCP mean latency |",
		"| 4 KiB sequential read | 1 | 10.0 MB/s; 1000 µs mean, p99 2000 µs | 20.0 MB/s; 500 µs mean, p99 900 µs | 0.500× | 2.00× |",
		"| 128 KiB sequential read | 32 | 10.0 MB/s; 1000 µs mean, p99 2000 µs |",
		// fio's last line: RDMA missing, so no ratios; the bridge's cost is there.
		"| 128 KiB sequential read | 32 | missing | 20.0 MB/s; 500 µs mean, p99 900 µs |  |  | 20.0 MB/s; 400 µs mean, p99 900 µs | +100 µs (1.25×) |",
		"- Go client, RDMA: `go-rdma`",
		"| 4 KiB sequential read | 1256 MB/s; 417 µs mean | 563 MB/s; 931 µs mean | 2.23× | 0.448× |",
		"| 4 KiB random write | 474 MB/s; 1105 µs mean | 323 MB/s; 1624 µs mean | 1.47× | 0.680× |",
		"What the emulated CPU does to this table",
		"3 rounds, and each figure is the median of its rounds",
		"| workload | QD | kernel NVMe-oF, RDMA | kernel NVMe/TCP | rdmanet: Go client, RDMA | ÷ NVMe-oF/RDMA | rdmanet: fio on /dev/nbd0 via the bridge, RDMA | ÷ NVMe-oF/RDMA | target |",
		// The Go client at 10 MB/s against the kernel's 16: 0.625.
		"| 4 KiB sequential read | 1 | 16.0 MB/s; 250 µs mean, p99 400 µs | 20.0 MB/s; 500 µs mean, p99 900 µs | 10.0 MB/s; 1000 µs mean, p99 2000 µs | 0.625× | 10.0 MB/s; 1000 µs mean, p99 2000 µs | 0.625× | Go ≥ 1.00: **not met**; bridge ≥ 0.500: met |",
		// A workload without a target, and the bridge's missing figure.
		"| 4 KiB random write | 1 | 16.0 MB/s; 250 µs mean, p99 400 µs |",
		"| 128 KiB sequential read | 32 | 16.0 MB/s; 250 µs mean, p99 400 µs | 20.0 MB/s; 500 µs mean, p99 900 µs | 10.0 MB/s; 1000 µs mean, p99 2000 µs | 0.625× | missing |  | Go ≥ 1.00: **not met**; bridge ≥ 0.500: not measured |",
		"fio, for the first line: `nvmeof-rdma`",
		"## Problems in this run",
		"- **missing**: storage, fio on /dev/nbd0 via the bridge, RDMA, 128 KiB sequential read at queue depth 32: fio: exit status 1",
		"fio: something broke",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
	if section, _, _ := strings.Cut(md, "## Problems"); strings.Contains(section, "\n\n\n") {
		t.Errorf("two blank lines in a row:\n%s", section)
	}
	if i, j := strings.Index(md, "## Resumable"), strings.Index(md, "## Storage"); j < 0 || (i >= 0 && j < i) {
		t.Error("the storage section is not after the failover section")
	}
	if r.total() != len(r.res)+42 || r.missing() != 1 || r.failed() != 1 {
		t.Errorf("total %d (of which the comparison's %d), missing %d, failed %d; want 42 more, 1, 1", r.total(), len(r.res), r.missing(), r.failed())
	}

	r.storage = &storageRun{skipped: "labbench was not given -blockstore"}
	md = r.markdown()
	if !strings.Contains(md, "## Storage: an NBD server over RDMA and TCP\n\nNot measured: labbench was not given -blockstore.\n\n") {
		t.Errorf("a section not measured:\n%s", md)
	}
	if r.total() != len(r.res) || r.missing() != 0 {
		t.Errorf("a section not measured counts %d figures, %d missing", r.total()-len(r.res), r.missing())
	}
}

// TestOnlyStorage: -only picks the section, and without -blockstore it
// says it was not measured, and why.
func TestOnlyStorage(t *testing.T) {
	o := options{scale: 1, rounds: 1, storageDuration: time.Second}
	b := newBench(noEnv, o, io.Discard)
	if !b.withStorage {
		t.Error("the storage section is not measured by default")
	}
	if err := b.only([]string{"storage"}); err != nil || len(b.impls) != 0 || !b.withStorage || b.withFailover {
		t.Errorf("-only storage: %v, %d implementations, storage %v, failover %v", err, len(b.impls), b.withStorage, b.withFailover)
	}
	b.runStorage()
	if b.storage == nil || !strings.Contains(b.storage.skipped, "-blockstore") {
		t.Errorf("without -blockstore: %+v", b.storage)
	}
	b = newBench(noEnv, o, io.Discard)
	if err := b.only([]string{"tcp"}); err != nil || b.withStorage {
		t.Errorf("-only tcp: %v, storage %v", err, b.withStorage)
	}
	b.runStorage()
	if b.storage != nil {
		t.Error("-only tcp measured the storage section")
	}
}

// TestMedianFigure: each value's median over the rounds that have one;
// missing only when every round is.
func TestMedianFigure(t *testing.T) {
	f := medianFigure([]storageFigure{
		{mbps: 30, mean: 100, p99: 900, how: "a"},
		{missing: "fio: exit status 1"},
		{mbps: 10, mean: 300, p99: 700, how: "b"},
		{mbps: 20, mean: 200, p99: 800, how: "c"},
	})
	if f.missing != "" || f.mbps != 20 || f.mean != 200 || f.p99 != 800 || len(f.roundsMBps) != 3 || f.missed != 1 || f.how != "a" {
		t.Errorf("median of three rounds and a missing one: %+v", f)
	}
	// An even count takes the lower middle of each value on its own.
	f = medianFigure([]storageFigure{{mbps: 40, mean: 100, p99: 1}, {mbps: 10, mean: 400, p99: 2}})
	if f.mbps != 10 || f.mean != 100 || f.p99 != 1 {
		t.Errorf("median of two: %+v", f)
	}
	if f := medianFigure([]storageFigure{{missing: "first"}, {missing: "second"}}); f.missing != "first" {
		t.Errorf("every round missing: %+v", f)
	}
	if f := medianFigure(nil); f.missing == "" {
		t.Errorf("no round: %+v", f)
	}
}
