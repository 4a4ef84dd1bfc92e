//go:build linux

package rdmanet_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// The fallback in the lab: every reason a peer or a route can cause, the
// memory of failures, the policies and a listener on both transports.

// dialerA dials from the lab's address A, where an RDMA device is.
func dialerA(env labenv.Env) rdmanet.Dialer {
	return rdmanet.Dialer{LocalAddr: &net.TCPAddr{IP: env.AddrA.AsSlice()}, Timeout: 30 * time.Second}
}

// listenIn listens on TCP on host inside netns ("" for the initial namespace).
func listenIn(tb testing.TB, netns string, host netip.Addr) net.Listener {
	tb.Helper()
	ln, err := labenv.ListenTCP(netns, host)
	if err != nil {
		tb.Fatal(err)
	}
	return ln
}

// plainIn starts a plain TCP server on host inside netns.
func plainIn(t *testing.T, netns string, host netip.Addr) *plainServer {
	t.Helper()
	return servePlain(t, listenIn(t, netns, host))
}

// dialFallback dials addr on "tcp" with d, checks that it fell back to TCP
// for want, and that the server receives exactly what is written.
func dialFallback(t *testing.T, d rdmanet.Dialer, srv *plainServer, want fallback.Reason) (why *fallback.Error, took time.Duration) {
	t.Helper()
	start := time.Now()
	c, err := d.Dial("tcp", srv.ln.Addr().String())
	took = time.Since(start)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	tr, reason := rdmanet.TransportOf(c)
	if tr != fallback.TCP || !errors.As(reason, &why) || why.Reason != want {
		c.Close()
		t.Fatalf("TransportOf = %q, %v; want tcp, %s", tr, reason, want)
	}
	msg := []byte("*1\r\n$4\r\nPING\r\n")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if got := <-srv.conns; !bytes.Equal(got, msg) {
		t.Fatalf("the plain server received %q, want exactly %q", got, msg)
	}
	t.Logf("%s in %v: %v", tr, took.Round(time.Millisecond), why)
	return why, took
}

func TestLabFallbackRejected(t *testing.T) {
	env := labenv.RequireRDMA(t)
	rdmanet.ForgetFailures()
	srv := plainIn(t, "", env.AddrB) // B has RDMA, but no RDMA listener on that port
	why, _ := dialFallback(t, dialerA(env), srv, fallback.ReasonRejected)
	if why.Remembered || why.Err == nil {
		t.Errorf("first dial: %+v, want a fresh failure with its set-up error", why)
	}
	why, _ = dialFallback(t, dialerA(env), srv, fallback.ReasonRejected)
	if !why.Remembered {
		t.Errorf("second dial tried RDMA again: %+v", why)
	}
}

func TestLabFallbackPeerWithoutRDMA(t *testing.T) {
	env := labenv.RequireRDMA(t)
	rdmanet.ForgetFailures()
	// The request that timed out is watched for a late answer: release it
	// before later tests count open cm IDs.
	t.Cleanup(rdmanet.EndLateWatches)
	srv := plainIn(t, env.NoRDMANetns, env.NoRDMAHost)
	// No LocalAddr: the route to the host leaves through its own link, which
	// has an RDMA device; the host behind it has none.
	d := rdmanet.Dialer{Timeout: 30 * time.Second, RDMATimeout: 500 * time.Millisecond}
	// The fallback itself shows that RDMATimeout ended the attempt: rdma_cm
	// keeps a request to a silent host going far longer than the dial's
	// Timeout (30 s), after which the dial would fail instead. How long it
	// took (README: RDMATimeout plus local set-up work) is logged, not
	// compared: a loaded machine stretches the local work at will.
	why, _ := dialFallback(t, d, srv, fallback.ReasonTimeout)
	if why.Remembered || why.PeerAnswers {
		t.Errorf("first dial: %+v, want a fresh timeout of a peer not known to answer", why)
	}
	why, _ = dialFallback(t, d, srv, fallback.ReasonTimeout)
	if !why.Remembered {
		t.Errorf("second dial: %+v, want the remembered failure without a new attempt", why)
	}
}

