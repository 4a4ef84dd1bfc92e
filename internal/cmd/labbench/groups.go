package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/leakcheck"
	"github.com/rdmanet/sdk/rdmanet"
	"github.com/rdmanet/sdk/verbs"
)

// The Link groups section (issue 25): between two rdmanet processes the
// first dial to a listener makes a group (an RDMA link on each path: the
// address dialed and Dialer.FailoverAddrs), and every later dial to it
// opens a stream in it, one message and its answer with no queue pair of
// its own (docs/engine.md, "Link groups"). The section measures, in the
// same run and beside their references:
//
//   - how fast connections open, 16 dials at a time, each connection
//     making a one-byte round trip and closing (as rdmanet's
//     BenchmarkLabGroupDial): Go's TCP, a connection with a queue pair of
//     its own (NoLinkGroups), a stream of a group that exists, and the
//     first connection to a new listener, which makes the group;
//   - a stream's 64-byte round trip and 64 KiB stream beside a
//     connection's of its own;
//   - 8 streams of one group streaming at once over both rxe paths
//     (SpreadLeastStreams: 4 on each) beside 8 over one (SpreadFirstLink);
//   - a group of 100 streaming streams through path 1's failure and
//     heal, beside a resumable session's failover (failover.go) if the
//     failover section ran.
//
// The first three are made in rounds (-rounds), the best of each figure
// reported, as the comparison's, but for the round trip and stream table,
// whose figures are medians and whose ratios are the median of pairs
// measured one after the other (groupsRTTPairs a round); the failover
// once, after the first round.

// groupsID selects the section in -only.
const groupsID = "groups"

const (
	groupsParallel    = 16               // dials in flight at once
	groupsDials       = 300              // connections a dial-rate figure opens
	groupsFirstDials  = 32               // new listeners the first-connection figure dials, once each
	groupsDialTimeout = 20 * time.Second // bounds each connection: its dial, accept and round trip

	groupsAggStreams = 8        // the aggregate's streams
	groupsAggBytes   = 64 << 20 // they move together, one way, in 64 KiB writes
	groupsAggWrite   = 64 << 10

	// groupsRTTPairs: a round measures the round trip and the stream this
	// many times each for a connection of its own and a group's stream,
	// interleaved. Their ratio moved from 0.75 to 1.8 between runs in the
	// lab (docs/attempts/README.md), over 20 times the 5% it is held to:
	// the table gives the median of the pairs' ratios.
	groupsRTTPairs = 3

	groupsFailoverStreams = 100
	groupsFailoverWrite   = 16 << 10 // each stream's writes
	groupsFailoverRead    = 64 << 10 // each server end's read buffer
	groupsWarmBytes       = 64 << 10 // every stream reads this much before the figures start

	// groupsSettle bounds the wait, after a figure, for its groups to end
	// and every verbs object and cm ID to be released.
	groupsSettle = 30 * time.Second
	// groupsStable is how long a group's streams must stay where they are
	// before a figure that needs them there starts.
	groupsStable = 500 * time.Millisecond
	// groupsRoundEstimate and groupsFailoverEstimate are about how long a
	// round and the failover take in the lab, to keep the section's time
	// free of further rounds of the comparison (see groupsReserve).
	groupsRoundEstimate    = 70 * time.Second
	groupsFailoverEstimate = 60 * time.Second
)

// groupsFailoverConfig is the failover's Config on both sides: the
// failover section's KeepAlive (1 s: a dead path found in 2-3 s), so that
// the group's and the session's detection are alike. A group's stream is
// made whatever the KeepAlive.
var groupsFailoverConfig = rdmanet.Config{KeepAlive: time.Second}

// ---- what is measured ------------------------------------------------------------

// dialSubject is a row of the connection-rate table.
type dialSubject int

const (
	dialTCP    dialSubject = iota // Go's net
	dialOwn                       // rdmanet, NoLinkGroups: a queue pair a connection
	dialStream                    // the default: a stream of a group that exists
	dialFirst                     // the default, each to a new listener: makes a group
)

var dialSubjects = []dialSubject{dialTCP, dialOwn, dialStream, dialFirst}

func (s dialSubject) String() string {
	switch s {
	case dialTCP:
		return "Go net, TCP"
	case dialOwn:
		return "rdmanet, a queue pair of its own (NoLinkGroups)"
	case dialStream:
		return "rdmanet, a stream of a group that exists (default Config)"
	}
	return "rdmanet, the first connection to a new listener (makes the group)"
}

// rdma says whether the subject is rdmanet's, and stream whether its
// connections must be streams of a group.
func (s dialSubject) rdma() bool   { return s != dialTCP }
func (s dialSubject) stream() bool { return s == dialStream || s == dialFirst }

// dialFigure is one round of a subject: connections opened and how fast.
type dialFigure struct {
	asked, opened int
	failed        int
	firstErr      string
	wall          time.Duration   // the first dial to the end of the last connection (its Close)
	lats          []time.Duration // each connection's dial and round trip, sorted
	missing       string          // why there is no figure
	note          string
}

func (f dialFigure) ok() bool { return f.missing == "" }

// rate is connections a second: opened over wall.
func (f dialFigure) rate() float64 {
	if f.opened == 0 || f.wall <= 0 {
		return 0
	}
	return float64(f.opened) / f.wall.Seconds()
}

// bestDial is the round with the highest rate, or why none succeeded.
func bestDial(rounds []dialFigure) dialFigure {
	return bestRound(rounds, dialFigure.rate, func(why string) dialFigure { return dialFigure{missing: why} })
}

// rttKey names a figure of the round-trip and stream table.
type rttKey struct {
	stream bool // a group's stream, else a queue pair of its own
	kind   kind
}

// The two connections the round-trip and stream table compares.
var (
	groupModeOwn    = benchkit.Mode{Name: "a queue pair of its own", Config: rdmanet.Config{NoLinkGroups: true}, Protocol: rdmanet.ProtocolRdmanet}
	groupModeStream = benchkit.Mode{Name: "a group's stream", Config: rdmanet.Config{}, Protocol: rdmanet.ProtocolRdmanet}
)

const (
	groupsPingPongSize = 64
	groupsStreamSize   = 64 << 10
)

// aggSubject is a row of the aggregate table.
type aggSubject int

