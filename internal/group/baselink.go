package group

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// baseLink is one of a group's links and what the group keeps of it: its
// send queue (the requests outstanding, the streams that wait their turn),
// its pool of receives and who watches it (kick). Under the
// mux's lock, as every stream's state is: a stream moves between links
// with no lock of its own to hand over.
type baseLink struct {
	m       *Mux
	base    link.Carrier
	emptier link.Emptier // base, if it says when a Poll took all it had
	bc      link.Caps
	index   int           // the order it was added in, for names
	done    chan struct{} // closed by finishLocked
	// lastResort: a TCP link (Caps.Transport "tcp"). No stream opens on
	// it; streams move to it only when no other link works, and leave it
	// for the first that does, which then retires it (retireLastResortLocked).
	lastResort bool

	pool    int // its receives for streams (the rest are the group's)
	granted int // receives committed to its streams: credit held and receives taken

	// Sending: base requests outstanding, oldest first (fifo, head, n: a
	// ring of SendDepth), the base ID of the oldest, and who waits.
	fifo        []sent
	head, n     int
	firstID     uint64
	controls    int
	sinceSignal int
	// Data in flight (Config.LinkInFlight): the bytes of data writes
	// outstanding, the bytes posted since the last signaled request, and
	// the signaled requests outstanding, whose completions retire it.
	inFlight, sinceSignalData, signaledOut int
	// Streams with requests queued take turns, one request at a time, as
	// fq_codel's flows do: one that had nothing queued starts in fresh,
	// served before ready, and goes on in ready after its first turn
	// (staying there until a turn finds it empty, so that a stream that
	// posts one request at a time is fresh once a round, not always).
	// A stream that starts, moves or answers waits for no round of the
	// others' large writes.
	fresh, ready fifo[*Stream]
	queued       int                 // stream requests waiting in fresh and ready
	groupq       []wire.GroupMessage // group messages to post, before any stream's
	groupOut     int                 // this side's group requests unanswered on it
	groupWait    []wire.GroupMessage // requests waiting for groupOut to drop
	batch        []link.SendWR
	pumping      bool
	draining     bool
	cs           []link.Completion

	// movesWaiting are the peer's StreamMoves to this link that wait for
	// its receives (roomToMoveLocked), in order.
	movesWaiting []wire.GroupMessage
	streams      int   // streams on it now
	leaving      int   // of which leaving it for another link (rebalance.go)
	arriving     int   // streams leaving another link for this one
	regs         int   // rings of streams registered on it (made or shared)
	err          error // why it ended (nil while it works)
	closed       bool  // its base link was closed
	sent, hear   time.Time
	posted       uint64
	mostQueued   int
	// signals are the streams whose signals a leader's or the service's
	// drain deferred until it let go of the mux's lock (Mux.deferTo).
	signals []*Stream

	// Watching the base link (kick): whether a waiter leads (a stream's
	// Wait, an Open or an Accept: leadLocked), whether it sleeps in the
	// base link's Wait now (asleep: a signal to it must wake the base
	// link), the streams asleep in Wait on their cond that may lead next,
	// the service's kicks, and whether done was closed.
	leading   bool
	yields    bool // the leader stops leading once a stream's Wait follows
	asleep    bool
	followers []*Stream
	kicks     chan struct{} // the service's (capacity 1)
	serving   atomic.Bool   // a service goroutine runs
	quit      chan struct{} // closed by finishLocked: the service returns
	finished  bool
	// Resting (restLocked): the base link is left unarmed after a kick
	// while its streams poll it and none is armed. armedStreams: its
	// streams whose Arm no completion answered yet; polled: a stream's
	// Poll drained it since the last kick or rest timer; resting: it is
	// not armed; restTimer settles it once a rest timer's span passes
	// with no Poll (rested), restTimed: it is set.
	armedStreams int
	polled       bool
	resting      bool
	restTimed    bool
	restTimer    *time.Timer
}

// restDelay is how long a base link may rest unarmed with no stream
// polling it (rested), as connfd's armDelay for a connection's own link:
// a completion no stream polls is taken at most this late.
const restDelay = 2 * time.Millisecond

// sent is one base request outstanding.
type sent struct {
	s        *Stream // nil: a group message
	seq      uint64  // the stream's own sequence number of the request
	id       uint64  // the stream's ID for it
	signaled bool    // signaled at the stream
	control  bool
	based    bool   // signaled on the base link: its completion comes
	data     uint32 // a data write's bytes (Config.LinkInFlight)
}

