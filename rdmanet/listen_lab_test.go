//go:build linux

package rdmanet_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/rdmacore"
	"github.com/rdmanet/sdk/rdmanet"
	"github.com/rdmanet/sdk/verbs"
	"golang.org/x/sys/unix"
)

// The listener under pressure in the lab: a burst of dials while the VM's
// CPUs are busy, and a peer that requests and never completes.

// spinEnv, when set, turns the test binary into a process that keeps one
// CPU busy until it is killed (see TestMain).
const spinEnv = "RDMANET_TEST_SPIN"

func spin() {
	runtime.GOMAXPROCS(1)
	runtime.LockOSThread()
	for {
	}
}

// busyCPUs keeps n CPUs busy, each with a process of its own, until the
// test ends.
func busyCPUs(t *testing.T, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), spinEnv+"=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
}

// TestLabListenBurstUnderLoad: 48 dials at once on "tcp" to one listener,
// with the default RDMATimeout, while two busy loops hold the VM's two
// CPUs: every connection is RDMA, and echoes.
func TestLabListenBurstUnderLoad(t *testing.T) {
	env := labenv.RequireRDMA(t)
	rdmanet.ForgetFailures()
	t.Cleanup(rdmanet.EndLateWatches)
	const n = 48
	ln := listenBoth(t, env)
	kinds := make(chan (<-chan fallback.Transport), 1)
	go func() { kinds <- echoAll(t, ln, n) }()
	busyCPUs(t, 2)

	d := dialerA(env) // the default RDMATimeout: the point is that it suffices
	conns := make([]net.Conn, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			conns[i], errs[i] = d.Dial("tcp", ln.Addr().String())
		}()
	}
	close(start)
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	rdma := 0
	for i, c := range conns {
		if errs[i] != nil {
			t.Errorf("dial %d: %v", i, errs[i])
			continue
		}
		if tr, why := rdmanet.TransportOf(c); tr != fallback.RDMA {
			t.Errorf("dial %d: %s, because %v", i, tr, why)
			continue
		}
		rdma++
	}
	t.Logf("%d of %d dials got RDMA; listener %+v", rdma, n, ln.Stats())
	var echoes sync.WaitGroup
	for i, c := range conns {
		if c == nil {
			continue
		}
		echoes.Add(1)
		go func() {
			defer echoes.Done()
			msg := []byte(fmt.Sprintf("connection %d", i))
			c.SetDeadline(time.Now().Add(time.Minute))
			if _, err := c.Write(msg); err != nil {
				t.Errorf("connection %d: write: %v", i, err)
				return
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
				t.Errorf("connection %d: echo %q, %v", i, got, err)
			}
		}()
	}
	echoes.Wait()
	served := 0
	for k := range <-kinds {
		if k != fallback.RDMA {
			t.Errorf("the listener accepted a %s connection", k)
		}
		served++
	}
	if served != n {
		t.Errorf("the listener accepted %d connections, want %d", served, n)
	}
}