// The one-path reference is a group with no failover address, not one
// with SpreadFirstLink: in the lab (3 of 3 rounds, 2026-11-28) a group
// with SpreadFirstLink and a failover address had its 8 streams 4 and 4
// once path 2's link joined (4 moved): internal/group's rebalance onto a
// link just added does not look at the spread policy.
const (
	aggTwoPaths aggSubject = iota // a failover address, SpreadLeastStreams: 4 streams on each path
	aggOnePath                    // no failover address: one link, all 8 on it
)

var aggSubjects = []aggSubject{aggTwoPaths, aggOnePath}

func (s aggSubject) String() string {
	if s == aggTwoPaths {
		return fmt.Sprintf("%d streams over two paths (SpreadLeastStreams)", groupsAggStreams)
	}
	return fmt.Sprintf("%d streams over one path (no failover address)", groupsAggStreams)
}

// failover says whether the subject dials with path 2 to fail over to.
func (s aggSubject) failover() bool { return s == aggTwoPaths }

// want is how the n streams must sit on the group's links.
func (s aggSubject) want(n int) []int {
	if s == aggTwoPaths {
		return []int{n - n/2, n / 2}
	}
	return []int{n}
}

// aggFigure is one round of an aggregate subject.
type aggFigure struct {
	mbps    float64 // every stream's bytes over the time until the last was read
	links   string  // the group's links and their streams as the streams started
	missing string
	note    string // the group changed while the streams ran
	elapsed time.Duration
}

func (f aggFigure) ok() bool { return f.missing == "" }

// bestAgg is the round with the highest throughput, or why none succeeded.
func bestAgg(rounds []aggFigure) aggFigure {
	return bestRound(rounds, func(f aggFigure) float64 { return f.mbps }, func(why string) aggFigure { return aggFigure{missing: why} })
}

// roundFigure is a figure of one round: it succeeded, or says why not.
type roundFigure interface {
	ok() bool
	why() string
}

func (f dialFigure) why() string { return f.missing }
func (f aggFigure) why() string  { return f.missing }

// bestRound is the round that succeeded with the highest score; the only
// round, if one ran and failed; else a figure (missing) that says why
// none succeeded.
func bestRound[F roundFigure](rounds []F, score func(F) float64, missing func(why string) F) F {
	var best F
	found := false
	for _, f := range rounds {
		if f.ok() && (!found || score(f) > score(best)) {
			best, found = f, true
		}
	}
	switch {
	case found:
		return best
	case len(rounds) == 1:
		return rounds[0]
	case len(rounds) == 0:
		return missing("not measured")
	}
	return missing(fmt.Sprintf("all %d rounds failed; the first: %s", len(rounds), rounds[0].why()))
}

// gfPhase is how far the group's failover got.
type gfPhase int

const (
	gfNone   gfPhase = iota
	gfBefore         // throughput with both paths
	gfMoved          // detection, every stream moved, the stall
	gfDuring         // throughput on path 2 alone
	gfBack           // failback and its stall
	gfAfter          // throughput with both paths again
)

// groupFailover is the group's failover and what was measured.
type groupFailover struct {
	streams int
	reached gfPhase

	before, during, after float64 // MB/s read by the server ends together

	// quietStall is the longest gap between reads any stream saw during
	// the before window, with no fault: the floor the stalls stand on.
	quietStall time.Duration

	onPath1   int           // streams on path 1's link at T0
	linkDown  time.Duration // T0 to the group counting path 1's link down (-1: not seen)
	firstMove time.Duration // T0 to the first stream moved (-1: not seen)
	allMoved  time.Duration // T0 to every stream on path 2's link, none suspended
	moved     uint64        // streams moved by then
	movedTo   string        // the group's links then

	stallMax, stallP50 time.Duration // over the streams: the longest gap between reads around the move
	// stallMovedMax and stallStayedMax are stallMax over the streams that
	// were on path 1's link at T0 (they moved) and over those on path 2's
	// (they stayed, and took the moved ones in beside them); -1: none.
	stallMovedMax, stallStayedMax time.Duration

	failback      time.Duration // T1 to half the streams back on path 1's link
	movedBack     uint64        // streams moved by then
	failbackStall time.Duration // the longest gap any stream saw from T1 to stallTail after the failback

	bytes      int64  // read by the server ends in all
	endProblem string // the streams did not end with every byte read; empty if they did
	failed     string // why the failover did not complete
	labBroken  bool   // path 1 could not be healed
	took       time.Duration
}

// groupsRun is the section's result.
type groupsRun struct {
	asked, rounds int    // rounds asked for and made
	roundsWhy     string // why fewer were made

	dial map[dialSubject][]dialFigure
	rtt  map[rttKey][]figure
	agg  map[aggSubject][]aggFigure

	failover        *groupFailover // nil if not measured
	failoverSkipped string         // why not

	skipped   string // why the section was not measured at all
	labBroken bool
}

// ---- running it ----------------------------------------------------------------------

// groupsReserve is how long the section is expected to take at least: a
// round and the failover (later rounds run only if the budget has room).
func (b *bench) groupsReserve() time.Duration {
	if !b.withGroups {
		return 0
	}
	return groupsRoundEstimate + groupsFailoverEstimate
}

// runGroups measures the section within the run's budget: a round is not
// started if it would end after it (judged by the longest so far), nor
// the failover, after the first round, if it would.
func (b *bench) runGroups() {
	if !b.withGroups {
		return
	}
	run := &groupsRun{asked: b.opt.rounds, dial: map[dialSubject][]dialFigure{}, rtt: map[rttKey][]figure{}, agg: map[aggSubject][]aggFigure{}}
	b.groups = run
	if time.Since(b.start) > b.opt.budget {
		run.skipped = fmt.Sprintf("the run's budget (-budget %v) was used up before it", b.opt.budget)
		fmt.Fprintln(b.log, "labbench: link groups: skipped:", run.skipped)
		return
	}
	if r, ids := leakcheck.Released(groupsSettle); r != (verbs.ResourceCounts{}) || ids != 0 || len(rdmanet.Groups()) > 0 {
		fmt.Fprintf(b.log, "labbench: link groups: starting with objects of the sections before still open: %+v, %d cm IDs, %d groups\n", r, ids, len(rdmanet.Groups()))
	}
	var longest time.Duration
	for round := 1; round <= b.opt.rounds; round++ {
		if round > 1 && time.Since(b.start)+longest > b.opt.budget {
			run.roundsWhy = fmt.Sprintf("another would have ended after the run's budget (-budget %v)", b.opt.budget)
			fmt.Fprintf(b.log, "labbench: link groups: no round %d: %s\n", round, run.roundsWhy)
			break
		}
		if run.labBroken {
			run.roundsWhy = "path 1 could not be healed after the failover"
			fmt.Fprintf(b.log, "labbench: link groups: no round %d: %s\n", round, run.roundsWhy)
			break
		}
		start := time.Now()
		b.groupsRound(run, round)
		run.rounds = round
		longest = max(longest, time.Since(start))
		if round > 1 {
			continue
		}
		if time.Since(b.start)+groupsFailoverEstimate > b.opt.budget {
			run.failoverSkipped = fmt.Sprintf("it would have ended after the run's budget (-budget %v)", b.opt.budget)
			fmt.Fprintln(b.log, "labbench: link groups: failover skipped:", run.failoverSkipped)
			continue
		}
		gf := b.groupFailover()
		run.failover = &gf
		run.labBroken = gf.labBroken
		fmt.Fprintf(b.log, "labbench: link groups: failover of %d streams: %s\n", gf.streams, gf.summary())
	}
}

