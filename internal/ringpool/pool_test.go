package ringpool

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// memSlab is a slab of plain memory that counts its Closes.
type memSlab struct {
	b      []byte
	closes *atomic.Int32
}

func (s *memSlab) Bytes() []byte { return s.b }
func (s *memSlab) Close() error  { s.closes.Add(1); return nil }

type registrar struct {
	made, closed atomic.Int32
	fail         error
}

func (r *registrar) reg(size int) (Slab, error) {
	if r.fail != nil {
		return nil, r.fail
	}
	r.made.Add(1)
	return &memSlab{b: make([]byte, size), closes: &r.closed}, nil
}

func testPool(r *registrar, bound int64) *Pool {
	var b *Budget
	if bound > 0 {
		b = NewBudget(bound)
	}
	return New(r.reg, Config{Classes: []int{16 << 10, 32 << 10, 256 << 10}, SlabSize: 128 << 10, Budget: b, KeepEmpty: 1})
}

// TestChunksShareSlabs: a class's first slab holds one ring, each next
// one twice the last up to the slab size (a peer with one connection pins
// its ring and no more); rings never overlap; a class larger than a slab
// gets a slab each.
func TestChunksShareSlabs(t *testing.T) {
	r := &registrar{}
	p := testPool(r, 0)
	var chunks []*Chunk
	for range 9 {
		c, err := p.Get(10 << 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Bytes()) != 16<<10 || c.Offset()%(16<<10) != 0 {
			t.Fatalf("chunk of %d bytes at %d", len(c.Bytes()), c.Offset())
		}
		chunks = append(chunks, c)
	}
	if got := r.made.Load(); got != 4 {
		t.Errorf("9 chunks of 16 KiB made %d slabs, want 4 (of 1, 2, 4 and 8 chunks)", got)
	}
	seen := map[*byte]bool{}
	for i, c := range chunks {
		c.Bytes()[0] = byte(i)
		if seen[&c.Bytes()[0]] {
			t.Fatalf("chunk %d overlaps another", i)
		}
		seen[&c.Bytes()[0]] = true
	}
	for i, c := range chunks {
		if c.Bytes()[0] != byte(i) {
			t.Errorf("chunk %d was written by another", i)
		}
	}
	big, err := p.Get(200 << 10)
	if err != nil || len(big.Bytes()) != 256<<10 || len(big.Slab().Bytes()) != 256<<10 {
		t.Fatalf("a ring larger than a slab: %v", err)
	}
	if _, err := p.Get(1 << 20); err == nil {
		t.Errorf("a ring larger than every class")
	}
	if st := p.Stats(); st.Slabs != 5 || st.InUse != 9*16<<10+256<<10 || st.Held != 240<<10+256<<10 {
		t.Errorf("stats %+v", st)
	}
}

// TestPutKeepsOneEmptySlab: chunks put back are handed out again; a slab
// with none in use is kept for the next connection, a second one goes.
func TestPutKeepsOneEmptySlab(t *testing.T) {
	r := &registrar{}
	p := testPool(r, 0)
	var chunks []*Chunk
	for range 16 {
		c, err := p.Get(16 << 10)
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, c)
	}
	for _, c := range chunks {
		if err := c.Put(); err != nil {
			t.Fatal(err)
		}
	}
	if st := p.Stats(); st.Slabs != 1 || st.InUse != 0 || r.closed.Load() != 4 {
		t.Errorf("after every chunk came back: %+v, %d slabs closed; want one kept", st, r.closed.Load())
	}
	c, err := p.Get(16 << 10)
	if err != nil || r.made.Load() != 5 {
		t.Errorf("a ring after: %v, %d slabs made (want the kept one reused)", err, r.made.Load())
	}
	if err := chunks[0].Put(); err == nil {
		t.Errorf("an old chunk given back again")
	}
	if st := p.Stats(); st.InUse != 16<<10 {
		t.Errorf("a second Put changed the pool: %+v", st)
	}
	c.Put()
}

