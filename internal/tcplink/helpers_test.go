package tcplink

import (
	"net"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/rdmanet/sdk/internal/linktest"
)

// hangGuard bounds every wait in these tests. It only turns a hang into a
// failure: no test compares how long something took against an upper bound.
const hangGuard = linktest.HangGuard

// The helpers of link tests (internal/linktest), by the names these tests
// use.
var (
	checkGoroutines = linktest.CheckGoroutines
	pollAll         = linktest.PollAll
	waitFor         = linktest.WaitFor
	waitEnd         = linktest.WaitEnd
	kinds           = linktest.Kinds
	wantKinds       = linktest.WantKinds
	checkEnd        = linktest.CheckEnd
	data            = linktest.Data
	control         = linktest.Control
	marker          = linktest.Marker
	post            = linktest.Post
	fill            = linktest.Fill
)

// shareSend and shareRecv register plain memory of size bytes on a link in
// carrier mode.
func shareSend(t testing.TB, l *Link, size int) ([]byte, uint32) {
	t.Helper()
	return linktest.ShareSend(t, l, nil, size)
}

func shareRecv(t testing.TB, l *Link, size int) ([]byte, uint64, uint32) {
	t.Helper()
	return linktest.ShareRecv(t, l, nil, size)
}

// spec sizes one end.
type spec struct {
	sendRing, recvRing                 int
	sendDepth, recvDepth, controlDepth int
	carrier                            bool
}

func testSpec() spec {
	return spec{sendRing: 4096, recvRing: 4096, sendDepth: 8, recvDepth: 4, controlDepth: 2}
}

func (s spec) config() Config {
	return Config{
		SendRing: make([]byte, s.sendRing), RecvRing: make([]byte, s.recvRing),
		SendDepth: s.sendDepth, RecvDepth: s.recvDepth, ControlDepth: s.controlDepth,
		Carrier: s.carrier,
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
