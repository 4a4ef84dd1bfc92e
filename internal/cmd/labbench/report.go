package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
)

// endMarker is the report's last line: `make bench` installs the report only
// if it ends with it, so a run cut short never replaces BENCHMARKS.md.
const endMarker = "<!-- labbench: end of report -->"

// report is everything the Markdown is made from.
type report struct {
	set    setting
	impls  []impl
	rounds map[key][]figure // every measurement
	res    map[key]figure   // the figures: the rounds combined

	failover    *failoverRun // nil if the section was not measured
	storage     *storageRun  // likewise
	connections *connsRun    // likewise
	groups      *groupsRun   // likewise
}

func (b *bench) report() report {
	r := report{set: b.setting(), impls: b.impls, rounds: b.res, res: map[key]figure{}, failover: b.failover, storage: b.storage, connections: b.connections, groups: b.groups}
	for k, fs := range b.res {
		r.res[k] = combine(fs)
	}
	return r
}

// noisy is the ratio between the highest and the lowest of a figure's
// rounds above which the report points the spread out.
const noisy = 1.5

// combine makes one figure of a measurement's rounds: the best of each value
// over the rounds that succeeded (the highest throughput, the lowest round
// trip), as other processes on the host only ever slow a measurement down.
// It is missing only if every round failed, and doubtful if any round was.
func combine(rounds []figure) figure {
	var oks []figure
	for _, f := range rounds {
		if f.ok() {
			oks = append(oks, f)
		}
	}
	how := ""
	for _, f := range rounds {
		if how == "" {
			how = f.how
		}
	}
	if len(oks) == 0 {
		if len(rounds) == 1 {
			return rounds[0]
		}
		return figure{how: how, missing: fmt.Sprintf("all %d rounds failed", len(rounds))}
	}
	c := figure{hasPct: oks[0].hasPct, how: how}
	best := func(get func(figure) float64, higher bool) float64 {
		v := make([]float64, len(oks))
		for i, f := range oks {
			v[i] = get(f)
		}
		if higher {
			return slices.Max(v)
		}
		return slices.Min(v)
	}
	c.mbps = best(func(f figure) float64 { return f.mbps }, true)
	c.p50 = best(func(f figure) float64 { return f.p50 }, false)
	c.p99 = best(func(f figure) float64 { return f.p99 }, false)
	c.mean = best(func(f figure) float64 { return f.mean }, false)
	for _, f := range oks {
		if f.doubt != "" {
			c.doubt = f.doubt
		}
	}
	for _, f := range rounds {
		c.elapsed += f.elapsed
	}
	return c
}

// lowerMedian is the median of vs, the lower middle one of an even count;
// it sorts vs.
func lowerMedian(vs []float64) float64 {
	slices.Sort(vs)
	return vs[(len(vs)-1)/2]
}

// primary is a figure's main value: throughput, or the round trip's p50 (its
// mean for tools that report only that).
func primary(f figure) float64 {
	switch {
	case f.mbps != 0:
		return f.mbps
	case f.hasPct:
		return f.p50
	}
	return f.mean
}

// spread is the highest of the rounds' primary values over the lowest.
func spread(rounds []figure) float64 {
	lo, hi := math.Inf(1), 0.0
	for _, f := range rounds {
		if f.ok() {
			lo, hi = min(lo, primary(f)), max(hi, primary(f))
		}
	}
	if hi == 0 {
		return 1
	}
	return hi / lo
}

func (r report) total() int { return len(r.res) + r.storage.total() }

// failed counts the measurements (of every round) that failed, the
// failover section's failed cycles and sessions, the storage section's
// missing figures, the connections section's steps that were not
// measured or after which the process did not come back to its baseline,
// and the link groups section's failures (groupsRun.failedCount).
func (r report) failed() int {
	n := r.storage.missing() + r.connections.problemSteps() + r.groups.failedCount()
	if r.failover != nil {
		n += r.failover.failedCycles() + r.failover.badSessions()
	}
	for _, fs := range r.rounds {
		for _, f := range fs {
			if !f.ok() {
				n++
			}
		}
	}
	return n
}

func (r report) missing() int {
	n := r.storage.missing()
	for _, f := range r.res {
		if !f.ok() {
			n++
		}
	}
	return n
}