func (l *baseLink) name() string { return l.bc.Name }

// Who watches the base link. A stream's Wait leads: it sleeps in the
// base link's Wait itself (Stream.leadLocked), so that the completion it
// waits for wakes its own goroutine and no other, as on a link of its own,
// and hands what it takes to the other streams. With no leader, the base
// link is left armed, and its notify function (kick) wakes the link's
// service goroutine, which takes what came and arms it again. Either way
// the base link is armed whenever nobody holds the mux's lock to drain it,
// so no completion goes untold.
//
// The service goroutine starts at a kick and ends after serviceLinger with
// none, so an idle group has no goroutine; it sleeps on a channel between
// kicks, not in the link's Wait. A goroutine started for each kick cost
// more than its work, growing its stack each time (17% of a host ping
// pong's CPU, in runtime.newstack).
const serviceLinger = 100 * time.Millisecond

// kick is the base link's notify function: a completion came, or the link
// ended, while no Wait ran on it. It must not block.
func (l *baseLink) kick() {
	select {
	case l.kicks <- struct{}{}:
	default: // a service has one to take already
	}
	if l.serving.CompareAndSwap(false, true) {
		go l.service()
	}
}

// service takes what the base link has and leaves it armed, at each kick,
// until none comes for serviceLinger or the link ends. A kick that finds
// it ending starts another, and both may serve: they take the mux's lock
// to do it.
func (l *baseLink) service() {
	var ws []wakeup
	idle := time.NewTimer(serviceLinger)
	defer idle.Stop()
	for {
		select {
		case <-l.kicks:
			ws = l.serve(ws)
			idle.Reset(serviceLinger)
			continue
		case <-idle.C:
		case <-l.quit:
		}
		l.serving.Store(false)
		// A kick that came before the Store started no service.
		select {
		case <-l.kicks:
			l.serve(ws)
		default:
		}
		return
	}
}

// serve is one kick's work: it takes what the base link has and arms it,
// or leaves it to rest (restLocked).
func (l *baseLink) serve(ws []wakeup) []wakeup {
	m := l.m
	m.mu.Lock()
	if l.usableLocked() {
		m.deferTo = l
		if !l.restLocked() {
			l.settleLocked()
		}
		ws = l.takeSignalsLocked(ws)
	}
	m.mu.Unlock()
	return give(ws)
}

// restLocked takes what the base link has and leaves it unarmed, if its
// streams poll it (a Poll drained it since the last kick) and none waits
// for an event (armedStreams), and reports whether it did. The streams
// take what comes as they poll, as a busy connection does on a link of its
// own (connfd's rest): an event would only wake the service for what a
// Poll takes anyway. A stream's Arm settles it again, and so does the rest
// timer once restDelay passes with no Poll.
func (l *baseLink) restLocked() bool {
	if !l.polled || l.armedStreams > 0 || l.leading {
		return false
	}
	l.polled = false
	l.drainLocked(true)
	if !l.usableLocked() || l.armedStreams > 0 {
		return false // the drain ended it, or a stream's call armed one
	}
	l.resting = true
	if !l.restTimed {
		l.restTimed = true
		if l.restTimer == nil {
			l.restTimer = time.AfterFunc(restDelay, l.rested)
		} else {
			l.restTimer.Reset(restDelay)
		}
	}
	return true
}

// rested is the rest timer: it settles a resting base link that no Poll
// drained for restDelay, or waits another restDelay.
func (l *baseLink) rested() {
	m := l.m
	m.mu.Lock()
	if l.resting && l.polled && l.usableLocked() {
		l.polled = false
		l.restTimer.Reset(restDelay)
		m.mu.Unlock()
		return
	}
	l.restTimed = false
	var ws []wakeup
	if l.resting && l.usableLocked() {
		m.deferTo = l
		l.settleLocked()
		ws = l.takeSignalsLocked(ws)
	}
	m.mu.Unlock()
	give(ws)
}

// usableLocked reports whether the base link and its group still work.
func (l *baseLink) usableLocked() bool { return l.err == nil && l.m.err == nil }

// settleLocked arms the base link and takes what came before the Arm: a
// completion after it raises an event, for the leader's Wait or kick.
func (l *baseLink) settleLocked() {
	if !l.usableLocked() {
		return
	}
	if err := l.base.Arm(); err != nil {
		l.downLocked(err)
		return
	}
	l.resting = false
	l.drainLocked(true)
}

