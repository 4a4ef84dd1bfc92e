package session

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// Failback: a session the dialer moved to another path than its first (the
// first RDMA path, to the dialed address) tries, every FailbackInterval at
// most and with backoff, to move back: to the first path, and from TCP to
// any RDMA path, in their order. It makes the new path before it lets go of
// the old: it resumes on the new path while the current one still runs. If
// that fails (every such path is still broken) nothing has changed. If it
// works, the server lets go of the session's old path for the new one
// (EndResume), the dialer lets go of its own, and attaches the new path.
// Each side may see the old path's end, closed by the other, before it let
// go of the path itself: that end is a move, not the peer's close (moving
// on the dialer, attaching on the server; Poll).

// DefaultFailbackInterval is Config.FailbackInterval's default.
const DefaultFailbackInterval = 30 * time.Second

// failbackAnswerWait bounds one try to move back: the server's answer to
// a resume, and a little.
const failbackAnswerWait = 4 * time.Second

// scheduleFailbackLocked arms the next try, when the session is on another
// path than its first; l.mu is held.
func (l *Link) scheduleFailbackLocked() {
	if l.cfg.Paths == nil || l.pathIndex == 0 || l.cfg.FailbackInterval < 0 || l.closed || l.noFailback {
		l.failbackWait = 0
		return
	}
	interval := cmp.Or(l.cfg.FailbackInterval, DefaultFailbackInterval)
	if l.failbackWait == 0 {
		l.failbackWait = interval
	}
	if l.failbackTimer != nil {
		l.failbackTimer.Stop()
	}
	l.failbackTimer = time.AfterFunc(l.failbackWait, l.failback)
}

// pathLost reports whether the session has no path (it broke while a
// failback was under way).
func (l *Link) pathLost() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.path == nil
}

// failback tries once to move the session to a path before the one it is
// on, in their order: back to the first path, or, from TCP, to whichever
// RDMA path works first (a passing error may have sent the session past
// one that works: RDMA is not given up for it).
func (l *Link) failback() {
	l.mu.Lock()
	if l.closed || l.noFailback || l.path == nil || l.pathIndex == 0 || l.state != Active {
		l.mu.Unlock()
		return
	}
	l.work.Add(1)
	defer l.work.Done()
	l.setLocked(Moving)
	h := l.helloLocked()
	better, from := l.cfg.Paths[:l.pathIndex], l.pathNameLocked()
	l.mu.Unlock()

	var p link.Link
	var peer wire.Hello
	var err error
	to := 0
	for ; to < len(better); to++ {
		ctx, cancel := context.WithTimeout(l.life, failbackAnswerWait)
		p, peer, err = better[to].Dial(ctx, h)
		cancel()
		if err == nil || l.life.Err() != nil || l.pathLost() {
			break // a lost path is resumed from, below, not failed back from
		}
		slog.Debug("rdmanet: session could not move back to a path", "session", l.cfg.ID, "path", better[to].Name, "err", err)
	}

	l.mu.Lock()
	if err != nil {
		l.stepEndedLocked(Moving)
		interval := cmp.Or(l.cfg.FailbackInterval, DefaultFailbackInterval)
		l.failbackWait = min(2*l.failbackWait, 8*interval)
		if l.path == nil {
			// The old path went meanwhile (the server had begun to take
			// the session over, and failed; or it broke): resume as after
			// any loss, for what the engine was told of it.
			if !l.closed {
				l.startRecoveryLocked(l.leftCause)
			}
		} else {
			l.scheduleFailbackLocked()
		}
		l.mu.Unlock()
		return
	}
	if l.closed || l.noFailback {
		l.stepEndedLocked(Moving)
		l.mu.Unlock()
		p.Close()
		return
	}
	if l.path != nil && !l.letGoLocked(errFailback) {
		l.stepEndedLocked(Moving)
		l.scheduleFailbackLocked()
		l.mu.Unlock()
		p.Close()
		return
	}
	retired := l.retired
	l.failbackWait = 0
	l.mu.Unlock()
	<-retired

	if err := l.attach(p, peer, better[to].Name, to); err != nil { // moving to active, if it works
		l.mu.Lock()
		l.stepEndedLocked(Moving)
		if !l.closed && l.path == nil {
			l.startRecoveryLocked(l.leftCause)
		}
		l.mu.Unlock()
		return
	}
	l.mu.Lock()
	l.failbacks++
	l.mu.Unlock()
	slog.Info("rdmanet: session moved back to a path before its last", "session", l.cfg.ID, "from", from, "to", better[to].Name)
}
