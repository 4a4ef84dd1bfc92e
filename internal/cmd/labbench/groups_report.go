package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
)

// The Link groups section of the report (groups.go measures it).

// rttRows are the rows of the round-trip and stream table.
var rttRows = []struct {
	name   string
	kind   kind
	get    func(figure) float64
	format func(figure) string
	higher bool // a higher figure is better (throughput)
	target bool // issue 25's "within 5%" applies
}{
	{"round trip, 64 B, p50", pingpong, func(f figure) float64 { return f.p50 }, func(f figure) string { return usec(f.p50) }, false, true},
	{"round trip, 64 B, p99", pingpong, func(f figure) float64 { return f.p99 }, func(f figure) string { return usec(f.p99) }, false, false},
	{"stream, 64 KiB writes", stream, func(f figure) float64 { return f.mbps }, mbpsOf, true, true},
}

// sessionRef is the failover section's reference for the group's
// failover: its RDMA-to-RDMA cycles' times, each sorted, of the cycles
// that got that far, and their throughputs' medians.
type sessionRef struct {
	detection, moved, stall []time.Duration // phaseMoved
	failback, failbackPause []time.Duration // phaseFailback
	before, during          float64
	haveRate                bool
}

func (ref sessionRef) haveOK() bool       { return len(ref.stall) > 0 }
func (ref sessionRef) haveFailback() bool { return len(ref.failback) > 0 }

// sessionReference is the session's RDMA-to-RDMA cycles, if the failover
// section ran.
func sessionReference(run *failoverRun) sessionRef {
	var ref sessionRef
	if run == nil {
		return ref
	}
	ref.detection = samples(run, toRDMA, phaseMoved, func(c cycle) time.Duration { return c.detection })
	ref.moved = samples(run, toRDMA, phaseMoved, func(c cycle) time.Duration { return c.detection + c.resume })
	ref.stall = samples(run, toRDMA, phaseMoved, func(c cycle) time.Duration { return c.stall })
	ref.failback = samples(run, toRDMA, phaseFailback, func(c cycle) time.Duration { return c.failback })
	ref.failbackPause = samples(run, toRDMA, phaseFailback, func(c cycle) time.Duration { return c.failbackPause })
	if vs := samples(run, toRDMA, phaseDuring, func(c cycle) float64 { return c.during }); len(vs) > 0 {
		ref.during = benchkit.NearestRank(vs, 50)
		ref.before = benchkit.NearestRank(samples(run, toRDMA, phaseBefore, func(c cycle) float64 { return c.before }), 50)
		ref.haveRate = true
	}
	return ref
}

// refCell is a session's figure: the p50 (nearest rank) of its cycles,
// their number and range; "–" if none got that far.
func refCell(vs []time.Duration) string {
	switch len(vs) {
	case 0:
		return "–"
	case 1:
		return secs(vs[0]) + " (1)"
	}
	return fmt.Sprintf("%s (%d; %s–%s)", secs(benchkit.NearestRank(vs, 50)), len(vs), secs(vs[0]), secs(vs[len(vs)-1]))
}

// timeRatio is a ÷ b, or "–".
func timeRatio(a, b time.Duration, ok bool) string {
	if !ok || a < 0 || b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", float64(a)/float64(b))
}

