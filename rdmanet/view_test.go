package rdmanet

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// Zero-copy over link.Pipe, which poisons a ring given back or closed: a
// view whose ring was reused, replaced or freed under it reads poison or
// later bytes, which viewReader checks at release.

// patternAt is the byte at stream position p of viewStream's streams.
func patternAt(p uint64) byte {
	x := (p + 1) * 0x9E3779B97F4A7C15
	x ^= x >> 32
	x *= 0xD6E8FEB86659FD93
	return byte(x >> 56)
}

// fillPattern fills b with the stream's bytes from position p.
func fillPattern(b []byte, p uint64) {
	for i := range b {
		b[i] = patternAt(p + uint64(i))
	}
}

// checkPattern reports the first position in b (at stream position p)
// that is not the stream's byte, or -1.
func checkPattern(b []byte, p uint64) int {
	for i := range b {
		if b[i] != patternAt(p+uint64(i)) {
			return i
		}
	}
	return -1
}

// zeroCopyCounts is what a side of viewStream did in place.
type zeroCopyCounts struct {
	views, viewsInPlace, full int
	buffers, buffersInRing    int
}

// writeZeroCopy writes size bytes of the pattern to c, with Writes and
// with write buffers filled in place, of random sizes up to most, then
// closes its sending side.
func writeZeroCopy(t testing.TB, c *Conn, size, most int, seed uint64) (n zeroCopyCounts) {
	rng := rand.New(rand.NewPCG(seed, 1))
	buf := make([]byte, most)
	for pos := 0; pos < size; {
		k := min(1+rng.IntN(most), size-pos)
		if rng.IntN(3) == 0 || os.Getenv("ZC_NOBUF") != "" {
			fillPattern(buf[:k], uint64(pos))
			if _, err := c.Write(buf[:k]); err != nil {
				t.Errorf("Write at %d: %v", pos, err)
				return n
			}
			pos += k
			continue
		}
		b, err := c.WriteBuffer(k)
		if err != nil {
			t.Errorf("WriteBuffer(%d) at %d: %v", k, pos, err)
			return n
		}
		n.buffers++
		c.mu.Lock()
		if c.eng.HoldsMemory() {
			n.buffersInRing++
		}
		c.mu.Unlock()
		if len(b) != k {
			t.Errorf("WriteBuffer(%d) returned %d bytes", k, len(b))
			return n
		}
		// Sometimes only part of it goes.
		if rng.IntN(4) == 0 {
			k = rng.IntN(k + 1)
		}
		fillPattern(b[:k], uint64(pos))
		if got, err := c.Commit(k); err != nil || got != k {
			t.Errorf("Commit(%d) at %d: %d, %v", k, pos, got, err)
			return n
		}
		pos += k
	}
	err := c.CloseWrite()
	if errors.Is(err, ErrHalfCloseUnsupported) {
		err = c.Close() // Valkey's protocol: the bytes written are still delivered
	}
	if err != nil {
		t.Errorf("CloseWrite: %v", err)
	}
	return n
}

// heldAt is a view held and where it is in the stream.
type heldAt struct {
	b   []byte
	pos uint64
}

