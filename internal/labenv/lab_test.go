package labenv

import (
	"bytes"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLab checks, inside the lab, what RDMA tests rely on. Outside it skips.
func TestLab(t *testing.T) {
	env := RequireRDMA(t)

	for _, p := range env.Paths() {
		for _, dev := range []struct{ rxe, netdev string }{{p.DevA, p.NetdevA}, {p.DevB, p.NetdevB}} {
			dir := filepath.Join("/sys/class/infiniband", dev.rxe)
			if _, err := os.Stat(dir); err != nil {
				t.Errorf("RDMA device %s: %v", dev.rxe, err)
				continue
			}
			// GID 0 (the link-local one) names the device's netdev.
			if nd, err := os.ReadFile(filepath.Join(dir, "ports/1/gid_attrs/ndevs/0")); err != nil || strings.TrimSpace(string(nd)) != dev.netdev {
				t.Errorf("RDMA device %s: netdev %q (%v), want %s", dev.rxe, bytes.TrimSpace(nd), err, dev.netdev)
			}
			// A queue pair's packets must arrive in the order rxe sent
			// them, whichever CPU sent them (docs/lab.md, "In order").
			if m, err := os.ReadFile(filepath.Join("/sys/class/net", dev.netdev, "queues/rx-0/rps_cpus")); err != nil || strings.Trim(string(m), "0,\n") == "" {
				t.Errorf("%s: rps_cpus %q (%v), want CPUs: a veth would reorder rxe's packets", dev.netdev, bytes.TrimSpace(m), err)
			}
		}
	}

	local := localAddrs(t)
	for _, p := range env.Paths() {
		for _, want := range []struct {
			a      netip.Addr
			netdev string
		}{{p.A, p.NetdevA}, {p.B, p.NetdevB}} {
			if ifname, ok := local[want.a]; !ok || ifname != want.netdev {
				t.Errorf("address %v is on interface %q, want %s", want.a, ifname, want.netdev)
			}
		}
		// What rdma_cm and rxe do: a route bound to the source address's
		// interface, which must lead out of that interface, each way.
		for _, r := range [][3]string{{p.A.String(), p.B.String(), p.NetdevA}, {p.B.String(), p.A.String(), p.NetdevB}} {
			out, err := exec.Command("ip", "-o", "route", "get", r[1], "from", r[0], "oif", r[2]).CombinedOutput()
			if err != nil || !strings.Contains(string(out), " dev "+r[2]+" ") {
				t.Errorf("ip route get %s from %s oif %s: %v: %s", r[1], r[0], r[2], err, out)
			}
		}
	}
	for _, a := range []netip.Addr{env.NoRDMAHost, env.PlainHost} {
		if ifname, ok := local[a]; ok {
			t.Errorf("address %v of another namespace is on %s in this one", a, ifname)
		}
	}

	// TCP between A's and B's addresses is local traffic: it goes through
	// lo, not the veths, so no fault on an RDMA path touches it.
	for _, p := range env.Paths() {
		out, err := exec.Command("ip", "-o", "route", "get", p.B.String(), "from", p.A.String()).CombinedOutput()
		if err != nil || !strings.Contains(string(out), " dev lo ") {
			t.Errorf("ip route get %s from %s: %v: %s, want dev lo", p.B, p.A, err, out)
		}
	}

	t.Run("nordma", func(t *testing.T) { testTCPIn(t, env.NoRDMANetns, env.NoRDMAHost) })
	t.Run("plain", func(t *testing.T) { testTCPIn(t, env.PlainNetns, env.PlainHost) })
}

// testTCPIn starts a TCP server on host inside netns and talks to it from
// the initial namespace.
func testTCPIn(t *testing.T, netns string, host netip.Addr) {
	ln, err := ListenTCP(netns, host)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	// Back in the initial namespace, the address is not local any more.
	if l, err := net.Listen("tcp", netip.AddrPortFrom(host, 0).String()); err == nil {
		l.Close()
		t.Fatalf("listening on %v outside network namespace %s succeeded: InNetns did not switch back", host, netns)
	}

	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dialling the server in %s: %v", netns, err)
	}
	defer c.Close()
	msg := []byte("hello from the initial namespace")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	if string(buf) != string(msg) {
		t.Errorf("echo = %q, want %q", buf, msg)
	}
}
