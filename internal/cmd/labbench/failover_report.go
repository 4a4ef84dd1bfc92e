package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
)

// The failover section of the report (failover.go measures it).

// secs formats a duration with 3 significant digits, in ms below a second.
func secs(d time.Duration) string {
	if d > -time.Second && d < time.Second {
		return sig(float64(d)/float64(time.Millisecond)) + " ms"
	}
	return sig(d.Seconds()) + " s"
}

// failoverTime is one of the times measured per cycle, from phase on.
type failoverTime struct {
	name  string
	phase phase
	get   func(cycle) time.Duration
}

var failoverTimes = []failoverTime{
	{"stall: the longest wait for data", phaseMoved, func(c cycle) time.Duration { return c.stall }},
	{"detection: the fault to the dead path found", phaseMoved, func(c cycle) time.Duration { return c.detection }},
	{"resume: the dead path found to the new link", phaseMoved, func(c cycle) time.Duration { return c.resume }},
	{"failback: path 1 healed to the session back on it", phaseFailback, func(c cycle) time.Duration { return c.failback }},
	{"failback's pause", phaseFailback, func(c cycle) time.Duration { return c.failbackPause }},
}

// failoverRate is one of the throughputs measured per cycle, from phase on.
type failoverRate struct {
	name  string
	phase phase
	get   func(cycle) float64
}

var failoverRates = []failoverRate{
	{"before: path 1", phaseBefore, func(c cycle) float64 { return c.before }},
	{"during: the new path", phaseDuring, func(c cycle) float64 { return c.during }},
	{"after: path 1 again", phaseAfter, func(c cycle) float64 { return c.after }},
}

// samples returns get of every cycle of kind k that reached ph, sorted.
func samples[T int64 | float64 | time.Duration](run *failoverRun, k moveKind, ph phase, get func(cycle) T) []T {
	var vs []T
	for _, c := range run.cycles {
		if c.kind == k && c.reached >= ph {
			vs = append(vs, get(c))
		}
	}
	slices.Sort(vs)
	return vs
}

// failedCycles counts the cycles that failed.
func (run *failoverRun) failedCycles() int {
	n := 0
	for _, c := range run.cycles {
		if c.failed != "" {
			n++
		}
	}
	return n
}

// badSessions counts the sessions whose stream did not end cleanly with
// every byte read.
func (run *failoverRun) badSessions() int {
	n := 0
	for _, s := range run.sessions {
		if s.problem != "" {
			n++
		}
	}
	return n
}

// failoverSection writes the section: what was done, the times' p50 and
// p99 and the throughputs' medians per kind, and every cycle.
func (r report) failoverSection(w *strings.Builder) {
	run := r.failover
	if run == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	paths := r.set.env.Paths()
	p("## Resumable sessions: failover and failback\n\n")
	p("One resumable session, `%s` on both sides, carries a stream from client to server at full speed "+
		"(%s writes; the server reads into a %s buffer and notes when each read completes). "+
		"The client dials from A's path 1 address (%s) to B's (%s) with `Dialer.FailoverAddrs` B's path 2 address (%s); "+
		"the listener is on every address, RDMA and TCP. A session is never a link group's stream (issue 25): it keeps a queue pair "+
		"of its own whatever `NoLinkGroups` says (checked), so this section is what it was before link groups became the default; "+
		"the Link groups section measures a group's failover. A cycle: %v of throughput on path 1 (before); "+
		"the fault, netem dropping every packet on both netdevs of path 1 (**RDMA to RDMA**: the session moves to path 2) "+
		"or of path 2 and then path 1 (**RDMA to TCP**: TCP between the lab's addresses goes through lo and keeps working), "+
		"T0 being when the first of path 1's netdevs dropped; "+
		"once the client's `Session().LastMove` is after T0 and neither side is suspended, %v of throughput on the new path (during); "+
		"then path 1 heals, T1 being when both its netdevs are clear (path 2 heals after it, in RDMA to TCP), and once the session has "+
		"failed back to path 1 (from TCP it may stop on path 2 first: the first RDMA path that answers takes it, and a cycle says so), "+
		"%v of throughput on path 1 (after). "+
		"The kinds alternate on the one session, which is replaced only when a cycle leaves it ended or off path 1; "+
		"cycles of each kind asked for: %d (`-failover-cycles`). "+
		"A cycle is given up after %v without the move it waits for (a hang guard), or at `-timeout`.\n\n",
		describeConfig(failoverConfig), benchkit.SizeName(failoverWriteSize), benchkit.SizeName(failoverReadSize),
		paths[0].A, paths[0].B, paths[1].B, rateWindow, rateWindow, rateWindow, run.perKind, moveGuard)
	p("- **stall**: the longest time between consecutive read completions at the server, from the last one before T0 "+
		"to %v after the move: the pause the application saw; about detection plus resume.\n", stallTail)
	p("- **detection**: T0 to when the client found the path dead (`LastMove.At − LastMove.Pause`). "+
		"Bound by the keepalive: 2-3 × KeepAlive (%v) by design.\n", failoverConfig.KeepAlive)
	p("- **resume**: the client's `LastMove.Pause`, from finding the path dead to the new link taking over. " +
		"The client tries the other RDMA paths first, then TCP, and the path just found dead last (README): " +
		"in RDMA to TCP this includes path 2's try, which waits for an answer that never comes (3 s).\n")
	p("- **failback**: T1 to the new link on path 1 taking over (`LastMove.At` of the failback). "+
		"It is bound by the failback's schedule, not by how fast a move is: a failback is tried every FailbackInterval (%v), "+
		"and each try that fails (as every try does while path 1 is down) doubles the wait, up to 8 × FailbackInterval; "+
		"so it depends on how long the session was away before the heal. "+
		"**failback's pause**: its `LastMove.Pause` (it makes the new link before it lets go of the old).\n\n",
		failoverConfig.FailbackInterval)
	p("p50 and p99 by nearest rank over the cycles of each kind that got that far (n); with fewer than 100 cycles p99 is the largest. "+
		"Throughputs (MB/s, 10^6 bytes per second) are the medians (nearest rank) of the cycles' %v figures. "+
		"As everywhere in this report the CPU is emulated: only ratios within this run mean anything, such as the throughput "+
		"during or after a move against before it, or the times against KeepAlive and FailbackInterval.\n\n", rateWindow)

	header := []string{""}
	for _, k := range moveKinds {
		header = append(header, k.String()+" p50", "p99", "n")
	}
	var rows [][]string
	for _, t := range failoverTimes {
		row := []string{t.name}
		for _, k := range moveKinds {
			vs := samples(run, k, t.phase, t.get)
			if len(vs) == 0 {
				row = append(row, "–", "–", "0")
				continue
			}
			row = append(row, secs(benchkit.NearestRank(vs, 50)), secs(benchkit.NearestRank(vs, 99)), fmt.Sprint(len(vs)))
		}
		rows = append(rows, row)
	}
	table(w, header, rows)

	header = []string{"median throughput (n)"}
	for _, rt := range failoverRates {
		header = append(header, rt.name)
	}
	header = append(header, "during ÷ before", "after ÷ before")
	rows = nil
	for _, k := range moveKinds {
		row := []string{k.String()}
		medians := make([]float64, len(failoverRates))
		for i, rt := range failoverRates {
			vs := samples(run, k, rt.phase, rt.get)
			if len(vs) == 0 {
				row = append(row, "–")
				continue
			}
			medians[i] = benchkit.NearestRank(vs, 50)
			row = append(row, fmt.Sprintf("%s MB/s (%d)", sig(medians[i]), len(vs)))
		}
		for _, v := range medians[1:] {
			if v == 0 || medians[0] == 0 {
				row = append(row, "–")
				continue
			}
			row = append(row, fmt.Sprintf("%.2f", v/medians[0]))
		}
		rows = append(rows, row)
	}
	table(w, header, rows)

	r.failoverOutcome(w)
}

