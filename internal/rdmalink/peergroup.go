package rdmalink

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmanet/sdk/internal/rdmacore"
	"github.com/rdmanet/sdk/internal/ringpool"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// A peer group is a device's resources for one peer, as SMC-R's link
// group: a protection domain, and the pools its connections' rings and
// control slots are carved from (docs/engine.md, "Memory (issue 24)"). A
// peer's rkeys name only its own group's slabs, so it reaches only its own
// connections' rings. A group goes with its last connection.
type peerGroup struct {
	key    groupKey
	device string // the device's name, for errors
	pd     *verbs.PD
	remote *ringpool.Pool // receive rings: the peer writes into them
	local  *ringpool.Pool // send rings and control slots
	// budget bounds what the group registers, pools and rings of their
	// own together (admission: Config.PeerBound); nil: no bound.
	budget *ringpool.Budget
	refs   int // under groups.Mutex
	// shared are the group's shared receive queues (sharedrecv.go).
	smu    sync.Mutex
	shared []*sharedRecv
	mems   memRegs // application memory registered here (mem.go)
	// sent and heard are when a send last completed and a message last
	// arrived on any of the group's links (Link.PathProgress), as
	// nanoseconds since pathEpoch.
	sent, heard atomic.Int64
}

// pathEpoch is what peerGroup's times count from: a monotonic clock.
var pathEpoch = time.Now()

// progressed sets the group's sent (a send completed) or heard (a message
// arrived) to now. A group of nil (a test's link) records nothing. A time
// less than a millisecond old stays: the links of a busy group do not all
// write the same word on every poll.
func (g *peerGroup) progressed(sent bool) {
	if g == nil {
		return
	}
	t := &g.heard
	if sent {
		t = &g.sent
	}
	if now := int64(time.Since(pathEpoch)); now-t.Load() >= int64(time.Millisecond) {
		t.Store(now)
	}
}

// groupKey names a group: connections with a different bound (Config's
// PeerMemory) have groups of their own.
type groupKey struct {
	dev   rdmacore.Context // the device's context: every cm ID's on it is the same, its Go wrapper is not
	peer  netip.Addr
	bound int64
}

var groups = struct {
	sync.Mutex
	m map[groupKey]*peerGroup
}{m: make(map[groupKey]*peerGroup)}

// poolClasses are the chunk sizes of a group's pools; a ring larger than
// the largest is registered on its own. poolSlab is the largest slab.
var poolClasses = []int{4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10}

const poolSlab = 1 << 20

// poolSlabChunks caps a slab at 16 chunks: a pool pins at most 15 chunks
// of a class beyond those in use once its slabs stopped doubling, and a
// dial registers a slab at most once in 16 past the first few.
const poolSlabChunks = 16

// poolKeepSlabs and poolKeepBytes: a pool keeps up to 4 empty slabs a
// class, up to 256 KiB in all, for the next connections: dials that
// follow closes (a connection a request, a health check), whose rings
// are given back some time after the close, register nothing
// (registering and deregistering their rings' slabs was the largest
// cost of a stream's open in the lab). A group's two pools keep at most
// 512 KiB, given back when the group ends or its bound needs the room.
const (
	poolKeepSlabs = 4
	poolKeepBytes = 256 << 10
)

// acquireGroup is the group of ctx's connections to peer bounded to
// bound bytes (0: DefaultPeerBound; negative: no bound), made if none.
func acquireGroup(ctx *verbs.Context, peer netip.Addr, bound int64) (*peerGroup, error) {
	if bound == 0 {
		bound = DefaultPeerBound()
	}
	key := groupKey{ctx.Raw(), peer.Unmap(), bound}
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
	g := &peerGroup{key: key, device: ctx.Name(), pd: pd, refs: 1}
	if bound > 0 {
		g.budget = ringpool.NewBudget(bound)
	}
	pool := func(access verbs.Access) *ringpool.Pool {
		return ringpool.New(func(size int) (ringpool.Slab, error) {
			b, mr, err := register(pd, size, access)
			if err != nil {
				return nil, err
			}
			return &registeredSlab{b: b, mr: mr}, nil
		}, ringpool.Config{Classes: poolClasses, SlabSize: poolSlab, MaxChunks: poolSlabChunks, Budget: g.budget,
			KeepEmpty: poolKeepSlabs, KeepBytes: poolKeepBytes})
	}
	g.remote = pool(verbs.AccessLocalWrite | verbs.AccessRemoteWrite)
	g.local = pool(verbs.AccessLocalWrite)
	groups.m[key] = g
	return g, nil
}

