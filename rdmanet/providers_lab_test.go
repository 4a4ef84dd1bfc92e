//go:build linux

package rdmanet_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
	"github.com/rdmanet/sdk/verbs"
)

// The core suite runs on both of the lab's providers: Soft-RoCE (rxe) and
// Soft-iWARP (siw), whose devices have no immediate data and no
// receiver-not-ready retry, and whose passive side speaks second. The
// tests written for path 1 take the siw pair in its place.

// onPair is env with path 1 replaced by p.
func onPair(env labenv.Env, p labenv.Pair) labenv.Env {
	env.AddrA, env.AddrB, env.DevA, env.DevB, env.NetdevA, env.NetdevB = p.AddrA, p.AddrB, p.DevA, p.DevB, p.NetdevA, p.NetdevB
	return env
}

// dataPaths are how data goes between rdmanet peers on each pair: with
// immediate data on rxe; with write notices and receive credit on siw,
// and on rxe when forced, so that iWARP's data path also runs on the
// other provider.
func dataPaths(env labenv.Env) []struct {
	name string
	env  labenv.Env
	cfg  func(rdmanet.Config) rdmanet.Config
	want string
} {
	same := func(c rdmanet.Config) rdmanet.Config { return c }
	return []struct {
		name string
		env  labenv.Env
		cfg  func(rdmanet.Config) rdmanet.Config
		want string
	}{
		{"rxe", onPair(env, env.RoCE()), same, "write-with-immediate"},
		{"siw", onPair(env, env.IWARP()), same, "write-and-notice"},
		{"rxe with iWARP's data path", onPair(env, env.RoCE()), rdmanet.WithIWARPDataPath, "write-and-notice"},
	}
}

// plainAndSession is a data path's Config (from cfg), plain and as a
// resumable session, with the subtests' names.
func plainAndSession(name string, cfg func(rdmanet.Config) rdmanet.Config) []struct {
	name string
	cfg  rdmanet.Config
} {
	return []struct {
		name string
		cfg  rdmanet.Config
	}{
		{name, cfg(rdmanet.Config{})},
		{name + "/session", cfg(rdmanet.Config{ResumeTimeout: 30 * time.Second})},
	}
}

// TestLabDataPaths: nettest's whole net.Conn suite on every data path,
// with rdmanet's default Config (the streams of one link group, its
// listener's) and as a session; both ends say which data path and
// protocol they run, and whether they are a group's stream or a session.
// The first dial to a listener makes its group (TestLabGroups, and most
// tests' pipes, make new ones).
func TestLabDataPaths(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, dp := range dataPaths(env) {
		for _, ps := range plainAndSession(dp.name, dp.cfg) {
			name, cfg := ps.name, ps.cfg
			t.Run(name, func(t *testing.T) {
				checkLeaks(t)
				ln, d, err := listenAndDialer(dp.env.AddrA, dp.env.AddrB, cfg, 20*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				session := cfg.ResumeTimeout > 0
				check := func(rc *rdmanet.Conn) error {
					switch {
					case rc.Info().DataPath != dp.want:
						return fmt.Errorf("data path %q, want %q", rc.Info().DataPath, dp.want)
					case rc.Protocol() != rdmanet.ProtocolRdmanet:
						return fmt.Errorf("connection speaks %q, want %q", rc.Protocol(), rdmanet.ProtocolRdmanet)
					case rc.Session().Resumable != session:
						return fmt.Errorf("connection is a session: %v, want %v", rc.Session().Resumable, session)
					case rdmanet.GroupStream(rc) == session:
						return fmt.Errorf("connection is a group's stream: %v, want %v", session, !session)
					}
					return nil
				}
				nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
					c1, c2, err = listenerPair(ln, d)
					if err != nil {
						return nil, nil, nil, err
					}
					stop = func() { c1.Close(); c2.Close() }
					for _, c := range []net.Conn{c1, c2} {
						if err := check(c.(*rdmanet.Conn)); err != nil {
							stop()
							return nil, nil, nil, err
						}
					}
					return c1, c2, stop, nil
				})
			})
		}
	}
}

