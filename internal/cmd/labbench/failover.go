package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// Resumable sessions' failover and failback (README, "Resumable
// sessions"): a session carries a stream from client to server at full
// speed while labbench breaks its path with the lab's dead-path fault
// (labenv.Path.Drop), waits for the session to move, heals the path and
// waits for it to move back, measuring the throughput before, during and
// after, and the pauses in between.
//
// Every cycle runs on one long-lived session, the kinds alternating: a
// long-lived application connection goes through every kind of move in
// turn, each cycle starts from where the last one's failback left the
// session (so that state is exercised too, not only a fresh connection),
// and a slow spell of the host hits both kinds alike, as runAll's order
// does for the tools. A cycle that fails may leave the session ended or on
// the wrong path; the next cycle then starts a new session, so that one
// failure does not spoil the rest.

// failoverID selects the section in -only.
const failoverID = "failover"

// failoverConfig is the sessions' Config, on both sides. A 1 s keepalive
// finds a dead path in 2-3 s (the default, 3 s, would make each cycle
// 6-9 s longer), and a 1 s FailbackInterval (default 30 s) brings the
// session back within seconds of the heal.
var failoverConfig = rdmanet.Config{KeepAlive: time.Second, ResumeTimeout: 30 * time.Second, FailbackInterval: time.Second}

const (
	failoverWriteSize = 64 << 10  // the client's writes
	failoverReadSize  = 256 << 10 // the server's read buffer, as benchkit.Stream's
	warmUpBytes       = 1 << 20   // read before a new session's first cycle

	rateWindow   = 2 * time.Second // each throughput figure's measurement
	stallTail    = time.Second     // how long after the move the stall's window ends
	failoverPoll = 10 * time.Millisecond

	// moveGuard is a hang guard: how long a cycle waits for the session
	// to move after the fault, and to move back after the heal, before
	// it is reported as failed.
	moveGuard = 60 * time.Second
	// finishGrace bounds the end of a stream when its session is closed.
	finishGrace = 30 * time.Second
	// failoverCycleEstimate is about how long a cycle takes in the lab
	// (measured: see the section's cycle list), to keep the section's time
	// free of further rounds of the other measurements.
	failoverCycleEstimate = 20 * time.Second
)

// moveKind is what a cycle breaks, and so where the session moves.
type moveKind int

const (
	toRDMA moveKind = iota // path 1 drops everything: the session moves to path 2
	toTCP                  // both RDMA paths drop everything: it moves to TCP (which goes through lo)
)

var moveKinds = []moveKind{toRDMA, toTCP}

func (k moveKind) String() string {
	if k == toRDMA {
		return "RDMA to RDMA"
	}
	return "RDMA to TCP"
}

// phase is how far a cycle got: the figures of every phase up to the
// one reached are measured, even in a cycle that failed later.
type phase int

const (
	phaseNone     phase = iota
	phaseBefore         // throughput on path 1
	phaseMoved          // stall, detection, resume
	phaseDuring         // throughput on the new path
	phaseFailback       // failback time and its pause
	phaseAfter          // throughput on path 1 again
)

// cycle is one fault, move, heal and move back, and what was measured.
type cycle struct {
	kind    moveKind
	reached phase

	before, during, after float64 // MB/s (10^6 bytes per second) read by the server

	stall     time.Duration // the longest gap between read completions around the move
	detection time.Duration // the fault to the client finding the path dead
	resume    time.Duration // the client's LastMove.Pause: dead path found to new link
	movedTo   string        // the path the session moved to

	failback      time.Duration // the heal to the failback's new link
	failbackPause time.Duration // the failback's LastMove.Pause

	failed    string // why the cycle did not complete; empty if it did
	labBroken bool   // a fault could not be undone: no cycle can follow
	note      string
	took      time.Duration
}

// failoverRun is the section's result.
type failoverRun struct {
	perKind  int // cycles asked for per kind (-failover-cycles)
	cycles   []cycle
	skipped  int    // cycles not run
	skipWhy  string // why
	sessions []sessionEnd
}

// sessionEnd is what the end of one session's stream found.
type sessionEnd struct {
	written, read int64
	problem       string // the stream did not end cleanly, or the counts differ; empty if fine
}

