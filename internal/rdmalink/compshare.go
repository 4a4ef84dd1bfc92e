package rdmalink

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/verbs"
)

// Completion events: one completion channel per device context, shared by
// every link on it (one descriptor and its netpoller duplicate, not two a
// connection), and the device's completion queues on it, each shared by
// many links (cqshare.go).
//
// Reading the channel is a role, passed as a token: a link's Wait that
// finds it free reads the channel, parked in the netpoller, until its own
// completions come (it returns at once, with no hand-off: the common case
// of one busy connection) or it is woken. The reader of a queue's event
// polls the queue and moves each completion to its link, telling those
// that armed; when it told others and has nothing of its own, it gives the
// role up, so the role moves to where completions are wanted: a told link
// takes it with its next Wait, and meanwhile any other link waiting takes
// it.
//
// Once no link has waited for dispatchLinger, the device's one dispatcher
// goroutine holds the role (dispatch): an event for a link that nobody
// waits on calls the link's notify function (link.Link's SetNotify), so an
// idle connection needs no goroutine of its own. The dispatcher gives the
// role up as soon as a link's Wait wants it: a blocked Read or Write reads
// its own events, with no hand-off.
type compShare struct {
	key  any                // the device context (verbs.Context.Raw)
	vch  *verbs.CompChannel // what the queues are made on
	ch   compChannel        // vch, or a test's fake
	role chan struct{}      // holds the token while nobody reads ch (capacity 1)

	mu     sync.Mutex
	reader *Link                   // the link whose Wait reads ch now, or nil
	cqs    map[*verbs.CQ]*sharedCQ // the queues on the channel
	refs   int                     // links on the channel (resources)

	// qmu: a link joins or leaves a queue (cqshare.go); guards queues.
	qmu    sync.Mutex
	queues []*sharedCQ

	// The dispatcher (dispatch), when started: it reads ch once waits has
	// been zero for a linger, with no Wait ended in that time (waitsEnded
	// counts them). dispatching: it reads now; idle: waits fell to zero;
	// stop and stopped: release ends it. err: ch failed, for every Wait
	// after. takes counts the dispatcher's reads of ch (tests).
	waits       int
	waitsEnded  uint64
	linger      time.Duration
	takes       int
	dispatching bool
	idle        chan struct{} // capacity 1
	stop        chan struct{}
	stopped     chan struct{}
	err         error
}

// compChannel is what a compShare waits on: a *verbs.CompChannel.
type compChannel interface {
	Wait(ctx context.Context) (*verbs.CQ, error)
	SetDeadline(t time.Time) error
	Close() error
}

// newCompShare makes the share of ch, with the role free.
func newCompShare(key any, ch compChannel) *compShare {
	s := &compShare{key: key, ch: ch, role: make(chan struct{}, 1), cqs: make(map[*verbs.CQ]*sharedCQ), linger: dispatchLinger}
	s.role <- struct{}{}
	return s
}

// compShares are the process's shared channels, by device context.
var compShares = struct {
	mu sync.Mutex
	m  map[any]*compShare
}{m: make(map[any]*compShare)}

// acquireCompShare returns ctx's shared channel with one more reference,
// making it if there is none.
func acquireCompShare(ctx *verbs.Context) (*compShare, error) {
	compShares.mu.Lock()
	defer compShares.mu.Unlock()
	key := ctx.Raw()
	s := compShares.m[key]
	if s == nil {
		ch, err := ctx.NewCompChannel()
		if err != nil {
			return nil, err
		}
		s = newCompShare(key, ch)
		s.vch = ch
		s.startDispatcher()
		compShares.m[key] = s
	}
	s.refs++
	return s, nil
}

// release drops a reference, after its link left its queue; the last one
// destroys the channel (which needs every queue on it gone).
func (s *compShare) release() {
	compShares.mu.Lock()
	defer compShares.mu.Unlock()
	s.refs--
	if s.refs == 0 {
		delete(compShares.m, s.key)
		s.stopDispatcher()
		s.ch.Close()
	}
}

// wait is the Wait of l: it returns nil once completions of l's came,
// link.ErrWoken once l was woken (Wake, or the link's end), or the error
// of a channel that failed.
func (s *compShare) wait(l *Link) error {
	s.mu.Lock()
	s.waits++
	if s.dispatching {
		s.ch.SetDeadline(time.Unix(1, 0)) // the dispatcher gives the role up
	}
	err := s.err
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.waitsEnded++
		if s.waits--; s.waits == 0 {
			notify(s.idle)
		}
		s.mu.Unlock()
	}()
	if err != nil {
		return err
	}
	for {
		if l.takeWoken() {
			return link.ErrWoken
		}
		select {
		case <-l.events:
			return nil
		case <-l.wakes:
			// takeWoken says whether the wake-up still stands.
		case <-s.role:
			// An event that another reader handed over while this Wait
			// chose the role (select picks at random among ready cases)
			// is not on the channel any more: reading it would sleep
			// past it.
			select {
			case <-l.events:
				s.role <- struct{}{}
				return nil
			default:
			}
			if done, err := s.read(l); done {
				return err
			}
		}
	}
}

