package rdmalink

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// Shared receive queues (Config.SharedRecv): the links of a peer group
// take their peers' messages into receives of one queue (a verbs.SRQ, as
// nvmet-rdma's queue pairs do), not into receives of their own, and grant
// their peers credit from it (wire.FeatureRecvGrant, link.RecvGranter):
// a link's first grant is reserved when it joins, and it gets more only
// from what no peer of the queue holds, up to Config.RecvDepth, so the
// queue never runs dry. A group's queues are made in chunks, as the
// completion queues are (255 receives, then 511, ...: a link joins one
// with room for its first grant), in the group's protection domain (rxe
// checks a receive's keys against the queue pair's domain).
//
// A receive's completion names the queue pair that took it, not a slot of
// the link's: the shared completion queue routes it by queue pair number
// (cqshare.go). Its work request id names the queue and the receive's
// slot (wrShared), so that one whose queue pair has gone (flushed, or
// taken as the link left) is posted again at once, and one the engine
// took goes back with the link's PostRecv.

// sharedRecv is one shared receive queue of a peer group.
type sharedRecv struct {
	id    uint32 // in its receives' work request ids, and sharedRecvs
	srq   *verbs.SRQ
	slots *region // a 32-byte slot a receive
	size  int

	mu       sync.Mutex
	wrs      []verbs.RecvWR // scratch for posting, under mu
	reserved int            // the first grants of the links on it
	granted  int            // what their peers hold
}

// sharedRecvs are the live queues by id, for completions whose queue pair
// has gone.
var (
	sharedRecvs  sync.Map // uint32 -> *sharedRecv
	sharedRecvID atomic.Uint32
)

// firstGrant is a shared-queue link's first grant: its Hello's RecvDepth.
// A link that streams is granted more, up to Config.RecvDepth.
const firstGrant = 16

// maxSharedRecv bounds a chunk: 4,095 receives (128 KiB of slots).
const maxSharedRecv = 4095

// sharedRecvSize is the size of a group's next queue when it has n, one
// short of a power of two as the completion queues are (rxe rounds a
// queue of n up to the power of two above it).
func sharedRecvSize(n int) int { return min(256<<min(n, 4)-1, maxSharedRecv) }

// joinShared reserves first receives for a link on one of g's queues,
// making one if none has room.
func (g *peerGroup) joinShared(first int) (*sharedRecv, error) {
	g.smu.Lock()
	defer g.smu.Unlock()
	for _, s := range g.shared {
		if s.join(first) {
			return s, nil
		}
	}
	s, err := g.newShared(sharedRecvSize(len(g.shared)))
	if err != nil {
		return nil, err
	}
	g.shared = append(g.shared, s)
	if !s.join(first) {
		return nil, fmt.Errorf("rdmanet: a shared receive queue of %d has no room for a first grant of %d", s.size, first)
	}
	return s, nil
}

// newShared makes a queue of size receives, all posted.
func (g *peerGroup) newShared(size int) (_ *sharedRecv, err error) {
	slots, err := g.region(g.local, size*wire.MessageSize, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	srq, err := g.pd.NewSRQ(size, 0)
	if err != nil {
		slots.close()
		return nil, err
	}
	s := &sharedRecv{id: sharedRecvID.Add(1) & wrSharedIDMask, srq: srq, slots: slots, size: size, wrs: make([]verbs.RecvWR, 0, size)}
	all := make([]int, size)
	for i := range all {
		all[i] = i
	}
	if err := s.post(all); err != nil {
		s.close()
		return nil, err
	}
	sharedRecvs.Store(s.id, s)
	return s, nil
}

// join reserves first receives for a link, if the queue has room.
func (s *sharedRecv) join(first int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reserved+first > s.size {
		return false
	}
	s.reserved += first
	s.granted += first
	return true
}

// leave gives back a link's reservation and what its peer held.
func (s *sharedRecv) leave(first, held int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reserved -= first
	s.granted -= held
}

// grant is link.PoolGrant from the queue.
func (s *sharedRecv) grant(held, n, first, most int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.granted -= n
	g := link.PoolGrant(s.size-s.granted, held, n, first, most)
	s.granted += g
	return g
}

// wrID is the work request id of a receive into slot.
func (s *sharedRecv) wrID(slot int) uint64 {
	return wrRecv | wrShared | uint64(s.id)<<wrGenShift | uint64(slot)
}

// post posts the receives of slots.
func (s *sharedRecv) post(slots []int) error {
	if len(slots) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	wrs := s.wrs[:0]
	for _, i := range slots {
		wrs = append(wrs, verbs.RecvWR{ID: s.wrID(i), Local: s.slots.Slice(i*wire.MessageSize, wire.MessageSize)})
	}
	err := s.srq.PostRecv(wrs)
	clear(wrs)
	return err
}

// slotBytes is a receive slot's message.
func (s *sharedRecv) slotBytes(i int) []byte {
	return s.slots.Bytes()[i*wire.MessageSize : (i+1)*wire.MessageSize]
}

// close destroys the queue (every queue pair on it is gone) and gives its
// slots back to the pool.
func (s *sharedRecv) close() error {
	sharedRecvs.Delete(s.id)
	return errors.Join(s.srq.Close(), s.slots.close())
}

// giveBackShared posts again the receive of a completion whose queue pair
// has gone, or that the link will not give to the engine (flushed).
func giveBackShared(id uint64) {
	if v, ok := sharedRecvs.Load(uint32(id>>wrGenShift) & wrSharedIDMask); ok {
		v.(*sharedRecv).post([]int{int(id & wrIndexMask)})
	}
}

// Grant is the credit the link gives its peer for n receives the peer's
// messages took (link.RecvGranter): with a shared queue, what the queue
// has for it; else the n posted again.
func (l *Link) Grant(held, n int) int {
	s := l.res.shared
	if s == nil {
		return n
	}
	g := s.grant(held, n, l.caps.RecvDepth, l.res.recvDepth)
	l.res.held = held + g
	return g
}

// SharedRecv reports whether the link takes its receives from a shared
// receive queue.
func (l *Link) SharedRecv() bool { return l.res.shared != nil }