func TestLabFallbackRouteWithoutRDMA(t *testing.T) {
	env := labenv.RequireRDMA(t)
	srv := plainIn(t, env.PlainNetns, env.PlainHost)
	var d rdmanet.Dialer // no LocalAddr: the route picks the plain interface
	why, _ := dialFallback(t, d, srv, fallback.ReasonRouteNoRDMA)
	if why.Err == nil {
		t.Error("the reason does not say which interface")
	}
}

func TestLabFallbackRDMAOnly(t *testing.T) {
	env := labenv.RequireRDMA(t)
	rdmanet.ForgetFailures()
	srv := plainIn(t, "", env.AddrB)
	for _, d := range []struct {
		name    string
		network string
		policy  fallback.Policy
		env     string
	}{
		{"rdma network", "rdma", fallback.Auto, ""},
		{"RDMAOnly policy", "tcp", fallback.RDMAOnly, ""},
		{"environment", "tcp", fallback.Auto, "rdma"},
	} {
		t.Run(d.name, func(t *testing.T) {
			if d.env != "" {
				t.Setenv(fallback.EnvPolicy, d.env)
			}
			dl := dialerA(env)
			dl.Policy = d.policy
			c, err := dl.Dial(d.network, srv.ln.Addr().String())
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded; RDMA was required and nothing listens over RDMA")
			}
			if !errors.Is(err, fallback.ReasonRejected) {
				t.Fatalf("Dial: %v, want a rejection", err)
			}
		})
	}
	srv.expectNoConnection(t, 200*time.Millisecond)
}

