package rdmanet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// Resumable sessions (wire.FeatureResume, docs/protocol.md). Between two
// rdmanet peers a connection is a session that outlives the link it runs
// on: when the link fails in a way another link may cure (link.ErrDown: a
// dead path, a port or device gone, an address change), the engine
// suspends the stream instead of failing it. The connection's link becomes
// the session's lostLink, on which pollers sleep until a new link comes or
// the session ends; the old link is closed once nobody waits on it, and
// only then is a new one made over the same rings (the old one may not
// write into them any more). The dialing side makes the new link
// (resumeDialer); the listening side waits for it (resumeFrom), for at most
// Config.ResumeTimeout each.

// resumePath is one way to the session's server that the dialing side
// tries, in order: other RDMA paths first, TCP last. dial makes a new link
// over the session's rings with h in its request, and returns it with the
// server's Hello; an error matching ErrSessionRefused ends the session.
type resumePath struct {
	name string
	tcp  bool
	dial func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error)
}

// resumeOrder is the order in which a dialer whose link on paths[failed]
// broke tries its paths: the other RDMA paths first, starting with the
// next one (failback brings the session back to the first path once it
// works), then the broken one, then TCP. A path found dead (silent for 2 x
// KeepAlive) goes after TCP instead: trying it again at once would cost a
// whole answer wait (resumeAnswerWait) for nothing, while a queue-pair
// error may have been passing, and RDMA is not given up for that.
func resumeOrder(paths []resumePath, failed int, dead bool) []int {
	var rdma, tcp []int
	broken := -1
	for k := range paths {
		i := (failed + 1 + k) % len(paths)
		if paths[failed].tcp {
			i = k // off TCP: the RDMA paths in their order
		}
		switch {
		case paths[i].tcp:
			tcp = append(tcp, i)
		case i == failed && dead:
			broken = i
		default:
			rdma = append(rdma, i)
		}
	}
	order := append(rdma, tcp...)
	if broken >= 0 {
		order = append(order, broken)
	}
	return order
}

// session is a resumable connection's state beyond its engine; Conn.mu
// guards it.
type session struct {
	id wire.SessionID
	// gen is the generation the session is at: the one the dialer names
	// in a resume. The server gives out gen+1 in its accept and moves to
	// it when the dialer's first message arrives on the new link (next).
	gen, next uint32
	// unconfirmed: the server's link is a resumed one on which the
	// dialer's first message has not come yet (that message moves the
	// session to next).
	unconfirmed bool
	tx, rx      []byte // the rings, which every link of the session uses
	lost        *lostLink
	paths       []resumePath  // the dialer's; nil on the server
	table       *sessionTable // the server's
	timeout     time.Duration

	state   sessionState  // session_state.go
	retired chan struct{} // closed when the lost link was closed (nil when none is)
	// knocked: a resume of the session was asked for since it last lost
	// its link (the server's side).
	knocked   bool
	failovers int         // links replaced
	path      string      // the current link's path, for errors and logs
	why       error       // what broke the link before the current one
	left      SessionMove // why and from what the session left its last link (To unset)
	lostAt    time.Time   // when it did
	lastMove  SessionMoveEvent
	cancel    context.CancelFunc

	// The dialer's path now (an index into paths), and moving back to
	// the first one (failback.go).
	pathIndex     int
	failbacks     int
	failbackWait  time.Duration
	failbackTimer *time.Timer

	// Resuming over TCP (session_tcp.go): the dialer's reserved source
	// port; the port and the addresses the server knows the dialer by.
	port      *tcpPortReservation
	tcpPort   uint16
	clientIPs []netip.Addr
}

// onTCPLocked reports whether the connection runs over TCP now (a session
// that failed over to it); c.mu is held.
func (c *Conn) onTCPLocked() bool {
	return transportOfLink(c.link) == fallback.TCP
}

// knowLocked notes an address the dialer's links came from; c.mu is held.
func (s *session) knowLocked(a netip.Addr) {
	if !a.IsValid() || slices.Contains(s.clientIPs, a) {
		return
	}
	if len(s.clientIPs) == 8 {
		s.clientIPs = s.clientIPs[1:]
	}
	s.clientIPs = append(s.clientIPs, a)
}

