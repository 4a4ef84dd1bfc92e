package stream

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/rdmanet/sdk/internal/wire"
)

func TestRecvWindowValkeyCycle(t *testing.T) {
	ann := wire.Message{Op: wire.OpRegisterXferMemory, Addr: 0x1000, Length: 100, RKey: 5}
	w := NewRecvWindow(ann)
	if err := w.Arrived(60); err != nil {
		t.Fatal(err)
	}
	if off, n := w.Readable(); off != 0 || n != 60 {
		t.Fatalf("Readable = %d,%d", off, n)
	}
	if _, send := w.Consume(60); send {
		t.Fatal("re-announce before the buffer was full")
	}
	if err := w.Arrived(40); err != nil {
		t.Fatal(err)
	}
	if off, n := w.Readable(); off != 60 || n != 40 {
		t.Fatalf("Readable = %d,%d", off, n)
	}
	if _, send := w.Consume(39); send {
		t.Fatal("re-announce with a byte left")
	}
	if m, send := w.Consume(1); !send || m != ann {
		t.Fatalf("after the whole buffer was read: %+v, %v; want the announcement again", m, send)
	}
	if off, n := w.Readable(); off != 0 || n != 0 {
		t.Fatalf("after reset Readable = %d,%d", off, n)
	}
}

func TestRecvWindowOverrun(t *testing.T) {
	w := NewRecvWindow(wire.Message{Length: 100})
	w.Arrived(90)
	err := w.Arrived(11)
	if !errors.Is(err, wire.ErrProtocol) {
		t.Fatalf("overrun = %v, want a protocol error", err)
	}
	if err := w.Arrived(1 << 31); !errors.Is(err, wire.ErrProtocol) {
		t.Fatalf("huge immediate = %v, want a protocol error", err)
	}
}

func TestSendWindow(t *testing.T) {
	var s SendWindow
	if s.Room() != 0 {
		t.Fatal("room before the peer announced its buffer")
	}
	if err := s.Announce(wire.Message{Op: wire.OpRegisterXferMemory, Addr: 0x1000, Length: 100, RKey: 7}); err != nil {
		t.Fatal(err)
	}
	addr, rkey, n := s.Take(70)
	if addr != 0x1000 || rkey != 7 || n != 70 {
		t.Fatalf("Take(70) = %#x,%d,%d", addr, rkey, n)
	}
	addr, _, n = s.Take(70)
	if addr != 0x1000+70 || n != 30 || s.Room() != 0 {
		t.Fatalf("Take(70) at 70 = %#x,%d room %d; the window must be filled exactly", addr, n, s.Room())
	}
	s.Announce(wire.Message{Addr: 0x1000, Length: 100, RKey: 7})
	if s.Room() != 100 {
		t.Fatal("re-announce did not reset the window")
	}
	for _, bad := range []wire.Message{{Length: 0}, {Addr: ^uint64(0) - 10, Length: 100}} {
		if err := s.Announce(bad); !errors.Is(err, wire.ErrProtocol) {
			t.Errorf("Announce(%+v) = %v, want a protocol error", bad, err)
		}
	}
}

// TestSendQueueInvariants drives the accounting with random posts and
// in-order completions, as a reliable connection delivers them, and checks:
// ring and slots are never overcommitted, and whenever nothing can be posted,
// a signaled request is outstanding (so a waiting writer will be woken).
func TestSendQueueInvariants(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		depth := 1 + rng.IntN(64)
		ring := uint64(1 + rng.IntN(1<<16))
		q := NewSendQueue(depth, ring)
		var inflight []uint64 // signaled ids, in post order
		for step := 0; step < 2000; step++ {
			switch op := rng.IntN(4); {
			case op <= 1: // data
				off, n := q.RingSpace()
				if n == 0 {
					if len(inflight) == 0 {
						t.Fatalf("seed %d: ring or queue full with no signaled request outstanding", seed)
					}
					break
				}
				if off+n > ring {
					t.Fatalf("seed %d: space [%d,+%d) runs past a %d-byte ring", seed, off, n, ring)
				}
				take := 1 + uint64(rng.IntN(int(n)))
				if q.SignaledPending() && rng.IntN(2) == 0 {
					// Held back behind a signaled request, as a small
					// write is; posted with later bytes or on a completion.
					q.Hold(take)
					break
				}
				if id, sig := q.PostData(take); sig {
					inflight = append(inflight, id)
				}
			case op == 2 && q.SlotsFree() > 0: // control
				inflight = append(inflight, q.PostControl())
			case op == 3 && len(inflight) > 0: // completion of the oldest signaled
				if _, err := q.Complete(inflight[0]); err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				inflight = inflight[1:]
				if q.Held() > 0 && !q.SignaledPending() && q.SlotsFree() > 0 {
					// The completion held bytes waited for: post them, signaled.
					_, id, sig := q.PostHeld(true)
					if !sig {
						t.Fatalf("seed %d: PostHeld(true) not signaled", seed)
					}
					inflight = append(inflight, id)
				}
			}
			if q.Held() > 0 && !q.SignaledPending() {
				t.Fatalf("seed %d: %d bytes held with no completion coming", seed, q.Held())
			}
			if q.SlotsFree() < 0 || q.put+q.held-q.freed > ring {
				t.Fatalf("seed %d: overcommitted: slots %d, ring used %d of %d", seed, q.SlotsFree(), q.put-q.freed, ring)
			}
		}
		// Draining: a marker retires trailing unsignaled requests.
		if q.Unsignaled() && q.SlotsFree() > 0 {
			inflight = append(inflight, q.PostMarker())
		}
		for _, id := range inflight {
			if _, err := q.Complete(id); err != nil {
				t.Fatalf("seed %d: drain: %v", seed, err)
			}
		}
		if !q.Unsignaled() && !q.Idle() {
			t.Fatalf("seed %d: not idle after every signaled request completed", seed)
		}
	}
}

func TestSendQueueOutOfOrderCompletion(t *testing.T) {
	q := NewSendQueue(8, 1024)
	a := q.PostControl()
	b := q.PostControl()
	if _, err := q.Complete(b); !errors.Is(err, wire.ErrProtocol) {
		t.Fatalf("completing %d before %d = %v, want an error", b, a, err)
	}
	if _, err := q.Complete(99); !errors.Is(err, wire.ErrProtocol) {
		t.Fatal("completion of an unknown request accepted")
	}
}

// FuzzRecvWindow: any sequence of arrivals and reads keeps the positions in
// the buffer and never panics.
func FuzzRecvWindow(f *testing.F) {
	f.Add(uint32(100), []byte{10, 200, 30, 5})
	f.Fuzz(func(t *testing.T, size uint32, ops []byte) {
		if size == 0 {
			return
		}
		w := NewRecvWindow(wire.Message{Length: size})
		for i, op := range ops {
			if i%2 == 0 {
				w.Arrived(uint32(op) * (size/256 + 1))
			} else {
				_, n := w.Readable()
				w.Consume(min(n, uint32(op)))
			}
			off, n := w.Readable()
			if uint64(off)+uint64(n) > uint64(size) {
				t.Fatalf("readable [%d,+%d) outside a %d-byte buffer", off, n, size)
			}
		}
	})
}
