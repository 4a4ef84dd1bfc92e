package main

import (
	"context"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/rdmanet"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func latencies(ns ...int) []time.Duration {
	var ds []time.Duration
	for _, n := range ns {
		ds = append(ds, ms(n))
	}
	return ds
}

// fakeGroups is a section of 2 rounds of 3: the rates, round trips and
// aggregates measured (the own connection's second dial round and the
// stream's second stream round failed), and a failover that completed.
func fakeGroups() *groupsRun {
	return &groupsRun{asked: 3, rounds: 2, roundsWhy: "another would have ended after the run's budget (-budget 14m0s)",
		dial: map[dialSubject][]dialFigure{
			dialTCP:    {{asked: 300, opened: 300, wall: ms(400), lats: latencies(10, 20, 30)}, {asked: 300, opened: 300, wall: ms(375), lats: latencies(9, 19, 29)}},
			dialOwn:    {{asked: 300, opened: 300, wall: 3 * time.Second, lats: latencies(100, 150, 200)}, {asked: 300, opened: 290, failed: 10, missing: "10 of 300 connections failed; the first: dial rdma: timeout"}},
			dialStream: {{asked: 300, opened: 300, wall: ms(750), lats: latencies(30, 40, 50)}, {asked: 300, opened: 300, wall: ms(800), lats: latencies(31, 41, 51)}},
			dialFirst:  {{asked: 32, opened: 32, wall: 2 * time.Second, lats: latencies(800, 900, 1000), note: "not settled 30s after it: 1 groups"}},
		},
		rtt: map[rttKey][]figure{
			// Three pairs: 49/50, 55/48 and 53/52.
			{false, pingpong}: {{p50: 50, p99: 90, mean: 55, hasPct: true, how: "own pair"}, {p50: 48, p99: 95, mean: 53, hasPct: true, how: "own pair"}, {p50: 52, p99: 92, mean: 54, hasPct: true, how: "own pair"}},
			{true, pingpong}:  {{p50: 49, p99: 100, mean: 56, hasPct: true, how: "stream pair"}, {p50: 55, p99: 99, mean: 58, hasPct: true, how: "stream pair"}, {p50: 53, p99: 101, mean: 57, hasPct: true, how: "stream pair"}},
			{false, stream}:   {{mbps: 100, how: "own pair"}},
			{true, stream}:    {{mbps: 90, how: "stream pair"}, {missing: "read: i/o timeout", how: "stream pair"}},
		},
		agg: map[aggSubject][]aggFigure{
			aggTwoPaths: {{mbps: 150, links: "path 1: 4, path 2: 4", elapsed: time.Second}},
			aggOnePath:  {{mbps: 100, links: "path 1: 8", elapsed: time.Second}},
		},
		failover: &groupFailover{streams: 100, reached: gfAfter, before: 120, during: 80, after: 118,
			quietStall: ms(90), onPath1: 50, linkDown: ms(2100), firstMove: ms(2150), allMoved: ms(2600), moved: 50, movedTo: "path 2: 100",
			stallMax: ms(2650), stallP50: ms(2500), stallMovedMax: ms(2650), stallStayedMax: ms(700), failback: ms(3000), movedBack: 50, failbackStall: ms(300),
			bytes: 900e6, took: 30 * time.Second},
	}
}