// ResumeError ends a session that could not resume within
// Config.ResumeTimeout, or that the server refused to resume: what broke
// the link, and each path tried, with why it failed.
type ResumeError struct {
	Cause    error // what broke the link
	Attempts []ResumeAttempt
	Waited   time.Duration
	Refused  bool // the server refused the session (unknown, stale, closed)
}

// ResumeAttempt is what became of the tries to resume a session on one
// path: how many, and the last one's error.
type ResumeAttempt struct {
	Path  string
	Tries int
	Err   error
}

func (e *ResumeError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rdmanet: the session could not resume in %v after %v", e.Waited.Round(time.Millisecond), e.Cause)
	if e.Refused {
		b.WriteString(" (the server refused it)")
	}
	for i, a := range e.Attempts {
		if i == 0 {
			b.WriteString("; tried:")
		}
		fmt.Fprintf(&b, " %s (%d times): %v;", a.Path, a.Tries, a.Err)
	}
	return strings.TrimSuffix(b.String(), ";")
}

func (e *ResumeError) Unwrap() error { return e.Cause }

// Timeout reports whether the session ran out of time (not refused).
func (e *ResumeError) Timeout() bool { return !e.Refused }

// ErrSessionRefused is matched by the error of a resume the server
// refused: the session is unknown to it (it restarted, or the session
// ended), the generation is stale (a replay, or a resume that another
// already won), or a resume of it is already under way.
var ErrSessionRefused = errors.New("rdmanet: session refused")

// refusalReason is what a server tells a dialer of why it refused a
// resume: err's text without ErrSessionRefused's, which the dialer's error
// wraps again.
func refusalReason(err error) string {
	return strings.TrimPrefix(err.Error(), ErrSessionRefused.Error()+": ")
}

// lostLink is a session's link while it has none: nothing arrives, nothing
// may be posted, and a poller sleeps in Wait until Wake (a new link, a
// deadline, Close).
type lostLink struct {
	tx, rx        []byte
	local, remote netip.AddrPort // the last link's
	wake          chan struct{}
}

func newLostLink(tx, rx []byte) *lostLink {
	return &lostLink{tx: tx, rx: rx, wake: make(chan struct{}, 1)}
}

var errLinkLost = errors.New("rdmanet: the session has no link")

func (l *lostLink) Caps() link.Caps                     { return link.Caps{Name: "none"} }
func (l *lostLink) SendRing() []byte                    { return l.tx }
func (l *lostLink) RecvRing() []byte                    { return l.rx }
func (l *lostLink) RecvRingKey() (uint64, uint32)       { return 0, 0 }
func (l *lostLink) PostSend([]link.SendWR) error        { return errLinkLost }
func (l *lostLink) PostRecv(int) error                  { return errLinkLost }
func (l *lostLink) Poll([]link.Completion) (int, error) { return 0, nil }
func (l *lostLink) Arm() error                          { return nil }
func (l *lostLink) Disconnect() error                   { return nil }
func (l *lostLink) Close() error                        { return nil }
func (l *lostLink) Wake()                               { notify(l.wake) }
func (l *lostLink) SetNotify(func())                    {}
func (l *lostLink) Wait() error {
	<-l.wake
	return link.ErrWoken
}
func (l *lostLink) Addrs() (local, remote netip.AddrPort) { return l.local, l.remote }

// notify wakes one waiter without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// suspendLocked runs once the engine lost its link: the session's lost
// link takes its place, the old one is woken (a poller asleep on it moves
// to the lost link) and closed in the background, and the session starts
// to resume. c.mu is held.
func (c *Conn) suspendLocked() {
	s := c.sess
	old := c.link
	if old == link.Link(s.lost) {
		return
	}
	c.link = s.lost
	old.SetNotify(nil)
	s.lost.local, s.lost.remote = old.Addrs()
	retired := make(chan struct{})
	s.retired = retired
	cause := c.eng.Lost()
	if cause != errFailback {
		s.why = cause
	}
	if cause != errFailback && cause != errResumedElsewhere && cause != stream.ErrPeerLeftLink {
		// (The peer's leaving is its own failure, or its close: none
		// of this side's connection errors.)
		countConnError(cause)
	}
	s.left = SessionMove{Reason: moveReason(cause), From: transportOfLink(old)}
	s.lostAt = time.Now()
	slog.Info("rdmanet: session lost its link", "session", s.id, "path", s.path, "err", cause)
	old.Wake()
	go func() {
		c.retire(old)
		close(retired)
	}()
	if s.state == sessionActive {
		s.setStateLocked(sessionSuspended)
	}
	if s.state != sessionMoving { // a failback in progress brings its own link (failback.go)
		c.startRecoveryLocked(cause)
	}
}