// DefaultPeerBound is what one peer's connections on a device may
// register by default: half of what RLIMIT_MEMLOCK allows where it binds
// (no CAP_IPC_LOCK), so that one peer leaves room for others, but at
// least 1 MiB (below, the limit itself stops registration first, with an
// error that names it); 4 GiB where it does not bind. Read once: the
// process's limit does not change under it.
func DefaultPeerBound() int64 { return defaultBound().bound }

// defaultBound is DefaultPeerBound and the RLIMIT_MEMLOCK it comes from
// (0: none binds).
var defaultBound = sync.OnceValue(func() (b struct{ bound, memlock int64 }) {
	raiseMemlock()
	if _, limit, capIPCLock, ok := rdmacore.PinnedMemory(); ok && !capIPCLock && limit >= 0 {
		b.bound, b.memlock = max(limit/2, 1<<20), limit
		return b
	}
	b.bound = 4 << 30
	return b
})

// BoundError is the error when a peer group's connections would register
// more than Config.PeerBound.
type BoundError struct {
	Peer   netip.Addr
	Device string
	Asked  int64 // the bytes asked for: a new slab, or a ring of its own
	Held   int64 // what the group holds
	Bound  int64
	// Memlock is the RLIMIT_MEMLOCK the bound is the default of (half of
	// it), or 0 when the bound was set.
	Memlock int64
}

func (e *BoundError) Error() string {
	return fmt.Sprintf("the connections with %v on %s hold %s of registered memory of the %s they may (asked for %s more)",
		e.Peer, e.Device, rdmacore.IEC(e.Held), rdmacore.IEC(e.Bound), rdmacore.IEC(e.Asked))
}

// boundError is err with the group named, if it is the budget's.
func (g *peerGroup) boundError(err error) error {
	var be *ringpool.BoundError
	if !errors.As(err, &be) {
		return err
	}
	e := &BoundError{Peer: g.key.peer, Device: g.device, Asked: be.Asked, Held: be.Held, Bound: be.Bound}
	if d := defaultBound(); g.key.bound == d.bound {
		e.Memlock = d.memlock
	}
	return e
}

// PoolStats is what the peer groups' pools of the process hold: the
// bytes of their registered slabs, and of the chunks connections use.
type PoolStats struct {
	Groups      int
	Held, InUse int64
}

// Pools sums the pools of every peer group.
func Pools() PoolStats {
	groups.Lock()
	defer groups.Unlock()
	st := PoolStats{Groups: len(groups.m)}
	for _, g := range groups.m {
		for _, p := range []*ringpool.Pool{g.remote, g.local} {
			ps := p.Stats()
			st.Held += ps.Held
			st.InUse += ps.InUse
		}
	}
	return st
}

// hold takes one more hold on the group, for one that holds it already
// (a link registering memory on its domain in the background).
func (g *peerGroup) hold() {
	groups.Lock()
	g.refs++
	groups.Unlock()
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
	// Its shared receive queues go with its last queue pair, and give
	// their slots back; the domain goes only once no slab is registered
	// on it.
	var errs []error
	for _, s := range g.shared {
		errs = append(errs, s.close())
	}
	g.shared = nil
	g.dropMems()
	if err := errors.Join(append(errs, g.remote.Close(), g.local.Close())...); err != nil {
		return err
	}
	return g.pd.Close()
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
	// budget and pinned: what a region outside the pools (an own or a
	// borrowed buffer) took of its group's budget.
	budget *ringpool.Budget
	pinned int64
}

// Bytes is the region's memory. A nil region is a ring of 0 bytes (none
// was made, or the first receive ring was released): no memory, and
// named by address and key 0, which no write reaches.
func (r *region) Bytes() []byte {
	if r == nil {
		return nil
	}
	return r.b
}

// Slice is the scatter/gather element for [off, off+n) of the region.
func (r *region) Slice(off, n int) verbs.SGE {
	if r == nil && off == 0 && n == 0 {
		return verbs.SGE{}
	}
	return r.mr.Slice(r.off+off, n)
}

