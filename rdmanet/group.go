package rdmanet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/wire"
)

// Link groups (issue 25; docs/engine.md, "Link groups"): with
// Config.groups, the first dial to a listener makes a group: an RDMA
// connection that carries every later connection to it as a stream
// (internal/group), and one more to each of the listener's other
// addresses the dialer knows (Dialer.FailoverAddrs), between which the
// streams move when one fails (group_paths.go). A dial then costs one
// message and its answer, no rdma_cm exchange, no queue pair and no
// registration. The listener's Accept returns streams as it returns
// connections (group_accept.go).
//
// On by default (Config.NoLinkGroups turns them off). Not with sessions
// (Config.ResumeTimeout), Config.ValkeyCompatible, BusyPoll or
// FixedRings, which keep a queue pair per connection: a session resumes
// on its own, a busy-polling connection polls its own completion queue,
// and fixed rings are a connection's own memory.

// GroupMoveError ends a connection that is a link group's stream when no
// link of its group took it within 15 s after its own failed (a
// partition: every path silent), or when the peer refused its move. Its
// Timeout() is true for the first.
type GroupMoveError struct {
	Cause   error         // what broke the link it was on
	Waited  time.Duration // how long it waited for another
	Refused bool          // the peer refused the move
}

func (e *GroupMoveError) Error() string {
	if e.Refused {
		return fmt.Sprintf("rdmanet: the peer refused to move the connection to another link of its group after %v", e.Cause)
	}
	return fmt.Sprintf("rdmanet: no link of the connection's group took it in %v after %v", e.Waited.Round(time.Millisecond), e.Cause)
}

func (e *GroupMoveError) Unwrap() error { return e.Cause }

// Timeout reports whether the stream ran out of time (not refused).
func (e *GroupMoveError) Timeout() bool { return !e.Refused }

// groupEndError is the error a group's stream ends with (link.Ended):
// a failed move as a *GroupMoveError, anything else as it is.
func groupEndError(err error) error {
	var me *group.MoveError
	if errors.As(err, &me) {
		return &GroupMoveError{Cause: me.Cause, Waited: me.Waited, Refused: me.Reason != 0}
	}
	return err
}

// groupOffer is what a group's link agrees on: rings, half-close, and
// credit for every message, granted from the link's pool of receives.
const groupOffer = wire.FeatureGroup | groupStreamFeatures

// groupStreamFeatures are what a group's streams speak: a connection's
// features, rings that grow included, with credit for every message.
const groupStreamFeatures = wire.FeatureRing | wire.FeatureShutdown | wire.FeatureGrow | wire.FeatureRecvCredit | wire.FeatureRecvGrant

// groupStreamOffer are what a group's link offers for its streams beyond
// groupStreamFeatures, which a peer may not have: its streams have them
// only if the peer agreed (group.Config.Features).
const groupStreamOffer = wire.FeatureRetain | wire.FeatureEndAt | wire.FeatureOpenRing

// The link of a group: its own rings are not used (each stream has its
// own), its receives are the streams' pool.
const (
	// groupRecvDepth: a group that moves its streams keeps, on each link,
	// every stream's first grant (8), so that any link can take them all:
	// a thousand streams a group hold half its receives, and credit for
	// those that stream comes from the rest. 1 MiB of receive slots a
	// link. Not 8,192: siw's rdma_create_qp fails with EIO for it (one of
	// the depths docs/engine.md's open finding names). 16,128 and not
	// 16,384: with the send depth's 255 the link needs 16,383 completion
	// entries, and rxe rounds a queue of n up to the power of two above
	// n, so 16,384 receives took a receive queue of 32,768 and a
	// completion queue of 32,768, twice the memory and set-up time (the
	// largest costs of a group's first dial in the lab, at both ends).
	groupRecvDepth = 16384 - groupSendDepth - 1
	// groupPostFirst: the receives a group's link posts before connect or
	// accept; the rest follow once it is established (rdmalink's
	// PostFirst), so that a listener answers without posting 16,128 first.
	// Before the group exists the peer sends its group's requests
	// (2 x 32) at most.
	groupPostFirst    = 1024
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
	return !c.NoLinkGroups && !c.ValkeyCompatible && c.ResumeTimeout <= 0 && c.BusyPoll <= 0 && !c.FixedRings && !c.sharedRecv
}