// runFailover runs the section's cycles, the kinds alternating, within
// the run's budget (a cycle is not started if it would end after it,
// judged by the longest so far) and each within -timeout.
func (b *bench) runFailover() {
	if !b.withFailover {
		return
	}
	run := &failoverRun{perKind: b.opt.failoverCycles}
	b.failover = run
	total := len(moveKinds) * run.perKind
	var f *flow
	var longest time.Duration
	for i := range total {
		kind := moveKinds[i%len(moveKinds)]
		prefix := fmt.Sprintf("labbench: failover cycle %d/%d, %s:", i+1, total, kind)
		switch {
		case len(run.cycles) > 0 && run.cycles[len(run.cycles)-1].labBroken:
			run.skipped, run.skipWhy = total-i, "a fault could not be undone, so the lab's paths are not as a cycle needs them"
		case time.Since(b.start)+longest > b.opt.budget:
			run.skipped, run.skipWhy = total-i, fmt.Sprintf("they would have ended after the run's budget (-budget %v)", b.opt.budget)
		}
		if run.skipped > 0 {
			fmt.Fprintf(b.log, "%s skipped with the %d after it: %s\n", prefix, run.skipped-1, run.skipWhy)
			break
		}
		start := time.Now()
		var c cycle
		f, c = b.failoverCycle(f, kind)
		c.took = time.Since(start)
		longest = max(longest, c.took)
		run.cycles = append(run.cycles, c)
		fmt.Fprintln(b.log, prefix, c.summary())
	}
	if f != nil {
		run.sessions = append(run.sessions, b.finish(f))
	}
}

// failoverCycle makes one cycle within -timeout, on f's session if it is
// ready for one, else on a new session; it returns the session to go on
// with (nil if none could be made).
func (b *bench) failoverCycle(f *flow, kind moveKind) (*flow, cycle) {
	ctx, cancel := context.WithTimeoutCause(context.Background(), b.opt.timeout,
		fmt.Errorf("the cycle took over %v (-timeout)", b.opt.timeout))
	defer cancel()
	if f != nil {
		if err := f.ready(); err != nil {
			fmt.Fprintf(b.log, "labbench: failover: a new session, as the last one is not ready for a cycle: %v\n", err)
			b.failover.sessions = append(b.failover.sessions, b.finish(f))
			f = nil
		}
	}
	if f == nil {
		var err error
		if f, err = openFlow(ctx, b.env); err != nil {
			if f != nil {
				b.failover.sessions = append(b.failover.sessions, b.finish(f))
			}
			return nil, cycle{kind: kind, failed: "opening a session: " + err.Error()}
		}
	}
	return f, measureCycle(ctx, f, b.env, kind)
}

