package rdmanet

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/wire"
)

// A dialer's group has a link per path to the server (issue 25): the
// address it dialed, and each of Dialer.FailoverAddrs from a local RDMA
// address on the same subnet (as a session's resume paths). The first
// link makes the group; the server's accept names the group and the
// server's process, and the other links present the group to join it
// (wire.Hello's Group) and must reach the same process. A link that
// fails is made again on its path, at once and then with backoff, for as
// long as the group lives; the group moves the failed link's streams to
// the links that work meanwhile (internal/group, MoveTimeout).

// processID names this process in its groups' Hellos: random, non-zero.
var processID = sync.OnceValue(randomID)

// randomID is 64 random bits, never 0.
func randomID() uint64 {
	for {
		var b [8]byte
		rand.Read(b[:])
		if id := binary.BigEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

// errUnknownGroup is a join's refusal by a server that has no such group
// (after rejectPrefix): it ended there, or the server restarted.
const unknownGroupReason = "unknown link group"

// Backoff between tries to make a path's link again.
const (
	pathRetryFirst = 100 * time.Millisecond
	pathRetryMost  = 5 * time.Second
	// pathDialTimeout bounds one try: a path whose port is down may
	// never answer.
	pathDialTimeout = 3 * time.Second
)

// groupPaths are a dialer's group's paths and the links on them.
type groupPaths struct {
	cfg   Config
	paths []*groupPath

	mu      sync.Mutex
	mux     *group.Mux
	id      uint64 // the group's, from the server's accept
	process uint64 // the server's
	wake    chan struct{}

	// The last path (group_tcp.go): the TCP port the group keeps (nil:
	// none, the group has RDMA paths only), its link while it has one,
	// and the tries to make it.
	tcpPort *tcpPortReservation
	tcpSrc  netip.Addr // the first link's local address
	tcp     link.Carrier
	tcpTry  linkTries
}

// groupPath is one pair of local and remote addresses.
type groupPath struct {
	src  netip.Addr // zero: routing's choice
	dst  netip.AddrPort
	link link.Carrier // the link on it now; nil while it has none
	linkTries
}

// linkTries are the tries to make a path's link (or the TCP link) again.
type linkTries struct {
	tries   int       // failed tries since it last had one
	err     error     // the last try's
	trying  bool      // a try runs
	retryAt time.Time // the next try's, after a failed one
}

func (p *groupPath) String() string {
	if p.src.IsValid() {
		return "rdma " + p.src.String() + " -> " + p.dst.String()
	}
	return "rdma -> " + p.dst.String()
}

func newGroupPaths(src netip.Addr, dst netip.AddrPort, alts []netip.AddrPort, cfg Config) *groupPaths {
	g := &groupPaths{cfg: cfg, paths: []*groupPath{{src: src, dst: dst}}, wake: make(chan struct{}, 1)}
	for _, a := range alts {
		if a != dst {
			g.paths = append(g.paths, &groupPath{src: sameSubnetRDMAAddr(a.Addr()), dst: a})
		}
	}
	return g
}

// dialFirst makes the group with its first link, on the first path, and
// starts making the others once the server agreed to move streams.
func (g *groupPaths) dialFirst(ctx context.Context, answerWait time.Duration, onEnd func(error)) (*group.Mux, error) {
	p := g.paths[0]
	var err error
	if g.tcpPort, err = reserveTCPPort(p.dst.Addr()); err != nil {
		slog.Debug("rdmanet: no TCP port for a link group: its links are RDMA only", "err", err)
	}
	var tcpPort uint16
	if g.tcpPort != nil {
		tcpPort = g.tcpPort.port
	}
	l, h, err := dialGroupLink(ctx, g.cfg, p.src, p.dst, answerWait, 0, tcpPort)
	if err != nil {
		g.tcpPort.close()
		return nil, err
	}
	moves := h.Features&wire.FeatureGroupMove != 0
	if !moves || h.TCPPort == 0 {
		// The listener takes no TCP on its port (an "rdma" listener): the
		// group's paths are RDMA only, and a refused TCP connection would
		// say nothing of the listener's process.
		g.tcpPort.close()
		g.tcpPort = nil
	}
	gc := groupConfig(g.cfg, 0, moves)
	gc.Features = h.Features & groupStreamOffer
	gc.OnEnd, gc.IdleClose, gc.Mover = onEnd, groupIdleClose, true
	gc.OnLinkDown = g.linkDown
	m, err := group.New(l, gc)
	if err != nil {
		g.tcpPort.close()
		l.Close()
		return nil, err
	}
	local, _ := l.Addrs()
	g.mu.Lock()
	g.mux, g.id, g.process, p.link = m, h.Group, h.Process, l
	g.tcpSrc = local.Addr()
	g.mu.Unlock()
	registerGroup(m, sideDialed, h.Group, h.Process)
	if moves {
		go g.keep()
	}
	return m, nil
}

// linkDown is the group's OnLinkDown: the path of base has no link now.
func (g *groupPaths) linkDown(base link.Carrier, err error) {
	g.mu.Lock()
	if base == g.tcp {
		g.tcp = nil
		slog.Info("rdmanet: a link group's TCP link ended", "path", base.Caps().Name, "err", err)
	}
	for _, p := range g.paths {
		if p.link == base {
			p.link, p.err = nil, err
			slog.Info("rdmanet: a link of a group failed; its connections move to the others", "path", p, "err", err)
		}
	}
	g.mu.Unlock()
	g.poke()
}

// keep makes a link on each path that has none, until the group ends:
// at once, then with backoff. Each path's try, and the TCP link's, runs
// on its own: a try on a path whose port is down waits out
// pathDialTimeout (longer while rdma_cm resolves), and must not hold
// back the TCP link that the streams need once the last RDMA link failed
// (under load in the lab, the two links were found dead 7 s apart).
func (g *groupPaths) keep() {
	done := g.mux.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var tries sync.WaitGroup
	defer g.tcpPort.close()
	defer tries.Wait() // a TCP try dials from the port
	for {
		select {
		case <-done:
			return
		case <-g.wake:
		case <-timer.C:
		}
		if next := g.tryPaths(done, &tries); next > 0 {
			timer.Reset(next)
		}
	}
}

// tryPaths starts a try on each path that has no link, none running and
// its backoff over, and on the TCP link when no RDMA link is left; it
// returns when to look again (0: when a try ends, which wakes keep).
func (g *groupPaths) tryPaths(done <-chan struct{}, tries *sync.WaitGroup) time.Duration {
	now := time.Now()
	var next time.Duration
	due := func(at time.Time) bool {
		if wait := at.Sub(now); wait > 0 {
			if next == 0 || wait < next {
				next = wait
			}
			return false
		}
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	// With no RDMA link, TCP too: the streams wait for a link meanwhile.
	// They move back once an RDMA link is up again.
	if g.tcpPort != nil && g.tcp == nil && !g.tcpTry.trying && g.noRDMALinkLocked() && due(g.tcpTry.retryAt) {
		g.tryLocked(&g.tcpTry, tries, func() error { return g.joinTCP(done) }, "rdmanet: a link group has no TCP link")
	}
	for _, p := range g.paths {
		if p.link != nil || p.trying || !due(p.retryAt) {
			continue
		}
		g.tryLocked(&p.linkTries, tries, func() error { return g.join(p, done) }, "rdmanet: a path of a link group has no link", "path", p)
	}
	return next
}

// tryLocked runs try on a goroutine of its own (tries counts it) and
// keeps its outcome in t: a failure is logged with msg and args, and
// backs off. g.mu is held.
func (g *groupPaths) tryLocked(t *linkTries, tries *sync.WaitGroup, try func() error, msg string, args ...any) {
	t.trying = true
	tries.Add(1)
	go func() {
		defer tries.Done()
		err := try()
		g.mu.Lock()
		t.trying, t.err = false, err
		if err == nil {
			t.tries = 0
		} else {
			t.tries++
			t.retryAt = time.Now().Add(retryWait(t.tries))
		}
		failed := t.tries
		g.mu.Unlock()
		if err != nil {
			slog.Debug(msg, append(args, "tries", failed, "err", err)...)
		}
		g.poke()
	}()
}

// retryWait is the backoff after tries failed tries.
func retryWait(tries int) time.Duration {
	return min(pathRetryFirst<<min(tries-1, 10), pathRetryMost)
}

// poke wakes keep to look at the paths again.
func (g *groupPaths) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// joinContext bounds one try to make a link of the group: pathDialTimeout,
// or the group's end (done).
func joinContext(done <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), pathDialTimeout)
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// name is the group's id and the server's process, which a join presents
// and checks.
func (g *groupPaths) name() (id, process uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.id, g.process
}

// join makes a link on p that joins the group.
func (g *groupPaths) join(p *groupPath, done <-chan struct{}) error {
	ctx, cancel := joinContext(done)
	defer cancel()
	id, process := g.name()
	l, h, err := dialGroupLink(ctx, g.cfg, p.src, p.dst, 0, id, 0)
	if err != nil {
		var refused *ServerRefusedError
		switch {
		case errors.As(err, &refused) && refused.Reason == unknownGroupReason && g.mux.Stats().Links == 0:
			// The server's group ended (its last link failed long enough,
			// or the server restarted): so does this one, at once. While
			// a link of the group works, the server has it: the path
			// reached another process at the port, or an older server
			// that refused a join of a group it was still making; the
			// path is tried again later, as for any failure.
			g.mux.End(fmt.Errorf("%w: %w (%s)", group.ErrDown, errGroupGone, p))
		case nothingListens(err) && g.mux.Stats().Links == 0:
			// The server's process is gone: its streams cannot move.
			g.mux.End(fmt.Errorf("%w: %w at %s: %w", group.ErrDown, errListenerGone, p.dst, err))
		}
		return err
	}
	if h.Process != process || h.Group != id || h.Features&wire.FeatureGroupMove == 0 {
		l.Close()
		return fmt.Errorf("rdmanet: %s reaches another process than the group's first link", p)
	}
	if err := g.mux.AddLink(l); err != nil {
		l.Close()
		return err
	}
	g.mu.Lock()
	p.link = l
	g.mu.Unlock()
	slog.Info("rdmanet: a link of a group is up", "path", p)
	return nil
}

// setGroupAckTimeout gives a group link's queue pair groupAckTimeout (on
// iWARP it changes nothing: retransmission is TCP's there).
func setGroupAckTimeout(id *cm.ID) {
	if err := id.SetAckTimeout(groupAckTimeout); err != nil {
		slog.Debug("rdmanet: a group link keeps rdma_cm's ACK timeout", "err", err)
	}
}

// dialGroupLink makes a link of a group with dst: an rdma_cm connection
// whose Hello offers a group (id 0: a new one, whose TCP link may come
// from tcpPort) and moves between its links. A listener that does not make groups is remembered for
// noGroupMemory, and errNoGroup returned.
func dialGroupLink(ctx context.Context, cfg Config, src netip.Addr, dst netip.AddrPort, answerWait time.Duration, id uint64, tcpPort uint16) (_ *rdmalink.Link, _ wire.Hello, err error) {
	if err := cm.Available(); err != nil {
		return nil, wire.Hello{}, err
	}
	cid, err := cm.NewID()
	if err != nil {
		return nil, wire.Hello{}, err
	}
	setupStart := time.Now()
	var l *rdmalink.Link
	defer func() {
		if err != nil && cid != nil {
			cid.Close()
			if l != nil {
				l.Discard()
			}
		}
	}()
	if err := cid.Resolve(ctx, src, dst); err != nil {
		return nil, wire.Hello{}, err
	}
	if err := dialSetups.enter(ctx); err != nil {
		return nil, wire.Hello{}, err
	}
	l, err = rdmalink.New(cid, groupLinkConfig(cfg))
	dialSetups.leave()
	if err != nil {
		l = nil
		return nil, wire.Hello{}, peerMemoryError(err)
	}
	hello := wire.Hello{Version: wire.HelloVersion, Features: groupOffer | groupStreamOffer | wire.FeatureGroupMove | wire.LinkFeatures,
		RecvDepth: groupRecvDepth, RingSize: groupLinkRing, Needs: l.Needs(), Process: processID(), Group: id, TCPPort: tcpPort}
	setGroupAckTimeout(cid)
	peer, err := connectAnswered(ctx, cid, dst, hello.Encode(), answerWait, time.Since(setupStart))
	if err != nil {
		var refused *ServerRefusedError
		switch {
		case errors.As(err, &refused) && refused.Reason == noGroupsReason:
			groups.noGroup(dst)
			return nil, wire.Hello{}, errNoGroup
		case watchUnanswered(err, dst, cid, l.Discard):
			// As a plain dial's: a late answer shows the peer answers
			// RDMA, so the next dials there wait for a busy peer rather
			// than fall back for the failure memory's TTL.
			cid, l = nil, nil // the watch owns them now
		}
		return nil, wire.Hello{}, err
	}
	h, ok, err := wire.DecodeHello(peer.PrivateData)
	if err != nil {
		cid.Disconnect()
		return nil, wire.Hello{}, err
	}
	agreed := h.Features & hello.Features
	if !ok || agreed&groupOffer != groupOffer {
		// A listener without groups answered as for a connection of its
		// own: this link is not one, and the dial makes one.
		cid.Disconnect()
		groups.noGroup(dst)
		return nil, wire.Hello{}, errNoGroup
	}
	if err := checkLinkAnswer(agreed&wire.LinkFeatures, ok, l); err != nil {
		cid.Disconnect()
		return nil, wire.Hello{}, err
	}
	if err := l.Established(agreed&(wire.LinkFeatures|wire.FeatureGroup), false); err != nil {
		cid.Disconnect()
		return nil, wire.Hello{}, err
	}
	l.StartEvents()
	h.Features = agreed
	return l, h, nil
}
