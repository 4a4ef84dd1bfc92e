// Package session is a resumable session (wire.FeatureResume,
// docs/protocol.md) as a link: one link.Link that outlives the paths it
// runs on. The connection above it (rdmanet.Conn and its stream engine)
// sees one link for its whole life; the session switches paths under it.
//
// A path is a link made over the session's rings (RDMA or TCP). When the
// engine loses it in a way another path may cure (link.ErrDown: a dead
// path, a port or device gone, an address change), the connection calls
// Lost: the session lets go of the path, closes it once nobody waits on it
// (it may not write into the rings any more), and only then makes the next
// one over the same rings. The dialing side makes it (its Paths, in
// order); the listening side waits for the dialer's request (BeginResume,
// EndResume); each for at most Config.Timeout. When the new path is up,
// Poll reports a link.Resumed completion and the engine relinks; if none
// comes in time, link.Ended. A dialer on another path than its first moves
// back to it once it works (failback.go), and the peer's moves reach the
// engine as a link.Failed completion on the path it let go of.
//
// The session never takes the connection's lock and never sees the engine:
// what it tells the connection, it tells through completions.
package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// Path is one way to the session's server that the dialer tries, in order:
// other RDMA paths first, TCP last. Dial makes a new link over the
// session's rings with h in its request, and returns it with the server's
// Hello; an error matching ErrRefused ends the session.
type Path struct {
	Name string
	TCP  bool
	Dial func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error)
}

// Config is a session's.
type Config struct {
	ID wire.SessionID
	// Gen is the generation the session starts at (the dialer's, from the
	// server's accept).
	Gen uint32
	// Hello is the dialer's resume request but for Resume, Session and
	// Generation, which the session fills in.
	Hello wire.Hello
	// Paths are the dialer's; none on the server.
	Paths []Path
	// Timeout bounds the time without a path before the session ends.
	Timeout time.Duration
	// PeerLeftWait is how long the server waits for a dialer that left its
	// path without closing to ask for a resume.
	PeerLeftWait time.Duration
	// FailbackInterval is how often, at most, a dialer off its first path
	// tries to move back (with backoff, to 8 times it); negative: never.
	FailbackInterval time.Duration
	// ClientIP is the address the server's first path came from.
	ClientIP netip.Addr

	// PathName names a path's link for State.Path and logs; name is the
	// Path's or the one EndResume was given.
	PathName func(l link.Link, name string) string
	// GiveUp makes the error a session that could not resume ends with.
	GiveUp func(End) error
	// NothingListens reports whether a dial's error says nothing listens at
	// the server's address any more: its listener, and the session, are gone.
	NothingListens func(error) bool
	// Moved sees each move to a new path.
	Moved func(Move)
	// Closed runs once, when the session is closed or discarded.
	Closed func()
}

// End is why a session ends without resuming: what broke its path, and
// each path tried, with why it failed.
type End struct {
	Cause    error
	Attempts []Attempt
	Waited   time.Duration
	Refused  bool
}

// Attempt is what became of the tries to resume on one path.
type Attempt struct {
	Path  string
	Tries int
	Err   error
}

// Move is one move of the session to a new path.
type Move struct {
	Cause            error // why the last path was left (MoveReason)
	From, To         string
	FromPath, ToPath string
	At               time.Time
	Pause            time.Duration // how long the session had no path
}

// Errors a session's peer is told, or its moves are made with.
var (
	// ErrRefused is matched by the error of a resume the server refused.
	ErrRefused = errors.New("rdmanet: session refused")
	// ErrBusy answers a resume while another of the same session is under
	// way: the dialer tries again (it is not a refusal).
	ErrBusy = errors.New("rdmanet: a resume of the session is under way")
	// errFailback fails the path a dialer moves away from.
	errFailback = fmt.Errorf("rdmanet: the session moves back to a path before this one: %w", link.ErrDown)
	// errResumedElsewhere fails a path whose dialer resumed the session on
	// a new one while this side's still looked alive: the dialer found it dead.
	errResumedElsewhere = fmt.Errorf("rdmanet: the peer resumed the session on another link: %w", link.ErrDown)
	errNoPath           = errors.New("rdmanet: the session has no link")
	errClosed           = errors.New("rdmanet: the session is closed")
	errNoMemSend        = errors.New("rdmanet: the session's path cannot send from registered memory")
)

// MoveReason classifies why a session left a path.
func MoveReason(cause error) string {
	var dead *stream.PathDeadError
	switch {
	case cause == errFailback:
		return "failback"
	case cause == errResumedElsewhere:
		return "peer-resumed"
	case errors.As(cause, &dead):
		return "dead-path"
	case errors.Is(cause, stream.ErrPeerLeftLink):
		return "peer-left"
	}
	return "link-down"
}

