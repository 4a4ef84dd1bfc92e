package stream

import (
	"errors"
	"io"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// FuzzEngine feeds an engine what a hostile or broken peer and link could:
// any control message, data of any size, completions for requests it never
// posted, disconnects and failures, mixed with the application's Reads,
// Writes, CloseWrite and the clock. The engine must never panic, never
// hand Read bytes from outside its ring, never have more requests in
// flight than the peer's receives nor post data from outside its ring, and, once it
// failed, keep failing with a typed error.
func FuzzEngine(f *testing.F) {
	f.Add(byte(3), []byte{0, 3, 0, 16, 1, 200, 2, 9, 4, 1, 5, 0, 6, 7})
	f.Add(byte(0), []byte{1, 255, 1, 255, 1, 255, 3, 3, 3})
	f.Add(byte(1), []byte{0, 0x72, 0, 0, 8, 8, 8, 8, 2, 1})
	// A resumable session: data written, the link lost, a new one, a Resume.
	f.Add(byte(7), []byte{4, 200, 7, 1, 7, 0x32, 0, 0x83, 0, 3, 7, 1})
	// iWARP's link: receive credit, the accepting side speaking second.
	f.Add(byte(0x63), []byte{4, 10, 4, 10, 4, 10, 0, 0x81, 7, 3, 4, 10, 6, 30, 6, 30})
	// A session that says when it closes: written, closed, lost, resumed.
	f.Add(byte(0x87), []byte{4, 200, 5, 3, 7, 1, 7, 0x32, 0, 0x83, 0, 0x85, 7, 0})
	// Rings that grow: data, a Ring offered, a RingAt.
	f.Add(byte(0x0b), []byte{0, 3, 4, 200, 4, 200, 7, 3, 0, 0x86, 7, 3, 1, 10, 0, 0x87, 3, 200})
	// Zero-copy: views taken and released while rings grow, a write buffer.
	f.Add(byte(0x0b), []byte{0, 3, 1, 100, 3, 0x80, 3, 0xa0, 1, 200, 1, 200, 0, 0x86, 3, 0x84, 3, 0x81, 3, 0x82, 3, 0x8b, 1, 50, 3, 0x81})
	// End positions: data, the peer's Shutdown (its position from the
	// input), CloseWrite.
	f.Add(byte(0x13), []byte{1, 5, 0, 0x82, 5, 0, 3, 100, 7, 3})
	// A group's resumable stream, rings named by the open: data written,
	// the link lost, a new one, a Resume, the peer's ring announced.
	f.Add(byte(0x0f), []byte{4, 200, 7, 1, 7, 0x32, 0, 0x83, 0, 3, 7, 1, 0, 3})
	// Receive credit with grants: data both ways, Credits from the peer.
	f.Add(byte(0x53), []byte{8, 1, 4, 100, 1, 9, 1, 9, 4, 100, 7, 3, 0, 0x8c, 4, 200, 1, 9})
	f.Fuzz(func(t *testing.T, mode byte, ops []byte) {
		features := wire.Features(mode) & (wire.FeatureRing | wire.FeatureShutdown | wire.FeatureResume)
		if mode&0x80 != 0 && features&wire.FeatureResume != 0 {
			features |= wire.FeatureClose // a session whose sides say when they close
		}
		// Bit 3: rings that grow (not with sessions).
		grows := mode&8 != 0 && features&wire.FeatureRing != 0 && features&wire.FeatureResume == 0
		if grows {
			features |= wire.FeatureGrow
		}
		const ring = 4096
		// Bit 3 with sessions: both rings named by the open, as a link
		// group's resumable stream has them (no RegisterXferMemory at
		// Start; one from the input is a ring announced twice).
		var peerRing *wire.Message
		if need := wire.FeatureRing | wire.FeatureResume; mode&8 != 0 && features&need == need {
			features |= wire.FeatureOpenRing
			peerRing = &wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 24, Length: ring, RKey: 5}
		}
		peer := wire.Hello{}
		if features != 0 {
			peer = wire.Hello{Version: 1, Features: features, RecvDepth: uint16(1 + mode%8), RingSize: ring, SendRing: ring / 2}
		}
		// Bit 6: an iWARP link (receive credit; bit 5, accepted there).
		iwarp := mode&0x40 != 0 && features&wire.FeatureRing != 0
		if iwarp {
			peer.RecvDepth += 8
		}
		// Bit 4, with receive credit: credit grants, this side's link
		// granting what the input's first byte says (a quarter of what was
		// taken per unit, from none to 63 times it).
		grants := iwarp && mode&0x10 != 0
		// Bit 4 without iWARP: end positions (a Shutdown or Close from
		// the input ends the stream only where it says).
		if need := wire.FeatureRing | wire.FeatureShutdown; !iwarp && mode&0x10 != 0 && features&need == need {
			features |= wire.FeatureEndAt
		}
		clk := &clock{now: time.Unix(0, 0)}
		e, err := New(Config{
			Features: features, Peer: peer, PeerHello: peer.Version != 0, Server: mode&4 != 0,
			Caps:     link.Caps{SendDepth: 16, RecvDepth: 16, ControlDepth: 4, RecvCredit: iwarp, RecvGrant: grants, SpeakSecond: iwarp && mode&0x20 != 0},
			SendRing: make([]byte, ring), RecvRing: make([]byte, ring), RecvAddr: 1 << 20, RecvKey: 3,
			KeepAlive: time.Second, Clock: clk.Now, PeerRing: peerRing,
			MaxSendRing: 4 * ring, MaxRecvRing: 4 * ring, ShrinkAfter: 3 * time.Second,
		})
		if err != nil {
			return
		}
		r := &recorder{}
		var poster Poster = r
		if grows {
			poster = ringRecorder{r}
		}
		if grants && len(ops) > 0 {
			poster = fuzzGranter{ringRecorder{r}, int(ops[0] % 64)}
		}
		e.Start()
		e.Flush(poster)
		if e.muted && len(r.sent) > 0 {
			t.Fatalf("the accepting side of an iWARP link posted %d requests before the peer spoke", len(r.sent))
		}
		buf := make([]byte, 1000)
		mem := link.NewMem(make([]byte, 1500), nil)
		var views [][]byte
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%8, ops[i+1]
			switch op {
			case 0: // a control message with an opcode and fields from the input
				var m [wire.MessageSize]byte
				m[1] = arg &^ 0x80
				if arg&0x80 != 0 {
					m[0] = 0x72
				}
				for j := 2; j < wire.MessageSize; j++ {
					m[j] = ops[(i+j)%len(ops)]
				}
				e.Handle(&link.Completion{Kind: link.ControlArrived, Msg: m})
			case 1: // data of any size
				e.Handle(&link.Completion{Kind: link.DataArrived, N: uint32(arg) * 37})
			case 2: // a completion for some request
				e.Handle(&link.Completion{Kind: link.SendDone, ID: uint64(arg)})
			case 3:
				if arg&0x80 != 0 {
					views = fuzzZeroCopy(t, e, arg, views)
					break
				}
				if _, err := e.Read(buf[:1+int(arg)%len(buf)]); err != nil && err != ErrWouldBlock && err != ErrViewsFull && err != io.EOF && e.Err() == nil {
					t.Fatalf("Read failed with %v but the engine has no error", err)
				}
			case 4:
				if arg&0x80 != 0 {
					// From registered memory; MemHeld waits for it.
					k := int(arg&0x7f) * 13
					e.WriteMem(mem, mem.Bytes()[k%len(mem.Bytes()):][:min(k, len(mem.Bytes())-k%len(mem.Bytes()))])
					if arg&0x40 != 0 {
						e.WaitMem()
					}
					break
				}
				e.Write(buf[:int(arg)%len(buf)])
			case 5:
				if arg%4 == 3 {
					e.Drain() // the connection's Close
				} else {
					e.CloseWrite()
				}
			case 6:
				clk.advance(time.Duration(arg) * 50 * time.Millisecond)
				e.Tick()
			case 7:
				if arg%16 == 0 {
					e.Handle(&link.Completion{Kind: link.Disconnected})
				} else if arg%16 == 1 {
					e.Handle(&link.Completion{Kind: link.Failed, Err: link.ErrDown})
				} else if arg%16 == 2 && e.Lost() != nil {
					// A resumable session gets a new link.
					if err := e.Relink(link.Caps{SendDepth: 1 + int(arg>>4), RecvDepth: 16, ControlDepth: 2}, 2<<20, 5); err != nil {
						t.Fatalf("Relink of a lost session: %v", err)
					}
				} else {
					completeAll(e, r)
				}
			}
			e.AfterCompletions()
			e.Flush(poster)
			checkMems(t, e, mem)
			for _, wr := range r.sent {
				if wr.Kind == link.SendData && wr.Mem != nil {
					if uint64(wr.Off)+uint64(wr.N) > uint64(len(wr.Mem.Bytes())) {
						t.Fatalf("data request [%d,+%d) outside the %d bytes of registered memory", wr.Off, wr.N, len(wr.Mem.Bytes()))
					}
					continue
				}
				if wr.Kind == link.SendData && uint64(wr.Off)+uint64(wr.N) > uint64(len(e.cfg.SendRing)) {
					t.Fatalf("data request [%d,+%d) outside the %d-byte ring", wr.Off, wr.N, len(e.cfg.SendRing))
				}
			}
			// (r.sent cannot tell: a SendDone from the input may retire
			// requests it still lists.)
			if out := e.sq.depth - e.sq.SlotsFree(); peer.Version != 0 && out > int(peer.RecvDepth) {
				t.Fatalf("%d requests in flight to a peer with %d receives", out, peer.RecvDepth)
			}
			if e.rc.on && e.rc.sent > e.rc.peerDepth+e.rc.peerAgain {
				t.Fatalf("%d messages sent to a peer that posted %d receives and %d again", e.rc.sent, e.rc.peerDepth, e.rc.peerAgain)
			}
			if off, n := e.recv.Readable(); uint64(off)+uint64(n) > uint64(len(e.recv.Mem())) {
				t.Fatalf("readable [%d,+%d) outside the %d-byte ring", off, n, len(e.recv.Mem()))
			}
			checkViews(t, e)
			if err := e.Err(); err != nil && e.reserved == nil {
				if _, werr := e.Write([]byte("x")); werr != err && !errors.Is(werr, err) {
					t.Fatalf("after the failure %v, Write = %v", err, werr)
				}
			}
		}
	})
}

