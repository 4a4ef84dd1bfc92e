package nbd

import (
	"sync"
	"testing"
	"time"
)

// barrier is a Backend whose reads wait until n of them are running at
// once (or a time has passed), and count how many did at most.
type barrier struct {
	*Memory
	n       int
	mu      sync.Mutex
	running int
	most    int
	opened  bool // all is closed
	all     chan struct{}
}

func (b *barrier) ReadAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	b.running++
	b.most = max(b.most, b.running)
	if b.running == b.n && b.most == b.n && !b.opened {
		b.opened = true
		close(b.all)
	}
	b.mu.Unlock()
	select {
	case <-b.all:
	case <-time.After(5 * time.Second):
	}
	b.mu.Lock()
	b.running--
	b.mu.Unlock()
	return b.Memory.ReadAt(p, off)
}

// TestRequestsOverlap: a connection's requests run on the backend at once,
// as many as there are workers, so that a queue depth above one overlaps
// the backend's work (a file's reads).
func TestRequestsOverlap(t *testing.T) {
	const workers = 4
	b := &barrier{Memory: NewMemory(1 << 20), n: workers, all: make(chan struct{})}
	addr, _ := startServer(t, b, Options{Workers: workers})
	c := dialClient(t, addr)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 2 * workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Read(make([]byte, 4096), int64(i)*4096); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if b.most != workers {
		t.Errorf("at most %d reads ran at once, want %d", b.most, workers)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("the reads took %v: they waited for one another", d)
	}
}
