package stream

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/rdmanet/sdk/internal/wire"
)

// TestRingStreamsWithoutStalling drives a sender and a receiver ring against
// each other with random write and read sizes, checking that every byte lands
// where the sender put it, credits flow back, and the sender never waits for
// a whole buffer to drain.
func TestRingStreams(t *testing.T) {
	for seed := uint64(0); seed < 100; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		size := uint32(16 + rng.IntN(5000))
		recv := NewRecvRing(size, 0)
		var send SendRing
		if err := send.Announce(wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: size, RKey: 9}); err != nil {
			t.Fatal(err)
		}
		ring := make([]byte, size)
		var wrote, readTotal uint64
		next := byte(0)
		for step := 0; step < 3000; step++ {
			if rng.IntN(2) == 0 {
				want := uint32(1 + rng.IntN(int(size)))
				addr, rkey, n := send.Take(want)
				if n == 0 {
					continue
				}
				if rkey != 9 || addr < 1<<20 || addr+uint64(n) > 1<<20+uint64(size) {
					t.Fatalf("seed %d: write of %d at %#x outside the ring", seed, n, addr)
				}
				for i := uint32(0); i < n; i++ {
					ring[addr-1<<20+uint64(i)] = byte(wrote + uint64(i))
				}
				wrote += uint64(n)
				if err := recv.Arrived(n); err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
			} else {
				off, n := recv.Readable()
				k := min(n, uint32(1+rng.IntN(int(size))))
				for i := uint32(0); i < k; i++ {
					if ring[off+i] != next {
						t.Fatalf("seed %d: byte %d is %d, want %d", seed, readTotal+uint64(i), ring[off+i], next)
					}
					next++
				}
				readTotal += uint64(k)
				if m, ok := recv.Consume(k); ok {
					if err := send.Credit(m); err != nil {
						t.Fatalf("seed %d: %v", seed, err)
					}
				}
			}
		}
		if wrote < uint64(size)*3 {
			t.Errorf("seed %d: only %d bytes through a %d-byte ring", seed, wrote, size)
		}
	}
}

func TestRingProtocolErrors(t *testing.T) {
	r := NewRecvRing(100, 0)
	if err := r.Arrived(101); !errors.Is(err, wire.ErrProtocol) {
		t.Errorf("overrun: %v", err)
	}
	r.Arrived(90)
	r.Consume(90)
	if err := r.Arrived(20); !errors.Is(err, wire.ErrProtocol) {
		t.Errorf("write across the ring's end: %v", err)
	}
	var s SendRing
	if err := s.Credit(wire.Message{ConsumedBytes: 1}); !errors.Is(err, wire.ErrProtocol) {
		t.Errorf("credit before announce: %v", err)
	}
	s.Announce(wire.Message{Addr: 0, Length: 100})
	if err := s.Announce(wire.Message{Addr: 0, Length: 100}); !errors.Is(err, wire.ErrProtocol) {
		t.Errorf("second announce: %v", err)
	}
	s.Take(50)
	if err := s.Credit(wire.Message{ConsumedBytes: 51}); !errors.Is(err, wire.ErrProtocol) {
		t.Errorf("credit beyond what was sent: %v", err)
	}
	s.Credit(wire.Message{ConsumedBytes: 40})
	if err := s.Credit(wire.Message{ConsumedBytes: 30}); !errors.Is(err, wire.ErrProtocol) {
		t.Errorf("credit going backwards: %v", err)
	}
}

// FuzzRecvRing: any arrivals and reads keep the readable bytes inside the
// ring, and anything that would leave it is refused, never a panic.
func FuzzRecvRing(f *testing.F) {
	f.Add(uint32(100), []byte{10, 200, 30, 5, 90})
	f.Fuzz(func(t *testing.T, size uint32, ops []byte) {
		if size == 0 {
			return
		}
		r := NewRecvRing(size, 0)
		for i, op := range ops {
			if i%2 == 0 {
				r.Arrived(uint32(op) * (size/256 + 1))
			} else {
				_, n := r.Readable()
				r.Consume(min(n, uint32(op)))
			}
			off, n := r.Readable()
			if uint64(off)+uint64(n) > uint64(size) {
				t.Fatalf("readable [%d,+%d) outside a %d-byte ring", off, n, size)
			}
		}
	})
}

// TestRingCreditFollowsPeerRetain: a resumable peer's transmit ring sets
// how often credit goes (a quarter of what it retains), and a Retain
// moves it: larger, credit goes less often; smaller, what was read and
// not credited goes at once, as the smaller ring may be full of it.
func TestRingCreditFollowsPeerRetain(t *testing.T) {
	r := NewRecvRing(256<<10, 4<<10)
	credits := func(answers int) int {
		n := 0
		for range answers {
			if err := r.Arrived(4096); err != nil {
				t.Fatal(err)
			}
			if _, send := r.Consume(4096); send {
				n++
			}
		}
		return n
	}
	if n := credits(64); n != 64 {
		t.Errorf("a 4 KiB transmit ring at the peer: %d Credits for 64 answers of 4 KiB, want one each", n)
	}
	if _, send := r.SetPeerRetain(256 << 10); send {
		t.Errorf("a larger transmit ring at the peer made a Credit due with everything credited")
	}
	if n := credits(64); n != 4 {
		t.Errorf("a 256 KiB transmit ring at the peer: %d Credits for 64 answers of 4 KiB, want one each 64 KiB (4)", n)
	}
	// Read, and not credited yet: a 4 KiB ring at the peer may be full of it.
	r.Arrived(2048)
	r.Consume(2048)
	credit, send := r.SetPeerRetain(4 << 10)
	if _, consumed := r.Totals(); !send || credit.ConsumedBytes != consumed {
		t.Errorf("a smaller transmit ring at the peer with 2048 bytes read and not credited: Credit %v (%v), want one for all %d", credit, send, consumed)
	}
}
