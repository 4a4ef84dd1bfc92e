package rdmanet

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// Registered memory (WriteFrom) over link.Pipe, which copies a request's
// bytes when it lands, not when it is posted: a WriteFrom that returned
// before every request reading its bytes completed (and, in a session,
// before the peer acknowledged them) lets the writer's poison, written
// right after it returns, reach the reader.

const memPoison = 0xa5

// writeFromMemory writes size bytes of the pattern to c through m, in
// WriteFroms of random sizes up to most (and a Write now and then), each
// from the same place in m, poisoned as soon as WriteFrom returns.
func writeFromMemory(t testing.TB, c *Conn, m *Memory, size, most int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 2))
	mem := m.Bytes()
	for pos := 0; pos < size; {
		k := min(1+rng.IntN(most), size-pos, len(mem))
		b := mem[rng.IntN(len(mem)-k+1):][:k]
		fillPattern(b, uint64(pos))
		var err error
		if rng.IntN(8) == 0 {
			_, err = c.Write(b)
		} else {
			_, err = c.WriteFrom(m, b)
			select {
			case <-m.Idle():
			default:
				t.Errorf("WriteFrom at %d returned with the memory still in use", pos)
			}
		}
		if err != nil {
			t.Errorf("write at %d: %v", pos, err)
			return
		}
		for i := range b {
			b[i] = memPoison
		}
		pos += k
	}
}

// readPattern reads size bytes and checks they are the pattern.
func readPattern(t testing.TB, c *Conn, size int) {
	buf := make([]byte, 64<<10)
	for pos := 0; pos < size; {
		n, err := c.Read(buf[:min(len(buf), size-pos)])
		if at := checkPattern(buf[:n], uint64(pos)); at >= 0 {
			t.Errorf("byte %d: %#x, want %#x", pos+at, buf[at], patternAt(uint64(pos+at)))
			c.Close()
			return
		}
		pos += n
		if err != nil {
			t.Errorf("Read at %d: %v", pos, err)
			return
		}
	}
}

// memoryStream streams size bytes from w's m to r.
func memoryStream(t *testing.T, w, r *Conn, m *Memory, size int, seed uint64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		writeFromMemory(t, w, m, size, 200<<10, seed)
	}()
	readPattern(t, r, size)
	wg.Wait()
}

func newTestMemory(t testing.TB, size int) *Memory {
	t.Helper()
	m, err := NewMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Errorf("Memory.Close: %v", err)
		}
	})
	return m
}

// TestWriteFromInPlace: WriteFrom sends from the registered memory, in
// both wire protocols and as over iWARP, and returns only once its bytes
// may change.
func TestWriteFromInPlace(t *testing.T) {
	for _, mode := range hostModes {
		t.Run(mode.name, func(t *testing.T) {
			goroutineCheck(t)
			cfg := Config{RecvBuffer: 64 << 10, SendBuffer: 32 << 10, RecvDepth: 8}
			a, b, pa, _ := memPair(t, cfg, mode.features)
			pa.SetDelay(20 * time.Microsecond)
			m := newTestMemory(t, 256<<10)
			memoryStream(t, a, b, m, 8<<20, 11)
			st := m.Stats()
			t.Logf("%+v", st)
			if st.Sent == 0 || st.Copied != 0 {
				t.Errorf("stats %+v: want every byte sent from the memory", st)
			}
			closeAndWait(t, a)
			closeAndWait(t, b)
		})
	}
}

// TestWriteFromGroupStream: the same over a stream of a link group.
func TestWriteFromGroupStream(t *testing.T) {
	goroutineCheck(t)
	cfg, _ := Config{}.withDefaults()
	x, y := groupMuxes(t, groupStreamConfig(cfg), groupBase(8))
	a, b := groupConnPair(t, Config{}, x, y)
	m := newTestMemory(t, 512<<10)
	memoryStream(t, a, b, m, 8<<20, 12)
	if st := m.Stats(); st.Sent == 0 || st.Copied != 0 {
		t.Errorf("stats %+v: want every byte sent from the memory", st)
	}
	closeAndWait(t, a)
	closeAndWait(t, b)
}

// TestWriteFromCopiesWhereNotRegistered: where registration fails (the
// pinned-memory limit), WriteFrom copies, and says so.
func TestWriteFromCopiesWhereNotRegistered(t *testing.T) {
	goroutineCheck(t)
	a, b, pa, _ := memPair(t, Config{}, hostModes[0].features)
	pa.FailRegisterMem()
	m := newTestMemory(t, 64<<10)
	memoryStream(t, a, b, m, 1<<20, 13)
	if st := m.Stats(); st.Sent != 0 || st.Copied == 0 {
		t.Errorf("stats %+v: want every byte copied", st)
	}
	closeAndWait(t, a)
	closeAndWait(t, b)
}

