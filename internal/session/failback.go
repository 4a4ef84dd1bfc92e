package session

import (
	"cmp"
	"context"
	"log/slog"
	"time"
)

// Failback: a session the dialer moved to another path than its first (the
// first RDMA path, to the dialed address) tries, every FailbackInterval at
// most and with backoff, to move back. It makes the new path before it lets
// go of the old: it resumes on the first path while the current one still
// runs. If that fails (the path is still broken) nothing has changed. If it
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

// failback tries once to move the session back to its first path.
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
	first, from := l.cfg.Paths[0], l.pathNameLocked()
	l.mu.Unlock()

	ctx, cancel := context.WithTimeout(l.life, failbackAnswerWait)
	p, peer, err := first.Dial(ctx, h)
	cancel()

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
		slog.Debug("rdmanet: session could not move back to its first path", "session", l.cfg.ID, "path", first.Name, "err", err)
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

	if err := l.attach(p, peer, first.Name, 0); err != nil { // moving to active, if it works
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
	slog.Info("rdmanet: session moved back to its first path", "session", l.cfg.ID, "from", from, "to", first.Name)
}