// groupsSection writes the section.
func (r report) groupsSection(w *strings.Builder) {
	run := r.groups
	if run == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	s := r.set
	paths := s.env.Paths()
	p("## Link groups (issue 25)\n\n")
	p("Between two rdmanet processes the first dial to a listener makes a *link group*: an RDMA connection on each path to it "+
		"(the address dialed and `Dialer.FailoverAddrs`); every later dial to it opens a *stream* in the group, one message and its answer, "+
		"with no queue pair, rdma_cm exchange or registration of its own (docs/engine.md, \"Link groups\"). Groups are the default; "+
		"with `Config.NoLinkGroups` each connection has a queue pair of its own, as every rdmanet row outside this section has. "+
		"Everything here runs in labbench's process, clients on A, listeners on B, in the same run as the rest; every rdmanet end is checked "+
		"to be what its row says (`ConnInfo.Stream`: a group's stream, or a connection of its own). "+
		"The first and third tables' figures are each the best of the section's rounds (%d of %d asked for, `-rounds`), as the comparison's, "+
		"and the second's medians; "+
		"the failover is made once, after the first round. `bin/rdmanet-lab -m 8192 bin/labbench -only %s` runs the section alone "+
		"(`-only %s,%s` with the failover section, the session's reference).\n\n",
		run.rounds, run.asked, groupsID, groupsID, failoverID)
	if run.skipped != "" {
		p("**Not measured**: %s.\n\n", run.skipped)
		return
	}

	// Connections opened a second.
	p("**Connections opened a second.** Each connection: dialed from %s to a listener on %s, a one-byte write echoed back by the server, "+
		"then closed by both ends; %d dials at a time, %d connections a figure. The first connection to a new listener (which makes the group, "+
		"its link's queue pair at each end, then opens the stream in it) is measured on %d listeners made beforehand, each dialed once. "+
		"Opened a second: connections over the time from the first dial to the last one's Close; open p50 and p99 (nearest rank): one connection's "+
		"dial and round trip, while the others are in flight. Before the other rows' figures one connection is opened and closed, not counted: "+
		"the device's first use, and for the stream row the group its streams open in. rdmanet's listeners listen on \"rdma\"; the Configs are "+
		"the default but in the row of its own, which is `Config{NoLinkGroups: true}`. As rdmanet/group_bench_test.go's BenchmarkLabGroupDial. "+
		"Issue 25's target: a stream of a group that exists opens at least 0.5 × as fast as Go's TCP dials.\n\n",
		s.env.AddrA, s.env.AddrB, groupsParallel, max(1, int(float64(groupsDials)*s.scale+0.5)), max(1, int(float64(groupsFirstDials)*s.scale+0.5)))
	tcp := bestDial(run.dial[dialTCP])
	var rows [][]string
	for _, subj := range dialSubjects {
		f := bestDial(run.dial[subj])
		if !f.ok() {
			rows = append(rows, []string{subj.String(), "–", cellMissing, "–", "–", "–", dialTarget(subj, f, tcp)})
			continue
		}
		ratio := "–"
		if tcp.ok() && tcp.rate() > 0 {
			ratio = fmt.Sprintf("%.2f", f.rate()/tcp.rate())
		}
		rows = append(rows, []string{subj.String(), thousands(f.opened), sig(f.rate()), ratio,
			secs(benchkit.NearestRank(f.lats, 50)), secs(benchkit.NearestRank(f.lats, 99)), dialTarget(subj, f, tcp)})
	}
	table(w, []string{"", "connections", "opened a second", "÷ Go's TCP", "open p50", "open p99", "target"}, rows)

	// Round trip and throughput.
	p("**A stream's round trip and throughput**, beside a connection with a queue pair of its own, as the comparison's rows: "+
		"a pair per measurement, %d round trips of 64 B (p50 and p99 by nearest rank, after 20 unmeasured), and %s streamed one way "+
		"in 64 KiB writes into a 256 KiB read buffer. The connection of its own is `Config{NoLinkGroups: true}`'s; the stream is the default Config's "+
		"to a listener of the pair's own, so its dial makes the group and the stream is the group's first (a later stream's data path "+
		"is the same). Each round measures the connection of its own and then the stream, %d times over (a pair each time): "+
		"the figures are the medians over every round (the lower middle one of an even count), and the ratio is the median of "+
		"the pairs' ratios, with their range. "+
		"Issue 25's target: within 5%%, the stream's round trip at most 1.05 × and its throughput at least 0.95 × the "+
		"connection's of its own.\n\n",
		s.roundTrips, benchkit.SizeName(int(max(1, int64(float64(streamBytes(groupsStreamSize))*s.scale+0.5)))), groupsRTTPairs)
	rows = nil
	for _, row := range rttRows {
		owns, sts := run.rtt[rttKey{false, row.kind}], run.rtt[rttKey{true, row.kind}]
		own, st := medianFigureOf(owns, row.get), medianFigureOf(sts, row.get)
		have := len(owns) > 0 && len(sts) > 0
		v, ok, why := ratio(st, own, have, row.get)
		ratioCell := "–"
		if rs := pairRatios(owns, sts, row.get); len(rs) > 0 {
			v, ok, why = lowerMedian(rs), true, ""
			ratioCell = fmt.Sprintf("%.2f (1 pair)", v)
			if len(rs) > 1 {
				ratioCell = fmt.Sprintf("%.2f (%d pairs: %.2f–%.2f)", v, len(rs), slices.Min(rs), slices.Max(rs))
			}
		} else if ok {
			ratioCell = fmt.Sprintf("%.2f", v)
		}
		tcell := ""
		if row.target {
			t := target{text: "≤ 1.05 × its own", ratio: v, ok: ok, met: v <= 1.05, why: why}
			if row.higher {
				t = target{text: "≥ 0.95 × its own", ratio: v, ok: ok, met: v >= 0.95, why: why}
			}
			tcell = t.String()
		}
		rows = append(rows, []string{row.name, cell(own, have, row.format), cell(st, have, row.format), ratioCell, tcell})
	}
	table(w, []string{"", "a queue pair of its own", "a group's stream", "stream ÷ own", "target"}, rows)

	// Aggregate over two paths and one.
	p("**%d streams of one group at once, over two paths and over one.** A listener on every address, RDMA and TCP; %d streams dialed "+
		"from A's path 1 address (%s) to B's (%s). Over two paths, with `Dialer.FailoverAddrs` B's path 2 address (%s) and "+
		"`GroupSpread: SpreadLeastStreams` (the default): the group has a link on each path and the streams sit 4 and 4 on them. "+
		"Over one path, with no failover address: the group has path 1's link alone. `rdmanet.Groups()` is checked to show the streams "+
		"so placed, unchanged for %v, before they start, and again after. "+
		"Each stream moves %s one way in 64 KiB writes, all at once; the aggregate is every byte over the time until the last was read. "+
		"**Both rxe paths are software on the VM's one emulated CPU** (and its kernel): a second path adds no hardware here, so the ratio "+
		"is what spreading costs or gains in software, not what a second NIC would give.\n\n",
		groupsAggStreams, groupsAggStreams, paths[0].A, paths[0].B, paths[1].B, groupsStable,
		benchkit.SizeName(int(max(1, int64(float64(groupsAggBytes)*s.scale+0.5))/groupsAggStreams)))
	one := bestAgg(run.agg[aggOnePath])
	rows = nil
	for _, subj := range aggSubjects {
		f := bestAgg(run.agg[subj])
		if !f.ok() {
			rows = append(rows, []string{subj.String(), "–", cellMissing, "–"})
			continue
		}
		ratio := "–"
		if one.ok() && one.mbps > 0 {
			ratio = fmt.Sprintf("%.2f", f.mbps/one.mbps)
		}
		rows = append(rows, []string{subj.String(), f.links, mbps(f.mbps), ratio})
	}
	table(w, []string{"", "the group's links (streams on each)", "aggregate", "÷ one path"}, rows)

	r.groupFailoverPart(w)

	r.groupsRounds(w)
}

