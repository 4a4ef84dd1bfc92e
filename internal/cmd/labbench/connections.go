package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/leakcheck"
	"github.com/rdmanet/sdk/rdmanet"
	"github.com/rdmanet/sdk/verbs"
)

// The connections section (issue 23's measurement): what an open
// connection costs the process, and how fast connections are opened.
//
// One step opens N connection pairs from A's address to a listener on B's,
// both ends in this process: dials 16 at a time, each pair making one
// round trip (a small write echoed back) once established. With all the
// pairs open it counts the process's descriptors, goroutines, pinned and
// resident memory and rdmanet's verbs objects, against a baseline taken
// just before the first dial (the listener open); then it closes every
// connection and waits for the process to come back to the baseline. Go's
// TCP (net.Dial, net.Listen) runs the same steps on the same addresses in
// the same run. The process's descriptor limit is left as it is: where it
// stops a step, the step says how many pairs were opened and the first
// error.

// connectionsID selects the section in -only.
const connectionsID = "connections"

// connsConfig is rdmanet's Config in the section's main rows: small
// buffers and receive queues, so that registered memory does not bound how
// many connections open; and a queue pair a connection (NoLinkGroups), as
// before link groups became the default (issue 25): one listener's
// connections would be streams of one group, which the Link groups section
// measures.
var connsConfig = rdmanet.Config{RecvBuffer: 16 << 10, SendBuffer: 16 << 10, RecvDepth: 16, NoLinkGroups: true}

// connsDefaultConfig is the Config of the default's rows: the default but
// for NoLinkGroups, for the same reason.
var connsDefaultConfig = rdmanet.Config{NoLinkGroups: true}

const (
	connsParallel = 16 // dials in flight at once
	// connsDialTimeout bounds each pair: its dial, accept and round trip.
	connsDialTimeout = 20 * time.Second
	// connsSettle is a hang guard: how long after closing a step's
	// connections the process may take to come back to its baseline (a
	// closed rdmanet connection lingers up to 5 s before it frees its
	// objects, and thousands of them free theirs in the emulated kernel).
	connsSettle = 2 * time.Minute
	// connsPerPairEstimate is about how long a pair asked for takes in the
	// lab (opened or failed, closed, settled), to keep the section's time
	// free of further rounds of the comparison: two runs of 2026-11-25 took
	// 180 s and 230 s for the default steps, 6,300 pairs asked for.
	connsPerPairEstimate = 25 * time.Millisecond
	connsStepOverhead    = 10 * time.Second // a step's warm-up, listener and settling
	// connsSettleLog is how often the wait for the baseline says what is left.
	connsSettleLog = 15 * time.Second
)

// connsMessage is each pair's round trip: the client writes it, the server
// reads it whole and writes it back.
var connsMessage = []byte("labbench: one round trip a pair.")

// connsSubject is what a step connects with.
type connsSubject struct {
	label string
	rdma  bool
	cfg   rdmanet.Config // rdmanet's, on both sides
}

var (
	connsRDMA        = connsSubject{label: "rdmanet", rdma: true, cfg: connsConfig}
	connsRDMADefault = connsSubject{label: "rdmanet, default Config but NoLinkGroups", rdma: true, cfg: connsDefaultConfig}
	connsTCP         = connsSubject{label: "Go net, TCP"}
)

// usage is what the process holds at one moment.
type usage struct {
	fds, goroutines        int
	pinKiB, lckKiB, rssKiB int64 // /proc/self/status: VmPin, VmLck, VmRSS
	anonKiB, fileKiB       int64 // VmRSS's RssAnon and RssFile
	verbs                  verbs.ResourceCounts
	cmIDs                  int64
}

// connsStep is one line of the table: a subject at N pairs.
type connsStep struct {
	subject connsSubject
	pairs   int // asked for

	opened   int            // pairs connected and through their round trip
	failed   int            // pairs whose dial, accept or round trip failed
	atLimit  int            // of them, those that failed at the descriptor limit (EMFILE)
	reasons  map[string]int // the failures by rdmanet's fallback.Reason ("" for other errors)
	notTried int            // dials not started: the step ran out of time (-timeout)
	firstErr string         // the first failure's error
	otherErr string         // the first error of a failure not at the descriptor limit
	accErr   string         // the first error of the listener's Accept, if any
	elapsed  time.Duration  // from the first dial to the end of the last
	lastOpen time.Duration  // from the first dial to the last pair opened

	base, open, after usage
	back              []string      // what did not come back to the baseline; empty if all did
	closing           time.Duration // the Close calls, 16 at a time
	settled           time.Duration // the Close calls and the wait for the baseline after them
	closeErrs         int

	skipped string // why the step was not measured
	note    string
}

