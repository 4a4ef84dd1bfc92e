//go:build linux && labprobe

package rdmanet_test

// The lab's fault survey (docs/lab.md, "Faults"): what rxe, rdma_cm and
// rdmanet make of each fault the lab can inject, on each side, and how fast.
// This is a probe, not a test: it passes whatever rxe does and logs a
// timeline (times are seconds since the fault was injected) for a person to
// read. Some faults leave rxe unable to set up connections for the rest of
// the VM's life, so run one fault and mode per VM:
//
//	go test -tags labprobe -count=1 -v -run 'TestLabProbe/^linkdown-a$/^raw$' \
//		-exec $PWD/bin/rdmanet-lab ./rdmanet/
//
// or scripts/lab-probe, which runs every one in a VM of its own.
//
// Modes:
//   - raw: queue pairs set up with rdma_cm as rdmanet sets its own up
//     (retry count 6, RNR retry 7, rdma_cm's default ACK timeout; or
//     RDMANET_PROBE_ACK_TIMEOUT=exp to set one), each side posting a 64-byte
//     send every 100 ms; every rdma_cm event and the first completion of each
//     error status are logged. The probe disconnects only after the fault is
//     undone (a removed device's side is closed during the fault, as it must
//     be for the removal to finish).
//   - conn: an rdmanet connection with KeepAlive 1 s streaming both ways;
//     the first error of each side's Read and Write is logged, then a dial on
//     a "tcp" network is made during the fault (does it fall back, how fast).
//     rdmanet disconnects as soon as it gives up, during the fault.
//
// Both modes also run a control pair on the path the fault does not touch,
// and a TCP echo between A and B, and poll the RDMA ports' state. After the
// fault is undone they try new connections on each path and through each
// device of the faulted path (a connection from an address to itself stays
// on one device), which tells whether the fault left a device unusable.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
	"github.com/rdmanet/sdk/verbs"
)

// probeFault is one fault: how to inject it and undo it, and which paths it
// hits (indices into labenv.Env.Paths).
type probeFault struct {
	name    string
	paths   []int
	inject  func(pr *probe)
	restore func(pr *probe)
}

