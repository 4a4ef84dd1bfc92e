package tcplink

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

// streamer is one end of a stress test's stream over a link: it sends
// total bytes of pseudo-random data through its send ring into the peer's
// receive ring (of the same size) in requests of random sizes, some
// unsignaled, and consumes what the peer sends, returning credit in control
// messages: the running total of bytes consumed. The sender never
// overwrites bytes the peer has not consumed nor bytes whose request has
// not completed. It sends as many messages as its SendDepth allows, more
// than the peer keeps receives posted, so the peer's link often waits for a
// receive (receiver not ready).
type streamer struct {
	name  string
	l     *Link
	total uint64
	ring  uint64
	rng   *rand.Rand
	gen   *rand.ChaCha8

	peerAddr uint64
	peerKey  uint32
	// The rings: SendRing and RecvRing, or in carrier mode a stream's
	// (carry). sendKey names send (0: SendRing); the peer's data arrives
	// with tag peerTag, and this end's goes with tag.
	send, recv   []byte
	sendKey      uint32
	tag, peerTag uint32

	// Sending.
	sent, completed, credited uint64
	queue                     []sent // outstanding requests, in post order
	controls                  int    // control requests outstanding
	nextID                    uint64
	sentHash                  hash.Hash
	wrs                       []link.SendWR

	// Receiving.
	landed, consumed, lastCredit uint64
	reposts                      int
	recvHash                     hash.Hash
	cs                           []link.Completion
}

// sent is an outstanding request: its ID, and for data, the total sent
// once it completes.
type sent struct {
	id      uint64
	control bool
	end     uint64
}

func newStreamer(name string, l, peer *Link, total uint64, seed uint64) *streamer {
	addr, key := peer.RecvRingKey()
	var chachaSeed [32]byte
	binary.LittleEndian.PutUint64(chachaSeed[:], seed)
	return &streamer{
		name: name, l: l, total: total, ring: uint64(len(l.SendRing())),
		rng:      rand.New(rand.NewPCG(seed, 1)),
		gen:      rand.NewChaCha8(chachaSeed),
		peerAddr: addr, peerKey: key,
		send: l.SendRing(), recv: l.RecvRing(),
		sentHash: sha256.New(), recvHash: sha256.New(),
		cs: make([]link.Completion, 16),
	}
}

// carry has the streamer send from a transmit ring registered under key
// and take the peer's data in recv, which the peer names by addr and rkey,
// with the tags of a carrier's streams.
func (s *streamer) carry(send []byte, key uint32, recv []byte, addr uint64, rkey, tag, peerTag uint32) {
	s.send, s.sendKey, s.recv, s.ring = send, key, recv, uint64(len(send))
	s.peerAddr, s.peerKey, s.tag, s.peerTag = addr, rkey, tag, peerTag
}

func (s *streamer) done() bool {
	return s.sent == s.total && len(s.queue) == 0 && s.credited == s.total &&
		s.landed == s.total && s.consumed == s.total && s.lastCredit == s.total
}

// run drives the end until done, or returns the error that stopped it.
func (s *streamer) run(t *testing.T) bool {
	guard := time.AfterFunc(10*hangGuard, s.l.Wake)
	defer guard.Stop()
	for !s.done() {
		n, err := s.l.Poll(s.cs)
		if err != nil {
			t.Errorf("%s: Poll: %v", s.name, err)
			return false
		}
		if n == 0 && s.idle() {
			if err := s.l.Arm(); err != nil {
				t.Errorf("%s: Arm: %v", s.name, err)
				return false
			}
			if n, err = s.l.Poll(s.cs); err != nil {
				t.Errorf("%s: Poll: %v", s.name, err)
				return false
			}
			if n == 0 {
				if err := s.l.Wait(); err != nil {
					t.Errorf("%s: Wait: %v (sent %d, completed %d, credited %d, landed %d, consumed %d)",
						s.name, err, s.sent, s.completed, s.credited, s.landed, s.consumed)
					return false
				}
				continue
			}
		}
		for _, c := range s.cs[:n] {
			if !s.handle(t, c) {
				return false
			}
		}
		s.consume()
		if !s.post(t) {
			return false
		}
	}
	return true
}

// idle: nothing to do until a completion comes.
func (s *streamer) idle() bool {
	return s.consumed == s.landed && s.reposts == 0 && !s.canCredit() && s.room() == 0
}

func (s *streamer) handle(t *testing.T, c link.Completion) bool {
	switch c.Kind {
	case link.SendDone:
		for {
			if len(s.queue) == 0 {
				t.Errorf("%s: SendDone %d with nothing outstanding", s.name, c.ID)
				return false
			}
			r := s.queue[0]
			s.queue = s.queue[1:]
			if r.control {
				s.controls--
			} else {
				s.completed = r.end
			}
			if r.id == c.ID {
				return true
			}
		}
	case link.DataArrived:
		if c.Tag != s.peerTag {
			t.Errorf("%s: data with tag %#x, want %#x", s.name, c.Tag, s.peerTag)
			return false
		}
		s.landed += uint64(c.N)
		s.reposts++
	case link.ControlArrived:
		credit := binary.BigEndian.Uint64(c.Msg[:])
		if credit < s.credited || credit > s.sent {
			t.Errorf("%s: credit %d after %d, with %d sent", s.name, credit, s.credited, s.sent)
			return false
		}
		s.credited = credit
		s.reposts++
	default:
		t.Errorf("%s: %v: %v", s.name, c.Kind, c.Err)
		return false
	}
	return true
}

