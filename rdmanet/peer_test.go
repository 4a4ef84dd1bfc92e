//go:build linux

package rdmanet_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/leakcheck"
	"github.com/rdmanet/sdk/rdmanet"
)

// peerEnv, when set, turns the test binary into a peer process that dials the
// address in it and writes until it is killed (see TestMain). A "resume,"
// before the address makes its connection a resumable session.
const peerEnv = "RDMANET_TEST_PEER"

// debugEnv, when set, makes the test binary log at Debug.
const debugEnv = "RDMANET_TEST_DEBUG"

func TestMain(m *testing.M) {
	if addr := os.Getenv(peerEnv); addr != "" {
		os.Exit(runPeer(addr))
	}
	if args := os.Getenv(limitedDialEnv); args != "" {
		os.Exit(runLimitedDial(args))
	}
	if args := os.Getenv(memlockPairsEnv); args != "" {
		os.Exit(runMemlockPairs(args))
	}
	if args := os.Getenv(memlockMemoryEnv); args != "" {
		os.Exit(runMemlockMemory(args))
	}
	if os.Getenv(spinEnv) != "" {
		spin()
	}
	if os.Getenv(debugEnv) != "" {
		slog.SetLogLoggerLevel(slog.LevelDebug) // rdmanet's own Debug lines, to stderr
	}
	os.Exit(m.Run())
}

func runPeer(addr string) int {
	// A connection of its own unless the address says "group,".
	d := rdmanet.Dialer{Config: rdmanet.Config{NoLinkGroups: true}}
	conns := 1
	if a, ok := strings.CutPrefix(addr, "resume,"); ok {
		addr = a
		d.Config = sessionConfig
	}
	if a, ok := strings.CutPrefix(addr, "group,"); ok {
		// groupPeerConns streams of one link group.
		addr, conns = a, groupPeerConns
		d.Config = rdmanet.Config{}
	}
	errs := make(chan error, conns)
	for range conns {
		c, err := d.Dial("rdma", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			return 1
		}
		go func() {
			buf := make([]byte, 64<<10)
			for {
				if _, err := c.Write(buf); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	fmt.Fprintln(os.Stderr, "peer:", <-errs)
	return 1
}

// groupPeerConns is how many connections a "group," peer dials.
const groupPeerConns = 3

// streamingPeer starts a peer process that dials spec (peerEnv's value)
// and writes until it is killed, accepts its connection on ln and reads
// 1 MiB of it. The connection is closed and the process waited for when
// the test ends.
func streamingPeer(t *testing.T, ln net.Listener, spec string) (net.Conn, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), peerEnv+"="+spec)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.ReadFull(c, make([]byte, 1<<20)); err != nil {
		t.Fatalf("reading from the peer: %v (peer said %q)", err, stderr.String())
	}
	return c, cmd
}

// readUntilError reads until Read fails and reports how long after start.
func readUntilError(c net.Conn, start time.Time, limit time.Duration) (time.Duration, error) {
	c.SetReadDeadline(start.Add(limit))
	buf := make([]byte, 64<<10)
	for {
		if _, err := c.Read(buf); err != nil {
			return time.Since(start), err
		}
	}
}

// TestLabPeerKilled: a peer process killed mid-stream ends the connection on
// this side: Read returns (EOF or an error) and Write fails, promptly.
func TestLabPeerKilled(t *testing.T) {
	env := labenv.RequireRDMA(t)
	leakcheck.Check(t)
	ln, err := rdmanet.Listen("rdma", netip.AddrPortFrom(env.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, cmd := streamingPeer(t, ln, ln.Addr().String())
	start := time.Now()
	cmd.Process.Signal(syscall.SIGKILL)
	took, err := readUntilError(c, start, 30*time.Second)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read still blocked %v after the peer was killed", took)
	}
	t.Logf("Read returned %v %v after SIGKILL", err, took.Round(time.Millisecond))
	if _, err := c.Write([]byte("anyone there?")); err == nil {
		t.Fatal("Write to a killed peer succeeded")
	}
}

// TestLabGroupPeerKilled: a group's peer process killed mid-stream ends
// every stream of the group on this side at once: its kernel disconnects
// the group's link, and each Read returns well within 3 x KeepAlive.
func TestLabGroupPeerKilled(t *testing.T) {
	env := labenv.RequireRDMA(t)
	leakcheck.Check(t)
	lc := rdmanet.ListenConfig{Config: rdmanet.Config{}}
	ln, err := lc.Listen(context.Background(), "rdma", netip.AddrPortFrom(env.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, cmd := streamingPeer(t, ln, "group,"+ln.Addr().String())
	conns := []net.Conn{c}
	for range groupPeerConns - 1 {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.ReadFull(c, make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		if !rdmanet.GroupStream(c.(*rdmanet.Conn)) {
			t.Fatalf("%v is not a group's stream", c.RemoteAddr())
		}
	}
	start := time.Now()
	cmd.Process.Signal(syscall.SIGKILL)
	bound := 3 * 3 * time.Second // 3 x Config.KeepAlive's default
	for i, c := range conns {
		took, err := readUntilError(c, start, bound)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("stream %d: Read still blocked %v after the peer was killed", i, took)
			continue
		}
		t.Logf("stream %d: Read returned %v %v after SIGKILL", i, err, took.Round(time.Millisecond))
	}
}

// TestLabPeerUnreachable: when every packet between the two sides is dropped
// (a dead host, a broken network: no disconnect ever arrives), keepalive
// notices: Read fails within the documented bound, three keepalive
// intervals (a keepalive goes out after one idle interval; the path is dead
// when it has not completed two intervals later), here with 3 s to spare
// for the emulated, possibly loaded CPU.
func TestLabPeerUnreachable(t *testing.T) {
	env := labenv.RequireRDMA(t)
	leakcheck.Check(t)
	const keepAlive = time.Second
	// A connection of its own: a group's stream waits up to 15 s for
	// another link (a partition), not 3 x KeepAlive.
	a, b, stop := pipe(t, env, rdmanet.Config{KeepAlive: keepAlive, NoLinkGroups: true})
	defer stop()
	if _, err := a.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	env.Paths()[0].DropAll(t) // to each side the other is simply gone
	bound := 3*keepAlive + 3*time.Second
	start := time.Now()
	errs := make(chan string, 2)
	for name, c := range map[string]net.Conn{"A": a, "B": b} {
		go func() {
			took, err := readUntilError(c, start, bound)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				errs <- fmt.Sprintf("%s: Read still blocked after %v, bound %v", name, took, bound)
				return
			}
			t.Logf("%s: Read failed after %v: %v", name, took.Round(time.Millisecond), err)
			errs <- ""
		}()
	}
	for range 2 {
		if e := <-errs; e != "" {
			t.Error(e)
		}
	}
}