// byRole returns the first implementation with the role.
func (r report) byRole(ro role) (impl, bool) {
	for _, im := range r.impls {
		if im.role == ro {
			return im, true
		}
	}
	return impl{}, false
}

// sig formats v with 3 significant digits (and no exponent).
func sig(v float64) string {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Sprint(v)
	}
	d := 2 - int(math.Floor(math.Log10(math.Abs(v))))
	if d < 0 {
		d = 0
	}
	return fmt.Sprintf("%.*f", d, v)
}

func mbps(v float64) string { return sig(v) + " MB/s (" + sig(v*8/1e3) + " Gb/s)" }

func usec(v float64) string { return sig(v) + " µs" }

const (
	cellMissing = "**missing**"
	cellNA      = "n/a"
)

// cell formats one figure for the tables; get picks the value.
func cell(f figure, have bool, get func(figure) string) string {
	switch {
	case !have:
		return cellNA
	case !f.ok():
		return cellMissing
	case f.doubt != "":
		return get(f) + " (doubtful)"
	}
	return get(f)
}

func (r report) markdown() string {
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	s := r.set

	p("# rdmanet benchmarks\n\n")
	p("<!-- Written by `make bench` (internal/cmd/labbench); do not edit by hand. -->\n\n")
	p("Measured on %s by labbench (`make bench`) in the rdmanet lab: %s in a QEMU VM under TCG "+
		"(software emulation; %d vCPUs, CPU model %q), Soft-RoCE (rdma_rxe) and Soft-iWARP (siw)",
		s.when.Format("2006-01-02 15:04 MST"), s.kernel, s.cpus, s.cpu)
	if s.host != "" {
		p(", on a host with %s", s.host)
	}
	p(". ")
	if r.hasRXE() || len(r.impls) == 0 { // the siw section says where its own clients and servers are
		p("Every client is on %s (%s) and every server on %s (%s), in the one VM: "+
			"RDMA goes through rxe's loopback path, TCP through the kernel's loopback. ",
			s.env.AddrA, s.env.DevA, s.env.AddrB, s.env.DevB)
		if len(r.siwImpls()) > 0 {
			p("The siw section's are on the iWARP pair. ")
		}
	}
	p("rdmanet %s, Go %s, %s. ",
		s.revision, strings.TrimPrefix(s.goVersion, "go"), orUnknown(s.tools, "tool versions unknown"))
	if len(r.impls) > 0 {
		p("Each figure of the comparison is the best of %d rounds of its measurement "+
			"(other processes on the host only ever slow a measurement down)", s.rounds)
		if s.targetRounds > s.rounds {
			p(", issue 26's target rows and their references of %d", s.targetRounds)
		}
		p("; the run took %s.\n\n", s.took.Round(time.Second))
	} else {
		p("The run took %s.\n\n", s.took.Round(time.Second))
	}
	p("**Only ratios within one run mean anything.** The CPU is emulated: absolute figures say " +
		"nothing about RDMA hardware, and figures from different runs are not comparable.\n\n")
	if s.scale != 1 {
		p("**A trial run:** every amount was scaled by %v (`-scale`).\n\n", s.scale)
	}

	if r.hasRXE() { // else only other sections were asked for (-only)
		r.targets(&w)
		r.throughputTable(&w)
		r.latencyTable(&w)
	}
	r.siwSection(&w)
	r.failoverSection(&w)
	r.groupsSection(&w)
	r.storageSection(&w)
	r.connectionsSection(&w)
	if len(r.impls) > 0 {
		r.method(&w)
	}
	r.problems(&w)
	p("%s\n", endMarker)
	return w.String()
}

func orUnknown(s, unknown string) string {
	if s == "" {
		return unknown
	}
	return s
}

// ---- targets -------------------------------------------------------------------

// target is one of issue 3's targets, as it applies to a row.
type target struct {
	text  string
	ratio float64 // of the row's rdmanet figure to its reference
	ok    bool    // the reference figure exists
	met   bool
	why   string // why it cannot be evaluated
}

func (t target) String() string {
	switch {
	case !t.ok:
		return t.text + ": cannot tell (" + t.why + ")"
	case t.met:
		return t.text + ": met"
	}
	return t.text + ": **not met**"
}