// TestLabIWARPValkey: Valkey's protocol needs immediate data, which siw
// has not. A Valkey-compatible dial from siw fails at once with
// verbs.ErrNoImmediate (RDMA only) or falls back to TCP for
// fallback.ReasonNoImmediate; an rdmanet dial to a Valkey-compatible
// listener on siw is refused with that reason, which the dialer's error
// matches. Nothing hangs.
func TestLabIWARPValkey(t *testing.T) {
	env := labenv.RequireRDMA(t)
	checkLeaks(t)
	p := env.IWARP()
	rdmanet.ForgetFailures()

	// On network "rdma": iWARP shares TCP's ports (TestLabIWARPPorts).
	lc := rdmanet.ListenConfig{Config: rdmanet.Config{ValkeyCompatible: true}}
	ln, err := lc.Listen(context.Background(), "rdma", netip.AddrPortFrom(p.AddrB, 0).String())
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
	from := &net.TCPAddr{IP: p.AddrA.AsSlice()}

	plain := rdmanet.Dialer{LocalAddr: from, Timeout: 20 * time.Second}
	_, err = plain.Dial("rdma", ln.Addr().String())
	var refused *rdmanet.ServerRefusedError
	if !errors.As(err, &refused) || !errors.Is(err, verbs.ErrNoImmediate) || fallback.Classify(err) != fallback.ReasonNoImmediate {
		t.Fatalf("rdmanet dial from siw to a Valkey-compatible listener: %v, want a *ServerRefusedError matching verbs.ErrNoImmediate", err)
	}
	t.Logf("to a Valkey-compatible listener: %v", err)

	valkey := rdmanet.Dialer{LocalAddr: from, Timeout: 20 * time.Second, Config: rdmanet.Config{ValkeyCompatible: true}}
	start := time.Now()
	_, err = valkey.Dial("rdma", ln.Addr().String())
	if !errors.Is(err, verbs.ErrNoImmediate) {
		t.Fatalf("Valkey-compatible RDMA-only dial from siw: %v, want verbs.ErrNoImmediate", err)
	}
	t.Logf("RDMA only, after %v: %v", time.Since(start).Round(time.Millisecond), err)

	// The fallback's TCP goes to a TCP listener of its own on the siw
	// address: a plain TCP connection to the iWARP listener's port would
	// be taken by siw's kernel socket and wait for MPA's request, and
	// after it closed without one the listener's rdma_destroy_id can block
	// in the kernel for minutes (docs/lab.md, "Soft-iWARP"). The dial
	// finds the device without immediate data before it sends anything.
	tl, err := net.Listen("tcp", netip.AddrPortFrom(p.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	c, err := valkey.Dial("tcp", tl.Addr().String())
	if err != nil {
		t.Fatalf("Valkey-compatible dial from siw with fallback: %v", err)
	}
	tr, why := rdmanet.TransportOf(c)
	c.Close()
	var fe *fallback.Error
	if tr != fallback.TCP || !errors.As(why, &fe) || fe.Reason != fallback.ReasonNoImmediate {
		t.Fatalf("Valkey-compatible dial from siw with fallback: %s, %v; want tcp for %s", tr, why, fallback.ReasonNoImmediate)
	}
	t.Logf("with fallback: %s: %v", tr, why)
}

// TestLabIWARPPorts: iWARP takes TCP's port numbers. A dial to an siw port
// where nothing listens is refused as on RoCE; a listener for both
// transports on an siw address serves TCP and says why; one on network
// "rdma" serves iWARP.
func TestLabIWARPPorts(t *testing.T) {
	env := labenv.RequireRDMA(t)
	checkLeaks(t)
	p := env.IWARP()
	from := &net.TCPAddr{IP: p.AddrA.AsSlice()}

	d := rdmanet.Dialer{LocalAddr: from, Timeout: 20 * time.Second}
	_, err := d.Dial("rdma", netip.AddrPortFrom(p.AddrB, 1).String())
	if !errors.Is(err, cm.ErrRejected) {
		t.Fatalf("dial to an siw port with no listener = %v, want cm.ErrRejected", err)
	}

	both, err := rdmanet.Listen("tcp", netip.AddrPortFrom(p.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer both.Close()
	ln := both
	var why *fallback.Error
	if tr := ln.Transports(); len(tr) != 1 || tr[0] != fallback.TCP || !errors.As(ln.RDMAError(), &why) || why.Reason != fallback.ReasonIWARPPort {
		t.Fatalf("a listener for both on siw's address serves %v (RDMA: %v), want TCP only for %s", tr, ln.RDMAError(), fallback.ReasonIWARPPort)
	}
	t.Logf("both on %s: %v", ln.Addr(), ln.RDMAError())

	rdma, err := rdmanet.Listen("rdma", netip.AddrPortFrom(p.AddrB, 0).String())
	if err != nil {
		t.Fatalf("an RDMA listener on siw's address: %v", err)
	}
	defer rdma.Close()
	go func() {
		if c, err := rdma.Accept(); err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	c, err := d.Dial("rdma", rdma.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := []byte("over iWARP")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
		t.Fatalf("echo %q, %v", got, err)
	}
}

// TestLabSessionLetsGo: a session on each data path streams both ways while
// each side in turn lets go of its working link, as a busy host's stall
// taken for a dead path makes it (rdmanet.DeclareDeadPath). The other side
// sees the link end without the peer's Close, and the session resumes on
// a new link over the same pair: on siw a new MPA connection, whose
// passive side speaks second again and whose receive credit starts
// afresh. Every byte arrives once, in order.
func TestLabSessionLetsGo(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, dp := range dataPaths(env) {
		t.Run(dp.name, func(t *testing.T) {
			checkLeaks(t)
			nc, ns, ln, err := dialPair(dp.env.AddrA, dp.env.AddrB, dp.cfg(sessionConfig), 20*time.Second)
			if ln != nil {
				defer ln.Close() // it stays: a session resumes through it
			}
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			defer ns.Close()
			sides := map[string]*rdmanet.Conn{"client": nc.(*rdmanet.Conn), "server": ns.(*rdmanet.Conn)}

			// Each way streams until the fourth move, and 1 MiB past it.
			moved := make(chan struct{})
			sums := make([][2][32]byte, 2)
			counts := make([][2]int, 2)
			done := make(chan struct{}, 4)
			for i, ends := range [][2]net.Conn{{nc, ns}, {ns, nc}} {
				go func() {
					defer func() { done <- struct{}{} }()
					var err error
					sums[i][0], counts[i][0], err = streamWhile(ends[0], streamPast(1<<20, moved, 1<<20), uint64(i), 64<<10)
					if err == nil {
						err = ends[0].(*rdmanet.Conn).CloseWrite()
					}
					if err != nil {
						t.Errorf("direction %d: write: %v", i, err)
					}
				}()
				go func() {
					defer func() { done <- struct{}{} }()
					var n int64
					var err error
					if sums[i][1], n, err = drain(ends[1], math.MaxInt); err != nil {
						t.Errorf("direction %d: read %d bytes: %v", i, n, err)
					}
					counts[i][1] = int(n)
				}()
			}
			for k, side := range []string{"server", "client", "server", "client"} {
				if err := rdmanet.DeclareDeadPath(sides[side]); err != nil {
					t.Fatal(err)
				}
				waitSessions(t, sides, "a resume", func(st rdmanet.SessionState) bool { return st.Failovers > k && !st.Suspended })
			}
			close(moved)
			for range 4 {
				<-done
			}
			for i := range sums {
				if sums[i][0] != sums[i][1] || counts[i][0] != counts[i][1] {
					t.Errorf("direction %d: wrote %d bytes, read %d; SHA-256 differs: %v", i, counts[i][0], counts[i][1], sums[i][0] != sums[i][1])
				}
			}
			for name, c := range sides {
				st := c.Session()
				if got := c.Info().DataPath; got != dp.want || st.Failovers < 4 {
					t.Errorf("%s: data path %q, session %+v; want %q and 4 moves or more", name, got, st, dp.want)
				}
				t.Logf("%s: last move %s, pause %v", name, st.LastMove.Reason, st.LastMove.Pause.Round(time.Microsecond))
			}
		})
	}
}