// groupsRound measures one round of the rates, round trips, streams and
// aggregates, each subject after the other.
func (b *bench) groupsRound(run *groupsRun, round int) {
	prefix := func(what string) string {
		return fmt.Sprintf("labbench: link groups, round %d/%d: %s:", round, b.opt.rounds, what)
	}
	for _, s := range dialSubjects {
		f := b.dialRate(s)
		run.dial[s] = append(run.dial[s], f)
		if !f.ok() {
			fmt.Fprintln(b.log, prefix("connections, "+s.String()), "FAILED:", f.missing)
			continue
		}
		fmt.Fprintf(b.log, "%s %d opened a second (%d in %.1fs), p50 %s\n", prefix("connections, "+s.String()),
			int(f.rate()), f.opened, f.wall.Seconds(), secs(benchkit.NearestRank(f.lats, 50)))
		if f.note != "" {
			fmt.Fprintln(b.log, "    "+f.note)
		}
	}
	for _, kd := range []kind{pingpong, stream} {
		// Own and stream one after the other, groupsRTTPairs times: each
		// pair's ratio is taken (groupsSection), so that a slow spell of
		// the host hits both of a pair. Each starts once the one before
		// has let go of everything (a group's end flushes 16,128
		// receives at each end), and which goes first alternates.
		for i := range groupsRTTPairs {
			order := []bool{false, true}
			if i%2 == 1 {
				order = []bool{true, false}
			}
			for _, st := range order {
				if note := b.settleGroups(); note != "" {
					fmt.Fprintln(b.log, prefix("round trips and streams"), note)
				}
				m := groupModeOwn
				if st {
					m = groupModeStream
				}
				im := b.groupImpl(m, st)
				size := groupsPingPongSize
				if kd == stream {
					size = groupsStreamSize
				}
				f := b.measure(im, kd, size)
				k := rttKey{st, kd}
				run.rtt[k] = append(run.rtt[k], f)
				what := prefix(fmt.Sprintf("%s %s, %s", kd, benchkit.SizeName(size), m.Name))
				switch {
				case !f.ok():
					fmt.Fprintln(b.log, what, "FAILED:", f.missing)
				case kd == stream:
					fmt.Fprintf(b.log, "%s %.2f MB/s (%.1fs)\n", what, f.mbps, f.elapsed.Seconds())
				default:
					fmt.Fprintf(b.log, "%s p50 %.1f us, p99 %.1f us (%.1fs)\n", what, f.p50, f.p99, f.elapsed.Seconds())
				}
			}
		}
	}
	if note := b.settleGroups(); note != "" {
		fmt.Fprintln(b.log, prefix("round trips and streams"), note)
	}
	for _, s := range aggSubjects {
		f := b.aggregate(s)
		run.agg[s] = append(run.agg[s], f)
		if !f.ok() {
			fmt.Fprintln(b.log, prefix(s.String()), "FAILED:", f.missing)
			continue
		}
		fmt.Fprintf(b.log, "%s %.2f MB/s (%s; %.1fs)\n", prefix(s.String()), f.mbps, f.links, f.elapsed.Seconds())
		if f.note != "" {
			fmt.Fprintln(b.log, "    "+f.note)
		}
	}
}

// settleGroups waits, up to groupsSettle, for every group to end and
// every verbs object and cm ID to be released, and says what is still
// open if something is.
func (b *bench) settleGroups() string {
	end := time.Now().Add(groupsSettle)
	for len(rdmanet.Groups()) > 0 && time.Now().Before(end) {
		time.Sleep(20 * time.Millisecond)
	}
	r, ids := leakcheck.Released(time.Until(end))
	if n := len(rdmanet.Groups()); n > 0 || r != (verbs.ResourceCounts{}) || ids != 0 {
		note := fmt.Sprintf("not settled %v after it: %d groups, verbs objects %+v, %d cm IDs still open", groupsSettle, n, r, ids)
		if !b.unsettledDumped {
			// What still holds them, for whoever reads the log: the
			// report gives only the counts.
			b.unsettledDumped = true
			fmt.Fprintf(b.log, "labbench: link groups: %s; %d connections listed; the goroutines:\n", note, len(rdmanet.Connections()))
			pprof.Lookup("goroutine").WriteTo(b.log, 1)
		}
		return note
	}
	return ""
}

// groupImpl is m's pair (checked to be streams of a group if stream, else
// connections with a queue pair of their own) as an implementation, for
// measure.
func (b *bench) groupImpl(m benchkit.Mode, stream bool) impl {
	kindOf := "each end a connection with a queue pair of its own"
	if stream {
		kindOf = "each end a stream of the group its dial made (the listener is the pair's own, so the dial makes the group and opens the stream in it)"
	}
	d := dialer{
		how: fmt.Sprintf("rdmanet, %s (%s; protocol checked to be %q, %s, checked), client on %s, listener on %s",
			m.Name, describeConfig(m.Config), m.Protocol, kindOf, b.env.AddrA, b.env.AddrB),
		pair: func(ctx context.Context) (net.Conn, net.Conn, error) {
			return checkedPair(ctx, m, b.env.AddrA, b.env.AddrB, stream)
		},
	}
	return impl{
		id: "groups/" + m.Name, label: m.Name,
		stream: func(ctx context.Context, size int, total int64) figure {
			return b.goStream(ctx, d, size, total)
		},
		pingpong: func(ctx context.Context, size, n int) figure {
			return b.goPingPong(ctx, d, size, n)
		},
	}
}

