package tcplink

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

// hangGuard bounds every wait in these tests. It only turns a hang into a
// failure: no test compares how long something took against an upper bound.
const hangGuard = 60 * time.Second

// spec sizes one end.
type spec struct {
	sendRing, recvRing                 int
	sendDepth, recvDepth, controlDepth int
}

func testSpec() spec {
	return spec{sendRing: 4096, recvRing: 4096, sendDepth: 8, recvDepth: 4, controlDepth: 2}
}

func (s spec) config() Config {
	return Config{
		SendRing: make([]byte, s.sendRing), RecvRing: make([]byte, s.recvRing),
		SendDepth: s.sendDepth, RecvDepth: s.recvDepth, ControlDepth: s.controlDepth,
	}
}

// transports are what the contract tests run over: loopback TCP, and
// net.Pipe (synchronous, unbuffered: every write waits for the reader).
var transports = []string{"tcp", "pipe"}

// connPair returns two connected sockets over transport tr, closed when the
// test ends.
func connPair(t testing.TB, tr string) (net.Conn, net.Conn) {
	t.Helper()
	var a, b net.Conn
	switch tr {
	case "pipe":
		a, b = net.Pipe()
	case "tcp":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				t.Error(err)
			}
			accepted <- c
		}()
		if a, err = net.Dial("tcp", ln.Addr().String()); err != nil {
			t.Fatal(err)
		}
		if b = <-accepted; b == nil {
			t.FailNow()
		}
	default:
		t.Fatalf("transport %q", tr)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

// newPair returns two links over tr, closed when the test ends, after which
// the test fails if goroutines outlive them.
func newPair(t testing.TB, tr string, sa, sb spec) (*Link, *Link) {
	t.Helper()
	ca, cb := connPair(t, tr)
	return newLinks(t, ca, cb, sa, sb)
}

func newLinks(t testing.TB, ca, cb net.Conn, sa, sb spec) (*Link, *Link) {
	t.Helper()
	checkGoroutines(t)
	a, err := New(ca, sa.config())
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(cb, sb.config())
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

// forEachTransport runs f as a subtest over every transport.
func forEachTransport(t *testing.T, f func(t *testing.T, tr string)) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) { f(t, tr) })
	}
}

// checkGoroutines fails t if, once t's later cleanups ran, more goroutines
// run than before; it waits for them to end, up to hangGuard.
func checkGoroutines(t testing.TB) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(hangGuard)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("%d goroutines before the test, %d after:\n%s",
					before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// pollAll takes every completion queued now.
func pollAll(t testing.TB, l *Link) []link.Completion {
	t.Helper()
	var all []link.Completion
	cs := make([]link.Completion, 3) // small, so that Poll is called more than once
	for {
		n, err := l.Poll(cs)
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if n == 0 {
			return all
		}
		all = append(all, cs[:n]...)
	}
}

// waitFor takes n completions, sleeping in Wait between them as the engine
// does (arm, poll once more, wait).
func waitFor(t testing.TB, l *Link, n int) []link.Completion {
	t.Helper()
	guard := time.AfterFunc(hangGuard, l.Wake)
	defer guard.Stop()
	var all []link.Completion
	cs := make([]link.Completion, n)
	for len(all) < n {
		k, err := l.Poll(cs[:n-len(all)])
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if k > 0 {
			all = append(all, cs[:k]...)
			continue
		}
		if err := l.Arm(); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		if k, err = l.Poll(cs[:n-len(all)]); err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if k > 0 {
			all = append(all, cs[:k]...)
			continue
		}
		if err := l.Wait(); err != nil {
			t.Fatalf("Wait, with %d of %d completions (%v): %v", len(all), n, kinds(all), err)
		}
	}
	return all
}

// waitEnd takes completions until the link's last one (Disconnected or
// Failed), reposting receives as messages consume them, and returns them
// all.
func waitEnd(t testing.TB, l *Link) []link.Completion {
	t.Helper()
	var all []link.Completion
	for {
		c := waitFor(t, l, 1)[0]
		all = append(all, c)
		switch c.Kind {
		case link.Disconnected, link.Failed:
			if more := pollAll(t, l); len(more) > 0 {
				t.Fatalf("completions after the last one: %v", kinds(more))
			}
			return all
		case link.DataArrived, link.ControlArrived:
			if err := l.PostRecv(1); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// kinds summarizes completions: "send-done 1", "data-arrived 100",
// "control-arrived", "disconnected", "failed".
func kinds(cs []link.Completion) []string {
	var s []string
	for _, c := range cs {
		switch c.Kind {
		case link.SendDone:
			s = append(s, fmt.Sprintf("%v %d", c.Kind, c.ID))
		case link.DataArrived:
			s = append(s, fmt.Sprintf("%v %d", c.Kind, c.N))
		default:
			s = append(s, c.Kind.String())
		}
	}
	return s
}

func wantKinds(t testing.TB, who string, got []link.Completion, want ...string) {
	t.Helper()
	g := kinds(got)
	if fmt.Sprint(g) != fmt.Sprint(want) {
		t.Errorf("%s's completions: %q, want %q", who, g, want)
	}
}

// data returns a SendData request writing SendRing[off:off+n] at offset
// remote of the peer's ring.
func data(peer *Link, off, n, remote uint32, signaled bool, id uint64) link.SendWR {
	addr, rkey := peer.RecvRingKey()
	return link.SendWR{Kind: link.SendData, Signaled: signaled, ID: id, Off: off, N: n, Remote: addr + uint64(remote), RKey: rkey}
}

func control(id uint64, b byte) link.SendWR {
	wr := link.SendWR{Kind: link.SendControl, Signaled: true, ID: id}
	for i := range wr.Msg {
		wr.Msg[i] = b + byte(i)
	}
	return wr
}

func marker(peer *Link, id uint64) link.SendWR {
	addr, rkey := peer.RecvRingKey()
	return link.SendWR{Kind: link.SendMarker, Signaled: true, ID: id, Remote: addr, RKey: rkey}
}

func post(t testing.TB, l *Link, wrs ...link.SendWR) {
	t.Helper()
	if err := l.PostSend(wrs); err != nil {
		t.Fatalf("PostSend: %v", err)
	}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

// checkEnd checks that cs are first (in order), then any of maybe (each at
// most once, in any order), then Disconnected.
func checkEnd(t testing.TB, who string, cs []link.Completion, first []string, maybe ...string) {
	t.Helper()
	g := kinds(cs)
	bad := func() {
		t.Errorf("%s's completions %q: want %q, then any of %q, then disconnected", who, g, first, maybe)
	}
	if len(g) < len(first)+1 || fmt.Sprint(g[:len(first)]) != fmt.Sprint(first) || g[len(g)-1] != "disconnected" {
		bad()
		return
	}
	left := append([]string(nil), maybe...)
next:
	for _, k := range g[len(first) : len(g)-1] {
		for i, m := range left {
			if k == m {
				left = append(left[:i], left[i+1:]...)
				continue next
			}
		}
		bad()
		return
	}
}

func (l *Link) recvPostedNow() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recvPosted
}

func (l *Link) rnrWaitsNow() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rnrWaits
}

func (l *Link) seqNow() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq
}

// faultConn is a net.Conn whose writes fail once fail was called.
type faultConn struct {
	net.Conn
	mu  sync.Mutex
	err error
}

func (c *faultConn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
}

func (c *faultConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("writev", err)}
	}
	return c.Conn.Write(b)
}

// errHostUnreachable is a path failure.
var errHostUnreachable = syscall.EHOSTUNREACH
