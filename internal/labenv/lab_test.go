package labenv

import (
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// TestLab checks, inside the lab, what RDMA tests rely on. Outside it skips.
func TestLab(t *testing.T) {
	env := RequireRDMA(t)

	for _, dev := range []string{env.DevA, env.DevB} {
		if _, err := os.Stat(filepath.Join("/sys/class/infiniband", dev)); err != nil {
			t.Errorf("RDMA device %s: %v", dev, err)
		}
	}

	local := map[netip.Addr]string{}
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifi := range ifaces {
		addrs, err := ifi.Addrs()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					local[ip.Unmap()] = ifi.Name
				}
			}
		}
	}
	for _, a := range []netip.Addr{env.AddrA, env.AddrB} {
		if ifname, ok := local[a]; !ok {
			t.Errorf("address %v is on no interface", a)
		} else {
			t.Logf("%v is on %s", a, ifname)
		}
	}
	for _, a := range []netip.Addr{env.NoRDMAHost, env.PlainHost} {
		if ifname, ok := local[a]; ok {
			t.Errorf("address %v of another namespace is on %s in this one", a, ifname)
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
