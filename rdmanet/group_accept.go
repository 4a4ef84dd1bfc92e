package rdmanet

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/wire"
)

// acceptedGroups are the groups this process accepted, by id, for the
// links that join them: a dialer's later links may come to another of the
// listener's addresses, served by another rdmaSide.
var acceptedGroups struct {
	sync.Mutex
	m         map[uint64]*acceptedGroup
	byTCPPort map[uint16][]*acceptedGroup // those whose dialer keeps a TCP port
	// ended are the TCP ports of groups that ended here lately, oldest
	// first: their dialers may not know yet (the listener closed with
	// a stream still closing at the dialer's end, and the dialer, taking
	// the disconnect for a failed path, joins over TCP). A join from one
	// is refused as an unknown group; without this it was taken for a
	// plain client's connection and handed to Accept.
	ended []endedGroup
}

// endedGroup is a TCP port a group's dialer kept, and its addresses.
type endedGroup struct {
	tcpPort uint16
	dialers []netip.Addr
	at      time.Time
}

// endedGroupMemory is how long an ended group's TCP port is remembered:
// more than a dialer tries to move its streams (groupMoveTimeout) after it
// found its last link dead. maxEndedGroups bounds the memory it takes;
// the oldest go first.
const (
	endedGroupMemory = time.Minute
	maxEndedGroups   = 1024
)

type acceptedGroup struct {
	mux *group.Mux
	// made is closed once mux is set, or the making failed (mux nil):
	// the dialer's first link is established before this side has made
	// the group, and its second may come meanwhile.
	made    chan struct{}
	port    uint16 // the listener's
	process uint64 // the dialer's
	// tcpPort is the TCP source port the dialer keeps for the group's TCP
	// link, and dialers the addresses its links came from.
	tcpPort uint16
	dialers []netip.Addr
}

// findAcceptedGroup is the group a join names, if it is a group of the
// listener's port made by the same dialer. A group still being made is
// waited for, up to ctx's end: the dialer's first link is up as soon as
// this side accepted it, before the group exists, and the dialer joins
// its other paths at once.
func findAcceptedGroup(ctx context.Context, h wire.Hello, port uint16) *group.Mux {
	acceptedGroups.Lock()
	g := acceptedGroups.m[h.Group]
	acceptedGroups.Unlock()
	if g == nil || g.port != port || g.process != h.Process {
		return nil
	}
	select {
	case <-g.made:
	case <-ctx.Done():
		return nil
	}
	acceptedGroups.Lock()
	defer acceptedGroups.Unlock()
	return g.mux // nil if the making failed
}

// reserveAcceptedGroup gives a group being made an id of its own; the
// dialer's Hello h came from dialer.
func reserveAcceptedGroup(port uint16, h wire.Hello, dialer netip.Addr) uint64 {
	acceptedGroups.Lock()
	defer acceptedGroups.Unlock()
	if acceptedGroups.m == nil {
		acceptedGroups.m = map[uint64]*acceptedGroup{}
		acceptedGroups.byTCPPort = map[uint16][]*acceptedGroup{}
	}
	id := randomID()
	for acceptedGroups.m[id] != nil {
		id = randomID()
	}
	g := &acceptedGroup{port: port, process: h.Process, dialers: []netip.Addr{dialer}, made: make(chan struct{})}
	if h.Features&wire.FeatureGroupMove != 0 && h.TCPPort != 0 {
		g.tcpPort = h.TCPPort
		acceptedGroups.byTCPPort[g.tcpPort] = append(acceptedGroups.byTCPPort[g.tcpPort], g)
	}
	acceptedGroups.m[id] = g
	return id
}

// joinedFrom notes that a link of group id came from dialer.
func joinedFrom(id uint64, dialer netip.Addr) {
	acceptedGroups.Lock()
	defer acceptedGroups.Unlock()
	if g := acceptedGroups.m[id]; g != nil && !slices.Contains(g.dialers, dialer) && len(g.dialers) < maxGroupDialers {
		g.dialers = append(g.dialers, dialer)
	}
}

// maxGroupDialers bounds the addresses kept per group: a dialer has one
// per path.
const maxGroupDialers = 16

// setAcceptedGroup lists the group made for id until it ends; a nil m
// gives the id up.
func setAcceptedGroup(id uint64, m *group.Mux) {
	acceptedGroups.Lock()
	defer acceptedGroups.Unlock()
	g := acceptedGroups.m[id]
	g.mux = m
	close(g.made)
	if m == nil {
		dropAcceptedGroupLocked(id)
		return
	}
	go func() {
		<-m.Done()
		acceptedGroups.Lock()
		dropAcceptedGroupLocked(id)
		acceptedGroups.Unlock()
	}()
}

func dropAcceptedGroupLocked(id uint64) {
	g := acceptedGroups.m[id]
	if g == nil {
		return
	}
	delete(acceptedGroups.m, id)
	if g.tcpPort != 0 {
		if g.mux != nil { // its dialer had the group
			forgetEndedGroupsLocked(time.Now())
			if len(acceptedGroups.ended) == maxEndedGroups {
				acceptedGroups.ended = slices.Delete(acceptedGroups.ended, 0, 1)
			}
			acceptedGroups.ended = append(acceptedGroups.ended, endedGroup{g.tcpPort, g.dialers, time.Now()})
		}
		rest := slices.DeleteFunc(acceptedGroups.byTCPPort[g.tcpPort], func(x *acceptedGroup) bool { return x == g })
		if len(rest) == 0 {
			delete(acceptedGroups.byTCPPort, g.tcpPort)
		} else {
			acceptedGroups.byTCPPort[g.tcpPort] = rest
		}
	}
}