// backToBase is whether everything counted came back.
func (s connsStep) backToBase() bool { return s.skipped == "" && len(s.back) == 0 }

// connsRun is the section's result.
type connsRun struct {
	limit     uint64 // RLIMIT_NOFILE's soft limit as the section started
	footprint rdmanet.Footprint
	defFoot   rdmanet.Footprint
	defPairs  []int // the default Config's rows
	steps     []connsStep
	memlock   []memlockRow // under an ordinary container's limit
}

// connsSteps are the section's steps in the order run: for each N,
// rdmanet then TCP (a slow spell of the host hits both alike); the default
// Config's first row after the first N, its others at the end (issue 24's
// 5,000 pairs: TCP's two descriptors a pair would stop at the limit).
func connsSteps(pairs, defaultPairs []int) []connsStep {
	var steps []connsStep
	for i, n := range pairs {
		steps = append(steps, connsStep{subject: connsRDMA, pairs: n}, connsStep{subject: connsTCP, pairs: n})
		if i == 0 && len(defaultPairs) > 0 {
			steps = append(steps, connsStep{subject: connsRDMADefault, pairs: defaultPairs[0]})
		}
	}
	if len(pairs) > 0 && len(defaultPairs) > 1 {
		for _, n := range defaultPairs[1:] {
			steps = append(steps, connsStep{subject: connsRDMADefault, pairs: n})
		}
	}
	return steps
}

// connectionsReserve is how long the section is expected to take.
func (b *bench) connectionsReserve() time.Duration {
	if !b.withConnections {
		return 0
	}
	var d time.Duration
	for _, s := range connsSteps(b.opt.connPairs, b.opt.connDefaultPairs) {
		d += connsStepOverhead + time.Duration(s.pairs)*connsPerPairEstimate
	}
	return d
}

// runConnections measures the section, within the run's budget: a step
// that would end after it (judged by the longest step so far) is not run.
func (b *bench) runConnections() {
	if !b.withConnections || len(b.opt.connPairs) == 0 {
		return
	}
	run := &connsRun{}
	b.connections = run
	run.limit = nofileLimit()
	run.footprint, _ = connsConfig.Footprint()
	run.defFoot, _ = connsDefaultConfig.Footprint()
	run.defPairs = b.opt.connDefaultPairs
	proc, err := openProc()
	if err != nil {
		for _, s := range connsSteps(b.opt.connPairs, b.opt.connDefaultPairs) {
			s.skipped = "reading /proc/self: " + err.Error()
			run.steps = append(run.steps, s)
		}
		return
	}
	defer proc.close()
	var longest time.Duration
	warm := map[bool]bool{}
	steps := connsSteps(b.opt.connPairs, b.opt.connDefaultPairs)
	for i, s := range steps {
		prefix := fmt.Sprintf("labbench: connections %d/%d, %s, %d pairs:", i+1, len(steps), s.subject.label, s.pairs)
		if time.Since(b.start)+longest > b.opt.budget {
			s.skipped = fmt.Sprintf("it would have ended after the run's budget (-budget %v)", b.opt.budget)
			run.steps = append(run.steps, s)
			fmt.Fprintln(b.log, prefix, "skipped:", s.skipped)
			continue
		}
		start := time.Now()
		if !warm[s.subject.rdma] {
			// The first connection of a transport opens what the process
			// keeps for good (rdma_cm's devices and event channel); it is
			// not what a connection costs.
			if err := b.warmUp(s.subject); err != nil {
				fmt.Fprintf(b.log, "%s warming up: %v\n", prefix, err)
			}
			warm[s.subject.rdma] = true
		}
		b.connsStep(proc, &s)
		run.steps = append(run.steps, s)
		longest = max(longest, time.Since(start))
		fmt.Fprintf(b.log, "%s %s (%.1fs)\n", prefix, s.summary(), time.Since(start).Seconds())
	}
	if time.Since(b.start)+longest <= b.opt.budget {
		b.runMemlock(run)
	}
}

