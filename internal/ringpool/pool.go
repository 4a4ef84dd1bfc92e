// Package ringpool hands out rings carved from large registered slabs:
// one pool per peer group (docs/engine.md, "Memory (issue 24)"), so that
// a dial or an accept registers nothing in the common case, and a peer's
// rkey reaches only its own connections' rings, as within an SMC-R link
// group.
//
// A slab is registered once and holds chunks of one size class. A chunk
// goes back to its slab only when its user says nothing can write into it
// any more (the link that announced it is closed: its queue pair is
// destroyed). A slab whose chunks are all free is deregistered, but for a
// few kept for the next connection. A Budget shared by a group's pools
// bounds the bytes of their slabs (admission).
package ringpool

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Slab is a registered buffer (a verbs.MR over a verbs.Buffer in rdmalink;
// memory in the tests).
type Slab interface {
	Bytes() []byte
	Close() error // deregisters and frees it
}

// Registrar allocates and registers a slab of size bytes.
type Registrar func(size int) (Slab, error)

// Config is a pool's.
type Config struct {
	// Classes are the chunk sizes, ascending.
	Classes []int
	// SlabSize is the most bytes of a slab: a multiple of every class. A
	// class's first slab holds one chunk, and each next one twice the
	// last, up to SlabSize (so a peer with one connection pins its rings
	// and no more); a class larger than SlabSize gets slabs of one chunk.
	SlabSize int
	// MaxChunks is the most chunks a slab holds (0: SlabSize decides): it
	// bounds what a pool pins beyond its chunks in use, to MaxChunks-1
	// chunks a class once its slabs stopped doubling.
	MaxChunks int
	// Budget, if set, bounds the bytes of the slabs of every pool that
	// shares it (a peer group's pools: admission).
	Budget *Budget
	// KeepEmpty is how many slabs with no chunk in use a class keeps, so
	// that connections opened and closed one after another do not
	// register and deregister a slab each; KeepBytes, if set, bounds the
	// bytes of the empty slabs the pool keeps in all. A kept slab still
	// counts against the Budget, which takes it back when a Get needs the
	// room.
	KeepEmpty int
	KeepBytes int
}

// Pool is one peer group's rings.
type Pool struct {
	reg Registrar
	cfg Config

	mu      sync.Mutex
	classes []class
	held    int64 // bytes of slabs
	kept    int64 // bytes of slabs with no chunk in use
	inUse   int64 // bytes of chunks handed out
	closed  bool
}

type class struct {
	size  int
	slabs []*slab
	empty int // slabs with no chunk in use
	next  int // chunks the next slab holds
}

type slab struct {
	Slab
	class int
	free  []int // chunk indexes
	used  int
	gen   []uint32 // each chunk's generation: a Put moves it on
}

// Chunk is a ring: a part of a slab.
type Chunk struct {
	pool  *Pool
	slab  *slab
	index int
	gen   uint32
	size  int
}

// ErrClosed is Get's error after Close.
var ErrClosed = errors.New("ringpool: closed")

// Budget is a bound on the bytes that pools, and memory registered
// beside them, may hold together.
type Budget struct {
	mu          sync.Mutex
	bound, held int64
	pools       []*Pool // sharing it: their kept slabs are taken back when it is short
}

// NewBudget returns a budget of bound bytes.
func NewBudget(bound int64) *Budget { return &Budget{bound: bound} }

// Take reserves n bytes, or returns a *BoundError if they do not fit.
func (b *Budget) Take(n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held+n > b.bound {
		return &BoundError{Asked: n, Held: b.held, Bound: b.bound}
	}
	b.held += n
	return nil
}

// Give returns n bytes that Take reserved.
func (b *Budget) Give(n int64) {
	b.mu.Lock()
	b.held -= n
	b.mu.Unlock()
}

// BoundError is the error when memory would pass a Budget's bound.
type BoundError struct {
	Asked       int64 // the bytes asked for: a new slab, or a ring of its own
	Held, Bound int64 // the bytes held, and the bound
}

func (e *BoundError) Error() string {
	return fmt.Sprintf("ringpool: %d more bytes would pass the bound of %d bytes, of which %d are held", e.Asked, e.Bound, e.Held)
}

// reclaim deregisters the empty slabs every pool of the budget but
// except keeps, and reports whether it freed any. A pool whose lock is
// held (by its own Get or Put) is passed over: its caller may hold
// except's lock, and two Gets that reclaimed from each other would wait
// for each other.
func (b *Budget) reclaim(except *Pool) bool {
	b.mu.Lock()
	pools := slices.Clone(b.pools)
	b.mu.Unlock()
	freed := false
	for _, q := range pools {
		if q == except || !q.mu.TryLock() {
			continue
		}
		drop := q.dropEmptyLocked()
		q.mu.Unlock()
		for _, s := range drop {
			s.Close()
			freed = true
		}
	}
	return freed
}

// New makes a pool whose slabs reg makes.
func New(reg Registrar, cfg Config) *Pool {
	p := &Pool{reg: reg, cfg: cfg}
	for _, size := range cfg.Classes {
		p.classes = append(p.classes, class{size: size, next: 1})
	}
	if b := cfg.Budget; b != nil {
		b.mu.Lock()
		b.pools = append(b.pools, p)
		b.mu.Unlock()
	}
	return p
}

// dropEmptyLocked takes the slabs with no chunk in use out of the pool
// and gives their bytes back to the budget; the caller closes them.
func (p *Pool) dropEmptyLocked() []Slab {
	var drop []Slab
	for ci := range p.classes {
		c := &p.classes[ci]
		c.slabs = slices.DeleteFunc(c.slabs, func(s *slab) bool {
			if s.used > 0 {
				return false
			}
			drop = append(drop, s.Slab)
			p.held -= int64(len(s.Bytes()))
			p.give(int64(len(s.Bytes())))
			return true
		})
		c.empty = 0
		if len(c.slabs) == 0 {
			c.next = 1
		}
	}
	p.kept = 0
	return drop
}

// Get hands out a chunk of at least size bytes (the smallest class that
// holds it), from a slab with a free chunk, or from a new one.
func (p *Pool) Get(size int) (*Chunk, error) {
	ci := slices.IndexFunc(p.cfg.Classes, func(c int) bool { return c >= size })
	if ci < 0 {
		return nil, fmt.Errorf("ringpool: no class holds %d bytes (the largest is %d)", size, p.cfg.Classes[len(p.cfg.Classes)-1])
	}
	var drop []Slab // kept slabs taken back for room, closed unlocked
	defer func() {
		for _, s := range drop {
			s.Close()
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	c := &p.classes[ci]
	var s *slab
	for _, cand := range c.slabs {
		if len(cand.free) > 0 && (s == nil || cand.used > s.used) {
			s = cand // the fullest, so that others may empty and go
		}
	}
	if s == nil {
		slabSize := max(min(c.next*c.size, p.slabCap(c.size)), c.size)
		if b := p.cfg.Budget; b != nil {
			// Near the bound, a smaller slab, down to one chunk: the bound
			// is on bytes, and a chunk that fits is given.
			reclaimed := false
			for {
				err := b.Take(int64(slabSize))
				if err == nil {
					break
				}
				if !reclaimed {
					// The pools' kept slabs first: they hold nothing.
					reclaimed = true
					kept := p.dropEmptyLocked()
					drop = append(drop, kept...)
					if b.reclaim(p) || len(kept) > 0 {
						continue
					}
				}
				if slabSize == c.size {
					return nil, err
				}
				slabSize = max(slabSize/2/c.size*c.size, c.size)
			}
		}
		raw, err := p.reg(slabSize)
		if err != nil {
			p.give(int64(slabSize))
			return nil, err
		}
		n := slabSize / c.size
		s = &slab{Slab: raw, class: ci, gen: make([]uint32, n)}
		for i := n - 1; i >= 0; i-- {
			s.free = append(s.free, i)
		}
		c.slabs = append(c.slabs, s)
		c.empty++
		p.kept += int64(slabSize)
		c.next = min(2*c.next, max(p.slabCap(c.size)/c.size, 1))
		p.held += int64(slabSize)
	}
	if s.used == 0 {
		c.empty--
		p.kept -= int64(len(s.Bytes()))
	}
	i := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.used++
	p.inUse += int64(c.size)
	return &Chunk{pool: p, slab: s, index: i, gen: s.gen[i], size: c.size}, nil
}

func (p *Pool) give(n int64) {
	if b := p.cfg.Budget; b != nil {
		b.Give(n)
	}
}

// slabCap is the most bytes of a slab of size-byte chunks.
func (p *Pool) slabCap(size int) int {
	if p.cfg.MaxChunks > 0 {
		return min(p.cfg.SlabSize, p.cfg.MaxChunks*size)
	}
	return p.cfg.SlabSize
}

// Bytes is the chunk's memory.
func (c *Chunk) Bytes() []byte {
	off := c.index * c.size
	return c.slab.Bytes()[off : off+c.size : off+c.size]
}

// Slab is the registered slab the chunk is part of (its keys name it).
func (c *Chunk) Slab() Slab { return c.slab.Slab }

// Offset is where the chunk starts in its slab.
func (c *Chunk) Offset() int { return c.index * c.size }

// Put gives the chunk back. Its user guarantees that nothing writes into
// it any more. A second Put of the same chunk is an error, and changes
// nothing.
func (c *Chunk) Put() error {
	p := c.pool
	p.mu.Lock()
	s := c.slab
	if s.gen[c.index] != c.gen {
		p.mu.Unlock()
		return errors.New("ringpool: a chunk given back twice")
	}
	s.gen[c.index]++
	s.free = append(s.free, c.index)
	s.used--
	p.inUse -= int64(c.size)
	var drop Slab
	if s.used == 0 {
		cl := &p.classes[s.class]
		size := int64(len(s.Bytes()))
		if cl.empty >= p.cfg.KeepEmpty || p.cfg.KeepBytes > 0 && p.kept+size > int64(p.cfg.KeepBytes) || p.closed {
			cl.slabs = slices.DeleteFunc(cl.slabs, func(o *slab) bool { return o == s })
			if len(cl.slabs) == 0 {
				cl.next = 1 // the peer's traffic is gone: start small again
			}
			p.held -= size
			p.give(size)
			drop = s.Slab
		} else {
			cl.empty++
			p.kept += size
		}
	}
	p.mu.Unlock()
	if drop != nil {
		return drop.Close()
	}
	return nil
}

// Stats is what a pool holds.
type Stats struct {
	Slabs       int
	Held, InUse int64 // bytes of slabs, and of chunks handed out
}

func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Stats{Held: p.held, InUse: p.inUse}
	for _, c := range p.classes {
		st.Slabs += len(c.slabs)
	}
	return st
}

// Close refuses later Gets and deregisters the slabs with no chunk in use
// now; the others go when their last chunk is put back.
func (p *Pool) Close() error {
	if b := p.cfg.Budget; b != nil {
		b.mu.Lock()
		b.pools = slices.DeleteFunc(b.pools, func(q *Pool) bool { return q == p })
		b.mu.Unlock()
	}
	p.mu.Lock()
	p.closed = true
	drop := p.dropEmptyLocked()
	p.mu.Unlock()
	var errs []error
	for _, s := range drop {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
