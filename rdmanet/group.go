package rdmanet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/wire"
)

// Link groups (issue 25; docs/engine.md, "Link groups"): with
// Config.groups, the first dial to a listener makes one RDMA connection
// that carries every later connection to it as a stream (internal/group):
// a dial then costs one message and its answer, no rdma_cm exchange, no
// queue pair and no registration. The listener's Accept returns streams
// as it returns connections.
//
// Off by default until a group moves its streams when its link fails
// (issue 25's failover): today a group's link that fails ends its streams,
// as a plain connection's does. Not with sessions (Config.ResumeTimeout)
// or Config.ValkeyCompatible, which keep a queue pair per connection.

// groupOffer is what a group's link agrees on: rings, half-close, and
// credit for every message, granted from the link's pool of receives.
const groupOffer = wire.FeatureGroup | groupStreamFeatures

// groupStreamFeatures are what a group's streams speak: a connection's
// features, rings that grow included, with credit for every message.
const groupStreamFeatures = wire.FeatureRing | wire.FeatureShutdown | wire.FeatureGrow | wire.FeatureRecvCredit | wire.FeatureRecvGrant

// The link of a group: its own rings are not used (each stream has its
// own), its receives are the streams' pool.
const (
	groupRecvDepth    = 2048
	groupSendDepth    = 255
	groupControlDepth = 64
	groupLinkRing     = 4096
	// groupIdleClose is how long a dialer keeps a group with no stream.
	groupIdleClose = time.Minute
	// noGroupMemory is how long a listener that agreed on no group is
	// dialed without offering one.
	noGroupMemory = time.Minute
)

// groups reports whether connections with c are made as streams of link
// groups.
func (c Config) groups() bool {
	return c.groupsOn && !c.ValkeyCompatible && c.ResumeTimeout <= 0
}

func groupLinkConfig() rdmalink.Config {
	return rdmalink.Config{SendBuffer: groupLinkRing, RecvBuffer: groupLinkRing,
		SendDepth: groupSendDepth, RecvDepth: groupRecvDepth, ControlDepth: groupControlDepth}
}

// groupConfig sizes a group's streams for connections with cfg: their
// rings start as a connection's do (firstRings) and grow as theirs.
func groupConfig(cfg Config, backlog int) group.Config {
	gc := group.DefaultConfig()
	first := cfg.firstRings()
	gc.SendRing, gc.RecvRing = first.SendBuffer, first.RecvBuffer
	gc.SendDepth, gc.ControlDepth = groupSendDepth/4, controlSlots
	gc.Backlog = backlog
	return gc
}

// streamConn makes a connection over a group's stream. The stream of a
// group that moves its streams is resumable: its engine is suspended
// while the stream moves, and says what it received once moved.
func streamConn(s *group.Stream, cfg Config, server bool) (*Conn, error) {
	_, size, _ := s.PeerRing()
	features := groupStreamFeatures
	if s.Moves() {
		features |= wire.FeatureResume
	}
	peer := wire.Hello{Version: wire.HelloVersion, Features: features, RecvDepth: uint16(s.PeerGrant()), RingSize: size,
		// What the peer's transmit ring retains: no rdmanet ring is
		// smaller, so credit never comes too late for it.
		SendRing: minRing}
	c, err := newLinkConn(s, cfg, server, features, peer)
	if err != nil {
		s.Close()
		return nil, err
	}
	return c, nil
}

// groupKey names a dialer's group: the local address it dials from (the
// zero Addr: routing's choice) and the listener's address.
type groupKey struct {
	src netip.Addr
	dst netip.AddrPort
}

// dialGroups are the process's groups toward listeners.
type dialGroups struct {
	mu   sync.Mutex
	live map[groupKey]*dialGroup
	none map[netip.AddrPort]time.Time // listeners that agreed on no group, and when
}

// dialGroup is one group in the making or made.
type dialGroup struct {
	ready chan struct{} // closed once mux or err is set
	mux   *group.Mux
	err   error
}

var groups = dialGroups{live: map[groupKey]*dialGroup{}, none: map[netip.AddrPort]time.Time{}}

// errNoGroup: the listener agreed on no group; a plain connection is made.
var errNoGroup = errors.New("rdmanet: the listener makes no link groups")