// TestWriteFromAcrossResumes: a session's WriteFroms across link
// failures: the bytes the peer did not acknowledge are sent again, from
// the ring, after the writer poisoned its memory.
func TestWriteFromAcrossResumes(t *testing.T) {
	goroutineCheck(t)
	cfg := Config{RecvBuffer: 32 << 10, SendBuffer: 16 << 10, RecvDepth: 16, KeepAlive: 250 * time.Millisecond}
	p := newSessionPair(t, cfg)
	m := newTestMemory(t, 128<<10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		memoryStream(t, p.client, p.server, m, 16<<20, 14)
	}()
	p.faultsDuring(done, 6, rand.NewPCG(7, 8))
	<-done
	t.Logf("resumptions %d, %+v", p.resumed.Load(), m.Stats())
	if p.resumed.Load() < 2 {
		t.Errorf("%d resumptions: the stream ended before the faults tested anything", p.resumed.Load())
	}
	if m.Stats().Sent == 0 {
		t.Errorf("nothing sent from the memory")
	}
	closeAndWait(t, p.client)
	closeAndWait(t, p.server)
}

// TestWriteFromMisuse: typed errors, and a memory in use that Close
// waits for.
func TestWriteFromMisuse(t *testing.T) {
	goroutineCheck(t)
	a, b, pa, _ := memPair(t, Config{}, hostModes[0].features)
	m := newTestMemory(t, 64<<10)
	if _, err := a.WriteFrom(m, make([]byte, 10)); !errors.Is(err, ErrNotInMemory) {
		t.Errorf("WriteFrom of bytes outside the memory: %v, want ErrNotInMemory", err)
	}
	if _, err := a.WriteBuffer(10); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteFrom(m, m.Bytes()[:10]); !errors.Is(err, ErrBufferHeld) {
		t.Errorf("WriteFrom while a buffer is held: %v, want ErrBufferHeld", err)
	}
	if _, err := a.Commit(0); err != nil {
		t.Fatal(err)
	}
	// A deadline that passes while the bytes are in flight: the error,
	// and the memory busy until they land.
	pa.SetDelay(2 * time.Second) // a margin for a loaded host between the deadline and Close
	a.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := a.WriteFrom(m, m.Bytes()[:4096])
	if !errors.Is(err, os.ErrDeadlineExceeded) || n != 4096 {
		t.Errorf("WriteFrom past its deadline = %d, %v; want 4096 posted and the deadline", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	if err := m.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Memory.Close with a request in flight: %v, want it to wait", err)
	}
	cancel()
	select {
	case <-m.Idle():
	case <-time.After(10 * time.Second):
		t.Fatal("the memory stayed in use after its bytes landed")
	}
	buf := make([]byte, 4096)
	if _, err := io.ReadFull(b, buf); err != nil {
		t.Fatal(err)
	}
	closeAndWait(t, a)
	if _, err := a.WriteFrom(m, m.Bytes()[:10]); !errors.Is(err, net.ErrClosed) {
		t.Errorf("WriteFrom after Close: %v, want net.ErrClosed", err)
	}
	closeAndWait(t, b)
}

// TestPostFromStreams: PostFrom from four Memories in turn, each refilled
// once Idle says no request reads it, and poisoned at once before that:
// with nothing else in flight on the writer's side, its completions still
// come (Idle is the completion).
func TestPostFromStreams(t *testing.T) {
	for _, mode := range hostModes[:1] {
		t.Run(mode.name, func(t *testing.T) {
			goroutineCheck(t)
			cfg := Config{RecvBuffer: 64 << 10, SendBuffer: 64 << 10, RecvDepth: 8}
			a, b, pa, _ := memPair(t, cfg, mode.features)
			pa.SetDelay(20 * time.Microsecond)
			var mems [4]*Memory
			for i := range mems {
				mems[i] = newTestMemory(t, 16<<10)
			}
			const size = 4 << 20
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for pos, i := 0, 0; pos < size; i++ {
					m := mems[i%len(mems)]
					select {
					case <-m.Idle():
					case <-time.After(10 * time.Second):
						t.Errorf("memory %d still in use after 10 s", i%len(mems))
						return
					}
					k := min(len(m.Bytes()), size-pos)
					bs := m.Bytes()[:k]
					fillPattern(bs, uint64(pos))
					if _, err := a.PostFrom(m, bs); err != nil {
						t.Errorf("PostFrom at %d: %v", pos, err)
						return
					}
					pos += k
				}
				for _, m := range mems {
					<-m.Idle()
					for i := range m.Bytes() {
						m.Bytes()[i] = memPoison
					}
				}
			}()
			readPattern(t, b, size)
			wg.Wait()
			for i, m := range mems {
				if st := m.Stats(); st.Sent == 0 || st.Copied != 0 {
					t.Errorf("memory %d: %+v, want every byte sent from it", i, st)
				}
			}
			closeAndWait(t, a)
			closeAndWait(t, b)
		})
	}
}
