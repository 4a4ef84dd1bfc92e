package fallback

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

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
	var steps []Step
	fail := func(name, detail string, r Reason, err error) []Step {
		return append(steps, Step{Name: name, Detail: detail, Err: &Error{Reason: r, Err: err}})
	}
	if err := verbs.Available(); err != nil {
		return fail("rdma-core", "", Classify(err), err)
	}
	steps = append(steps, Step{Name: "rdma-core", Detail: "libibverbs.so.1 and librdmacm.so.1 loaded"})

	devs, err := verbs.Devices()
	if err == nil && len(devs) == 0 {
		err = verbs.ErrNoDevice
	}
	if err != nil {
		return fail("devices", "", Classify(err), err)
	}
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = d.Name
	}
	steps = append(steps, Step{Name: "devices", Detail: strings.Join(names, ", ")})

	src := local.Unmap()
	how := "given"
	if !src.IsValid() {
		src, err = SourceFor(dst)
		if err != nil {
			return fail("source address", "", ReasonUnreachable, err)
		}
		how = "chosen by routing"
	}
	steps = append(steps, Step{Name: "source address", Detail: fmt.Sprintf("%v (%s)", src, how)})

	ad, err := verbs.DeviceForAddr(src)
	switch {
	case errors.Is(err, verbs.ErrNoDevice):
		return fail("route", fmt.Sprintf("%v is on %s", src, ad.Netdev), ReasonRouteNoRDMA, err)
	case err != nil:
		return fail("route", "", ReasonRouteNoRDMA, err)
	}
	return append(steps, Step{Name: "route", Detail: fmt.Sprintf("%v is on %s, RDMA device %s", src, ad.Netdev, ad.Device)})
}

// Check is Diagnose's verdict: nil when RDMA may work, else why not.
func Check(dst netip.AddrPort, local netip.Addr) *Error {
	steps := Diagnose(dst, local)
	return steps[len(steps)-1].Err
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