func probeFaults(env labenv.Env) []probeFault {
	p1 := env.Paths()[0]
	p2 := env.Paths()[1]
	linkDown := func(netdev string) probeFault {
		return probeFault{
			paths:  []int{0},
			inject: func(pr *probe) { pr.cmd("ip", "link", "set", netdev, "down") },
			restore: func(pr *probe) {
				pr.cmd("ip", "link", "set", netdev, "up")
				pr.waitPorts(10 * time.Second)
				pr.fixRoutes(p1)
			},
		}
	}
	removeDev := func(dev, netdev string) probeFault {
		var done chan struct{}
		return probeFault{
			paths: []int{0},
			inject: func(pr *probe) {
				pr.removedDev = dev
				done = pr.background("rdma", "link", "delete", dev)
			},
			restore: func(pr *probe) {
				pr.closeEndsOn(dev)
				select {
				case <-done:
				case <-time.After(60 * time.Second):
					pr.logf("rdma link delete %s still blocked 60 s after the probe closed its side: the rest of the run is moot", dev)
					return
				}
				pr.cmd("rdma", "link", "add", dev, "type", "rxe", "netdev", netdev)
				pr.waitPorts(10 * time.Second)
			},
		}
	}
	addrDel := func(a netip.Addr, netdev string) probeFault {
		prefix := fmt.Sprintf("%s/24", a)
		return probeFault{
			paths:  []int{0},
			inject: func(pr *probe) { pr.cmd("ip", "addr", "del", prefix, "dev", netdev) },
			restore: func(pr *probe) {
				pr.cmd("ip", "addr", "add", prefix, "dev", netdev)
				pr.fixRoutes(p1)
			},
		}
	}
	// RoCE (UDP port 4791, rdma_cm's MADs included) dropped as it arrives:
	// the sender's transmit succeeds. TCP between A and B runs over lo and
	// is not touched.
	blockRoCE := func(paths []int, netdevs ...string) probeFault {
		return probeFault{
			paths: paths,
			inject: func(pr *probe) {
				for _, d := range netdevs {
					pr.cmd("tc", "qdisc", "add", "dev", d, "clsact")
					pr.cmd("tc", "filter", "add", "dev", d, "ingress", "protocol", "ip", "prio", "1", "u32",
						"match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", "4791", "0xffff", "action", "drop")
				}
			},
			restore: func(pr *probe) {
				for _, d := range netdevs {
					pr.cmd("tc", "-s", "filter", "show", "dev", d, "ingress")
					pr.cmd("tc", "qdisc", "del", "dev", d, "clsact")
				}
			},
		}
	}
	faults := []probeFault{
		linkDown(p1.NetdevA),
		linkDown(p1.NetdevB),
		removeDev(p1.DevA, p1.NetdevA),
		removeDev(p1.DevB, p1.NetdevB),
		addrDel(p1.A, p1.NetdevA),
		addrDel(p1.B, p1.NetdevB),
		blockRoCE([]int{0}, p1.NetdevA, p1.NetdevB),
		blockRoCE([]int{0, 1}, p1.NetdevA, p1.NetdevB, p2.NetdevA, p2.NetdevB),
		{
			paths: []int{0},
			inject: func(pr *probe) {
				for _, d := range []string{p1.NetdevA, p1.NetdevB} {
					pr.cmd("tc", "qdisc", "add", "dev", d, "root", "netem", "loss", "100%")
				}
			},
			restore: func(pr *probe) {
				for _, d := range []string{p1.NetdevA, p1.NetdevB} {
					pr.cmd("tc", "qdisc", "del", "dev", d, "root")
				}
			},
		},
		// RoCE dropped as A sends it (a drop that fails the transmit): what
		// not to use, for the record.
		{
			paths: []int{0},
			inject: func(pr *probe) {
				pr.cmd("tc", "qdisc", "add", "dev", p1.NetdevA, "clsact")
				pr.cmd("tc", "filter", "add", "dev", p1.NetdevA, "egress", "protocol", "ip", "prio", "1", "u32",
					"match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", "4791", "0xffff", "action", "drop")
			},
			restore: func(pr *probe) {
				pr.cmd("tc", "-s", "filter", "show", "dev", p1.NetdevA, "egress")
				pr.cmd("tc", "qdisc", "del", "dev", p1.NetdevA, "clsact")
			},
		},
	}
	names := []string{"linkdown-a", "linkdown-b", "rmdev-a", "rmdev-b", "addrdel-a", "addrdel-b",
		"roceblock", "roceblock-all", "netem", "egressdrop-a"}
	for i := range faults {
		faults[i].name = names[i]
	}
	return faults
}

func TestLabProbe(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, f := range probeFaults(env) {
		t.Run(f.name, func(t *testing.T) {
			for _, mode := range []string{"raw", "conn"} {
				t.Run(mode, func(t *testing.T) {
					pr := newProbe(t, env, f)
					defer pr.finish()
					if mode == "raw" {
						pr.runRaw()
					} else {
						pr.runConn()
					}
				})
			}
		})
	}
}

// probe is one fault's run.
type probe struct {
	t      *testing.T
	env    labenv.Env
	fault  probeFault
	other  []labenv.Path // the paths the fault does not hit
	window time.Duration // how long to watch the fault

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	injected   time.Time // zero before the fault
	restored   bool
	ends       []*rawEnd
	removedDev string

	uptimeAtFault float64
	counters      map[string]map[string]int64
}

func newProbe(t *testing.T, env labenv.Env, f probeFault) *probe {
	pr := &probe{t: t, env: env, fault: f, window: 30 * time.Second}
	if s := os.Getenv("RDMANET_PROBE_WINDOW"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		pr.window = d
	}
	for i, p := range env.Paths() {
		hit := false
		for _, j := range f.paths {
			hit = hit || i == j
		}
		if !hit {
			pr.other = append(pr.other, p)
		}
	}
	pr.ctx, pr.cancel = context.WithCancel(context.Background())
	pr.wg.Add(1)
	go pr.watchPorts()
	return pr
}

// logf logs with the time since the fault (negative before it).
func (pr *probe) logf(format string, args ...any) {
	pr.mu.Lock()
	at := pr.injected
	pr.mu.Unlock()
	stamp := "  setup"
	if !at.IsZero() {
		stamp = fmt.Sprintf("%+7.2fs", time.Since(at).Seconds())
	}
	pr.t.Logf("%s  %s", stamp, fmt.Sprintf(format, args...))
}

