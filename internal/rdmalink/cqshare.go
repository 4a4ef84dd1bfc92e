package rdmalink

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/rdmanet/sdk/verbs"
)

// Shared completion queues: the queue pairs of many links on a device
// complete on one queue (as nvmet-rdma's do), instead of one queue a link.
//
// A queue pair joins a queue only with its worst case reserved: every
// request it may have outstanding, sends and receives, since a queue pair
// in error flushes all of them, signaled or not, and an overrun kills
// every queue pair on the queue. The receives of a shared receive queue
// are reserved once on each queue its queue pairs complete on, not once a
// queue pair (cqNeed): they cannot complete more than it has posted, and a
// peer that sends beyond its credit takes them from its neighbours, not
// from the completion queue. A device whose queues are full adds a
// queue (iWARP devices cannot resize one); a queue goes with its last
// link.
//
// A work request's id names its link's slot in the queue and the slot's
// generation (wrID), so a completion reaches its link by index, and one of
// a link that has left (an older generation) is dropped. Whoever polls the
// queue (a link's Poll, or the reader of the device's channel) takes
// everything on it and moves each completion to its link's own small
// queue (pending), never under a connection's lock; a link that armed and
// has not been told yet is told (arrived). A link's Poll then takes its own
// completions from there.
//
// A leaving link's queue pair is destroyed first, so no completion of its
// can come after; the queue is then polled empty (its completions left in
// the queue are dropped with its generation), and only then is its
// reservation given back. So the sum of the reservations bounds what the
// queue may hold, and the end of a link is still "nothing of it is left":
// its pending completions taken, and the queue polled empty since its end
// was recorded.

// completionQueue is what a sharedCQ polls and arms: a *verbs.CQ, or a
// test's fake.
type completionQueue interface {
	Poll(wcs []verbs.WorkCompletion) (int, error)
	RequestNotify(solicitedOnly bool) error
}

// sharedCQ is one completion queue that many links' queue pairs use.
type sharedCQ struct {
	vcq  *verbs.CQ // nil in tests
	cq   completionQueue
	size int

	// mu: one poller at a time; guards members, free, reserved, err and wcs.
	mu       sync.Mutex
	members  []cqMember
	free     []uint32          // free slots in members
	byQPN    map[uint32]uint32 // the slot of each queue pair on a shared receive queue, by number
	reserved int               // what the members may have on the queue at worst
	// recvQueues counts the members on each shared receive queue (by
	// id): its receives are reserved while any is on the queue.
	recvQueues map[uint32]int
	err        error  // polling failed: the queue is unusable
	gone       bool   // its last link left: it is destroyed, and an event read late polls nothing
	told       uint64 // links told of their completions, ever
	wcs        [pollBatch]verbs.WorkCompletion

	// armedLinks counts the links that armed (Link.Arm) and were not told
	// of a completion since; notifying: the queue is armed, an event is on
	// its way for the next completion.
	armedLinks atomic.Int32
	notifying  atomic.Bool
}

// cqMember is a slot of a shared queue: its link (nil while the link is
// being made, and after it left) and the slot's generation.
type cqMember struct {
	link *Link
	gen  uint32
}

// wr_id layout. Every work request's id carries its link's slot and the
// slot's generation, and an index: a receive's slot in the control buffer,
// or a send's place in the link's table of the engine's ids (Link.sendIDs).
//
// A receive of a shared receive queue (wrShared, sharedrecv.go) names the
// queue and its slot instead, and reaches its link by the queue pair
// number the completion gives.
const (
	wrRecv      = 1 << 63
	wrShared    = 1 << 62
	wrSlotShift = 43
	wrSlotBits  = 19 // half a million links a queue
	wrGenShift  = 32
	wrGenBits   = 11
	wrIndexMask = 1<<32 - 1
	// A shared receive's queue id: the bits between the index and wrShared.
	wrSharedIDMask = 1<<30 - 1
)

// wrTag is the part of every id of slot's link of generation gen.
func wrTag(slot, gen uint32) uint64 {
	return uint64(slot)<<wrSlotShift | uint64(gen&(1<<wrGenBits-1))<<wrGenShift
}

// wrSlot and wrGen read an id's slot and generation.
func wrSlot(id uint64) uint32 { return uint32(id>>wrSlotShift) & (1<<wrSlotBits - 1) }
func wrGen(id uint64) uint32  { return uint32(id>>wrGenShift) & (1<<wrGenBits - 1) }

// errQueueFull: no slot is left in a queue (it has a million links).
var errQueueFull = errors.New("rdmanet: the completion queue has no slot left")

// newSharedCQ is a queue of size entries over cq.
func newSharedCQ(cq completionQueue, size int) *sharedCQ {
	return &sharedCQ{cq: cq, size: size}
}