// Link is a resumable session: a link.Link over the path of the moment.
type Link struct {
	cfg    Config
	tx, rx []byte

	mu     sync.Mutex
	path   link.Link // nil while the session has none
	last   link.Link // the last path, for its addresses while there is none
	notify func()
	// events are completions the session reports before the path's.
	events []link.Completion
	// resumed: the current path's link.Resumed is not yet taken; until
	// it is, the engine's loss is the last path's.
	resumed bool
	// waitingOn is the path a Wait sleeps on (nil: none, or on wake).
	// woken: a Wake came that no Wait took yet; a Wait about to sleep
	// takes it instead (a Wake is never lost between the two).
	waitingOn link.Link
	woken     bool
	wake      chan struct{}
	// left is closed when the path a move failed (leave) is let go of.
	left chan struct{}

	state       State
	gen, next   uint32
	unconfirmed bool // the server's new path has not heard the dialer yet
	knocked     bool // the server heard from the dialer since the loss
	closed      bool // Disconnect or Close: no more paths
	// life ends with closed: what the session does in the background
	// (a failback's dial) ends with it.
	life       context.Context
	stop       context.CancelFunc
	retired    chan struct{}
	cancel     context.CancelFunc
	work       sync.WaitGroup // recovery and failback
	closedOnce sync.Once

	failovers, failbacks int
	pathName             string
	why                  error // what broke the path before the current one
	leftCause            error
	leftFrom             string
	lostAt               time.Time
	lastMove             Move

	pathIndex     int
	failbackWait  time.Duration
	failbackTimer *time.Timer
	noFailback    bool
	clientIPs     []netip.Addr
}

var _ link.Resumer = (*Link)(nil)

// New makes a session over its first path, p, which is established; p's
// rings are the session's.
func New(p link.Link, cfg Config) *Link {
	l := &Link{cfg: cfg, tx: p.SendRing(), rx: p.RecvRing(), path: p, last: p, gen: cfg.Gen,
		wake: make(chan struct{}, 1), cancel: func() {}}
	l.life, l.stop = context.WithCancel(context.Background())
	l.knowLocked(cfg.ClientIP)
	return l
}

// pathNameLocked names the path of the moment; the first one is named
// when first asked, once it is established (its addresses are known).
func (l *Link) pathNameLocked() string {
	if l.pathName == "" {
		l.pathName = l.cfg.PathName(l.last, l.last.Caps().Name)
	}
	return l.pathName
}

func (l *Link) Caps() link.Caps {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.path == nil {
		return link.Caps{Name: "none"}
	}
	return l.path.Caps()
}

// PathProgress is the current path's (link.PathWatcher), or nothing where
// its link does not know it.
func (l *Link) PathProgress() (sent, heard time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w, ok := l.path.(link.PathWatcher); ok {
		return w.PathProgress()
	}
	return time.Time{}, time.Time{}
}

func (l *Link) SendRing() []byte { return l.tx }
func (l *Link) RecvRing() []byte { return l.rx }

// Path is the path the session runs on now, or nil.
func (l *Link) Path() link.Link {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.path
}

func (l *Link) RecvRingKey() (uint64, uint32) {
	if p := l.Path(); p != nil {
		return p.RecvRingKey()
	}
	return 0, 0
}

func (l *Link) PostSend(wrs []link.SendWR) error {
	if p := l.Path(); p != nil {
		return p.PostSend(wrs)
	}
	return errNoPath
}

// RegisterMem registers m with the path the session is on now
// (link.MemSender); a path that cannot send from it refuses, and the
// caller copies.
func (l *Link) RegisterMem(m *link.Mem) error {
	if p := l.Path(); p != nil {
		if s, ok := p.(link.MemSender); ok {
			return s.RegisterMem(m)
		}
		return errNoMemSend
	}
	return errNoPath
}

func (l *Link) PostRecv(n int) error {
	if p := l.Path(); p != nil {
		return p.PostRecv(n)
	}
	return errNoPath
}

// Poll reports the session's own completions first, then the path's. A
// path whose peer let it go during a move is a move, not the peer's close;
// the server's resumed path that hears from the dialer confirms the
// generation it gave out.
func (l *Link) Poll(cs []link.Completion) (int, error) {
	l.mu.Lock()
	if len(l.events) > 0 {
		n := copy(cs, l.events)
		for _, c := range cs[:n] {
			if c.Kind == link.Resumed {
				l.resumed = false
			}
		}
		clear(l.events[:n])
		l.events = l.events[n:]
		l.mu.Unlock()
		return n, nil
	}
	p := l.path
	l.mu.Unlock()
	if p == nil {
		return 0, nil
	}
	n, err := p.Poll(cs)
	if n > 0 {
		l.mu.Lock()
		if l.state == Moving || l.state == Attaching || l.unconfirmed {
			l.watchLocked(cs[:n])
		}
		l.mu.Unlock()
	}
	return n, err
}

