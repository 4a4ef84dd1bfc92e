package rdmanet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/tcplink"
	"github.com/rdmanet/sdk/internal/wire"
)

// A group's last path is one TCP connection to the listener's port
// (docs/protocol.md, "A group's TCP link"): when none of its RDMA paths
// has a link, the dialer connects from the TCP port it keeps for the
// group (its first link's Hello named it, as a session's does) and sends
// the group's join Hello; the listener answers as to a TCP resume, and
// both ends add a tcplink carrier to the group. Every stream moves onto
// it, each with the memory its rings have; none opens there. Once an RDMA
// link is back, the streams move to it and the group retires the TCP
// link (internal/group, lastResort).

// joinTCP makes the group's TCP link: from its reserved port, to the
// listener's port behind the first path's address.
func (g *groupPaths) joinTCP(done <-chan struct{}) error {
	ctx, cancel := joinContext(done)
	defer cancel()
	id, process := g.name()
	dst := g.paths[0].dst
	// From the first link's address if it still can (the listener holds
	// back connections from its dialer's addresses), else from any.
	d := net.Dialer{Control: reuseAddr, LocalAddr: &net.TCPAddr{IP: g.tcpSrc.AsSlice(), Port: int(g.tcpPort.port)}}
	conn, err := d.DialContext(ctx, "tcp", dst.String())
	if err != nil && g.tcpSrc.IsValid() {
		d.LocalAddr = &net.TCPAddr{Port: int(g.tcpPort.port)}
		conn, err = d.DialContext(ctx, "tcp", dst.String())
	}
	if err != nil {
		if nothingListens(err) && g.mux.Stats().Links == 0 {
			// Every RDMA path failed, and the host refuses TCP: the
			// server's process is gone (3 x KeepAlive at most, with the
			// detection).
			g.mux.End(fmt.Errorf("%w: %w at %s: %w", group.ErrDown, errListenerGone, dst, err))
		}
		return err
	}
	tc := conn.(*net.TCPConn)
	deadline, _ := ctx.Deadline()
	tc.SetDeadline(deadline)
	hello := wire.Hello{Version: wire.HelloVersion, Features: groupOffer | wire.FeatureGroupMove,
		RecvDepth: groupRecvDepth, RingSize: groupLinkRing, Process: processID(), Group: id}
	peer, err := tcpHelloExchange(tc, hello)
	if err == nil && (peer.Process != process || peer.Group != id || peer.Features&wire.FeatureGroupMove == 0) {
		err = fmt.Errorf("rdmanet: TCP to %s reaches another process than the group's first link", dst)
	}
	var refused *tcpRefusedError
	if errors.As(err, &refused) && refused.reason == unknownGroupReason {
		g.mux.End(fmt.Errorf("%w: %w (tcp -> %s)", group.ErrDown, errGroupGone, dst))
	}
	if err != nil {
		tc.Close()
		return err
	}
	l, err := newGroupTCPLink(tc)
	if err != nil {
		tc.Close()
		return err
	}
	if err := g.mux.AddLink(l); err != nil {
		l.Close()
		return err
	}
	g.mu.Lock()
	g.tcp = l
	g.mu.Unlock()
	slog.Info("rdmanet: a link group has no RDMA path left; its connections move to TCP", "path", l.Caps().Name)
	return nil
}

// newGroupTCPLink is a group's link over tc: a carrier of the streams'
// rings, with the depths of the group's RDMA links.
func newGroupTCPLink(tc *net.TCPConn) (*tcplink.Link, error) {
	return tcplink.New(tc, tcplink.Config{Carrier: true,
		SendDepth: groupSendDepth, RecvDepth: groupRecvDepth, ControlDepth: groupControlDepth,
		Name: fmt.Sprintf("tcp %v -> %v", tc.LocalAddr(), tc.RemoteAddr())})
}

// noRDMALinkLocked reports whether no path has an RDMA link now.
func (g *groupPaths) noRDMALinkLocked() bool {
	for _, p := range g.paths {
		if p.link != nil {
			return false
		}
	}
	return true
}

// tcpJoinFrom reports whether remote is a TCP port the dialer of one of
// this process's accepted groups keeps, or kept for a group that ended
// lately: a TCP connection from it may be a group's join (classifyTCP
// waits for its Hello).
func tcpJoinFrom(remote netip.AddrPort) bool {
	acceptedGroups.Lock()
	forgetEndedGroupsLocked(time.Now())
	for _, e := range acceptedGroups.ended {
		if e.tcpPort == remote.Port() && slices.Contains(e.dialers, remote.Addr()) {
			acceptedGroups.Unlock()
			return true
		}
	}
	var linkless []*group.Mux
	for _, g := range acceptedGroups.byTCPPort[remote.Port()] {
		if slices.Contains(g.dialers, remote.Addr()) {
			acceptedGroups.Unlock()
			return true
		}
		if g.mux != nil {
			linkless = append(linkless, g.mux)
		}
	}
	acceptedGroups.Unlock()
	// From another address: a group with no link may be the dialer's,
	// whose address went with its paths.
	for _, m := range linkless {
		if m.Stats().Links == 0 {
			return true
		}
	}
	return false
}

// anyTCPJoins reports whether some accepted group's dialer keeps a TCP
// port, or kept one for a group that ended lately.
func anyTCPJoins() bool {
	acceptedGroups.Lock()
	defer acceptedGroups.Unlock()
	forgetEndedGroupsLocked(time.Now())
	return len(acceptedGroups.byTCPPort) > 0 || len(acceptedGroups.ended) > 0
}

// serveTCPGroupJoin adds a TCP link to the group h names, or tells the
// dialer why not (refuse).
func (l *Listener) serveTCPGroupJoin(tc *net.TCPConn, h wire.Hello, refuse func(error)) {
	port := l.rdma.addr.Port()
	ctx, cancel := context.WithTimeout(context.Background(), acceptTimeout)
	m := findAcceptedGroup(ctx, h, port)
	cancel()
	if m == nil || h.Features&wire.FeatureGroupMove == 0 {
		// The reason as an RDMA join's refusal gives it, which joinTCP
		// looks for: its dialer ends the group.
		refuse(errors.New(unknownGroupReason))
		return
	}
	accept := wire.Hello{Version: wire.HelloVersion, Features: h.Features & (groupOffer | wire.FeatureGroupMove),
		RecvDepth: groupRecvDepth, RingSize: groupLinkRing, Process: processID(), Group: h.Group}
	if _, err := tc.Write(append([]byte{tcpResumed}, accept.Encode()...)); err != nil {
		tc.Close()
		return
	}
	lk, err := newGroupTCPLink(tc)
	if err != nil {
		tc.Close()
		return
	}
	if err := m.AddLink(lk); err != nil {
		lk.Close()
		return
	}
	slog.Info("rdmanet: a link group's dialer has no RDMA path left; its connections move to TCP", "path", lk.Caps().Name)
}