// readZeroCopy reads the pattern from c until EOF with views of random
// sizes up to most (and some Reads), holding up to hold views at once and
// releasing them in random order; every view is checked when taken and
// again when released. It returns the bytes read.
func readZeroCopy(t testing.TB, c *Conn, most, hold int, seed uint64) (total uint64, n zeroCopyCounts) {
	rng := rand.New(rand.NewPCG(seed, 2))
	var held []heldAt
	release := func(i int) bool {
		h := held[i]
		if at := checkPattern(h.b, h.pos); at >= 0 {
			t.Errorf("view of %d bytes at %d changed before its release: byte %d is %#x, want %#x", len(h.b), h.pos, at, h.b[at], patternAt(h.pos+uint64(at)))
			return false
		}
		if err := c.ReleaseView(h.b); err != nil {
			t.Errorf("ReleaseView: %v", err)
			return false
		}
		held = append(held[:i], held[i+1:]...)
		return true
	}
	releaseAll := func() bool {
		for len(held) > 0 {
			if !release(0) {
				return false
			}
		}
		return true
	}
	buf := make([]byte, most)
	for {
		if len(held) > 0 && (len(held) >= hold || rng.IntN(3) == 0) {
			if !release(rng.IntN(len(held))) {
				return total, n
			}
			continue
		}
		if rng.IntN(5) == 0 || os.Getenv("ZC_NOVIEW") != "" {
			k, err := c.Read(buf[:1+rng.IntN(most)])
			if at := checkPattern(buf[:k], total); at >= 0 {
				t.Errorf("Read at %d: byte %d wrong", total, at)
				return total, n
			}
			total += uint64(k)
			if err == io.EOF {
				break
			}
			if errors.Is(err, ErrViewsFull) {
				n.full++
				if !releaseAll() {
					return total, n
				}
				continue
			}
			if err != nil {
				t.Errorf("Read at %d: %v", total, err)
				return total, n
			}
			continue
		}
		c.mu.Lock()
		before, _ := c.eng.ViewsHeld()
		c.mu.Unlock()
		v, err := c.ReadView(1 + rng.IntN(most))
		if errors.Is(err, ErrViewsFull) {
			n.full++
			if !releaseAll() {
				return total, n
			}
			continue
		}
		if len(v) > 0 {
			n.views++
			c.mu.Lock()
			if after, _ := c.eng.ViewsHeld(); after > before {
				n.viewsInPlace++
			}
			c.mu.Unlock()
			if at := checkPattern(v, total); at >= 0 {
				t.Errorf("view of %d bytes at %d: byte %d wrong: % x, want % x", len(v), total, at, v[at:min(at+8, len(v))], []byte{patternAt(total + uint64(at)), patternAt(total + uint64(at) + 1), patternAt(total + uint64(at) + 2)})
				for d := -70000; d < 70000; d++ {
					p := int(total) + at + d
					if p >= 0 && checkPattern(v[at:min(at+16, len(v))], uint64(p)) < 0 {
						t.Errorf("the bytes are the stream's at %d (%+d)", p, d)
					}
				}
				return total, n
			}
			held = append(held, heldAt{v, total})
			total += uint64(len(v))
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			t.Errorf("ReadView at %d: %v", total, err)
			return total, n
		}
	}
	for len(held) > 0 {
		if !release(len(held) - 1) {
			break
		}
	}
	return total, n
}

// viewStream streams size bytes from w to r, zero-copy on both sides, and
// checks every byte.
func viewStream(t *testing.T, w, r *Conn, size int, seed uint64) (wn, rn zeroCopyCounts) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		wn = writeZeroCopy(t, w, size, 9000, seed)
	}()
	total, rn := readZeroCopy(t, r, 9000, 12, seed)
	if total != uint64(size) {
		w.Close() // the writer may wait for a reader that gave up
		r.Close()
	}
	wg.Wait()
	if total != uint64(size) {
		t.Errorf("read %d bytes, want %d", total, size)
	}
	return wn, rn
}

// TestViewsStayUntilReleased: views and write buffers of every size
// across rings that grow and shrink, in both wire protocols, with up to
// 12 views held at once and released out of order while the peer writes
// on. A view the peer's bytes overwrote, or whose ring was given back,
// fails the check at its release.
func TestViewsStayUntilReleased(t *testing.T) {
	for _, m := range hostModes {
		t.Run(m.name, func(t *testing.T) {
			goroutineCheck(t)
			cfg := Config{RecvBuffer: 64 << 10, SendBuffer: 32 << 10, RecvDepth: 8}
			a, b, pa, pb := memPair(t, cfg, m.features)
			pa.SetDelay(20 * time.Microsecond)
			wn, rn := viewStream(t, a, b, 8<<20, 7)
			t.Logf("writer %+v, reader %+v; reader's rings %+v", wn, rn, pb.Stats())
			if m.features != 0 && pb.Stats().RingsReleased == 0 {
				t.Errorf("the receive ring was never replaced: growth under views untested")
			}
			if wn.buffersInRing == 0 {
				t.Errorf("no write buffer of %d was in the ring", wn.buffers)
			}
			if m.features != 0 && rn.viewsInPlace == 0 {
				t.Errorf("no view of %d was in place", rn.views)
			}
			closeAndWait(t, a)
			closeAndWait(t, b)
		})
	}
}