func (l *Link) watchLocked(cs []link.Completion) {
	for i := range cs {
		switch cs[i].Kind {
		case link.Disconnected:
			switch l.state {
			case Moving: // the server let go of the path this side moves from
				cs[i] = link.Completion{Kind: link.Failed, Err: errFailback}
			case Attaching: // the dialer let go of the path it moves from
				cs[i] = link.Completion{Kind: link.Failed, Err: errResumedElsewhere}
			}
			// Any other end of a path is the peer closing only if its Close
			// came first (wire.FeatureClose): the engine takes it for a lost
			// path otherwise, and the session resumes.
		case link.DataArrived, link.ControlArrived:
			if l.unconfirmed {
				// The dialer's first message on the new path: it has the
				// generation this side gave out, and names it from now on.
				l.gen, l.next, l.unconfirmed = l.next, 0, false
			}
		}
	}
}

func (l *Link) Arm() error {
	if p := l.Path(); p != nil {
		return p.Arm()
	}
	return nil
}

// Wait sleeps in the path's Wait, or, with no path, until Wake or a
// completion of the session's own. A path let go of while a poller slept
// on it wakes it (ErrWoken, not the path's error).
func (l *Link) Wait() error {
	l.mu.Lock()
	if len(l.events) > 0 {
		l.mu.Unlock()
		return nil
	}
	if l.woken {
		l.woken = false
		l.mu.Unlock()
		return link.ErrWoken
	}
	p := l.path
	l.waitingOn = p
	l.mu.Unlock()
	var err error
	if p == nil {
		<-l.wake
		err = link.ErrWoken
	} else {
		err = p.Wait()
	}
	l.mu.Lock()
	l.waitingOn, l.woken = nil, false
	gone := p != l.path
	l.mu.Unlock()
	if err != nil && gone {
		err = link.ErrWoken
	}
	return err
}

func (l *Link) Wake() {
	l.mu.Lock()
	// Under the lock: retire closes a path only once no Wait is on it.
	if l.waitingOn != nil {
		l.waitingOn.Wake()
	}
	l.woken = true
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *Link) SetNotify(f func()) {
	l.mu.Lock()
	l.notify = f
	p := l.path
	l.mu.Unlock()
	if p != nil {
		p.SetNotify(f)
	}
}

// reportLocked queues a completion of the session's own; the caller calls
// signal once l.mu is released.
func (l *Link) reportLocked(c link.Completion) {
	l.events = append(l.events, c)
}

// signal tells the connection that a completion waits: its poller, or a
// service, takes it.
func (l *Link) signal() {
	l.mu.Lock()
	f := l.notify
	l.mu.Unlock()
	l.Wake()
	if f != nil {
		f()
	}
}

func (l *Link) Addrs() (local, remote netip.AddrPort) {
	l.mu.Lock()
	p := l.last
	l.mu.Unlock()
	return p.Addrs()
}

// Disconnect ends the session (the connection failed, or lingered its
// last): it makes no path any more, and its path is disconnected.
func (l *Link) Disconnect() error {
	p := l.end()
	if p != nil {
		return p.Disconnect()
	}
	return nil
}

func (l *Link) end() link.Link {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		l.stop()
		l.cancel()
		if l.failbackTimer != nil {
			l.failbackTimer.Stop()
		}
		l.closeLeftLocked()
	}
	return l.path
}

// Close ends the session, waits for its recovery and failback to stop and
// for a path it let go of to be closed, and closes its path: the rings
// are nobody's after it.
func (l *Link) Close() error {
	p := l.end()
	l.work.Wait()
	l.mu.Lock()
	retired := l.retired
	l.mu.Unlock()
	if retired != nil {
		<-retired
	}
	var err error
	if p != nil {
		err = p.Close()
	}
	l.Discard()
	return err
}

// Discard runs Config.Closed, for a session whose first path was never
// established (Close runs it too).
func (l *Link) Discard() {
	l.closedOnce.Do(func() {
		if l.cfg.Closed != nil {
			l.cfg.Closed()
		}
	})
}

// StopFailback stops moving back to an earlier path (the connection is
// closing: it delivers what was written on the path it has).
func (l *Link) StopFailback() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.noFailback = true
	if l.failbackTimer != nil {
		l.failbackTimer.Stop()
	}
}

