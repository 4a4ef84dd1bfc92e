package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/rdmanet"
)

func TestParseStatus(t *testing.T) {
	status := "Name:\tlabbench\nVmPeak:\t  100 kB\nVmLck:\t       0 kB\nVmPin:\t   36864 kB\nVmRSS:\t   80000 kB\n" +
		"RssAnon:\t   50000 kB\nRssFile:\t   30000 kB\nThreads:\t5\n"
	got, err := parseStatus(status)
	if err != nil || got["VmPin"] != 36864 || got["VmLck"] != 0 || got["VmRSS"] != 80000 || got["RssAnon"] != 50000 || got["RssFile"] != 30000 {
		t.Errorf("parseStatus = %v, %v", got, err)
	}
	if _, err := parseStatus("VmRSS:\t1 kB\n"); err == nil || !strings.Contains(err.Error(), "no VmPin") {
		t.Errorf("no VmPin: %v", err)
	}
	if _, err := parseStatus(strings.Replace(status, "36864 kB", "36864 MB", 1)); err == nil {
		t.Error("a field in MB parsed")
	}
}

// This process's /proc/self counts: its own descriptors, and a
// descriptor more when it opens one.
func TestProcReader(t *testing.T) {
	p, err := openProc()
	if err != nil {
		t.Skip("no /proc/self:", err)
	}
	defer p.close()
	before, err := p.snapshot(true)
	if err != nil || before.fds < 5 || before.rssKiB <= 0 || before.goroutines < 1 {
		t.Fatalf("snapshot = %+v, %v", before, err)
	}
	f, err := openProc()
	if err != nil {
		t.Fatal(err)
	}
	during, _ := p.snapshot(false)
	f.close()
	if during.fds != before.fds+2 {
		t.Errorf("%d descriptors, then %d with two more open", before.fds, during.fds)
	}
	if d := before.differs(during); len(d) != 1 || d[0] != "descriptors +2" {
		t.Errorf("differs = %q", d)
	}
	if back := p.settle(before, func([]string) {}); len(back) != 0 {
		t.Errorf("not back: %q", back)
	}
}

func TestAtDescriptorLimit(t *testing.T) {
	for err, want := range map[error]bool{
		fmt.Errorf("dial: %w", syscall.EMFILE): true,
		errors.New("no-device: ibv_get_device_list: function not implemented (the process had 4095 of the 4095 file descriptors its RLIMIT_NOFILE allows open)"): true,
		errors.New("connection refused"): false,
		errors.New("server refused: resources: pollfd: dup ibv_comp_channel: too many open files"): true,
	} {
		if got := atDescriptorLimit(err); got != want {
			t.Errorf("atDescriptorLimit(%v) = %v", err, got)
		}
	}
}