// cqNeed is what a queue pair may put on its completion queue at worst:
// its own requests, and the receives of the shared receive queue it takes
// them from, if any (recvEntries receives, of the queue recvQueue).
type cqNeed struct {
	entries     int
	recvQueue   uint32
	recvEntries int
}

// moreLocked is what need adds to q's reservation: its entries, and its shared
// receive queue's unless another member holds them already.
func (q *sharedCQ) moreLocked(need cqNeed) int {
	if need.recvEntries > 0 && q.recvQueues[need.recvQueue] == 0 {
		return need.entries + need.recvEntries
	}
	return need.entries
}

// take reserves need and a slot, if the queue has room: the slot's link is
// set by attach.
func (q *sharedCQ) take(need cqNeed) (slot, gen uint32, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	more := q.moreLocked(need)
	if q.err != nil || q.gone || q.size-q.reserved < more {
		return 0, 0, false
	}
	if n := len(q.free); n > 0 {
		slot, q.free = q.free[n-1], q.free[:n-1]
	} else {
		if len(q.members) >= 1<<wrSlotBits {
			return 0, 0, false
		}
		slot = uint32(len(q.members))
		q.members = append(q.members, cqMember{})
	}
	q.reserved += more
	if need.recvEntries > 0 {
		if q.recvQueues == nil {
			q.recvQueues = make(map[uint32]int)
		}
		q.recvQueues[need.recvQueue]++
	}
	return slot, q.members[slot].gen, true
}

// attach makes l the link of slot: its completions reach it from now on.
// A link on a shared receive queue gives its queue pair's number (qpn),
// which its receives' completions carry; others give 0.
func (q *sharedCQ) attach(slot uint32, l *Link, qpn uint32) {
	q.mu.Lock()
	q.members[slot].link = l
	if qpn != 0 {
		if q.byQPN == nil {
			q.byQPN = make(map[uint32]uint32)
		}
		q.byQPN[qpn] = slot
	}
	q.mu.Unlock()
}

// leave gives back slot and its reservation, need, once the
// queue pair that used them is destroyed: the queue is polled empty first,
// so that none of its completions is left on the queue. It reports how
// many links remain.
func (q *sharedCQ) leave(slot uint32, need cqNeed) (remain int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if l := q.members[slot].link; l != nil && l.armed.CompareAndSwap(true, false) {
		q.armedLinks.Add(-1)
	}
	q.members[slot].link = nil
	q.members[slot].gen++
	if q.err == nil {
		q.drainLocked(nil)
	}
	for qpn, s := range q.byQPN {
		if s == slot {
			// Its queue pair is gone: no completion names it any more,
			// and its number may be given to another.
			delete(q.byQPN, qpn)
		}
	}
	q.reserved -= need.entries
	if need.recvEntries > 0 {
		if q.recvQueues[need.recvQueue]--; q.recvQueues[need.recvQueue] == 0 {
			delete(q.recvQueues, need.recvQueue)
			q.reserved -= need.recvEntries
		}
	}
	q.free = append(q.free, slot)
	remain = len(q.members) - len(q.free)
	q.gone = remain == 0
	return remain
}

// drain polls the queue empty, moving each completion to its link; it
// returns the error of a queue that cannot be polled.
func (q *sharedCQ) drain(caller *Link) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ok, err := q.pollableLocked(); !ok {
		return err
	}
	return q.drainLocked(caller)
}

// pollableLocked reports whether the queue may be polled, and the error of
// one that failed. One that is gone (destroyed with its last link) is not
// polled, and is no error: an event read late concerns nobody.
func (q *sharedCQ) pollableLocked() (bool, error) {
	if q.err != nil {
		return false, q.err
	}
	return !q.gone, nil
}

// drainLocked is drain with q.mu held. Links that armed are told, but for
// the caller, which takes its own. It takes at most the queue's size: all
// that was on it when it began (a queue is first in, first out), and no
// more, so that completions that keep coming do not keep one poller.
func (q *sharedCQ) drainLocked(caller *Link) error {
	for taken := 0; ; {
		n, err := q.cq.Poll(q.wcs[:])
		if err != nil {
			q.err = err
			q.failLocked()
			return err
		}
		for i := range q.wcs[:n] {
			wc := &q.wcs[i]
			var m *cqMember
			if wc.ID&wrShared != 0 {
				// A shared queue's receive: its link by queue pair number,
				// or back to the queue when the link has left.
				if slot, ok := q.byQPN[wc.QPNum]; ok && q.members[slot].link != nil {
					m = &q.members[slot]
				} else {
					giveBackShared(wc.ID)
					continue
				}
			} else {
				slot := wrSlot(wc.ID)
				if int(slot) >= len(q.members) {
					continue
				}
				m = &q.members[slot]
				if m.link == nil || m.gen&(1<<wrGenBits-1) != wrGen(wc.ID) {
					continue // a link that left: its completions concern nobody
				}
			}
			m.link.deliver(wc)
			if m.link != caller && m.link.armed.CompareAndSwap(true, false) {
				q.armedLinks.Add(-1)
				q.told++
				m.link.arrived()
			}
		}
		if taken += n; n < len(q.wcs) || taken >= q.size {
			return nil
		}
	}
}