// targets writes, per rdmanet mode, each figure with its ratios to perftest
// and rsockets and issue 3's targets.
func (r report) targets(w *strings.Builder) {
	pt, havePT := r.byRole(rolePerftest)
	rs, haveRS := r.byRole(roleRsockets)
	var rows [][]string
	counts := map[string]int{}
	for _, im := range r.impls {
		if im.role != roleRDMANet {
			continue
		}
		mode := strings.TrimPrefix(im.id, "rdmanet/")
		for _, size := range benchkit.StreamSizes {
			if im.stream == nil {
				break
			}
			k := func(id string) key { return key{id, stream, size} }
			f := r.res[k(im.id)]
			fpt, frs := r.res[k(pt.id)], r.res[k(rs.id)]
			get := func(f figure) float64 { return f.mbps }
			ptR, ptOK, ptWhy := ratio(f, fpt, havePT, get)
			rsR, rsOK, rsWhy := ratio(f, frs, haveRS, get)
			var ts []target
			if issue26Target(key{im.id, stream, size}) {
				ts = append(ts, target{text: "≥ 0.95 × ib_write_bw (issue 26)", ratio: ptR, ok: ptOK, met: ptR >= 0.95, why: ptWhy})
			} else if size == 64<<10 {
				ts = append(ts, target{text: "≥ 0.9 × ib_write_bw", ratio: ptR, ok: ptOK, met: ptR >= 0.9, why: ptWhy})
			}
			ts = append(ts, target{text: "≥ rsockets", ratio: rsR, ok: rsOK, met: rsR >= 1, why: rsWhy})
			rows = append(rows, r.targetRow(mode, "stream, "+benchkit.SizeName(size)+" writes",
				f, fpt, frs, havePT, haveRS, mbpsOf, ptR, ptOK, rsR, rsOK, ts, counts))
		}
		for _, size := range benchkit.PingPongSizes {
			if im.pingpong == nil {
				break
			}
			k := func(id string) key { return key{id, pingpong, size} }
			f := r.res[k(im.id)]
			fpt, frs := r.res[k(pt.id)], r.res[k(rs.id)]
			for _, stat := range []struct {
				name string
				get  func(figure) float64
				pct  bool // a percentile, which rstream does not report
			}{
				{"p50", func(f figure) float64 { return f.p50 }, true},
				{"p99", func(f figure) float64 { return f.p99 }, true},
				{"mean", func(f figure) float64 { return f.mean }, false},
			} {
				ptR, ptOK, ptWhy := ratio(f, fpt, havePT, stat.get)
				rsHas := haveRS && !(stat.pct && rs.meanOnly)
				rsR, rsOK, rsWhy := ratio(f, frs, rsHas, stat.get)
				if haveRS && !rsHas {
					rsWhy = "rstream reports only a mean"
				}
				var ts []target
				if size == 64 && stat.name == "p50" {
					ts = append(ts, target{text: "≤ 1.5 × ib_send_lat", ratio: ptR, ok: ptOK, met: ptR <= 1.5, why: ptWhy})
					if issue26Target(key{im.id, pingpong, size}) {
						ts = append(ts, target{text: "≤ 1.3 × ib_send_lat (issue 26)", ratio: ptR, ok: ptOK, met: ptR <= 1.3, why: ptWhy})
					}
				}
				ts = append(ts, target{text: "≤ rsockets", ratio: rsR, ok: rsOK, met: rsR <= 1, why: rsWhy})
				format := func(f figure) string { return usec(stat.get(f)) }
				rows = append(rows, r.targetRow(mode, "round trip, "+benchkit.SizeName(size)+", "+stat.name,
					f, fpt, frs, havePT, rsHas, format, ptR, ptOK, rsR, rsOK, ts, counts))
			}
		}
	}
	fmt.Fprintf(w, "## Targets\n\n")
	fmt.Fprintf(w, "Issue 3's targets for rdmanet, per mode: stream throughput at least 0.9 × ib_write_bw's "+
		"for 64 KiB writes; a 64 B round trip at most 1.5 × ib_send_lat's (the p50 against its typical "+
		"figure, both as round trips); and at least as good as rsockets on every row. "+
		"Issue 26's, on the rows it names: the zero-copy mode's 64 KiB stream at least 0.95 × ib_write_bw's "+
		"(in place of issue 3's 0.9), and the busy-polling mode's 64 B round trip at most 1.3 × ib_send_lat's "+
		"(beside issue 3's 1.5). "+
		"Ratios are rdmanet's figure divided by the other's: above 1 is better for throughput, "+
		"below 1 for round trips. rstream reports only a mean round trip, so the p50 and p99 rows "+
		"have no rsockets figure. "+ownQueuePairNote+"\n\n")
	fmt.Fprintf(w, "**%d met, %d not met, %d cannot tell.**\n\n", counts["met"], counts["not met"], counts["cannot tell"])
	table(w, []string{"rdmanet mode", "figure", "rdmanet", "perftest", "÷ perftest", "rsockets", "÷ rsockets", "targets"}, rows)
}

