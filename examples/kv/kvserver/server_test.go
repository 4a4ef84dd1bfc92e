package kvserver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testEpoch is the fake clock's start, a whole second so that EXAT and TTL
// arithmetic in tests is exact.
const testEpoch = 1_700_000_000_000

type testServer struct {
	*Server
	addr  string
	clock *atomic.Int64 // Unix milliseconds
}

// advance moves the fake clock forward.
func (ts *testServer) advance(d time.Duration) { ts.clock.Add(d.Milliseconds()) }

// startServer serves on a loopback TCP port with a fake clock, and closes the
// server when the test ends.
func startServer(t *testing.T, opts Options) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	clock := new(atomic.Int64)
	clock.Store(testEpoch)
	s := New(opts)
	s.now = clock.Load
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve after Close: %v", err)
		}
	})
	return &testServer{Server: s, addr: ln.Addr().String(), clock: clock}
}

// rawClient talks RESP by hand, to check replies byte for byte.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rawClient{t: t, conn: conn, r: bufio.NewReader(conn)}
}

func (c *rawClient) send(b []byte) {
	c.t.Helper()
	c.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.conn.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// expect reads len(want) bytes and checks they are want.
func (c *rawClient) expect(want string) {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(want))
	n, err := io.ReadFull(c.r, got)
	if string(got[:n]) != want {
		c.t.Fatalf("reply %q (%v), want %q", got[:n], err, want)
	}
}

// do sends a request and reads its reply.
func (c *rawClient) do(args ...string) any {
	c.t.Helper()
	c.send(encode(args...))
	c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	v, err := readReply(c.r)
	if err != nil {
		c.t.Fatalf("%q: %v", args, err)
	}
	return v
}

// expectClosed checks that the server closed the connection, with nothing
// more sent.
func (c *rawClient) expectClosed() {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := c.r.ReadByte()
	if err != io.EOF {
		c.t.Fatalf("read %q, %v; want io.EOF", b, err)
	}
}

// redisError is an error reply.
type redisError string

func (e redisError) Error() string { return string(e) }

