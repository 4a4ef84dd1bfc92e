//go:build linux

package rdmanet_test

import (
	"errors"
	"fmt"
	"io"
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
// address in it and writes until it is killed (see TestMain).
const peerEnv = "RDMANET_TEST_PEER"

func TestMain(m *testing.M) {
	if addr := os.Getenv(peerEnv); addr != "" {
		os.Exit(runPeer(addr))
	}
	if args := os.Getenv(limitedDialEnv); args != "" {
		os.Exit(runLimitedDial(args))
	}
	os.Exit(m.Run())
}

func runPeer(addr string) int {
	c, err := rdmanet.Dial("rdma", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := c.Write(buf); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			return 1
		}
	}
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
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), peerEnv+"="+ln.Addr().String())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	c, err := ln.Accept()
	if err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("reading from the peer: %v (peer said %q)", err, stderr.String())
	}
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
	a, b, stop := pipe(t, env, rdmanet.Config{KeepAlive: keepAlive})
	defer stop()
	if _, err := a.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	dropRoCE(t)
	bound := 3*keepAlive + 3*time.Second
	start := time.Now()
	errs := make(chan string, 2)
	for name, c := range map[string]net.Conn{"A": a, "B": b} {
		go func() {
			took, err := readUntilError(c, start, bound)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				errs <- fmt.Sprintf("%s: Read still blocked after %v", name, took)
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

// dropRoCE drops every packet on the link between the lab's two RDMA
// addresses until the test ends: to each side the other is simply gone.
func dropRoCE(t *testing.T) {
	t.Helper()
	for _, dev := range []string{"lab-a", "lab-b"} {
		if out, err := exec.Command("tc", "qdisc", "add", "dev", dev, "root", "netem", "loss", "100%").CombinedOutput(); err != nil {
			t.Fatalf("tc netem on %s: %v\n%s", dev, err, out)
		}
		t.Cleanup(func() { exec.Command("tc", "qdisc", "del", "dev", dev, "root").Run() })
	}
}

// TestLabLinkDown: the link under a stream goes down (the interface of one
// side's RDMA device is set down: rxe then neither completes nor fails the
// requests already posted, and rdma_cm sends no event). Both ends must
// fail within the documented bound, 3 x KeepAlive (here with 3 s to spare
// for the emulated, possibly loaded CPU), in every one of 10 runs.
func TestLabLinkDown(t *testing.T) {
	env := labenv.RequireRDMA(t)
	leakcheck.Check(t)
	const keepAlive = time.Second
	bound := 3*keepAlive + 3*time.Second
	for run := 1; run <= 10; run++ {
		a, b, stop := pipe(t, env, rdmanet.Config{KeepAlive: keepAlive})
		// A streams to B until the write fails; B reads until its read fails.
		flowing := make(chan struct{})
		writeErr := make(chan error, 1)
		go func() {
			buf := make([]byte, 64<<10)
			for {
				if _, err := a.Write(buf); err != nil {
					writeErr <- err
					return
				}
			}
		}()
		readErr := make(chan error, 1)
		go func() {
			buf := make([]byte, 64<<10)
			total := 0
			for {
				n, err := b.Read(buf)
				if total < 1<<20 && total+n >= 1<<20 {
					close(flowing)
				}
				total += n
				if err != nil {
					readErr <- err
					return
				}
			}
		}()
		select {
		case <-flowing:
		case <-time.After(time.Minute):
			t.Fatalf("run %d: 1 MiB did not flow in a minute", run)
		}
		linkDown(t, "lab-a")
		start := time.Now()
		for _, side := range []struct {
			name string
			errs chan error
		}{{"writer A", writeErr}, {"reader B", readErr}} {
			select {
			case err := <-side.errs:
				took := time.Since(start)
				if took > bound {
					t.Errorf("run %d: %s failed after %v, bound %v: %v", run, side.name, took, bound, err)
				} else if run == 1 {
					t.Logf("run %d: %s failed after %v: %v", run, side.name, took.Round(time.Millisecond), err)
				}
			case <-time.After(bound):
				a.Close()
				b.Close()
				t.Fatalf("run %d: %s still blocked %v after the link went down", run, side.name, bound)
			}
		}
		stop()
		linkUp(t, "lab-a", "lab-b")
		waitConnectable(t, env)
	}
}

// waitConnectable waits until a connection between the lab's two RDMA
// addresses can be made again (after a link came back, address and route
// resolution may fail for a moment while neighbours are learnt again).
func waitConnectable(t *testing.T, env labenv.Env) {
	t.Helper()
	var err error
	for end := time.Now().Add(time.Minute); time.Now().Before(end); {
		var a, b net.Conn
		if a, b, err = tryPipe(env, rdmanet.Config{}, 3*time.Second); err == nil {
			a.Close()
			b.Close()
			return
		}
	}
	t.Fatalf("no connection a minute after the link came back: %v", err)
}

// linkDown sets a network interface down until linkUp or the test's end.
func linkDown(t *testing.T, dev string) {
	t.Helper()
	if out, err := exec.Command("ip", "link", "set", dev, "down").CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s down: %v\n%s", dev, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "link", "set", dev, "up").Run() })
}

// linkUp sets dev up again and waits until the RDMA ports on every one
// of ports (dev, and the far end of its veth, which lost its carrier) are
// active.
//
// Both ends of the lab's A-B veth have a route to the same prefix, and
// address resolution from A's address takes the first. Setting dev down
// deletes its route and setting it up appends it again, after the other
// end's: RDMA from A would then resolve through B's device and never
// connect. So the other ends' routes are taken out and put back after
// dev's, as the lab made them.
func linkUp(t *testing.T, dev string, ports ...string) {
	t.Helper()
	if out, err := exec.Command("ip", "link", "set", dev, "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s up: %v\n%s", dev, err, out)
	}
	for _, other := range ports {
		if other == dev {
			continue
		}
		out, err := exec.Command("ip", "-o", "route", "show", "dev", other, "proto", "kernel", "scope", "link").Output()
		if err != nil {
			t.Fatalf("ip route show dev %s: %v", other, err)
		}
		for _, route := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if route == "" {
				continue
			}
			args := append([]string{"route", "del"}, strings.Fields(route)...)
			args = append(args, "dev", other)
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %v: %v\n%s", args, err, out)
			}
			// As the kernel made it, so that the next run finds it again.
			args = append(args, "proto", "kernel", "scope", "link")
			args[1] = "append" // a second route to the prefix: "add" says it exists
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %v: %v\n%s", args, err, out)
			}
		}
	}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, _ := exec.Command("rdma", "link", "show").CombinedOutput()
		active := 0
		for _, line := range strings.Split(string(out), "\n") {
			for _, p := range ports {
				if strings.HasSuffix(strings.TrimSpace(line), "netdev "+p) && strings.Contains(line, "state ACTIVE") {
					active++
				}
			}
		}
		if active == len(ports) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("RDMA ports on %v not active 30 s after %s came up:\n%s", ports, dev, out)
		}
	}
}
