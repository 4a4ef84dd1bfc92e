package main

import (
	"fmt"
	"strconv"
	"strings"
)

// The connections section of the report (connections.go measures it).

func (r report) connectionsSection(w *strings.Builder) {
	run := r.connections
	if run == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## Connections: what an open connection costs\n\n")
	p("Issue 23's measurement. One process opens N connection pairs from %s to a listener on %s, both ends in it: "+
		"dials %d at a time, each pair making one round trip (a %d-byte write echoed back) once established. "+
		"With all the pairs open it counts, against a baseline taken just before the first dial (the listener open), "+
		"the open descriptors (`/proc/self/fd`), goroutines (`runtime.NumGoroutine`), pinned memory (`VmPin` in `/proc/self/status`) "+
		"and resident memory (`VmRSS`, after `debug.FreeOSMemory`); a pair's figure is the growth divided by the pairs opened, "+
		"so it is both ends' together. Pairs a second: the pairs opened (round trip included) over the time from the first dial to the last pair opened "+
		"(dials that failed after it, at the descriptor limit, do not count). "+
		"Then it closes every connection and waits (up to %v) for the descriptors, goroutines, pinned and locked memory, "+
		"verbs objects (`verbs.Resources`) and cm IDs to come back to the baseline; resident memory is not expected to, "+
		"as Go's runtime keeps some of what it used. Go's TCP (`net.Dialer`, `net.ListenConfig`) runs the same steps in the same run, "+
		"each N right after rdmanet's. Before the first step of each transport, one pair is opened and closed: "+
		"what the first connection opens for good (rdma_cm's devices and event channel) is not a connection's cost.\n\n",
		r.set.env.AddrA, r.set.env.AddrB, connsParallel, len(connsMessage), connsSettle)
	p("rdmanet runs with `%s` on both sides, so that registered memory does not bound how many connections open: "+
		"`Config.Footprint` says %s KiB registered an end (%s a pair) and %d descriptors an end. Every rdmanet row is a connection with a queue pair "+
		"of its own at each end (`NoLinkGroups: true`, checked on each client end), as before link groups became the default (issue 25): "+
		"one listener's connections would otherwise be streams of one group, which the Link groups section measures. "+
		"The default Config but for that registers %s KiB an end "+
		"while idle (%s KiB once its rings grew, streaming), and has rows of its own at %s pairs. ",
		describeConfig(connsConfig), kib(run.footprint.RegisteredBytes), kib(2*run.footprint.RegisteredBytes),
		run.footprint.FileDescriptors, kib(run.defFoot.RegisteredBytes), kib(run.defFoot.StreamingRegisteredBytes), pairList(run.defPairs))
	if run.limit > 0 {
		p("The process's descriptor limit (`RLIMIT_NOFILE`) is %s, left as it is", thousands(int(run.limit)))
		if fp := run.footprint.FileDescriptors; fp > 0 {
			p(": at %d descriptors an end, about %s rdmanet pairs fit", fp, thousands(int(run.limit)/(2*fp)))
		}
		p("; a step it stops says how many pairs opened and its first error. ")
	}
	p("**Pinned** is `VmPin`, the kernel's count of the process's pinned pages (`mm->pinned_vm`), which `ib_umem_get` raises " +
		"for every memory region registered (rxe's too): the registered memory as the kernel holds it, whole pages. " +
		"`VmLck` counts `mlock`, which registration does not use. TCP pins nothing. " +
		"**RSS** counts what is mapped and touched: the Go heap and goroutine stacks, the registered buffers, and (file-backed, `RssFile`) " +
		"the queues rxe maps into the process from the uverbs device; the steps below split it.\n\n")

	header := []string{"", "pairs asked", "pairs opened", "descriptors a pair", "goroutines a pair", "pinned KiB a pair",
		"RSS KiB a pair", "pairs opened a second", "back to the baseline"}
	var rows [][]string
	for _, s := range run.steps {
		row := []string{s.subject.label, thousands(s.pairs)}
		switch {
		case s.skipped != "":
			row = append(row, "not measured", "–", "–", "–", "–", "–", "–")
		case s.opened == 0:
			row = append(row, "0", "–", "–", "–", "–", "–", backCell(s))
		default:
			per := s.perPair()
			row = append(row, thousands(s.opened), sig2(per.fds), sig2(per.goroutines), sig2(per.pinKiB), sig2(per.rssKiB),
				sig(s.rate()), backCell(s))
		}
		rows = append(rows, row)
	}
	table(w, header, rows)
	run.memlockSection(w)

	var short []string
	for _, s := range run.steps {
		if line := s.shortfall(); line != "" {
			short = append(short, fmt.Sprintf("- %s, %s pairs: %s\n", s.subject.label, thousands(s.pairs), line))
		}
	}
	if len(short) > 0 {
		p("**Pairs not opened**\n\n%s\n", strings.Join(short, ""))
	}

	p("<details><summary>Every step</summary>\n\n")
	for _, s := range run.steps {
		p("- %s, %s pairs: %s", s.subject.label, thousands(s.pairs), oneLine(s.summary()))
		if s.skipped == "" && s.opened > 0 {
			per := s.perPair()
			p("; a pair: MRs %s, QPs %s, CQs %s, PDs %s, completion channels %s, cm IDs %s, VmLck %s KiB",
				sig2(per.mrs), sig2(per.qps), sig2(per.cqs), sig2(per.pds), sig2(per.channels), sig2(per.cmIDs), sig2(per.lckKiB))
			p("; RSS a pair %s KiB anonymous, %s KiB file-backed (RssAnon, RssFile); RSS %s KiB after the close (baseline %s KiB)",
				sig2(per.anonKiB), sig2(per.fileKiB), thousands(int(s.after.rssKiB)), thousands(int(s.base.rssKiB)))
		}
		p("\n")
	}
	p("\n</details>\n\n")
}