// Addr and RKey name the region to the peer.
func (r *region) Addr() uint64 {
	if r == nil {
		return 0
	}
	return r.mr.Addr() + uint64(r.off)
}

func (r *region) RKey() uint32 {
	if r == nil {
		return 0
	}
	return r.mr.RKey()
}

// region takes size bytes from pool (the group's remote or local one), or
// registers them on the group's domain alone when no class holds them.
// Beyond the group's budget it fails with a *BoundError.
func (g *peerGroup) region(pool *ringpool.Pool, size int, access verbs.Access) (*region, error) {
	if size > poolClasses[len(poolClasses)-1] {
		return g.charge(size, func() (*region, error) {
			b, mr, err := register(g.pd, size, access)
			if err != nil {
				return nil, err
			}
			return &region{mr: mr, b: b.Bytes(), own: b}, nil
		})
	}
	c, err := pool.Get(size)
	if err != nil {
		return nil, g.boundError(err)
	}
	s := c.Slab().(*registeredSlab)
	return &region{mr: s.mr, off: c.Offset(), b: c.Bytes()[:size:size], chunk: c}, nil
}

// regionBytes is what a region of size bytes pins: its pool class, or
// whole pages for a ring registered on its own.
func regionBytes(size int) int {
	for _, c := range poolClasses {
		if c >= size {
			return c
		}
	}
	page := os.Getpagesize()
	return (size + page - 1) / page * page
}

// Registered is what a link made with cfg pins: its rings (unless they
// are the caller's, SendMem and RecvMem, or of 0 bytes) and its receive
// and control slots, as pool chunks. Write notices (iWARP) pin nothing
// more on a device that sends 32 bytes inline (siw does); on one that
// cannot, notices is whether to count their slots.
func Registered(cfg Config, notices bool) int {
	n := regionBytes(cfg.RecvDepth*wire.MessageSize) + regionBytes(cfg.ControlDepth*wire.MessageSize)
	if notices {
		n += regionBytes(cfg.SendDepth * wire.MessageSize)
	}
	for _, ring := range []int{cfg.RecvBuffer, cfg.SendBuffer} {
		if ring > 0 && (cfg.SendMem == nil || cfg.RecvMem == nil) {
			n += regionBytes(ring)
		}
	}
	return n
}

// register allocates size bytes and registers them on pd: a slab, or a
// ring of its own.
func register(pd *verbs.PD, size int, access verbs.Access) (*verbs.Buffer, *verbs.MR, error) {
	b, err := verbs.NewBuffer(size)
	if err != nil {
		return nil, nil, err
	}
	mr, err := pd.Register(b, access)
	if err != nil {
		b.Close()
		return nil, nil, err
	}
	return b, mr, nil
}

// borrowedRegion registers memory the caller owns (a session's rings) on
// the group's domain, within its budget.
func (g *peerGroup) borrowedRegion(b *verbs.Buffer, access verbs.Access) (*region, error) {
	return g.charge(len(b.Bytes()), func() (*region, error) {
		mr, err := g.pd.Register(b, access)
		if err != nil {
			return nil, err
		}
		return &region{mr: mr, b: b.Bytes()}, nil
	})
}

// sharedRegion registers part of buf, a region of another group's (a
// stream's ring that moved here), on the group's domain, within its budget.
func (g *peerGroup) sharedRegion(buf *verbs.Buffer, part []byte, access verbs.Access) (*region, error) {
	return g.charge(len(part), func() (*region, error) {
		mr, err := g.pd.RegisterPart(buf, part, access)
		if err != nil {
			return nil, err
		}
		return &region{mr: mr, b: part}, nil
	})
}

// charge takes a registration of size bytes (whole pages) from the group's
// budget for reg, and gives it back if reg fails: what is registered
// outside the pools counts against the peer's bound too.
func (g *peerGroup) charge(size int, reg func() (*region, error)) (*region, error) {
	n := int64(regionBytes(size))
	if g.budget != nil {
		if err := g.budget.Take(n); err != nil {
			return nil, g.boundError(err)
		}
	}
	r, err := reg()
	if err != nil {
		if g.budget != nil {
			g.budget.Give(n)
		}
		return nil, err
	}
	r.budget, r.pinned = g.budget, n
	return r, nil
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
	if r.budget != nil {
		r.budget.Give(r.pinned)
	}
	return err
}