func mbpsOf(f figure) string { return mbps(f.mbps) }

// ownQueuePairNote says what every rdmanet row of the comparison is.
const ownQueuePairNote = "Every rdmanet row is a connection with a queue pair of its own: each mode's Config has " +
	"`NoLinkGroups: true`, and each end is checked not to be a link group's stream. Only the rdmanet mode needs it: " +
	"since link groups became rdmanet's default (issue 25), its default Config would make a stream of a group; " +
	"the rows stay what they measured in earlier runs, and the Link groups section measures a group's stream beside them."

// ratio is get(f)/get(ref), if both figures exist.
func ratio(f, ref figure, have bool, get func(figure) float64) (float64, bool, string) {
	switch {
	case !have:
		return 0, false, "not measured in this run"
	case !f.ok():
		return 0, false, "rdmanet's figure is missing"
	case !ref.ok():
		return 0, false, "the reference figure is missing"
	case get(ref) == 0:
		return 0, false, "the reference figure is zero"
	}
	return get(f) / get(ref), true, ""
}

func (r report) targetRow(mode, what string, f, fpt, frs figure, havePT, haveRS bool, format func(figure) string,
	ptR float64, ptOK bool, rsR float64, rsOK bool, ts []target, counts map[string]int) []string {
	ratioCell := func(v float64, ok bool) string {
		if !ok {
			return "–"
		}
		return fmt.Sprintf("%.2f", v)
	}
	var tcells []string
	for _, t := range ts {
		tcells = append(tcells, t.String())
		switch {
		case !t.ok:
			counts["cannot tell"]++
		case t.met:
			counts["met"]++
		default:
			counts["not met"]++
		}
	}
	return []string{mode, what, cell(f, true, format), cell(fpt, havePT, format), ratioCell(ptR, ptOK),
		cell(frs, haveRS, format), ratioCell(rsR, rsOK), strings.Join(tcells, "; ")}
}

// ---- the figures ---------------------------------------------------------------------

func (r report) throughputTable(w *strings.Builder) {
	fmt.Fprintf(w, "## Stream throughput\n\n")
	fmt.Fprintf(w, "One connection per measurement (rdmanet's: a queue pair of its own, see Targets); MB/s is 10^6 bytes per second, Gb/s 10^9 bits. "+
		"rdmanet and Go: a goroutine writes the bytes in writes of the given size while the other "+
		"end reads them into a 256 KiB buffer, timed from the first write to the last byte read. "+
		"rstream: the client sends its transfers, then the server sends as many back; the rate is "+
		"size ÷ its time per transfer. ib_write_bw: its average bandwidth (RDMA writes, no copy, "+
		"no receiver involvement), converted from MiB/s.\n\n")
	header, rows := r.streamTable(r.rxeImpls())
	amounts := []string{"bytes per measurement (one way)"}
	for _, size := range benchkit.StreamSizes {
		amounts = append(amounts, benchkit.SizeName(int(max(1, int64(math.Round(float64(streamBytes(size))*r.set.scale))))))
	}
	rows = append(rows, amounts)
	table(w, header, rows)
}

