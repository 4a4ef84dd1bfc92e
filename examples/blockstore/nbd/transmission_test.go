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

// Immediate: a barrier's reads wait for one another, so no reader may run
// one itself (Memory's Immediate, which it embeds, would say it may).
func (b *barrier) Immediate() bool { return false }

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

// notImmediate is a Memory that does not say its calls return at once.
type notImmediate struct{ Backend }

// TestLoneRequestsInline: on an Immediate backend a client that waits for
// each answer has every request run by the connection's reader (no
// hand-off to a worker); on another backend, none is; and requests that
// come together still go to the workers and all get answered.
func TestLoneRequestsInline(t *testing.T) {
	const n = 50
	for _, tc := range []struct {
		name    string
		backend Backend
		inline  bool
	}{{"Memory", NewMemory(1 << 20), true}, {"not Immediate", notImmediate{NewMemory(1 << 20)}, false}} {
		t.Run(tc.name, func(t *testing.T) {
			addr, s := startServer(t, tc.backend, Options{})
			c := dialClient(t, addr)
			buf := make([]byte, 4096)
			for i := range n {
				if err := c.Write(buf, int64(i)*4096, 0); err != nil {
					t.Fatal(err)
				}
				if err := c.Read(buf, int64(i)*4096); err != nil {
					t.Fatal(err)
				}
			}
			want := int64(0)
			if tc.inline {
				want = 2 * n
			}
			if got := s.inlined.Load(); got != want {
				t.Fatalf("%d of %d lone requests run by the reader, want %d", got, 2*n, want)
			}
			// Many at once: answered whoever runs them.
			var wg sync.WaitGroup
			for i := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := c.Read(make([]byte, 4096), int64(i%8)*4096); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
		})
	}
}