// warmUp opens one pair of subject's and closes it.
func (b *bench) warmUp(subject connsSubject) error {
	ctx, cancel := context.WithTimeout(context.Background(), connsDialTimeout)
	defer cancel()
	ln, err := b.connsListen(ctx, subject)
	if err != nil {
		return err
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := b.connsDial(ctx, subject, ln.Addr().String())
	if err != nil {
		ln.Close()
		if s := <-accepted; s != nil {
			s.Close()
		}
		return err
	}
	c.Close()
	if s := <-accepted; s != nil {
		s.Close()
	}
	ln.Close()
	if subject.rdma {
		// A closed connection lingers, then frees its objects in the
		// background: the step's baseline is taken once they are gone.
		if r, ids := leakcheck.Released(connsSettle); r != (verbs.ResourceCounts{}) || ids != 0 {
			return fmt.Errorf("the warm-up pair's objects are still open: %+v, %d cm IDs", r, ids)
		}
		time.Sleep(100 * time.Millisecond) // and the goroutine that freed them returns
	}
	return nil
}

func (b *bench) connsListen(ctx context.Context, subject connsSubject) (net.Listener, error) {
	addr := netip.AddrPortFrom(b.env.AddrB, 0).String()
	if subject.rdma {
		lc := rdmanet.ListenConfig{Config: subject.cfg}
		return lc.Listen(ctx, "rdma", addr)
	}
	var lc net.ListenConfig
	return lc.Listen(ctx, "tcp", addr)
}

func (b *bench) connsDial(ctx context.Context, subject connsSubject, addr string) (net.Conn, error) {
	local := netip.AddrPortFrom(b.env.AddrA, 0)
	if subject.rdma {
		d := rdmanet.Dialer{LocalAddr: &rdmanet.Addr{AddrPort: local}, Config: subject.cfg}
		c, err := d.DialContext(ctx, "rdma", addr)
		if err == nil {
			if err := checkStreams(false, c); err != nil {
				c.Close()
				return nil, err
			}
		}
		return c, err
	}
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local)}
	return d.DialContext(ctx, "tcp", addr)
}