// startRecoveryLocked starts to resume the suspended session: the dialer
// makes a new link, the server waits for one; c.mu is held.
func (c *Conn) startRecoveryLocked(cause error) {
	ctx, cancel := context.WithCancel(context.Background())
	c.sess.cancel = cancel
	c.sess.knocked = false
	go c.recoverSession(ctx, cancel, c.sess.retired, cause)
}

// recoverSession closes the old link once nobody waits on it, then, on the
// dialing side, makes a new one, and on the listening side waits for one,
// for up to Config.ResumeTimeout; after that the connection fails with a
// *ResumeError.
//
// A link the peer left without its Close (stream.ErrPeerLeftLink) is lost
// only if the peer comes back: it let go of a link that may work (its
// keepalive took a stall for a dead path, or its device failed), or its
// process died, whose kernel ends its links the same way. A peer that
// left comes back at once, so the server waits for its resume to be asked
// for only peerLeftWait; the dialer tries the path it was on first, and
// if nothing listens there any more, or the server does not know the
// session, the peer is gone. Either way the session then ends as the
// peer's close (PeerLeft), the end a plain connection sees.
func (c *Conn) recoverSession(ctx context.Context, cancel context.CancelFunc, retired chan struct{}, cause error) {
	defer cancel()
	start := time.Now()
	select { // the old link is closed before a new one uses the rings
	case <-retired:
	case <-ctx.Done():
		return
	}
	deadline := start.Add(c.sess.timeout)
	left := cause == stream.ErrPeerLeftLink
	if c.sess.paths == nil {
		// The server: resumeFrom attaches a link; this only ends the wait.
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		var back <-chan time.Time
		if left {
			bt := time.NewTimer(min(peerLeftWait(c.cfg), c.sess.timeout))
			defer bt.Stop()
			back = bt.C
		}
		for {
			select {
			case <-t.C:
				c.giveUp(&ResumeError{Cause: cause, Waited: time.Since(start)})
				return
			case <-back:
				if c.peerLeft() {
					return
				}
				back = nil // the dialer asked: it has until the deadline
			case <-ctx.Done():
				return
			}
		}
	}
	var attempts []ResumeAttempt
	backoff := 10 * time.Millisecond
	c.mu.Lock()
	var dead *stream.PathDeadError
	from := c.sess.pathIndex
	order := resumeOrder(c.sess.paths, from, errors.As(cause, &dead))
	if left {
		order = append([]int{from}, slices.DeleteFunc(order, func(i int) bool { return i == from })...)
	}
	c.mu.Unlock()
	for {
		for _, i := range order {
			p := c.sess.paths[i]
			c.mu.Lock()
			if (c.closing && !c.lingering) || c.eng.Err() != nil {
				c.mu.Unlock()
				return
			}
			h := c.resumeHelloLocked()
			c.mu.Unlock()

			actx, cancel := context.WithDeadline(ctx, deadline)
			l, peer, err := p.dial(actx, h)
			cancel()
			if err == nil {
				if err = c.attach(l, peer, p.name, i); err == nil {
					return
				}
			}
			attempts = tried(attempts, p.name, err)
			if left && (errors.Is(err, ErrSessionRefused) || i == from && nothingListens(err)) {
				slog.Info("rdmanet: session ended: the server left its link and is gone", "session", c.sess.id, "path", p.name, "err", err)
				c.peerLeft()
				return
			}
			refused := errors.Is(err, ErrSessionRefused)
			if refused || !time.Now().Before(deadline) || ctx.Err() != nil {
				c.giveUp(&ResumeError{Cause: cause, Attempts: attempts, Waited: time.Since(start), Refused: refused})
				return
			}
		}
		// Try again after the backoff, and once more at the deadline.
		select {
		case <-time.After(min(backoff, max(time.Until(deadline), time.Millisecond))):
		case <-ctx.Done():
		}
		backoff = min(2*backoff, time.Second)
	}
}