// cmd runs a command, logging it, its output and how long it took.
func (pr *probe) cmd(argv ...string) error {
	start := time.Now()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	msg := strings.TrimSpace(string(out))
	if err != nil {
		msg = strings.TrimSpace(fmt.Sprintf("%v %s", err, msg))
	}
	pr.logf("$ %s (%.2fs) %s", strings.Join(argv, " "), time.Since(start).Seconds(), msg)
	return err
}

// background starts a command and logs when it ends; done is closed then.
func (pr *probe) background(argv ...string) (done chan struct{}) {
	done = make(chan struct{})
	start := time.Now()
	c := exec.Command(argv[0], argv[1:]...)
	var out strings.Builder
	c.Stdout, c.Stderr = &out, &out
	pr.logf("$ %s &", strings.Join(argv, " "))
	if err := c.Start(); err != nil {
		pr.logf("  %v", err)
		close(done)
		return done
	}
	go func() {
		err := c.Wait()
		pr.logf("$ %s ended after %.2fs: %v %s", strings.Join(argv, " "), time.Since(start).Seconds(), err, strings.TrimSpace(out.String()))
		close(done)
	}()
	return done
}

// fixRoutes puts path's subnet routes back in their boot order (A's
// interface first): setting A's interface up again or re-adding its address
// appends its route after B's, and rdma_cm then resolves A's address
// through B's device.
func (pr *probe) fixRoutes(p labenv.Path) {
	subnet := netip.PrefixFrom(p.B, 24).Masked().String()
	pr.cmd("ip", "route", "del", subnet, "dev", p.NetdevB)
	pr.cmd("ip", "route", "append", subnet, "dev", p.NetdevB, "proto", "kernel", "scope", "link", "src", p.B.String())
	pr.cmd("ip", "route", "show", subnet)
}

func portState(dev string) string {
	b, err := os.ReadFile(filepath.Join("/sys/class/infiniband", dev, "ports/1/state"))
	if err != nil {
		return "gone"
	}
	return strings.TrimSpace(string(b))
}

// watchPorts logs every change of the path devices' port state.
func (pr *probe) watchPorts() {
	defer pr.wg.Done()
	devs := []string{pr.env.DevA, pr.env.DevB, pr.env.DevA2, pr.env.DevB2}
	last := map[string]string{}
	for {
		for _, d := range devs {
			if s := portState(d); s != last[d] {
				if last[d] != "" {
					pr.logf("port %s: %s -> %s", d, last[d], s)
				}
				last[d] = s
			}
		}
		select {
		case <-pr.ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitPorts waits until every path device's port is ACTIVE.
func (pr *probe) waitPorts(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		ok := true
		for _, d := range []string{pr.env.DevA, pr.env.DevB, pr.env.DevA2, pr.env.DevB2} {
			ok = ok && strings.Contains(portState(d), "ACTIVE")
		}
		if ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	pr.logf("ports not all ACTIVE after %v", limit)
}

// readCounters reads the path devices' hw_counters.
func (pr *probe) readCounters() map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	for _, d := range []string{pr.env.DevA, pr.env.DevB, pr.env.DevA2, pr.env.DevB2} {
		files, _ := filepath.Glob(filepath.Join("/sys/class/infiniband", d, "ports/1/hw_counters/*"))
		m := map[string]int64{}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
				m[filepath.Base(f)] = n
			}
		}
		out[d] = m
	}
	return out
}

func uptime() float64 {
	b, _ := os.ReadFile("/proc/uptime")
	f, _ := strconv.ParseFloat(strings.Fields(string(b) + " 0")[0], 64)
	return f
}

// inject snapshots the counters and injects the fault; times count from here.
func (pr *probe) inject() {
	pr.counters = pr.readCounters()
	pr.uptimeAtFault = uptime()
	pr.mu.Lock()
	pr.injected = time.Now()
	pr.mu.Unlock()
	pr.logf("FAULT %s (kernel uptime %.2f)", pr.fault.name, pr.uptimeAtFault)
	pr.fault.inject(pr)
}

func (pr *probe) restore() {
	pr.logf("UNDO %s", pr.fault.name)
	pr.fault.restore(pr)
	pr.mu.Lock()
	pr.restored = true
	pr.mu.Unlock()
}

