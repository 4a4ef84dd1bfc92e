//go:build !race

// Allocation counts mean nothing under the race detector, which allocates
// itself.

package fallback

import (
	"net/netip"
	"testing"
)

// TestCheckCachedAnswerAllocatesNothing: once the host's verdict is known,
// asking for it allocates nothing, and on a host without RDMA neither does
// Check: a "tcp" dial there must cost what net.Dial costs.
func TestCheckCachedAnswerAllocatesNothing(t *testing.T) {
	hostCheck()
	if n := testing.AllocsPerRun(1000, func() { hostCheck() }); n != 0 {
		t.Errorf("hostCheck allocates %v times per call", n)
	}
	if hostCheck() == nil {
		return // this host has RDMA: Check goes on to the route, which costs a socket
	}
	dst := netip.MustParseAddrPort("198.18.0.2:7471")
	if n := testing.AllocsPerRun(1000, func() { Check(dst, netip.Addr{}) }); n != 0 {
		t.Errorf("Check on a host without RDMA allocates %v times per call", n)
	}
}