// measureCycle is one cycle on f's session (on path 1): throughput, the
// fault, the move, throughput, the heal, the move back, throughput.
func measureCycle(ctx context.Context, f *flow, env labenv.Env, kind moveKind) (c cycle) {
	c.kind = kind
	paths := env.Paths()
	fail := func(when string, err error) cycle {
		c.failed = when + ": " + err.Error()
		return c
	}
	var err error
	if c.before, err = f.rate(ctx); err != nil {
		return fail("on path 1 before the fault", err)
	}
	c.reached = phaseBefore

	var heals []func() error // path 1's first
	defer func() {
		for _, heal := range heals { // each heals once: these are no-ops if healed already
			if err := heal(); err != nil {
				c.labBroken = true
				if c.failed == "" {
					c.failed = "healing: " + err.Error()
				}
			}
		}
	}()
	before := f.client.Session()
	f.forgetReads() // the stall's window starts with the last read before the fault
	var heal2 func() error
	if kind == toTCP { // path 2 first, so that at T0 every RDMA path is dead
		if heal2, _, err = paths[1].Drop(); err != nil {
			return fail("breaking path 2", err)
		}
	}
	heal1, t0, err := paths[0].Drop()
	if err != nil {
		if heal2 != nil {
			heals = append(heals, heal2)
		}
		return fail("breaking path 1", err)
	}
	heals = append(heals, heal1)
	if heal2 != nil {
		heals = append(heals, heal2)
	}

	err = f.waitUntil(ctx, "failover after the fault", func() bool {
		cs, ss := f.client.Session(), f.server.Session()
		return cs.LastMove.At.After(t0) && !cs.Suspended && !ss.Suspended
	})
	if err != nil {
		return fail("after the fault", err)
	}
	moved := f.client.Session()
	move := moved.LastMove
	c.movedTo = move.ToPath
	if err := f.movedAsExpected(env, kind); err != nil {
		return fail("after the fault", err)
	}
	if n := moved.Failovers - before.Failovers; n != 1 {
		c.note = joinNotes(c.note, fmt.Sprintf("the client moved %d times after the fault (the figures are of the last move)", n))
	}
	windowEnd := move.At.Add(stallTail)
	err = f.waitUntil(ctx, "data on the new path", func() bool {
		return time.Now().After(windowEnd) && f.lastRead().After(move.At)
	})
	if err != nil {
		return fail("after the failover", err)
	}
	reads := f.readsSoFar()
	c.stall = longestGap(reads, t0, later(windowEnd, firstReadAfter(reads, move.At)))
	c.detection = move.At.Add(-move.Pause).Sub(t0)
	c.resume = move.Pause
	c.reached = phaseMoved
	f.forgetReads()

	if c.during, err = f.rate(ctx); err != nil {
		return fail("on the new path", err)
	}
	c.reached = phaseDuring

	failbacks := f.client.Session().Failbacks
	if err := heals[0](); err != nil {
		return fail("healing path 1", err)
	}
	t1 := time.Now()
	for _, heal := range heals[1:] {
		if err := heal(); err != nil {
			return fail("healing path 2", err)
		}
	}
	// From TCP the first RDMA path that answers takes the session: path
	// 2, if path 1's try began before it healed and came to nothing. The
	// next failback takes it on to path 1.
	err = f.waitUntil(ctx, "failback to path 1 after it healed", func() bool {
		cs, ss := f.client.Session(), f.server.Session()
		return cs.Failbacks > failbacks && f.onFirstPath(cs) && !cs.Suspended && !ss.Suspended
	})
	if err != nil {
		return fail("after the heal", fmt.Errorf("%w (the session is on %q)", err, f.client.Session().Path))
	}
	back := f.client.Session()
	if n := back.Failbacks - failbacks; n > 1 {
		c.note = joinNotes(c.note, fmt.Sprintf("it failed back %d times, through path 2 (the figures are of the move to path 1)", n))
	}
	c.failback = back.LastMove.At.Sub(t1)
	c.failbackPause = back.LastMove.Pause
	c.reached = phaseFailback

	if c.after, err = f.rate(ctx); err != nil {
		return fail("back on path 1", err)
	}
	c.reached = phaseAfter
	f.forgetReads()
	return c
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// summary is the cycle's progress line.
func (c cycle) summary() string {
	var parts []string
	if c.reached >= phaseMoved {
		parts = append(parts, fmt.Sprintf("stall %s, detection %s, resume %s (to %s)",
			secs(c.stall), secs(c.detection), secs(c.resume), c.movedTo))
	}
	if c.reached >= phaseFailback {
		parts = append(parts, fmt.Sprintf("failback %s (pause %s)", secs(c.failback), secs(c.failbackPause)))
	}
	rates := []string{}
	for _, r := range []struct {
		ph   phase
		name string
		v    float64
	}{{phaseBefore, "before", c.before}, {phaseDuring, "during", c.during}, {phaseAfter, "after", c.after}} {
		if c.reached >= r.ph {
			rates = append(rates, fmt.Sprintf("%s %s MB/s", r.name, sig(r.v)))
		}
	}
	if len(rates) > 0 {
		parts = append(parts, strings.Join(rates, ", "))
	}
	s := strings.Join(parts, "; ")
	if c.failed != "" {
		s = strings.TrimPrefix(s+"; ", "; ") + "FAILED: " + c.failed
	}
	if c.note != "" {
		s += "; " + c.note
	}
	return fmt.Sprintf("%s (%.1fs)", s, c.took.Seconds())
}

// ---- the session and its stream ------------------------------------------------

// flow is one session and the stream over it: a goroutine writes into the
// client's end as fast as it can, another reads the server's end and notes
// when each read completed.
type flow struct {
	ln    net.Listener
	first netip.AddrPort // what the client dialed: B's path 1 address
	stop  chan struct{}
	pump
}

// pump is a stream driven flat out: a goroutine writes into the client's
// end, another reads the server's end and notes when each read completed
// (the failover's session, and each stream of the link groups' failover).
type pump struct {
	client, server *rdmanet.Conn

	written, read atomic.Int64
	writerDone    chan struct{}
	readerDone    chan struct{}

	mu       sync.Mutex
	reads    []readAt // since forgetReads, in time order
	writeErr error    // why the writer stopped, if it failed
	readErr  error    // why the reader stopped (io.EOF after CloseWrite)
}

// readAt is one read completion: when, and the bytes read by then.
type readAt struct {
	at    time.Time
	total int64
}

// openFlow makes a session from A's path 1 address to B's, with B's path 2
// address to fail over to, and starts the stream on it.
func openFlow(ctx context.Context, env labenv.Env) (*flow, error) {
	paths := env.Paths()
	lc := rdmanet.ListenConfig{Config: failoverConfig}
	// Every address, RDMA and TCP: the session resumes on B's path 2
	// address, or over TCP to the same port.
	ln, err := lc.Listen(ctx, "tcp", ":0")
	if err != nil {
		return nil, fmt.Errorf("listening: %w", err)
	}
	ta, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("the listener's address %v is not TCP's", ln.Addr())
	}
	first := netip.AddrPortFrom(paths[0].B, ta.AddrPort().Port())
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	d := rdmanet.Dialer{
		LocalAddr:     &rdmanet.Addr{AddrPort: netip.AddrPortFrom(paths[0].A, 0)},
		Config:        failoverConfig,
		FailoverAddrs: []string{paths[1].B.String()},
	}
	nc, err := d.DialContext(ctx, "rdma", first.String())
	if err != nil {
		ln.Close()
		if c := <-accepted; c != nil {
			c.Close()
		}
		return nil, fmt.Errorf("dialing %s: %w", first, err)
	}
	var ns net.Conn
	select {
	case ns = <-accepted:
	case <-ctx.Done():
	}
	client, okc := nc.(*rdmanet.Conn)
	server, oks := ns.(*rdmanet.Conn)
	if !okc || !oks || !client.Session().Resumable || !server.Session().Resumable || checkStreams(false, nc, ns) != nil {
		for _, c := range []io.Closer{nc, ns, ln} {
			if c != nil {
				c.Close()
			}
		}
		if ns == nil {
			return nil, fmt.Errorf("accepting: no connection (%v)", context.Cause(ctx))
		}
		return nil, fmt.Errorf("not a resumable session over RDMA with a queue pair of its own: client %T, server %T (%v)", nc, ns, checkStreams(false, nc, ns))
	}
	f := &flow{ln: ln, first: first, stop: make(chan struct{}),
		pump: pump{client: client, server: server, writerDone: make(chan struct{}), readerDone: make(chan struct{})}}
	f.start(f.stop, failoverWriteSize, failoverReadSize)
	if err := f.waitUntil(ctx, "data on a new session", func() bool { return f.read.Load() >= warmUpBytes }); err != nil {
		return f, fmt.Errorf("the stream did not start: %w", err)
	}
	return f, nil
}

