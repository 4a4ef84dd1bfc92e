package rdmanet_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// Tests of the TCP fallback that run anywhere: on a host without RDMA (CI's),
// without cgo, without rdma-core, and in the lab, where the loopback
// interface has no RDMA device.

// loopbackReason is why a dial to 127.0.0.1 cannot use RDMA here, found from
// facts independent of the code under test: the build, the test scripts'
// declarations, and sysfs.
func loopbackReason(t *testing.T) fallback.Reason {
	t.Helper()
	switch {
	case !cgoEnabled:
		return fallback.ReasonNoCgo
	case os.Getenv("RDMANET_EXPECT_NO_RDMA_CORE") == "1":
		return fallback.ReasonNoLibrary
	}
	if devs, _ := os.ReadDir("/sys/class/infiniband"); len(devs) > 0 || labenv.InLab() {
		// RDMA is there, but not on the loopback interface.
		return fallback.ReasonRouteNoRDMA
	}
	return fallback.ReasonNoDevice
}

// listenLoopback listens with rdmanet on network "tcp" on 127.0.0.1.
func listenLoopback(t *testing.T, lc rdmanet.ListenConfig) *rdmanet.Listener {
	t.Helper()
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func TestFallbackNetConn(t *testing.T) {
	want := loopbackReason(t)
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		ln, err := rdmanet.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, nil, err
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, _ := ln.Accept()
			accepted <- c
		}()
		c1, err = rdmanet.Dial("tcp", ln.Addr().String())
		if err != nil {
			return nil, nil, nil, err
		}
		c2 = <-accepted
		if c2 == nil {
			c1.Close()
			return nil, nil, nil, errors.New("accept failed")
		}
		for _, c := range []net.Conn{c1, c2} {
			if tr, why := rdmanet.TransportOf(c); tr != fallback.TCP || !errors.Is(why, want) {
				t.Errorf("TransportOf = %q, %v; want tcp, %s", tr, why, want)
			}
		}
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
}

func TestFallbackReasonHere(t *testing.T) {
	want := loopbackReason(t)
	before := rdmanet.ReadMetrics().Snapshot
	ln := listenLoopback(t, rdmanet.ListenConfig{})
	if got := ln.Transports(); !slices.Equal(got, []fallback.Transport{fallback.TCP}) {
		t.Errorf("Transports = %v, want [tcp]", got)
	}
	if !errors.Is(ln.RDMAError(), want) {
		t.Errorf("RDMAError = %v, want %s", ln.RDMAError(), want)
	}
	if _, ok := ln.Addr().(*net.TCPAddr); !ok {
		t.Errorf("Addr is a %T, want *net.TCPAddr", ln.Addr())
	}
	c, err := rdmanet.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc, ok := c.(*rdmanet.TCPConn)
	if !ok {
		t.Fatalf("Dial returned a %T, want *rdmanet.TCPConn", c)
	}
	var fe *fallback.Error
	if !errors.As(tc.FallbackReason(), &fe) || fe.Reason != want || fe.Remembered {
		t.Fatalf("FallbackReason = %#v, want a fresh %s", tc.FallbackReason(), want)
	}
	t.Logf("fell back: %v", fe)
	after := rdmanet.ReadMetrics().Snapshot
	if d := after.Dialed[fallback.TCP] - before.Dialed[fallback.TCP]; d != 1 {
		t.Errorf("Stats: %d TCP dials counted, want 1", d)
	}
	// The listener's fallback and the dial's.
	if d := after.Fallbacks[want] - before.Fallbacks[want]; d != 2 {
		t.Errorf("Stats: %d fallbacks for %s counted, want 2", d, want)
	}
}

// plainServer is a TCP server that is not rdmanet: it records every
// connection and everything each sends.
type plainServer struct {
	ln    net.Listener
	conns chan []byte // what each connection sent, once it closed
}

func newPlainServer(t *testing.T, network, addr string) *plainServer {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	return servePlain(t, ln)
}