// TestViewsFullIsAnError: views that hold the whole receive ring, at its
// largest, make a ReadView that needs more fail at once with
// ErrViewsFull instead of waiting for bytes that cannot come; released,
// the bytes come.
func TestViewsFullIsAnError(t *testing.T) {
	goroutineCheck(t)
	cfg := Config{RecvBuffer: 16 << 10, SendBuffer: 16 << 10, RecvDepth: 8}
	a, b, _, _ := memPair(t, cfg, hostModes[0].features)
	defer closeAndWait(t, a)
	defer closeAndWait(t, b)
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		fillPattern(buf, 0)
		_, err := a.Write(buf)
		errc <- err
	}()
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	var held [][]byte
	var pos uint64
	for {
		v, err := b.ReadView(4 << 10)
		if errors.Is(err, ErrViewsFull) {
			break
		}
		if err != nil {
			t.Fatalf("ReadView after %d views: %v", len(held), err)
		}
		if at := checkPattern(v, pos); at >= 0 {
			t.Fatalf("view at %d: byte %d wrong", pos, at)
		}
		held, pos = append(held, v), pos+uint64(len(v))
	}
	if pos < 16<<10-4<<10 {
		t.Errorf("ErrViewsFull after %d bytes held; the ring holds %d", pos, 16<<10)
	}
	for _, v := range held {
		if err := b.ReleaseView(v); err != nil {
			t.Fatal(err)
		}
	}
	rest := make([]byte, 64<<10-pos)
	if _, err := io.ReadFull(b, rest); err != nil {
		t.Fatalf("after the release: %v", err)
	}
	if at := checkPattern(rest, pos); at >= 0 {
		t.Fatalf("after the release: byte %d wrong", at)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestViewMisuse: typed errors for a release of what is not a view held,
// a commit without a buffer, and a Write while a buffer is held.
func TestViewMisuse(t *testing.T) {
	goroutineCheck(t)
	a, b, _, _ := memPair(t, Config{}, hostModes[0].features)
	defer closeAndWait(t, a)
	defer closeAndWait(t, b)
	if _, err := a.Write([]byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	v, err := b.ReadView(6)
	if err != nil || string(v) != "012345" {
		t.Fatalf("ReadView(6) = %q, %v", v, err)
	}
	for name, w := range map[string][]byte{"a slice of its own": make([]byte, 6), "nil": nil, "resliced": v[1:], "shortened": v[:3]} {
		if err := b.ReleaseView(w); !errors.Is(err, ErrNotView) {
			t.Errorf("ReleaseView of %s: %v, want ErrNotView", name, err)
		}
	}
	if err := b.ReleaseView(v); err != nil {
		t.Fatalf("ReleaseView: %v", err)
	}
	if err := b.ReleaseView(v); !errors.Is(err, ErrNotView) {
		t.Errorf("second ReleaseView: %v, want ErrNotView", err)
	}
	if _, err := b.ReadView(0); err == nil {
		t.Error("ReadView(0) succeeded")
	}
	// The bytes after the view come next.
	rest := make([]byte, 4)
	if _, err := io.ReadFull(b, rest); err != nil || string(rest) != "6789" {
		t.Fatalf("Read after the view: %q, %v", rest, err)
	}

	if _, err := a.Commit(0); !errors.Is(err, ErrNoBuffer) {
		t.Errorf("Commit without a buffer: %v, want ErrNoBuffer", err)
	}
	w, err := a.WriteBuffer(8)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, ErrBufferHeld) {
		t.Errorf("Write while a buffer is held: %v, want ErrBufferHeld", err)
	}
	if _, err := a.WriteBuffer(1); !errors.Is(err, ErrBufferHeld) {
		t.Errorf("WriteBuffer while a buffer is held: %v, want ErrBufferHeld", err)
	}
	if _, err := a.Commit(9); !errors.Is(err, ErrNoBuffer) {
		t.Errorf("Commit beyond the buffer: %v, want ErrNoBuffer", err)
	}
	copy(w, "abcdefgh")
	if n, err := a.Commit(3); n != 3 || err != nil {
		t.Fatalf("Commit(3) = %d, %v", n, err)
	}
	if _, err := a.Write([]byte("!")); err != nil {
		t.Fatalf("Write after the commit: %v", err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(b, got); err != nil || string(got) != "abc!" {
		t.Fatalf("read %q, %v; want \"abc!\"", got, err)
	}
}

// TestViewsOutliveClose: a closed connection keeps its rings until its
// views are released and its write buffer committed, and those calls
// still work; the view's bytes are intact until then (link.Pipe poisons
// the rings it frees at Close).
func TestViewsOutliveClose(t *testing.T) {
	goroutineCheck(t)
	a, b, _, _ := memPair(t, Config{}, hostModes[0].features)
	msg := make([]byte, 1000)
	fillPattern(msg, 0)
	if _, err := a.Write(msg); err != nil {
		t.Fatal(err)
	}
	v, err := b.ReadView(len(msg))
	if err != nil {
		t.Fatal(err)
	}
	w, err := b.WriteBuffer(100)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	a.Close()
	select {
	case <-b.released:
		t.Fatal("the rings were freed with a view and a write buffer held")
	case <-time.After(50 * time.Millisecond):
	}
	if at := checkPattern(v, 0); at >= 0 {
		t.Fatalf("the view changed after Close: byte %d", at)
	}
	copy(w, "after close") // the memory is still the connection's
	if _, err := b.ReadView(1); !errors.Is(err, net.ErrClosed) {
		t.Errorf("ReadView after Close: %v, want net.ErrClosed", err)
	}
	if _, err := b.Commit(10); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Commit after Close: %v, want net.ErrClosed", err)
	}
	select {
	case <-b.released:
		t.Fatal("the rings were freed with a view held")
	case <-time.After(50 * time.Millisecond):
	}
	if err := b.ReleaseView(v); err != nil {
		t.Fatalf("ReleaseView after Close: %v", err)
	}
	select {
	case <-b.released:
	case <-time.After(2 * lingerTimeout):
		t.Fatal("the rings were not freed once the view was released")
	}
	<-a.released
}

// TestViewsAcrossResumes: a session's views and write buffers across
// link failures: the rings are the session's, and a view held across a
// resume is still the stream's bytes.
func TestViewsAcrossResumes(t *testing.T) {
	goroutineCheck(t)
	cfg := Config{RecvBuffer: 32 << 10, SendBuffer: 16 << 10, RecvDepth: 16, KeepAlive: 250 * time.Millisecond}
	p := newSessionPair(t, cfg)
	done := make(chan struct{})
	var wn, rn zeroCopyCounts
	go func() {
		defer close(done)
		wn, rn = viewStream(t, p.client, p.server, 16<<20, 3)
	}()
	p.faultsDuring(done, 6, rand.NewPCG(5, 6))
	<-done
	t.Logf("resumptions %d; writer %+v, reader %+v", p.resumed.Load(), wn, rn)
	if p.resumed.Load() < 2 {
		t.Errorf("%d resumptions: the stream ended before the faults tested anything", p.resumed.Load())
	}
	closeAndWait(t, p.client)
	closeAndWait(t, p.server)
}

// TestReadViewUpToInPlace: a streaming reader's views of what arrived,
// up to a size, are in place in the ring wherever the protocol has one,
// even where ReadView of that size would wrap at the ring's end and copy.
func TestReadViewUpToInPlace(t *testing.T) {
	for _, m := range hostModes {
		t.Run(m.name, func(t *testing.T) {
			goroutineCheck(t)
			cfg := Config{RecvBuffer: 64 << 10, SendBuffer: 32 << 10, RecvDepth: 8}
			a, b, _, _ := memPair(t, cfg, m.features)
			const size = 4 << 20
			go func() {
				rng := rand.New(rand.NewPCG(9, 1))
				buf := make([]byte, 20000)
				for pos := 0; pos < size; {
					k := min(1+rng.IntN(len(buf)), size-pos)
					fillPattern(buf[:k], uint64(pos))
					if _, err := a.Write(buf[:k]); err != nil {
						return
					}
					pos += k
				}
			}()
			rng := rand.New(rand.NewPCG(9, 2))
			b.SetReadDeadline(time.Now().Add(time.Minute))
			copies := 0
			for pos := 0; pos < size; {
				most := 1 + rng.IntN(48<<10)
				v, err := b.ReadViewUpTo(most)
				if err != nil {
					t.Fatalf("ReadViewUpTo(%d) at %d: %v", most, pos, err)
				}
				if len(v) == 0 || len(v) > most {
					t.Fatalf("ReadViewUpTo(%d) gave %d bytes", most, len(v))
				}
				b.mu.Lock()
				_, c := b.eng.ViewsHeld()
				b.mu.Unlock()
				copies += c
				if at := checkPattern(v, uint64(pos)); at >= 0 {
					t.Fatalf("view at %d: byte %d wrong", pos, at)
				}
				if err := b.ReleaseView(v); err != nil {
					t.Fatal(err)
				}
				pos += len(v)
			}
			if m.features != 0 && copies > 0 {
				t.Errorf("%d of the views were copies", copies)
			}
			closeAndWait(t, a)
			closeAndWait(t, b)
		})
	}
}