// failoverOutcome writes how many cycles completed, why the others did
// not, whether every byte arrived, and every cycle's figures.
func (r report) failoverOutcome(w *strings.Builder) {
	run := r.failover
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	total := len(moveKinds) * run.perKind
	p("**%d of %d cycles completed", len(run.cycles)-run.failedCycles(), total)
	if n := run.failedCycles(); n > 0 {
		p(", %d failed", n)
	}
	if run.skipped > 0 {
		p(", %d not run", run.skipped)
	}
	p(".**")
	if run.skipped > 0 {
		p(" Not run: %s.", run.skipWhy)
	}
	p("\n\n")
	if run.failedCycles() > 0 {
		for i, c := range run.cycles {
			if c.failed != "" {
				p("- **failed**: cycle %d, %s: %s\n", i+1, c.kind, oneLine(c.failed))
			}
		}
		p("\n")
	}
	var bytes int64
	for _, s := range run.sessions {
		bytes += s.read
	}
	switch bad := run.badSessions(); {
	case len(run.sessions) == 0:
	case bad == 0:
		p("The stream used %d session(s); at the end of each the server had read every byte the client wrote (%s MB in all).\n\n",
			len(run.sessions), sig(float64(bytes)/1e6))
	default:
		p("The stream used %d session(s); %d did not end with every byte the client wrote read by the server:\n\n", len(run.sessions), bad)
		for i, s := range run.sessions {
			if s.problem != "" {
				p("- **failed**: session %d (%d bytes written, %d read): %s\n", i+1, s.written, s.read, oneLine(s.problem))
			}
		}
		p("\n")
	}
	if len(run.cycles) == 0 {
		return
	}
	p("<details><summary>Every cycle</summary>\n\n")
	for i, c := range run.cycles {
		p("- cycle %d, %s: %s\n", i+1, c.kind, oneLine(c.summary()))
	}
	p("\n</details>\n\n")
}

// failoverProblems are the lines of the failover section's problems, for
// the report's list of them.
func (r report) failoverProblems() []string {
	run := r.failover
	if run == nil {
		return nil
	}
	var lines []string
	if n := run.failedCycles(); n > 0 {
		lines = append(lines, fmt.Sprintf("- failover: %d of %d cycles failed (see Resumable sessions).", n, len(run.cycles)))
	}
	if n := run.badSessions(); n > 0 {
		lines = append(lines, fmt.Sprintf("- failover: %d session(s) did not end with every byte read (see Resumable sessions).", n))
	}
	if run.skipped > 0 {
		lines = append(lines, fmt.Sprintf("- failover: %d cycles not run: %s.", run.skipped, run.skipWhy))
	}
	return lines
}