// finish stops the watchers and reports counters and the kernel's messages.
func (pr *probe) finish() {
	pr.mu.Lock()
	ends := append([]*rawEnd(nil), pr.ends...)
	pr.mu.Unlock()
	for _, e := range ends {
		e.close()
	}
	pr.cancel()
	pr.wg.Wait()
	if pr.counters != nil {
		now := pr.readCounters()
		for _, d := range []string{pr.env.DevA, pr.env.DevB, pr.env.DevA2, pr.env.DevB2} {
			var diffs []string
			for k, v := range now[d] {
				if v != pr.counters[d][k] && k != "sent_pkts" && k != "rcvd_pkts" {
					diffs = append(diffs, fmt.Sprintf("%s %+d", k, v-pr.counters[d][k]))
				}
			}
			sort.Strings(diffs)
			pr.logf("counters %s since the fault: sent_pkts %+d rcvd_pkts %+d %s", d,
				now[d]["sent_pkts"]-pr.counters[d]["sent_pkts"], now[d]["rcvd_pkts"]-pr.counters[d]["rcvd_pkts"], strings.Join(diffs, ", "))
		}
	}
	out, _ := exec.Command("dmesg").Output()
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	n := 0
	for sc.Scan() {
		l := sc.Text()
		var ts float64
		if i := strings.Index(l, "]"); strings.HasPrefix(l, "[") && i > 0 {
			ts, _ = strconv.ParseFloat(strings.TrimSpace(l[1:i]), 64)
		}
		if ts >= pr.uptimeAtFault-1 && pr.uptimeAtFault > 0 && n < 60 {
			pr.t.Logf("dmesg: %s (fault at %.2f)", l, pr.uptimeAtFault)
			n++
		}
	}
}

// ---- raw queue pairs ----

const (
	rawRecvs    = 32
	rawRecvBase = 1 << 32
	rawMaxOut   = 4
)

// rawEnd is one side of a raw connection: the verbs objects and a loop that
// posts a send every 100 ms and polls the completion queue every 20 ms.
type rawEnd struct {
	pr   *probe
	name string
	dev  string
	id   *cm.ID
	pd   *verbs.PD
	cq   *verbs.CQ
	qp   *verbs.QP
	buf  *verbs.Buffer
	mr   *verbs.MR

	cancel context.CancelFunc
	done   sync.WaitGroup

	mu           sync.Mutex
	closed       bool
	outstanding  int
	ok, okAfter  int // successful completions, and since the fault
	okRestored   int // since the fault was undone
	lastOK       time.Time
	errs         map[verbs.WCStatus]int
	postFailures int
}

func newRawEnd(pr *probe, name string, id *cm.ID) (*rawEnd, error) {
	ctx := id.Context()
	if ctx == nil {
		return nil, errors.New("ID has no device")
	}
	e := &rawEnd{pr: pr, name: name, dev: ctx.Name(), id: id, errs: map[verbs.WCStatus]int{}}
	var err error
	if e.pd, err = ctx.AllocPD(); err != nil {
		return e, err
	}
	if e.cq, err = ctx.NewCQ(2*rawRecvs, nil, 0); err != nil {
		return e, err
	}
	if e.buf, err = verbs.NewBuffer(64 << 10); err != nil {
		return e, err
	}
	if e.mr, err = e.pd.Register(e.buf, verbs.AccessLocalWrite); err != nil {
		return e, err
	}
	if e.qp, err = id.CreateQP(e.pd, cm.QPConfig{SendCQ: e.cq, RecvCQ: e.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: rawRecvs, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}}); err != nil {
		return e, err
	}
	wrs := make([]verbs.RecvWR, rawRecvs)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: rawRecvBase + uint64(i), Local: e.mr.Slice(i*256, 256)}
	}
	if err := e.qp.PostRecv(wrs); err != nil {
		return e, err
	}
	if s := os.Getenv("RDMANET_PROBE_ACK_TIMEOUT"); s != "" {
		exp, _ := strconv.Atoi(s)
		if err := id.SetAckTimeout(uint8(exp)); err != nil {
			return e, err
		}
	}
	return e, nil
}