// servePlain serves ln as a plain TCP server until the test ends.
func servePlain(t *testing.T, ln net.Listener) *plainServer {
	s := &plainServer{ln: ln, conns: make(chan []byte, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				s.conns <- b
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return s
}

// expectNoConnection fails if the server got a connection within d.
func (s *plainServer) expectNoConnection(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case b := <-s.conns:
		t.Errorf("the plain server got a connection (it sent %q)", b)
	case <-time.After(d):
	}
}

func TestFallbackPlainServerGetsExactBytes(t *testing.T) {
	srv := newPlainServer(t, "tcp", "127.0.0.1:0")
	c, err := rdmanet.Dial("tcp", srv.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 1<<20)
	for i := range msg {
		msg[i] = byte(rand.Uint32())
	}
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if got := <-srv.conns; !bytes.Equal(got, msg) {
		t.Fatalf("the server received %d bytes, not exactly the %d the client wrote", len(got), len(msg))
	}
}

func TestFallbackRDMARequired(t *testing.T) {
	want := loopbackReason(t)
	srv := newPlainServer(t, "tcp", "127.0.0.1:0")
	addr := srv.ln.Addr().String()
	for _, tc := range []struct {
		name, network string
		d             rdmanet.Dialer
		env           string
	}{
		{"rdma network", "rdma", rdmanet.Dialer{}, ""},
		{"rdma4 network", "rdma4", rdmanet.Dialer{}, ""},
		{"RDMAOnly policy", "tcp", rdmanet.Dialer{Policy: fallback.RDMAOnly}, ""},
		{"environment", "tcp", rdmanet.Dialer{}, "rdma"},
		{"environment over a TCPOnly policy", "tcp", rdmanet.Dialer{Policy: fallback.TCPOnly}, "rdma-only"},
		{"rdma network ignores the environment", "rdma", rdmanet.Dialer{}, "tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv(fallback.EnvPolicy, tc.env)
			}
			c, err := tc.d.Dial(tc.network, addr)
			if err == nil {
				c.Close()
				t.Fatalf("Dial succeeded over %v; RDMA was required", c.LocalAddr().Network())
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || !errors.Is(err, want) {
				t.Fatalf("Dial error %v (%T), want a *net.OpError matching %s", err, err, want)
			}
		})
	}
	srv.expectNoConnection(t, 100*time.Millisecond)
}

func TestFallbackPolicyTCPOnly(t *testing.T) {
	ln := listenLoopback(t, rdmanet.ListenConfig{})
	for _, tc := range []struct {
		name string
		d    rdmanet.Dialer
		env  string
	}{
		{"field", rdmanet.Dialer{Policy: fallback.TCPOnly}, ""},
		{"environment", rdmanet.Dialer{}, "tcp"},
		{"environment over RDMAOnly", rdmanet.Dialer{Policy: fallback.RDMAOnly}, " TCP "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv(fallback.EnvPolicy, tc.env)
			}
			c, err := tc.d.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tr, why := rdmanet.TransportOf(c); tr != fallback.TCP || !errors.Is(why, fallback.ReasonPolicy) {
				t.Fatalf("TransportOf = %q, %v; want tcp, %s", tr, why, fallback.ReasonPolicy)
			}
		})
	}
	t.Run("listener", func(t *testing.T) {
		t.Setenv(fallback.EnvPolicy, "tcp")
		ln := listenLoopback(t, rdmanet.ListenConfig{})
		if !errors.Is(ln.RDMAError(), fallback.ReasonPolicy) || !slices.Equal(ln.Transports(), []fallback.Transport{fallback.TCP}) {
			t.Fatalf("listener serves %v (RDMAError %v), want TCP by policy", ln.Transports(), ln.RDMAError())
		}
	})
}

func TestFallbackPolicyErrors(t *testing.T) {
	t.Setenv(fallback.EnvPolicy, "sometimes")
	var pe *fallback.PolicyError
	if _, err := rdmanet.Dial("tcp", "127.0.0.1:1"); !errors.As(err, &pe) || pe.Source != fallback.EnvPolicy {
		t.Errorf("Dial with a malformed %s: %v, want a *fallback.PolicyError", fallback.EnvPolicy, err)
	}
	if _, err := rdmanet.Listen("tcp", "127.0.0.1:0"); !errors.As(err, &pe) {
		t.Errorf("Listen with a malformed %s: %v, want a *fallback.PolicyError", fallback.EnvPolicy, err)
	}
	t.Setenv(fallback.EnvPolicy, "rdma")
	if ln, err := rdmanet.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
		t.Errorf("Listen with %s=rdma on loopback succeeded", fallback.EnvPolicy)
	} else if !errors.Is(err, loopbackReason(t)) {
		t.Errorf("Listen with %s=rdma: %v, want %s", fallback.EnvPolicy, err, loopbackReason(t))
	}
	if _, err := rdmanet.Dial("udp", "127.0.0.1:1"); !errors.As(err, new(net.UnknownNetworkError)) {
		t.Errorf("Dial on udp: %v, want net.UnknownNetworkError", err)
	}
}

func TestTransportOf(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if tr, why := rdmanet.TransportOf(a); tr != "" || why != nil {
		t.Errorf("TransportOf(net.Pipe) = %q, %v; want \"\", nil", tr, why)
	}
	srv := newPlainServer(t, "tcp", "127.0.0.1:0")
	c, err := net.Dial("tcp", srv.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tr, why := rdmanet.TransportOf(c); tr != fallback.TCP || why != nil {
		t.Errorf("TransportOf(*net.TCPConn) = %q, %v; want tcp, nil", tr, why)
	}
}

// A fallen-back connection is the *net.TCPConn: io.Copy still finds its
// ReadFrom and WriteTo (splice, sendfile).
var (
	_ io.ReaderFrom = (*rdmanet.TCPConn)(nil)
	_ io.WriterTo   = (*rdmanet.TCPConn)(nil)
)
