// Package workload drives a block device with a synthetic load, reads or
// writes of one size, in order or at random, from a number of goroutines
// at once (the queue depth), and measures its throughput and latency. The
// blockstore bench command runs it on an nbd.Client.
package workload

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Device is what a workload runs on: an nbd.Client, or a backend.
type Device interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Size() int64
}

// Config describes a workload. It runs until Duration has passed or Bytes
// have been moved, whichever comes first; at least one must be set.
type Config struct {
	Write      bool // writes (of random data) instead of reads
	Random     bool // blocks at random instead of in order
	BlockSize  int
	QueueDepth int
	Duration   time.Duration
	Bytes      int64
	// Offset and Span bound the region used (Span 0: to the device's end).
	// Requests are aligned to BlockSize from Offset; a tail smaller than a
	// block is not used.
	Offset, Span int64
	// Seed makes the random offsets and data repeatable.
	Seed uint64
}

// Result is what a workload measured.
type Result struct {
	Ops     int64
	Bytes   int64
	Elapsed time.Duration
	Latency Latency
}

// BytesPerSecond is the throughput.
func (r Result) BytesPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) / r.Elapsed.Seconds()
}

// OpsPerSecond is the rate of requests (IOPS).
func (r Result) OpsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// Run runs the workload on dev. It stops early, returning what it measured
// so far, when ctx is done; it stops at the first failed request and
// returns its error with the measurements until then.
func Run(ctx context.Context, dev Device, cfg Config) (Result, error) {
	if cfg.BlockSize <= 0 || cfg.QueueDepth <= 0 {
		return Result{}, errors.New("workload: the block size and queue depth must be positive")
	}
	if cfg.Duration <= 0 && cfg.Bytes <= 0 {
		return Result{}, errors.New("workload: neither a duration nor a byte count")
	}
	span := cfg.Span
	if span == 0 {
		span = dev.Size() - cfg.Offset
	}
	if cfg.Offset < 0 || span < 0 || cfg.Offset+span > dev.Size() {
		return Result{}, fmt.Errorf("workload: region [%d, +%d) outside a device of %d bytes", cfg.Offset, span, dev.Size())
	}
	bs := int64(cfg.BlockSize)
	blocks := span / bs
	if blocks == 0 {
		return Result{}, fmt.Errorf("workload: a region of %d bytes holds no block of %d", span, bs)
	}
	limit := int64(math.MaxInt64)
	if cfg.Bytes > 0 {
		limit = (cfg.Bytes + bs - 1) / bs
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.Duration > 0 {
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}

	var (
		issued   atomic.Int64 // requests started, which numbers them
		wg       sync.WaitGroup
		mu       sync.Mutex
		total    histogram
		firstErr error
	)
	start := time.Now()
	for w := range cfg.QueueDepth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(w)))
			buf := make([]byte, bs)
			if cfg.Write {
				rand.NewChaCha8(seedBytes(cfg.Seed, uint64(w))).Read(buf)
			}
			var h histogram
			var err error
			for ctx.Err() == nil {
				i := issued.Add(1) - 1
				if i >= limit {
					break
				}
				blk := i % blocks
				if cfg.Random {
					blk = rng.Int64N(blocks)
				}
				off := cfg.Offset + blk*bs
				t0 := time.Now()
				if cfg.Write {
					_, err = dev.WriteAt(buf, off)
				} else {
					_, err = dev.ReadAt(buf, off)
				}
				if err != nil {
					err = fmt.Errorf("workload: %s of %d bytes at %d: %w", opName(cfg.Write), bs, off, err)
					cancel()
					break
				}
				h.add(time.Since(t0))
			}
			mu.Lock()
			defer mu.Unlock()
			total.merge(&h)
			if err != nil && firstErr == nil {
				firstErr = err
			}
		}()
	}
	wg.Wait()
	r := Result{Ops: int64(total.n), Bytes: int64(total.n) * bs, Elapsed: time.Since(start), Latency: total.latency()}
	return r, firstErr
}

func opName(write bool) string {
	if write {
		return "write"
	}
	return "read"
}

// seedBytes makes a ChaCha8 seed of two numbers.
func seedBytes(a, b uint64) (s [32]byte) {
	for i := range 8 {
		s[i] = byte(a >> (8 * i))
		s[8+i] = byte(b >> (8 * i))
	}
	return s
}