// resumeHelloLocked is the dialer's request to resume the session at its
// generation, naming its reserved TCP port; c.mu is held.
func (c *Conn) resumeHelloLocked() wire.Hello {
	s := c.sess
	h := c.cfg.helloOf(c.eng.Features())
	h.Resume, h.Session, h.Generation = true, s.id, s.gen
	if s.port != nil {
		h.TCPPort = s.port.port
	}
	return h
}

// retire waits until no poller waits on old, then closes it: the old link
// may then touch the session's rings no more.
func (c *Conn) retire(old link.Link) {
	for {
		c.mu.Lock()
		waiting := c.waitLink == old
		c.mu.Unlock()
		if !waiting {
			break
		}
		old.Wake()
		time.Sleep(time.Millisecond)
	}
	old.Close()
}

// peerLeftWait is how long the server waits for a dialer that left its
// link without closing to ask for a resume: it does at once, and a dead
// path on its way costs it resumeAnswerWait before it tries the next.
func peerLeftWait(cfg Config) time.Duration { return resumeAnswerWait + cfg.KeepAlive }

// nothingListens reports whether a resume's dial found nothing listening
// at the server's address and port (RDMA's reject by the host, or TCP's
// refusal): the server's listener is gone, and with it the session.
func nothingListens(err error) bool {
	var ee *cm.EventError
	return errors.As(err, &ee) && ee.NoListener() || errors.Is(err, syscall.ECONNREFUSED)
}

// peerLeft ends a session whose peer left its link and did not come back
// (recoverSession), unless a resume was asked for meanwhile; it reports
// whether it did.
func (c *Conn) peerLeft() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sess
	if (c.closing && !c.lingering) || c.link != link.Link(s.lost) || s.knocked || s.state != sessionSuspended {
		return false
	}
	slog.Info("rdmanet: session ended: the peer left its link and did not come back", "session", s.id, "path", s.path)
	s.setStateLocked(sessionEnded)
	c.eng.PeerLeft()
	c.wakeReadyLocked()
	s.lost.Wake()
	return true
}

// giveUp ends a session that did not resume.
func (c *Conn) giveUp(err *ResumeError) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if (c.closing && !c.lingering) || c.link != link.Link(c.sess.lost) {
		return
	}
	slog.Info("rdmanet: session ended without resuming", "session", c.sess.id, "err", err)
	c.sess.setStateLocked(sessionEnded)
	c.eng.End(err)
	c.wakeReadyLocked()
	c.sess.lost.Wake()
}

// attach makes l the session's link: the engine resumes on it. A closed or
// failed connection refuses it (and closes it).
func (c *Conn) attach(l link.Link, peer wire.Hello, path string, index int) (err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer func() {
		if err != nil {
			c.stepEndedLocked(sessionAttaching) // the server's attach is over
		}
	}()
	switch {
	case c.closing && !c.lingering:
		l.Close()
		return net.ErrClosed
	case c.eng.Err() != nil:
		l.Close()
		return c.eng.Err()
	case c.link != link.Link(c.sess.lost):
		l.Close()
		return errors.New("rdmanet: session already has a link")
	}
	addr, key := l.RecvRingKey()
	if err := c.eng.Relink(l.Caps(), addr, key); err != nil {
		l.Close()
		return err
	}
	if c.sess.paths != nil {
		c.sess.gen = peer.Generation
		c.sess.pathIndex = index
		c.scheduleFailbackLocked()
	} else {
		c.sess.unconfirmed = true
	}
	c.sess.setStateLocked(sessionActive)
	c.sess.cancel() // the server's wait for a link
	c.link = l
	path = linkPathName(l, path)
	c.sess.failovers++
	move := c.sess.left
	move.To = transportOfLink(l)
	countMove(move)
	now := time.Now()
	c.sess.lastMove = SessionMoveEvent{SessionMove: move, FromPath: c.sess.path, ToPath: path, At: now, Pause: now.Sub(c.sess.lostAt)}
	slog.Info("rdmanet: session resumed", "session", c.sess.id, "reason", move.Reason, "from", c.sess.path, "to", path, "failovers", c.sess.failovers, "pause", c.sess.lastMove.Pause)
	c.sess.path = path
	c.rdma = nil // the first link's, for its set-up only
	if c.sess.paths == nil {
		_, remote := l.Addrs()
		c.sess.knowLocked(remote.Addr())
	}
	l.SetNotify(c.fd.Kick)
	c.flushLocked()
	c.rearmLocked()
	c.sess.lost.Wake()  // the poller asleep on the lost link moves to l
	c.fd.SettleLocked() // or, with none, l tells of its completions
	return nil
}

