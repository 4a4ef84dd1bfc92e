package rdmalink

import (
	"net/netip"
	"sync"

	"github.com/rdmanet/sdk/internal/ringpool"
	"github.com/rdmanet/sdk/verbs"
)

// A peer group is a device's resources for one peer, as SMC-R's link
// group: a protection domain, and the pools its connections' rings and
// control slots are carved from (docs/engine.md, "Memory (issue 24)"). A
// peer's rkeys name only its own group's slabs, so it reaches only its own
// connections' rings. A group goes with its last connection.
type peerGroup struct {
	key    groupKey
	pd     *verbs.PD
	remote *ringpool.Pool // receive rings: the peer writes into them
	local  *ringpool.Pool // send rings and control slots
	refs   int            // under groups.Mutex
}

type groupKey struct {
	ctx  *verbs.Context
	peer netip.Addr
}

var groups = struct {
	sync.Mutex
	m map[groupKey]*peerGroup
}{m: make(map[groupKey]*peerGroup)}

// poolClasses are the chunk sizes of a group's pools; a ring larger than
// the largest is registered on its own. poolSlab is the largest slab.
var poolClasses = []int{4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10}

const poolSlab = 1 << 20

// acquireGroup is the group of ctx's connections to peer, made if none.
func acquireGroup(ctx *verbs.Context, peer netip.Addr) (*peerGroup, error) {
	key := groupKey{ctx, peer.Unmap()}
	groups.Lock()
	defer groups.Unlock()
	if g := groups.m[key]; g != nil {
		g.refs++
		return g, nil
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		return nil, err
	}
	g := &peerGroup{key: key, pd: pd, refs: 1}
	pool := func(access verbs.Access) *ringpool.Pool {
		return ringpool.New(func(size int) (ringpool.Slab, error) {
			b, err := verbs.NewBuffer(size)
			if err != nil {
				return nil, err
			}
			mr, err := pd.Register(b, access)
			if err != nil {
				b.Close()
				return nil, err
			}
			return &registeredSlab{b: b, mr: mr}, nil
		}, ringpool.Config{Classes: poolClasses, SlabSize: poolSlab})
	}
	g.remote = pool(verbs.AccessLocalWrite | verbs.AccessRemoteWrite)
	g.local = pool(verbs.AccessLocalWrite)
	groups.m[key] = g
	return g, nil
}

// release ends a connection's hold on the group, after it gave back its
// chunks; the last one closes the group.
func (g *peerGroup) release() error {
	groups.Lock()
	g.refs--
	last := g.refs == 0
	if last {
		delete(groups.m, g.key)
	}
	groups.Unlock()
	if !last {
		return nil
	}
	err1, err2 := g.remote.Close(), g.local.Close()
	if err1 != nil || err2 != nil {
		return firstErr(err1, err2)
	}
	return g.pd.Close()
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// registeredSlab is a pool's slab: a buffer registered on the group's
// protection domain.
type registeredSlab struct {
	b  *verbs.Buffer
	mr *verbs.MR
}

func (s *registeredSlab) Bytes() []byte { return s.b.Bytes() }

func (s *registeredSlab) Close() error {
	err := s.mr.Close()
	if err2 := s.b.Close(); err == nil {
		err = err2
	}
	return err
}

// region is registered memory a connection uses: a chunk of a group's
// slab, or a buffer registered for it alone (a session's rings, or a ring
// larger than the pools' classes).
type region struct {
	mr    *verbs.MR
	off   int    // where it starts in mr
	b     []byte // exactly the size asked for
	chunk *ringpool.Chunk
	own   *verbs.Buffer // a buffer of the region's own, unmapped with it (nil: borrowed or a chunk)
}

// Bytes is the region's memory.
func (r *region) Bytes() []byte { return r.b }

// Slice is the scatter/gather element for [off, off+n) of the region.
func (r *region) Slice(off, n int) verbs.SGE { return r.mr.Slice(r.off+off, n) }

// Addr and RKey name the region to the peer.
func (r *region) Addr() uint64 { return r.mr.Addr() + uint64(r.off) }
func (r *region) RKey() uint32 { return r.mr.RKey() }

// chunkRegion takes size bytes from pool, or registers them on pd alone
// when no class holds them.
func chunkRegion(pool *ringpool.Pool, pd *verbs.PD, size int, access verbs.Access) (*region, error) {
	if size > poolClasses[len(poolClasses)-1] {
		b, err := verbs.NewBuffer(size)
		if err != nil {
			return nil, err
		}
		mr, err := pd.Register(b, access)
		if err != nil {
			b.Close()
			return nil, err
		}
		return &region{mr: mr, b: b.Bytes(), own: b}, nil
	}
	c, err := pool.Get(size)
	if err != nil {
		return nil, err
	}
	s := c.Slab().(*registeredSlab)
	return &region{mr: s.mr, off: c.Offset(), b: c.Bytes()[:size:size], chunk: c}, nil
}

// borrowedRegion registers memory the caller owns (a session's rings) on pd.
func borrowedRegion(pd *verbs.PD, b *verbs.Buffer, access verbs.Access) (*region, error) {
	mr, err := pd.Register(b, access)
	if err != nil {
		return nil, err
	}
	return &region{mr: mr, b: b.Bytes()}, nil
}

// close gives the region back: after the queue pair that used it is
// destroyed, so that nothing lands in it any more.
func (r *region) close() error {
	if r == nil {
		return nil
	}
	if r.chunk != nil {
		return r.chunk.Put()
	}
	err := r.mr.Close()
	if r.own != nil {
		if err2 := r.own.Close(); err == nil {
			err = err2
		}
	}
	return err
}
