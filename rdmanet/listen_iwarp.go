package rdmanet

import (
	"errors"
	"log/slog"
	"net/netip"
	"syscall"
	"time"

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

// An iWARP listener is a kernel TCP socket of the provider's, which the
// rdma_cm listener cannot see. Debian 12's siw (Linux 6.1) loses it: in the
// lab, with a few hundred connections opened at once, the listening socket
// was gone within seconds while the rdma_cm ID listened on, reporting
// nothing, and every later request was refused by TCP's reset, as if
// nothing listened. (An accepted socket copies its listener's callbacks
// and endpoint; one that closes before siw takes it from the accept queue
// reports its close on the listener's endpoint, which siw then releases.)
// So an iWARP listener asks the kernel every iwarpListenCheck whether the
// socket is still there (tcpListening), and when it is not, twice in a
// row, makes the listener again on the same address and port, as after
// any failure of the listening ID (rdmaSide.run).

// iwarpListenCheck is how often an iWARP listener's socket is looked for:
// a listener that lost it refuses every request until it is made again.
const iwarpListenCheck = time.Second

// errIWARPListenLost is why an iWARP listener was made again.
var errIWARPListenLost = errors.New("rdmanet: the iWARP provider's listening TCP socket is gone (the kernel dropped it); listening again")

// listensOnIWARP reports whether the side's listener takes iWARP
// requests: an iWARP device's address, or the wildcard address of a host
// with one, on a listener that serves RDMA alone.
func (s *rdmaSide) listensOnIWARP() bool {
	if s.servesTCP {
		return false // it leaves iWARP devices out (listen_each.go)
	}
	if s.addr.Addr().IsUnspecified() {
		return hostHasIWARP()
	}
	d, err := verbs.DeviceForAddr(s.addr.Addr())
	return err == nil && deviceTransport(d.Device) == verbs.TransportIWARP
}

// watchIWARPListen looks for the listener's socket every period until the
// side closes, and closes the listening ID that lost it, so that run makes
// it again. A kernel that cannot be asked ends the watch.
func (s *rdmaSide) watchIWARPListen(period time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	missed := 0
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		id := s.servingID
		s.mu.Unlock()
		if id == nil {
			missed = 0
			continue
		}
		ok, err := s.tcpListening(s.addr)
		switch {
		case err != nil:
			slog.Debug("rdmanet: cannot watch the iWARP listener's socket", "addr", s.addr, "err", err)
			return
		case ok:
			missed = 0
			continue
		}
		// Twice: a listener being made again has no socket for a moment.
		if missed++; missed < 2 {
			continue
		}
		missed = 0
		s.mu.Lock()
		if s.servingID == id {
			s.lostListen.Store(true)
			id.Close()
		}
		s.mu.Unlock()
	}
}