// ---- connections opened a second -------------------------------------------------------

// dialFuncs are how subject s listens on B and dials from A.
func (b *bench) dialFuncs(s dialSubject) (listen func(context.Context) (net.Listener, error), dial func(context.Context, string) (net.Conn, error)) {
	laddr := netip.AddrPortFrom(b.env.AddrB, 0).String()
	local := netip.AddrPortFrom(b.env.AddrA, 0)
	if !s.rdma() {
		return func(ctx context.Context) (net.Listener, error) {
				var lc net.ListenConfig
				return lc.Listen(ctx, "tcp", laddr)
			}, func(ctx context.Context, addr string) (net.Conn, error) {
				d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local)}
				return d.DialContext(ctx, "tcp", addr)
			}
	}
	cfg := rdmanet.Config{NoLinkGroups: s == dialOwn}
	return func(ctx context.Context) (net.Listener, error) {
			lc := rdmanet.ListenConfig{Config: cfg}
			return lc.Listen(ctx, "rdma", laddr)
		}, func(ctx context.Context, addr string) (net.Conn, error) {
			d := rdmanet.Dialer{LocalAddr: &rdmanet.Addr{AddrPort: local}, Config: cfg, Timeout: groupsDialTimeout}
			return d.DialContext(ctx, "rdma", addr)
		}
}

// echoOneByte accepts until ln closes; each connection echoes one byte
// and is closed.
func echoOneByte(ln net.Listener, log io.Writer) {
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(groupsDialTimeout))
			if _, err := io.CopyN(c, c, 1); err != nil {
				// The client's error says only what it saw (EOF, say).
				fmt.Fprintf(log, "labbench: link groups: a server end (%v from %v) did not echo: %v\n", c.LocalAddr(), c.RemoteAddr(), err)
			}
		}()
	}
}

// dialRate opens subject s's connections, groupsParallel at a time, each
// dialed, through a one-byte round trip and closed; then closes the
// listeners and waits for rdmanet's objects to go.
func (b *bench) dialRate(s dialSubject) dialFigure {
	ctx, cancel := context.WithTimeoutCause(context.Background(), b.opt.timeout,
		fmt.Errorf("the connections took over %v (-timeout)", b.opt.timeout))
	defer cancel()
	n := int(b.scaled(groupsDials))
	if s == dialFirst {
		n = int(b.scaled(groupsFirstDials))
	}
	var lns []net.Listener
	f := b.dialRateOn(ctx, s, n, &lns)
	for _, ln := range lns {
		ln.Close()
	}
	if s.rdma() {
		if note := b.settleGroups(); note != "" {
			f.note = strings.TrimPrefix(f.note+"; ", "; ") + note
		}
	}
	return f
}

func (b *bench) dialRateOn(ctx context.Context, s dialSubject, n int, lns *[]net.Listener) dialFigure {
	f := dialFigure{asked: n}
	listen, dial := b.dialFuncs(s)
	listeners := 1
	if s == dialFirst {
		listeners = n
	}
	for range listeners {
		ln, err := listen(ctx)
		if err != nil {
			f.missing = "listening: " + err.Error()
			return f
		}
		*lns = append(*lns, ln)
		go echoOneByte(ln, b.log)
	}
	one := func(addr string) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(ctx, groupsDialTimeout)
		defer cancel()
		start := time.Now()
		c, err := dial(ctx, addr)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		if s.rdma() {
			if err := checkStreams(s.stream(), c); err != nil {
				return 0, err
			}
		}
		dl, _ := ctx.Deadline()
		c.SetDeadline(dl)
		buf := []byte{7}
		if _, err := c.Write(buf); err != nil {
			return 0, fmt.Errorf("round trip: %w", err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return 0, fmt.Errorf("round trip: %w", err)
		}
		return time.Since(start), nil
	}
	addr := func(i int) string { return (*lns)[i%len(*lns)].Addr().String() }
	if s != dialFirst {
		// The device's first use, and the stream's group: not counted.
		if _, err := one(addr(0)); err != nil {
			f.missing = "the first connection (not counted): " + err.Error()
			return f
		}
	}
	var mu sync.Mutex
	work := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range groupsParallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				lat, err := one(addr(i))
				mu.Lock()
				if err != nil {
					f.failed++
					if f.firstErr == "" {
						f.firstErr = err.Error()
					}
				} else {
					f.opened++
					f.lats = append(f.lats, lat)
				}
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		select {
		case work <- i:
			continue
		case <-ctx.Done():
		}
		break
	}
	close(work)
	wg.Wait()
	f.wall = time.Since(start)
	slices.Sort(f.lats)
	switch {
	case f.failed > 0:
		f.missing = fmt.Sprintf("%d of %d connections failed; the first: %s", f.failed, n, f.firstErr)
	case f.opened < n:
		f.missing = fmt.Sprintf("%d of %d connections opened: %v", f.opened, n, context.Cause(ctx))
	}
	return f
}

// ---- a group's streams between the lab's hosts --------------------------------------------

// groupConns are n streams of one group, each client paired with the
// server end it reached.
type groupConns struct {
	ln               net.Listener
	port             uint16
	clients, servers []*rdmanet.Conn
}

