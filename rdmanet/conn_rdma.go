package rdmanet

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/rdmacore"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/wire"
)

// An RDMA connection is made in two steps around rdma_cm's handshake: newConn
// before connect or accept (every receive must be posted before the peer
// can send), start once it is established, or discard if it never was.

// newConn makes the verbs objects of a connection on id and posts its
// receives. With mem (a connection that may become a resumable session),
// its rings are mem's, which the connection owns from now on. With shared,
// its receives are its peer group's shared receive queue's (an accepted
// connection whose dialer offered credit grants, Config.sharedRecv).
func newConn(id *cm.ID, cfg Config, server bool, mem *ringMem, shared bool) (*Conn, error) {
	lc := cfg.firstRings()
	if mem != nil {
		lc = cfg.linkConfig()
		if err := mem.lendTo(&lc); err != nil {
			return nil, err
		}
	}
	lc.SharedRecv = shared
	l, err := rdmalink.New(id, lc)
	if err != nil {
		return nil, peerMemoryError(err)
	}
	return &Conn{link: l, rdma: l, cfg: cfg, server: server, mem: mem}, nil
}

// PeerMemoryError is a connection refused because the connections with
// its peer on the device hold all the registered memory Config.PeerMemory
// allows them. It matches fallback.ReasonResources: a listener rejects the
// dial for resources, and a dialer on "tcp" falls back to TCP.
type PeerMemoryError struct {
	Peer   netip.Addr
	Device string
	// Held is what the peer's connections hold, Bound what they may, and
	// Asked what this connection needed more.
	Held, Bound, Asked int64
	// Memlock is the RLIMIT_MEMLOCK whose half the bound is by default,
	// or 0 when Config.PeerMemory set it.
	Memlock int64
}

func (e *PeerMemoryError) Error() string {
	s := fmt.Sprintf("rdmanet: the connections with %v on %s hold %s of the %s of registered memory Config.PeerMemory allows them, and one more needs %s",
		e.Peer, e.Device, rdmacore.IEC(e.Held), rdmacore.IEC(e.Bound), rdmacore.IEC(e.Asked))
	if e.Memlock > 0 {
		s += fmt.Sprintf(" (by default half of the %s RLIMIT_MEMLOCK allows without CAP_IPC_LOCK: raise either, or set Config.PeerMemory)", rdmacore.IEC(e.Memlock))
	}
	return s
}

func (e *PeerMemoryError) Is(target error) bool { return target == fallback.ReasonResources }

// peerMemoryError is err as a *PeerMemoryError, if a peer group's bound
// made it.
func peerMemoryError(err error) error {
	var be *rdmalink.BoundError
	if !errors.As(err, &be) {
		return err
	}
	return &PeerMemoryError{Peer: be.Peer, Device: be.Device, Held: be.Held, Bound: be.Bound, Asked: be.Asked, Memlock: be.Memlock}
}

// start runs once the connection is established, with the extensions both
// sides agreed on and the peer's Hello (zero for a Valkey peer). On an
// error (a Hello this side cannot work with) nothing was started: the
// caller discards the connection as after a failed handshake.
func (c *Conn) start(features wire.Features, peer wire.Hello) error {
	if err := c.rdma.Established(features&wire.LinkFeatures, c.server); err != nil {
		return err
	}
	if err := c.begin(features, peer); err != nil {
		return err
	}
	c.rdma.StartEvents()
	return nil
}

// discard releases a connection that was never started (its handshake
// failed); the caller has closed or will close its cm ID.
func (c *Conn) discard() {
	c.rdma.Discard()
	c.mem.close()
}

// discardSession is discard for a connection that may have been given a
// session id: the listener forgets it.
func (c *Conn) discardSession() {
	if c.sess != nil {
		c.sess.Discard()
	}
	c.discard()
}