// stalledRequest sends a connection request from src to dst that never
// completes: its client never takes the server's answer, so the server's
// accept waits for a confirmation that does not come. cm's IDs cannot do
// that (the process's dispatcher takes every event, and librdmacm confirms
// an answer as it takes it), so the client is made with rdma-core's calls
// on an event channel of its own that nobody reads after the request.
func stalledRequest(t *testing.T, src netip.Addr, dst netip.AddrPort) {
	t.Helper()
	ch, _, err := rdmacore.CreateEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	id, err := rdmacore.CreateID(ch)
	if err != nil {
		rdmacore.DestroyEventChannel(ch)
		t.Fatal(err)
	}
	var pd *verbs.PD
	var cq *verbs.CQ
	qp := false
	t.Cleanup(func() {
		if qp {
			rdmacore.DestroyQP(id)
		}
		rdmacore.DestroyID(id) // before the CQ and PD
		if cq != nil {
			cq.Close()
		}
		if pd != nil {
			pd.Close()
		}
		rdmacore.DestroyEventChannel(ch)
	})
	// step starts one step of the set-up and waits (blocking, on the
	// channel's descriptor) for the event that ends it.
	step := func(what string, want cm.EventType, start error) {
		t.Helper()
		if start != nil {
			t.Fatalf("%s: %v", what, start)
		}
		ev, err := rdmacore.GetCMEvent(ch)
		rdmacore.AckCMEvent(ev) // rdma_destroy_id waits for it
		if err != nil || cm.EventType(ev.Type) != want {
			t.Fatalf("%s: event %v (status %d), %v", what, cm.EventType(ev.Type), ev.Status, err)
		}
	}
	srcSA, dstSA := rdmacore.EncodeSockaddr(netip.AddrPortFrom(src, 0)), rdmacore.EncodeSockaddr(dst)
	step("resolve address", cm.EventAddrResolved, rdmacore.ResolveAddr(id, &srcSA, &dstSA, 5000))
	step("resolve route", cm.EventRouteResolved, rdmacore.ResolveRoute(id, 5000))
	dev := verbs.AdoptContext(rdmacore.IDContext(id))
	if pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if cq, err = dev.NewCQ(8, nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rdmacore.CreateQP(id, pd.Raw(), cq.Raw(), cq.Raw(), nil, verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}, false); err != nil {
		t.Fatal(err)
	}
	qp = true
	if err := rdmacore.Connect(id, &rdmacore.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 6, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds; the bound is a hang guard.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !eventually(cond) {
		t.Fatalf("still waiting for %s", what)
	}
}

// fdTargets maps this process's open descriptors to what they are.
func fdTargets() map[string]string {
	out := map[string]string{}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			out[e.Name()] = target
		}
	}
	return out
}

// settledFDs counts this process's open descriptors once the pipes Go's
// splice pool held are closed: after two collections (a sync.Pool's items
// go at the second) and their finalizers.
func settledFDs(t *testing.T) int {
	n := -1
	for i := 0; i < 100; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
		m := openFDs(t)
		if m == n {
			break
		}
		n = m
	}
	return n
}

// eventually polls cond until it holds, for a minute at most.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// TestLabListenStalledHandshake: a request whose peer never completes the
// handshake does not delay the next: a dial made while it is pending gets
// RDMA, and the stalled one is still pending when it has.
func TestLabListenStalledHandshake(t *testing.T) {
	env := labenv.RequireRDMA(t)
	checkLeaks(t)
	rdmanet.ForgetFailures()
	// The stalled handshake's bound, and below it the dial's wait for its
	// answer: a listener that waited for the stalled handshake first would
	// answer the dial only after its bound, too late. Both far above what
	// a dial takes on a loaded host: the product's 10 s and a wait of 9 s
	// left too little room (make test at a1a6005 and 24a42e7 under two
	// busy loops, two lab VMs at once: dials of 9 and 23.8 s). Registered
	// before the listener's Close, so that it is restored after.
	const bound, answerWait = time.Minute, 40 * time.Second
	rdmanet.SetAcceptTimeout(t, bound)
	ln := listenBoth(t, env)
	port := ln.Addr().(*net.TCPAddr).AddrPort().Port()
	stalled := time.Now() // before the listener takes it: its bound runs from later
	stalledRequest(t, env.AddrA, netip.AddrPortFrom(env.AddrB, port))
	waitFor(t, "the listener to take the stalled request", func() bool { return ln.Stats().Handshaking == 1 })

	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	d := dialerA(env)
	d.RDMATimeout = answerWait
	d.Timeout = 3 * bound // a hang guard: above the group's attempt and then a connection's own
	dialed := time.Now()
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tr, why := rdmanet.TransportOf(c); tr != fallback.RDMA {
		t.Fatalf("the dial behind a stalled handshake got %s after %v (%v after the stalled request), because %v; listener %+v",
			tr, time.Since(dialed).Round(time.Millisecond), time.Since(stalled).Round(time.Millisecond), why, ln.Stats())
	}
	// A listener that waited for the stalled handshake would answer the
	// dial's second request (a connection of its own, made when the
	// group's link got no answer) once the bound passed.
	if since := time.Since(stalled); since >= bound {
		t.Fatalf("the dial behind a stalled handshake got RDMA only %v after the stalled request, past its %v bound", since.Round(time.Millisecond), bound)
	}
	t.Logf("the dial behind a stalled handshake got RDMA in %v", time.Since(dialed).Round(time.Millisecond))
	s := <-accepted
	if s == nil {
		t.Fatal("Accept failed")
	}
	defer s.Close()
	// Still pending, unless its bound passed meanwhile (when it was 10 s,
	// on a loaded host the dial and Accept above took that long once:
	// make test at 7c45bd2): ended by its bound then, as it should be.
	st := ln.Stats()
	ended := st.Handshaking == 0 && st.HandshakeFailures == 1 && time.Since(stalled) >= bound
	if st.Handshakes != 1 || (st.Handshaking != 1 && !ended) {
		t.Errorf("listener %+v %v after the stalled request: want the stalled handshake still pending (or ended by its %v bound) beside the finished one", st, time.Since(stalled).Round(time.Millisecond), bound)
	}
	if ended {
		t.Logf("the stalled handshake ended by its bound before the check (%v)", time.Since(stalled).Round(time.Millisecond))
	}
	go io.Copy(s, s)
	roundTrip(t, c)
	c.Close()
	s.Close()
	ln.Close() // ends the stalled handshake; leakcheck then counts
	if st := ln.Stats(); st.Handshaking != 0 || st.HandshakeFailures != 1 {
		t.Errorf("listener after Close %+v: want the stalled handshake ended", st)
	}
}