// finishLocked closes done once the link (or the group) ended and no
// leader sleeps in its Wait: from then on nobody calls the base link
// without the mux's lock, and under it nobody calls a link that ended, so
// it may be closed.
func (l *baseLink) finishLocked() {
	if l.finished || l.usableLocked() || l.asleep {
		return
	}
	l.finished = true
	if l.restTimer != nil {
		l.restTimer.Stop()
	}
	l.base.SetNotify(nil)
	close(l.quit)
	close(l.done)
}

// leadableLocked reports whether a waiter may lead l: it works, and
// nobody leads it.
func (l *baseLink) leadableLocked() bool { return !l.leading && l.usableLocked() }

// leadLocked sleeps in l's Wait until done reports true or l ends, and
// takes each time what l has, for every stream on it: it arms l and then
// drains it (settleLocked), before it sleeps and after each wake-up, so
// that when it stops leading, l is left armed (kick's watch); and then a
// follower, if any, is woken to lead. The mux's lock is let go while it
// sleeps and while it gives the streams their signals (ws: the caller's
// scratch). Whatever makes done true must wake l's Wait (a stream's
// wakeLeaderLocked, a completion, the link's end), unless done is the
// leader's own drain's doing. A leader that yields (an Open or an Accept)
// stops leading once a stream's Wait follows, and hands it the lead: a
// listener's Accept, which waits for as long as the listener lives, must
// not make every stream's wake-up two.
func (l *baseLink) leadLocked(done func() bool, yield bool, scratch *[]wakeup) {
	m := l.m
	l.leading, l.yields = true, yield
	ws := (*scratch)[:0]
	m.deferTo = l
	l.settleLocked()
	rested := false
	for {
		if ws = l.takeSignalsLocked(ws); len(ws) > 0 {
			m.mu.Unlock()
			ws = give(ws)
			m.mu.Lock()
		}
		if done() || !l.usableLocked() || yield && (len(l.followers) > 0 || rested) {
			break
		}
		l.asleep = true
		m.mu.Unlock()
		err := l.base.Wait()
		m.mu.Lock()
		l.asleep = false
		if err != nil && !errors.Is(err, link.ErrWoken) {
			l.downLocked(err)
		}
		m.deferTo = l
		if yield {
			// An Open or an Accept woken by its streams' completions
			// while they poll l: l rests, as a service would let it
			// (the streams take what comes as they poll), and the waiter
			// waits on its channel, told by whichever drain takes its
			// answer. Leading on would arm l again: an event, and this
			// goroutine's wake-up, for every completion the streams poll.
			l.leading = false
			rested = l.restLocked()
			l.leading = true
		}
		if !rested {
			l.settleLocked()
		}
	}
	l.leading, l.yields = false, false
	*scratch = ws
	l.finishLocked()
	l.handLeadLocked()
}

// pollLocked polls l until done reports true, l ends or spin passes,
// yielding the CPU between polls and letting go of the mux's lock meanwhile.
// It neither arms l nor leaves it unwatched: l stays armed, or resting
// with its timer, as it was; each poll counts as a stream's (polled), so
// that a kick while it polls lets l rest rather than arming it again.
func (l *baseLink) pollLocked(done func() bool, spin time.Duration) {
	m := l.m
	for end := time.Now().Add(spin); !done() && l.usableLocked(); {
		l.polled = true
		l.drainLocked(false)
		if done() || !time.Now().Before(end) {
			return
		}
		m.mu.Unlock()
		runtime.Gosched()
		m.mu.Lock()
	}
}

// handLeadLocked wakes a stream that waits on l to lead, when l has no
// leader: the next completion then wakes one goroutine, not kick's and
// then the stream's.
func (l *baseLink) handLeadLocked() {
	if !l.leadableLocked() || len(l.followers) == 0 {
		return
	}
	s := l.followers[len(l.followers)-1]
	s.unfollowLocked()
	s.cond.Broadcast()
}