// noGroupsReason is a listener's rejection of a group's link when it makes
// none (after rejectPrefix).
const noGroupsReason = "no link groups"

// get returns the group for k, and whether the caller makes it.
func (g *dialGroups) get(k groupKey) (*dialGroup, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if when, ok := g.none[k.dst]; ok {
		if time.Since(when) < noGroupMemory {
			return &dialGroup{err: errNoGroup}, false
		}
		delete(g.none, k.dst)
	}
	if dg := g.live[k]; dg != nil {
		return dg, false
	}
	dg := &dialGroup{ready: make(chan struct{})}
	g.live[k] = dg
	return dg, true
}

// drop forgets a group that failed or ended, if it is still k's.
func (g *dialGroups) drop(k groupKey, dg *dialGroup) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.live[k] == dg {
		delete(g.live, k)
	}
}

func (g *dialGroups) noGroup(dst netip.AddrPort) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.none) >= maxNoGroup {
		clear(g.none) // bounded: forgetting only costs a refused offer
	}
	g.none[dst] = time.Now()
}

// maxNoGroup bounds the listeners remembered to make no groups.
const maxNoGroup = 1024

// dialStream dials as a stream of the group with dst, making the group if
// there is none. ok is false when a plain connection is to be made
// instead: the listener makes no groups, or its group cannot take another
// stream, or the group's link could not be made for a reason a plain
// connection may not meet.
func dialStream(ctx context.Context, src netip.Addr, dst netip.AddrPort, cfg Config, answerWait time.Duration) (c *Conn, ok bool, err error) {
	k := groupKey{src, dst}
	for attempt := 0; attempt < 2; attempt++ {
		dg, maker := groups.get(k)
		if maker {
			dg.mux, dg.err = dialGroupLink(ctx, src, dst, cfg, answerWait, func(err error) {
				// The peer closed the group, or its link failed: the
				// next dial makes another.
				groupEnded(sideDialed, dst, err)
				groups.drop(k, dg)
				<-dg.ready
				dg.mux.Close()
			})
			close(dg.ready)
			if dg.err != nil {
				groups.drop(k, dg)
			}
		} else if dg.ready != nil {
			select {
			case <-dg.ready:
			case <-ctx.Done():
				return nil, true, ctx.Err()
			}
		}
		switch {
		case errors.Is(dg.err, errNoGroup):
			return nil, false, nil
		case dg.err != nil && (errors.Is(dg.err, errNoAnswer) || errors.Is(dg.err, errNoBusyAnswer) || ctx.Err() != nil):
			// The peer did not answer: a plain connection would wait in vain too.
			return nil, true, dg.err
		case dg.err != nil:
			slog.Debug("rdmanet: no link group; a connection of its own", "addr", dst, "err", dg.err)
			return nil, false, nil
		}
		s, err := dg.mux.Open(ctx, dst.Port())
		var refused *group.RefusedError
		switch {
		case err == nil:
			c, err := streamConn(s, cfg, false)
			if err == nil {
				metrics.groupStreams[sideIndex(sideDialed)].Add(1)
			}
			return c, true, err
		case errors.Is(err, group.ErrDown) || errors.Is(err, wire.ErrProtocol) || errors.Is(err, group.ErrClosed):
			// The group's link ended (or it closed, idle): a new one, once.
			groups.drop(k, dg)
			dg.mux.Close()
			continue
		case errors.As(err, &refused) && refused.Reason == wire.ReasonNoListener:
			return nil, true, fmt.Errorf("rdmanet: %w", err)
		case errors.Is(err, group.ErrLimit) || errors.As(err, &refused):
			return nil, false, nil // full: a connection of its own
		default:
			return nil, true, err
		}
	}
	return nil, false, nil
}

