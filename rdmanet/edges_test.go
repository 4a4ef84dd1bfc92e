package rdmanet

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// Edges reachable on any host: arguments Listen and Dial refuse, the
// dialer's resume paths and reserved port, and the small pieces that the
// session and metrics code build on.

// TestListenAndDialRefuseBadArguments: a bad network, Config or address
// fails Listen and Dial at once, with a *net.OpError that says why.
func TestListenAndDialRefuseBadArguments(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, network, addr string
		cfg                 Config
		says                string
	}{
		{"network", "udp", "127.0.0.1:0", Config{}, "unknown network udp"},
		{"receive buffer", "tcp", "127.0.0.1:0", Config{RecvBuffer: 100}, "RecvBuffer 100"},
		{"send buffer", "rdma", "127.0.0.1:0", Config{SendBuffer: 2 << 30}, "SendBuffer"},
		{"receive depth", "tcp4", "127.0.0.1:0", Config{RecvDepth: 1}, "RecvDepth 1"},
		{"address", "tcp", "127.0.0.1", Config{}, "missing port"},
		{"family", "tcp6", "127.0.0.1:0", Config{}, "wrong family"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc := ListenConfig{Config: tc.cfg}
			ln, err := lc.Listen(ctx, tc.network, tc.addr)
			if err == nil {
				ln.Close()
				t.Fatalf("Listen(%s, %s) with %+v succeeded", tc.network, tc.addr, tc.cfg)
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Op != "listen" || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Listen: %v; want a listen *net.OpError saying %q", err, tc.says)
			}
			d := Dialer{Config: tc.cfg, Timeout: hangGuard}
			c, err := d.DialContext(ctx, tc.network, strings.TrimSuffix(tc.addr, ":0")+":1")
			if tc.name == "address" {
				c, err = d.DialContext(ctx, tc.network, tc.addr)
			}
			if err == nil {
				c.Close()
				t.Fatalf("Dial(%s) with %+v succeeded", tc.network, tc.cfg)
			}
			if !errors.As(err, &oe) || oe.Op != "dial" || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Dial: %v; want a dial *net.OpError saying %q", err, tc.says)
			}
		})
	}
	d := Dialer{LocalAddr: &net.UnixAddr{Name: "x", Net: "unix"}}
	if c, err := d.Dial("tcp", "127.0.0.1:1"); err == nil {
		c.Close()
		t.Error("Dial from a Unix address succeeded")
	}
}

// TestFailoverAddrs: the server's other addresses, with the dialed port
// where they name none; anything else is refused.
func TestFailoverAddrs(t *testing.T) {
	dst := netip.MustParseAddrPort("10.1.0.2:7471")
	d := Dialer{FailoverAddrs: []string{"10.2.0.2", "10.3.0.2:9000", "[::ffff:10.4.0.2]:80", "2001:db8::2"}}
	got, err := d.failoverAddrs(dst)
	want := []netip.AddrPort{
		netip.MustParseAddrPort("10.2.0.2:7471"), netip.MustParseAddrPort("10.3.0.2:9000"),
		netip.MustParseAddrPort("10.4.0.2:80"), netip.MustParseAddrPort("[2001:db8::2]:7471"),
	}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("failoverAddrs = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"server-b", "10.2.0.2:http", ""} {
		d := Dialer{FailoverAddrs: []string{"10.2.0.2", bad}}
		if got, err := d.failoverAddrs(dst); err == nil || !strings.Contains(err.Error(), "failover address") {
			t.Errorf("failover address %q: %v, %v; want it refused", bad, got, err)
		}
	}
}

// TestRDMAResumePaths: the dialer's RDMA paths, one per server address in
// order, the first from the address it was dialed from; on a host without
// RDMA no local address can reach the others through a port of its own,
// so routing picks.
func TestRDMAResumePaths(t *testing.T) {
	dsts := []netip.AddrPort{netip.MustParseAddrPort("198.18.0.2:7471"), netip.MustParseAddrPort("198.19.0.2:7471")}
	for _, tc := range []struct {
		src  netip.Addr
		want []string
	}{
		{netip.MustParseAddr("198.18.0.1"), []string{"rdma 198.18.0.1 -> 198.18.0.2:7471", "rdma -> 198.19.0.2:7471"}},
		{netip.Addr{}, []string{"rdma -> 198.18.0.2:7471", "rdma -> 198.19.0.2:7471"}},
	} {
		paths := rdmaResumePaths(nil, tc.src, dsts, Config{})
		var names []string
		for _, p := range paths {
			names = append(names, p.Name)
			if p.TCP || p.Dial == nil {
				t.Errorf("path %q: tcp %v, dial %v", p.Name, p.TCP, p.Dial != nil)
			}
		}
		if !slices.Equal(names, tc.want) {
			t.Errorf("paths from %v: %q, want %q", tc.src, names, tc.want)
		}
	}
}