// drainLocked hands the completions the base link has to their streams,
// then posts what waits. With full it polls until a poll finds nothing,
// or the link says it took all it had (link.Emptier), as a drain after an
// Arm must: what came before the Arm raises no event. Otherwise it stops
// at a poll that comes back short, which saves a poll of an empty queue
// when nothing relies on it (a Read that polls).
func (l *baseLink) drainLocked(full bool) {
	if l.draining || l.err != nil {
		return // a stream's call from within a completion: the drain goes on after it
	}
	l.draining = true
	defer func() { l.draining = false }()
	if l.cs == nil {
		l.cs = make([]link.Completion, 64)
	}
	for l.m.err == nil && l.err == nil {
		k, err := l.base.Poll(l.cs)
		if err != nil {
			l.downLocked(err)
			break
		}
		if k == 0 {
			break
		}
		for i := range k {
			l.completeLocked(&l.cs[i])
		}
		clear(l.cs[:k])
		if k < len(l.cs) && (!full || l.emptier != nil && l.emptier.Emptied()) {
			break
		}
	}
	l.pumpLocked()
}

// completeLocked takes one completion of the base link.
func (l *baseLink) completeLocked(c *link.Completion) {
	m := l.m
	switch c.Kind {
	case link.SendDone:
		l.sent = time.Now()
		l.retireLocked(c.ID)
	case link.DataArrived:
		l.hear = time.Now()
		s, err := m.streamLocked(wire.StreamTag(c.Tag))
		if err == nil && s.peerDone() {
			err = fmt.Errorf("stream %#x after its peer's close", c.Tag)
		}
		if err != nil {
			m.protocolLocked(l, fmt.Errorf("data write: %w", err))
			return
		}
		if s.l != l || s.leaving {
			l.repostLocked(1) // a write the peer sent before it moved the stream
			return
		}
		s.arriveLocked(link.Completion{Kind: link.DataArrived, N: c.N})
	case link.ControlArrived:
		l.hear = time.Now()
		tag := wire.StreamOf(&c.Msg)
		if tag == 0 {
			l.groupMessageLocked(&c.Msg)
			return
		}
		s, err := m.streamLocked(tag)
		if err == nil && s.peerDone() {
			err = fmt.Errorf("stream %#x after its peer's close", uint32(tag))
		}
		if err != nil {
			m.protocolLocked(l, fmt.Errorf("control message: %w", err))
			return
		}
		if wire.IsGroupOp(wire.Opcode(uint16(c.Msg[0])<<8 | uint16(c.Msg[1]))) {
			m.protocolLocked(l, fmt.Errorf("a group message names stream %#x", uint32(tag)))
			return
		}
		if s.l != l || s.leaving {
			l.repostLocked(1)
			return
		}
		msg := c.Msg
		wire.SetStream(&msg, 0)
		s.snoopLocked(&msg)
		s.arriveLocked(link.Completion{Kind: link.ControlArrived, Msg: msg})
	case link.Disconnected:
		l.downLocked(disconnected{fmt.Errorf("%w: %s disconnected", ErrDown, l.name())})
	case link.Failed:
		l.downLocked(fmt.Errorf("%w: %w", ErrDown, c.Err))
	default:
		l.downLocked(fmt.Errorf("%w: %s: completion %v", ErrDown, l.name(), c.Kind))
	}
}

// repostLocked gives back n receives that messages took and no stream keeps.
func (l *baseLink) repostLocked(n int) {
	if n > 0 && l.err == nil && l.m.err == nil {
		if err := l.base.PostRecv(n); err != nil {
			l.downLocked(err)
		}
	}
}

// retireLocked ends the base requests up to id, whose SendDone came.
func (l *baseLink) retireLocked(id uint64) {
	for l.n > 0 && l.firstID <= id {
		e := l.fifo[l.head]
		l.fifo[l.head] = sent{}
		l.head = (l.head + 1) % len(l.fifo)
		l.n--
		l.firstID++
		if e.control {
			l.controls--
		}
		l.inFlight -= int(e.data)
		if e.based {
			l.signaledOut--
		}
		if s := e.s; s != nil && s.l == l {
			s.inflight--
			if s.leaving {
				// Its engine starts afresh on the link it goes to.
				if s.inflight == 0 {
					s.leftLocked()
				}
				continue
			}
			if e.signaled {
				s.pushLocked(link.Completion{Kind: link.SendDone, ID: e.id}, e.seq)
			}
			s.settleLocked()
		}
	}
}

// sendGroupLocked sends a group message: an answer at once, a request when
// fewer than groupRequests are unanswered.
func (l *baseLink) sendGroupLocked(g wire.GroupMessage) {
	if isRequest(g.Op) {
		if l.groupOut >= groupRequests {
			l.groupWait = append(l.groupWait, g)
			return
		}
		l.groupOut++
	}
	l.groupq = append(l.groupq, g)
	l.pumpLocked()
}