// dialTarget is the rate row's target cell: the stream's only.
func dialTarget(subj dialSubject, f, tcp dialFigure) string {
	if subj != dialStream {
		return ""
	}
	t := target{text: "≥ 0.5 × Go's TCP"}
	switch {
	case !f.ok():
		t.why = "the stream's figure is missing"
	case !tcp.ok() || tcp.rate() == 0:
		t.why = "Go's TCP figure is missing"
	default:
		t.ok, t.ratio = true, f.rate()/tcp.rate()
		t.met = t.ratio >= 0.5
	}
	return t.String()
}

// groupFailoverPart writes the failover's table beside the session's.
func (r report) groupFailoverPart(w *strings.Builder) {
	run := r.groups
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("**A group of %d streams through path 1's failure.** %d streams of one group, dialed as above over two paths (`%s` on both sides: "+
		"the failover section's KeepAlive, so that both find a dead path alike), sit 50 and 50 on the two paths (unchanged for %v); each streams from client to server "+
		"at full speed (%s writes; the server end reads into a %s buffer and notes when each read completes). After %v of throughput "+
		"(before), netem drops every packet on both netdevs of path 1 (`labenv.Path.Drop`), T0 being when the first dropped; `rdmanet.Groups()` "+
		"is polled every %v for path 1's link counted down, the first stream moved, and every stream on path 2's link with none suspended "+
		"and the moves counted (every stream moved). The **stall** is each stream's longest time between read completions at its server end, "+
		"from its last read before T0 to %v after every stream moved; the table gives the longest over the streams. "+
		"Then %v of throughput on path 2 (during); path 1 heals (T1, both netdevs clear), and the group makes its link there again and "+
		"moves half the streams back (**failback**: T1 to half back, none suspended), with the stall of that move measured alike; "+
		"%v of throughput (after). At the end every stream half-closes and its server end reads to EOF: every byte must arrive. "+
		"The session's column is the failover section's RDMA-to-RDMA cycles in this run (p50 by nearest rank), one session streaming alone "+
		"on path 1 with path 2 to move to; its \"first moved\" and \"every stream moved\" are its one move (detection plus resume). "+
		"The failbacks differ in kind: a session tries one on its FailbackInterval's schedule (doubling while path 1 is down), "+
		"a group makes a lost path's link again at once and then with backoff (100 ms, doubling, up to 5 s), whatever its Config. "+
		"Issue 25's target: the group's longest stall with %d streams no worse than one session's.\n\n",
		groupsFailoverStreams, groupsFailoverStreams, describeConfig(groupsFailoverConfig), groupsStable,
		benchkit.SizeName(groupsFailoverWrite), benchkit.SizeName(groupsFailoverRead),
		rateWindow, failoverPoll, stallTail, rateWindow, rateWindow, groupsFailoverStreams)
	gf := run.failover
	if gf == nil {
		why := run.failoverSkipped
		if why == "" {
			why = "the section's first round did not end"
		}
		p("**Not measured**: %s.\n\n", why)
		return
	}
	ref := sessionReference(r.failover)
	refWhy := "the failover section did not run in this run (`-only` without `failover`, or `-failover-cycles 0`)"
	if r.failover != nil && !ref.haveOK() {
		refWhy = "no RDMA-to-RDMA cycle of the failover section got as far as its move"
	}
	p50 := func(vs []time.Duration) time.Duration { return benchkit.NearestRank(vs, 50) }
	header := []string{"", fmt.Sprintf("group of %d streams", gf.streams), "one session: p50 (n; range)", "group ÷ session p50"}
	var rows [][]string
	moved := gf.reached >= gfMoved
	back := gf.reached >= gfBack
	cellIf := func(ok bool, d time.Duration) string {
		if !ok {
			return "–"
		}
		return optSecs(d)
	}
	rows = append(rows,
		[]string{"path 1 found dead (T0 to the group's link counted down; the session's detection)", cellIf(moved || gf.linkDown >= 0, gf.linkDown),
			refCell(ref.detection), timeRatio(gf.linkDown, p50(ref.detection), ref.haveOK() && (moved || gf.linkDown >= 0))},
		[]string{"the first stream moved (the session: its move)", cellIf(moved || gf.firstMove >= 0, gf.firstMove),
			refCell(ref.moved), timeRatio(gf.firstMove, p50(ref.moved), ref.haveOK() && (moved || gf.firstMove >= 0))},
		[]string{"every stream moved", cellIf(moved, gf.allMoved), refCell(ref.moved), timeRatio(gf.allMoved, p50(ref.moved), ref.haveOK() && moved)},
		[]string{"stall: the longest wait for data (the group: over its streams)", cellIf(moved, gf.stallMax), refCell(ref.stall),
			timeRatio(gf.stallMax, p50(ref.stall), ref.haveOK() && moved)},
		[]string{"failback: path 1 healed to back on it (the group: half the streams)", cellIf(back, gf.failback),
			refCell(ref.failback), timeRatio(gf.failback, p50(ref.failback), ref.haveFailback() && back)},
		[]string{"the failback's pause (the group: the longest wait for data over its streams; the session: its LastMove.Pause)",
			cellIf(back, gf.failbackStall), refCell(ref.failbackPause), "–"},
	)
	table(w, header, rows)

	st := target{text: fmt.Sprintf("the group's longest stall with %d streams ≤ one session's (p50)", gf.streams)}
	switch {
	case !moved:
		st.why = "the group's failover did not get as far as its stall"
	case !ref.haveOK():
		st.why = refWhy
	default:
		st.ok, st.ratio = true, float64(gf.stallMax)/float64(p50(ref.stall))
		st.met = gf.stallMax <= p50(ref.stall)
	}
	p("Target: %s.", st)
	if !ref.haveOK() && moved {
		p(" (No session's reference: %s.)", refWhy)
	}
	p("\n\n")

	var notes []string
	if moved {
		notes = append(notes, fmt.Sprintf("%d streams were on path 1's link at T0; %d moves counted until every stream was on %s; "+
			"the median stream's stall was %s; the longest of the streams that moved (from path 1) was %s, of those that stayed on path 2 %s; "+
			"with no fault (the before window) the longest gap any stream saw between reads was %s",
			gf.onPath1, gf.moved, gf.movedTo, secs(gf.stallP50), secsOrNone(gf.stallMovedMax), secsOrNone(gf.stallStayedMax), secs(gf.quietStall)))
	}
	if gf.reached >= gfBack {
		notes = append(notes, fmt.Sprintf("the failback moved %d streams", gf.movedBack))
	}
	var rates []string
	for _, rt := range []struct {
		ph   gfPhase
		name string
		v    float64
	}{{gfBefore, "before (both paths)", gf.before}, {gfDuring, "during (path 2 alone)", gf.during}, {gfAfter, "after (both paths)", gf.after}} {
		if gf.reached >= rt.ph {
			rates = append(rates, fmt.Sprintf("%s %s MB/s", rt.name, sig(rt.v)))
		}
	}
	if len(rates) > 0 {
		line := "the server ends read, together, " + strings.Join(rates, ", ")
		if gf.reached >= gfDuring && gf.before > 0 {
			line += fmt.Sprintf(" (during ÷ before %.2f", gf.during/gf.before)
			if ref.haveRate && ref.before > 0 {
				line += fmt.Sprintf("; the session's, on one path: %.2f", ref.during/ref.before)
			}
			line += ")"
		}
		notes = append(notes, line)
	}
	for _, n := range notes {
		p("- %s.\n", n)
	}
	if len(notes) > 0 {
		p("\n")
	}
	switch {
	case gf.failed != "":
		p("**The failover failed** %s: %s\n\n", failedAt(gf.reached), oneLine(gf.failed))
	default:
		p("**The failover completed** in %.0f s.", gf.took.Seconds())
		if gf.endProblem == "" {
			p(" At the end every server end had read every byte its client wrote (%s MB in all).", sig(float64(gf.bytes)/1e6))
		}
		p("\n\n")
	}
	if gf.endProblem != "" {
		p("- **failed**: the streams' end: %s\n\n", oneLine(gf.endProblem))
	}
}

