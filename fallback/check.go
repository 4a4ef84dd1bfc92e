package fallback

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmanet/sdk/verbs"
)

// Step is one check of [Diagnose]: what was checked, what was found, and,
// when it fails, the reason RDMA cannot be used.
type Step struct {
	Name   string // "rdma-core", "devices", "source address", "route"
	Detail string // what was found, e.g. "rxe0, rxe1" or "198.18.0.1 on lab-a (rxe0)"
	Err    *Error // nil when the check passed
}

// Diagnose makes the checks that can be made without sending anything, in
// order, and stops at the first that fails: can this build and host use
// RDMA at all, and does the route to dst leave through an interface with an
// RDMA device. local, if valid, is the source address the dial will use
// (Dialer.LocalAddr); otherwise the kernel's routing picks it, as for a
// TCP connection. Whether a listener answers at dst is not checked: only a
// connection attempt can tell.
func Diagnose(dst netip.AddrPort, local netip.Addr) []Step {
	steps := diagnoseHost()
	if steps[len(steps)-1].Err != nil {
		return steps
	}
	src, step := sourceStep(dst, local)
	if steps = append(steps, step); step.Err != nil {
		return steps
	}
	return append(steps, routeStep(src))
}

// diagnoseHost checks this build and host: rdma-core and devices.
func diagnoseHost() []Step {
	if err := verbs.Available(); err != nil {
		return []Step{{Name: "rdma-core", Err: &Error{Reason: Classify(err), Err: err}}}
	}
	steps := []Step{{Name: "rdma-core", Detail: "libibverbs.so.1 and librdmacm.so.1 loaded"}}
	devs, err := verbs.Devices()
	if err == nil && len(devs) == 0 {
		err = verbs.ErrNoDevice
	}
	if err != nil {
		return append(steps, Step{Name: "devices", Err: &Error{Reason: Classify(err), Err: err}})
	}
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = d.Name
	}
	return append(steps, Step{Name: "devices", Detail: strings.Join(names, ", ")})
}

// sourceStep finds the source address: local if valid, else the one the
// kernel routes from to dst.
func sourceStep(dst netip.AddrPort, local netip.Addr) (netip.Addr, Step) {
	if src := local.Unmap(); src.IsValid() {
		return src, Step{Name: "source address", Detail: fmt.Sprintf("%v (given)", src)}
	}
	src, err := SourceFor(dst)
	if err != nil {
		return src, Step{Name: "source address", Err: &Error{Reason: ReasonUnreachable, Err: err}}
	}
	return src, Step{Name: "source address", Detail: fmt.Sprintf("%v (chosen by routing)", src)}
}

// routeStep checks that the interface holding src has an RDMA device.
func routeStep(src netip.Addr) Step {
	ad, err := verbs.DeviceForAddr(src)
	if err != nil {
		detail := ""
		if ad.Netdev != "" {
			detail = fmt.Sprintf("%v is on %s", src, ad.Netdev)
		}
		reason := ReasonRouteNoRDMA
		if Classify(err) == ReasonResources {
			// The interfaces could not be listed (no descriptor for
			// the netlink socket): a passing failure, not an answer.
			reason = ReasonResources
		}
		return Step{Name: "route", Detail: detail, Err: &Error{Reason: reason, Err: err}}
	}
	return Step{Name: "route", Detail: fmt.Sprintf("%v is on %s, RDMA device %s", src, ad.Netdev, ad.Device)}
}

// checkTTL is how long Check reuses what it found: the host's devices and
// which interface a source address is on change rarely, and finding out
// costs a few system calls and netlink dumps per dial (tens of
// milliseconds under the lab's emulated CPU). A device that appears is used
// at most this much later.
const checkTTL = 5 * time.Second

// hostVerdict is what Check found about this build and host (rdma-core,
// devices): nil err when RDMA may work here.
type hostVerdict struct {
	err   *Error
	until time.Time // found again, off the dials' path, after this
}

// host holds the process's verdict on its own RDMA. On a host without RDMA
// (the common case for a program that merely may use it) every "tcp" dial
// asks, and the answer must cost what an atomic load costs, so that the
// dial costs what net.Dial does.
var host struct {
	verdict    atomic.Pointer[hostVerdict]
	refreshing atomic.Bool // a goroutine is finding the verdict again
	first      sync.Mutex  // the first dials wait for one finding, not one each
}

// hostCheck is Check's verdict on this build and host. Only the first call
// finds it itself; afterwards a stale verdict is still answered while a
// goroutine finds the new one. A verdict of ReasonResources (the process
// was at its descriptor limit while rdma-core listed the devices, say) is
// never answered again: it was this moment's, and the next dial finds the
// verdict itself, so that a process back from its limit gets RDMA at once.
func hostCheck() *Error {
	v := host.verdict.Load()
	if v == nil || v.passing() {
		host.first.Lock()
		defer host.first.Unlock()
		if v = host.verdict.Load(); v == nil || v.passing() {
			v = findHost()
		}
		return v.err
	}
	if time.Now().After(v.until) && host.refreshing.CompareAndSwap(false, true) {
		go func() {
			defer host.refreshing.Store(false)
			findHost()
		}()
	}
	return v.err
}

// passing reports a verdict that no later dial may reuse.
func (v *hostVerdict) passing() bool { return v.err != nil && v.err.Reason == ReasonResources }

// findHost checks the host and publishes the verdict.
func findHost() *hostVerdict {
	steps := diagnoseHost()
	v := &hostVerdict{err: steps[len(steps)-1].Err, until: time.Now().Add(checkTTL)}
	host.verdict.Store(v)
	return v
}

// routes caches Check's verdicts on routes, by source address; see checkTTL.
var routes struct {
	sync.Mutex
	m map[netip.Addr]routeVerdict
}

type routeVerdict struct {
	err   *Error
	until time.Time
}

// maxCachedRoutes bounds the cache of route verdicts.
const maxCachedRoutes = 1024

// Check is Diagnose's verdict, nil when RDMA may work and otherwise why
// not; unlike Diagnose it reuses its findings for a few seconds (checkTTL),
// and on a host without RDMA it answers at once without allocating.
func Check(dst netip.AddrPort, local netip.Addr) *Error {
	if err := hostCheck(); err != nil {
		return err
	}
	// Routing picks the source per destination: looked up each time, and
	// outside the lock, so that concurrent dials do not queue behind it.
	src, step := sourceStep(dst, local)
	if step.Err != nil {
		return step.Err
	}
	now := time.Now()
	routes.Lock()
	defer routes.Unlock()
	if v, ok := routes.m[src]; ok && now.Before(v.until) {
		return v.err
	}
	if routes.m == nil || len(routes.m) >= maxCachedRoutes {
		routes.m = make(map[netip.Addr]routeVerdict)
	}
	v := routeVerdict{err: routeStep(src).Err, until: now.Add(checkTTL)}
	if v.err != nil && v.err.Reason == ReasonResources {
		return v.err // this moment's, as hostCheck's: the next dial asks again
	}
	routes.m[src] = v
	return v.err
}

// SourceFor returns the local address the kernel would send from to reach
// dst, as for a TCP connection. It connects a UDP socket, which sends nothing.
func SourceFor(dst netip.AddrPort) (netip.Addr, error) {
	if !dst.Addr().IsValid() || dst.Addr().IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("fallback: no route to %v", dst.Addr())
	}
	port := dst.Port()
	if port == 0 {
		port = 9 // connecting to port 0 is refused; the port does not affect routing
	}
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst.Addr(), port)))
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}