func isRequest(op wire.Opcode) bool {
	return op == wire.OpStreamOpen || op == wire.OpStreamClose || op == wire.OpStreamMove
}

// answeredLocked: the peer answered one of this side's requests.
func (l *baseLink) answeredLocked() error {
	if l.groupOut == 0 {
		return errors.New("an answer to no request")
	}
	l.requestDoneLocked()
	return nil
}

// requestDoneLocked frees a request's place among the groupRequests: the
// first request waiting for one takes it.
func (l *baseLink) requestDoneLocked() {
	l.groupOut--
	if len(l.groupWait) > 0 {
		l.groupq = append(l.groupq, l.groupWait[0])
		l.groupWait = l.groupWait[1:]
		l.groupOut++
	}
}

// pumpLocked posts what waits, in one batch, while the base link has room:
// the group's messages first, then the streams' requests, one from each
// stream in turn. A group message that waits for a control slot holds the
// streams back too: an accepted (or moved) stream's first message must not
// overtake its StreamAccept (StreamMoved).
func (l *baseLink) pumpLocked() {
	if l.m.err != nil || l.err != nil || l.pumping {
		return
	}
	l.pumping = true
	defer func() { l.pumping = false }()
	l.batch = l.batch[:0]
	for l.n < len(l.fifo) {
		if len(l.groupq) > 0 {
			if l.controls >= l.bc.ControlDepth {
				break
			}
			l.postGroupLocked()
			continue
		}
		if !l.roundLocked() {
			break
		}
	}
	if len(l.batch) == 0 {
		return
	}
	l.posted += uint64(len(l.batch))
	if err := l.base.PostSend(l.batch); err != nil {
		l.downLocked(err)
	}
	clear(l.batch)
}

// postGroupLocked posts the first group message waiting.
func (l *baseLink) postGroupLocked() {
	m := l.m
	g := l.groupq[0]
	l.groupq = l.groupq[1:]
	var wr link.SendWR
	wr.Kind, wr.Signaled = link.SendControl, true
	g.Encode(&wr.Msg)
	l.postLocked(wr, sent{control: true})
	m.stats.GroupMessages++
	if g.Op != wire.OpStreamAccept && (g.Op != wire.OpStreamMoved || g.Reason != wire.ReasonNone) {
		return
	}
	// The stream's own requests may follow now.
	if s, err := m.streamLocked(g.From); err == nil && s.l == l {
		s.announced = true
		l.readyLocked(s)
	}
}

// readyLocked puts a stream with requests queued in the turn, once the
// peer knows it on this link.
func (l *baseLink) readyLocked(s *Stream) {
	if s.queued.len() > 0 && !s.inReady && s.announced {
		s.inReady = true
		l.fresh.push(s)
	}
}

// unreadyLocked takes s, which leaves l, out of l's turns: its place
// there would keep it from taking turns on the link it goes to
// (readyLocked), since a stream stays in the round with nothing queued.
func (l *baseLink) unreadyLocked(s *Stream) {
	if !s.inReady {
		return
	}
	is := func(x *Stream) bool { return x == s }
	l.fresh.deleteFunc(is)
	l.ready.deleteFunc(is)
	s.inReady = false
}

// roundLocked posts one request of each stream that has one, in turn
// (fresh ones first), as long as the base link has room; false if it
// posted nothing. A stream whose next request is a control message with
// no control slot free, or a StreamClose with too many group requests
// out, waits its next turn.
func (l *baseLink) roundLocked() bool {
	posted, full := l.turnsLocked(&l.fresh)
	if !full {
		p, _ := l.turnsLocked(&l.ready)
		posted = posted || p
	}
	return posted
}

