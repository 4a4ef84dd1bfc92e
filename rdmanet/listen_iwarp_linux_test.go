//go:build linux

package rdmanet

import (
	"net"
	"net/netip"
	"testing"
)

// TestTCPListening: sock_diag finds a TCP listener by its address and
// port, and a wildcard one by its port, and no longer once it closed.
func TestTCPListening(t *testing.T) {
	for _, tc := range []struct{ network, listen, ask string }{
		{"tcp4", "127.0.0.1:0", "127.0.0.1"},
		{"tcp4", "0.0.0.0:0", "127.0.0.1"},
		{"tcp6", "[::1]:0", "::1"},
	} {
		ln, err := net.Listen(tc.network, tc.listen)
		if err != nil {
			t.Logf("%s %s: %v (skipped)", tc.network, tc.listen, err)
			continue
		}
		port := uint16(ln.Addr().(*net.TCPAddr).Port)
		ap := netip.AddrPortFrom(netip.MustParseAddr(tc.ask), port)
		if ok, err := tcpListening(ap); err != nil || !ok {
			t.Errorf("%s on %v: tcpListening(%v) = %v, %v; want true", tc.network, ln.Addr(), ap, ok, err)
		}
		other := netip.AddrPortFrom(netip.MustParseAddr(tc.ask), port+1)
		if ok, err := tcpListening(other); err != nil || ok {
			// Another process may listen on port+1; only a failure to ask is wrong.
			t.Logf("%v: %v, %v", other, ok, err)
		}
		ln.Close()
		if ok, err := tcpListening(ap); err != nil || ok {
			t.Errorf("%s on %v, closed: tcpListening(%v) = %v, %v; want false", tc.network, ln.Addr(), ap, ok, err)
		}
	}
}
