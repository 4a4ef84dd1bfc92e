package link_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	. "github.com/rdmanet/sdk/internal/link"
)

// errHang is how the stress test's hang guard cuts the pipe.
var errHang = errors.New("stress test hung")

// TestPipeStress moves data from a writer on one end to a reader on the other
// as the engine does (a ring on each side, byte credits returned in control
// messages, completions taken between Arm and Wait), while a third goroutine
// changes delays, withholds receives and wakes both ends at random. What the
// reader hashed must be what the writer hashed.
func TestPipeStress(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	total := 1 << 20
	if testing.Short() {
		total = 1 << 16
	}

	a, b := newTestPipe(t,
		PipeConfig{SendRing: 8192, RecvRing: 64, SendDepth: 16, RecvDepth: 8, ControlDepth: 1, RNRRetry: 7},
		PipeConfig{SendRing: 64, RecvRing: 4096, SendDepth: 4, RecvDepth: 8, ControlDepth: 4, RNRRetry: 7})
	guard := time.AfterFunc(hangGuard, func() { a.Cut(errHang) })
	defer guard.Stop()

	var (
		wg              sync.WaitGroup
		wsum, rsum      []byte
		werr, rerr      error
		stopChaos, done = make(chan struct{}), make(chan struct{})
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		wsum, werr = stressWrite(a, b, total, seed)
	}()
	go func() {
		defer wg.Done()
		rsum, rerr = stressRead(b, total)
	}()
	go func() {
		defer close(done)
		stressChaos(a, b, seed, stopChaos)
	}()
	wg.Wait()
	close(stopChaos)
	<-done
	if werr != nil || rerr != nil {
		t.Fatalf("writer: %v; reader: %v", werr, rerr)
	}
	if !bytes.Equal(wsum, rsum) {
		t.Fatalf("the reader's SHA-256 %x differs from the writer's %x", rsum, wsum)
	}
	sa, sb := a.Stats(), b.Stats()
	if sa.BytesLanded != uint64(total) {
		t.Errorf("%d bytes landed, want %d", sa.BytesLanded, total)
	}
	t.Logf("writer %+v, reader %+v", sa, sb)

	// An orderly end once both are done: both see Disconnected last.
	a.SetDelay(0)
	b.StopReposting(false)
	if err := a.Disconnect(); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*Pipe{a, b} {
		if c := drainToEnd(t, e); c.Kind != Disconnected {
			t.Errorf("last completion %v (%v), want disconnected", c.Kind, c.Err)
		}
	}
}

// drainToEnd takes completions, waiting as needed, until the link goes down,
// and returns that last completion.
func drainToEnd(t *testing.T, e *Pipe) Completion {
	t.Helper()
	for {
		for _, c := range waitFor(t, e, 1) {
			if c.Kind == Disconnected || c.Kind == Failed {
				return c
			}
		}
	}
}

// stressNext takes the next completion of e, sleeping in Wait when there is
// none. Wakes from the chaos goroutine just loop.
func stressNext(e *Pipe, cs []Completion) (Completion, error) {
	for {
		n, err := e.Poll(cs[:1])
		if err != nil || n == 1 {
			return cs[0], err
		}
		if err := e.Arm(); err != nil {
			return Completion{}, err
		}
		if n, err := e.Poll(cs[:1]); err != nil || n == 1 {
			return cs[0], err
		}
		if err := e.Wait(); err != nil && err != ErrWoken {
			return Completion{}, err
		}
	}
}

