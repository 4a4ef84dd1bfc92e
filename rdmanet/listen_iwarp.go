package rdmanet

import (
	"errors"
	"net/netip"
	"syscall"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/verbs"
)

// iWARP runs over TCP, and its listeners take TCP port numbers (siw binds
// a kernel TCP socket to the device's address and the port), where RoCE's
// and InfiniBand's rdma_cm ports are a space of their own. So a listener
// that serves both transports on one port cannot listen for iWARP on an
// iWARP device's address, nor on the wildcard address of a host with an
// iWARP device (rdma_cm listens on every device there, and one failure
// fails all). It serves TCP and says why.

// errIWARPSharesPorts is the error of fallback.ReasonIWARPPort.
var errIWARPSharesPorts = errors.New("rdmanet: the TCP side holds this port, and iWARP listens on TCP ports (listen on network \"rdma\" for iWARP clients)")

// iwarpPortConflict reports whether rdma_cm's failure to listen on addr
// (err) is iWARP's port space colliding with the TCP listener's.
func iwarpPortConflict(addr netip.Addr, err error) bool {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return false
	}
	if !addr.IsUnspecified() {
		d, err := verbs.DeviceForAddr(addr)
		return err == nil && deviceTransport(d.Device) == verbs.TransportIWARP
	}
	return hostHasIWARP()
}

// hostHasIWARP reports whether the host has an iWARP device.
func hostHasIWARP() bool {
	devs, _ := verbs.Devices()
	for _, d := range devs {
		if d.Transport == verbs.TransportIWARP {
			return true
		}
	}
	return false
}

// deviceTransport is the transport of the device called name.
func deviceTransport(name string) verbs.Transport {
	devs, _ := verbs.Devices()
	for _, d := range devs {
		if d.Name == name {
			return d.Transport
		}
	}
	return verbs.TransportUnspecified
}

// iwarpPortError is the listener's reason for serving TCP only.
func iwarpPortError(err error) *fallback.Error {
	return &fallback.Error{Reason: fallback.ReasonIWARPPort, Err: errors.Join(errIWARPSharesPorts, err)}
}
