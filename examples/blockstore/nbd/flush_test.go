package nbd

import (
	"bytes"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestFlushReachesFile: a write answered, then flushed, is in the file when
// the flush's reply comes (read from the file itself, not through the
// server); so is a FUA write when its own reply comes.
func TestFlushReachesFile(t *testing.T) {
	path := tempFile(t, make([]byte, 1<<20))
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	addr, _ := startServer(t, f, Options{})
	c := dialClient(t, addr)

	data := randomBytes(65536)
	if err := c.Write(data, 4096, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	onDisk, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk[4096:4096+65536], data) {
		t.Fatal("the flushed write is not in the file")
	}

	fua := randomBytes(8192)
	if err := c.Write(fua, 1<<19, FlagFUA); err != nil {
		t.Fatal(err)
	}
	if onDisk, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk[1<<19:1<<19+8192], fua) {
		t.Fatal("the FUA write is not in the file")
	}
}

// syncGate is a Backend whose Sync waits to be let through, and which
// records the order of writes and syncs.
type syncGate struct {
	*Memory
	release chan struct{}
	syncing chan struct{}
	mu      sync.Mutex
	events  []string
}

func newSyncGate(size int64) *syncGate {
	return &syncGate{Memory: NewMemory(size), release: make(chan struct{}), syncing: make(chan struct{}, 16)}
}

func (g *syncGate) WriteAt(p []byte, off int64) (int, error) {
	n, err := g.Memory.WriteAt(p, off)
	g.mu.Lock()
	g.events = append(g.events, "write")
	g.mu.Unlock()
	return n, err
}

func (g *syncGate) Sync() error {
	g.syncing <- struct{}{}
	<-g.release
	g.mu.Lock()
	g.events = append(g.events, "sync")
	g.mu.Unlock()
	return nil
}

// TestFlushWaitsForSync: the replies to a flush and to a FUA write wait
// until the backend's Sync has returned, and that Sync comes after the
// write.
func TestFlushWaitsForSync(t *testing.T) {
	for _, name := range []string{"flush", "FUA write"} {
		t.Run(name, func(t *testing.T) {
			g := newSyncGate(1 << 20)
			addr, _ := startServer(t, g, Options{})
			c := dialClient(t, addr)
			var answered atomic.Bool
			done := make(chan error, 1)
			go func() {
				var err error
				if name == "flush" {
					if err = c.Write(make([]byte, 4096), 0, 0); err == nil {
						err = c.Flush()
					}
				} else {
					err = c.Write(make([]byte, 4096), 0, FlagFUA)
				}
				answered.Store(true)
				done <- err
			}()
			select {
			case <-g.syncing:
			case <-time.After(10 * time.Second):
				t.Fatal("Sync was not called")
			}
			time.Sleep(50 * time.Millisecond)
			if answered.Load() {
				t.Fatal("answered before Sync returned")
			}
			close(g.release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if len(g.events) != 2 || g.events[0] != "write" || g.events[1] != "sync" {
				t.Fatalf("backend calls %q, want a write, then a sync", g.events)
			}
		})
	}
}