// start runs the traffic loop and the event loop.
func (e *rawEnd) start() {
	ctx, cancel := context.WithCancel(e.pr.ctx)
	e.cancel = cancel
	e.pr.mu.Lock()
	e.pr.ends = append(e.pr.ends, e)
	e.pr.mu.Unlock()
	e.done.Add(2)
	go func() {
		defer e.done.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			e.poll()
			if n%5 == 0 {
				e.post()
			}
		}
	}()
	go func() {
		defer e.done.Done()
		for {
			ev, err := e.id.WaitEvent(ctx)
			if err != nil {
				return
			}
			e.pr.logf("%s: rdma_cm event %v (status %d)", e.name, ev.Type, ev.Status)
			if ev.Type == cm.EventDisconnected {
				err := e.id.Disconnect()
				e.pr.logf("%s: answered with a disconnect: %v", e.name, err)
			}
		}
	}()
}

func (e *rawEnd) post() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.outstanding >= rawMaxOut {
		return
	}
	wr := verbs.SendWR{ID: 1, Local: e.mr.Slice(32<<10, 64), Opcode: verbs.OpSend, Flags: verbs.SendSignaled}
	if err := e.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		e.postFailures++
		if e.postFailures == 1 {
			e.pr.logf("%s: post send failed: %v", e.name, err)
		}
		return
	}
	e.outstanding++
}

func (e *rawEnd) poll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	wcs := make([]verbs.WorkCompletion, 32)
	k, err := e.cq.Poll(wcs)
	if err != nil {
		e.pr.logf("%s: poll: %v", e.name, err)
		return
	}
	e.pr.mu.Lock()
	after, restored := !e.pr.injected.IsZero(), e.pr.restored
	e.pr.mu.Unlock()
	for _, wc := range wcs[:k] {
		recv := wc.ID >= rawRecvBase
		if !recv {
			e.outstanding--
		}
		if wc.Status == verbs.WCSuccess {
			e.ok++
			e.lastOK = time.Now()
			if after {
				e.okAfter++
			}
			if restored {
				e.okRestored++
				if e.okRestored == 1 && !strings.HasPrefix(e.name, "check") {
					e.pr.logf("%s: first successful completion since the fault was undone", e.name)
				}
			}
			if recv {
				i := int(wc.ID - rawRecvBase)
				e.qp.PostRecv([]verbs.RecvWR{{ID: wc.ID, Local: e.mr.Slice(i*256, 256)}})
			}
			continue
		}
		e.errs[wc.Status]++
		if e.errs[wc.Status] == 1 {
			kind := "send"
			if recv {
				kind = "recv"
			}
			e.pr.logf("%s: first %s completion with status %v (vendor error %#x), %d successful completions since the fault",
				e.name, kind, wc.Status, wc.VendorErr, e.okAfter)
		}
	}
}

// summary says what the end has seen.
func (e *rawEnd) summary() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []string
	for s, n := range e.errs {
		errs = append(errs, fmt.Sprintf("%v x%d", s, n))
	}
	sort.Strings(errs)
	last := "never"
	if !e.lastOK.IsZero() {
		last = fmt.Sprintf("%.1fs ago", time.Since(e.lastOK).Seconds())
	}
	return fmt.Sprintf("%s on %s: %d ok (%d since the fault, %d since undone), last ok %s, %d sends outstanding, errors [%s], failed posts %d",
		e.name, e.dev, e.ok, e.okAfter, e.okRestored, last, e.outstanding, strings.Join(errs, ", "), e.postFailures)
}

// close stops the loops and destroys the verbs objects, logging how long
// destroying the ID (with its queue pair) took.
func (e *rawEnd) close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	e.mu.Unlock()
	if e.cancel != nil {
		e.cancel()
	}
	start := time.Now()
	if e.id != nil {
		e.id.Close()
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		e.pr.logf("%s: closing its ID took %.2fs", e.name, d.Seconds())
	}
	e.done.Wait()
	for _, c := range []interface{ Close() error }{e.cq, e.mr, e.buf, e.pd} {
		if c != nil && !isNil(c) {
			c.Close()
		}
	}
}

func isNil(c interface{ Close() error }) bool {
	switch v := c.(type) {
	case *verbs.CQ:
		return v == nil
	case *verbs.MR:
		return v == nil
	case *verbs.Buffer:
		return v == nil
	case *verbs.PD:
		return v == nil
	}
	return false
}