// openGroupStreams listens on every address, RDMA and TCP (the group's
// second link comes to B's path 2 address, its last path is TCP to the
// port), with cfg, and dials n streams from A's path 1 address to B's,
// groupsParallel at a time, with B's path 2 address to fail over to if
// failover; every end must be a stream of a group.
func (b *bench) openGroupStreams(ctx context.Context, cfg rdmanet.Config, n int, failover bool) (*groupConns, error) {
	paths := b.env.Paths()
	lc := rdmanet.ListenConfig{Config: cfg}
	ln, err := lc.Listen(ctx, "tcp", ":0")
	if err != nil {
		return nil, fmt.Errorf("listening: %w", err)
	}
	ap, err := netip.ParseAddrPort(ln.Addr().String())
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("the listener's address: %w", err)
	}
	gc := &groupConns{ln: ln, port: ap.Port()}
	d := rdmanet.Dialer{
		LocalAddr: &rdmanet.Addr{AddrPort: netip.AddrPortFrom(paths[0].A, 0)},
		Config:    cfg,
		Timeout:   groupsDialTimeout,
	}
	if failover {
		d.FailoverAddrs = []string{paths[1].B.String()}
	}
	dst := netip.AddrPortFrom(paths[0].B, gc.port).String()
	// Accepts go on until the listener closes: a stream whose open was
	// lost with its link (the dial opened it again) is accepted too, and
	// has no client. Those not paired are closed.
	servers := make(chan net.Conn, 2*n) // closed when the accepts end
	acceptErr := make(chan error, 1)
	go func() {
		defer close(servers)
		for {
			c, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			servers <- c
		}
	}()
	closeRest := func() {
		go func() {
			for c := range servers {
				c.Close()
			}
		}()
	}
	clients := make([]net.Conn, n)
	errs := make([]error, n)
	sem := make(chan struct{}, groupsParallel)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			clients[i], errs[i] = d.DialContext(ctx, "rdma", dst)
		}()
	}
	wg.Wait()
	byLocal := map[string]int{}
	for i, c := range clients {
		if c != nil {
			byLocal[c.LocalAddr().String()] = i
		}
	}
	paired := make([]net.Conn, n)
	var accepted []net.Conn
	var err2 error
	for found := 0; found < n && err2 == nil && errors.Join(errs...) == nil; {
		select {
		case c, ok := <-servers:
			if !ok {
				err2 = fmt.Errorf("accepting: %w", <-acceptErr)
				break
			}
			accepted = append(accepted, c)
			if i, ok := byLocal[c.RemoteAddr().String()]; ok && paired[i] == nil {
				paired[i] = c
				found++
			}
		case <-ctx.Done():
			err2 = fmt.Errorf("accepting: %w", context.Cause(ctx))
		}
	}
	fail := func(err error) (*groupConns, error) {
		ln.Close()
		for _, c := range append(clients, accepted...) {
			if c != nil {
				c.Close()
			}
		}
		closeRest() // accepted after the listener closed
		return nil, err
	}
	for i, err := range errs {
		if err != nil {
			return fail(fmt.Errorf("dialing stream %d of %d: %w", i+1, n, err))
		}
	}
	if err2 != nil {
		return fail(err2)
	}
	for _, c := range accepted {
		if !slices.Contains(paired, c) {
			c.Close() // its open was lost with its link
		}
	}
	closeRest()
	for i, c := range clients {
		s := paired[i]
		if err := checkStreams(true, c, s); err != nil {
			return fail(err)
		}
		gc.clients = append(gc.clients, c.(*rdmanet.Conn))
		gc.servers = append(gc.servers, s.(*rdmanet.Conn))
	}
	return gc, nil
}

// close closes every stream and the listener, each for at most hangGrace.
func (gc *groupConns) close() error {
	var cs []io.Closer
	for i := range gc.clients {
		cs = append(cs, gc.clients[i], gc.servers[i])
	}
	return closeAll(append(cs, gc.ln)...)
}

// dialedGroup is the dialer's group with a link to port, or with id if
// id is set.
func dialedGroup(port uint16, id string) (rdmanet.GroupInfo, bool) {
	for _, g := range rdmanet.Groups() {
		if g.Side != "dialed" {
			continue
		}
		if id != "" {
			if g.ID == id {
				return g, true
			}
			continue
		}
		for _, l := range g.Links {
			if ap, err := netip.ParseAddrPort(l.Remote); err == nil && ap.Port() == port {
				return g, true
			}
		}
	}
	return rdmanet.GroupInfo{}, false
}

// linksHold says whether g has every stream placed as want says (the
// links' streams, in any order) and none waiting for a link.
func linksHold(g rdmanet.GroupInfo, want []int) bool {
	if len(g.Links) != len(want) || g.Suspended != 0 {
		return false
	}
	var got []int
	for _, l := range g.Links {
		got = append(got, l.Streams)
	}
	slices.Sort(got)
	w := slices.Clone(want)
	slices.Sort(w)
	return slices.Equal(got, w)
}

// pathOf names the path of a group's link: "path 1" or "path 2" by B's
// address, "TCP" for its TCP link, else its remote address.
func pathOf(l rdmanet.GroupLinkInfo, paths [2]labenv.Path) string {
	if l.Transport == "tcp" {
		return "TCP"
	}
	if ap, err := netip.ParseAddrPort(l.Remote); err == nil {
		for i, p := range paths {
			if ap.Addr() == p.B {
				return fmt.Sprintf("path %d", i+1)
			}
		}
	}
	return l.Remote
}

// describeLinks is a group's links and their streams: "path 1: 4, path
// 2: 4"; a group with none, "no link".
func describeLinks(g rdmanet.GroupInfo, paths [2]labenv.Path) string {
	var parts []string
	for _, l := range g.Links {
		parts = append(parts, fmt.Sprintf("%s: %d", pathOf(l, paths), l.Streams))
	}
	if len(parts) == 0 {
		return "no link"
	}
	return strings.Join(parts, ", ")
}

// groupState describes a group for a failure's reason.
func groupState(g rdmanet.GroupInfo, found bool, paths [2]labenv.Path) string {
	if !found {
		return "no such group"
	}
	return fmt.Sprintf("links %s; %d streams, %d suspended, %d moved, %d moves failed, %d links down",
		describeLinks(g, paths), g.Streams, g.Suspended, g.Moved, g.MovesFailed, g.LinksDown)
}

// streamsOn counts the streams on g's links to B's address a.
func streamsOn(g rdmanet.GroupInfo, a netip.Addr) int {
	n := 0
	for _, l := range g.Links {
		if ap, err := netip.ParseAddrPort(l.Remote); err == nil && ap.Addr() == a && l.Transport != "tcp" {
			n += l.Streams
		}
	}
	return n
}