// dialGroupLink makes the link of a group with dst: an rdma_cm connection
// whose Hello offers a group. A listener that does not agree is
// remembered for noGroupMemory, and errNoGroup returned.
func dialGroupLink(ctx context.Context, src netip.Addr, dst netip.AddrPort, cfg Config, answerWait time.Duration, onEnd func(error)) (_ *group.Mux, err error) {
	if err := cm.Available(); err != nil {
		return nil, err
	}
	id, err := cm.NewID()
	if err != nil {
		return nil, err
	}
	var l *rdmalink.Link
	defer func() {
		if err != nil && id != nil {
			id.Close()
			if l != nil {
				l.Discard()
			}
		}
	}()
	if err := id.Resolve(ctx, src, dst); err != nil {
		return nil, err
	}
	if err := dialSetups.enter(ctx); err != nil {
		return nil, err
	}
	l, err = rdmalink.New(id, groupLinkConfig())
	dialSetups.leave()
	if err != nil {
		l = nil
		return nil, peerMemoryError(err)
	}
	hello := wire.Hello{Version: wire.HelloVersion, Features: groupOffer | wire.LinkFeatures,
		RecvDepth: groupRecvDepth, RingSize: groupLinkRing, Needs: l.Needs()}
	peer, err := connectAnswered(ctx, id, dst, hello.Encode(), answerWait)
	if err != nil {
		var refused *ServerRefusedError
		if errors.As(err, &refused) && refused.Reason == noGroupsReason {
			groups.noGroup(dst)
			return nil, errNoGroup
		}
		return nil, err
	}
	h, ok, err := wire.DecodeHello(peer.PrivateData)
	if err != nil {
		id.Disconnect()
		return nil, err
	}
	agreed := h.Features & hello.Features
	if !ok || agreed&groupOffer != groupOffer {
		// A listener without groups answered as for a connection of its
		// own: this link is not one, and the dial makes one.
		id.Disconnect()
		groups.noGroup(dst)
		return nil, errNoGroup
	}
	if err := checkLinkAnswer(agreed&wire.LinkFeatures, ok, l); err != nil {
		id.Disconnect()
		return nil, err
	}
	if err := l.Established(agreed&(wire.LinkFeatures|wire.FeatureGroup), false); err != nil {
		id.Disconnect()
		return nil, err
	}
	l.StartEvents()
	gc := groupConfig(cfg, 0)
	gc.OnEnd, gc.IdleClose = onEnd, groupIdleClose
	m, err := group.New(l, gc)
	if err != nil {
		l.Close()
		id = nil // closed with the link
		return nil, err
	}
	registerGroup(m, sideDialed)
	return m, nil
}

// groupEnded logs a group that ended other than by Close: at Info when
// its peer closed it (the link was disconnected), at Warn when it failed.
func groupEnded(side string, peer netip.AddrPort, err error) {
	if group.Disconnected(err) || errors.Is(err, group.ErrClosed) {
		slog.Info("rdmanet: link group closed by its peer", "side", side, "peer", peer, "err", err)
		return
	}
	slog.Warn("rdmanet: link group failed; its connections end with it", "side", side, "peer", peer, "err", err)
}

// acceptGroup accepts a request for a group's link: the streams the peer
// opens in it come to the listener's Accept (serveGroup). It returns no
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
	if err := acceptSetups.enter(ctx); err != nil {
		return fail(nil, err)
	}
	l, err := rdmalink.New(req.ID, groupLinkConfig())
	acceptSetups.leave()
	if err != nil {
		return fail(nil, peerMemoryError(err))
	}
	linkFeatures, err := chooseLinkFeatures(h, true, l, s.cfg.extensions())
	if err != nil {
		return fail(l, err)
	}
	agreed := h.Features&groupOffer | linkFeatures
	accept := wire.Hello{Version: wire.HelloVersion, Features: agreed, RecvDepth: groupRecvDepth, RingSize: groupLinkRing}
	if err := req.ID.Accept(ctx, acceptParam(accept.Encode())); err != nil {
		req.ID.Close()
		l.Discard()
		return err
	}
	if err := l.Established(agreed&(wire.LinkFeatures|wire.FeatureGroup), true); err != nil {
		req.ID.Disconnect()
		req.ID.Close()
		l.Discard()
		return err
	}
	l.StartEvents()
	gc := groupConfig(s.cfg, cap(s.slots))
	port := s.addr.Port()
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
		l.Close()
		return err
	}
	registerGroup(m, sideAccepted)
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
			continue
		}
		s.handshakes.Add(1)
		metrics.groupStreams[sideIndex(sideAccepted)].Add(1)
		s.ready <- c // never blocks: ready has room for every slot
	}
}