// connsStep measures one step into s.
func (b *bench) connsStep(proc *procReader, s *connsStep) {
	ctx, cancel := context.WithTimeoutCause(context.Background(), b.opt.timeout,
		fmt.Errorf("the step's dials took over %v (-timeout)", b.opt.timeout))
	defer cancel()
	ln, err := b.connsListen(ctx, s.subject)
	if err != nil {
		s.skipped = "listening: " + err.Error()
		return
	}
	defer ln.Close()

	var (
		mu               sync.Mutex
		clients, servers []net.Conn
		echoes           sync.WaitGroup
		accepting        = make(chan struct{})
	)
	firstErr := func(dst *string, err error) {
		mu.Lock()
		if *dst == "" {
			*dst = err.Error()
		}
		mu.Unlock()
	}
	go func() { // the server: each connection's message echoed back
		defer close(accepting)
		for {
			c, err := ln.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil { // at the descriptor limit, say
				firstErr(&s.accErr, err)
				time.Sleep(10 * time.Millisecond)
				continue
			}
			echoes.Add(1)
			go func() {
				defer echoes.Done()
				if err := echoOnce(c); err != nil {
					c.Close()
					return
				}
				mu.Lock()
				servers = append(servers, c)
				mu.Unlock()
			}()
		}
	}()

	s.base, err = proc.snapshot(true)
	if err != nil {
		s.skipped = "reading /proc/self: " + err.Error()
		return
	}
	start := time.Now()
	work := make(chan int)
	var dialers sync.WaitGroup
	for range connsParallel {
		dialers.Add(1)
		go func() {
			defer dialers.Done()
			for range work {
				c, err := b.connsPair(ctx, s.subject, ln.Addr().String())
				mu.Lock()
				if err != nil {
					s.failed++
					if s.firstErr == "" {
						s.firstErr = err.Error()
					}
					if atDescriptorLimit(err) {
						s.atLimit++
					} else if s.otherErr == "" {
						s.otherErr = err.Error()
					}
					var fe *fallback.Error
					reason := ""
					if errors.As(err, &fe) {
						reason = string(fe.Reason)
					}
					if s.reasons == nil {
						s.reasons = map[string]int{}
					}
					s.reasons[reason]++
				} else {
					clients = append(clients, c)
					s.lastOpen = time.Since(start)
				}
				mu.Unlock()
			}
		}()
	}
	for i := range s.pairs {
		select {
		case work <- i:
			continue
		case <-ctx.Done():
			s.notTried = s.pairs - i
		}
		break
	}
	close(work)
	dialers.Wait()
	s.elapsed = time.Since(start)
	echoes.Wait() // a round trip that failed on the server's side
	s.opened = len(clients)
	if len(servers) != len(clients) {
		s.note = fmt.Sprintf("%d client ends and %d server ends went through their round trip", len(clients), len(servers))
	}

	if s.open, err = proc.snapshot(true); err != nil {
		s.note = strings.TrimPrefix(s.note+"; ", "; ") + "reading /proc/self with the pairs open: " + err.Error()
	}

	closeStart := time.Now()
	all := append(clients, servers...)
	next := make(chan net.Conn)
	var closers sync.WaitGroup
	for range connsParallel {
		closers.Add(1)
		go func() {
			defer closers.Done()
			for c := range next {
				if c.Close() != nil {
					mu.Lock()
					s.closeErrs++
					mu.Unlock()
				}
			}
		}()
	}
	for _, c := range all {
		next <- c
	}
	close(next)
	closers.Wait()
	s.closing = time.Since(closeStart)
	s.back = proc.settle(s.base, func(d []string) {
		fmt.Fprintf(b.log, "labbench: connections, %s, %d pairs: %.0fs after the close began, not yet back to the baseline: %s\n",
			s.subject.label, s.pairs, time.Since(closeStart).Seconds(), strings.Join(d, ", "))
	})
	s.settled = time.Since(closeStart)
	if s.after, err = proc.snapshot(true); err != nil {
		s.note = strings.TrimPrefix(s.note+"; ", "; ") + "reading /proc/self after the close: " + err.Error()
	} else {
		s.back = s.base.differs(s.after)
	}
	ln.Close()
	<-accepting
}

// connsPair dials one pair and makes its round trip, within
// connsDialTimeout.
func (b *bench) connsPair(ctx context.Context, subject connsSubject, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, connsDialTimeout)
	defer cancel()
	c, err := b.connsDial(ctx, subject, addr)
	if err != nil {
		return nil, err
	}
	dl, _ := ctx.Deadline()
	got := make([]byte, len(connsMessage))
	err = c.SetDeadline(dl)
	if err == nil {
		_, err = c.Write(connsMessage)
	}
	if err == nil {
		_, err = io.ReadFull(c, got)
	}
	if err == nil && !bytes.Equal(got, connsMessage) {
		err = fmt.Errorf("the round trip returned %q", got)
	}
	if err == nil {
		err = c.SetDeadline(time.Time{})
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("round trip: %w", err)
	}
	return c, nil
}

// echoOnce reads a pair's message on the server's end and writes it back.
func echoOnce(c net.Conn) error {
	if err := c.SetDeadline(time.Now().Add(connsDialTimeout)); err != nil {
		return err
	}
	buf := make([]byte, len(connsMessage))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if _, err := c.Write(buf); err != nil {
		return err
	}
	return c.SetDeadline(time.Time{})
}

// procReader reads /proc/self through descriptors it keeps open, so that
// it still can when the process is at its descriptor limit.
type procReader struct {
	fdDir, status *os.File
}