// TestBound: the pool takes no slab beyond its bound and says so; rings
// from slabs it holds are still handed out; the bound frees up as slabs go.
func TestBound(t *testing.T) {
	r := &registrar{}
	p := testPool(r, 112<<10) // slabs of 16, 32 and 64 KiB; the next would be 128
	var chunks []*Chunk
	for range 7 {
		c, err := p.Get(16 << 10)
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, c)
	}
	_, err := p.Get(16 << 10)
	var be *BoundError
	if !errors.As(err, &be) || be.Held != 112<<10 || be.Bound != 112<<10 || be.Asked != 16<<10 {
		t.Fatalf("beyond the bound, even for a slab of one chunk: %v", err)
	}
	chunks[3].Put()
	if _, err := p.Get(16 << 10); err != nil {
		t.Errorf("a ring from a held slab: %v", err)
	}
	// The first slab (one chunk) goes: there is room for a chunk again,
	// though the next slab would have been of eight.
	chunks[0].Put()
	if _, err := p.Get(16 << 10); err != nil {
		t.Errorf("a ring near the bound, from a smaller slab: %v", err)
	}
	r.fail = errors.New("test: cannot allocate memory")
	p2 := testPool(r, 0)
	if _, err := p2.Get(16 << 10); !errors.Is(err, r.fail) {
		t.Errorf("a registration that fails: %v", err)
	}
}

// TestCloseFreesSlabs: Close refuses later Gets, frees the slabs with no
// ring in use at once, and the others when their last ring comes back.
func TestCloseFreesSlabs(t *testing.T) {
	r := &registrar{}
	p := testPool(r, 0)
	a, _ := p.Get(16 << 10)
	b, _ := p.Get(32 << 10)
	b.Put() // its slab is kept empty
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if r.closed.Load() != 1 {
		t.Errorf("Close freed %d slabs, want the empty one", r.closed.Load())
	}
	if _, err := p.Get(16 << 10); err != ErrClosed {
		t.Errorf("Get after Close: %v", err)
	}
	a.Put()
	if r.closed.Load() != 2 || p.Stats() != (Stats{}) {
		t.Errorf("after the last ring came back: %d slabs freed, %+v", r.closed.Load(), p.Stats())
	}
}

// TestConcurrentGetPut: many connections open and close at once; every
// slab made is freed in the end, and no ring is handed out twice.
func TestConcurrentGetPut(t *testing.T) {
	r := &registrar{}
	p := testPool(r, 0)
	var owners sync.Map
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				c, err := p.Get((16 << 10) << (i % 2))
				if err != nil {
					t.Error(err)
					return
				}
				if prev, taken := owners.LoadOrStore(&c.Bytes()[0], g); taken {
					t.Errorf("a ring handed out twice (to %v and %d)", prev, g)
				}
				owners.Delete(&c.Bytes()[0])
				if err := c.Put(); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	p.Close()
	if r.made.Load() != r.closed.Load() {
		t.Errorf("%d slabs made, %d freed", r.made.Load(), r.closed.Load())
	}
}

// TestSlabsStartSmallAgain: once a class's traffic is gone (its last slab
// freed), its next slab holds one ring again.
func TestSlabsStartSmallAgain(t *testing.T) {
	r := &registrar{}
	p := New(r.reg, Config{Classes: []int{16 << 10}, SlabSize: 128 << 10})
	var chunks []*Chunk
	for range 7 { // slabs of 1, 2 and 4 rings
		c, err := p.Get(16 << 10)
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, c)
	}
	for _, c := range chunks {
		c.Put()
	}
	c, err := p.Get(16 << 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(c.Slab().Bytes()); got != 16<<10 {
		t.Errorf("the first ring after the class emptied came with a %d-byte slab", got)
	}
}

// TestMaxChunks: slabs stop doubling at MaxChunks chunks, so what a pool
// pins beyond its chunks in use stays under MaxChunks chunks a class.
func TestMaxChunks(t *testing.T) {
	r := &registrar{}
	p := New(r.reg, Config{Classes: []int{4 << 10}, SlabSize: 1 << 20, MaxChunks: 4})
	for range 15 {
		if _, err := p.Get(4 << 10); err != nil {
			t.Fatal(err)
		}
	}
	// 1, 2, 4, 4, 4 chunks: 15 in 5 slabs.
	if st := p.Stats(); st.Slabs != 5 || st.Held != 15*4<<10 {
		t.Fatalf("15 chunks of slabs capped at 4: %+v, want 5 slabs holding 60 KiB", st)
	}
	if _, err := p.Get(4 << 10); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Held-st.InUse != 3*4<<10 {
		t.Fatalf("16th chunk: %+v, want a new slab of 4 with 3 free", st)
	}
}