func (r report) latencyTable(w *strings.Builder) {
	fmt.Fprintf(w, "## Round trips\n\n")
	fmt.Fprintf(w, "One connection per measurement, %d round trips each. rdmanet and Go: one side writes a message "+
		"and reads it back, the other reads it whole and writes it back; p50 and p99 by nearest rank "+
		"over the round trips (after 20 unmeasured ones). rstream reports only the mean time per "+
		"transfer, which is half a round trip: shown doubled. ib_send_lat reports half a round trip "+
		"too (t_typical, 99%% percentile, t_avg): shown doubled; its typical figure is the median. "+
		"perftest busy-polls its completion queue and rstream retries non-blocking calls (its default), "+
		"both spinning on a CPU; rdmanet and Go wait in the netpoller. The row of ib_send_lat -e, which waits for completion events as rdmanet does, "+
		"shows what waiting costs here; it is no target's reference. The other rows run both ends in labbench's one process; "+
		"the row of rdmanet in two processes runs each end in a child process of its own (the default Config: a link group's stream), "+
		"as users and blockstore do: on the lab's two emulated CPUs the threads each wake-up runs in either process delay the other, "+
		"and its round trips are bimodal (docs/lab.md). Its reference is ib_send_lat -e, which runs as two processes too.\n\n",
		r.set.roundTrips)
	header, rows := r.roundTripTable(r.rxeImpls())
	table(w, header, rows)
}

// streamTable is the stream throughput of impls, a row each, a column per
// write size.
func (r report) streamTable(impls []impl) (header []string, rows [][]string) {
	header = []string{""}
	for _, size := range benchkit.StreamSizes {
		header = append(header, benchkit.SizeName(size)+" writes")
	}
	for _, im := range impls {
		if im.stream == nil {
			continue
		}
		rw := []string{im.labelFor(stream)}
		for _, size := range benchkit.StreamSizes {
			rw = append(rw, cell(r.res[key{im.id, stream, size}], true, mbpsOf))
		}
		rows = append(rows, rw)
	}
	return header, rows
}

// roundTripTable is the round trips of impls: p50, p99 and mean per size
// (percentiles only where the implementation reports them).
func (r report) roundTripTable(impls []impl) (header []string, rows [][]string) {
	header = []string{""}
	for _, size := range benchkit.PingPongSizes {
		n := benchkit.SizeName(size)
		header = append(header, n+" p50", n+" p99", n+" mean")
	}
	for _, im := range impls {
		if im.pingpong == nil {
			continue
		}
		rw := []string{im.labelFor(pingpong)}
		for _, size := range benchkit.PingPongSizes {
			f := r.res[key{im.id, pingpong, size}]
			pct := !im.meanOnly
			rw = append(rw,
				cell(f, pct, func(f figure) string { return usec(f.p50) }),
				cell(f, pct, func(f figure) string { return usec(f.p99) }),
				cell(f, true, func(f figure) string { return usec(f.mean) }))
		}
		rows = append(rows, rw)
	}
	return header, rows
}

// each calls fn for every figure measured, in the tables' order.
func (r report) each(fn func(what string, im impl, k key)) {
	for _, kd := range []kind{stream, pingpong} {
		sizes := benchkit.StreamSizes
		if kd == pingpong {
			sizes = benchkit.PingPongSizes
		}
		for _, size := range sizes {
			for _, im := range r.impls {
				k := key{im.id, kd, size}
				if _, ok := r.rounds[k]; ok {
					fn(fmt.Sprintf("%s %s, %s", kd, benchkit.SizeName(size), im.labelFor(kd)), im, k)
				}
			}
		}
	}
}

// roundValues lists the rounds' primary values, "–" for a failed round.
func roundValues(rounds []figure) string {
	var vs []string
	for _, f := range rounds {
		switch {
		case !f.ok():
			vs = append(vs, "–")
		case f.mbps != 0:
			vs = append(vs, sig(f.mbps))
		default:
			vs = append(vs, sig(primary(f)))
		}
	}
	return strings.Join(vs, ", ")
}