// consume takes what landed from the receive ring.
func (s *streamer) consume() {
	r := s.recv
	for s.consumed < s.landed {
		off := s.consumed % s.ring
		n := min(s.landed-s.consumed, s.ring-off)
		s.recvHash.Write(r[off : off+n])
		s.consumed += n
	}
}

func (s *streamer) canCredit() bool {
	return s.consumed > s.lastCredit && s.controls < s.l.Caps().ControlDepth && len(s.queue)+len(s.wrs) < s.l.Caps().SendDepth
}

// room is how many bytes may be sent now, in one piece.
func (s *streamer) room() uint64 {
	if len(s.queue)+len(s.wrs) >= s.l.Caps().SendDepth {
		return 0
	}
	space := s.ring - (s.sent - min(s.credited, s.completed))
	return min(space, s.ring-s.sent%s.ring, s.total-s.sent)
}

func (s *streamer) post(t *testing.T) bool {
	s.wrs = s.wrs[:0]
	if s.canCredit() {
		wr := link.SendWR{Kind: link.SendControl, Signaled: true, ID: s.id()}
		binary.BigEndian.PutUint64(wr.Msg[:], s.consumed)
		s.lastCredit = s.consumed
		s.wrs = append(s.wrs, wr)
		s.queue = append(s.queue, sent{id: wr.ID, control: true})
		s.controls++
	}
	for {
		room := s.room()
		if room == 0 {
			break
		}
		var n uint64
		switch p := s.rng.IntN(10); {
		case p < 6:
			n = 1 + s.rng.Uint64N(256)
		case p < 9:
			n = 1 + s.rng.Uint64N(8<<10)
		default:
			n = 1 + s.rng.Uint64N(32<<10)
		}
		n = min(n, room)
		off := s.sent % s.ring
		b := s.send[off : off+n]
		s.gen.Read(b)
		s.sentHash.Write(b)
		s.sent += n
		wr := link.SendWR{
			Kind: link.SendData, Signaled: s.rng.IntN(4) == 0, ID: s.id(),
			Off: uint32(off), N: uint32(n), Remote: s.peerAddr + off, RKey: s.peerKey,
			Ring: s.sendKey, Tag: s.tag,
		}
		s.wrs = append(s.wrs, wr)
		s.queue = append(s.queue, sent{id: wr.ID, end: s.sent})
	}
	if len(s.wrs) > 0 {
		s.wrs[len(s.wrs)-1].Signaled = true // nothing waits for a completion that never comes
		if err := s.l.PostSend(s.wrs); err != nil {
			t.Errorf("%s: PostSend: %v", s.name, err)
			return false
		}
	}
	if s.reposts > 0 {
		if err := s.l.PostRecv(s.reposts); err != nil {
			t.Errorf("%s: PostRecv: %v", s.name, err)
			return false
		}
		s.reposts = 0
	}
	return true
}

func (s *streamer) id() uint64 {
	s.nextID++
	return s.nextID
}

// TestStress: two ends exchange pseudo-random bytes each way through small
// rings, in requests of random sizes, and every byte arrives in order. In
// carrier mode, the ends' own rings are empty and the bytes go through a
// stream's rings, shared on the links, with the stream's tags.
func TestStress(t *testing.T) {
	for _, tc := range []struct {
		name, tr string
		total    uint64
		carrier  bool
	}{
		{"tcp", "tcp", 64 << 20, false},
		{"pipe", "pipe", 16 << 20, false},
		{"tcp carrier", "tcp", 32 << 20, true},
		{"pipe carrier", "pipe", 8 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			total := tc.total
			if testing.Short() {
				total /= 16
			}
			sp := spec{sendRing: 64 << 10, recvRing: 64 << 10, sendDepth: 32, recvDepth: 8, controlDepth: 2}
			if tc.carrier {
				sp.sendRing, sp.recvRing, sp.carrier = 0, 0, true
			}
			a, b := newPair(t, tc.tr, sp, sp)
			sa := newStreamer("a", a, b, total, 1)
			sb := newStreamer("b", b, a, total, 2)
			if tc.carrier {
				aSend, aKey := shareSend(t, a, 64<<10)
				bSend, bKey := shareSend(t, b, 64<<10)
				aRecv, aAddr, aRKey := shareRecv(t, a, 64<<10)
				bRecv, bAddr, bRKey := shareRecv(t, b, 64<<10)
				sa.carry(aSend, aKey, aRecv, bAddr, bRKey, 0xa1a1_0001, 0xb2b2_0002)
				sb.carry(bSend, bKey, bRecv, aAddr, aRKey, 0xb2b2_0002, 0xa1a1_0001)
			}
			var wg sync.WaitGroup
			var okA, okB bool
			wg.Add(2)
			go func() { defer wg.Done(); okA = sa.run(t) }()
			go func() { defer wg.Done(); okB = sb.run(t) }()
			wg.Wait()
			if !okA || !okB {
				return
			}
			t.Logf("a: %d bytes sent and %d received in %d requests, %d waits for a receive; b: %d, %d, %d and %d",
				sa.sent, sa.consumed, sa.nextID, a.rnrWaitsNow(), sb.sent, sb.consumed, sb.nextID, b.rnrWaitsNow())
			if !bytes.Equal(sa.sentHash.Sum(nil), sb.recvHash.Sum(nil)) {
				t.Error("b received other bytes than a sent")
			}
			if !bytes.Equal(sb.sentHash.Sum(nil), sa.recvHash.Sum(nil)) {
				t.Error("a received other bytes than b sent")
			}
			if err := a.Disconnect(); err != nil {
				t.Fatal(err)
			}
			wantKinds(t, "a", waitEnd(t, a), "disconnected")
			wantKinds(t, "b", waitEnd(t, b), "disconnected")
		})
	}
}