// TestSharedBudget: two pools on one budget are bounded together, and a
// slab that goes gives its bytes back to the budget.
func TestSharedBudget(t *testing.T) {
	r := &registrar{}
	b := NewBudget(48 << 10)
	cfg := Config{Classes: []int{16 << 10}, SlabSize: 16 << 10, Budget: b}
	p1, p2 := New(r.reg, cfg), New(r.reg, cfg)
	c1, err1 := p1.Get(16 << 10)
	c2, err2 := p2.Get(16 << 10)
	_, err3 := p2.Get(16 << 10)
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	var be *BoundError
	if _, err := p1.Get(16 << 10); !errors.As(err, &be) || be.Held != 48<<10 {
		t.Fatalf("a fourth slab on a budget of three: %v", err)
	}
	c1.Put()
	if _, err := p2.Get(16 << 10); err != nil {
		t.Fatalf("after a slab of the other pool went: %v", err)
	}
	c2.Put()
	if err := b.Take(16 << 10); err != nil {
		t.Fatalf("budget after two slabs went: %v", err)
	}
}

// TestSmallerSlabNearTheBound: a slab that would pass the bound is made
// smaller, down to one chunk, rather than refusing a chunk that fits.
func TestSmallerSlabNearTheBound(t *testing.T) {
	r := &registrar{}
	p := New(r.reg, Config{Classes: []int{16 << 10}, SlabSize: 128 << 10, Budget: NewBudget(48 << 10)})
	var cs []*Chunk
	for range 3 { // slabs of 1 and 2 chunks: 48 KiB
		c, err := p.Get(16 << 10)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	cs[0].Put() // its slab goes
	if _, err := p.Get(16 << 10); err != nil {
		t.Fatalf("a chunk that fits the bound: %v", err)
	}
	if st := p.Stats(); st.Held != 48<<10 || st.Slabs != 2 {
		t.Fatalf("%+v, want a new slab of one chunk beside the one of two", st)
	}
}

// TestKeptSlabs: a slab kept empty serves the next Get with no
// registration; one larger than KeepBytes is not kept; a Get that finds
// the budget short takes back the kept slabs of every pool sharing it,
// and registers in their room.
func TestKeptSlabs(t *testing.T) {
	r := &registrar{}
	b := NewBudget(96 << 10)
	cfg := Config{Classes: []int{16 << 10, 32 << 10, 64 << 10}, SlabSize: 64 << 10, Budget: b, KeepEmpty: 1, KeepBytes: 32 << 10}
	p, q := New(r.reg, cfg), New(r.reg, cfg)
	for range 5 {
		c, err := p.Get(16 << 10)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Put(); err != nil {
			t.Fatal(err)
		}
	}
	if made, closed := r.made.Load(), r.closed.Load(); made != 1 || closed != 0 {
		t.Errorf("5 Gets and Puts one after another: %d slabs made, %d closed, want the one kept", made, closed)
	}
	big, err := p.Get(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	big.Put()
	if closed := r.closed.Load(); closed != 1 {
		t.Errorf("a 64 KiB slab, past KeepBytes, emptied: %d closed, want it closed", closed)
	}
	// q keeps a 32 KiB slab, p its 16 KiB one: 48 KiB of the 96 held.
	c, err := q.Get(32 << 10)
	if err != nil {
		t.Fatal(err)
	}
	c.Put()
	if st := p.Stats().Held + q.Stats().Held; st != 48<<10 {
		t.Fatalf("kept: %d bytes, want 48 KiB", st)
	}
	// 64 KiB more fits only once both pools gave back what they keep.
	c, err = p.Get(64 << 10)
	if err != nil {
		t.Fatalf("a Get that fits once the kept slabs go: %v", err)
	}
	if st := q.Stats(); st.Held != 0 || st.Slabs != 0 {
		t.Errorf("the other pool still keeps %+v", st)
	}
	if st := p.Stats(); st.Held != 64<<10 {
		t.Errorf("the pool holds %+v, want the new 64 KiB slab alone", st)
	}
	c.Put()
	q.Close()
	p.Close()
	if made, closed := r.made.Load(), r.closed.Load(); made != closed {
		t.Errorf("%d slabs made, %d closed after Close", made, closed)
	}
}