// failedAt says how far a failover got before it failed.
func failedAt(ph gfPhase) string {
	switch ph {
	case gfNone:
		return "before its first figure"
	case gfBefore:
		return "after its throughput before the fault"
	case gfMoved:
		return "after every stream moved"
	case gfDuring:
		return "after its throughput on path 2"
	case gfBack:
		return "after the failback"
	}
	return "after its last figure"
}

// groupsRounds writes every round's figures.
func (r report) groupsRounds(w *strings.Builder) {
	run := r.groups
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("<details><summary>Every round of the link groups section</summary>\n\n")
	for _, subj := range dialSubjects {
		var vs []string
		for _, f := range run.dial[subj] {
			if f.ok() {
				vs = append(vs, fmt.Sprintf("%s a second (%d in %.1fs)", sig(f.rate()), f.opened, f.wall.Seconds()))
			} else {
				vs = append(vs, "failed: "+oneLine(f.missing))
			}
		}
		p("- connections, %s: %s\n", subj, strings.Join(vs, "; "))
	}
	for _, row := range []struct {
		name string
		k    rttKey
	}{
		{"round trip 64 B, " + groupModeOwn.Name, rttKey{false, pingpong}},
		{"round trip 64 B, " + groupModeStream.Name, rttKey{true, pingpong}},
		{"stream 64 KiB, " + groupModeOwn.Name, rttKey{false, stream}},
		{"stream 64 KiB, " + groupModeStream.Name, rttKey{true, stream}},
	} {
		fs := run.rtt[row.k]
		if len(fs) == 0 {
			continue
		}
		unit := "µs p50"
		if row.k.kind == stream {
			unit = "MB/s"
		}
		p("- %s: %s; rounds: %s %s\n", row.name, combine(fs).how, roundValues(fs), unit)
	}
	for _, subj := range aggSubjects {
		var vs []string
		for _, f := range run.agg[subj] {
			if f.ok() {
				v := fmt.Sprintf("%s MB/s (%s; %.1fs)", sig(f.mbps), f.links, f.elapsed.Seconds())
				if f.note != "" {
					v += " (" + oneLine(f.note) + ")"
				}
				vs = append(vs, v)
			} else {
				vs = append(vs, "failed: "+oneLine(f.missing))
			}
		}
		p("- %s: %s\n", subj, strings.Join(vs, "; "))
	}
	if gf := run.failover; gf != nil {
		p("- failover of %d streams: %s\n", gf.streams, oneLine(gf.summary()))
	}
	p("\n</details>\n\n")
}

