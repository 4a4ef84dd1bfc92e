package tcplink

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// engineEnd drives an internal/stream Engine over a link as rdmanet.Conn
// does, much simplified: one poller goroutine takes completions and sleeps
// in the link's Wait; Write and Read run the engine under the same lock and
// wait for the poller's news when they would block.
type engineEnd struct {
	l   *Link
	mu  sync.Mutex
	eng *stream.Engine
	// The poller handled a batch: news for a Read, and for a Write
	// (capacity 1 each).
	readNews, writeNews chan struct{}
	pollDone            chan struct{}
}

func newEngineEnd(t *testing.T, l *Link, peer peerInfo) *engineEnd {
	addr, key := l.RecvRingKey()
	features := wire.FeatureRing | wire.FeatureShutdown
	eng, err := stream.New(stream.Config{
		Features: features, PeerHello: true,
		Peer: wire.Hello{Version: wire.HelloVersion, Features: features, RecvDepth: uint16(peer.recvDepth), RingSize: uint32(peer.ring)},
		Caps: l.Caps(), SendRing: l.SendRing(), RecvRing: l.RecvRing(),
		RecvAddr: addr, RecvKey: key,
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &engineEnd{l: l, eng: eng, readNews: make(chan struct{}, 1), writeNews: make(chan struct{}, 1), pollDone: make(chan struct{})}
	e.mu.Lock()
	eng.Start()
	eng.Flush(l)
	e.mu.Unlock()
	go e.poll(t)
	return e
}

// peerInfo is what an end knows of its peer from its Hello.
type peerInfo struct{ recvDepth, ring int }

func (e *engineEnd) notify() {
	for _, ch := range []chan struct{}{e.readNews, e.writeNews} {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// poll takes completions until the link ends.
func (e *engineEnd) poll(t *testing.T) {
	defer close(e.pollDone)
	defer e.notify()
	cs := make([]link.Completion, 32)
	for {
		e.mu.Lock()
		n, err := e.l.Poll(cs)
		if err != nil {
			e.mu.Unlock()
			t.Errorf("Poll: %v", err)
			return
		}
		if n == 0 {
			e.l.Arm()
			n, _ = e.l.Poll(cs)
		}
		end := false
		for i := range cs[:n] {
			e.eng.Handle(&cs[i])
			end = end || cs[i].Kind == link.Disconnected || cs[i].Kind == link.Failed
		}
		if n > 0 {
			e.eng.AfterCompletions()
			e.eng.Flush(e.l)
		}
		e.mu.Unlock()
		if n > 0 {
			e.notify()
		}
		if end {
			return
		}
		if n == 0 {
			if err := e.l.Wait(); err != nil && !errors.Is(err, link.ErrWoken) {
				t.Errorf("Wait: %v", err)
				return
			}
		}
	}
}

// wait waits for the poller's news, up to the hang guard.
func (e *engineEnd) wait(t *testing.T, news chan struct{}, what string) bool {
	select {
	case <-news:
		return true
	case <-time.After(hangGuard):
		t.Errorf("%s: no progress for %v", what, hangGuard)
		return false
	}
}

func (e *engineEnd) write(t *testing.T, b []byte) bool {
	for len(b) > 0 {
		e.mu.Lock()
		n, err := e.eng.Write(b)
		e.eng.Flush(e.l)
		e.mu.Unlock()
		b = b[n:]
		switch {
		case err == stream.ErrWouldBlock:
			if !e.wait(t, e.writeNews, "Write") {
				return false
			}
		case err != nil:
			t.Errorf("Write: %v", err)
			return false
		}
	}
	return true
}

func (e *engineEnd) read(t *testing.T, b []byte) (int, error) {
	for {
		e.mu.Lock()
		n, err := e.eng.Read(b)
		e.eng.Flush(e.l)
		e.mu.Unlock()
		if err != stream.ErrWouldBlock {
			return n, err
		}
		if !e.wait(t, e.readNews, "Read") {
			return 0, errors.New("hang")
		}
	}
}

// TestEngineOverTCP: the stream engine runs unchanged over a TCP link:
// both ends write and read 16 MiB at once in writes of random sizes, then
// shut down their sending side (the peer reads EOF), and disconnect.
func TestEngineOverTCP(t *testing.T) {
	total := 16 << 20
	if testing.Short() {
		total = 1 << 20
	}
	sp := spec{sendRing: 256 << 10, recvRing: 256 << 10, sendDepth: 32, recvDepth: 16, controlDepth: 4}
	a, b := newPair(t, "tcp", sp, sp)
	ea := newEngineEnd(t, a, peerInfo{sp.recvDepth, sp.recvRing})
	eb := newEngineEnd(t, b, peerInfo{sp.recvDepth, sp.recvRing})

	var wg sync.WaitGroup
	sums := make([][2][32]byte, 2) // per end: what it wrote, what it read
	for i, e := range []*engineEnd{ea, eb} {
		wg.Add(2)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			h := sha256.New()
			buf := make([]byte, 200<<10)
			for sent := 0; sent < total; {
				n := min(1+rng.IntN(len(buf)>>rng.IntN(10)), total-sent)
				for j := range buf[:n] {
					buf[j] = byte(rng.Uint32())
				}
				h.Write(buf[:n])
				if !e.write(t, buf[:n]) {
					return
				}
				sent += n
			}
			copy(sums[i][0][:], h.Sum(nil))
			e.mu.Lock()
			err := e.eng.CloseWrite()
			e.eng.Flush(e.l)
			e.mu.Unlock()
			if err != nil {
				t.Errorf("CloseWrite: %v", err)
			}
		}()
		go func() {
			defer wg.Done()
			h := sha256.New()
			buf := make([]byte, 50<<10)
			got := 0
			for {
				n, err := e.read(t, buf)
				h.Write(buf[:n])
				got += n
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Errorf("Read after %d bytes: %v", got, err)
					return
				}
			}
			if got != total {
				t.Errorf("read %d bytes, want %d", got, total)
			}
			copy(sums[i][1][:], h.Sum(nil))
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if !bytes.Equal(sums[0][0][:], sums[1][1][:]) || !bytes.Equal(sums[1][0][:], sums[0][1][:]) {
		t.Error("the bytes read are not those written")
	}
	// An orderly close: once every request completed, disconnect.
	for _, e := range []*engineEnd{ea, eb} {
		e.mu.Lock()
		e.eng.Drain()
		e.eng.Flush(e.l)
		e.mu.Unlock()
		for {
			e.mu.Lock()
			drained := e.eng.Drained()
			e.mu.Unlock()
			if drained || !e.wait(t, e.writeNews, "Drain") {
				break
			}
		}
	}
	ea.mu.Lock()
	ea.l.Disconnect()
	ea.mu.Unlock()
	<-ea.pollDone
	<-eb.pollDone
	for _, e := range []*engineEnd{ea, eb} {
		if err := e.eng.Err(); err != nil {
			t.Errorf("engine error: %v", err)
		}
	}
}