func openProc() (*procReader, error) {
	fdDir, err := os.Open("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	status, err := os.Open("/proc/self/status")
	if err != nil {
		fdDir.Close()
		return nil, err
	}
	return &procReader{fdDir: fdDir, status: status}, nil
}

func (p *procReader) close() {
	p.fdDir.Close()
	p.status.Close()
}

// fds counts the process's open descriptors (its own two among them).
func (p *procReader) fds() (int, error) {
	if _, err := p.fdDir.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	names, err := p.fdDir.Readdirnames(-1)
	return len(names), err
}

// snapshot is what the process holds now; with gc, after a collection
// that returns freed memory to the kernel, so that VmRSS counts what is
// live.
func (p *procReader) snapshot(gc bool) (usage, error) {
	if gc {
		debug.FreeOSMemory()
	}
	u := usage{goroutines: runtime.NumGoroutine(), verbs: verbs.Resources(), cmIDs: cm.LiveIDs()}
	var err error
	if u.fds, err = p.fds(); err != nil {
		return u, err
	}
	buf := make([]byte, 8<<10)
	n, err := p.status.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return u, err
	}
	st, err := parseStatus(string(buf[:n]))
	u.pinKiB, u.lckKiB, u.rssKiB, u.anonKiB, u.fileKiB = st["VmPin"], st["VmLck"], st["VmRSS"], st["RssAnon"], st["RssFile"]
	return u, err
}

// statusFields are the fields of /proc/self/status that snapshot reads.
var statusFields = []string{"VmPin", "VmLck", "VmRSS", "RssAnon", "RssFile"}

// parseStatus reads statusFields (in KiB) from /proc/self/status.
func parseStatus(s string) (map[string]int64, error) {
	got := map[string]int64{}
	for _, l := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		if !slices.Contains(statusFields, k) {
			continue
		}
		num, unit, _ := strings.Cut(strings.TrimSpace(v), " ")
		if unit != "kB" {
			return nil, fmt.Errorf("/proc/self/status: %s in %q, not kB", k, unit)
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("/proc/self/status: %s: %w", k, err)
		}
		got[k] = n
	}
	for _, k := range statusFields {
		if _, ok := got[k]; !ok {
			return nil, fmt.Errorf("/proc/self/status has no %s", k)
		}
	}
	return got, nil
}

// atDescriptorLimit is whether err is the process's descriptor limit:
// EMFILE; its text, where the server's refusal carries it (the server's
// end, in this process too, hit the limit); or rdmanet's note that the
// process had every descriptor its limit allows open (which it adds to an
// error that may name another cause).
func atDescriptorLimit(err error) bool {
	msg := err.Error()
	return errors.Is(err, syscall.EMFILE) || strings.Contains(msg, syscall.EMFILE.Error()) ||
		strings.Contains(msg, "file descriptors its RLIMIT_NOFILE allows open")
}

// differs lists what after holds that u does not (or lacks): descriptors,
// goroutines, pinned and locked memory, verbs objects and cm IDs. Resident
// memory is not among them: the Go runtime keeps some of what it used.
func (u usage) differs(after usage) []string {
	var d []string
	add := func(what string, base, now int64) {
		if now != base {
			d = append(d, fmt.Sprintf("%s %+d", what, now-base))
		}
	}
	add("descriptors", int64(u.fds), int64(after.fds))
	add("goroutines", int64(u.goroutines), int64(after.goroutines))
	add("pinned KiB", u.pinKiB, after.pinKiB)
	add("locked KiB", u.lckKiB, after.lckKiB)
	add("verbs MRs", u.verbs.MRs, after.verbs.MRs)
	add("verbs QPs", u.verbs.QPs, after.verbs.QPs)
	add("verbs CQs", u.verbs.CQs, after.verbs.CQs)
	add("verbs PDs", u.verbs.PDs, after.verbs.PDs)
	add("verbs completion channels", u.verbs.CompChannels, after.verbs.CompChannels)
	add("verbs buffers", u.verbs.Buffers, after.verbs.Buffers)
	add("cm IDs", u.cmIDs, after.cmIDs)
	return d
}