// closeEndsOn closes every raw end on dev (a removed device's users must).
func (pr *probe) closeEndsOn(dev string) {
	pr.mu.Lock()
	ends := append([]*rawEnd(nil), pr.ends...)
	pr.mu.Unlock()
	for _, e := range ends {
		if e.dev == dev {
			pr.logf("closing %s (on %s)", e.name, dev)
			e.close()
		}
	}
}

// rawPair connects a raw end on src to one on dst. The ends are not started.
func (pr *probe) rawPair(label string, src, dst netip.Addr, timeout time.Duration) (a, b *rawEnd, err error) {
	ctx, cancel := context.WithTimeout(pr.ctx, timeout)
	defer cancel()
	ln, err := cm.NewID()
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	if err := ln.Bind(netip.AddrPortFrom(dst, 0)); err != nil {
		return nil, nil, fmt.Errorf("bind %v: %w", dst, err)
	}
	if err := ln.Listen(4); err != nil {
		return nil, nil, err
	}
	type result struct {
		e   *rawEnd
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		req, err := ln.GetRequest(ctx)
		if err != nil {
			accepted <- result{nil, fmt.Errorf("request: %w", err)}
			return
		}
		e, err := newRawEnd(pr, label+" B", req.ID)
		if err == nil {
			err = req.ID.Accept(ctx, cm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7})
		}
		accepted <- result{e, err}
	}()
	id, err := cm.NewID()
	if err != nil {
		return nil, nil, err
	}
	a = &rawEnd{pr: pr, id: id}
	if err = id.Resolve(ctx, src, ln.LocalAddr()); err != nil {
		err = fmt.Errorf("resolve: %w", err)
	}
	if err == nil {
		a, err = newRawEnd(pr, label+" A", id)
	}
	if err == nil {
		_, err = id.Connect(ctx, cm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 6, RNRRetryCount: 7})
		if err != nil {
			err = fmt.Errorf("connect: %w", err)
		}
	}
	r := <-accepted
	if err == nil && r.err != nil {
		err = fmt.Errorf("accept: %w", r.err)
	}
	if err != nil {
		a.close()
		if r.e != nil {
			r.e.close()
		}
		return nil, nil, err
	}
	return a, r.e, nil
}