// TestLabDescriptorBurst runs one process (dialers and listener) into its
// descriptor limit and back (issues 22 and 23): dials on "tcp", 16 at a
// time. First with RLIMIT_NOFILE at the descriptors open, so that no
// device's completion channel can be made: every dial is a *net.OpError
// matching EMFILE (or TCP for reason resources), and nothing panics. Then
// with room for 8 more: the shared channels take 4, and all 96 dials get
// RDMA, since a connection holds no descriptor of its own. Once everything
// is closed and the limit is back, every descriptor, verbs object, cm ID
// and goroutine is back to its baseline, and the listener serves RDMA
// again.
func TestLabDescriptorBurst(t *testing.T) {
	env := labenv.RequireRDMA(t)
	checkLeaks(t)
	rdmanet.ForgetFailures()
	t.Cleanup(rdmanet.ForgetFailures)
	// roomy is the room of the second burst: the shared channels (2
	// descriptors a device, and its asynchronous events' 1) and what
	// rdma-core opens for a moment while it sets a connection up (it scans
	// its devices in sysfs for every dial), 16 dials at a time; far less
	// than 96 connections held 4 descriptors an end before issue 23.
	const dials, together, roomy = 96, 16, 80
	// Connections of their own: the limit is run into by their set-ups
	// (a group's streams make none, and its link outlives the first
	// connection).
	cfg := rdmanet.Config{RecvBuffer: 16 << 10, SendBuffer: 16 << 10, RecvDepth: 16, KeepAlive: 30 * time.Second, NoLinkGroups: true}
	lc := rdmanet.ListenConfig{Config: cfg, Backlog: 64}
	ln, err := lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(env.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The server echoes; an Accept error other than Close is passing
	// (EMFILE), retried after a pause as net/http does.
	var (
		mu          sync.Mutex
		served      []net.Conn
		acceptErrs  int
		serving     sync.WaitGroup
		acceptsDone = make(chan struct{})
	)
	go func() {
		defer close(acceptsDone)
		for {
			c, err := ln.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			mu.Lock()
			if err != nil {
				acceptErrs++
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
				continue
			}
			served = append(served, c)
			mu.Unlock()
			serving.Add(1)
			go func() {
				defer serving.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()

	// One connection first: rdma-core opens its devices once per process,
	// and that is no part of the burst's cost.
	d := dialerA(env)
	d.Config = cfg
	warm, err := d.Dial("rdma", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, warm)
	warm.Close()
	mu.Lock()
	served[0].Close()
	served = nil
	mu.Unlock()
	serving.Wait()
	waitFor(t, "the first connection to go", func() bool { return verbs.Resources() == (verbs.ResourceCounts{}) && cm.LiveIDs() == 1 })
	// The echo's io.Copy between TCP connections splices through pipes
	// that Go's internal/poll keeps in a sync.Pool and closes when the GC
	// drops them: both counts are taken after collecting garbage.
	baseFDs, baseGoroutines := settledFDs(t), runtime.NumGoroutine()
	baseVerbs, baseIDs := verbs.Resources(), cm.LiveIDs()
	baseFiles := fdTargets()
	var saved unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &saved); err != nil {
				t.Errorf("restore RLIMIT_NOFILE: %v", err)
			}
		}
	}
	t.Cleanup(restore)

	var conns []net.Conn
	// burst lowers the limit to room for headroom more descriptors and
	// dials; the connections stay open until the test closes them.
	burst := func(headroom int) map[string]int {
		t.Helper()
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &saved); err != nil { // to count what is open
			t.Fatal(err)
		}
		lowered := saved
		lowered.Cur = uint64(openFDs(t) + headroom)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lowered); err != nil {
			t.Fatal(err)
		}
		outcome := make([]string, dials)
		opened := make([]net.Conn, dials)
		sem := make(chan struct{}, together)
		var wg sync.WaitGroup
		for i := range dials {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				c, err := d.Dial("tcp", ln.Addr().String())
				if err != nil {
					var op *net.OpError
					if !errors.As(err, &op) || !errors.Is(err, syscall.EMFILE) {
						t.Errorf("dial %d: %v (%T), want a *net.OpError matching EMFILE", i, err, err)
					}
					outcome[i] = "error: " + err.Error()
					return
				}
				opened[i] = c
				tr, why := rdmanet.TransportOf(c)
				var fe *fallback.Error
				switch {
				case tr == fallback.RDMA:
					outcome[i] = "rdma"
					msg := []byte(fmt.Sprintf("dial %d", i))
					c.SetDeadline(time.Now().Add(time.Minute))
					got := make([]byte, len(msg))
					if _, err := c.Write(msg); err != nil {
						t.Errorf("dial %d: write: %v", i, err)
					} else if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
						t.Errorf("dial %d: echo %q, %v", i, got, err)
					}
				case !errors.As(why, &fe) || fe.Reason != fallback.ReasonResources:
					t.Errorf("dial %d: %s, because %v; want RDMA or reason resources", i, tr, why)
					outcome[i] = "tcp: " + fmt.Sprint(why)
				default:
					outcome[i] = "tcp: resources"
				}
			}()
		}
		wg.Wait()
		counts := map[string]int{}
		for _, o := range outcome {
			if strings.HasPrefix(o, "error: ") {
				o = "error"
			}
			counts[o]++
		}
		t.Logf("%d dials at the limit of %d descriptors (%d free): %v; listener %+v", dials, lowered.Cur, headroom, counts, ln.Stats())
		for i, o := range outcome {
			if strings.HasPrefix(o, "error: ") {
				t.Logf("dial %d, for example: %s", i, o)
				break
			}
		}
		for _, c := range opened {
			if c != nil {
				conns = append(conns, c)
			}
		}
		return counts
	}
	if counts := burst(0); counts["rdma"] != 0 || counts["error"] == 0 {
		t.Errorf("with no descriptor free: %v; want no RDMA (no completion channel can be made) and typed errors", counts)
	}
	if counts := burst(roomy); counts["rdma"] != dials {
		t.Errorf("with %d descriptors free: %v; want every dial over RDMA (a connection holds no descriptor)", roomy, counts)
	}

	for _, c := range conns {
		c.Close()
	}
	mu.Lock()
	for _, c := range served {
		c.Close()
	}
	mu.Unlock()
	serving.Wait()
	restore()
	back := eventually(func() bool {
		runtime.GC()
		return verbs.Resources() == baseVerbs && cm.LiveIDs() == baseIDs && openFDs(t) == baseFDs
	})
	var changed []string
	for fd, target := range fdTargets() {
		if baseFiles[fd] != target {
			changed = append(changed, fmt.Sprintf("%s -> %s", fd, target))
		}
	}
	if !back {
		t.Fatalf("resources after the burst: %+v, %d cm IDs, %d descriptors; before it %+v, %d, %d; changed descriptors: %v",
			verbs.Resources(), cm.LiveIDs(), openFDs(t), baseVerbs, baseIDs, baseFDs, changed)
	}
	waitFor(t, "the goroutines back to their baseline", func() bool { return runtime.NumGoroutine() <= baseGoroutines })

	// The listener serves RDMA again (after its pause, if it stopped).
	waitFor(t, "the listener to serve RDMA", func() bool { return ln.RDMAError() == nil })
	c, err := d.Dial("rdma", ln.Addr().String())
	if err != nil {
		t.Fatalf("an RDMA dial after the burst: %v", err)
	}
	defer c.Close()
	roundTrip(t, c)
	ln.Close()
	<-acceptsDone
}