// read reads the channel as l's Wait, holding the role, and gives the role
// back when it returns: done with nil when completions of l's came, done
// with an error when the channel or a queue failed, not done when l was
// woken (wait then says so) or other links were told of theirs.
func (s *compShare) read(l *Link) (done bool, err error) {
	s.mu.Lock()
	s.reader = l
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.reader = nil
		s.ch.SetDeadline(time.Time{}) // a wake-up of l's that came late
		s.mu.Unlock()
		s.role <- struct{}{}
	}()
	for !l.isWoken() {
		cq, err := s.ch.Wait(context.Background())
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			// Wake's doing: the loop sees l woken.
			s.mu.Lock()
			s.ch.SetDeadline(time.Time{})
			s.mu.Unlock()
			continue
		case err != nil:
			return true, err
		}
		s.mu.Lock()
		q := s.cqs[cq]
		s.mu.Unlock()
		if q == nil {
			continue // the queue is gone: its event concerns nobody
		}
		mine, told, err := q.event(l)
		switch {
		case err != nil || mine:
			return true, err
		case told:
			return false, nil
		}
	}
	return false, nil
}

// wake ends l's read of the channel, if it is reading; l is marked woken
// already, so a read that starts after this sees it.
func (s *compShare) wake(l *Link) {
	s.mu.Lock()
	if s.reader == l {
		s.ch.SetDeadline(time.Unix(1, 0))
	}
	s.mu.Unlock()
}

// startDispatcher starts the goroutine that reads the channel while no
// link waits.
func (s *compShare) startDispatcher() {
	s.idle = make(chan struct{}, 1)
	s.stop, s.stopped = make(chan struct{}), make(chan struct{})
	go s.dispatch()
}

// stopDispatcher ends the dispatcher, if it was started, and waits for it.
func (s *compShare) stopDispatcher() {
	if s.stop == nil {
		return
	}
	s.mu.Lock()
	close(s.stop)
	s.ch.SetDeadline(time.Unix(1, 0))
	s.mu.Unlock()
	<-s.stopped
}

// dispatchLinger is how long the device's links must have gone without a
// Wait ending before the dispatcher takes the role; while they are busy
// it looks once a linger, whatever the number of Waits. While the links
// wait again within it (a connection answering requests one at a time),
// a Wait finds the role free and nothing is handed back and forth, and
// the dispatcher sleeps: taking the role at once, and being woken at
// every Wait's end, cost a wake-up of the dispatcher and its giving the
// role back at every Wait, two more threads to run a round trip, which
// on the lab's two emulated CPUs made a third to a half of a 64 B round
// trip's wake-ups wait for the scheduler's next tick (docs/lab.md).
// Meanwhile an event for a link that nobody waits on stays on the channel
// for the next Wait's read, or the dispatcher's: its notify function is
// called at most two lingers late.
const dispatchLinger = 5 * time.Millisecond

// dispatch takes the role once no link's Wait has run or ended for a
// linger, and reads the channel until one wants it (dispatchRead).
func (s *compShare) dispatch() {
	defer close(s.stopped)
	// Reset before each use: since Go 1.23 it drops a firing not received.
	quiet := time.NewTimer(s.linger)
	defer quiet.Stop()
	var seen uint64 // waitsEnded at the last look
	for {
		s.mu.Lock()
		waits, ended := s.waits, s.waitsEnded
		s.mu.Unlock()
		switch {
		case ended != seen:
			// Waits ended since the last look: look again in a linger.
			seen = ended
			quiet.Reset(s.linger)
			select {
			case <-quiet.C:
			case <-s.stop:
				return
			}
		case waits > 0:
			// A Wait reads the channel, and none ended for a linger: sleep
			// until the waits end (idle), not a linger at a time.
			select {
			case <-s.idle:
			case <-s.stop:
				return
			}
		default:
			select {
			case <-s.role:
			case <-s.stop:
				return
			}
			if !s.dispatchRead() {
				return
			}
		}
	}
}

// dispatchRead reads the channel holding the role, handing each event to
// its link (arrived), until a link's Wait wants the role (true) or the
// dispatcher is stopped or the channel fails (false); it gives the role
// back.
func (s *compShare) dispatchRead() bool {
	defer func() { s.role <- struct{}{} }()
	for {
		s.mu.Lock()
		s.ch.SetDeadline(time.Time{})
		stopped := false
		select {
		case <-s.stop:
			stopped = true
		default:
		}
		if s.waits > 0 || stopped {
			s.dispatching = false
			s.mu.Unlock()
			return !stopped
		}
		s.dispatching = true
		s.takes++
		s.mu.Unlock()
		cq, err := s.ch.Wait(context.Background())
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue // a Wait wants the role, or the stop
		case err != nil:
			s.failed(err)
			return false
		}
		s.mu.Lock()
		q := s.cqs[cq]
		s.mu.Unlock()
		if q != nil {
			q.event(nil) // a queue that fails tells its links
		}
	}
}

// failed records that the channel failed: every link's Wait returns err
// from now on, and the links nobody waits on are told.
func (s *compShare) failed(err error) {
	s.mu.Lock()
	s.err, s.dispatching = err, false
	s.mu.Unlock()
	s.qmu.Lock()
	var links []*Link
	for _, q := range s.queues {
		links = append(links, q.links()...)
	}
	s.qmu.Unlock()
	for _, l := range links {
		l.Wake()
		l.tell()
	}
}

// notify wakes a waiter without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
