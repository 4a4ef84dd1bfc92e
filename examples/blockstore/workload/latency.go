package workload

import (
	"math/bits"
	"time"
)

// Latency summarizes the time requests took.
type Latency struct {
	Mean, P50, P99, Max time.Duration
}

// histogram counts request times in buckets a 64th of a power of two wide
// (within about 1.6% of the time, exact below 64 ns), so a run of any
// length takes the same memory: each goroutine keeps its own, merged at the
// end.
type histogram struct {
	counts [(64 - subBits + 1) * subBuckets]uint64
	n      uint64
	sum    time.Duration
	max    time.Duration
}

const (
	subBits    = 6
	subBuckets = 1 << subBits
)

// bucket returns the bucket of a time in nanoseconds: the first 64 hold one
// value each; after that, 64 buckets for each power of two.
func bucket(ns uint64) int {
	if ns < subBuckets {
		return int(ns)
	}
	exp := bits.Len64(ns) - 1 // at least subBits
	sub := (ns >> (exp - subBits)) & (subBuckets - 1)
	return (exp-subBits+1)*subBuckets + int(sub)
}

// bucketMiddle returns the middle of a bucket's range, in nanoseconds.
func bucketMiddle(i int) uint64 {
	if i < subBuckets {
		return uint64(i)
	}
	exp := i/subBuckets + subBits - 1
	sub := uint64(i % subBuckets)
	width := uint64(1) << (exp - subBits)
	return (subBuckets+sub)*width + width/2
}

func (h *histogram) add(d time.Duration) {
	d = max(d, 0)
	h.counts[bucket(uint64(d))]++
	h.n++
	h.sum += d
	h.max = max(h.max, d)
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// percentile returns the time under which a fraction p of the requests
// took (the middle of its bucket, never above the largest).
func (h *histogram) percentile(p float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(p*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(time.Duration(bucketMiddle(i)), h.max)
		}
	}
	return h.max
}

func (h *histogram) latency() Latency {
	if h.n == 0 {
		return Latency{}
	}
	return Latency{
		Mean: h.sum / time.Duration(h.n),
		P50:  h.percentile(0.50),
		P99:  h.percentile(0.99),
		Max:  h.max,
	}
}