// fuzzGranter is a link with a receive pool that grants quarter times what
// was taken (link.RecvGranter).
type fuzzGranter struct {
	ringRecorder
	quarter int
}

func (g fuzzGranter) Grant(held, n int) int { return n * g.quarter / 4 }

// fuzzZeroCopy runs one zero-copy call that arg says: a View, a Release
// (of a view held, or of a slice that is not one), a Reserve, or a Commit
// of part of the write buffer. It returns the views held.
func fuzzZeroCopy(t *testing.T, e *Engine, arg byte, views [][]byte) [][]byte {
	n := 1 + int(arg>>2&0x1f)*97
	switch arg % 4 {
	case 0:
		view := e.View
		if n%2 == 0 {
			view = e.ViewUpTo
		}
		if v, err := view(n); len(v) > 0 {
			if len(v) > n {
				t.Fatalf("a view of %d bytes for %d", len(v), n)
			}
			views = append(views, v)
		} else if err == nil {
			t.Fatalf("View(%d) returned nothing and no error", n)
		}
	case 1:
		if len(views) == 0 {
			if err := e.Release(make([]byte, 3)); err != ErrNotView {
				t.Fatalf("Release of a slice that is no view: %v", err)
			}
			break
		}
		i := n % len(views)
		if err := e.Release(views[i]); err != nil {
			t.Fatalf("Release of a view held: %v", err)
		}
		views = append(views[:i], views[i+1:]...)
	case 2:
		e.Reserve(n)
	case 3:
		if b := e.Reserved(); b != nil {
			e.Write(b[:n%(len(b)+1)])
			e.EndReserve()
		}
	}
	return views
}