// start runs the writer, in writes of size bytes until stop closes, and
// the reader, into a buffer of readSize.
func (p *pump) start(stop <-chan struct{}, size, readSize int) {
	go p.write(stop, size)
	go p.readAll(readSize)
}

func (p *pump) write(stop <-chan struct{}, size int) {
	defer close(p.writerDone)
	buf := make([]byte, size)
	for {
		select {
		case <-stop:
			return
		default:
		}
		n, err := p.client.Write(buf)
		p.written.Add(int64(n))
		if err != nil {
			p.mu.Lock()
			p.writeErr = err
			p.mu.Unlock()
			return
		}
	}
}

func (p *pump) readAll(size int) {
	defer close(p.readerDone)
	buf := make([]byte, size)
	for {
		n, err := p.server.Read(buf)
		if n > 0 {
			now := time.Now()
			total := p.read.Add(int64(n))
			p.mu.Lock()
			p.reads = append(p.reads, readAt{now, total})
			p.mu.Unlock()
		}
		if err != nil {
			p.mu.Lock()
			p.readErr = err
			p.mu.Unlock()
			return
		}
	}
}

// broken says why the stream stopped, if it did.
func (f *flow) broken() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.writeErr != nil:
		return fmt.Errorf("the client's Write failed: %w", f.writeErr)
	case f.readErr != nil:
		return fmt.Errorf("the server's Read ended: %w", f.readErr)
	}
	return nil
}

