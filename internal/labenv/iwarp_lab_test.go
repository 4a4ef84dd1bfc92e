package labenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLabIWARP checks, inside the lab, the Soft-iWARP pair: its devices are
// iWARP devices (the kernel's node type RNIC) with an active port on their
// netdevs, the addresses are on those netdevs, and RDMA bound to one end
// leaves through its own veth while plain TCP between the two goes
// through lo.
func TestLabIWARP(t *testing.T) {
	env := RequireRDMA(t)
	p := env.IWARP()
	if p.Provider != ProviderSIW {
		t.Fatalf("IWARP() = %+v, provider %q", p, p.Provider)
	}
	for _, d := range []struct{ dev, netdev string }{{p.DevA, p.NetdevA}, {p.DevB, p.NetdevB}} {
		dir := filepath.Join("/sys/class/infiniband", d.dev)
		if nt, err := os.ReadFile(filepath.Join(dir, "node_type")); err != nil || !strings.Contains(string(nt), "RNIC") {
			t.Errorf("RDMA device %s: node type %q (%v), want RNIC (iWARP)", d.dev, bytes.TrimSpace(nt), err)
		}
		if st, err := os.ReadFile(filepath.Join(dir, "ports/1/state")); err != nil || !strings.Contains(string(st), "ACTIVE") {
			t.Errorf("RDMA device %s: port state %q (%v), want ACTIVE", d.dev, bytes.TrimSpace(st), err)
		}
		// siw has no RoCE GID attributes naming its netdev: rdma link does.
		if nd, err := linkNetdev(d.dev); err != nil || nd != d.netdev {
			t.Errorf("RDMA device %s: netdev %q (%v), want %s", d.dev, nd, err, d.netdev)
		}
	}
	local := localAddrs(t)
	for _, want := range []struct {
		a      netip.Addr
		netdev string
	}{{p.AddrA, p.NetdevA}, {p.AddrB, p.NetdevB}} {
		if ifname := local[want.a]; ifname != want.netdev {
			t.Errorf("address %v is on interface %q, want %s", want.a, ifname, want.netdev)
		}
	}
	// rdma_cm resolves the peer with the route out of the source address's
	// interface (ARP over the veths, which accept_local lets through);
	// siw's own TCP connection is an ordinary local one, through lo.
	for _, r := range [][3]string{{p.AddrA.String(), p.AddrB.String(), p.NetdevA}, {p.AddrB.String(), p.AddrA.String(), p.NetdevB}} {
		out, err := exec.Command("ip", "-o", "route", "get", r[1], "from", r[0], "oif", r[2]).CombinedOutput()
		if err != nil || !strings.Contains(string(out), " dev "+r[2]+" ") {
			t.Errorf("ip route get %s from %s oif %s: %v: %s", r[1], r[0], r[2], err, out)
		}
	}
	out, err := exec.Command("ip", "-o", "route", "get", p.AddrB.String(), "from", p.AddrA.String()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), " dev lo ") {
		t.Errorf("ip route get %s from %s: %v: %s, want dev lo", p.AddrB, p.AddrA, err, out)
	}
	for _, nd := range []string{p.NetdevA, p.NetdevB} {
		if v, err := os.ReadFile(filepath.Join("/proc/sys/net/ipv4/conf", nd, "accept_local")); err != nil || strings.TrimSpace(string(v)) != "1" {
			t.Errorf("%s: accept_local %q (%v), want 1: ARP between the pair's local addresses would be dropped", nd, bytes.TrimSpace(v), err)
		}
	}
}

// TestLabPairsConnect checks that rdma_cm connects across each provider's
// pair, A to B: rping's three round trips, each a send and an RDMA read
// and write.
func TestLabPairsConnect(t *testing.T) {
	env := RequireRDMA(t)
	for _, p := range env.Pairs() {
		t.Run(p.Provider, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			out, err := rping(ctx, t, p.AddrA, p.AddrB)
			if err != nil {
				t.Fatalf("rping %v -> %v (%s -> %s): %v", p.AddrA, p.AddrB, p.DevA, p.DevB, err)
			}
			if n := strings.Count(out, "ping data:"); n != 3 {
				t.Errorf("rping %v -> %v: %d round trips, want 3:\n%s", p.AddrA, p.AddrB, n, out)
			}
		})
	}
}

// rping runs an rping server on b and a client from a, three round trips,
// and returns the client's output.
func rping(ctx context.Context, t *testing.T, a, b netip.Addr) (string, error) {
	return ServerClient(ctx,
		[]string{"rping", "-s", "-a", b.String(), "-C", "3", "-v"},
		[]string{"rping", "-c", "-I", a.String(), "-a", b.String(), "-C", "3", "-v"}, t.Logf)
}

// linkNetdev returns the netdev under an RDMA device's port 1, as
// `rdma link show` reports it.
func linkNetdev(dev string) (string, error) {
	out, err := exec.Command("rdma", "-j", "link", "show", dev+"/1").Output()
	if err != nil {
		return "", fmt.Errorf("rdma link show %s/1: %w", dev, err)
	}
	var links []struct {
		Netdev string `json:"netdev"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return "", fmt.Errorf("rdma link show %s/1: %q: %v", dev, out, err)
	}
	return links[0].Netdev, nil
}

// localAddrs returns the addresses of this network namespace's interfaces,
// each with its interface's name.
func localAddrs(t *testing.T) map[netip.Addr]string {
	t.Helper()
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
	return local
}