func TestParsePairs(t *testing.T) {
	if got, err := parsePairs("conn-pairs", " 100,1000, 2000"); err != nil || fmt.Sprint(got) != "[100 1000 2000]" {
		t.Errorf("parsePairs = %v, %v", got, err)
	}
	if got, err := parsePairs("conn-pairs", ""); err != nil || len(got) != 0 {
		t.Errorf("empty: %v, %v", got, err)
	}
	if _, err := parsePairs("conn-pairs", "100,x"); err == nil {
		t.Error("parsePairs(100,x) did not fail")
	}
	if _, err := parsePairs("conn-pairs", "0"); err == nil {
		t.Error("parsePairs(0) did not fail")
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 2000: "2,000", 1234567: "1,234,567", -4096: "-4,096"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// fakeConnections is a run of the default steps: rdmanet stops at the
// descriptor limit at 1,000 and 2,000 pairs, and does not come back to its
// baseline after 2,000; TCP opens every pair.
func fakeConnections() *connsRun {
	run := &connsRun{limit: 4096}
	run.footprint, _ = connsConfig.Footprint()
	run.defFoot = rdmanet.Footprint{RegisteredBytes: 32 << 10, StreamingRegisteredBytes: 524 << 10}
	run.defPairs = []int{100, 5000}
	base := usage{fds: 20, goroutines: 10, rssKiB: 20000, anonKiB: 15000, fileKiB: 5000}
	for _, s := range connsSteps([]int{100, 1000, 2000}, run.defPairs) {
		n := s.pairs
		if s.subject.rdma {
			n = min(n, 509)
		}
		s.opened, s.base, s.after = n, base, base
		s.lastOpen, s.elapsed, s.settled = 5*time.Second, 6*time.Second, 10*time.Second
		s.open = base
		if s.subject.rdma {
			s.open.fds += 8 * n
			s.open.goroutines += 4 * n
			s.open.pinKiB += 72 * int64(n)
			s.open.rssKiB += 700 * int64(n)
			s.open.anonKiB += 200 * int64(n)
			s.open.fileKiB += 500 * int64(n)
			s.open.verbs.MRs += 6 * int64(n)
			s.open.cmIDs += 2 * int64(n)
		} else {
			s.open.fds += 2 * n
		}
		if s.subject.rdma && s.pairs > n {
			s.failed, s.atLimit = s.pairs-n, s.pairs-n
			s.reasons = map[string]int{"resources": s.pairs - n - 10, "no-device": 10}
			s.firstErr = "dial rdma: resources: pollfd: dup rdma_cm event channel: too many open files"
		}
		run.steps = append(run.steps, s)
	}
	run.steps[5].back = []string{"descriptors +2"}
	run.memlock = []memlockRow{
		{provider: "rxe", res: benchkit.MemlockResult{Pairs: 100, PairsPinned: 7 << 20, Beyond: 28, BeyondErr: "limit: RLIMIT_MEMLOCK", TCP: "tcp resources"}},
		{provider: "siw", res: benchkit.MemlockResult{Pairs: 40, PairErr: "round trip: EOF", After: -1}, err: "exit status 1: memlock pairs: listen"},
	}
	return run
}

func TestConnectionsReport(t *testing.T) {
	r := fakeReport(nil)
	r.connections = fakeConnections()
	md := r.markdown()
	for _, want := range []string{
		"## Connections: what an open connection costs",
		"dials 16 at a time, each pair making one round trip (a 32-byte write echoed back)",
		"`Config{RecvBuffer: 16384, SendBuffer: 16384, RecvDepth: 16, NoLinkGroups: true}` on both sides, so that registered memory does not bound how many connections open",
		"`Config.Footprint` says 28.0 KiB registered an end (56.0 a pair) and 0 descriptors an end. Every rdmanet row is a connection with a queue pair of its own at each end (`NoLinkGroups: true`, checked on each client end)",
		"The default Config but for that registers 32.0 KiB an end while idle (524 KiB once its rings grew, streaming), and has rows of its own at 100 and 5,000 pairs",
		"The process's descriptor limit (`RLIMIT_NOFILE`) is 4,096, left as it is; a step it stops",
		"|  | pairs asked | pairs opened | descriptors a pair | goroutines a pair | pinned KiB a pair | RSS KiB a pair | pairs opened a second | back to the baseline |",
		"| rdmanet | 100 | 100 | 8.00 | 4.00 | 72.00 | 700 | 20.0 | yes (10.0 s) |",
		"| Go net, TCP | 100 | 100 | 2.00 | 0.00 | 0.00 | 0.00 | 20.0 | yes (10.0 s) |",
		"| rdmanet, default Config but NoLinkGroups | 100 | 100 |",
		"| rdmanet, default Config but NoLinkGroups | 5,000 | 509 |",
		"**Under an ordinary container's limit.** A child process limited to 8 MiB of `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`",
		"| rdmanet, default Config but NoLinkGroups, rxe | 100 | 71.68 | 28 | `limit: RLIMIT_MEMLOCK` | fell back to TCP (resources) | 0 bytes |",
		"| rdmanet, default Config but NoLinkGroups, siw | 40 | 0.00 | – | `**the child failed**: exit status 1: memlock pairs: listen` | not tried | – |",
		"| rdmanet | 1,000 | 509 | 8.00 | 4.00 | 72.00 | 700 | 102 | yes (10.0 s) |",
		"| Go net, TCP | 2,000 | 2,000 | 2.00 | 0.00 | 0.00 | 0.00 | 400 | yes (10.0 s) |",
		"| rdmanet | 2,000 | 509 | 8.00 | 4.00 | 72.00 | 700 | 102 | **no**: descriptors +2 |",
		"- rdmanet, 1,000 pairs: 491 of 1,000 failed, all of them at the descriptor limit (by rdmanet's reason: resources 481, no-device 10); the first with: dial rdma: resources: pollfd: dup rdma_cm event channel: too many open files",
		"- rdmanet, 2,000 pairs: 1,491 of 2,000 failed, all of them",
		"a pair: MRs 6.00, QPs 0.00",
		"RSS a pair 200 KiB anonymous, 500 KiB file-backed",
		"## Problems in this run",
		"- connections: rdmanet, 2,000 pairs: the process did not come back to its baseline: descriptors +2",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
	// Failures at the descriptor limit are the section's finding, not a problem.
	if strings.Contains(md, "- connections: rdmanet, 1,000 pairs") {
		t.Errorf("the limit's failures are listed as a problem:\n%s", md)
	}
	if section, _, _ := strings.Cut(md, "## Problems"); strings.Contains(section, "\n\n\n") {
		t.Errorf("two blank lines in a row:\n%s", section)
	}
	if i, j, k := strings.Index(md, "## Storage"), strings.Index(md, "## Connections"), strings.Index(md, "## How"); j < 0 || (i >= 0 && j < i) || j > k {
		t.Error("the connections section is not after the storage section and before the method")
	}
	if got := r.failed(); got != 1 {
		t.Errorf("failed() = %d, want the 1 step not back", got)
	}
	checkTables(t, md)

	// Failures for another reason, and steps not measured, are problems.
	r.connections.steps[1].failed, r.connections.steps[1].opened = 3, 97
	r.connections.steps[1].firstErr = "round trip: i/o timeout"
	r.connections.steps[1].reasons = map[string]int{"": 3}
	r.connections.steps[3].failed++
	r.connections.steps[3].otherErr = "round trip: EOF"
	r.connections.steps[6].skipped = "it would have ended after the run's budget (-budget 11m0s)"
	md = r.markdown()
	for _, want := range []string{
		"- connections: Go net, TCP, 100 pairs: 3 of 100 failed, none of them at the descriptor limit; the first with: round trip: i/o timeout",
		"- connections: rdmanet, 1,000 pairs: 492 of 1,000 failed, 491 of them at the descriptor limit (by rdmanet's reason: resources 481, no-device 10); the first with: dial rdma: resources: pollfd: dup rdma_cm event channel: too many open files; the first not at the descriptor limit: round trip: EOF",
		"- connections: Go net, TCP, 2,000 pairs: not measured: it would have ended after the run's budget",
		"| Go net, TCP | 2,000 | not measured | – | – | – | – | – | – |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
	if got := r.failed(); got != 2 {
		t.Errorf("failed() = %d, want 2", got)
	}
	checkTables(t, md)
}

// -only picks the section, and -conn-pairs sets its steps and reserve.
func TestOnlyConnections(t *testing.T) {
	o := options{scale: 1, rounds: 1, connPairs: []int{100, 1000}}
	b := newBench(noEnv, o, io.Discard)
	if !b.withConnections || b.connectionsReserve() <= 0 {
		t.Errorf("the connections section is not measured by default, or reserves no time (%v)", b.connectionsReserve())
	}
	if err := b.only([]string{"connections"}); err != nil || len(b.impls) != 0 || !b.withConnections || b.withStorage {
		t.Errorf("-only connections: %v, %d implementations, connections %v, storage %v", err, len(b.impls), b.withConnections, b.withStorage)
	}
	b = newBench(noEnv, o, io.Discard)
	if err := b.only([]string{"tcp"}); err != nil || b.withConnections || b.connectionsReserve() != 0 {
		t.Errorf("-only tcp: %v, connections %v", err, b.withConnections)
	}
	b.runConnections()
	if b.connections != nil {
		t.Error("-only tcp measured the connections section")
	}
	if b := newBench(noEnv, options{scale: 1, rounds: 1}, io.Discard); b.withConnections {
		t.Error("no -conn-pairs, yet the section is measured")
	}
	var steps []string
	for _, s := range connsSteps([]int{100, 1000}, []int{100, 5000}) {
		steps = append(steps, fmt.Sprintf("%s %d", s.subject.label, s.pairs))
	}
	if got := strings.Join(steps, "; "); got != "rdmanet 100; Go net, TCP 100; rdmanet, default Config but NoLinkGroups 100; rdmanet 1000; Go net, TCP 1000; rdmanet, default Config but NoLinkGroups 5000" {
		t.Errorf("steps: %s", got)
	}
}

// With the budget used up, no step runs (and nothing touches the lab).
func TestRunConnectionsBudget(t *testing.T) {
	b := newBench(noEnv, options{scale: 1, rounds: 1, timeout: time.Second, budget: time.Millisecond, connPairs: []int{10}, connDefaultPairs: []int{10}}, io.Discard)
	b.start = time.Now().Add(-time.Second)
	b.runConnections()
	run := b.connections
	if run == nil || len(run.steps) != 3 {
		t.Fatalf("run %+v", run)
	}
	for _, s := range run.steps {
		if !strings.Contains(s.skipped, "budget") {
			t.Errorf("step %s %d: %q", s.subject.label, s.pairs, s.skipped)
		}
	}
	if md := b.report().markdown(); !strings.Contains(md, "| rdmanet | 10 | not measured |") {
		t.Errorf("report:\n%s", md)
	}
}
