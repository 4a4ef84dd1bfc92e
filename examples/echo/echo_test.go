package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
)

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var listening = regexp.MustCompile(`listening on (\S+) over \[([a-z ]+)\]`)

// startServer runs `echo server` until the test ends and returns its
// address and the transports it serves.
func startServer(t *testing.T, args ...string) (addr, transports string, out *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out = new(syncBuffer)
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"server"}, args...), out, out) }()
	t.Cleanup(func() {
		cancel()
		if rc := <-done; rc != 0 {
			t.Errorf("server exited %d: %s", rc, out)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := listening.FindStringSubmatch(out.String()); m != nil {
			return m[1], m[2], out
		}
	}
	t.Fatalf("the server did not start: %s", out)
	return "", "", nil
}

func runClient(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	rc := run(context.Background(), append([]string{"client"}, args...), &out, &out)
	return out.String(), rc
}

func TestEchoOverTCP(t *testing.T) {
	addr, transports, srv := startServer(t, "-addr", "127.0.0.1:0")
	if transports != "tcp" {
		t.Errorf("on loopback the server serves %q, want tcp only (loopback has no RDMA)", transports)
	}
	out, rc := runClient(t, "-addr", addr, "-count", "3", "-size", "1000")
	if rc != 0 {
		t.Fatalf("client exited %d: %s", rc, out)
	}
	for _, want := range []string{"over tcp (fell back: ", "1000 bytes: seq=3 ", "3 round trips of 1000 bytes over tcp: min "} {
		if !strings.Contains(out, want) {
			t.Errorf("client output lacks %q:\n%s", want, out)
		}
	}
	// RDMA required: the client fails, with the reason.
	out, rc = runClient(t, "-addr", addr, "-policy", "rdma")
	if rc != 1 || !strings.Contains(out, "rdma unavailable") && !strings.Contains(out, "dial tcp") {
		t.Errorf("client -policy rdma: exit %d, %s", rc, out)
	}
	if !strings.Contains(srv.String(), "connected over tcp") {
		t.Errorf("the server did not report the connection's transport:\n%s", srv)
	}
}

func TestEchoUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"serve"}, {"client", "-policy", "fast"}, {"client", "-count", "0"}, {"client", "extra"}} {
		var out bytes.Buffer
		if rc := run(context.Background(), args, &out, &out); rc != 2 {
			t.Errorf("run(%q) = %d, want 2 (usage)", args, rc)
		}
	}
}

func TestLabEchoOverRDMA(t *testing.T) {
	env := labenv.RequireRDMA(t)
	addr, transports, srv := startServer(t, "-addr", env.AddrB.String()+":0")
	if transports != "rdma tcp" {
		t.Fatalf("the server serves %q, want rdma and tcp", transports)
	}
	out, rc := runClient(t, "-addr", addr, "-local", env.AddrA.String(), "-count", "5")
	if rc != 0 || !strings.Contains(out, "over rdma (protocol rdmanet)") || !strings.Contains(out, "5 round trips of 64 bytes over rdma") {
		t.Fatalf("client: exit %d:\n%s", rc, out)
	}
	out, rc = runClient(t, "-addr", addr, "-policy", "tcp", "-count", "2")
	if rc != 0 || !strings.Contains(out, "over tcp (fell back: policy") {
		t.Fatalf("client -policy tcp: exit %d:\n%s", rc, out)
	}
	t.Logf("client output:\n%s\nserver output:\n%s", out, srv)
}