// Lost lets go of the path the engine lost (cause): the session is
// suspended, closes the path once nobody waits on it, and resumes. It
// reports whether cause is a failure of this side's path (not a move,
// nor the peer's leaving), which the connection counts. The connection
// calls it, with its lock held, whenever its engine is suspended: until
// the engine took the new path's link.Resumed, the loss is the last
// path's, and the new path stays.
func (l *Link) Lost(cause error) (failure bool) {
	l.mu.Lock()
	old := l.path
	if old == nil || l.resumed {
		l.mu.Unlock()
		return false
	}
	l.path = nil
	old.SetNotify(nil)
	retired := make(chan struct{})
	l.retired = retired
	if cause != errFailback {
		l.why = cause
	}
	l.leftCause, l.leftFrom = cause, old.Caps().Transport
	l.lostAt = time.Now()
	slog.Info("rdmanet: session lost its link", "session", l.cfg.ID, "path", l.pathNameLocked(), "err", cause)
	if l.state == Active {
		l.setLocked(Suspended)
	}
	if l.state != Moving && !l.closed { // a failback brings its own path
		l.startRecoveryLocked(cause)
	}
	l.closeLeftLocked()
	l.mu.Unlock()
	old.Wake()
	go func() {
		l.retire(old)
		close(retired)
	}()
	return cause != errFailback && cause != errResumedElsewhere && cause != stream.ErrPeerLeftLink
}

// retire waits until no poller waits on old, then closes it: the old
// path may then touch the session's rings no more.
func (l *Link) retire(old link.Link) {
	for {
		l.mu.Lock()
		waiting := l.waitingOn == old
		l.mu.Unlock()
		if !waiting {
			break
		}
		old.Wake()
		time.Sleep(time.Millisecond)
	}
	old.Close()
}

// letGoLocked fails the current path with err (a move): the connection
// takes the completion and calls Lost. It waits for that, or the
// session's end, for at most leaveWait, and reports whether the path was
// let go of and the session goes on. l.mu is held, and released while it
// waits.
func (l *Link) letGoLocked(err error) bool {
	if l.left == nil {
		l.left = make(chan struct{})
	}
	left := l.left
	l.reportLocked(link.Completion{Kind: link.Failed, Err: err})
	l.mu.Unlock()
	l.signal()
	t := time.NewTimer(leaveWait)
	select {
	case <-left:
	case <-t.C:
	}
	t.Stop()
	l.mu.Lock()
	if l.path != nil {
		// Not taken: it must not fail the path later.
		l.events = slices.DeleteFunc(l.events, func(c link.Completion) bool { return c.Kind == link.Failed && c.Err == err })
	}
	return l.path == nil && !l.closed
}

func (l *Link) closeLeftLocked() {
	if l.left != nil {
		close(l.left)
		l.left = nil
	}
}

// leaveWait bounds the wait for the connection to take a move's
// completion: it takes it at once, unless it ended meanwhile.
const leaveWait = 5 * time.Second

// knowLocked notes an address the dialer's paths came from; l.mu is held.
func (l *Link) knowLocked(a netip.Addr) {
	if !a.IsValid() || slices.Contains(l.clientIPs, a) {
		return
	}
	if len(l.clientIPs) == 8 {
		l.clientIPs = l.clientIPs[1:]
	}
	l.clientIPs = append(l.clientIPs, a)
}

// MayResumeFrom reports whether a resume may come from a: the dialer's
// paths came from it, or the session has no path (the dialer's address
// may have changed with it).
func (l *Link) MayResumeFrom(a netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.path == nil || slices.Contains(l.clientIPs, a)
}

// Snapshot is a session at one moment.
type Snapshot struct {
	ID         wire.SessionID
	Generation uint32
	Failovers  int
	Failbacks  int
	Path       string // "" while there is none
	Suspended  bool   // no path the engine runs on, and resuming
	LastMove   Move
	State      State
}

// Snapshot reports the session now.
func (l *Link) Snapshot() Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Snapshot{ID: l.cfg.ID, Generation: l.gen, Failovers: l.failovers, Failbacks: l.failbacks,
		Path: l.pathNameLocked(), LastMove: l.lastMove, State: l.state}
	if l.path == nil || l.resumed {
		// (A new path counts once the engine took it.)
		s.Path = ""
		s.Suspended = l.state != Ended && !l.closed
	}
	return s
}

// Why is what broke the path before the current one.
func (l *Link) Why() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.why
}

// ID is the session's id.
func (l *Link) ID() wire.SessionID { return l.cfg.ID }