// failLocked tells every link of a queue that cannot be polled: their
// Polls return the error from now on.
func (q *sharedCQ) failLocked() {
	for _, m := range q.members {
		if m.link != nil {
			m.link.wakeForEnd()
		}
	}
}

// setFailed marks the queue unusable (the device reported it overran or
// failed): no link joins it, and its links' Polls fail with err.
func (q *sharedCQ) setFailed(err error) {
	q.mu.Lock()
	if q.err == nil {
		q.err = err
	}
	q.mu.Unlock()
}

// arm makes the queue raise an event for its next completion, unless it
// is armed already.
func (q *sharedCQ) arm() error {
	if !q.notifying.CompareAndSwap(false, true) {
		return nil
	}
	if err := q.cq.RequestNotify(false); err != nil {
		q.notifying.Store(false)
		return err
	}
	return nil
}

// event handles an event of the queue, read from the device's channel by
// reader's Wait (nil: the dispatcher): the queue is polled empty, and
// armed again only while a link still wants an event, then polled once
// more for what came in between. It reports whether reader has
// completions to take, and whether other links were told of theirs.
//
// A reader that found its own does not count: its Wait returns, and its
// connection arms again only when it next sleeps. So a lone busy
// connection's round trip pays no arming between the event and its Read
// (on rxe, arming is a system call).
func (q *sharedCQ) event(reader *Link) (mine, told bool, err error) {
	q.notifying.Store(false)
	q.mu.Lock()
	defer q.mu.Unlock()
	if ok, err := q.pollableLocked(); !ok {
		return false, false, err
	}
	before := q.told
	if err := q.drainLocked(reader); err != nil {
		return false, false, err
	}
	mine = reader != nil && reader.hasPending()
	if mine {
		reader.disarm()
	}
	if q.armedLinks.Load() > 0 {
		if err := q.arm(); err != nil {
			return false, false, err
		}
		if err := q.drainLocked(reader); err != nil {
			return false, false, err
		}
		mine = mine || reader != nil && reader.hasPending()
	}
	return mine, q.told != before, nil
}

// links returns the queue's links.
func (q *sharedCQ) links() []*Link {
	q.mu.Lock()
	defer q.mu.Unlock()
	var ls []*Link
	for _, m := range q.members {
		if m.link != nil {
			ls = append(ls, m.link)
		}
	}
	return ls
}

// sharedCQSize is the size of a device's next queue, when it has n: queues
// grow by adding, each about twice the last, from a size that costs the
// first connection little (a provider may pin a queue's memory) to one
// that holds hundreds of connections. Each is one short of a power of two:
// rxe gives a queue of n entries the power of two above n slots, so 512
// would take 1,024 (128 KiB), 511 takes 512.
func sharedCQSize(n, need, maxCQE int) int {
	size := minSharedCQ<<min(n, 6) - 1
	return min(max(size, need), maxCQE)
}

// minSharedCQ is a device's first queue's size: room for several small
// connections' worst cases.
const minSharedCQ = 256

// joinCQ reserves need on one of s's queues, adding a queue when none has
// room; newCQ makes a queue of the size asked.
func (s *compShare) joinCQ(need cqNeed, maxCQE int, newCQ func(size int) (*sharedCQ, error)) (q *sharedCQ, slot, gen uint32, err error) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	for _, q := range s.queues {
		if slot, gen, ok := q.take(need); ok {
			return q, slot, gen, nil
		}
	}
	q, err = newCQ(sharedCQSize(len(s.queues), need.entries+need.recvEntries, maxCQE))
	if err != nil {
		return nil, 0, 0, err
	}
	slot, gen, ok := q.take(need)
	if !ok {
		return nil, 0, 0, errQueueFull
	}
	s.queues = append(s.queues, q)
	s.mu.Lock()
	if q.vcq != nil {
		s.cqs[q.vcq] = q
	}
	s.mu.Unlock()
	return q, slot, gen, nil
}

// leaveCQ gives back a link's slot on q (leave); a queue left with no
// link is removed from s and returned, to be destroyed.
func (s *compShare) leaveCQ(q *sharedCQ, slot uint32, need cqNeed) (empty *sharedCQ) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if q.leave(slot, need) > 0 {
		return nil
	}
	for i, o := range s.queues {
		if o == q {
			s.queues = append(s.queues[:i], s.queues[i+1:]...)
			break
		}
	}
	s.mu.Lock()
	if q.vcq != nil {
		delete(s.cqs, q.vcq)
	}
	s.mu.Unlock()
	return q
}