// turnsLocked gives each stream in list its turn; full reports that the
// base link has no room for more now.
func (l *baseLink) turnsLocked(list *fifo[*Stream]) (posted, full bool) {
	for range list.len() {
		if l.n >= len(l.fifo) || len(l.groupq) > 0 {
			return posted, true
		}
		s := *list.front()
		if s.queued.len() == 0 || s.l != l {
			list.pop()
			s.inReady = false
			continue
		}
		q := s.queued.front()
		if l.overFlightLocked(q) {
			// It keeps its place: the first in line when data completes.
			return posted, true
		}
		list.pop()
		switch {
		case q.close != 0:
			// The stream's failure, told the peer in its order: after
			// every request it posted before.
			l.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamClose, To: s.peer, From: s.tag, Reason: q.close})
			s.closeSent = true
		case q.wr.Kind == link.SendControl && l.controls >= l.bc.ControlDepth:
			l.ready.push(s)
			continue
		default:
			e := sent{s: s, seq: q.seq, id: q.wr.ID, signaled: q.wr.Signaled, control: q.wr.Kind == link.SendControl}
			if q.wr.Kind == link.SendData {
				e.data = q.wr.N
			}
			l.postLocked(q.wr, e)
			s.inflight++
		}
		posted = true
		s.queued.pop()
		l.queued--
		switch {
		case list == &l.fresh:
			l.ready.push(s) // in the round now, even if it has nothing more
			if s.queued.len() == 0 {
				s.settleLocked()
			}
		case s.queued.len() > 0:
			l.ready.push(s)
		default:
			s.inReady = false
			s.settleLocked()
		}
	}
	return posted, false
}

// overFlightLocked reports whether q, a data write, must wait for data in
// flight to complete (Config.LinkInFlight). It does not if no signaled
// request is outstanding: no completion would come to retire the data.
func (l *baseLink) overFlightLocked(q *queuedWR) bool {
	limit := l.m.cfg.LinkInFlight
	return limit > 0 && q.close == 0 && q.wr.Kind == link.SendData &&
		l.signaledOut > 0 && l.inFlight+int(q.wr.N) > limit
}

// postLocked adds one request to the batch, with the base ID that names it
// in the fifo. A request the stream did not signal is signaled anyway
// every half send queue, so that the base queue never fills with requests
// nothing retires.
func (l *baseLink) postLocked(wr link.SendWR, e sent) {
	l.sinceSignal++
	l.inFlight += int(e.data)
	l.sinceSignalData += int(e.data)
	limit := l.m.cfg.LinkInFlight
	if e.control || e.signaled || l.sinceSignal >= len(l.fifo)/2 ||
		limit > 0 && (l.sinceSignalData >= limit/4 || l.inFlight > limit/2) {
		// Data in flight is signaled often enough that its completions
		// make room before the bound is reached.
		wr.Signaled = true
		l.sinceSignal, l.sinceSignalData = 0, 0
	}
	if wr.Signaled {
		e.based = true
		l.signaledOut++
	}
	wr.ID = l.firstID + uint64(l.n)
	l.fifo[(l.head+l.n)%len(l.fifo)] = e
	l.n++
	if e.control {
		l.controls++
	}
	l.batch = append(l.batch, wr)
}

// groupMessageLocked takes one of the group's own messages.
func (l *baseLink) groupMessageLocked(b *[wire.MessageSize]byte) {
	m := l.m
	l.repostLocked(1) // the group's receives are reserved, not credited
	g, err := wire.DecodeGroup(b)
	if err != nil {
		m.protocolLocked(l, err)
		return
	}
	switch g.Op {
	case wire.OpStreamOpen:
		m.openedByPeerLocked(l, g)
	case wire.OpStreamAccept, wire.OpStreamRefuse:
		if err := l.answeredLocked(); err != nil {
			m.protocolLocked(l, fmt.Errorf("%v: %w", g.Op, err))
			return
		}
		s, err := m.streamLocked(g.To)
		if err != nil || s.state != opening || s.l != l {
			m.protocolLocked(l, fmt.Errorf("%v for %#x, which opens nothing here", g.Op, uint32(g.To)))
			return
		}
		if g.Op == wire.OpStreamRefuse {
			s.state = refused
			s.openErr = &RefusedError{Reason: g.Reason}
			s.peerClosed = true
			s.openedLocked()
			if s.abandoned {
				s.closed = true // its opener gave up: nobody else will close it
			}
			m.maybeFreeLocked(s)
			return
		}
		s.acceptedLocked(g)
		s.announced = true
		s.openedLocked()
		if s.abandoned {
			s.disconnectLocked()
			s.closed = true
		}
	case wire.OpStreamClose:
		s, err := m.streamLocked(g.To)
		if err != nil || s.peer != g.From || s.state != open || s.peerClosed {
			m.protocolLocked(l, fmt.Errorf("StreamClose for %#x from %#x: %v", uint32(g.To), uint32(g.From), err))
			return
		}
		if s.l != l {
			m.protocolLocked(l, fmt.Errorf("StreamClose for %#x on a link it is not on", uint32(g.To)))
			return
		}
		s.peerClosed = true
		s.disconnecting = true
		s.dropQueuedLocked()
		l.unsendCloseLocked(s)
		if g.Reason == wire.ReasonNone {
			s.terminateLocked(link.Completion{Kind: link.Disconnected})
		} else {
			s.terminateLocked(link.Completion{Kind: link.Failed, Err: reasonError(g.Reason, "the peer")})
		}
		l.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamClosed, To: g.From, From: s.tag})
		m.maybeFreeLocked(s)
	case wire.OpStreamClosed:
		if err := l.answeredLocked(); err != nil {
			m.protocolLocked(l, fmt.Errorf("StreamClosed: %w", err))
			return
		}
		s, err := m.streamLocked(g.To)
		if err != nil || !s.closeSent || s.closeAnswered || s.peer != g.From || s.l != l {
			m.protocolLocked(l, fmt.Errorf("StreamClosed for %#x, which sent no StreamClose here", uint32(g.To)))
			return
		}
		s.closeAnswered = true
		m.maybeFreeLocked(s)
	case wire.OpStreamMove:
		m.moveAskedLocked(l, g)
	case wire.OpStreamMoved:
		if err := l.answeredLocked(); err != nil {
			m.protocolLocked(l, fmt.Errorf("StreamMoved: %w", err))
			return
		}
		m.movedLocked(l, g)
	}
}