// linkPathName names the path a link runs on, for SessionState.Path and
// logs, the same way for the first link and the next ones: RDMA links by
// their addresses and device, TCP links by their addresses; others (the
// tests' pipes) by name.
func linkPathName(l link.Link, name string) string {
	switch transportOfLink(l) {
	case fallback.RDMA:
		return rdmaPathName(l)
	case fallback.TCP:
		return l.Caps().Name
	}
	return name
}

// errResumedElsewhere suspends a session whose dialer resumed it on a new
// link while this side's link still looked alive: the dialer found it dead.
var errResumedElsewhere = fmt.Errorf("rdmanet: the peer resumed the session on another link: %w", link.ErrDown)

// resumeBegin starts to resume c's session, at generation gen, for a
// dialer that asked: the generation must be the session's (or the one its
// last resume gave out, if the dialer got that answer and this side has not
// yet heard from it on that link). It returns the rings to make the new
// link over and the generation to give the dialer; resumeEnd must follow,
// with the new link once it is established, or nil.
func (c *Conn) resumeBegin(gen uint32) (tx, rx []byte, next uint32, err error) {
	c.mu.Lock()
	s := c.sess
	s.knocked = true // the dialer is alive: peerLeft waits for it
	switch {
	case c.closing && !c.lingering:
		// A connection closed and still delivering what was written
		// (linger) may resume to deliver it.
		err = fmt.Errorf("%w: it was closed", ErrSessionRefused)
	case c.eng.Err() != nil:
		err = fmt.Errorf("%w: it has ended: %v", ErrSessionRefused, c.eng.Err())
	case s.state == sessionEnded:
		err = fmt.Errorf("%w: it has ended: the dialer left its link and did not come back in time", ErrSessionRefused)
	case s.state == sessionAttaching:
		err = errResumeBusy
	case gen != s.gen && (s.next == 0 || gen != s.next):
		err = fmt.Errorf("%w: generation %d, the session is at %d", ErrSessionRefused, gen, s.gen)
	}
	if err != nil {
		c.mu.Unlock()
		return nil, nil, 0, err
	}
	s.setStateLocked(sessionAttaching)
	s.gen, s.next = gen, gen+1
	c.mu.Unlock()
	return s.tx, s.rx, gen + 1, nil
}

// resumeEnd ends what resumeBegin started: with l, the session resumes on
// it; with nil (the new link was not made), the session waits for another
// try.
//
// The session keeps its link until the new one is established: a resume
// that fails half-way (a dialer moving back to its first path that gives
// up) leaves it as it was. The new link may be made over the rings while
// the old one runs: the dialer sends nothing into them before this side's
// announcement, which the new link carries only after the old one is
// closed (what the old one wrote meanwhile is sent again after Resume).
func (c *Conn) resumeEnd(l link.Link, path string) error {
	c.mu.Lock()
	s := c.sess
	if l == nil {
		c.stepEndedLocked(sessionAttaching)
		c.mu.Unlock()
		return nil
	}
	if c.link != link.Link(s.lost) && (!c.closing || c.lingering) && c.eng.Err() == nil {
		// The dialer let go of this link (it found the path dead, or it
		// moves back to its first path).
		c.eng.Fail(errResumedElsewhere)
		c.wakeReadyLocked()
	}
	if c.link != link.Link(s.lost) { // ended or closed: attach refuses
		c.stepEndedLocked(sessionAttaching)
		c.mu.Unlock()
		l.Close()
		return fmt.Errorf("%w: it has ended", ErrSessionRefused)
	}
	retired := s.retired
	c.mu.Unlock()
	<-retired
	return c.attach(l, wire.Hello{}, path, -1)
}

