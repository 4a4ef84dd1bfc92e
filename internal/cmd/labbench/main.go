// Command labbench runs rdmanet's benchmark comparison inside the rdmanet
// lab and prints it as Markdown for BENCHMARKS.md; `make bench` runs it:
//
//	bin/rdmanet-lab bin/labbench > BENCHMARKS.md
//
// In one run, on the lab's two RDMA addresses (client on A, server on B), it
// measures stream throughput for writes of 64 B, 4 KiB, 64 KiB and 1 MiB and
// round trips of 64 B and 4 KiB messages for rdmanet (each mode in
// internal/benchkit.Modes) and Go's TCP in this process, and for rsockets
// (rstream), kernel TCP (rstream -T s) and perftest (ib_write_bw,
// ib_send_lat) as subprocesses, and rdmanet's 64 B and 4 KiB round trips
// with each end in a child process of its own (processes.go). In the same
// rounds it measures rdmanet's modes that run on iWARP and perftest (with
// rdma_cm set-up, -R) on the lab's Soft-iWARP pair, for the report's own
// siw section (siw.go; -only siw runs it alone). It makes every
// measurement in a few rounds (-rounds) and prints the best of each, rdmanet's ratios to perftest and
// rsockets, and whether issue 3's targets are met. Then it measures how a
// resumable session fails over from one RDMA path to the other and to TCP,
// and back (failover.go); what an open connection costs the process
// (descriptors, goroutines, pinned and resident memory a connection pair)
// and how fast pairs open, with 100, 1,000 and 2,000 pairs open at once
// (-conn-pairs), rdmanet beside Go's TCP (connections.go, issue 23; -only
// connections runs it alone); how link groups' streams (issue 25,
// the default between rdmanet peers) open, carry bytes, spread over two paths
// and fail over, beside Go's TCP, connections with a queue pair of their
// own and a session's failover (groups.go; -only groups); and an NBD
// server's storage figures over RDMA and TCP, from a Go client and from
// fio on the kernel's block device (storage.go, with -blockstore). Every
// rdmanet row outside the link groups section is a connection with a
// queue pair of its own (rdmanet's default). Progress goes to standard error. A measurement that fails, hangs or whose output cannot be parsed is
// reported with the reason and the raw output, and a figure none of whose
// rounds succeeded is marked missing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are labbench's flags.
type options struct {
	scale   float64       // multiplies every amount (bytes, round trips)
	timeout time.Duration // per measurement
	budget  time.Duration // for the whole run; later measurements are skipped
	rounds  int           // how often every measurement is made
	impls   string        // comma-separated implementation IDs to run; empty: all
	rev     string        // rdmanet's revision, for the report
	host    string        // a description of the host, for the report

	failoverCycles int // how many failover cycles of each kind to make

	blockstore      string        // examples/blockstore's binary, for the storage section
	storageDuration time.Duration // each storage figure's run

	connPairs        []int // the connections section's counts of pairs
	connDefaultPairs []int // and those of its default Config's rows
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("labbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.Float64Var(&o.scale, "scale", 1, "multiply every amount (bytes streamed, round trips) by `f`, for quick trial runs")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "bound each measurement")
	fs.DurationVar(&o.budget, "budget", 11*time.Minute, "start no round that would end after this much of the run (the first one always runs, its measurements until then)")
	fs.IntVar(&o.rounds, "rounds", 3, "make every measurement in `n` rounds (each figure is the best of its rounds)")
	fs.StringVar(&o.host, "host", "", "describe the host running the lab (CPUs, load) in the report")
	fs.StringVar(&o.rev, "rev", "", "rdmanet's `revision` to name in the report (default: the build's VCS stamp, if any)")
	fs.StringVar(&o.impls, "only", "", "run only these comma-separated implementations ("+siwID+": all of the siw section's), and the failover, connections, link groups and storage sections if "+failoverID+", "+connectionsID+", "+groupsID+" and "+storageID+" are among them (IDs: "+strings.Join(implIDs(), ", ")+")")
	fs.IntVar(&o.failoverCycles, "failover-cycles", 6, "make `n` failover cycles of each kind (RDMA to RDMA, RDMA to TCP) on a resumable session; 0: none")
	fs.StringVar(&o.blockstore, "blockstore", "", "examples/blockstore's binary (`path`), for the storage section; without it the section says it was not measured")
	fs.DurationVar(&o.storageDuration, "storage-duration", 3*time.Second, "run each storage figure for `d` (whole seconds)")
	memlockArgs := fs.String("memlock-child", "", "(internal) be the connections section's child under 8 MiB of RLIMIT_MEMLOCK: `\"A B N TCP\"`")
	echoArgs := fs.String("echo-child", "", "(internal) be the two-process round trips' server: `\"ADDR SIZE N\"`")
	pingArgs := fs.String("ping-child", "", "(internal) be the two-process round trips' client: `\"LOCAL ADDR SIZE N\"`")
	connPairs := fs.String("conn-pairs", "100,1000,2000", "open `n,...` connection pairs at once in the connections section (comma-separated; empty: no section)")
	connDefaultPairs := fs.String("conn-default-pairs", "100,5000", "open `n,...` pairs with the default Config too: the first after the first -conn-pairs step, the others at the end (5,000 need a VM with 8 GiB)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: bin/rdmanet-lab bin/labbench [flags] > report.md\n\n"+
			"Runs inside the rdmanet lab (`make bench` runs it); prints Markdown on stdout, progress on stderr.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *memlockArgs != "" {
		return memlockChild(*memlockArgs)
	}
	if *echoArgs != "" {
		return echoChild(*echoArgs)
	}
	if *pingArgs != "" {
		return pingChild(*pingArgs)
	}
	var err error
	if o.connPairs, err = parsePairs("conn-pairs", *connPairs); err != nil {
		fmt.Fprintf(stderr, "labbench: %v\n", err)
		return 2
	}
	if o.connDefaultPairs, err = parsePairs("conn-default-pairs", *connDefaultPairs); err != nil {
		fmt.Fprintf(stderr, "labbench: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 || !(o.scale > 0) || o.rounds < 1 || o.failoverCycles < 0 || o.storageDuration < time.Second {
		fs.Usage()
		return 2
	}
	if !labenv.InLab() {
		fmt.Fprintln(stderr, "labbench: not in the rdmanet lab; run it as `bin/rdmanet-lab bin/labbench` (or `make bench`)")
		return 2
	}
	env, err := labenv.FromEnviron(os.LookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "labbench: the lab is broken: %v\n", err)
		return 2
	}
	b := newBench(env, o, stderr)
	if o.impls != "" {
		if err := b.only(strings.Split(o.impls, ",")); err != nil {
			fmt.Fprintf(stderr, "labbench: %v\n", err)
			return 2
		}
	}
	b.runAll()
	b.runFailover()
	b.runConnections()
	b.runGroups()
	b.runStorage()
	report := b.report()
	if _, err := io.WriteString(stdout, report.markdown()); err != nil {
		fmt.Fprintf(stderr, "labbench: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "labbench: done in %.0fs; %d of %d figures missing, %d measurements failed\n",
		time.Since(b.start).Seconds(), report.missing(), report.total(), report.failed())
	return 0
}

// ---- what is measured -------------------------------------------------------

// kind is what a measurement measures.
type kind int

const (
	stream   kind = iota // throughput of writes of one size
	pingpong             // round trips of one message size
)

func (k kind) String() string {
	if k == stream {
		return "stream"
	}
	return "round trip"
}

// streamBytes is how many bytes one stream measurement moves (one way) for a
// write size: the lab moves some tens of MB/s at most, and small writes are
// much slower, so each takes a few seconds at most.
func streamBytes(size int) int64 {
	switch {
	case size < 1<<10:
		return 1 << 20
	case size < 64<<10:
		return 8 << 20
	}
	return 16 << 20
}

// roundTrips is how many round trips one round-trip measurement makes.
const roundTrips = 2000

// figure is one measured result, or why there is none.
type figure struct {
	// Stream: megabytes (10^6 bytes) per second.
	mbps float64
	// Round trip, in microseconds. hasPct is false for tools that report
	// only a mean (rstream).
	p50, p99, mean float64
	hasPct         bool

	how     string // what was run (command lines), for the report
	doubt   string // why the figure may be wrong, if there is a reason to think so
	missing string // why there is no figure; empty if there is one
	raw     string // output that could not be parsed, or a goroutine dump
	note    string // anything else worth reporting (an error from Close)
	elapsed time.Duration
}

func (f figure) ok() bool { return f.missing == "" }

// impl is one implementation compared: a row of the figures.
type impl struct {
	id, label string
	// streamLabel and pingpongLabel replace label for one kind, if set.
	streamLabel, pingpongLabel string
	role                       role
	meanOnly                   bool // reports only a mean round trip, no percentiles
	stream                     func(ctx context.Context, size int, total int64) figure
	pingpong                   func(ctx context.Context, size, n int) figure
}

// labelFor is the implementation's label in the results of kind k.
func (im impl) labelFor(k kind) string {
	switch {
	case k == stream && im.streamLabel != "":
		return im.streamLabel
	case k == pingpong && im.pingpongLabel != "":
		return im.pingpongLabel
	}
	return im.label
}

// role says how an implementation's figures are used in the targets.
type role int

const (
	roleRDMANet  role = iota // a subject: ratios and targets per figure
	roleBaseline             // shown only
	roleRsockets             // the reference of "at least as good as rsockets"
	rolePerftest             // the reference of the perftest targets
)

type key struct {
	impl string
	kind kind
	size int
}

type bench struct {
	env    labenv.Env
	opt    options
	log    io.Writer
	impls  []impl
	start  time.Time
	res    map[key][]figure // one per round
	ports  int              // the next port offset for the tools' servers
	hungGo int              // in-process measurements that hung (their goroutines remain)
	done   int              // rounds made
	// targetRounds: the rounds issue 26's target rows made (issue26Target),
	// when more than done.
	targetRounds int

	withFailover bool         // the failover section is to be measured
	failover     *failoverRun // its result, once measured

	withStorage bool        // the storage section is to be measured
	storage     *storageRun // its result, once measured

	withConnections bool      // the connections section is to be measured
	connections     *connsRun // its result, once measured

	withGroups bool       // the link groups section is to be measured
	groups     *groupsRun // its result, once measured
	// unsettledDumped: the log has the goroutines of the first figure
	// after which rdmanet's objects were not all released (settleGroups).
	unsettledDumped bool
}

func newBench(env labenv.Env, o options, log io.Writer) *bench {
	b := &bench{env: env, opt: o, log: log, start: time.Now(), res: map[key][]figure{}, withFailover: o.failoverCycles > 0, withStorage: true,
		withConnections: len(o.connPairs) > 0, withGroups: true}
	for _, m := range ownQueuePairModes() {
		b.impls = append(b.impls, impl{
			id: "rdmanet/" + m.Name, label: "rdmanet (" + m.Name + ")", role: roleRDMANet,
			stream: func(ctx context.Context, size int, total int64) figure {
				return b.goStream(ctx, rdmaDial(b.env, m), size, total)
			},
			pingpong: func(ctx context.Context, size, n int) figure {
				return b.goPingPong(ctx, rdmaDial(b.env, m), size, n)
			},
		})
	}
	// Issue 26: the default mode's stream through the zero-copy calls.
	zeroCopy := ownQueuePair(benchkit.Modes[1])
	b.impls = append(b.impls, impl{
		id: zeroCopyID, label: "rdmanet (zero-copy: WriteBuffer, ReadView)", role: roleRDMANet,
		stream: func(ctx context.Context, size int, total int64) figure {
			return b.inProcess(ctx, rdmaDial(b.env, zeroCopy), func(client, server net.Conn) (figure, error) {
				return streamFigure(benchkit.StreamZeroCopy(client.(*rdmanet.Conn), server.(*rdmanet.Conn), size, total))
			})
		},
	})
	// Issue 26's large transfers: writes sent from registered memory.
	b.impls = append(b.impls, impl{
		id: writeFromID, label: "rdmanet (PostFrom registered memory, Read)", role: roleRDMANet,
		stream: func(ctx context.Context, size int, total int64) figure {
			return b.inProcess(ctx, rdmaDial(b.env, zeroCopy), func(client, server net.Conn) (figure, error) {
				return streamFigure(benchkit.StreamFromMemory(client.(*rdmanet.Conn), server, size, total))
			})
		},
	})
	b.impls = append(b.impls,
		impl{id: "tcp", label: "Go net, TCP", role: roleBaseline,
			stream: func(ctx context.Context, size int, total int64) figure {
				return b.goStream(ctx, tcpDial(b.env), size, total)
			},
			pingpong: func(ctx context.Context, size, n int) figure {
				return b.goPingPong(ctx, tcpDial(b.env), size, n)
			}},
		impl{id: "rsockets", label: "rsockets (rstream)", role: roleRsockets, meanOnly: true,
			stream: func(ctx context.Context, size int, total int64) figure {
				return b.rstreamStream(ctx, false, size, total)
			},
			pingpong: func(ctx context.Context, size, n int) figure {
				return b.rstreamPingPong(ctx, false, size, n)
			}},
		impl{id: "ktcp", label: "kernel TCP (rstream -T s)", role: roleBaseline, meanOnly: true,
			stream: func(ctx context.Context, size int, total int64) figure {
				return b.rstreamStream(ctx, true, size, total)
			},
			pingpong: func(ctx context.Context, size, n int) figure {
				return b.rstreamPingPong(ctx, true, size, n)
			}},
		impl{id: perftestID, label: "perftest", role: rolePerftest,
			streamLabel: "perftest (ib_write_bw)", pingpongLabel: "perftest (ib_send_lat)",
			stream: b.writeBW,
			pingpong: func(ctx context.Context, size, n int) figure {
				return b.sendLat(ctx, false, size, n)
			}},
		// Not a target's reference: ib_send_lat waiting for completions as
		// rdmanet does (on the completion channel) instead of busy polling,
		// to show what waiting costs in the lab. ib_write_bw cannot wait so.
		impl{id: "perftest-events", label: "perftest waiting on events (ib_send_lat -e)", role: roleBaseline,
			pingpong: func(ctx context.Context, size, n int) figure {
				return b.sendLat(ctx, true, size, n)
			}},
	)
	b.impls = append(b.impls, b.processesImpl())
	b.impls = append(b.impls, b.siwImpls()...)
	return b
}

// implIDs lists the IDs -only accepts: the implementations', and the
// failover, connections, link groups and storage sections'.
func implIDs() []string {
	b := newBench(labenv.Default, options{}, io.Discard)
	var ids []string
	for _, im := range b.impls {
		ids = append(ids, im.id)
	}
	return append(ids, siwID, failoverID, connectionsID, groupsID, storageID)
}

// only keeps the implementations whose IDs are in ids, and the failover,
// connections, link groups and storage sections if their IDs are.
func (b *bench) only(ids []string) error {
	var kept []impl
	failover, storage, conns, groups := false, false, false, false
	for _, id := range ids {
		id = strings.TrimSpace(id)
		found := id == failoverID || id == storageID || id == connectionsID || id == groupsID
		failover = failover || id == failoverID
		storage = storage || id == storageID
		conns = conns || id == connectionsID
		groups = groups || id == groupsID
		for _, im := range b.impls {
			if im.id != id && !(id == siwID && im.isSIW()) {
				continue
			}
			found = true
			if !slices.ContainsFunc(kept, func(k impl) bool { return k.id == im.id }) {
				kept = append(kept, im)
			}
		}
		if !found {
			return fmt.Errorf("unknown ID %q (IDs: %s)", id, strings.Join(implIDs(), ", "))
		}
	}
	b.impls = kept
	b.withFailover = b.withFailover && failover
	b.withStorage = storage
	b.withConnections = b.withConnections && conns
	b.withGroups = groups
	return nil
}

func (b *bench) scaled(n int64) int64 { return max(1, int64(math.Round(float64(n)*b.opt.scale))) }

// runAll measures everything but the failover section, in rounds. Within
// a round it goes one size at a time across the implementations, so that a
// slow spell of the host hits one size's figures alike; taking the best of
// the rounds (see combine) takes out what hits a single measurement. A
// round that would not end within the budget (judged by the longest round
// so far), less the time the failover, connections and link groups
// sections are expected to take after the rounds, is not started.
func (b *bench) runAll() {
	type step struct {
		kind kind
		size int
		im   impl
	}
	var steps []step
	for _, size := range benchkit.StreamSizes {
		for _, im := range b.impls {
			if im.stream != nil {
				steps = append(steps, step{stream, size, im})
			}
		}
	}
	for _, size := range benchkit.PingPongSizes {
		for _, im := range b.impls {
			if im.pingpong != nil {
				steps = append(steps, step{pingpong, size, im})
			}
		}
	}
	var longest time.Duration
	reserve := b.failoverReserve() + b.connectionsReserve() + b.groupsReserve()
	for round := 1; round <= b.opt.rounds; round++ {
		if round > 1 && time.Since(b.start)+longest+reserve > b.opt.budget {
			kept := ""
			if reserve > 0 {
				kept = fmt.Sprintf(", less %v kept for the failover, connections and link groups sections", reserve)
			}
			fmt.Fprintf(b.log, "labbench: no round %d: it would end after the run's budget (-budget %v%s)\n", round, b.opt.budget, kept)
			break
		}
		start := time.Now()
		b.done = round
		for i, st := range steps {
			prefix := fmt.Sprintf("labbench: round %d/%d, %d/%d: %s %s, %s:", round, b.opt.rounds, i+1, len(steps),
				st.kind, benchkit.SizeName(st.size), st.im.labelFor(st.kind))
			k := key{st.im.id, st.kind, st.size}
			if round == 1 && time.Since(b.start) > b.opt.budget {
				// The first round leaves a figure or a reason for each.
				b.res[k] = append(b.res[k], figure{missing: fmt.Sprintf("skipped: the run's budget (-budget %v) was used up", b.opt.budget)})
				fmt.Fprintln(b.log, prefix, "skipped (budget used up)")
				continue
			}
			b.measureStep(prefix, st.im, st.kind, st.size)
		}
		longest = max(longest, time.Since(start))
	}
	// Issue 26's targets are ratios of a few figures to perftest's in the
	// same run: when the budget cut the rounds short, those figures and
	// their references get the rounds asked for all the same, interleaved
	// as the others' (a few seconds a round), so that no target rests on
	// one sample while rxe's rounds move by 2 x.
	for round := b.done + 1; round <= b.opt.rounds; round++ {
		for _, st := range steps {
			if !issue26Target(key{st.im.id, st.kind, st.size}) {
				continue
			}
			prefix := fmt.Sprintf("labbench: issue 26's rows, round %d/%d: %s %s, %s:", round, b.opt.rounds,
				st.kind, benchkit.SizeName(st.size), st.im.labelFor(st.kind))
			b.measureStep(prefix, st.im, st.kind, st.size)
		}
		b.targetRounds = round
	}
}

// issue26Target reports whether k is a figure of issue 26's targets or
// their reference: the zero-copy 64 KiB stream and ib_write_bw's, the
// busy-polling 64 B round trip and ib_send_lat's.
func issue26Target(k key) bool {
	switch {
	case k.kind == stream && k.size == 64<<10:
		return k.impl == zeroCopyID || k.impl == perftestID
	case k.kind == pingpong && k.size == 64:
		return k.impl == busyPollID || k.impl == perftestID
	}
	return false
}

// measureStep makes one measurement, adds it to its figure's rounds and
// logs it after prefix.
func (b *bench) measureStep(prefix string, im impl, kd kind, size int) {
	k := key{im.id, kd, size}
	f := b.measure(im, kd, size)
	b.res[k] = append(b.res[k], f)
	switch {
	case !f.ok():
		fmt.Fprintln(b.log, prefix, "FAILED:", f.missing)
		if f.raw != "" {
			fmt.Fprint(b.log, indent(f.raw, "    "))
		}
	case kd == stream:
		fmt.Fprintf(b.log, "%s %.2f MB/s (%.1fs)\n", prefix, f.mbps, f.elapsed.Seconds())
	case f.hasPct:
		fmt.Fprintf(b.log, "%s p50 %.1f us, p99 %.1f us, mean %.1f us (%.1fs)\n", prefix, f.p50, f.p99, f.mean, f.elapsed.Seconds())
	default:
		fmt.Fprintf(b.log, "%s mean %.1f us (%.1fs)\n", prefix, f.mean, f.elapsed.Seconds())
	}
	for _, s := range []string{f.doubt, f.note} {
		if s != "" {
			fmt.Fprintln(b.log, "    "+s)
		}
	}
}

// failoverReserve is how long the failover section is expected to take.
func (b *bench) failoverReserve() time.Duration {
	if !b.withFailover {
		return 0
	}
	return time.Duration(len(moveKinds)*b.opt.failoverCycles) * failoverCycleEstimate
}

// measure makes one measurement, bounded by the -timeout.
func (b *bench) measure(im impl, kd kind, size int) figure {
	ctx, cancel := context.WithTimeoutCause(context.Background(), b.opt.timeout,
		fmt.Errorf("measurement took over %v", b.opt.timeout))
	defer cancel()
	start := time.Now()
	var f figure
	if kd == stream {
		f = im.stream(ctx, size, b.scaled(streamBytes(size)))
	} else {
		f = im.pingpong(ctx, size, int(b.scaled(roundTrips)))
	}
	f.elapsed = time.Since(start)
	return f
}

// ---- in-process measurements (rdmanet, Go's TCP) ------------------------------

// dialer makes a connected pair for one measurement and says how.
type dialer struct {
	how  string
	pair func(ctx context.Context) (client, server net.Conn, err error)
}

func rdmaDial(env labenv.Env, m benchkit.Mode) dialer {
	return dialer{
		how: fmt.Sprintf("rdmanet mode %q (%s; protocol checked to be %q, and each end a connection with a queue pair of its own), client on %s, listener on %s",
			m.Name, describeConfig(m.Config), m.Protocol, env.AddrA, env.AddrB),
		pair: func(ctx context.Context) (net.Conn, net.Conn, error) {
			return checkedPair(ctx, m, env.AddrA, env.AddrB, false)
		},
	}
}

// ownQueuePair is m with Config.NoLinkGroups. Since link groups became
// rdmanet's default (issue 25), the rdmanet mode's default Config makes
// its connection a stream of a link group; the comparison's rdmanet rows
// measure a connection with a queue pair of its own, as before, so that
// they stay comparable with earlier runs (the Link groups section,
// groups.go, measures a group's stream beside one). The other modes keep
// a queue pair of their own anyway (Valkey's protocol, FixedRings and
// BusyPoll make no streams): NoLinkGroups changes nothing for them, and is
// set on every mode so that no rule of rdmanet's is repeated here.
// benchkit.Modes itself is left as it is: rdmanet's own lab benchmarks
// use it too.
func ownQueuePair(m benchkit.Mode) benchkit.Mode {
	m.Config.NoLinkGroups = true
	return m
}

// ownQueuePairModes are benchkit.Modes, each with ownQueuePair.
// zeroCopyID is the zero-copy stream's implementation (issue 26).
const zeroCopyID = "rdmanet/zero-copy"

// perftestID and busyPollID name perftest's row and the busy-polling
// mode's (benchkit.Modes), whose figures issue 26's targets compare.
const (
	perftestID = "perftest"
	busyPollID = "rdmanet/busy-poll 1 ms"
)

// writeFromID is the stream written from registered memory (issue 26).
const writeFromID = "rdmanet/write-from"

func ownQueuePairModes() []benchkit.Mode {
	var modes []benchkit.Mode
	for _, m := range benchkit.Modes {
		modes = append(modes, ownQueuePair(m))
	}
	return modes
}

// checkedPair connects mode m's pair from a to b (benchkit.Mode.Pair,
// which checks the protocol) and checks that both ends are streams of a
// link group if stream, else connections with a queue pair of their own
// (ConnInfo.Stream), so that no figure is labelled wrongly.
func checkedPair(ctx context.Context, m benchkit.Mode, a, b netip.Addr, stream bool) (net.Conn, net.Conn, error) {
	client, server, err := m.Pair(ctx, a, b)
	if err != nil {
		return nil, nil, err
	}
	if err := checkStreams(stream, client, server); err != nil {
		client.Close()
		server.Close()
		return nil, nil, fmt.Errorf("mode %s: %w", m.Name, err)
	}
	return client, server, nil
}

// checkStreams says which of conns is not what stream says: a link
// group's stream (true) or a connection with a queue pair of its own.
func checkStreams(stream bool, conns ...net.Conn) error {
	for _, c := range conns {
		rc, ok := c.(*rdmanet.Conn)
		switch {
		case !ok:
			return fmt.Errorf("a connection of type %T, not rdmanet's", c)
		case stream && rc.Info().Stream == 0:
			return fmt.Errorf("the %s end is a connection with a queue pair of its own, not a link group's stream", rc.Info().Side)
		case !stream && rc.Info().Stream != 0:
			return fmt.Errorf("the %s end is stream %d of a link group, not a connection with a queue pair of its own", rc.Info().Side, rc.Info().Stream)
		}
	}
	return nil
}

// describeConfig is "default Config", or the fields that are set.
func describeConfig(c rdmanet.Config) string {
	v := reflect.ValueOf(c)
	var set []string
	for i := range v.NumField() {
		if f := v.Field(i); !f.IsZero() {
			set = append(set, fmt.Sprintf("%s: %v", v.Type().Field(i).Name, f.Interface()))
		}
	}
	if len(set) == 0 {
		return "default Config"
	}
	return "Config{" + strings.Join(set, ", ") + "}"
}

func tcpDial(env labenv.Env) dialer {
	return dialer{
		how: fmt.Sprintf("Go net TCP, client on %s, listener on %s", env.AddrA, env.AddrB),
		pair: func(ctx context.Context) (net.Conn, net.Conn, error) {
			return benchkit.TCPPair(ctx, env.AddrA, env.AddrB)
		},
	}
}

// hangGrace is how long past its deadlines an in-process measurement may
// run before it is reported as hung (a variable for tests).
var hangGrace = 15 * time.Second

// inProcess connects a pair, sets both ends' deadlines to ctx's, and runs
// measure on it. If measure does not return within hangGrace after the
// deadlines, the figure is reported as hung with the goroutines involved
// (and they are left behind); if closing hangs, that is reported too.
func (b *bench) inProcess(ctx context.Context, d dialer, measure func(client, server net.Conn) (figure, error)) figure {
	client, server, err := d.pair(ctx)
	if err != nil {
		return figure{how: d.how, missing: "connecting: " + err.Error()}
	}
	dl, _ := ctx.Deadline()
	for _, c := range []net.Conn{client, server} {
		if err := c.SetDeadline(dl); err != nil {
			client.Close()
			server.Close()
			return figure{how: d.how, missing: "SetDeadline: " + err.Error()}
		}
	}
	type result struct {
		f   figure
		err error
	}
	done := make(chan result, 1)
	go func() {
		f, err := measure(client, server)
		done <- result{f, err}
	}()
	var f figure
	select {
	case r := <-done:
		f = r.f
		if r.err != nil {
			f = figure{missing: r.err.Error()}
		}
	case <-time.After(time.Until(dl) + hangGrace):
		b.hungGo++
		f = figure{
			missing: fmt.Sprintf("HUNG: no result %v after the connections' deadlines (set to %v after the start); goroutines below", hangGrace, b.opt.timeout),
			raw:     goroutines(),
		}
	}
	f.how = d.how
	closed := make(chan error, 2)
	go func() { closed <- client.Close() }()
	go func() { closed <- server.Close() }()
	timeout := time.After(hangGrace)
	for range 2 {
		select {
		case err := <-closed:
			if err != nil {
				f.note = strings.TrimPrefix(f.note+"; ", "; ") + "Close: " + err.Error()
			}
		case <-timeout:
			note := fmt.Sprintf("Close did not return within %v", hangGrace)
			if f.ok() {
				f.doubt = note
			} else {
				f.missing += "; " + note
			}
			if f.raw == "" {
				f.raw = goroutines()
			}
			return f
		}
	}
	return f
}

// goroutines returns the stacks of this program's goroutines that are in
// rdmanet's code (all of them if none is).
func goroutines() string {
	var sb strings.Builder
	pprof.Lookup("goroutine").WriteTo(&sb, 2)
	all := sb.String()
	var keep []string
	for _, g := range strings.Split(all, "\n\n") {
		if strings.Contains(g, "github.com/rdmanet/sdk/") && !strings.Contains(g, "main.goroutines") {
			keep = append(keep, g)
		}
	}
	if len(keep) == 0 {
		return all
	}
	return strings.Join(keep, "\n\n") + "\n"
}

func (b *bench) goStream(ctx context.Context, d dialer, size int, total int64) figure {
	return b.inProcess(ctx, d, func(client, server net.Conn) (figure, error) {
		return streamFigure(benchkit.Stream(client, server, size, total))
	})
}

// streamFigure is a stream's result as a figure.
func streamFigure(r benchkit.StreamResult, err error) (figure, error) {
	if err != nil {
		return figure{}, err
	}
	return figure{mbps: r.MBps()}, nil
}

func (b *bench) goPingPong(ctx context.Context, d dialer, size, n int) figure {
	return b.inProcess(ctx, d, func(client, server net.Conn) (figure, error) {
		l, err := benchkit.PingPong(client, server, size, n)
		if err != nil {
			return figure{}, err
		}
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
		return figure{p50: us(l.Percentile(50)), p99: us(l.Percentile(99)), mean: us(l.Mean()), hasPct: true}, nil
	})
}

// ---- external tools -------------------------------------------------------------

// port returns a fresh port for a tool's server, so that no run meets the
// remains of the one before.
func (b *bench) port(base int) string {
	b.ports++
	return strconv.Itoa(base + b.ports)
}

// toolFigure runs a tool and turns its output into a figure with parse, or
// into a missing figure with the raw output.
func (b *bench) toolFigure(ctx context.Context, server, client []string, parse func(toolRun) (figure, error)) figure {
	for _, c := range [][]string{server, client} {
		if _, err := exec.LookPath(c[0]); err != nil {
			return figure{missing: fmt.Sprintf("%s is not installed: %v", c[0], err)}
		}
	}
	run, err := serverClient(ctx, server, client)
	how := run.commandLines()
	if err != nil {
		return figure{how: how, missing: err.Error(), raw: run.raw()}
	}
	f, err := parse(run)
	if err != nil {
		return figure{how: how, missing: "could not parse the output: " + err.Error(), raw: run.raw()}
	}
	f.how = how
	return f
}

// rstreamArgs are rstream's arguments for a server (on B) or client (A to B).
func (b *bench) rstreamArgs(socket bool, port string, size, count, iters int) (server, client []string) {
	common := []string{"-f", "ip", "-p", port, "-S", strconv.Itoa(size), "-C", strconv.Itoa(count), "-I", strconv.Itoa(iters)}
	if socket {
		common = append(common, "-T", "s")
	}
	server = append([]string{"rstream", "-b", b.env.AddrB.String()}, common...)
	client = append([]string{"rstream", "-s", b.env.AddrB.String(), "-b", b.env.AddrA.String()}, common...)
	return server, client
}

// rstreamStream: the client sends count transfers of size bytes, then the
// server sends as many back; usec/xfer is the time per transfer, so
// size/usec is the one-way rate.
func (b *bench) rstreamStream(ctx context.Context, socket bool, size int, total int64) figure {
	count := int(max(1, total/int64(size)))
	server, client := b.rstreamArgs(socket, b.port(7470), size, count, 1)
	return b.toolFigure(ctx, server, client, func(r toolRun) (figure, error) {
		us, err := parseRstream(r.clientOut)
		if err != nil {
			return figure{}, err
		}
		return figure{mbps: float64(size) / us}, nil
	})
}

// rstreamPingPong: each of n iterations is one transfer each way; usec/xfer
// is half a round trip, and rstream reports only this mean.
func (b *bench) rstreamPingPong(ctx context.Context, socket bool, size, n int) figure {
	server, client := b.rstreamArgs(socket, b.port(7470), size, 1, n)
	return b.toolFigure(ctx, server, client, func(r toolRun) (figure, error) {
		us, err := parseRstream(r.clientOut)
		if err != nil {
			return figure{}, err
		}
		return figure{mean: 2 * us}, nil
	})
}

// perftestArgs are a perftest tool's arguments for a server (on device B)
// and a client (on device A, connecting to B).
func (b *bench) perftestArgs(tool string, size, iters int, extra ...string) (server, client []string) {
	common := append([]string{"-F", "-s", strconv.Itoa(size), "-n", strconv.Itoa(iters), "-p", b.port(18514)}, extra...)
	server = append([]string{tool, "-d", b.env.DevB}, common...)
	client = append(append([]string{tool, "-d", b.env.DevA}, common...), b.env.AddrB.String())
	return server, client
}

// clockCheck flags a perftest figure that claims more time than its client
// ran: perftest times with the CPU's cycle counter and the clock rate it
// reads from /proc/cpuinfo, which an emulated CPU may get wrong.
func clockCheck(f *figure, claimed, wall time.Duration) {
	if claimed > wall+wall/20 {
		f.doubt = fmt.Sprintf("the figure implies %.2fs of transfers but the client ran only %.2fs: perftest's clock looks wrong", claimed.Seconds(), wall.Seconds())
	}
}

func (b *bench) writeBW(ctx context.Context, size int, total int64) figure {
	iters := int(max(5, total/int64(size)))
	server, client := b.perftestArgs("ib_write_bw", size, iters)
	return b.toolFigure(ctx, server, client, parseWriteBWRun(size, iters))
}

// parseWriteBWRun parses an ib_write_bw run of iters writes of size bytes.
func parseWriteBWRun(size, iters int) func(toolRun) (figure, error) {
	return func(r toolRun) (figure, error) {
		mbps, err := parseWriteBW(r.clientOut, size)
		if err != nil {
			return figure{}, err
		}
		f := figure{mbps: mbps}
		clockCheck(&f, time.Duration(float64(size)*float64(iters)/mbps*1e3)*time.Nanosecond, r.wall)
		return f, nil
	}
}

func (b *bench) sendLat(ctx context.Context, events bool, size, n int) figure {
	var extra []string
	if events {
		extra = append(extra, "-e")
	}
	server, client := b.perftestArgs("ib_send_lat", size, max(5, n), extra...)
	return b.toolFigure(ctx, server, client, parseSendLatRun(size, n))
}

// parseSendLatRun parses an ib_send_lat run of n round trips of size bytes.
func parseSendLatRun(size, n int) func(toolRun) (figure, error) {
	return func(r toolRun) (figure, error) {
		l, err := parseSendLat(r.clientOut, size)
		if err != nil {
			return figure{}, err
		}
		f := figure{p50: l.typical, p99: l.p99, mean: l.avg, hasPct: true}
		clockCheck(&f, time.Duration(float64(n)*l.avg*1e3)*time.Nanosecond, r.wall)
		return f, nil
	}
}

// ---- where and when -----------------------------------------------------------------

// setting describes the run for the report's header.
type setting struct {
	when       time.Time
	took       time.Duration
	kernel     string
	cpu        string
	cpus       int
	env        labenv.Env
	goVersion  string
	revision   string // rdmanet's commit, "(unknown)" if the build has none
	tools      string // package versions
	hungGo     int
	scale      float64
	roundTrips int
	rounds     int // made
	// targetRounds: the rounds issue 26's target rows made, when more.
	targetRounds int
	asked        int // asked for with -rounds
	host         string
}

func (b *bench) setting() setting {
	s := setting{
		when: b.start.UTC(), took: time.Since(b.start), env: b.env,
		kernel: "Linux " + readTrim("/proc/sys/kernel/osrelease"), cpus: runtime.NumCPU(),
		goVersion: runtime.Version(), revision: "(unknown)", hungGo: b.hungGo,
		scale: b.opt.scale, roundTrips: int(b.scaled(roundTrips)), rounds: b.done, targetRounds: b.targetRounds, asked: b.opt.rounds, host: b.opt.host,
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				s.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	if b.opt.rev != "" {
		s.revision = b.opt.rev
	} else if bi, ok := debug.ReadBuildInfo(); ok {
		rev, modified := "", false
		for _, st := range bi.Settings {
			switch st.Key {
			case "vcs.revision":
				rev = st.Value
			case "vcs.modified":
				modified = st.Value == "true"
			}
		}
		if rev != "" {
			s.revision = rev[:min(12, len(rev))]
			if modified {
				s.revision += " with uncommitted changes"
			}
		}
	}
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Package} ${Version}, ", "perftest", "rdmacm-utils").Output()
	if err == nil {
		s.tools = strings.TrimSuffix(strings.TrimSpace(string(out)), ",")
	}
	return s
}

func readTrim(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(unknown)"
	}
	return strings.TrimSpace(string(data))
}

func indent(s, prefix string) string {
	var sb strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			sb.WriteString(prefix + l)
		}
	}
	if sb.Len() > 0 && !strings.HasSuffix(sb.String(), "\n") {
		sb.WriteString("\n")
	}
	return sb.String()
}