// unsendCloseLocked takes back a StreamClose of s's that waits to be
// posted, when the peer's StreamClose came first: the answer this side
// sends to it is an answer, posted before any waiting request, and once
// the peer has it the peer gives the slot back, so a StreamClose after it
// would name a stream that is not open. The peer's close ends the stream
// for both sides; only one that already went is answered.
func (l *baseLink) unsendCloseLocked(s *Stream) {
	if !s.closeSent {
		return
	}
	isMine := func(g wire.GroupMessage) bool { return g.Op == wire.OpStreamClose && g.From == s.tag }
	if i := slices.IndexFunc(l.groupWait, isMine); i >= 0 {
		l.groupWait = slices.Delete(l.groupWait, i, i+1)
		s.closeSent = false
		return
	}
	if i := slices.IndexFunc(l.groupq, isMine); i >= 0 {
		l.groupq = slices.Delete(l.groupq, i, i+1)
		s.closeSent = false
		l.requestDoneLocked() // it had its place
	}
}

// downLocked ends the link: its streams move to another link of the
// group (moveLocked), or, where the group does not move streams, the group
// ends with it.
func (l *baseLink) downLocked(err error) {
	m := l.m
	if l.err != nil || m.err != nil {
		return
	}
	if m.cfg.MoveTimeout <= 0 {
		m.endLocked(err)
		return
	}
	l.err = err
	// A TCP link retired (by this side, or disconnected by the peer's
	// with no stream on it) did not fail.
	if err != errRetired && !(l.lastResort && l.streams == 0 && Disconnected(err)) {
		m.stats.LinksDown++
	}
	l.base.Disconnect()
	l.base.Wake() // a leader may sleep on a link that says nothing more
	l.ready.reset()
	l.fresh.reset()
	l.queued, l.groupq, l.groupWait, l.movesWaiting = 0, nil, nil, nil
	l.fifo, l.n = nil, 0
	l.granted = 0
	for _, s := range m.slots {
		if s != nil && s.l == l {
			s.stopLeavingLocked()
			s.suspendLocked(err)
		}
	}
	l.finishLocked()
	l.maybeCloseLocked()
	m.afterLinkDownLocked(err)
	// Only while the group goes on: a group that ended with its last
	// link (its peer closed it) has no path to make a link on again.
	if m.cfg.OnLinkDown != nil && m.err == nil {
		go m.cfg.OnLinkDown(l.base, err)
	}
}

// maybeCloseLocked closes a link that ended once no stream is on it or
// holds a ring registered on it, and no leader sleeps in its Wait (done). The link
// holds the memory of the rings it made, which streams that moved away
// still use.
func (l *baseLink) maybeCloseLocked() {
	m := l.m
	if l.closed || l.err == nil || l.streams > 0 || l.regs > 0 || m.err != nil {
		return
	}
	l.closed = true
	m.links = slices.DeleteFunc(m.links, func(x *baseLink) bool { return x == l })
	go func() {
		<-l.done
		l.base.Close()
	}()
}