// listenBoth listens on network "tcp" on the lab's address B, which serves
// RDMA and TCP.
func listenBoth(t *testing.T, env labenv.Env) *rdmanet.Listener {
	t.Helper()
	ln, err := rdmanet.Listen("tcp", netip.AddrPortFrom(env.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if got := ln.Transports(); !slices.Equal(got, []fallback.Transport{fallback.RDMA, fallback.TCP}) || ln.RDMAError() != nil {
		t.Fatalf("Transports = %v (RDMAError %v), want both", got, ln.RDMAError())
	}
	return ln
}

// echoAll echoes what each accepted connection sends, n connections (or
// until the listener closes), and reports their transports.
func echoAll(t *testing.T, ln net.Listener, n int) <-chan fallback.Transport {
	kinds := make(chan fallback.Transport, n)
	for range n {
		c, err := ln.Accept()
		if err != nil {
			// Closed: the callers see fewer transports than they expect.
			close(kinds)
			return kinds
		}
		tr, _ := rdmanet.TransportOf(c)
		kinds <- tr
		go func() {
			defer c.Close()
			io.Copy(c, c)
		}()
	}
	close(kinds)
	return kinds
}

func roundTrip(t *testing.T, c net.Conn) {
	t.Helper()
	msg := []byte("over " + c.LocalAddr().Network())
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo: %q, %v", got, err)
	}
}

func TestLabListenBoth(t *testing.T) {
	env := labenv.RequireRDMA(t)
	rdmanet.ForgetFailures()
	ln := listenBoth(t, env)
	before := rdmanet.ReadMetrics().Snapshot
	done := make(chan (<-chan fallback.Transport), 1)
	go func() { done <- echoAll(t, ln, 2) }()

	d := dialerA(env)
	overRDMA, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer overRDMA.Close()
	if _, ok := overRDMA.(*rdmanet.Conn); !ok {
		t.Fatalf("Dial to a listener serving RDMA returned a %T", overRDMA)
	}
	overTCP, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer overTCP.Close()
	roundTrip(t, overRDMA)
	roundTrip(t, overTCP)

	var kinds []fallback.Transport
	for k := range <-done {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	if !slices.Equal(kinds, []fallback.Transport{fallback.RDMA, fallback.TCP}) {
		t.Errorf("accepted %v, want one of each", kinds)
	}
	after := rdmanet.ReadMetrics().Snapshot
	if after.Dialed[fallback.RDMA]-before.Dialed[fallback.RDMA] != 1 ||
		after.Accepted[fallback.RDMA]-before.Accepted[fallback.RDMA] != 1 ||
		after.Accepted[fallback.TCP]-before.Accepted[fallback.TCP] != 1 {
		t.Errorf("Stats before %+v, after %+v", before, after)
	}
}

func TestLabFallbackEnvironment(t *testing.T) {
	env := labenv.RequireRDMA(t)
	ln := listenBoth(t, env)
	done := make(chan (<-chan fallback.Transport), 1)
	go func() { done <- echoAll(t, ln, 1) }()
	t.Setenv(fallback.EnvPolicy, "tcp")
	d := dialerA(env)
	c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tr, why := rdmanet.TransportOf(c); tr != fallback.TCP || !errors.Is(why, fallback.ReasonPolicy) {
		t.Fatalf("TransportOf = %q, %v; want tcp by policy", tr, why)
	}
	roundTrip(t, c)
	if k := <-<-done; k != fallback.TCP {
		t.Errorf("the server accepted %q", k)
	}
}

func TestLabListenAddressWithoutRDMA(t *testing.T) {
	labenv.RequireRDMA(t)
	ln, err := rdmanet.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if !errors.Is(ln.RDMAError(), fallback.ReasonRouteNoRDMA) || !slices.Equal(ln.Transports(), []fallback.Transport{fallback.TCP}) {
		t.Errorf("listener on loopback: %v, %v; want TCP only, route without RDMA", ln.Transports(), ln.RDMAError())
	}
}

// BenchmarkLabFallbackDial is the extra time a dial spends before it falls
// back, against each kind of peer without RDMA; compare with net.Dial's. Run:
//
//	go test -exec $PWD/bin/rdmanet-lab -run '^$' -bench LabFallbackDial -benchtime 5x ./rdmanet/
func BenchmarkLabFallbackDial(b *testing.B) {
	env := labenv.RequireRDMA(b)
	b.Cleanup(rdmanet.EndLateWatches)
	servers := map[string]net.Listener{}
	for name, where := range map[string]struct {
		netns string
		host  netip.Addr
	}{
		"rejected":           {"", env.AddrB},
		"timeout":            {env.NoRDMANetns, env.NoRDMAHost},
		"route-without-rdma": {env.PlainNetns, env.PlainHost},
	} {
		ln := listenIn(b, where.netns, where.host)
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		servers[name] = ln
	}
	// Warm up: the first RDMA use in a process loads rdma-core and opens
	// the devices, once.
	if c, err := rdmanet.Dial("tcp", servers["rejected"].Addr().String()); err == nil {
		c.Close()
	}
	for _, name := range []string{"rejected", "timeout", "route-without-rdma"} {
		addr := servers[name].Addr().String()
		b.Run(name+"/net.Dial", func(b *testing.B) {
			for range b.N {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
		b.Run(name+"/first", func(b *testing.B) {
			for range b.N {
				rdmanet.ForgetFailures()
				c, err := rdmanet.Dial("tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				if _, why := rdmanet.TransportOf(c); !errors.Is(why, fallback.Reason(name)) {
					b.Fatalf("fell back for %v, want %s", why, name)
				}
				c.Close()
			}
		})
		b.Run(name+"/remembered", func(b *testing.B) {
			for range b.N {
				c, err := rdmanet.Dial("tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

// limitedDialEnv, when set to "LOCALIP ADDR", turns the test binary into a
// process that dials ADDR on "tcp" from LOCALIP and prints the transport
// and the fallback reason (see TestMain).
const limitedDialEnv = "RDMANET_TEST_LIMITED_DIAL"

func runLimitedDial(args string) int {
	local, addr, _ := strings.Cut(args, " ")
	d := rdmanet.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 30 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		fmt.Println("dial failed:", err)
		return 1
	}
	defer c.Close()
	tr, why := rdmanet.TransportOf(c)
	var fe *fallback.Error
	if errors.As(why, &fe) {
		fmt.Printf("%s %s %v\n", tr, string(fe.Reason), fe.Err)
	} else {
		fmt.Printf("%s\n", tr)
	}
	return 0
}

// TestLabFallbackResources: a process whose locked memory is limited (and
// which lacks CAP_IPC_LOCK, which would lift the limit) cannot register a
// connection's buffers, and falls back to TCP for "resources", with an
// error that names the limit.
func TestLabFallbackResources(t *testing.T) {
	env := labenv.RequireRDMA(t)
	ln := listenBoth(t, env)
	accepted := make(chan (<-chan fallback.Transport), 1)
	go func() { accepted <- echoAll(t, ln, 1) }()
	for _, tool := range []string{"prlimit", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s (util-linux) is needed: %v", tool, err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// 8 KiB locked at most: not even the first, 16 KiB, receive ring.
	cmd := exec.Command("prlimit", "--memlock=8192:8192", "--",
		"setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--", self)
	cmd.Env = append(os.Environ(), limitedDialEnv+"="+env.AddrA.String()+" "+ln.Addr().String())
	out, err := cmd.CombinedOutput()
	t.Logf("limited process: %s", out)
	if err != nil {
		t.Fatalf("limited process: %v", err)
	}
	if !strings.HasPrefix(string(out), "tcp resources ") {
		t.Fatalf("the limited process printed %q, want a fallback to TCP for resources", out)
	}
	// The registration's error says which limit, what was asked, and how
	// to lift it.
	for _, want := range []string{"ibv_reg_mr", "asked to pin", "of the 8 KiB RLIMIT_MEMLOCK allows", "no CAP_IPC_LOCK"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the fallback's reason %q does not say %q", out, want)
		}
	}
	if k := <-<-accepted; k != fallback.TCP {
		t.Errorf("the server accepted %q, want tcp", k)
	}
}

// TestLabLateAnswer: a dial that stops waiting for the answer of an
// rdmanet listener (RDMATimeout far below its set-up: a busy server)
// falls back to TCP, and the answer that comes late shows the peer
// answers RDMA: a later dial there gets RDMA again, rather than TCP for
// the failure memory's TTL. With the default Config, so that the
// request is a link group's first link, which before this test was
// closed at the timeout, its answer never seen.
func TestLabLateAnswer(t *testing.T) {
	env := labenv.RequireRDMA(t)
	checkLeaks(t) // its cleanup runs last: after the listener's and the watches'
	pinned := vmPin()
	t.Cleanup(func() {
		// The group the late answer made, at both ends, ends with the
		// listener and gives back what it pinned: within a group's bound
		// (leakcheck's 15 s were too short once, under make test with the
		// host loaded: its groups ended after 16 s).
		start := time.Now()
		for vmPin() > pinned && time.Since(start) < benchkit.GroupsEndBound {
			time.Sleep(10 * time.Millisecond)
		}
		if n := vmPin(); n > pinned {
			t.Errorf("%d bytes pinned %v after the listener closed, %d before", n, benchkit.GroupsEndBound, pinned)
		}
		// The pipes Go's splice pool kept for the TCP echoes close, so
		// that the next test counts descriptors of its own only.
		settledFDs(t)
	})
	rdmanet.ForgetFailures()
	t.Cleanup(rdmanet.ForgetFailures)
	t.Cleanup(rdmanet.EndLateWatches)
	ln := listenBoth(t, env)
	go echoAll(t, ln, 1<<20)
	// once dials with d, makes a round trip, and closes.
	once := func(d rdmanet.Dialer) (fallback.Transport, error) {
		t.Helper()
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		roundTrip(t, c)
		return rdmanet.TransportOf(c)
	}
	impatient := dialerA(env)
	impatient.RDMATimeout = time.Millisecond
	tr, reason := once(impatient)
	var why *fallback.Error
	if tr != fallback.TCP || !errors.As(reason, &why) || why.Reason != fallback.ReasonTimeout || why.Remembered {
		t.Fatalf("a dial that waits 1 ms for the answer: %s, %v; want TCP for a fresh timeout", tr, reason)
	}
	start := time.Now()
	for {
		tr, reason := once(dialerA(env))
		if tr == fallback.RDMA {
			t.Logf("RDMA again %v after the dial that fell back", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("later dials still get %s (%v) 20 s after the late answer could come", tr, reason)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
