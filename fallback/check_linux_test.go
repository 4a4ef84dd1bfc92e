package fallback

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRouteCheckAtTheDescriptorLimit: a process at its RLIMIT_NOFILE cannot
// list its interfaces; that is reason resources, not a route without RDMA,
// and no later dial is answered with it (the lab's descriptor burst saw
// RDMA refused as route-without-rdma after the limit was raised).
func TestRouteCheckAtTheDescriptorLimit(t *testing.T) {
	// The route is checked after the host: this host may have no RDMA,
	// so Check is told that it has.
	hostCheck()
	real := host.verdict.Load()
	t.Cleanup(func() { host.verdict.Store(real) })
	host.verdict.Store(&hostVerdict{until: time.Now().Add(time.Hour)})
	src := netip.MustParseAddr("127.0.0.1")
	dst := netip.AddrPortFrom(src, 9)
	routes.Lock()
	delete(routes.m, src)
	routes.Unlock()
	var saved unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	// A new descriptor takes the lowest free number, which must be under
	// the limit: with stdin, stdout and stderr open, 3 leaves none.
	lowered := saved
	lowered.Cur = 3
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lowered); err != nil {
		t.Fatal(err)
	}
	atLimit := routeStep(src).Err
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	if atLimit == nil || atLimit.Reason != ReasonResources {
		t.Fatalf("the route check at the descriptor limit: %v; want reason %s", atLimit, ReasonResources)
	}
	// Check does not keep such a verdict.
	routes.Lock()
	if routes.m == nil {
		routes.m = make(map[netip.Addr]routeVerdict)
	}
	routes.Unlock()
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lowered); err != nil {
		t.Fatal(err)
	}
	first := Check(dst, src)
	unix.Setrlimit(unix.RLIMIT_NOFILE, &saved)
	second := Check(dst, src)
	if first == nil || first.Reason != ReasonResources {
		t.Fatalf("Check at the limit: %v", first)
	}
	if second == nil || second.Reason == ReasonResources {
		t.Errorf("Check after the limit was raised: %v; want the route's own verdict (lo has no RDMA)", second)
	}
}
