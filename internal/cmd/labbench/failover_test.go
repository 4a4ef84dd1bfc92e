package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

func TestLongestGap(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	reads := []readAt{{at(-30), 1}, {at(-10), 2}, {at(2500), 3}, {at(2510), 4}, {at(2600), 5}, {at(9000), 6}}
	for _, c := range []struct {
		name     string
		from, to time.Time
		want     time.Duration
	}{
		// The wait that spans the fault counts from the last read before it.
		{"around the fault", at(0), at(3000), 2510 * time.Millisecond},
		// A read after the window's end is not in it.
		{"window ends before a later gap", at(0), at(8999), 2510 * time.Millisecond},
		{"window takes the later gap", at(0), at(9000), 6400 * time.Millisecond},
		// No read before from: the wait counts from from.
		{"nothing before", at(-100), at(0), 70 * time.Millisecond},
		{"nothing in the window", at(3000), at(4000), 0},
	} {
		if got := longestGap(reads, c.from, c.to); got != c.want {
			t.Errorf("%s: longestGap = %v, want %v", c.name, got, c.want)
		}
	}
	if got := longestGap(nil, at(0), at(1)); got != 0 {
		t.Errorf("no reads: %v", got)
	}
	if got := firstReadAfter(reads, at(-10)); !got.Equal(at(2500)) {
		t.Errorf("firstReadAfter = %v", got)
	}
	if got := firstReadAfter(reads, at(9000)); !got.IsZero() {
		t.Errorf("firstReadAfter the last = %v, want zero", got)
	}
}

func TestSecs(t *testing.T) {
	for d, want := range map[time.Duration]string{
		2612 * time.Millisecond:  "2.61 s",
		51234 * time.Microsecond: "51.2 ms",
		-3 * time.Millisecond:    "-3.00 ms",
		12 * time.Second:         "12.0 s",
	} {
		if got := secs(d); got != want {
			t.Errorf("secs(%v) = %q, want %q", d, got, want)
		}
	}
}

// fakeFailover is a run of 3 cycles of each kind: the RDMA-to-RDMA ones
// complete; of the RDMA-to-TCP ones, one fails waiting for the failback.
func fakeFailover() *failoverRun {
	run := &failoverRun{perKind: 3}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for i := range 3 {
		run.cycles = append(run.cycles,
			cycle{kind: toRDMA, reached: phaseAfter, before: 20, during: 10 + float64(i), after: 21,
				stall: ms(2600 + 100*i), detection: ms(2300 + 100*i), resume: ms(200 + 10*i), movedTo: "rdma b -> c",
				failback: ms(1500 + 1000*i), failbackPause: ms(40 + i), took: 14 * time.Second},
			cycle{kind: toTCP, reached: phaseAfter, before: 20, during: 40, after: 19,
				stall: ms(5000 + 100*i), detection: ms(2400), resume: ms(2600), movedTo: "tcp -> d",
				failback: ms(2000), failbackPause: ms(50), took: 16 * time.Second})
	}
	run.cycles[5].reached = phaseDuring
	run.cycles[5].failed = "after the heal: no failback after path 1 healed within 1m0s (a hang guard)"
	run.sessions = []sessionEnd{{written: 300e6, read: 300e6}}
	return run
}