// groupLinkConfig is a group's link for connections with c: its streams'
// rings come from the pools of c's peer bound (Config.PeerMemory), as
// connections of their own do.
func groupLinkConfig(c Config) rdmalink.Config {
	return rdmalink.Config{SendBuffer: groupLinkRing, RecvBuffer: groupLinkRing,
		SendDepth: groupSendDepth, RecvDepth: groupRecvDepth, PostFirst: groupPostFirst, ControlDepth: groupControlDepth,
		Needs: c.linkNeeds, PeerBound: int64(c.PeerMemory)}
}

// groupMoveTimeout bounds a group's stream's wait for a link after the
// one it was on failed (group.Config.MoveTimeout): the time a partition
// may last before the group's connections fail (docs/engine.md).
const groupMoveTimeout = 15 * time.Second

// groupOpenPoll is how long a dial into a group polls for the peer's
// answer to its StreamOpen under adaptive polling (group.Config.OpenPoll):
// as long as a stream's wait polls (connfd's maxAdaptiveSpin).
const groupOpenPoll = 2 * time.Millisecond

// groupConfig sizes a group's streams for connections with cfg: their
// rings start as a connection's do (firstRings) and grow as theirs, also
// in a group that moves its streams (moves), whose streams are resumable.
func groupConfig(cfg Config, backlog int, moves bool) group.Config {
	gc := group.DefaultConfig()
	first := cfg.firstRings()
	gc.SendRing, gc.RecvRing = first.SendBuffer, first.RecvBuffer
	gc.SendDepth, gc.ControlDepth = groupSendDepth/4, controlSlots
	gc.Backlog = backlog
	gc.Spread = group.SpreadLeastStreams
	if cfg.GroupSpread == SpreadFirstLink {
		gc.Spread = group.SpreadFirstLink
	}
	gc.OnMove = func(k group.MoveKind) { metrics.groupMoves[k].Add(1) }
	if cfg.BusyPoll == 0 {
		gc.OpenPoll = groupOpenPoll
	}
	if moves {
		gc.MoveTimeout = groupMoveTimeout
		// A dialer whose links all ended with a disconnect (its process
		// died, say) comes back at once if it will: it makes a link again
		// the moment one fails, over TCP first when it has no RDMA link
		// (milliseconds). KeepAlive, not a session's KeepAlive + 3 s
		// (peerLeftWait), so that the streams of a dialer that died end
		// within 3 x KeepAlive with a kernel that is slow to disconnect
		// (under the race detector in the lab, seconds).
		gc.PeerLeftWait = cfg.KeepAlive
		if gc.PeerLeftWait <= 0 {
			gc.PeerLeftWait = defaultKeepAlive // keepalive off: the default's wait
		}
	}
	return gc
}