// health tries a new connection from src to dst and one send over it.
func (pr *probe) health(label string, src, dst netip.Addr) {
	start := time.Now()
	a, b, err := pr.rawPair("check", src, dst, 10*time.Second)
	if err != nil {
		pr.logf("CHECK %s (%v -> %v): no connection after %.2fs: %v", label, src, dst, time.Since(start).Seconds(), err)
		return
	}
	defer b.close()
	defer a.close()
	a.post()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		a.poll()
		b.poll()
		if a.ok > 0 && b.ok > 0 {
			pr.logf("CHECK %s (%v -> %v on %s -> %s): ok in %.2fs", label, src, dst, a.dev, b.dev, time.Since(start).Seconds())
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	pr.logf("CHECK %s (%v -> %v): connected, but the send did not complete: %s; %s", label, src, dst, a.summary(), b.summary())
}

// healthAll checks every path, and each device of the faulted paths alone.
func (pr *probe) healthAll() {
	for i, p := range pr.env.Paths() {
		pr.health(fmt.Sprintf("path %d", i+1), p.A, p.B)
	}
	for _, i := range pr.fault.paths {
		p := pr.env.Paths()[i]
		pr.health(p.DevA+" alone", p.A, p.A)
		pr.health(p.DevB+" alone", p.B, p.B)
	}
}

// tcpEcho runs a TCP echo between path 1's addresses, a byte every 200 ms,
// and logs its failures; stop ends it and logs a summary.
func (pr *probe) tcpEcho() (stop func()) {
	p := pr.env.Paths()[0]
	ln, err := net.Listen("tcp", netip.AddrPortFrom(p.B, 0).String())
	if err != nil {
		pr.logf("tcp echo: %v", err)
		return func() {}
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: p.A.AsSlice()}}
	c, err := d.Dial("tcp", ln.Addr().String())
	ln.Close()
	if err != nil {
		pr.logf("tcp echo: %v", err)
		return func() {}
	}
	ctx, cancel := context.WithCancel(pr.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	var n int
	var worst time.Duration
	go func() {
		defer wg.Done()
		b := []byte{0}
		for ctx.Err() == nil {
			start := time.Now()
			c.SetDeadline(start.Add(time.Second))
			if _, err := c.Write(b); err == nil {
				_, err = io.ReadFull(c, b)
			}
			if err != nil && ctx.Err() == nil {
				pr.logf("tcp echo failed: %v", err)
				return
			}
			n++
			worst = max(worst, time.Since(start))
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
		c.Close()
		pr.logf("tcp echo %v -> %v: %d round trips, slowest %v", p.A, p.B, n, worst.Round(time.Millisecond))
	}
}

func (pr *probe) runRaw() {
	p := pr.env.Paths()[pr.fault.paths[0]]
	a, b, err := pr.rawPair("faulted", p.A, p.B, 20*time.Second)
	if err != nil {
		pr.t.Fatalf("connecting the pair to fault: %v", err)
	}
	a.start()
	b.start()
	var control []*rawEnd
	for _, o := range pr.other {
		ca, cb, err := pr.rawPair("control", o.A, o.B, 20*time.Second)
		if err != nil {
			pr.t.Fatalf("connecting the control pair: %v", err)
		}
		ca.start()
		cb.start()
		control = append(control, ca, cb)
	}
	stopEcho := pr.tcpEcho()
	time.Sleep(2 * time.Second)
	for _, e := range append([]*rawEnd{a, b}, control...) {
		pr.logf("%s", e.summary())
	}

	pr.inject()
	for _, at := range []time.Duration{time.Second, 5 * time.Second, 15 * time.Second, pr.window} {
		if at > pr.window {
			continue
		}
		time.Sleep(time.Until(pr.injected.Add(at)))
		for _, e := range append([]*rawEnd{a, b}, control...) {
			pr.logf("%s", e.summary())
		}
	}
	pr.restore()
	time.Sleep(5 * time.Second)
	for _, e := range append([]*rawEnd{a, b}, control...) {
		pr.logf("%s", e.summary())
	}
	for _, e := range []*rawEnd{a, b} {
		if !e.closed {
			err := e.id.Disconnect()
			pr.logf("%s: disconnect: %v", e.name, err)
			break
		}
	}
	time.Sleep(5 * time.Second)
	stopEcho()
	for _, e := range append([]*rawEnd{a, b}, control...) {
		e.close()
	}
	pr.healthAll()
	pr.recheck()
}

// recheck repeats the health checks after RDMANET_PROBE_RECHECK, if set.
func (pr *probe) recheck() {
	s := os.Getenv("RDMANET_PROBE_RECHECK")
	if s == "" {
		return
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		pr.t.Fatal(err)
	}
	pr.logf("waiting %v to check again", d)
	time.Sleep(d)
	pr.healthAll()
}

// ---- rdmanet connections ----

// connOps streams over a pair of rdmanet connections both ways and logs
// the first error of each side's Read and Write.
type connOps struct {
	pr    *probe
	label string
	a, b  net.Conn
	wg    sync.WaitGroup
	mu    sync.Mutex
	ended map[string]bool
}

func (pr *probe) streamBoth(label string, a, b net.Conn) *connOps {
	o := &connOps{pr: pr, label: label, a: a, b: b, ended: map[string]bool{}}
	run := func(name string, f func() error) {
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			err := f()
			timeout := false
			var ne net.Error
			if errors.As(err, &ne) {
				timeout = ne.Timeout()
			}
			pr.logf("%s %s: %v (Timeout() %v)", label, name, err, timeout)
			o.mu.Lock()
			o.ended[name] = true
			o.mu.Unlock()
		}()
	}
	big := make([]byte, 64<<10)
	run("A Write (64 KiB writes)", func() error {
		for {
			if _, err := a.Write(big); err != nil {
				return err
			}
		}
	})
	run("B Read", func() error {
		buf := make([]byte, 64<<10)
		for {
			if _, err := b.Read(buf); err != nil {
				return err
			}
		}
	})
	run("B Write (16 B every 100 ms)", func() error {
		for {
			if _, err := b.Write(big[:16]); err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	run("A Read", func() error {
		buf := make([]byte, 64<<10)
		for {
			if _, err := a.Read(buf); err != nil {
				return err
			}
		}
	})
	return o
}

func (o *connOps) allEnded() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.ended) == 4
}

func (o *connOps) close() {
	o.a.Close()
	o.b.Close()
	o.wg.Wait()
}

// connPair connects an rdmanet client on p.A to a listener on p.B that
// serves RDMA and TCP, which it returns open.
func (pr *probe) connPair(p labenv.Path, cfg rdmanet.Config) (a, b net.Conn, ln *rdmanet.Listener, err error) {
	lc := rdmanet.ListenConfig{Config: cfg}
	ln, err = lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(p.B, 0).String())
	if err != nil {
		return nil, nil, nil, err
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	d := rdmanet.Dialer{LocalAddr: &rdmanet.Addr{AddrPort: netip.AddrPortFrom(p.A, 0)}, Timeout: 20 * time.Second, Config: cfg}
	a, err = d.Dial("rdma", ln.Addr().String())
	if err != nil {
		ln.Close()
		return nil, nil, nil, err
	}
	b = <-accepted
	return a, b, ln, nil
}

func (pr *probe) runConn() {
	cfg := rdmanet.Config{KeepAlive: time.Second}
	p := pr.env.Paths()[pr.fault.paths[0]]
	a, b, ln, err := pr.connPair(p, cfg)
	if err != nil {
		pr.t.Fatalf("connecting the pair to fault: %v", err)
	}
	defer ln.Close()
	ops := pr.streamBoth("faulted", a, b)
	var controls []*connOps
	for _, o := range pr.other {
		ca, cb, cln, err := pr.connPair(o, cfg)
		if err != nil {
			pr.t.Fatalf("connecting the control pair: %v", err)
		}
		cln.Close()
		controls = append(controls, pr.streamBoth("control", ca, cb))
	}
	stopEcho := pr.tcpEcho()
	time.Sleep(2 * time.Second)

	pr.inject()
	deadline := pr.injected.Add(15 * time.Second)
	for !ops.allEnded() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !ops.allEnded() {
		pr.logf("faulted pair: %v of 4 operations ended after 15 s", len(ops.ended))
	}
	pr.logf("listener: transports %v, RDMA error %v, stats %+v", ln.Transports(), ln.RDMAError(), ln.Stats())

	// A dial that may fall back, during the fault.
	start := time.Now()
	d := rdmanet.Dialer{LocalAddr: &rdmanet.Addr{AddrPort: netip.AddrPortFrom(p.A, 0)}, Timeout: 30 * time.Second, Config: cfg}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		pr.logf("dial tcp during the fault: failed after %.2fs: %v", time.Since(start).Seconds(), err)
	} else {
		tr, why := rdmanet.TransportOf(c)
		var fe *fallback.Error
		reason := ""
		if errors.As(why, &fe) {
			reason = fmt.Sprintf(" reason %v peer answers %v", fe.Reason, fe.PeerAnswers)
		}
		pr.logf("dial tcp during the fault: %v after %.2fs%s: %v", tr, time.Since(start).Seconds(), reason, why)
		c.Close()
		select {
		case s := <-accepted:
			if s != nil {
				s.Close()
			}
		case <-time.After(5 * time.Second):
		}
	}
	rdmanet.ForgetFailures()
	pr.logf("listener: transports %v, RDMA error %v, stats %+v", ln.Transports(), ln.RDMAError(), ln.Stats())

	closeStart := time.Now()
	ops.close()
	pr.logf("faulted pair closed in %.2fs", time.Since(closeStart).Seconds())
	if pr.removedDev != "" {
		time.Sleep(5 * time.Second) // rdmanet's linger, and the removal's end
	}
	pr.restore()
	time.Sleep(3 * time.Second)
	for _, o := range controls {
		if o.allEnded() {
			pr.logf("control pair: ended (see above)")
		} else {
			pr.logf("control pair: still streaming")
		}
		o.close()
	}
	stopEcho()
	pr.logf("listener: transports %v, RDMA error %v, stats %+v", ln.Transports(), ln.RDMAError(), ln.Stats())
	// A new rdmanet connection on the faulted path.
	start = time.Now()
	if a, b, l, err := pr.connPair(p, cfg); err != nil {
		pr.logf("CHECK rdmanet on the faulted path: %v after %.2fs", err, time.Since(start).Seconds())
	} else {
		pr.logf("CHECK rdmanet on the faulted path: ok in %.2fs", time.Since(start).Seconds())
		a.Close()
		b.Close()
		l.Close()
	}
	pr.healthAll()
	pr.recheck()
}