func TestFailoverReport(t *testing.T) {
	r := fakeReport(nil)
	r.failover = fakeFailover()
	md := r.markdown()
	for _, want := range []string{
		"## Resumable sessions: failover and failback",
		"`Config{KeepAlive: 1s, ResumeTimeout: 30s, FailbackInterval: 1s}` on both sides",
		"|  | RDMA to RDMA p50 | p99 | n | RDMA to TCP p50 | p99 | n |",
		// Nearest rank: the middle of 3, and the largest as p99.
		"| stall: the longest wait for data | 2.70 s | 2.80 s | 3 | 5.10 s | 5.20 s | 3 |",
		"| resume: the dead path found to the new link | 210 ms | 220 ms | 3 | 2.60 s | 2.60 s | 3 |",
		// The failed cycle measured no failback: 2 of 3.
		"| failback: path 1 healed to the session back on it | 2.50 s | 3.50 s | 3 | 2.00 s | 2.00 s | 2 |",
		"| RDMA to RDMA | 20.0 MB/s (3) | 11.0 MB/s (3) | 21.0 MB/s (3) | 0.55 | 1.05 |",
		"| RDMA to TCP | 20.0 MB/s (3) | 40.0 MB/s (3) | 19.0 MB/s (2) | 2.00 | 0.95 |",
		"**5 of 6 cycles completed, 1 failed.**\n\n- **failed**: cycle 6, RDMA to TCP: after the heal: no failback",
		"the server had read every byte the client wrote (300 MB in all)",
		"- cycle 1, RDMA to RDMA: stall 2.60 s, detection 2.30 s, resume 200 ms (to rdma b -> c); failback 1.50 s (pause 40.0 ms); before 20.0 MB/s, during 10.0 MB/s, after 21.0 MB/s (14.0s)",
		"- cycle 6, RDMA to TCP: stall 5.20 s, detection 2.40 s, resume 2.60 s (to tcp -> d); before 20.0 MB/s, during 40.0 MB/s; FAILED: after the heal",
		"## Problems in this run",
		"- failover: 1 of 6 cycles failed (see Resumable sessions).",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
	if i, j := strings.Index(md, "## Round trips"), strings.Index(md, "## Resumable sessions"); i < 0 || j < i || j > strings.Index(md, "## How") {
		t.Error("the failover section is not between the round trips and the method")
	}
	if !strings.HasSuffix(md, endMarker+"\n") {
		t.Error("no end marker")
	}
	if got := r.failed(); got != 1 {
		t.Errorf("failed() = %d, want the 1 failed cycle", got)
	}
	checkTables(t, md)

	// A clean run: no failures listed, no problems, no empty paragraphs.
	r.failover.cycles[5].failed, r.failover.cycles[5].reached = "", phaseAfter
	md = r.markdown()
	for _, absent := range []string{"**failed**", "## Problems", "\n\n\n"} {
		if strings.Contains(md, absent) {
			t.Errorf("%q in the report of a clean run:\n%s", absent, md)
		}
	}
	if want := "**6 of 6 cycles completed.**\n\nThe stream used 1 session(s)"; !strings.Contains(md, want) {
		t.Errorf("no %q in\n%s", want, md)
	}
}

// A session whose bytes do not add up, and cycles the budget left out,
// are failures and problems.
func TestFailoverReportProblems(t *testing.T) {
	r := fakeReport(nil)
	r.failover = fakeFailover()
	r.failover.sessions = append(r.failover.sessions, sessionEnd{written: 10, read: 9, problem: "the server read 9 bytes, the client wrote 10"})
	r.failover.skipped, r.failover.skipWhy = 2, "they would have ended after the run's budget (-budget 8m0s)"
	md := r.markdown()
	for _, want := range []string{
		"The stream used 2 session(s); 1 did not end with every byte the client wrote read by the server:",
		"- **failed**: session 2 (10 bytes written, 9 read): the server read 9 bytes, the client wrote 10",
		"**5 of 6 cycles completed, 1 failed, 2 not run.** Not run: they would have ended after the run's budget (-budget 8m0s).",
		"- failover: 1 session(s) did not end with every byte read",
		"- failover: 2 cycles not run: they would",
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

// -only selects the failover section by its ID, alone or with others, and
// leaves it out when not named.
func TestOnlyFailover(t *testing.T) {
	o := options{scale: 1, rounds: 1, failoverCycles: 6}
	b := newBench(noEnv, o, io.Discard)
	if err := b.only([]string{"failover"}); err != nil || len(b.impls) != 0 || !b.withFailover {
		t.Errorf("-only failover: %v, %d implementations, failover %v", err, len(b.impls), b.withFailover)
	}
	b = newBench(noEnv, o, io.Discard)
	if err := b.only([]string{"tcp", " failover"}); err != nil || len(b.impls) != 1 || !b.withFailover {
		t.Errorf("-only tcp,failover: %v, %d implementations, failover %v", err, len(b.impls), b.withFailover)
	}
	b = newBench(noEnv, o, io.Discard)
	if err := b.only([]string{"tcp"}); err != nil || b.withFailover {
		t.Errorf("-only tcp: %v, failover %v", err, b.withFailover)
	}
	b = newBench(noEnv, options{scale: 1, rounds: 1}, io.Discard)
	if err := b.only([]string{"failover"}); err != nil || b.withFailover {
		t.Errorf("-only failover with no cycles: %v, failover %v", err, b.withFailover)
	}
	if err := b.only([]string{"failovers"}); err == nil || !strings.Contains(err.Error(), "failover") {
		t.Errorf("unknown ID: %v", err)
	}
	// The report of the section alone has none of the comparison's.
	r := fakeReport(nil)
	r.impls, r.failover = nil, fakeFailover()
	md := r.markdown()
	for _, absent := range []string{"## Targets", "## Stream throughput", "## Round trips", "## How", "best of", "\n\n\n"} {
		if strings.Contains(md, absent) {
			t.Errorf("%q in the report of the failover section alone:\n%s", absent, md)
		}
	}
	if !strings.Contains(md, "## Resumable sessions") || !strings.Contains(md, ". The run took") || !strings.HasSuffix(md, endMarker+"\n") {
		t.Errorf("report of the failover section alone:\n%s", md)
	}
}

// The rounds leave the failover section the time it is expected to take.
func TestRunAllKeepsFailoverTime(t *testing.T) {
	fake := impl{id: "fake", label: "fake", stream: func(ctx context.Context, size int, total int64) figure {
		time.Sleep(10 * time.Millisecond)
		return figure{mbps: 1}
	}}
	for _, c := range []struct {
		cycles int
		want   int
	}{{0, 3}, {1, 1}} {
		// 2 × 15 s of failover do not fit in 20 s after a round.
		b := newBench(noEnv, options{scale: 1, rounds: 3, timeout: time.Second, budget: 20 * time.Second, failoverCycles: c.cycles}, io.Discard)
		b.impls = []impl{fake}
		b.withGroups = false // its reserve is TestRunAllKeepsGroupsTime's
		b.runAll()
		if b.done != c.want {
			t.Errorf("%d failover cycles: %d rounds, want %d", c.cycles, b.done, c.want)
		}
	}
}

// With the budget used up, no cycle starts (and nothing touches the lab).
func TestRunFailoverBudget(t *testing.T) {
	b := newBench(noEnv, options{scale: 1, rounds: 1, timeout: time.Second, budget: time.Millisecond, failoverCycles: 2}, io.Discard)
	b.start = time.Now().Add(-time.Second)
	b.runFailover()
	run := b.failover
	if run == nil || len(run.cycles) != 0 || run.skipped != 4 || !strings.Contains(run.skipWhy, "budget") {
		t.Fatalf("run %+v", run)
	}
	md := b.report().markdown()
	if !strings.Contains(md, "**0 of 4 cycles completed, 4 not run.**") {
		t.Errorf("report:\n%s", md)
	}
}
