package rdmanet

import (
	"net"

	"github.com/rdmanet/sdk/fallback"
)

// The package's memory of destinations where RDMA failed, and its counters.
var (
	failures = fallback.NewMemory(fallback.DefaultMemoryTTL, maxRemembered)
	counters fallback.Counters
)

// maxRemembered bounds the failure memory: a program dialing many
// destinations without RDMA keeps at most this many entries.
const maxRemembered = 4096

// Stats returns connections dialed and accepted by transport, and
// fallbacks by reason (dials and listeners that could not use RDMA,
// whether they then used TCP or failed).
//
// Deprecated: ReadMetrics returns these counters (Metrics.Snapshot) with
// the package's others, read at one moment.
func Stats() fallback.Snapshot { return counters.Snapshot() }

// ForgetFailures forgets every destination where RDMA failed, so that the
// next dial to each tries RDMA again (otherwise a failure is remembered for
// fallback.DefaultMemoryTTL).
func ForgetFailures() { failures.Clear() }

// TCPConn is a connection over TCP: a dial that fell back, or a TCP
// connection that a Listener accepted. It is the *net.TCPConn itself,
// embedded, so every method (ReadFrom and WriteTo too, which let io.Copy
// use splice and sendfile) is TCPConn's own and costs nothing extra; it
// adds only why RDMA was not used.
type TCPConn struct {
	*net.TCPConn
	why error // *fallback.Error or nil
}

// Transport returns fallback.TCP.
func (c *TCPConn) Transport() fallback.Transport { return fallback.TCP }

// FallbackReason says why this connection does not use RDMA: a
// *fallback.Error (match its reason with errors.Is, e.g.
// fallback.ReasonRejected), or nil for a connection accepted by a listener
// that also serves RDMA (the peer chose TCP; only it knows why).
func (c *TCPConn) FallbackReason() error { return c.why }

// Transport returns fallback.RDMA, or fallback.TCP while a resumable
// session runs over TCP (Session says which path).
func (c *Conn) Transport() fallback.Transport {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.onTCPLocked() {
		return fallback.TCP
	}
	return fallback.RDMA
}

// FallbackReason returns nil while the connection uses RDMA, and while a
// session runs over TCP, the link failure that moved it there.
func (c *Conn) FallbackReason() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.onTCPLocked() {
		return c.sess.Why()
	}
	return nil
}

// TransportOf reports the transport a connection uses and, when it is TCP
// because of a fallback, why (a *fallback.Error, or nil). It knows rdmanet's
// connections, *net.TCPConn, and any connection with Transport and
// FallbackReason methods like theirs; for others it returns "".
func TransportOf(c net.Conn) (t fallback.Transport, why error) {
	switch c := c.(type) {
	case interface {
		Transport() fallback.Transport
		FallbackReason() error
	}:
		return c.Transport(), c.FallbackReason()
	case *net.TCPConn:
		return fallback.TCP, nil
	}
	return "", nil
}