func TestGroupsReport(t *testing.T) {
	r := fakeReport(nil)
	r.groups = fakeGroups()
	r.failover = fakeFailover()
	md := r.markdown()
	for _, want := range []string{
		"## Link groups (issue 25)",
		"(2 of 3 asked for, `-rounds`)",
		"`bin/rdmanet-lab -m 8192 bin/labbench -only groups` runs the section alone",
		"|  | connections | opened a second | ÷ Go's TCP | open p50 | open p99 | target |",
		// The best round of each: TCP's second, the own connection's first.
		"| Go net, TCP | 300 | 800 | 1.00 | 19.0 ms | 29.0 ms |  |",
		"| rdmanet, a queue pair of its own (NoLinkGroups) | 300 | 100 | 0.12 | 150 ms | 200 ms |  |",
		"| rdmanet, a stream of a group that exists (default Config) | 300 | 400 | 0.50 | 40.0 ms | 50.0 ms | ≥ 0.5 × Go's TCP: met |",
		"| rdmanet, the first connection to a new listener (makes the group) | 32 | 16.0 | 0.02 | 900 ms | 1.00 s |  |",
		"|  | a queue pair of its own | a group's stream | stream ÷ own | target |",
		// Medians of each column (50 and 53: 1.06 apart), and the
		// median of the pairs' ratios (0.98, 1.15, 1.02): within 5%.
		"| round trip, 64 B, p50 | 50.0 µs | 53.0 µs | 1.02 (3 pairs: 0.98–1.15) | ≤ 1.05 × its own: met |",
		"| round trip, 64 B, p99 | 92.0 µs | 100 µs | 1.10 (3 pairs: 1.04–1.11) |  |",
		// The stream's second pair failed: one pair.
		"| stream, 64 KiB writes | 100 MB/s (0.800 Gb/s) | 90.0 MB/s (0.720 Gb/s) | 0.90 (1 pair) | ≥ 0.95 × its own: **not met** |",
		"Each stream moves 8 MiB one way",
		"**Both rxe paths are software on the VM's one emulated CPU**",
		"| 8 streams over two paths (SpreadLeastStreams) | path 1: 4, path 2: 4 | 150 MB/s (1.20 Gb/s) | 1.50 |",
		"| 8 streams over one path (no failover address) | path 1: 8 | 100 MB/s (0.800 Gb/s) | 1.00 |",
		"(`Config{KeepAlive: 1s}` on both sides",
		"|  | group of 100 streams | one session: p50 (n; range) | group ÷ session p50 |",
		// fakeFailover's RDMA-to-RDMA cycles: detection 2.3-2.5 s, resume 200-220 ms, stall 2.6-2.8 s.
		"| path 1 found dead (T0 to the group's link counted down; the session's detection) | 2.10 s | 2.40 s (3; 2.30 s–2.50 s) | 0.88 |",
		"| the first stream moved (the session: its move) | 2.15 s | 2.61 s (3; 2.50 s–2.72 s) | 0.82 |",
		"| every stream moved | 2.60 s | 2.61 s (3; 2.50 s–2.72 s) | 1.00 |",
		"| stall: the longest wait for data (the group: over its streams) | 2.65 s | 2.70 s (3; 2.60 s–2.80 s) | 0.98 |",
		"| failback: path 1 healed to back on it (the group: half the streams) | 3.00 s | 2.50 s (3; 1.50 s–3.50 s) | 1.20 |",
		"Target: the group's longest stall with 100 streams ≤ one session's (p50): met.",
		"- 50 streams were on path 1's link at T0; 50 moves counted until every stream was on path 2: 100; the median stream's stall was 2.50 s; the longest of the streams that moved (from path 1) was 2.65 s, of those that stayed on path 2 700 ms; with no fault (the before window) the longest gap any stream saw between reads was 90.0 ms.",
		"before (both paths) 120 MB/s, during (path 2 alone) 80.0 MB/s, after (both paths) 118 MB/s (during ÷ before 0.67; the session's, on one path: 0.55)",
		"**The failover completed** in 30 s. At the end every server end had read every byte its client wrote (900 MB in all).",
		"- connections, rdmanet, a queue pair of its own (NoLinkGroups): 100 a second (300 in 3.0s); failed: 10 of 300 connections failed",
		"- stream 64 KiB, a group's stream: stream pair; rounds: 90.0, – MB/s",
		"- failover of 100 streams: path 1's link down at 2.10 s, first move at 2.15 s, all 50 moved at 2.60 s",
		"## Problems in this run",
		"- link groups: connections, rdmanet, a queue pair of its own (NoLinkGroups), round 2: 10 of 300 connections failed; the first: dial rdma: timeout",
		"- link groups: note: connections, rdmanet, the first connection to a new listener (makes the group), round 1: not settled 30s after it: 1 groups",
		"- link groups: stream, a group's stream, round 2: read: i/o timeout",
		"- link groups: 2 rounds of the 3 asked for: another would have ended after the run's budget (-budget 14m0s).",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
	if i, j, k := strings.Index(md, "## Resumable sessions"), strings.Index(md, "## Link groups"), strings.Index(md, "## How"); i < 0 || j < i || k < j {
		t.Error("the link groups section is not between the failover section and the method")
	}
	// 2 failed rounds here, 1 failed cycle in the failover section.
	if got := r.failed(); got != 3 {
		t.Errorf("failed() = %d, want 3", got)
	}
	checkTables(t, md)
}

// Without the failover section, the session's column is empty and the
// stall's target cannot be told; a failover that failed says where.
func TestGroupsReportNoSession(t *testing.T) {
	r := fakeReport(nil)
	r.impls = nil
	r.groups = fakeGroups()
	gf := r.groups.failover
	gf.reached, gf.failed = gfDuring, "after the heal: waiting for half the streams back on path 1: not within 1m0s (a hang guard); the group: links path 2: 100"
	gf.endProblem = "1 of 100 streams did not end with every byte read; the first: stream 7: the server read 5 bytes, the client wrote 6"
	md := r.markdown()
	for _, want := range []string{
		"| stall: the longest wait for data (the group: over its streams) | 2.65 s | – | – |",
		"| failback: path 1 healed to back on it (the group: half the streams) | – | – | – |",
		"Target: the group's longest stall with 100 streams ≤ one session's (p50): cannot tell (the failover section did not run in this run (`-only` without `failover`, or `-failover-cycles 0`)).",
		"**The failover failed** after its throughput on path 2: after the heal: waiting for half",
		"- **failed**: the streams' end: 1 of 100 streams did not end",
		"- link groups: the failover failed after its throughput on path 2: after the heal",
		"- link groups: the failover's streams: 1 of 100 streams",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
	for _, absent := range []string{"## Targets", "## How", "\n\n\n", "**The failover completed**"} {
		if strings.Contains(md, absent) {
			t.Errorf("%q in the report of the section alone:\n%s", absent, md)
		}
	}
	if got := r.failed(); got != 4 {
		t.Errorf("failed() = %d, want 2 rounds, the failover and its streams' end", got)
	}
	checkTables(t, md)

	r.groups.failover, r.groups.failoverSkipped = nil, "it would have ended after the run's budget (-budget 1m0s)"
	md = r.markdown()
	for _, want := range []string{
		"**Not measured**: it would have ended after the run's budget (-budget 1m0s).",
		"- link groups: the failover was not measured: it would have ended",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
	checkTables(t, md)
}

// With the budget used up, the section is not measured (and nothing
// touches the lab), and says so.
func TestRunGroupsBudget(t *testing.T) {
	b := newBench(noEnv, options{scale: 1, rounds: 3, timeout: time.Second, budget: time.Millisecond}, io.Discard)
	b.start = time.Now().Add(-time.Second)
	b.runGroups()
	if b.groups == nil || !strings.Contains(b.groups.skipped, "budget") || b.groups.rounds != 0 {
		t.Fatalf("run %+v", b.groups)
	}
	r := b.report()
	r.impls = nil
	md := r.markdown()
	for _, want := range []string{"**Not measured**: the run's budget (-budget 1ms) was used up before it.", "- link groups: not measured: the run's budget"} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
	if got := r.failed(); got != 1 {
		t.Errorf("failed() = %d, want 1", got)
	}
	checkTables(t, md)
}

// -only selects the section by its ID, and leaves it out when not named.
func TestOnlyGroups(t *testing.T) {
	o := options{scale: 1, rounds: 1, failoverCycles: 6, connPairs: []int{100}}
	b := newBench(noEnv, o, io.Discard)
	if !b.withGroups || !slices.Contains(implIDs(), groupsID) {
		t.Errorf("the section is not measured by default, or its ID not listed: %v", implIDs())
	}
	if err := b.only([]string{"groups"}); err != nil || len(b.impls) != 0 || !b.withGroups || b.withFailover || b.withConnections || b.withStorage {
		t.Errorf("-only groups: %v, %d implementations, groups %v, failover %v", err, len(b.impls), b.withGroups, b.withFailover)
	}
	b = newBench(noEnv, o, io.Discard)
	if err := b.only([]string{"groups", "failover"}); err != nil || !b.withGroups || !b.withFailover {
		t.Errorf("-only groups,failover: %v, groups %v, failover %v", err, b.withGroups, b.withFailover)
	}
	b = newBench(noEnv, o, io.Discard)
	if err := b.only([]string{"tcp"}); err != nil || b.withGroups {
		t.Errorf("-only tcp: %v, groups %v", err, b.withGroups)
	}
}

// The rounds leave the section the time it is expected to take.
func TestRunAllKeepsGroupsTime(t *testing.T) {
	fake := impl{id: "fake", label: "fake", stream: func(ctx context.Context, size int, total int64) figure {
		time.Sleep(10 * time.Millisecond)
		return figure{mbps: 1}
	}}
	for _, groups := range []bool{false, true} {
		b := newBench(noEnv, options{scale: 1, rounds: 3, timeout: time.Second, budget: groupsRoundEstimate + groupsFailoverEstimate/2}, io.Discard)
		b.impls, b.withGroups = []impl{fake}, groups
		b.runAll()
		if want := map[bool]int{false: 3, true: 1}[groups]; b.done != want {
			t.Errorf("groups %v: %d rounds, want %d", groups, b.done, want)
		}
	}
}

func TestBestDial(t *testing.T) {
	a := dialFigure{opened: 100, wall: time.Second}
	c := dialFigure{opened: 100, wall: ms(500)}
	bad := dialFigure{missing: "listening: no device"}
	if got := bestDial([]dialFigure{a, bad, c}); got.rate() != 200 {
		t.Errorf("best of 100 and 200 a second: %v", got.rate())
	}
	if got := bestDial([]dialFigure{bad}); got.missing != bad.missing {
		t.Errorf("one failed round: %+v", got)
	}
	if got := bestDial([]dialFigure{bad, {missing: "x"}}); got.missing != "all 2 rounds failed; the first: listening: no device" {
		t.Errorf("two failed rounds: %q", got.missing)
	}
	if got := bestDial(nil); got.ok() {
		t.Errorf("no round: %+v", got)
	}
	if (dialFigure{}).rate() != 0 {
		t.Error("the rate of nothing")
	}
	if got := bestAgg([]aggFigure{{mbps: 5}, {missing: "x"}, {mbps: 7}}); got.mbps != 7 {
		t.Errorf("best aggregate %+v", got)
	}
	if got := bestAgg([]aggFigure{{missing: "x"}, {missing: "y"}}); got.missing != "all 2 rounds failed; the first: x" {
		t.Errorf("failed aggregates %+v", got)
	}
}

func TestDialTarget(t *testing.T) {
	tcp := dialFigure{opened: 100, wall: time.Second}
	for _, c := range []struct {
		subj   dialSubject
		f, tcp dialFigure
		want   string
	}{
		{dialStream, dialFigure{opened: 50, wall: time.Second}, tcp, "≥ 0.5 × Go's TCP: met"},
		{dialStream, dialFigure{opened: 49, wall: time.Second}, tcp, "≥ 0.5 × Go's TCP: **not met**"},
		{dialStream, dialFigure{missing: "x"}, tcp, "≥ 0.5 × Go's TCP: cannot tell (the stream's figure is missing)"},
		{dialStream, dialFigure{opened: 50, wall: time.Second}, dialFigure{missing: "x"}, "≥ 0.5 × Go's TCP: cannot tell (Go's TCP figure is missing)"},
		{dialOwn, dialFigure{opened: 50, wall: time.Second}, tcp, ""},
	} {
		if got := dialTarget(c.subj, c.f, c.tcp); got != c.want {
			t.Errorf("%v: %q, want %q", c.subj, got, c.want)
		}
	}
}

func TestGroupLinks(t *testing.T) {
	paths := noEnv.Paths()
	paths[0].B, paths[1].B = netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.3.2")
	g := rdmanet.GroupInfo{Links: []rdmanet.GroupLinkInfo{
		{Remote: "198.18.0.2:7000", Transport: "rdma", Streams: 4},
		{Remote: "198.18.3.2:7000", Transport: "rdma", Streams: 3},
	}}
	if got := describeLinks(g, paths); got != "path 1: 4, path 2: 3" {
		t.Errorf("describeLinks = %q", got)
	}
	if linksHold(g, []int{4, 4}) || !linksHold(g, []int{3, 4}) {
		t.Error("linksHold takes the links' streams in any order, all of them")
	}
	if streamsOn(g, paths[1].B) != 3 {
		t.Error("streamsOn path 2")
	}
	g.Suspended = 1
	if linksHold(g, []int{4, 3}) {
		t.Error("linksHold with a stream suspended")
	}
	g = rdmanet.GroupInfo{Links: []rdmanet.GroupLinkInfo{{Remote: "198.18.0.2:7000", Transport: "tcp", Streams: 7}, {Remote: "10.0.0.1:1", Transport: "rdma"}}}
	if got := describeLinks(g, paths); got != "TCP: 7, 10.0.0.1:1: 0" {
		t.Errorf("describeLinks = %q", got)
	}
	if streamsOn(g, paths[0].B) != 0 {
		t.Error("a TCP link's streams are on no RDMA path")
	}
	if got := describeLinks(rdmanet.GroupInfo{}, paths); got != "no link" {
		t.Errorf("describeLinks of none = %q", got)
	}
	if got := groupState(rdmanet.GroupInfo{}, false, paths); got != "no such group" {
		t.Errorf("groupState = %q", got)
	}
	if !slices.Equal(aggTwoPaths.want(8), []int{4, 4}) || !slices.Equal(aggOnePath.want(8), []int{8}) || aggOnePath.failover() {
		t.Error("the aggregates' placements")
	}
}

func TestSessionReference(t *testing.T) {
	if ref := sessionReference(nil); ref.haveOK() || ref.haveFailback() {
		t.Errorf("no failover section: %+v", ref)
	}
	// The RDMA-to-RDMA cycles only; all three got as far as the failback.
	ref := sessionReference(fakeFailover())
	if !ref.haveOK() || !ref.haveFailback() || !slices.Equal(ref.detection, latencies(2300, 2400, 2500)) ||
		!slices.Equal(ref.moved, latencies(2500, 2610, 2720)) || !slices.Equal(ref.stall, latencies(2600, 2700, 2800)) ||
		!slices.Equal(ref.failback, latencies(1500, 2500, 3500)) || ref.before != 20 || ref.during != 11 {
		t.Errorf("reference %+v", ref)
	}
	for vs, want := range map[string]string{"": "–", "5": "5.00 ms (1)", "5 7": "5.00 ms (2; 5.00 ms–7.00 ms)"} {
		var ds []time.Duration
		for _, f := range strings.Fields(vs) {
			n, _ := strconv.Atoi(f)
			ds = append(ds, ms(n))
		}
		if got := refCell(ds); got != want {
			t.Errorf("refCell(%q) = %q, want %q", vs, got, want)
		}
	}
	if got := timeRatio(ms(100), ms(200), true); got != "0.50" {
		t.Errorf("timeRatio = %q", got)
	}
	if got := timeRatio(-1, ms(200), true); got != "–" {
		t.Errorf("timeRatio of nothing seen = %q", got)
	}
	if optSecs(-1) != "not seen" || optSecs(ms(20)) != "20.0 ms" {
		t.Error("optSecs")
	}
}

// The rate of connections, on Go's TCP over the loopback: the machinery
// without the lab.
func TestDialRateTCP(t *testing.T) {
	b := newBench(noEnv, options{scale: 0.1, rounds: 1, timeout: 30 * time.Second}, io.Discard)
	b.env.AddrA, b.env.AddrB = netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.1")
	f := b.dialRate(dialTCP)
	if !f.ok() || f.opened != 30 || f.asked != 30 || len(f.lats) != 30 || f.rate() <= 0 || !slices.IsSorted(f.lats) {
		t.Errorf("30 TCP connections: %+v", f)
	}
}