// rate is the throughput the server reads over rateWindow.
func (f *flow) rate(ctx context.Context) (float64, error) {
	start, from := time.Now(), f.read.Load()
	select {
	case <-time.After(rateWindow):
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	}
	n, took := f.read.Load()-from, time.Since(start)
	if err := f.broken(); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("nothing arrived in %v; client %s; server %s", rateWindow, sessionSummary(f.client.Session()), sessionSummary(f.server.Session()))
	}
	return float64(n) / took.Seconds() / 1e6, nil
}

// waitUntil polls cond until it holds, the stream stops, moveGuard passes
// (a hang guard) or ctx ends.
func (f *flow) waitUntil(ctx context.Context, what string, cond func() bool) error {
	tick := time.NewTicker(failoverPoll)
	defer tick.Stop()
	guard := time.Now().Add(moveGuard)
	for !cond() {
		if err := f.broken(); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if time.Now().After(guard) {
			return fmt.Errorf("no %s within %v (a hang guard); client %s; server %s",
				what, moveGuard, sessionSummary(f.client.Session()), sessionSummary(f.server.Session()))
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w; client %s; server %s",
				what, context.Cause(ctx), sessionSummary(f.client.Session()), sessionSummary(f.server.Session()))
		}
	}
	return nil
}

// sessionSummary describes a session's state for a failure's reason.
func sessionSummary(st rdmanet.SessionState) string {
	s := fmt.Sprintf("on %q, %d failovers, %d failbacks", st.Path, st.Failovers, st.Failbacks)
	if st.Suspended {
		s = "suspended, " + s
	}
	if m := st.LastMove; !m.At.IsZero() {
		s += fmt.Sprintf(", last move %s from %q to %q at %s (pause %s)",
			m.Reason, m.FromPath, m.ToPath, m.At.Format("15:04:05.000"), secs(m.Pause))
	}
	return s
}

func (f *flow) forgetReads() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.reads); n > 1 {
		f.reads = []readAt{f.reads[n-1]}
	}
}

func (f *flow) readsSoFar() []readAt {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]readAt(nil), f.reads...)
}

// lastRead is when the last read completed (zero if none since forgetReads).
func (f *flow) lastRead() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reads) == 0 {
		return time.Time{}
	}
	return f.reads[len(f.reads)-1].at
}

// onFirstPath says whether the client's session runs on path 1: where it
// was dialed (it has not moved), or where a failback brought it.
func (f *flow) onFirstPath(st rdmanet.SessionState) bool {
	if tr, _ := rdmanet.TransportOf(f.client); tr != fallback.RDMA || st.Suspended {
		return false
	}
	return st.Failovers == 0 || strings.HasSuffix(st.Path, " -> "+f.first.String())
}

// ready says why a cycle cannot start on the session, if it cannot: it
// must stream, on path 1, neither side suspended.
func (f *flow) ready() error {
	if err := f.broken(); err != nil {
		return err
	}
	cs, ss := f.client.Session(), f.server.Session()
	switch {
	case !f.onFirstPath(cs):
		return fmt.Errorf("the client is not on path 1: %s", sessionSummary(cs))
	case ss.Suspended:
		return fmt.Errorf("the server is suspended: %s", sessionSummary(ss))
	}
	return nil
}

