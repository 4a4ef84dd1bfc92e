package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/examples/blockstore/nbd"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// TestRelayHalfClose: a client that stops sending (a half-close) still
// gets everything the far side sends after that, and then an end.
func TestRelayHalfClose(t *testing.T) {
	client, bridgeIn := tcpPair(t)
	bridgeOut, server := tcpPair(t)
	relayed := make(chan error, 1)
	go func() { relayed <- relay(bridgeIn, bridgeOut) }()

	request := bytes.Repeat([]byte("request "), 10000)
	reply := bytes.Repeat([]byte("reply "), 100000)
	if _, err := client.Write(request); err != nil {
		t.Fatal(err)
	}
	client.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(server)
	if err != nil || !bytes.Equal(got, request) {
		t.Fatalf("the server read %d bytes (%v), want the %d of the request and an end", len(got), err, len(request))
	}
	// The server answers after the client's half-close, then hangs up.
	if _, err := server.Write(reply); err != nil {
		t.Fatal(err)
	}
	server.Close()
	got, err = io.ReadAll(client)
	if err != nil || !bytes.Equal(got, reply) {
		t.Fatalf("the client read %d bytes (%v), want the %d of the reply and an end", len(got), err, len(reply))
	}
	select {
	case err := <-relayed:
		if err != nil {
			t.Errorf("relay: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not end")
	}
}

// TestRelayFailure: when one side breaks, the relay closes the other.
func TestRelayFailure(t *testing.T) {
	client, bridgeIn := tcpPair(t)
	bridgeOut, server := tcpPair(t)
	relayed := make(chan error, 1)
	go func() { relayed <- relay(bridgeIn, bridgeOut) }()
	server.(*net.TCPConn).SetLinger(0)
	server.Close() // a reset
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(client); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the client was not disconnected")
		}
	}
	select {
	case <-relayed:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not end")
	}
}

var bridging = regexp.MustCompile(`relaying (?:tcp|unix) (\S+) to `)

// startBridge runs `blockstore bridge` until the test ends and returns the
// address it listens on and its log.
func startBridge(t *testing.T, args ...string) (string, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, logs := new(syncBuffer), new(syncBuffer)
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"bridge"}, args...), out, logs) }()
	t.Cleanup(func() {
		cancel()
		if rc := <-done; rc != 0 {
			t.Errorf("bridge exited %d: %s%s", rc, out, logs)
		}
		switch {
		case strings.Contains(logs.String(), "level=ERROR"):
			t.Errorf("the bridge logged:\n%s", logs)
		case t.Failed():
			t.Logf("the bridge's output:\n%s%s", out, logs) // what it saw of the failure
		}
	})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := bridging.FindStringSubmatch(out.String()); m != nil {
			return m[1], logs
		}
	}
	t.Fatalf("the bridge did not start: %s%s", out, logs)
	return "", nil
}

// TestBridge: NBD clients reach the server through the bridge, on a unix
// socket and on a TCP port: the Go client at queue depth 16, hash-checked,
// and (if installed) nbdinfo and nbdcopy.
func TestBridge(t *testing.T) {
	addr := startServe(t, "-mem", "16M")
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	startBridge(t, "-listen", "unix:"+sock, "-to", addr)
	tcp, _ := startBridge(t, "-listen", "127.0.0.1:0", "-to", addr)

	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := nbd.NewClient(ctx, nc, nbd.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const size, block = 16 << 20, 64 << 10
	src := make([]byte, size)
	rand.Read(src)
	each := func(f func(i int) error) {
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < size/block; i += 16 {
					if err := f(i); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	each(func(i int) error { return c.Write(src[i*block:(i+1)*block], int64(i*block), 0) })
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	each(func(i int) error { return c.Read(got[i*block:(i+1)*block], int64(i*block)) })
	if sha256.Sum256(got) != sha256.Sum256(src) {
		t.Fatal("read back through the bridge differs")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	nbdinfo := requireTool(t, "nbdinfo", "libnbd-bin")
	if out := runTool(t, nbdinfo, "--size", "nbd+unix:///?socket="+sock); out != "16777216\n" {
		t.Errorf("nbdinfo through the unix socket: %q", out)
	}
	nbdcopy := requireTool(t, "nbdcopy", "libnbd-bin")
	back := filepath.Join(t.TempDir(), "back.raw")
	runTool(t, nbdcopy, uri(tcp), back)
	if fileHash(t, back) != sha256.Sum256(src) {
		t.Fatal("nbdcopy through the TCP bridge copied something else")
	}
}
