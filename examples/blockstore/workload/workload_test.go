package workload

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/examples/blockstore/nbd"
)

// recorder is a Device that records the offsets it was asked for.
type recorder struct {
	*nbd.Memory
	mu      sync.Mutex
	offsets []int64
	writes  int
	failAt  int64 // an offset that fails, or -1
}

func newRecorder(size int64) *recorder {
	return &recorder{Memory: nbd.NewMemory(size), failAt: -1}
}

func (r *recorder) record(off int64, write bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.offsets = append(r.offsets, off)
	if write {
		r.writes++
	}
	if off == r.failAt {
		return nbd.EIO
	}
	return nil
}

func (r *recorder) ReadAt(p []byte, off int64) (int, error) {
	if err := r.record(off, false); err != nil {
		return 0, err
	}
	return r.Memory.ReadAt(p, off)
}

func (r *recorder) WriteAt(p []byte, off int64) (int, error) {
	if err := r.record(off, true); err != nil {
		return 0, err
	}
	return r.Memory.WriteAt(p, off)
}

// TestSequentialCoversTheRegion: a byte count of twice the region, in
// order at queue depth 4, reads every block of the region twice, aligned,
// and nothing outside it.
func TestSequentialCoversTheRegion(t *testing.T) {
	d := newRecorder(1 << 20)
	cfg := Config{BlockSize: 4096, QueueDepth: 4, Bytes: 2 * 65536, Offset: 8192, Span: 65536 + 100}
	r, err := Run(context.Background(), d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ops != 32 || r.Bytes != 32*4096 {
		t.Fatalf("%d ops, %d bytes; want 32 and %d", r.Ops, r.Bytes, 32*4096)
	}
	slices.Sort(d.offsets)
	var want []int64
	for i := range int64(16) {
		want = append(want, 8192+i*4096, 8192+i*4096)
	}
	if !slices.Equal(d.offsets, want) {
		t.Fatalf("offsets %v, want %v", d.offsets, want)
	}
	if d.writes != 0 {
		t.Errorf("%d writes in a read workload", d.writes)
	}
	if r.Latency.Max <= 0 || r.Latency.P50 > r.Latency.P99 || r.Latency.P99 > r.Latency.Max {
		t.Errorf("latency %+v", r.Latency)
	}
}

// TestRandomWritesStayInTheRegion: random writes are aligned blocks within
// the region, and they write (random data, not zeroes).
func TestRandomWritesStayInTheRegion(t *testing.T) {
	d := newRecorder(1 << 20)
	cfg := Config{Write: true, Random: true, BlockSize: 512, QueueDepth: 8, Bytes: 512 * 1000, Offset: 4096, Span: 65536, Seed: 7}
	r, err := Run(context.Background(), d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ops != 1000 || d.writes != 1000 {
		t.Fatalf("%d ops, %d writes; want 1000", r.Ops, d.writes)
	}
	distinct := make(map[int64]bool)
	for _, off := range d.offsets {
		if off < 4096 || off+512 > 4096+65536 || (off-4096)%512 != 0 {
			t.Fatalf("offset %d outside the region or unaligned", off)
		}
		distinct[off] = true
	}
	if len(distinct) < 64 {
		t.Errorf("only %d distinct blocks of 128 in 1000 random writes", len(distinct))
	}
	b := make([]byte, 512)
	d.Memory.ReadAt(b, d.offsets[0])
	if slices.Equal(b, make([]byte, 512)) {
		t.Error("a written block is all zeroes")
	}
}

// TestDurationStops: a workload with only a duration ends after it.
func TestDurationStops(t *testing.T) {
	start := time.Now()
	r, err := Run(context.Background(), newRecorder(1<<20), Config{BlockSize: 4096, QueueDepth: 2, Duration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
		t.Errorf("ran %v for a duration of 100ms", d)
	}
	if r.Ops == 0 || r.OpsPerSecond() <= 0 || r.BytesPerSecond() <= 0 {
		t.Errorf("result %+v", r)
	}
}

// TestErrorStops: a failed request ends the workload with its error.
func TestErrorStops(t *testing.T) {
	d := newRecorder(1 << 20)
	d.failAt = 40960
	_, err := Run(context.Background(), d, Config{BlockSize: 4096, QueueDepth: 4, Bytes: 1 << 30})
	if !errors.Is(err, nbd.EIO) {
		t.Fatalf("Run: %v, want EIO", err)
	}
	if len(d.offsets) > 1000 {
		t.Errorf("%d requests after the failure", len(d.offsets))
	}
}

// TestBadConfigs are refused.
func TestBadConfigs(t *testing.T) {
	d := newRecorder(1 << 20)
	for _, cfg := range []Config{
		{BlockSize: 0, QueueDepth: 1, Bytes: 1},
		{BlockSize: 4096, QueueDepth: 0, Bytes: 1},
		{BlockSize: 4096, QueueDepth: 1},
		{BlockSize: 4096, QueueDepth: 1, Bytes: 1, Offset: 1 << 20},
		{BlockSize: 4096, QueueDepth: 1, Bytes: 1, Span: 4095},
		{BlockSize: 4096, QueueDepth: 1, Bytes: 1, Offset: -1},
	} {
		if _, err := Run(context.Background(), d, cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}

// TestHistogramPercentiles: within 2% of the exact ones.
func TestHistogramPercentiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var h histogram
	var all []time.Duration
	for range 100000 {
		d := time.Duration(rng.ExpFloat64() * float64(200*time.Microsecond))
		h.add(d)
		all = append(all, d)
	}
	slices.Sort(all)
	for _, p := range []float64{0.5, 0.99} {
		exact := all[int(p*float64(len(all)))-1]
		got := h.percentile(p)
		if diff := float64(got-exact) / float64(exact); diff > 0.02 || diff < -0.02 {
			t.Errorf("p%v: %v, exact %v", p*100, got, exact)
		}
	}
	if h.latency().Max != all[len(all)-1] {
		t.Errorf("max %v, want %v", h.latency().Max, all[len(all)-1])
	}
	for ns := range uint64(100000) {
		if m := bucketMiddle(bucket(ns)); m < ns*98/100 || m > ns*102/100+1 {
			t.Fatalf("%d ns: bucket middle %d", ns, m)
		}
	}
}