// settle waits, up to connsSettle, until the process holds no more than
// base (without collecting: the goroutines and objects go by themselves),
// and returns what still differs; every connsSettleLog it calls progress
// with what differs then.
func (p *procReader) settle(base usage, progress func([]string)) []string {
	end := time.Now().Add(connsSettle)
	nextLog := time.Now().Add(connsSettleLog)
	for {
		now, err := p.snapshot(false)
		if err != nil {
			return []string{"reading /proc/self: " + err.Error()}
		}
		d := base.differs(now)
		if len(d) == 0 || !time.Now().Before(end) {
			return d
		}
		if time.Now().After(nextLog) {
			progress(d)
			nextLog = nextLog.Add(connsSettleLog)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// summary is the step's progress line.
func (s connsStep) summary() string {
	if s.skipped != "" {
		return "not measured: " + s.skipped
	}
	var parts []string
	parts = append(parts, fmt.Sprintf("%d of %d pairs opened in %.1fs (the last %.1fs after the first dial)", s.opened, s.pairs, s.elapsed.Seconds(), s.lastOpen.Seconds()))
	if s.opened > 0 {
		per := s.perPair()
		parts = append(parts, fmt.Sprintf("per pair: %s descriptors, %s goroutines, %s KiB pinned, %s KiB RSS",
			sig2(per.fds), sig2(per.goroutines), sig2(per.pinKiB), sig2(per.rssKiB)))
	}
	if s.failed > 0 {
		parts = append(parts, fmt.Sprintf("%d failed (%d at the descriptor limit; by reason: %s), the first: %s", s.failed, s.atLimit, s.reasonList(), oneLine(s.firstErr)))
	}
	if s.notTried > 0 {
		parts = append(parts, fmt.Sprintf("%d not tried", s.notTried))
	}
	if s.accErr != "" {
		parts = append(parts, "Accept failed: "+oneLine(s.accErr))
	}
	parts = append(parts, fmt.Sprintf("the Close calls took %.1fs", s.closing.Seconds()))
	if len(s.back) == 0 {
		parts = append(parts, fmt.Sprintf("back to the baseline %.1fs after the close began", s.settled.Seconds()))
	} else {
		parts = append(parts, fmt.Sprintf("NOT back to the baseline %.1fs after the close began: %s", s.settled.Seconds(), strings.Join(s.back, ", ")))
	}
	if s.note != "" {
		parts = append(parts, s.note)
	}
	return strings.Join(parts, "; ")
}

// reasonList lists the failures by reason, the commonest first.
func (s connsStep) reasonList() string {
	type rc struct {
		reason string
		n      int
	}
	var rs []rc
	for r, n := range s.reasons {
		if r == "" {
			r = "other"
		}
		rs = append(rs, rc{r, n})
	}
	slices.SortFunc(rs, func(a, b rc) int { return cmp.Or(b.n-a.n, strings.Compare(a.reason, b.reason)) })
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%s %d", r.reason, r.n))
	}
	return strings.Join(parts, ", ")
}

// perUse is what one pair holds, on average.
type perUse struct {
	fds, goroutines, pinKiB, lckKiB, rssKiB float64
	anonKiB, fileKiB                        float64
	mrs, qps, cqs, pds, channels, cmIDs     float64
}

// perPair divides the step's growth by the pairs opened.
func (s connsStep) perPair() perUse {
	n := float64(max(1, s.opened))
	o, b := s.open, s.base
	return perUse{
		fds: float64(o.fds-b.fds) / n, goroutines: float64(o.goroutines-b.goroutines) / n,
		pinKiB: float64(o.pinKiB-b.pinKiB) / n, lckKiB: float64(o.lckKiB-b.lckKiB) / n, rssKiB: float64(o.rssKiB-b.rssKiB) / n,
		anonKiB: float64(o.anonKiB-b.anonKiB) / n, fileKiB: float64(o.fileKiB-b.fileKiB) / n,
		mrs: float64(o.verbs.MRs-b.verbs.MRs) / n, qps: float64(o.verbs.QPs-b.verbs.QPs) / n,
		cqs: float64(o.verbs.CQs-b.verbs.CQs) / n, pds: float64(o.verbs.PDs-b.verbs.PDs) / n,
		channels: float64(o.verbs.CompChannels-b.verbs.CompChannels) / n, cmIDs: float64(o.cmIDs-b.cmIDs) / n,
	}
}

// rate is pairs opened a second, up to the last one opened (dials that
// failed after it, at the descriptor limit, do not count).
func (s connsStep) rate() float64 {
	if s.opened == 0 || s.lastOpen <= 0 {
		return 0
	}
	return float64(s.opened) / s.lastOpen.Seconds()
}

// sig2 formats a per-pair figure: 2 decimals below 100, else whole.
func sig2(v float64) string {
	if v >= 100 || v <= -100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// parsePairs reads -conn-pairs: comma-separated positive counts.
func parsePairs(flag, s string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-%s: %q is not a positive count", flag, f)
		}
		ns = append(ns, n)
	}
	return ns, nil
}
