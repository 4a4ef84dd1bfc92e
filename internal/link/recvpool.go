package link

import (
	"fmt"
	"math"
	"sync"
)

// RecvPool is an in-memory shared receive queue: the receives that the
// ends made with it (PipeConfig.RecvPool) take their peers' messages into,
// as a device's shared receive queue serves many queue pairs. It holds
// Size receives, all posted at first; a message takes one, and the end's
// PostRecv gives it back.
//
// Credit is what keeps it from running dry (wire.FeatureRecvGrant): an
// end on a pool grants its peer credit from it (Pipe.Grant). Each end's
// first grant (its RecvDepth) is reserved when it is made, even past Size,
// and it grants more only from what no end's peer holds: a link that
// streams gets up to twice what it took back, a pool that is short gives
// back no more than each peer's first grant. A message that finds the
// pool dry waits, as a receiver-not-ready retry does (RNRRetry), and is
// counted in Stats.
type RecvPool struct {
	size int

	mu      sync.Mutex
	posted  int // receives posted now
	granted int // credit the ends' peers hold, together
	most    int // the most granted at once
	dry     int // messages that found no receive
}

// NewRecvPool returns a pool of size receives, all posted.
func NewRecvPool(size int) *RecvPool {
	if size <= 0 {
		panic(fmt.Sprintf("link: NewRecvPool(%d)", size))
	}
	return &RecvPool{size: size, posted: size}
}

// RecvPoolStats is what a pool saw.
type RecvPoolStats struct {
	Size, Posted int
	Granted      int // credit the ends' peers hold now
	MostGranted  int // the most they held at once
	Dry          int // messages that found no receive posted and waited
}

// Stats reports what the pool saw.
func (p *RecvPool) Stats() RecvPoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return RecvPoolStats{Size: p.size, Posted: p.posted, Granted: p.granted, MostGranted: p.most, Dry: p.dry}
}

// join reserves an end's first grant.
func (p *RecvPool) join(first int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.granted += first
	p.most = max(p.most, p.granted)
}

// leave gives back what an end's peer held when the end closed.
func (p *RecvPool) leave(held int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.granted -= held
}

// take takes a receive for a message, or reports that none is posted.
func (p *RecvPool) take() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.posted == 0 {
		p.dry++
		return false
	}
	p.posted--
	return true
}

// post gives back n receives.
func (p *RecvPool) post(n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.posted+n > p.size {
		return misuse("PostRecv: %d posted in the pool and %d more, Size %d", p.posted, n, p.size)
	}
	p.posted += n
	return nil
}

// grant is the credit an end gives its peer for n receives its messages
// took (PoolGrant), the peer holding held now, with a first grant of
// first.
func (p *RecvPool) grant(held, n, first int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.granted -= n // the peer spent them
	g := PoolGrant(p.size-p.granted, held, n, first, math.MaxInt)
	p.granted += g
	p.most = max(p.most, p.granted)
	return g
}

// PoolGrant is the credit a receiver on a shared pool of receives gives its
// peer for n receives the peer's messages took (link.RecvGranter): the n
// back and n more while the pool has them free (free: what no peer holds,
// the n back in it), up to most held; back to its first grant at least,
// when the pool is short. held is what the peer holds now, the n taken
// off.
func PoolGrant(free, held, n, first, most int) int {
	g := min(2*n, max(free, 0), most-held)
	return max(g, first-held)
}