// waitGroupState polls the dialer's group until ok has held for it for
// stable with nothing changing (its links, their streams, its moves and
// links down: a move counts once answered, after the streams' places
// changed), ctx ends, moveGuard passes, or broken says the streams
// stopped. It returns the group and when ok began to hold.
func waitGroupState(ctx context.Context, port uint16, id, what string, paths [2]labenv.Path,
	broken func() error, stable time.Duration, ok func(rdmanet.GroupInfo) bool) (rdmanet.GroupInfo, time.Time, error) {
	tick := time.NewTicker(failoverPoll)
	defer tick.Stop()
	guard := time.Now().Add(moveGuard)
	var since time.Time
	var last string
	for {
		g, found := dialedGroup(port, id)
		if found && ok(g) {
			now, state := time.Now(), groupState(g, found, paths)
			if since.IsZero() || state != last {
				since, last = now, state
			}
			if now.Sub(since) >= stable {
				return g, since, nil
			}
		} else {
			since = time.Time{}
		}
		var err error
		if broken != nil {
			err = broken()
		}
		if err == nil && time.Now().After(guard) {
			err = fmt.Errorf("not within %v (a hang guard)", moveGuard)
		}
		if err == nil {
			select {
			case <-tick.C:
				continue
			case <-ctx.Done():
				err = context.Cause(ctx)
			}
		}
		return g, time.Time{}, fmt.Errorf("waiting for %s: %w; the group: %s", what, err, groupState(g, found, paths))
	}
}

// ---- 8 streams at once over one path and over two ---------------------------------------

// aggregate streams groupsAggBytes, shared by groupsAggStreams streams of
// one group, from the clients to the servers at once.
func (b *bench) aggregate(s aggSubject) aggFigure {
	ctx, cancel := context.WithTimeoutCause(context.Background(), b.opt.timeout,
		fmt.Errorf("the streams took over %v (-timeout)", b.opt.timeout))
	defer cancel()
	f := b.aggregateOn(ctx, s)
	if note := b.settleGroups(); note != "" {
		f.note = strings.TrimPrefix(f.note+"; ", "; ") + note
	}
	return f
}

func (b *bench) aggregateOn(ctx context.Context, s aggSubject) aggFigure {
	var f aggFigure
	n := groupsAggStreams
	paths := b.env.Paths()
	gc, err := b.openGroupStreams(ctx, rdmanet.Config{GroupSpread: rdmanet.SpreadLeastStreams}, n, s.failover())
	if err != nil {
		f.missing = err.Error()
		return f
	}
	defer func() {
		if err := gc.close(); err != nil {
			f.note = strings.TrimPrefix(f.note+"; ", "; ") + err.Error()
		}
	}()
	want := s.want(n)
	g, _, err := waitGroupState(ctx, gc.port, "", fmt.Sprintf("its streams placed %v on its links", want), paths, nil, groupsStable,
		func(g rdmanet.GroupInfo) bool { return linksHold(g, want) })
	if err != nil {
		f.missing = err.Error()
		return f
	}
	f.links = describeLinks(g, paths)
	dl, _ := ctx.Deadline()
	for i := range gc.clients {
		gc.clients[i].SetDeadline(dl)
		gc.servers[i].SetDeadline(dl)
	}
	per := max(1, b.scaled(groupsAggBytes)/int64(n))
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = benchkit.Stream(gc.clients[i], gc.servers[i], groupsAggWrite, per)
		}()
	}
	wg.Wait()
	f.elapsed = time.Since(start)
	for i, err := range errs {
		if err != nil {
			f.missing = fmt.Sprintf("stream %d of %d: %v", i+1, n, err)
			return f
		}
	}
	f.mbps = float64(per*int64(n)) / f.elapsed.Seconds() / 1e6
	after, found := dialedGroup(gc.port, g.ID)
	if !found || after.Moved != g.Moved || after.LinksDown != g.LinksDown || !linksHold(after, want) {
		f.note = "the group changed while the streams ran: " + groupState(after, found, paths)
	}
	return f
}

// ---- a group of 100 streams through path 1's failure ---------------------------------------

// gfStream is one stream of the failover, driven as the session's flow is.
type gfStream = pump

// gfFlows are the failover's streams.
type gfFlows struct {
	streams []*gfStream
	stop    chan struct{}
}

func startFlows(gc *groupConns) *gfFlows {
	fl := &gfFlows{stop: make(chan struct{})}
	for i := range gc.clients {
		s := &gfStream{client: gc.clients[i], server: gc.servers[i], writerDone: make(chan struct{}), readerDone: make(chan struct{})}
		fl.streams = append(fl.streams, s)
		s.start(fl.stop, groupsFailoverWrite, groupsFailoverRead)
	}
	return fl
}

// broken says why the first stream that stopped did, if one did.
func (fl *gfFlows) broken() error {
	for i, s := range fl.streams {
		s.mu.Lock()
		w, r := s.writeErr, s.readErr
		s.mu.Unlock()
		switch {
		case w != nil:
			return fmt.Errorf("stream %d: the client's Write failed: %w", i+1, w)
		case r != nil:
			return fmt.Errorf("stream %d: the server's Read ended: %w", i+1, r)
		}
	}
	return nil
}

func (fl *gfFlows) forgetReads() {
	for _, s := range fl.streams {
		s.mu.Lock()
		if n := len(s.reads); n > 1 {
			s.reads = []readAt{s.reads[n-1]}
		}
		s.mu.Unlock()
	}
}

func (fl *gfFlows) totalRead() int64 {
	var n int64
	for _, s := range fl.streams {
		n += s.read.Load()
	}
	return n
}

// everyRead says whether every stream read at least n bytes.
func (fl *gfFlows) everyRead(n int64) bool {
	for _, s := range fl.streams {
		if s.read.Load() < n {
			return false
		}
	}
	return true
}