// forgetEndedGroupsLocked drops the ended groups older than
// endedGroupMemory.
func forgetEndedGroupsLocked(now time.Time) {
	n := 0
	for n < len(acceptedGroups.ended) && now.Sub(acceptedGroups.ended[n].at) > endedGroupMemory {
		n++
	}
	acceptedGroups.ended = slices.Delete(acceptedGroups.ended, 0, n)
}

// errUnknownGroup refuses a join of a group this process does not have.
var errUnknownGroup = errors.New("rdmanet: " + unknownGroupReason)

// acceptGroup accepts a request for a group's link: a new group, whose
// streams the peer opens come to the listener's Accept (serveGroup), or a
// link that joins a group (another path of its dialer's). It returns no
// connection of its own.
func (s *rdmaSide) acceptGroup(ctx context.Context, req *cm.Request, h wire.Hello) error {
	fail := func(l *rdmalink.Link, err error) error {
		req.ID.Reject(rejectReason(err))
		req.ID.Close()
		if l != nil {
			l.Discard()
		}
		return err
	}
	port := s.addr.Port()
	var joins *group.Mux
	if h.Group != 0 {
		if joins = findAcceptedGroup(ctx, h, port); joins == nil {
			req.ID.Reject([]byte(rejectPrefix + unknownGroupReason))
			req.ID.Close()
			return errUnknownGroup
		}
	}
	if err := acceptSetups.enter(ctx); err != nil {
		return fail(nil, err)
	}
	l, err := rdmalink.New(req.ID, groupLinkConfig(s.cfg))
	acceptSetups.leave()
	if err != nil {
		return fail(nil, peerMemoryError(err))
	}
	linkFeatures, err := chooseLinkFeatures(h, true, l, s.cfg.extensions())
	if err != nil {
		return fail(l, err)
	}
	agreed := h.Features&(groupOffer|groupStreamOffer|wire.FeatureGroupMove) | linkFeatures
	if joins != nil && agreed&wire.FeatureGroupMove == 0 {
		return fail(l, errUnknownGroup) // a group without moves has one link
	}
	id := h.Group
	if joins == nil {
		id = reserveAcceptedGroup(port, h, req.ID.RemoteAddr().Addr().Unmap())
	}
	accept := wire.Hello{Version: wire.HelloVersion, Features: agreed, RecvDepth: groupRecvDepth, RingSize: groupLinkRing,
		Process: processID(), Group: id}
	if joins == nil && h.TCPPort != 0 && agreed&wire.FeatureGroupMove != 0 && s.servesTCP {
		accept.TCPPort = port // the group's TCP link may come here
	}
	setGroupAckTimeout(req.ID)
	err = req.ID.Accept(ctx, acceptParam(accept.Encode()))
	if err == nil {
		if err = l.Established(agreed&(wire.LinkFeatures|wire.FeatureGroup), true); err != nil {
			req.ID.Disconnect()
		}
	}
	if err != nil {
		if joins == nil {
			setAcceptedGroup(id, nil)
		}
		req.ID.Close()
		l.Discard()
		return err
	}
	l.StartEvents()
	if joins != nil {
		if err := joins.AddLink(l); err != nil {
			l.Close()
			return err
		}
		joinedFrom(id, req.ID.RemoteAddr().Addr().Unmap())
		return nil
	}
	gc := groupConfig(s.cfg, cap(s.slots), agreed&wire.FeatureGroupMove != 0)
	gc.Features = agreed & groupStreamOffer
	if gc.MoveTimeout > 0 {
		// The dialer makes the links again, and may find the last one
		// dead up to 3 x KeepAlive after this side did (under load in
		// the lab, 8 s after): its 15 s count from then.
		gc.MoveTimeout += 3 * cmp.Or(max(s.cfg.KeepAlive, 0), defaultKeepAlive)
	}
	gc.Accepts = func(p uint16) bool { return p == port }
	var m *group.Mux
	made := make(chan struct{})
	remote := req.ID.RemoteAddr()
	gc.OnEnd = func(err error) {
		<-made
		groupEnded(sideAccepted, remote, err)
		m.Close()
	}
	m, err = group.New(l, gc)
	close(made)
	if err != nil {
		setAcceptedGroup(id, nil)
		l.Close()
		return err
	}
	setAcceptedGroup(id, m)
	registerGroup(m, sideAccepted, id, h.Process)
	s.wg.Add(1)
	go s.serveGroup(m)
	return nil
}

// serveGroup hands the streams a group's peer opens to Accept, as
// connections, until the listener closes; the group then takes no more
// and ends with its last stream.
func (s *rdmaSide) serveGroup(m *group.Mux) {
	defer s.wg.Done()
	defer m.Retire()
	for {
		st, err := m.Accept(s.ctx)
		if err != nil {
			return
		}
		select {
		case s.slots <- struct{}{}:
		case <-s.ctx.Done():
			st.Close()
			return
		}
		c, err := streamConn(st, s.cfg, true)
		if err != nil {
			<-s.slots
			s.handshakeFailures.Add(1)
			slog.Debug("rdmanet: a link group's stream could not be served; closed", "addr", s.addr, "err", err)
			continue
		}
		s.handshakes.Add(1)
		metrics.groupStreams[sideIndex(sideAccepted)].Add(1)
		s.ready <- c // never blocks: ready has room for every slot
	}
}