// streamConn makes a connection over a group's stream. The stream of a
// group that moves its streams is resumable: its engine is suspended
// while the stream moves, and says what it received once moved.
func streamConn(s *group.Stream, cfg Config, server bool) (*Conn, error) {
	_, size, _ := s.PeerRing()
	features := groupStreamFeatures | s.Features()&groupStreamOffer
	if s.Moves() {
		features |= wire.FeatureResume
	}
	peer := wire.Hello{Version: wire.HelloVersion, Features: features, RecvDepth: uint16(s.PeerGrant()), RingSize: size,
		// What the peer's transmit ring retains at first: no rdmanet
		// ring is smaller, so credit never comes too late for it. With
		// Retain agreed, the peer says so as its ring grows.
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
	paths *groupPaths // the paths its links run on (group_paths.go)
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
// there is none: its first link to dst, and one to each of alts (the
// server's other addresses) once the server agreed to move streams
// between links. ok is false when a plain connection is to be made
// instead: the listener makes no groups, or its group cannot take another
// stream, or the group's link could not be made for a reason a plain
// connection may not meet.
func dialStream(ctx context.Context, src netip.Addr, dst netip.AddrPort, alts []netip.AddrPort, cfg Config, answerWait time.Duration) (c *Conn, ok bool, err error) {
	k := groupKey{src, dst}
	for attempt := 0; attempt < 2; attempt++ {
		dg, maker := groups.get(k)
		if maker {
			dg.paths = newGroupPaths(src, dst, alts, cfg)
			dg.mux, dg.err = dg.paths.dialFirst(ctx, answerWait, func(err error) {
				// The peer closed the group, or its links failed: the
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
		s, err := openStream(ctx, dg.mux, dst.Port())
		var refused *group.RefusedError
		switch {
		case err == nil:
			c, err := streamConn(s, cfg, false)
			if err == nil {
				metrics.groupStreams[sideIndex(sideDialed)].Add(1)
			}
			return c, true, err
		case errors.Is(err, group.ErrOpenLost):
			// Its links kept failing under the opens; the group may
			// live on for the streams it has.
			slog.Debug("rdmanet: opens in the link group lost with their links; a connection of its own", "addr", dst, "err", err)
			return nil, false, nil
		case errors.Is(err, group.ErrDown) || errors.Is(err, wire.ErrProtocol) || errors.Is(err, group.ErrClosed):
			// The group's links ended (or it closed, idle): a new one, once.
			groups.drop(k, dg)
			dg.mux.Close()
			continue
		case errors.As(err, &refused) && refused.Reason == wire.ReasonNoListener:
			return nil, true, fmt.Errorf("rdmanet: %w", err)
		case errors.Is(err, group.ErrLimit) || errors.As(err, &refused):
			slog.Debug("rdmanet: the link group took no stream; a connection of its own", "addr", dst, "err", err)
			return nil, false, nil // full: a connection of its own
		default:
			return nil, true, err
		}
	}
	return nil, false, nil
}

// openStream opens a stream to port in mux. A stream the listener refused
// because its accept queue was full is asked for again after each of
// backlogBackoff's waits, as a TCP dialer sends its SYN again when a
// listener's queue is full: the listener accepts slower than streams
// come, and a connection of its own would wait in a queue too, with a
// queue pair at both ends. Past them the refusal is the error.
//
// An open whose link failed before the answer (group.ErrOpenLost) is made
// again at once, on a link that works, up to openLostRetries times: one
// path's failure must not end a group whose other paths carry streams.
// Once no link works, Open says so (group.ErrDown), and the caller makes
// a new group.
func openStream(ctx context.Context, mux *group.Mux, port uint16) (*group.Stream, error) {
	for i, lost := 0, 0; ; {
		s, err := mux.Open(ctx, port)
		var refused *group.RefusedError
		switch {
		case errors.Is(err, group.ErrOpenLost) && lost < openLostRetries:
			lost++
		case err == nil || !errors.As(err, &refused) || refused.Reason != wire.ReasonBacklog || i == len(backlogBackoff):
			return s, err
		default:
			if !pause(ctx, backlogBackoff[i]) {
				return nil, ctx.Err()
			}
			i++
		}
	}
}

// openLostRetries bounds the opens of one dial lost with their link: each
// takes a link down with it, and a group has one link per path.
const openLostRetries = 4

// backlogBackoff: 1.55 s in all, about as long as a TCP dialer waits
// before its first SYN is sent again.
var backlogBackoff = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}

// errListenerGone ends a dialer's group whose links all ended and whose
// listener's host refuses new ones: the listener closed, or its process
// ended.
var errListenerGone = errors.New("nothing listens there any more")

// errGroupGone ends a dialer's group whose server refused a join as an
// unknown group: the server's group ended (its listener closed, or its
// last link failed long enough).
var errGroupGone = errors.New("the server no longer has the group")

// groupEnded logs a group that ended other than by Close: at Info when
// its peer closed it (the link was disconnected, its listener is gone, or
// its group ended), at Warn when it failed.
func groupEnded(side string, peer netip.AddrPort, err error) {
	if group.Disconnected(err) || errors.Is(err, group.ErrClosed) || errors.Is(err, errListenerGone) || errors.Is(err, errGroupGone) {
		slog.Info("rdmanet: link group closed by its peer", "side", side, "peer", peer, "err", err)
		return
	}
	slog.Warn("rdmanet: link group failed; its connections end with it", "side", side, "peer", peer, "err", err)
}