// TestReserveTCPPort: a session's reserved port, in either family, is a
// port of its own that a dial may then be made from (SO_REUSEADDR), as a
// resume over TCP is; two sessions get two ports.
func TestReserveTCPPort(t *testing.T) {
	for _, ip := range []string{"127.0.0.1", "::1"} {
		t.Run(ip, func(t *testing.T) {
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
			if err != nil {
				t.Skipf("no %s here: %v", ip, err)
			}
			defer ln.Close()
			dst := netip.MustParseAddr(ip)
			r1, err := reserveTCPPort(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer r1.close()
			r2, err := reserveTCPPort(dst)
			if err != nil {
				t.Fatal(err)
			}
			defer r2.close()
			if r1.port == 0 || r1.port == r2.port {
				t.Fatalf("reserved ports %d and %d", r1.port, r2.port)
			}
			d := net.Dialer{Control: reuseAddr, LocalAddr: &net.TCPAddr{IP: dst.AsSlice(), Port: int(r1.port)}}
			c, err := d.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatalf("dialing from the reserved port: %v", err)
			}
			defer c.Close()
			if got := c.LocalAddr().(*net.TCPAddr).Port; got != int(r1.port) {
				t.Errorf("dialed from port %d, want the reserved %d", got, r1.port)
			}
		})
	}
	var none *tcpPortReservation
	none.close() // a session without a reserved port
}

// TestNothingListens: a resume's TCP dial refused by the server's host
// (its listener is gone, and the session with it) is told from other
// failures, which another try may cure.
func TestNothingListens(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = net.DialTimeout("tcp", addr, hangGuard)
	if err == nil {
		t.Skip("something listens on the closed listener's port")
	}
	if !nothingListens(err) {
		t.Errorf("nothingListens(%v) = false for a refused connection", err)
	}
	for _, other := range []error{os.ErrDeadlineExceeded, errors.New("no route to host"), ErrSessionRefused} {
		if nothingListens(other) {
			t.Errorf("nothingListens(%v) = true", other)
		}
	}
}

// TestCountConnectFailure: a failed RDMA attempt is counted under its
// reason in ReadMetrics; a reason the package does not know is not.
func TestCountConnectFailure(t *testing.T) {
	before := ReadMetrics().ConnectFailures
	countConnectFailure(fallback.ReasonTimeout)
	countConnectFailure(fallback.Reason("no-such-reason"))
	after := ReadMetrics().ConnectFailures
	if got := after[fallback.ReasonTimeout] - before[fallback.ReasonTimeout]; got != 1 {
		t.Errorf("%d timeouts counted, want 1", got)
	}
	if _, ok := after["no-such-reason"]; ok {
		t.Error("an unknown reason was counted")
	}
	kinds := AllConnErrorKinds()
	if len(kinds) != len(connErrorKinds) || kinds[0] != ErrorRetryExceeded || !slices.Contains(kinds, ErrorOther) {
		t.Errorf("AllConnErrorKinds = %v", kinds)
	}
	kinds[0] = "changed"
	if AllConnErrorKinds()[0] != ErrorRetryExceeded {
		t.Error("AllConnErrorKinds returns the package's own array")
	}
}

