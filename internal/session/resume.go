package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// resumeOrder is the order in which a dialer whose path paths[failed]
// broke tries its paths: the other RDMA paths first, starting with the
// next one (failback brings the session back to the first path once it
// works), then the broken one, then TCP. A path found dead (silent for 2 x
// KeepAlive) goes after TCP instead: trying it again at once would cost a
// whole answer wait for nothing, while a queue-pair error may have been
// passing, and RDMA is not given up for that.
func resumeOrder(paths []Path, failed int, dead bool) []int {
	var rdma, tcp []int
	broken := -1
	for k := range paths {
		i := (failed + 1 + k) % len(paths)
		if paths[failed].TCP {
			i = k // off TCP: the RDMA paths in their order
		}
		switch {
		case paths[i].TCP:
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

// startRecoveryLocked starts to resume the suspended session: the dialer
// makes a new path, the server waits for one; l.mu is held.
func (l *Link) startRecoveryLocked(cause error) {
	ctx, cancel := context.WithCancel(l.life)
	l.cancel = cancel
	l.knocked = false
	retired := l.retired
	l.work.Add(1)
	go func() {
		defer l.work.Done()
		defer cancel()
		l.recover(ctx, retired, cause)
	}()
}

// recover closes the old path once nobody waits on it, then, on the
// dialing side, makes a new one, and on the listening side waits for one,
// for up to Config.Timeout; after that the session ends (GiveUp).
//
// A path the peer left without its Close (stream.ErrPeerLeftLink) is lost
// only if the peer comes back: it let go of a path that may work (its
// keepalive took a stall for a dead path, or its device failed), or its
// process died, whose kernel ends its paths the same way. A peer that
// left comes back at once, so the server waits for its resume to be asked
// for only PeerLeftWait; the dialer tries the path it was on first, and if
// nothing listens there any more, or the server does not know the
// session, the peer is gone. Either way the session then ends as the
// peer's close, the end a plain connection sees.
func (l *Link) recover(ctx context.Context, retired chan struct{}, cause error) {
	start := time.Now()
	select { // the old path is closed before a new one uses the rings
	case <-retired:
	case <-ctx.Done():
		return
	}
	deadline := start.Add(l.cfg.Timeout)
	left := cause == stream.ErrPeerLeftLink
	if l.cfg.Paths == nil {
		l.awaitResume(ctx, start, deadline, left, cause)
		return
	}
	var attempts []Attempt
	backoff := 10 * time.Millisecond
	l.mu.Lock()
	var dead *stream.PathDeadError
	from := l.pathIndex
	order := resumeOrder(l.cfg.Paths, from, errors.As(cause, &dead))
	if left {
		order = append([]int{from}, slices.DeleteFunc(order, func(i int) bool { return i == from })...)
	}
	l.mu.Unlock()
	for {
		for _, i := range order {
			p := l.cfg.Paths[i]
			l.mu.Lock()
			if l.closed {
				l.mu.Unlock()
				return
			}
			h := l.helloLocked()
			l.mu.Unlock()

			actx, cancel := context.WithDeadline(ctx, deadline)
			nl, peer, err := p.Dial(actx, h)
			cancel()
			if err == nil {
				if err = l.attach(nl, peer, p.Name, i); err == nil {
					return
				}
			}
			attempts = tried(attempts, p.Name, err)
			if left && (errors.Is(err, ErrRefused) || i == from && l.cfg.NothingListens != nil && l.cfg.NothingListens(err)) {
				slog.Info("rdmanet: session ended: the server left its link and is gone", "session", l.cfg.ID, "path", p.Name, "err", err)
				l.peerLeft()
				return
			}
			refused := errors.Is(err, ErrRefused)
			if refused || !time.Now().Before(deadline) || ctx.Err() != nil {
				l.giveUp(End{Cause: cause, Attempts: attempts, Waited: time.Since(start), Refused: refused})
				return
			}
		}
		// Try again after the backoff, and once more at the deadline.
		t := time.NewTimer(min(backoff, max(time.Until(deadline), time.Millisecond)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		backoff = min(2*backoff, time.Second)
	}
}

// awaitResume is the server's recovery: EndResume attaches a path; this
// only ends the wait.
func (l *Link) awaitResume(ctx context.Context, start, deadline time.Time, left bool, cause error) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	var back <-chan time.Time
	if left {
		bt := time.NewTimer(min(l.cfg.PeerLeftWait, l.cfg.Timeout))
		defer bt.Stop()
		back = bt.C
	}
	for {
		select {
		case <-t.C:
			l.giveUp(End{Cause: cause, Waited: time.Since(start)})
			return
		case <-back:
			if l.peerLeft() {
				return
			}
			back = nil // the dialer asked: it has until the deadline
		case <-ctx.Done():
			return
		}
	}
}

// helloLocked is the dialer's request to resume the session at its
// generation; l.mu is held.
func (l *Link) helloLocked() wire.Hello {
	h := l.cfg.Hello
	h.Resume, h.Session, h.Generation = true, l.cfg.ID, l.gen
	return h
}

// Hello is the dialer's resume request now.
func (l *Link) Hello() wire.Hello {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.helloLocked()
}

// peerLeft ends a session whose peer left its path and did not come back,
// unless a resume was asked for meanwhile; it reports whether it did.
func (l *Link) peerLeft() bool {
	l.mu.Lock()
	if l.closed || l.path != nil || l.knocked || l.state != Suspended {
		l.mu.Unlock()
		return false
	}
	slog.Info("rdmanet: session ended: the peer left its link and did not come back", "session", l.cfg.ID, "path", l.pathNameLocked())
	l.setLocked(Ended)
	l.reportLocked(link.Completion{Kind: link.Ended, Err: stream.ErrPeerLeftLink})
	l.mu.Unlock()
	l.signal()
	return true
}

// giveUp ends a session that did not resume.
func (l *Link) giveUp(e End) {
	l.mu.Lock()
	if l.closed || l.path != nil {
		l.mu.Unlock()
		return
	}
	err := l.cfg.GiveUp(e)
	slog.Info("rdmanet: session ended without resuming", "session", l.cfg.ID, "err", err)
	l.setLocked(Ended)
	l.reportLocked(link.Completion{Kind: link.Ended, Err: err})
	l.mu.Unlock()
	l.signal()
}

// attach makes p the session's path: Poll reports it (link.Resumed), and
// the engine resumes on it. A closed session refuses it (and closes it).
func (l *Link) attach(p link.Link, peer wire.Hello, name string, index int) (err error) {
	l.mu.Lock()
	defer func() {
		if err != nil {
			l.stepEndedLocked(Attaching) // the server's attach is over
			l.mu.Unlock()
			p.Close()
			return
		}
		l.mu.Unlock()
		l.signal()
	}()
	switch {
	case l.closed:
		return errClosed
	case l.state == Ended: // it gave up meanwhile, and said so
		return fmt.Errorf("%w: it has ended", ErrRefused)
	case l.path != nil:
		return errors.New("rdmanet: session already has a link")
	}
	if l.cfg.Paths != nil {
		l.gen = peer.Generation
		l.pathIndex = index
		l.scheduleFailbackLocked()
	} else {
		l.unconfirmed = true
		_, remote := p.Addrs()
		l.knowLocked(remote.Addr())
	}
	l.setLocked(Active)
	l.cancel() // the server's wait for a path
	l.path, l.last = p, p
	name = l.cfg.PathName(p, name)
	l.failovers++
	now := time.Now()
	l.lastMove = Move{Cause: l.leftCause, From: l.leftFrom, To: p.Caps().Transport,
		FromPath: l.pathNameLocked(), ToPath: name, At: now, Pause: now.Sub(l.lostAt)}
	slog.Info("rdmanet: session resumed", "session", l.cfg.ID, "reason", MoveReason(l.leftCause), "from", l.pathNameLocked(), "to", name, "failovers", l.failovers, "pause", l.lastMove.Pause)
	l.pathName = name
	if l.cfg.Moved != nil {
		l.cfg.Moved(l.lastMove)
	}
	p.SetNotify(l.notify)
	l.reportLocked(link.Completion{Kind: link.Resumed})
	l.resumed = true
	return nil
}

// BeginResume starts to resume the session, at generation gen, for a
// dialer that asked: the generation must be the session's (or the one its
// last resume gave out, if the dialer got that answer and this side has not
// yet heard from it on that path). It returns the generation to give the
// dialer; EndResume must follow, with the new path once it is established,
// or nil.
func (l *Link) BeginResume(gen uint32) (next uint32, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.knocked = true // the dialer is alive: peerLeft waits for it
	switch {
	case l.closed:
		return 0, fmt.Errorf("%w: it has ended", ErrRefused)
	case l.state == Ended:
		return 0, fmt.Errorf("%w: it has ended: the dialer left its link and did not come back in time", ErrRefused)
	case l.state == Attaching:
		return 0, ErrBusy
	case gen != l.gen && (l.next == 0 || gen != l.next):
		return 0, fmt.Errorf("%w: generation %d, the session is at %d", ErrRefused, gen, l.gen)
	}
	l.setLocked(Attaching)
	// The dialer's word on the path being replaced confirms nothing: it
	// named gen, and the path this resume attaches confirms gen+1.
	l.gen, l.next, l.unconfirmed = gen, gen+1, false
	return gen + 1, nil
}

// EndResume ends what BeginResume started: with p, the session resumes on
// it; with nil (the new path was not made), the session waits for another
// try.
//
// The session keeps its path until the new one is established: a resume
// that fails half-way (a dialer moving back to its first path that gives
// up) leaves it as it was. The new path may be made over the rings while
// the old one runs: the dialer sends nothing into them before this side's
// announcement, which the new path carries only after the old one is
// closed (what the old one wrote meanwhile is sent again after Resume).
func (l *Link) EndResume(p link.Link, name string) error {
	l.mu.Lock()
	if p == nil {
		l.stepEndedLocked(Attaching)
		l.mu.Unlock()
		return nil
	}
	// The dialer let go of the path this side still has (it found it
	// dead, or it moves back to a path before it).
	if l.closed || l.path != nil && !l.letGoLocked(errResumedElsewhere) {
		l.stepEndedLocked(Attaching)
		l.mu.Unlock()
		p.Close()
		return fmt.Errorf("%w: it has ended", ErrRefused)
	}
	retired := l.retired
	l.mu.Unlock()
	<-retired
	return l.attach(p, wire.Hello{}, name, -1)
}

// tried records a failed try on path.
func tried(attempts []Attempt, path string, err error) []Attempt {
	for i := range attempts {
		if attempts[i].Path == path {
			attempts[i].Tries++
			attempts[i].Err = err
			return attempts
		}
	}
	return append(attempts, Attempt{Path: path, Tries: 1, Err: err})
}