// stressWrite sends total bytes of a seeded random stream from w to r's ring
// and returns their SHA-256.
func stressWrite(w, r *Pipe, total int, seed uint64) ([]byte, error) {
	rng := rand.New(rand.NewPCG(seed, 1))
	src := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16)})
	sum := sha256.New()
	sring := w.SendRing()
	ringSize := len(r.RecvRing())
	caps := w.Caps()
	var cs [1]Completion

	// sent: bytes posted; credited: bytes the reader has consumed. head: bytes
	// ever written into sring; freed: the part of them whose requests retired.
	// posted and retired count requests, for the send depth.
	var sent, credited, head, freed, posted, retired int
	type signaled struct {
		id           uint64
		head, posted int
	}
	var pending []signaled // signaled requests not yet completed, in order
	var id uint64

	for sent < total || len(pending) > 0 {
		// Post as much as the rings and depths allow, in chunks of random
		// size, signaling some; now and then a marker.
		var wrs []SendWR
		for sent < total && posted+len(wrs)-retired < caps.SendDepth {
			n := min(1+rng.IntN(1500), total-sent,
				ringSize-(sent-credited), ringSize-sent%ringSize,
				len(sring)-(head-freed), len(sring)-head%len(sring))
			if n <= 0 {
				break
			}
			off := head % len(sring)
			src.Read(sring[off : off+n])
			sum.Write(sring[off : off+n])
			id++
			wr := data(r, uint32(off), uint32(n), uint32(sent%ringSize), rng.IntN(4) == 0, id)
			sent += n
			head += n
			wrs = append(wrs, wr)
			if wr.Signaled {
				pending = append(pending, signaled{id, head, posted + len(wrs)})
			}
			if rng.IntN(16) == 0 && posted+len(wrs)-retired < caps.SendDepth {
				id++
				wrs = append(wrs, marker(r, id))
				pending = append(pending, signaled{id, head, posted + len(wrs)})
			}
		}
		// Signal the last request of every batch: otherwise, once the rings
		// or the depth are full, nothing would retire the unsignaled ones.
		if last := len(wrs) - 1; last >= 0 && !wrs[last].Signaled {
			wrs[last].Signaled = true
			pending = append(pending, signaled{wrs[last].ID, head, posted + len(wrs)})
		}
		if len(wrs) > 0 {
			if err := w.PostSend(wrs); err != nil {
				return nil, err
			}
			posted += len(wrs)
		}
		if sent == total && len(pending) == 0 {
			break
		}

		c, err := stressNext(w, cs[:])
		if err != nil {
			return nil, err
		}
		switch c.Kind {
		case SendDone:
			if len(pending) == 0 || pending[0].id != c.ID {
				return nil, fmt.Errorf("send-done %d, want %v", c.ID, pending[:min(1, len(pending))])
			}
			freed, retired = pending[0].head, pending[0].posted
			pending = pending[1:]
		case ControlArrived:
			credited = int(binary.BigEndian.Uint64(c.Msg[:8]))
			if err := w.PostRecv(1); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("writer got %v (%v)", c.Kind, c.Err)
		}
	}
	return sum.Sum(nil), nil
}

// stressRead hashes total bytes arriving at r, returning their space to the
// writer in credit messages (the total consumed, big-endian), and scribbles
// over what it read so that a stale byte is never read as a fresh one.
func stressRead(r *Pipe, total int) ([]byte, error) {
	sum := sha256.New()
	ring := r.RecvRing()
	caps := r.Caps()
	var cs [1]Completion
	var got, pos, creditedTo, controls int
	var id uint64
	for got < total {
		// Return credit when there is some to return and a control slot.
		if got > creditedTo && controls < caps.ControlDepth {
			id++
			wr := SendWR{Kind: SendControl, Signaled: true, ID: id}
			binary.BigEndian.PutUint64(wr.Msg[:8], uint64(got))
			if err := r.PostSend([]SendWR{wr}); err != nil {
				return nil, err
			}
			creditedTo = got
			controls++
		}
		c, err := stressNext(r, cs[:])
		if err != nil {
			return nil, err
		}
		switch c.Kind {
		case DataArrived:
			n := int(c.N)
			if pos+n > len(ring) {
				return nil, fmt.Errorf("data of %d bytes at %d crosses the ring's end", n, pos)
			}
			sum.Write(ring[pos : pos+n])
			for i := range ring[pos : pos+n] {
				ring[pos+i] = 0xee
			}
			pos = (pos + n) % len(ring)
			got += n
			if err := r.PostRecv(1); err != nil {
				return nil, err
			}
		case SendDone:
			controls--
		default:
			return nil, fmt.Errorf("reader got %v (%v)", c.Kind, c.Err)
		}
	}
	return sum.Sum(nil), nil
}

// stressChaos changes delays, withholds the reader's receives for a while
// and wakes both ends, until stop is closed; then it leaves the pipe without
// delays and with the reader reposting.
func stressChaos(a, b *Pipe, seed uint64, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(seed, 2))
	defer func() {
		a.SetDelay(0)
		b.SetDelay(0)
		b.StopReposting(false)
	}()
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(rng.IntN(500)) * time.Microsecond):
		}
		switch rng.IntN(6) {
		case 0:
			a.SetDelay(time.Duration(rng.IntN(300)) * time.Microsecond)
		case 1:
			b.SetDelay(time.Duration(rng.IntN(300)) * time.Microsecond)
		case 2:
			b.StopReposting(rng.IntN(2) == 0)
		case 3:
			a.Wake()
		case 4:
			b.Wake()
		case 5:
			a.Stats()
			b.Stats()
		}
	}
}