// backCell says whether the process came back to its baseline.
func backCell(s connsStep) string {
	if s.backToBase() {
		return fmt.Sprintf("yes (%.1f s)", s.settled.Seconds())
	}
	return "**no**: " + strings.Join(s.back, ", ")
}

// shortfall says why pairs were not opened, or "" if all were.
func (s connsStep) shortfall() string {
	if s.skipped != "" || (s.failed == 0 && s.notTried == 0 && s.accErr == "") {
		return ""
	}
	var parts []string
	if s.failed > 0 {
		limit := "none"
		switch s.atLimit {
		case s.failed:
			limit = "all"
		case 0:
		default:
			limit = thousands(s.atLimit)
		}
		reasons := ""
		if s.subject.rdma {
			reasons = " (by rdmanet's reason: " + s.reasonList() + ")"
		}
		parts = append(parts, fmt.Sprintf("%s of %s failed, %s of them at the descriptor limit%s; the first with: %s",
			thousands(s.failed), thousands(s.pairs), limit, reasons, oneLine(s.firstErr)))
	}
	if s.otherErr != "" && s.otherErr != s.firstErr {
		parts = append(parts, "the first not at the descriptor limit: "+oneLine(s.otherErr))
	}
	if s.notTried > 0 {
		parts = append(parts, fmt.Sprintf("%s not tried (the step's dials ran past -timeout)", thousands(s.notTried)))
	}
	if s.accErr != "" {
		parts = append(parts, "the listener's Accept failed: "+oneLine(s.accErr))
	}
	return strings.Join(parts, "; ")
}

// problemSteps counts the steps not measured, and those after which the
// process did not come back to its baseline.
func (run *connsRun) problemSteps() int {
	if run == nil {
		return 0
	}
	n := 0
	for _, s := range run.steps {
		if !s.backToBase() {
			n++
		}
	}
	return n
}

// connectionsProblems lists the section's steps not measured, not back to
// their baseline, or with pairs that failed for another reason than the
// descriptor limit (which the section expects and reports).
func (r report) connectionsProblems(b *strings.Builder) {
	run := r.connections
	if run == nil {
		return
	}
	for _, s := range run.steps {
		what := fmt.Sprintf("- connections: %s, %s pairs", s.subject.label, thousands(s.pairs))
		switch {
		case s.skipped != "":
			fmt.Fprintf(b, "%s: not measured: %s\n", what, oneLine(s.skipped))
			continue
		case !s.backToBase():
			fmt.Fprintf(b, "%s: the process did not come back to its baseline: %s\n", what, strings.Join(s.back, ", "))
		}
		if s.failed > s.atLimit || s.notTried > 0 || s.accErr != "" {
			fmt.Fprintf(b, "%s: %s\n", what, s.shortfall())
		}
	}
}

// kib formats bytes as KiB.
// pairList is "100 and 5,000".
func pairList(ns []int) string {
	var parts []string
	for _, n := range ns {
		parts = append(parts, thousands(n))
	}
	if len(parts) < 2 {
		return strings.Join(parts, "")
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

func kib(n int) string { return sig(float64(n) / 1024) }

// thousands formats n with commas between thousands: 2,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}