// checkViews fails t if a view held in place is in none of the rings the
// engine still holds (a ring was given back under it), or if more bytes
// arrived than the peer could send without overwriting one.
func checkViews(t *testing.T, e *Engine) {
	r, ok := e.recv.(*RecvRing)
	if !ok {
		return
	}
	if r.written-r.freed() > r.peerRoom() && r.peerRetain == 0 {
		t.Fatalf("%d bytes arrived beyond the %d freed, in a ring of %d", r.written-r.freed(), r.freed(), r.WriteSize())
	}
	rings := append([][]byte{r.mem, r.WriteMem()}, r.retired...)
	for _, v := range e.views {
		if v.copied || v.released {
			continue
		}
		in := false
		for _, mem := range rings {
			if len(mem) > 0 && uintptr(unsafe.Pointer(v.data)) >= uintptr(unsafe.Pointer(&mem[0])) &&
				uintptr(unsafe.Pointer(v.data))+uintptr(v.n) <= uintptr(unsafe.Pointer(&mem[0]))+uintptr(len(mem)) {
				in = true
			}
		}
		if !in {
			t.Fatalf("a view of %d bytes at %d is in no ring the engine holds", v.n, v.at)
		}
	}
}

// checkMems fails t if the ranges sent from registered memory and still
// held are not in order within what the ring holds, if the memory's count
// of requests that read it is not theirs, or if a failed stream holds any.
func checkMems(t *testing.T, e *Engine, m *link.Mem) {
	prev := e.sq.released()
	for _, s := range e.mems {
		if s.start < prev && s.end <= prev || s.start >= s.end || s.end > e.sq.put {
			t.Fatalf("registered memory held for [%d, %d), after %d, with %d put", s.start, s.end, prev, e.sq.put)
		}
		prev = s.end
	}
	if m.Busy() != len(e.mems) {
		t.Fatalf("registered memory busy %d with %d ranges held", m.Busy(), len(e.mems))
	}
	if (e.err != nil || e.peerGone) && len(e.mems) > 0 {
		t.Fatalf("a stream that ended (%v) holds %d ranges of registered memory", e.err, len(e.mems))
	}
}