// readReply reads one RESP2 reply: a string (status or bulk), int64, nil, a
// redisError or []any.
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(line, "\r\n") || len(line) < 3 {
		return nil, fmt.Errorf("bad reply line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+':
		return body, nil
	case '-':
		return redisError(body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < -1 {
			return nil, fmt.Errorf("bad bulk length %q", body)
		}
		if n == -1 {
			return nil, nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		return string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < -1 {
			return nil, fmt.Errorf("bad array length %q", body)
		}
		if n == -1 {
			return nil, nil
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return a, nil
	}
	return nil, fmt.Errorf("bad reply line %q", line)
}

func TestPipelining(t *testing.T) {
	ts := startServer(t, Options{})
	c := dialRaw(t, ts.addr)
	const n = 10000
	var batch bytes.Buffer
	for range n {
		batch.Write(encode("INCR", "counter"))
	}
	// Written while the replies are read: the replies to 10,000 requests
	// fill socket buffers the client would otherwise not drain.
	go c.conn.Write(batch.Bytes())
	c.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	for i := 1; i <= n; i++ {
		v, err := readReply(c.r)
		if err != nil {
			t.Fatal(err)
		}
		if v != int64(i) {
			t.Fatalf("reply %d: %v", i, v)
		}
	}
	if got := c.do("GET", "counter"); got != "10000" {
		t.Fatalf("GET counter = %v", got)
	}
}

// TestPipelineInlineAndMultibulk: both request forms in one write, split at
// every byte boundary by the network or not.
func TestPipelineMixed(t *testing.T) {
	ts := startServer(t, Options{})
	c := dialRaw(t, ts.addr)
	batch := "PING\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\nGET k\r\n*1\r\n$4\r\nPING\r\n"
	want := "+PONG\r\n+OK\r\n$1\r\nv\r\n+PONG\r\n"
	c.send([]byte(batch))
	c.expect(want)
	// Byte by byte: the server must answer each request as soon as it is
	// complete, even with the next one half sent.
	for i := 0; i < len(batch); i++ {
		c.send([]byte{batch[i]})
	}
	c.expect(want)
}

func TestConcurrentClients(t *testing.T) {
	ts := startServer(t, Options{})
	const clients, each = 8, 500
	var wg sync.WaitGroup
	for range clients {
		c := dialRaw(t, ts.addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				c.conn.Write(encode("INCR", "n"))
				c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := readReply(c.r); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := dialRaw(t, ts.addr).do("GET", "n"); got != strconv.Itoa(clients*each) {
		t.Fatalf("GET n = %v, want %d", got, clients*each)
	}
}

func TestMalformedRequests(t *testing.T) {
	ts := startServer(t, Options{MaxBulk: 1 << 10, MaxArgs: 8})
	bystander := dialRaw(t, ts.addr)
	bystander.send([]byte("SET k v\r\n"))
	bystander.expect("+OK\r\n")
	tests := []struct {
		name, send, reply string
	}{
		{"bad multibulk length", "*x\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
		{"too many arguments", "*9\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
		{"not a bulk string", "*1\r\n:1\r\n", "-ERR Protocol error: expected '$', got ':'\r\n"},
		{"newline in the error", "*1\r\n\r\n", "-ERR Protocol error: expected '$', got ' '\r\n"},
		{"bad bulk length", "*1\r\n$x\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
		{"bulk too big", "*1\r\n$1025\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
		{"bulk without CRLF", "*1\r\n$4\r\nPINGPONG", "-ERR Protocol error: expected CRLF after bulk string\r\n"},
		{"unbalanced quotes", "SET \"k v\r\n", "-ERR Protocol error: unbalanced quotes in request\r\n"},
		{"inline too long", strings.Repeat("a", 70<<10), "-ERR Protocol error: too big inline request\r\n"},
		{"after a good request", "PING\r\n*1\r\n$y\r\n", "+PONG\r\n-ERR Protocol error: invalid bulk length\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dialRaw(t, ts.addr)
			c.send([]byte(tt.send))
			c.expect(tt.reply)
			c.expectClosed()
			if got := bystander.do("GET", "k"); got != "v" {
				t.Fatalf("another client's GET k = %v", got)
			}
		})
	}
	// Clients that vanish mid-request harm no one either.
	for _, partial := range []string{"*2\r\n$3\r\nGET\r\n", "*1\r\n$100\r\nab", "GET"} {
		c := dialRaw(t, ts.addr)
		c.send([]byte(partial))
		c.conn.Close()
	}
	if got := bystander.do("PING"); got != "PONG" {
		t.Fatalf("PING = %v", got)
	}
}

func TestLargeValue(t *testing.T) {
	ts := startServer(t, Options{})
	c := dialRaw(t, ts.addr)
	value := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	c.send(encode("SET", "big", string(value)))
	c.expect("+OK\r\n")
	if got := c.do("GET", "big"); got != string(value) {
		t.Fatalf("GET big: %d bytes, want %d", len(got.(string)), len(value))
	}
	if got := c.do("STRLEN", "big"); got != int64(len(value)) {
		t.Fatalf("STRLEN big = %v", got)
	}
}

func TestQuit(t *testing.T) {
	ts := startServer(t, Options{})
	c := dialRaw(t, ts.addr)
	c.send([]byte("PING\r\nQUIT\r\nPING\r\n"))
	c.expect("+PONG\r\n+OK\r\n")
	c.expectClosed()
}

func TestExpiry(t *testing.T) {
	ts := startServer(t, Options{})
	c := dialRaw(t, ts.addr)
	for i := range 100 {
		c.do("SET", "tmp"+strconv.Itoa(i), "v", "PX", "10")
	}
	c.do("SET", "kept", "v")
	if got := c.do("DBSIZE"); got != int64(101) {
		t.Fatalf("DBSIZE = %v", got)
	}
	// Expired keys are gone for readers at once, and deleted from memory by
	// periodic expiry without being read.
	ts.advance(11 * time.Millisecond)
	if got := c.do("GET", "tmp0"); got != nil {
		t.Fatalf("GET tmp0 = %v after it expired", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.do("DBSIZE") != int64(1) {
		if time.Now().After(deadline) {
			t.Fatalf("DBSIZE = %v: expired keys were not deleted", c.do("DBSIZE"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	ts.ks.mu.Lock()
	volatile := len(ts.ks.volatile)
	ts.ks.mu.Unlock()
	if volatile != 0 {
		t.Fatalf("%d keys left in the volatile set", volatile)
	}
}

func TestOnConnAndClose(t *testing.T) {
	var accepted atomic.Int64
	ts := startServer(t, Options{OnConn: func(net.Conn) { accepted.Add(1) }})
	a, b := dialRaw(t, ts.addr), dialRaw(t, ts.addr)
	a.do("PING")
	b.do("PING")
	if got := accepted.Load(); got != 2 {
		t.Fatalf("OnConn called %d times", got)
	}
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	// Close has closed the live connections and the listener.
	a.expectClosed()
	b.expectClosed()
	if c, err := net.Dial("tcp", ts.addr); err == nil {
		c.Close()
		t.Fatal("dial after Close succeeded")
	}
	// Serve on a closed server returns at once, closing its listener.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.Serve(ln); err != nil {
		t.Fatalf("Serve after Close = %v", err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept on the listener after Serve returned: %v", err)
	}
}

func TestServeListenerClosedElsewhere(t *testing.T) {
	s := New(Options{})
	defer s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	time.Sleep(10 * time.Millisecond)
	ln.Close()
	if err := <-served; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Serve = %v, want net.ErrClosed", err)
	}
}

// TestPanicCostsOneConnection: a panic while serving a client (here in the
// OnConn hook) closes that client's connection and nothing else.
func TestPanicCostsOneConnection(t *testing.T) {
	var n atomic.Int64
	ts := startServer(t, Options{OnConn: func(net.Conn) {
		if n.Add(1) == 1 {
			panic("boom")
		}
	}})
	first := dialRaw(t, ts.addr)
	first.send([]byte("PING\r\n"))
	first.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := first.r.ReadByte(); err == nil {
		t.Fatal("the connection whose goroutine panicked got a reply")
	}
	if got := dialRaw(t, ts.addr).do("PING"); got != "PONG" {
		t.Fatalf("PING after a panic = %v", got)
	}
}
