package rdmacore

import (
	"net/netip"
	"testing"
)

func TestSockaddrRoundTrip(t *testing.T) {
	for _, s := range []string{"198.18.0.1:7471", "0.0.0.0:0", "[::1]:6379", "[fe80::1]:1", "[2001:db8::5]:65535"} {
		ap := netip.MustParseAddrPort(s)
		sa := EncodeSockaddr(ap)
		if got := DecodeSockaddr(&sa); got != ap {
			t.Errorf("%s: round trip gave %s", s, got)
		}
	}
}

func TestSockaddrLayout(t *testing.T) {
	sa := EncodeSockaddr(netip.MustParseAddrPort("198.18.0.2:6379"))
	// sockaddr_in: family 2 in host order (little-endian here), port big-endian, address.
	want := []byte{2, 0, 0x18, 0xeb, 198, 18, 0, 2}
	if string(sa[:8]) != string(want) {
		t.Errorf("sockaddr_in bytes % x, want % x", sa[:8], want)
	}
	sa = EncodeSockaddr(netip.MustParseAddrPort("[::ffff:198.18.0.2]:1"))
	if sa[0] != 2 {
		t.Errorf("IPv4-mapped address must be encoded as sockaddr_in, family %d", sa[0])
	}
	var unknown Sockaddr
	if got := DecodeSockaddr(&unknown); got.IsValid() {
		t.Errorf("family 0 decoded as %s", got)
	}
}