// silentSince counts the streams with no read completed after t.
func (fl *gfFlows) silentSince(t time.Time) int {
	n := 0
	for _, s := range fl.streams {
		s.mu.Lock()
		if len(s.reads) == 0 || !s.reads[len(s.reads)-1].at.After(t) {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// stalls is each stream's longest gap between reads from the last one at
// or before from to the first one after t, or to end if that is later
// (longestGap), sorted.
func (fl *gfFlows) stalls(from, t, end time.Time) []time.Duration {
	ds := fl.streamStalls(from, t, end)
	slices.Sort(ds)
	return ds
}

// streamStalls is stalls in the streams' order.
func (fl *gfFlows) streamStalls(from, t, end time.Time) []time.Duration {
	var ds []time.Duration
	for _, s := range fl.streams {
		s.mu.Lock()
		reads := slices.Clone(s.reads)
		s.mu.Unlock()
		ds = append(ds, longestGap(reads, from, later(end, firstReadAfter(reads, t))))
	}
	return ds
}

// onDevice says, for each stream, whether its client's link is on dev.
func (fl *gfFlows) onDevice(dev string) []bool {
	on := make([]bool, len(fl.streams))
	for i, s := range fl.streams {
		on[i] = s.client.Info().Device == dev
	}
	return on
}

// longestOf is the longest of ds whose in is want; -1 if none is.
func longestOf(ds []time.Duration, in []bool, want bool) time.Duration {
	longest := time.Duration(-1)
	for i, d := range ds {
		if in[i] == want {
			longest = max(longest, d)
		}
	}
	return longest
}

// rate is the throughput the server ends read together over rateWindow.
func (fl *gfFlows) rate(ctx context.Context) (float64, error) {
	start, from := time.Now(), fl.totalRead()
	select {
	case <-time.After(rateWindow):
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	}
	n, took := fl.totalRead()-from, time.Since(start)
	if err := fl.broken(); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("nothing arrived in %v", rateWindow)
	}
	return float64(n) / took.Seconds() / 1e6, nil
}

// waitUntil polls cond until it holds, a stream stops, moveGuard passes
// or ctx ends.
func (fl *gfFlows) waitUntil(ctx context.Context, what string, cond func() bool) error {
	tick := time.NewTicker(failoverPoll)
	defer tick.Stop()
	guard := time.Now().Add(moveGuard)
	for !cond() {
		if err := fl.broken(); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if time.Now().After(guard) {
			return fmt.Errorf("no %s within %v (a hang guard)", what, moveGuard)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		}
	}
	return nil
}

// finish ends every stream (the client stops writing and half-closes, the
// server reads to EOF), all the waits together bounded, and checks that
// every server end read every byte its client wrote. It returns the bytes
// read in all and what went wrong, if something did.
func (fl *gfFlows) finish() (int64, string) {
	close(fl.stop)
	var problems []string
	wait := func(done <-chan struct{}, expired <-chan struct{}) bool {
		select {
		case <-done:
			return true
		case <-expired:
			return false
		}
	}
	deadline := time.Now().Add(finishGrace)
	for _, s := range fl.streams {
		s.client.SetWriteDeadline(deadline)
	}
	expired := make(chan struct{})
	timer := time.AfterFunc(finishGrace+hangGrace, func() { close(expired) })
	for i, s := range fl.streams {
		if !wait(s.writerDone, expired) {
			problems = append(problems, fmt.Sprintf("stream %d: the client's Write did not return %v after its deadline", i+1, hangGrace))
			continue
		}
		s.mu.Lock()
		werr := s.writeErr
		s.mu.Unlock()
		if werr == nil {
			if err := s.client.CloseWrite(); err != nil {
				problems = append(problems, fmt.Sprintf("stream %d: CloseWrite: %v", i+1, err))
			}
		}
	}
	timer.Stop()
	deadline = time.Now().Add(finishGrace)
	for _, s := range fl.streams {
		s.server.SetReadDeadline(deadline)
	}
	expired = make(chan struct{})
	timer = time.AfterFunc(finishGrace+hangGrace, func() { close(expired) })
	defer timer.Stop()
	var total int64
	for i, s := range fl.streams {
		if !wait(s.readerDone, expired) {
			problems = append(problems, fmt.Sprintf("stream %d: the server's Read did not return %v after its deadline", i+1, hangGrace))
			continue
		}
		s.mu.Lock()
		werr, rerr := s.writeErr, s.readErr
		s.mu.Unlock()
		written, read := s.written.Load(), s.read.Load()
		total += read
		switch {
		case werr != nil:
			problems = append(problems, fmt.Sprintf("stream %d: the client's Write failed: %v", i+1, werr))
		case rerr != nil && !errors.Is(rerr, io.EOF):
			problems = append(problems, fmt.Sprintf("stream %d: the server's Read failed: %v", i+1, rerr))
		case written != read:
			problems = append(problems, fmt.Sprintf("stream %d: the server read %d bytes, the client wrote %d", i+1, read, written))
		}
	}
	if len(problems) == 0 {
		return total, ""
	}
	return total, fmt.Sprintf("%d problem(s) as the %d streams ended, not every byte read; the first: %s", len(problems), len(fl.streams), problems[0])
}

// groupFailover makes the group's failover within -timeout: 100 streams
// of a group over both rxe paths streaming at once, path 1 dropped, every
// stream moved to path 2, path 1 healed, half of them moved back.
func (b *bench) groupFailover() (gf groupFailover) {
	start := time.Now()
	defer func() { gf.took = time.Since(start) }()
	ctx, cancel := context.WithTimeoutCause(context.Background(), b.opt.timeout,
		fmt.Errorf("the failover took over %v (-timeout)", b.opt.timeout))
	defer cancel()
	n := groupsFailoverStreams
	gf.streams, gf.linkDown, gf.firstMove = n, -1, -1
	paths := b.env.Paths()
	fail := func(when string, err error) groupFailover {
		gf.failed = when + ": " + err.Error()
		return gf
	}
	gc, err := b.openGroupStreams(ctx, groupsFailoverConfig, n, true)
	if err != nil {
		return fail("opening the streams", err)
	}
	fl := startFlows(gc)
	defer func() { // after the heal below
		gf.bytes, gf.endProblem = fl.finish()
		if err := gc.close(); err != nil {
			gf.endProblem = strings.TrimPrefix(gf.endProblem+"; ", "; ") + err.Error()
		}
		if note := b.settleGroups(); note != "" {
			gf.endProblem = strings.TrimPrefix(gf.endProblem+"; ", "; ") + note
		}
	}()
	even := []int{n - n/2, n / 2}
	g, _, err := waitGroupState(ctx, gc.port, "", "its streams spread over both paths", paths, fl.broken, groupsStable,
		func(g rdmanet.GroupInfo) bool { return linksHold(g, even) })
	if err != nil {
		return fail("before the fault", err)
	}
	id := g.ID
	if err := fl.waitUntil(ctx, "data on every stream", func() bool { return fl.everyRead(groupsWarmBytes) }); err != nil {
		return fail("before the fault", err)
	}
	fl.forgetReads()
	w0 := time.Now()
	if gf.before, err = fl.rate(ctx); err != nil {
		return fail("before the fault", err)
	}
	gf.quietStall = slices.Max(fl.stalls(w0, time.Now(), time.Now()))
	gf.reached = gfBefore

	g0, found := dialedGroup(gc.port, id)
	if !found || !linksHold(g0, even) {
		return fail("before the fault", fmt.Errorf("the group is not spread over both paths: %s", groupState(g0, found, paths)))
	}
	gf.onPath1 = streamsOn(g0, paths[0].B)
	var path1Device string
	for _, l := range g0.Links {
		if pathOf(l, paths) == "path 1" {
			path1Device = l.Device
		}
	}
	wasOnPath1 := fl.onDevice(path1Device)
	fl.forgetReads()
	heal, t0, err := paths[0].Drop()
	if err != nil {
		return fail("breaking path 1", err)
	}
	defer func() { // a no-op once healed below
		if err := heal(); err != nil {
			gf.labBroken = true
			if gf.failed == "" {
				gf.failed = "healing path 1: " + err.Error()
			}
		}
	}()
	var linkDownAt, firstMoveAt time.Time
	g, movedAt, err := waitGroupState(ctx, gc.port, id, "every stream moved to path 2", paths, fl.broken, 0,
		func(g rdmanet.GroupInfo) bool {
			now := time.Now()
			if linkDownAt.IsZero() && g.LinksDown > g0.LinksDown {
				linkDownAt = now
			}
			if firstMoveAt.IsZero() && g.Moved > g0.Moved {
				firstMoveAt = now
			}
			return len(g.Links) == 1 && g.Links[0].Streams == n && g.Suspended == 0 && g.Moved-g0.Moved >= uint64(gf.onPath1)
		})
	if !linkDownAt.IsZero() {
		gf.linkDown = linkDownAt.Sub(t0)
	}
	if !firstMoveAt.IsZero() {
		gf.firstMove = firstMoveAt.Sub(t0)
	}
	if err != nil {
		return fail("after the fault", err)
	}
	gf.allMoved, gf.moved, gf.movedTo = movedAt.Sub(t0), g.Moved-g0.Moved, describeLinks(g, paths)
	if pathOf(g.Links[0], paths) != "path 2" {
		return fail("after the fault", fmt.Errorf("the streams moved to %s, not to path 2 over RDMA", gf.movedTo))
	}
	windowEnd := movedAt.Add(stallTail)
	err = fl.waitUntil(ctx, "data on every stream after the move", func() bool {
		return time.Now().After(windowEnd) && fl.silentSince(movedAt) == 0
	})
	if err != nil {
		return fail("after the failover", fmt.Errorf("%w (%d streams read nothing after it)", err, fl.silentSince(movedAt)))
	}
	each := fl.streamStalls(t0, movedAt, windowEnd)
	gf.stallMovedMax, gf.stallStayedMax = longestOf(each, wasOnPath1, true), longestOf(each, wasOnPath1, false)
	st := slices.Sorted(slices.Values(each))
	gf.stallMax, gf.stallP50 = slices.Max(st), benchkit.NearestRank(st, 50)
	gf.reached = gfMoved
	fl.forgetReads()

	if gf.during, err = fl.rate(ctx); err != nil {
		return fail("on path 2", err)
	}
	gf.reached = gfDuring

	g1, _ := dialedGroup(gc.port, id)
	fl.forgetReads()
	if err := heal(); err != nil {
		gf.labBroken = true
		return fail("healing path 1", err)
	}
	t1 := time.Now()
	g, backAt, err := waitGroupState(ctx, gc.port, id, "half the streams back on path 1", paths, fl.broken, 0,
		func(g rdmanet.GroupInfo) bool { return linksHold(g, even) && g.Moved-g1.Moved >= uint64(n/2) })
	if err != nil {
		return fail("after the heal", err)
	}
	gf.failback, gf.movedBack = backAt.Sub(t1), g.Moved-g1.Moved
	windowEnd = backAt.Add(stallTail)
	err = fl.waitUntil(ctx, "data on every stream after the failback", func() bool {
		return time.Now().After(windowEnd) && fl.silentSince(backAt) == 0
	})
	if err != nil {
		return fail("after the failback", fmt.Errorf("%w (%d streams read nothing after it)", err, fl.silentSince(backAt)))
	}
	gf.failbackStall = slices.Max(fl.stalls(t1, backAt, windowEnd))
	gf.reached = gfBack
	fl.forgetReads()

	if gf.after, err = fl.rate(ctx); err != nil {
		return fail("back on both paths", err)
	}
	gf.reached = gfAfter
	return gf
}

// summary is the failover's progress line.
func (gf groupFailover) summary() string {
	var parts []string
	if gf.reached >= gfMoved {
		parts = append(parts, fmt.Sprintf("path 1's link down at %s, first move at %s, all %d moved at %s (to %s); stall %s the longest (%s of the streams that moved, %s of those that stayed), %s the median stream's (%s with no fault)",
			optSecs(gf.linkDown), optSecs(gf.firstMove), gf.moved, secs(gf.allMoved), gf.movedTo, secs(gf.stallMax), secsOrNone(gf.stallMovedMax), secsOrNone(gf.stallStayedMax), secs(gf.stallP50), secs(gf.quietStall)))
	}
	if gf.reached >= gfBack {
		parts = append(parts, fmt.Sprintf("failback %s (%d moved back), its stall %s", secs(gf.failback), gf.movedBack, secs(gf.failbackStall)))
	}
	var rates []string
	for _, r := range []struct {
		ph   gfPhase
		name string
		v    float64
	}{{gfBefore, "before", gf.before}, {gfDuring, "during", gf.during}, {gfAfter, "after", gf.after}} {
		if gf.reached >= r.ph {
			rates = append(rates, fmt.Sprintf("%s %s MB/s", r.name, sig(r.v)))
		}
	}
	if len(rates) > 0 {
		parts = append(parts, strings.Join(rates, ", "))
	}
	s := strings.Join(parts, "; ")
	if gf.failed != "" {
		s = strings.TrimPrefix(s+"; ", "; ") + "FAILED: " + gf.failed
	}
	if gf.endProblem != "" {
		s = strings.TrimPrefix(s+"; ", "; ") + "at the end: " + gf.endProblem
	}
	return fmt.Sprintf("%s (%.1fs)", s, gf.took.Seconds())
}

// secsOrNone is secs, or "none" for a figure of no stream (-1).
func secsOrNone(d time.Duration) string {
	if d < 0 {
		return "none"
	}
	return secs(d)
}

// optSecs is secs, or "not seen" for a negative duration.
func optSecs(d time.Duration) string {
	if d < 0 {
		return "not seen"
	}
	return secs(d)
}
