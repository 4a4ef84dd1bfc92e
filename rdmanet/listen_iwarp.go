package rdmanet

import (
	"errors"
	"log/slog"
	"net/netip"
	"sync"
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
// nothing listened. An accepted socket copies its listener's callbacks and
// endpoint, and one that closes before siw has taken it from the accept
// queue reports its close on the listener's endpoint: siw's work handler
// then releases the listening socket and drops its reference to the
// endpoint (siw_cm.c, SIW_CM_WORK_PEER_CLOSE).
//
// Such a listener cannot be made again in the process. Destroying its ID
// makes siw release the endpoint a second time (siw_drop_listeners): in the
// lab that was a "refcount_t: underflow; use-after-free" warning, and on
// the next destroy a "list_del corruption" BUG that killed the thread
// inside rdma_destroy_id, holding the listener's Close forever. And while
// the ID lives, rdma_cm holds its port, so a new ID cannot listen there.
// So an iWARP listener asks the kernel every iwarpListenCheck whether its
// socket is still there (tcpListening), and when it is not, twice in a
// row, says so: the listener's RDMAError and a warning name the loss, and
// its ID is kept, never destroyed (keepLostListener), until the process
// exits and the kernel tears it down.

// iwarpListenCheck is how often an iWARP listener's socket is looked for.
const iwarpListenCheck = time.Second

// errIWARPListenLost is why an iWARP listener no longer takes requests.
var errIWARPListenLost = errors.New("rdmanet: the iWARP provider dropped this listener's TCP socket (Soft-iWARP in Linux 6.1 does when a connection closes before it is accepted); RDMA requests to this port are refused until the process restarts: the listening ID is kept, since destroying it would corrupt the kernel's memory")

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
// side closes or the socket is lost. A loss it reports (a stop, RDMAError,
// a warning), and marks the listening ID lost, for run to keep instead of
// destroying. A kernel that cannot be asked ends the watch.
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
		lost := s.servingID == id
		if lost {
			s.lostID = id
			s.why = &fallback.Error{Reason: fallback.ReasonRDMAError, Err: errIWARPListenLost}
		}
		s.mu.Unlock()
		if lost {
			s.stops.Add(1)
			slog.Warn("rdmanet: the RDMA listener lost its iWARP socket", "addr", s.addr, "err", errIWARPListenLost)
			return
		}
	}
}

// lostListeners keeps the listening IDs whose iWARP socket was lost, and
// so their event channels, for the process's life (see above).
var lostListeners struct {
	sync.Mutex
	ids []requestSource
}

// keepLostListener keeps id, never to be closed.
func keepLostListener(id requestSource) {
	lostListeners.Lock()
	lostListeners.ids = append(lostListeners.ids, id)
	lostListeners.Unlock()
}
