// Package rdmanet gives Go programs RDMA connections as plain net.Conn and
// net.Listener values.
//
// A connection is an RDMA reliable connection set up with rdma_cm and carries
// a byte stream in registered memory, using Valkey's RDMA transport as its
// wire protocol, so rdmanet talks to Valkey servers and clients over RDMA.
// Each Conn keeps the whole net.Conn contract: deadlines (independent for
// reading and writing, settable while a call is blocked), Close unblocking
// pending calls, *net.OpError errors, net.ErrClosed after Close and io.EOF
// after the peer closes.
//
//	ln, err := rdmanet.Listen("tcp", ":7471")          // RDMA and TCP on one port
//	...
//	c, err := rdmanet.Dial("tcp", "198.18.0.2:7471")   // RDMA if it can, else TCP
//	transport, why := rdmanet.TransportOf(c)           // and why not RDMA
//
// On networks "tcp", "tcp4" and "tcp6", a dial falls back to TCP when RDMA
// cannot be used (no cgo, no rdma-core, no device, a route without RDMA, no
// RDMA listener at the peer, no answer from the peer's host, a resource
// limit), and says why with a *fallback.Error; networks "rdma", "rdma4" and
// "rdma6" never fall back. Package fallback holds the policy (and the
// RDMANET_TRANSPORT environment variable that overrides it) and the reasons.
//
// Waiting (for data, for room to write, for a connection) parks goroutines
// in Go's netpoller on the connection's completion and event channels.
//
// For operators, ReadMetrics counts connections, fallbacks, failed RDMA
// connection attempts, errors on live connections by kind and traffic
// (PublishExpvar publishes them; the module
// github.com/rdmanet/sdk/metrics/prometheus exports them to Prometheus),
// and Connections lists the live connections, which ConnsHandler serves
// over HTTP for `rdmanet conns`.
package rdmanet

import (
	"net/netip"

	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/verbs"
)

// Network is the network name of RDMA connections and addresses.
const Network = "rdma"

// Addr is the address of an RDMA endpoint: an IP address and an rdma_cm port
// (a port space separate from TCP's).
type Addr struct {
	netip.AddrPort
}

// Network returns "rdma".
func (a *Addr) Network() string { return Network }

// String returns the address as host:port.
func (a *Addr) String() string {
	if a == nil {
		return "<nil>"
	}
	return a.AddrPort.String()
}

var (
	// ErrNotSupported is returned when this build or platform cannot use RDMA
	// (the same error as verbs.ErrNotSupported and cm.ErrNotSupported).
	ErrNotSupported = verbs.ErrNotSupported
	// ErrHalfCloseUnsupported: CloseWrite needs a peer that negotiated orderly
	// half-close; Valkey's protocol has none.
	ErrHalfCloseUnsupported = stream.ErrHalfCloseUnsupported
)