// stepEndedLocked ends a step that made no new link, a failback's move or
// the server's attach, if the session is still in it: the session is
// active on its link, or suspended if the link went meanwhile; c.mu is
// held.
func (c *Conn) stepEndedLocked(step sessionState) {
	s := c.sess
	switch {
	case s.state != step:
	case c.link == link.Link(s.lost):
		s.setStateLocked(sessionSuspended)
	default:
		s.setStateLocked(sessionActive)
	}
}

// errResumeBusy answers a resume while another of the same session is
// under way: the dialer tries again (it is not a refusal).
var errResumeBusy = errors.New("rdmanet: a resume of the session is under way")

// newSessionConn makes a resumable connection over l, which is established
// with the session extension agreed: the session id, and on the dialing
// side the paths to make a new link on.
func newSessionConn(l link.Link, cfg Config, server bool, features wire.Features, peer wire.Hello, id wire.SessionID, paths []resumePath) (*Conn, error) {
	c := &Conn{link: l, cfg: cfg, server: server, sess: &session{id: id, paths: paths, timeout: cfg.ResumeTimeout}}
	if err := c.begin(features, peer); err != nil {
		return nil, err
	}
	return c, nil
}

// end runs when the connection has released its last link: the old link a
// resume retired is closed too (so the rings may be freed), and the server
// forgets the session.
func (s *session) end(c *Conn) {
	c.mu.Lock()
	retired := s.retired
	c.mu.Unlock()
	if retired != nil {
		<-retired
	}
	if s.table != nil {
		s.table.remove(s.id, c)
	}
	s.port.close()
}

// SessionState describes a resumable session (Config.ResumeTimeout).
type SessionState struct {
	// Resumable: the connection is a session (both sides agreed).
	Resumable bool
	// ID is the first bytes of the session's id, enough to find it in
	// logs (the whole id is what a resume presents, and is not shown).
	ID string
	// Generation counts the resumes the server has confirmed.
	Generation uint32
	// Failovers is how many times this side moved the session to a new link.
	Failovers int
	// Path is the link the session runs on now ("" while it has none).
	Path string
	// Failbacks is how many times the dialer moved the session back to
	// its first path after it recovered.
	Failbacks int
	// Suspended: the session lost its link and is resuming.
	Suspended bool
	// LastMove is the session's latest move to a new link, a failover or
	// a failback (At is zero before the first).
	LastMove SessionMoveEvent
}

// SessionMoveEvent is one move of a session to a new link.
type SessionMoveEvent struct {
	SessionMove
	// The paths, as in SessionState.Path.
	FromPath, ToPath string
	// At is when the new link took over.
	At time.Time
	// Pause is how long the session had no link: from when this side
	// found the old link broken (for a dead path, a keepalive interval or
	// more after it broke) to At. A failback makes its new link before it
	// lets go of the old, so its pause is short.
	Pause time.Duration
}

// Session reports the connection's session, if it is one.
func (c *Conn) Session() SessionState {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sess
	if s == nil {
		return SessionState{}
	}
	st := SessionState{Resumable: true, ID: s.id.String(), Generation: s.gen, Failovers: s.failovers, Path: s.path, Failbacks: s.failbacks, LastMove: s.lastMove}
	if c.link == link.Link(s.lost) {
		st.Path = ""
		st.Suspended = c.eng.Lost() != nil // not once it ended
	}
	return st
}

// tried records a failed try on path.
func tried(attempts []ResumeAttempt, path string, err error) []ResumeAttempt {
	for i := range attempts {
		if attempts[i].Path == path {
			attempts[i].Tries++
			attempts[i].Err = err
			return attempts
		}
	}
	return append(attempts, ResumeAttempt{Path: path, Tries: 1, Err: err})
}