// TestPauseEndsWithTheListener: the listener's pause before a retry ends
// when it passes (true), or at once when the listener closes (false).
func TestPauseEndsWithTheListener(t *testing.T) {
	if !pause(context.Background(), time.Millisecond) {
		t.Error("a pause that passed reported the listener closed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool, 1)
	go func() { done <- pause(ctx, time.Hour) }()
	cancel()
	select {
	case ok := <-done:
		if ok {
			t.Error("a pause the listener's close ended reported it passed")
		}
	case <-time.After(hangGuard):
		t.Fatal("the pause did not end with its context")
	}
}

// TestHello: what a side puts in its private data: nothing in Valkey's
// protocol, else its Hello, with sessions only when ResumeTimeout is set.
func TestHello(t *testing.T) {
	cfg, _ := Config{}.withDefaults()
	if b := cfg.hello(0); b != nil {
		t.Errorf("hello(0) = %x, want none", b)
	}
	if f := (Config{ValkeyCompatible: true, ResumeTimeout: time.Second}).extensions(); f != 0 {
		t.Errorf("a Valkey-compatible side offers %#x", f)
	}
	if f := cfg.extensions(); f&wire.FeatureResume != 0 {
		t.Errorf("a side without ResumeTimeout offers sessions: %#x", f)
	}
	cfg.ResumeTimeout = time.Second
	h, ok, err := wire.DecodeHello(cfg.hello(cfg.extensions()))
	if err != nil || !ok || h.Features != cfg.extensions() || h.Features&wire.FeatureResume == 0 ||
		h.RingSize != uint32(cfg.RecvBuffer) || h.SendRing != uint32(cfg.SendBuffer) || int(h.RecvDepth) != cfg.RecvDepth {
		t.Errorf("hello decodes to %+v, %v, %v", h, ok, err)
	}
}

// TestSuspendedSessionDescribesItself: while a session has no link, it
// reports itself suspended with what broke its link (Session, Info), and
// the stand-in link it runs on refuses every post, over the session's own
// rings, with the last link's addresses.
func TestSuspendedSessionDescribesItself(t *testing.T) {
	goroutineCheck(t)
	p := newSessionPair(t, Config{KeepAlive: time.Second})
	hold := make(chan struct{})
	p.mu.Lock()
	p.hold = hold
	p.mu.Unlock()
	a, _ := p.pipes()
	local, remote := a.Addrs()
	a.Cut(errors.New("test: cable pulled"))
	waitSession(t, p.client, "suspension", func(s SessionState) bool { return s.Suspended })
	if st := p.client.Session(); st.Path != "" || st.Failovers != 0 {
		t.Errorf("suspended session %+v", st)
	}
	if ci := p.client.Info(); !strings.Contains(ci.LastError, "test: cable pulled") || !ci.Session {
		t.Errorf("Info of the suspended session: %+v, want the link's failure", ci)
	}
	// The connection's link is the session's, with no path under it.
	l := p.client.link
	if l != link.Link(p.client.sess) || p.client.sess.Path() != nil {
		t.Fatalf("the suspended session runs on %T, over the path %v", l, p.client.sess.Path())
	}
	if l.Caps().Name != "none" || &l.SendRing()[0] != &a.SendRing()[0] || &l.RecvRing()[0] != &a.RecvRing()[0] {
		t.Errorf("the session's link: %+v, not over the session's rings", l.Caps())
	}
	if addr, key := l.RecvRingKey(); addr != 0 || key != 0 {
		t.Errorf("the pathless link's ring key %#x/%#x", addr, key)
	}
	if err := l.PostSend(nil); err == nil {
		t.Errorf("PostSend without a path succeeded")
	}
	if err := l.PostRecv(1); err == nil {
		t.Errorf("PostRecv without a path succeeded")
	}
	if l, r := l.Addrs(); l != local || r != remote {
		t.Errorf("the pathless link's addresses %v -> %v, want the last path's %v -> %v", l, r, local, remote)
	}
	close(hold)
	roundTrip(t, p.client, p.server)
	if st := p.client.Session(); st.Suspended || st.Failovers != 1 {
		t.Errorf("after the resume: %+v", st)
	}
	closeAndWait(t, p.client)
	closeAndWait(t, p.server)
}

// TestTCPOnlyListener: a listener that serves TCP alone has no RDMA
// statistics, hands Accept plain TCP connections, and after Close its
// Accept says so.
func TestTCPOnlyListener(t *testing.T) {
	lc := ListenConfig{Policy: fallback.TCPOnly}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if st := ln.Stats(); st != (ListenerStats{}) {
		t.Errorf("Stats of a TCP-only listener: %+v", st)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sc.Close()
	if tr, why := TransportOf(sc); tr != fallback.TCP || !errors.Is(why, fallback.ReasonPolicy) {
		t.Errorf("TransportOf the accepted connection: %v, %v", tr, why)
	}
	ln.Close()
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
}

// TestSetupGate: only as many connections' set-ups run at once as the gate
// has turns; a dial waiting for a turn gives up when its context ends,
// and a turn given back lets the next one in.
func TestSetupGate(t *testing.T) {
	g := setupGate(make(chan struct{}, 2))
	for range 2 {
		if err := g.enter(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- g.enter(ctx) }()
	cancel()
	select {
	case err := <-waited:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("a set-up with no turn free whose context ended: %v", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("a set-up waited for a turn past its context")
	}
	g.leave()
	entered := make(chan error, 1)
	go func() { entered <- g.enter(context.Background()) }()
	select {
	case err := <-entered:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(hangGuard):
		t.Fatal("a turn given back let no set-up in")
	}
	if len(g) != 2 {
		t.Errorf("%d turns taken, want 2", len(g))
	}
}

// TestRingMemLendsToRDMALinks: a session's rings lent to an RDMA link's
// Config, with the Config's depths and sizes, stay mapped until that link
// releases them, and a Config that cannot map its rings fails without
// leaving one mapped.
func TestRingMemLendsToRDMALinks(t *testing.T) {
	before := verbs.Resources().Buffers
	cfg, _ := Config{SendBuffer: 64 << 10, RecvBuffer: 128 << 10}.withDefaults()
	m, err := newRingMem(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lc := cfg.linkConfig()
	if lc.SendBuffer != cfg.SendBuffer || lc.RecvBuffer != cfg.RecvBuffer || lc.RecvDepth != cfg.RecvDepth || lc.ControlDepth != controlSlots {
		t.Errorf("linkConfig %+v for %+v", lc, cfg)
	}
	if err := m.lendTo(&lc); err != nil {
		t.Fatal(err)
	}
	if lc.SendMem != m.tx || lc.RecvMem != m.rx || lc.Release == nil {
		t.Fatal("the link's Config does not hold the session's rings")
	}
	m.close()
	if n := verbs.Resources().Buffers - before; n != 2 {
		t.Errorf("%d buffers mapped while an RDMA link holds the rings, want 2", n)
	}
	if err := m.lendTo(&rdmalink.Config{}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("lending the rings of a closed connection: %v", err)
	}
	lc.Release()
	if n := verbs.Resources().Buffers - before; n != 0 {
		t.Errorf("%d buffers mapped after the link released the rings", n)
	}
	for _, bad := range []Config{{SendBuffer: -1, RecvBuffer: 4096}, {SendBuffer: 4096, RecvBuffer: -1}} {
		if m, err := newRingMem(bad); err == nil {
			m.close()
			t.Errorf("rings of %+v made", bad)
		}
	}
	if n := verbs.Resources().Buffers - before; n != 0 {
		t.Errorf("%d buffers left mapped by rings that could not be made", n)
	}
}

// TestListenErrors: what Listen cannot do is a typed error, and leaves
// nothing listening: RDMA alone where RDMA is absent, and a TCP port that
// is taken, under each policy.
func TestListenErrors(t *testing.T) {
	goroutineCheck(t)
	if ln, err := Listen("rdma", "127.0.0.1:0"); err == nil {
		ln.Close()
		t.Log("this host listens on RDMA: the absent case is the lab's")
	} else {
		var fe *fallback.Error
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "listen" || !errors.As(err, &fe) || fe.Reason == "" {
			t.Errorf(`Listen("rdma") without RDMA = %v (%T), want a *net.OpError with a fallback reason`, err, err)
		}
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, policy := range []fallback.Policy{fallback.TCPOnly, fallback.Auto} {
		lc := ListenConfig{Policy: policy}
		ln, err := lc.Listen(context.Background(), "tcp", taken.Addr().String())
		if err == nil {
			ln.Close()
			t.Fatalf("policy %v: Listen on a taken port succeeded", policy)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("policy %v: Listen on a taken port = %v, want a *net.OpError wrapping EADDRINUSE", policy, err)
		}
	}
}

// TestDialTCPFromLocalAddr: a dial that goes over TCP leaves from the
// Dialer's LocalAddr, as net.Dialer's does.
func TestDialTCPFromLocalAddr(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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
	for _, local := range []net.Addr{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 7)}, &net.IPAddr{IP: net.IPv4(127, 0, 0, 7)}} {
		d := Dialer{Policy: fallback.TCPOnly, LocalAddr: local}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("LocalAddr %v: %v", local, err)
		}
		if got := c.LocalAddr().(*net.TCPAddr).IP.String(); got != "127.0.0.7" {
			t.Errorf("LocalAddr %v: the connection left from %v", local, c.LocalAddr())
		}
		c.Close()
	}
	d := Dialer{LocalAddr: &net.UnixAddr{Name: "/x", Net: "unix"}}
	if _, err := d.Dial("tcp", ln.Addr().String()); err == nil {
		t.Error("a Unix LocalAddr was taken for a TCP dial")
	}
}