// movedAsExpected checks where the session went: path 2 when path 1
// broke, TCP when both did.
func (f *flow) movedAsExpected(env labenv.Env, kind moveKind) error {
	st := f.client.Session()
	tr, _ := rdmanet.TransportOf(f.client)
	switch {
	case kind == toRDMA && (tr != fallback.RDMA || !strings.Contains(st.Path, " -> "+env.Paths()[1].B.String()+":")):
		return fmt.Errorf("the session moved to %q over %s, not to path 2 over RDMA", st.Path, tr)
	case kind == toTCP && tr != fallback.TCP:
		return fmt.Errorf("the session moved to %q over %s, not to TCP", st.Path, tr)
	}
	return nil
}

// finish ends the stream (the client stops writing and half-closes, the
// server reads to EOF), checks that the server read every byte the client
// wrote, and closes the session and its listener. Every wait is bounded:
// a session that cannot resume any more would block the stream's end.
func (b *bench) finish(f *flow) sessionEnd {
	close(f.stop)
	f.client.SetWriteDeadline(time.Now().Add(finishGrace))
	var e sessionEnd
	problem := func(s string) {
		e.problem = strings.TrimPrefix(e.problem+"; "+s, "; ")
	}
	select {
	case <-f.writerDone:
		if f.broken() == nil {
			if err := f.client.CloseWrite(); err != nil {
				problem("CloseWrite: " + err.Error())
			}
		}
	case <-time.After(finishGrace + hangGrace):
		problem(fmt.Sprintf("the client's Write did not return %v after its deadline", hangGrace))
	}
	f.server.SetReadDeadline(time.Now().Add(finishGrace))
	select {
	case <-f.readerDone:
	case <-time.After(finishGrace + hangGrace):
		problem(fmt.Sprintf("the server's Read did not return %v after its deadline", hangGrace))
	}
	e.written, e.read = f.written.Load(), f.read.Load()
	f.mu.Lock()
	writeErr, readErr := f.writeErr, f.readErr
	f.mu.Unlock()
	switch {
	case writeErr != nil:
		problem("the client's Write failed: " + writeErr.Error())
	case readErr != nil && readErr != io.EOF:
		problem("the server's Read failed: " + readErr.Error())
	case e.written != e.read:
		problem(fmt.Sprintf("the server read %d bytes, the client wrote %d", e.read, e.written))
	}
	if err := closeAll(f.client, f.server, f.ln); err != nil {
		if errors.Is(err, errCloseHung) {
			b.hungGo++
		}
		problem(err.Error())
	}
	return e
}

var errCloseHung = fmt.Errorf("Close did not return within %v", hangGrace)

// closeAll closes each, in parallel, for at most hangGrace.
func closeAll(cs ...io.Closer) error {
	errs := make(chan error, len(cs))
	for _, c := range cs {
		go func() { errs <- c.Close() }()
	}
	timeout := time.After(hangGrace)
	var all []error
	for range cs {
		select {
		case err := <-errs:
			if err != nil {
				all = append(all, fmt.Errorf("Close: %w", err))
			}
		case <-timeout:
			return errors.Join(append(all, errCloseHung)...)
		}
	}
	return errors.Join(all...)
}

// ---- the stall ---------------------------------------------------------------------

// longestGap is the longest time between consecutive read completions from
// the last one at or before from (from itself if there is none) to the last
// one at or before to: the longest the application waited for data, with
// the wait that spans from counted whole. reads is in time order.
func longestGap(reads []readAt, from, to time.Time) time.Duration {
	var prev time.Time
	var longest time.Duration
	for _, r := range reads {
		if r.at.After(to) {
			break
		}
		if !r.at.After(from) {
			prev = r.at
			continue
		}
		if prev.IsZero() {
			prev = from
		}
		longest = max(longest, r.at.Sub(prev))
		prev = r.at
	}
	return longest
}

// firstReadAfter is when the first read after t completed (zero if none).
func firstReadAfter(reads []readAt, t time.Time) time.Time {
	for _, r := range reads {
		if r.at.After(t) {
			return r.at
		}
	}
	return time.Time{}
}

// joinNotes adds note b to a.
func joinNotes(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