// failedCount counts the section's failures: measurements (of every
// round) that failed, a failover that failed or whose streams did not
// end with every byte read, and a section not measured.
func (run *groupsRun) failedCount() int {
	if run == nil {
		return 0
	}
	n := 0
	if run.skipped != "" {
		n++
	}
	for _, fs := range run.dial {
		for _, f := range fs {
			if !f.ok() {
				n++
			}
		}
	}
	for _, fs := range run.rtt {
		for _, f := range fs {
			if !f.ok() {
				n++
			}
		}
	}
	for _, fs := range run.agg {
		for _, f := range fs {
			if !f.ok() {
				n++
			}
		}
	}
	if gf := run.failover; gf != nil {
		if gf.failed != "" {
			n++
		}
		if gf.endProblem != "" {
			n++
		}
	}
	return n
}

// groupsProblems lists the section's failures, notes and what was not
// measured, for the report's list of problems.
func (r report) groupsProblems(b *strings.Builder) {
	run := r.groups
	if run == nil {
		return
	}
	line := func(format string, args ...any) { fmt.Fprintf(b, "- link groups: "+format+"\n", args...) }
	if run.skipped != "" {
		line("not measured: %s.", oneLine(run.skipped))
		return
	}
	for _, subj := range dialSubjects {
		for i, f := range run.dial[subj] {
			if !f.ok() {
				line("connections, %s, round %d: %s", subj, i+1, oneLine(f.missing))
			}
			if f.note != "" {
				line("note: connections, %s, round %d: %s", subj, i+1, oneLine(f.note))
			}
		}
	}
	for _, row := range rttRows {
		if row.name == "round trip, 64 B, p99" {
			continue
		}
		for _, st := range []bool{false, true} {
			name := groupModeOwn.Name
			if st {
				name = groupModeStream.Name
			}
			for i, f := range run.rtt[rttKey{st, row.kind}] {
				if !f.ok() {
					line("%s, %s, round %d: %s", strings.SplitN(row.name, ",", 2)[0], name, i+1, oneLine(f.missing))
				}
			}
		}
	}
	for _, subj := range aggSubjects {
		for i, f := range run.agg[subj] {
			if !f.ok() {
				line("%s, round %d: %s", subj, i+1, oneLine(f.missing))
			}
			if f.note != "" {
				line("note: %s, round %d: %s", subj, i+1, oneLine(f.note))
			}
		}
	}
	if run.rounds < run.asked && run.roundsWhy != "" {
		line("%d rounds of the %d asked for: %s.", run.rounds, run.asked, run.roundsWhy)
	}
	switch gf := run.failover; {
	case gf == nil:
		line("the failover was not measured: %s.", oneLine(run.failoverSkipped))
	case gf.failed != "":
		line("the failover failed %s: %s", failedAt(gf.reached), oneLine(gf.failed))
	}
	if gf := run.failover; gf != nil && gf.endProblem != "" {
		line("the failover's streams: %s", oneLine(gf.endProblem))
	}
}

// medianFigureOf is the figure whose get is the median of those of fs
// that succeeded (the lower middle one of an even count), or combine's
// missing figure if none did.
func medianFigureOf(fs []figure, get func(figure) float64) figure {
	var oks []figure
	for _, f := range fs {
		if f.ok() {
			oks = append(oks, f)
		}
	}
	if len(oks) == 0 {
		return combine(fs)
	}
	slices.SortStableFunc(oks, func(a, b figure) int { return cmp.Compare(get(a), get(b)) })
	return oks[(len(oks)-1)/2]
}

// pairRatios is st[i]'s get over own[i]'s, for each pair measured one
// after the other in which both succeeded.
func pairRatios(own, st []figure, get func(figure) float64) []float64 {
	var rs []float64
	for i := range min(len(own), len(st)) {
		if own[i].ok() && st[i].ok() && get(own[i]) != 0 {
			rs = append(rs, get(st[i])/get(own[i]))
		}
	}
	return rs
}