// method lists what was run for each figure.
func (r report) method(w *strings.Builder) {
	fmt.Fprintf(w, "## How\n\n")
	fmt.Fprintf(w, "`make bench` runs `bin/rdmanet-lab bin/labbench` (internal/cmd/labbench). "+
		"rdmanet and Go's TCP run in its process (shared code: internal/benchkit, also used by "+
		"rdmanet/bench_test.go); the other tools run as a server, then a client. "+
		"perftest's -F skips its CPU frequency check, which an emulated CPU fails. "+
		"The rounds run one after the other; within a round, one size at a time across the tools.\n\n")
	fmt.Fprintf(w, "<details><summary>Every figure's set-up or commands, and its rounds</summary>\n\n")
	r.each(func(what string, im impl, k key) {
		rounds := r.rounds[k]
		how := r.res[k].how
		if how == "" {
			how = "(not run)"
		}
		unit := "MB/s"
		if k.kind == pingpong {
			unit = "µs p50"
			if im.meanOnly {
				unit = "µs mean"
			}
		}
		var took time.Duration
		for _, f := range rounds {
			took += f.elapsed
		}
		fmt.Fprintf(w, "- %s: %s; rounds: %s %s (%.1fs in all)\n", what, how, roundValues(rounds), unit, took.Seconds())
	})
	fmt.Fprintf(w, "\n</details>\n\n")
}

// problems lists failed rounds, missing, doubtful and noisy figures, with
// their reasons and output.
func (r report) problems(w *strings.Builder) {
	var b strings.Builder
	r.each(func(what string, im impl, k key) {
		rounds := r.rounds[k]
		if f := r.res[k]; !f.ok() && len(rounds) > 1 {
			fmt.Fprintf(&b, "- **missing**: %s: %s\n", what, oneLine(f.missing))
		}
		for i, f := range rounds {
			where := what
			if len(rounds) > 1 {
				where = fmt.Sprintf("%s, round %d", what, i+1)
			}
			switch {
			case !f.ok() && len(rounds) == 1:
				fmt.Fprintf(&b, "- **missing**: %s: %s\n", where, oneLine(f.missing))
			case !f.ok():
				fmt.Fprintf(&b, "- **failed**: %s: %s\n", where, oneLine(f.missing))
			case f.doubt != "":
				fmt.Fprintf(&b, "- **doubtful**: %s: %s\n", where, oneLine(f.doubt))
			}
			if f.note != "" {
				fmt.Fprintf(&b, "- note: %s: %s\n", where, oneLine(f.note))
			}
			if f.raw != "" {
				fmt.Fprintf(&b, "\n  <details><summary>output</summary>\n\n  ```\n%s  ```\n\n  </details>\n\n",
					indent(strings.ReplaceAll(f.raw, "```", "'''"), "  "))
			}
		}
		if sp := spread(rounds); sp > noisy {
			fmt.Fprintf(&b, "- noisy: %s: its rounds differ by %.1f× (%s)\n", what, sp, roundValues(rounds))
		}
	})
	if r.set.hungGo > 0 {
		fmt.Fprintf(&b, "- %d in-process measurements hung; their goroutines were left running, which may have slowed what followed.\n", r.set.hungGo)
	}
	if r.set.rounds < r.set.asked && len(r.impls) > 0 {
		fmt.Fprintf(&b, "- %d rounds of the %d asked for: another would have ended after the run's budget", r.set.rounds, r.set.asked)
		if r.failover != nil || r.connections != nil || r.groups != nil {
			b.WriteString(" (less the time kept for the failover, connections and link groups sections)")
		}
		if r.set.targetRounds > r.set.rounds {
			fmt.Fprintf(&b, "; issue 26's target rows and their references (the zero-copy 64 KiB stream and ib_write_bw's, the busy-polling 64 B round trip and ib_send_lat's) made %d, interleaved, after them", r.set.targetRounds)
		}
		b.WriteString(".\n")
	}
	for _, l := range r.failoverProblems() {
		b.WriteString(l + "\n")
	}
	r.storageProblems(&b)
	r.connectionsProblems(&b)
	r.groupsProblems(&b)
	if b.Len() == 0 {
		return
	}
	fmt.Fprintf(w, "## Problems in this run\n\n%s\n", b.String())
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// table writes a Markdown table.
func table(w *strings.Builder, header []string, rows [][]string) {
	esc := func(s string) string { return strings.ReplaceAll(s, "|", "\\|") }
	line := func(cells []string) {
		w.WriteString("|")
		for _, c := range cells {
			w.WriteString(" " + esc(c) + " |")
		}
		w.WriteString("\n")
	}
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---"
	}
	w.WriteString("|" + strings.Join(sep, "|") + "|\n")
	for _, rw := range rows {
		line(rw)
	}
	w.WriteString("\n")
}
