package stream

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// A resumable session over link.Pipe, driven by hand: two engines whose
// links are cut, and sometimes silenced on one side only, again and again
// in mid-stream; each time both get a new pipe over the same rings and
// resume. Every byte must arrive once, in order.

const resumeFeatures = wire.FeatureRing | wire.FeatureShutdown | wire.FeatureResume

// sessionSide is one end: its rings (the session's memory), its engine and
// the stream it sends and what it received.
type sessionSide struct {
	tx, rx   []byte
	eng      *Engine
	link     *link.Pipe
	src      []byte // the whole stream this side sends
	sent     int    // how much of src Write took
	got      bytes.Buffer
	eof      bool
	closeWr  bool // CloseWrite once everything is written
	relinked int
}

func sessionHello(s *sessionSide) wire.Hello {
	return wire.Hello{Version: 1, Features: resumeFeatures, RecvDepth: 16, RingSize: uint32(len(s.rx)), SendRing: uint32(len(s.tx))}
}

func pipeOver(a, b *sessionSide) {
	cfg := func(s *sessionSide) link.PipeConfig {
		return link.PipeConfig{SendMem: s.tx, RecvMem: s.rx, SendDepth: 16, RecvDepth: 16, ControlDepth: 4, RNRRetry: 7}
	}
	a.link, b.link = link.NewPipe(cfg(a), cfg(b))
}

func newSession(t *testing.T, a, b *sessionSide) {
	t.Helper()
	pipeOver(a, b)
	for _, s := range []*struct{ me, peer *sessionSide }{{a, b}, {b, a}} {
		addr, key := s.me.link.RecvRingKey()
		e, err := New(Config{
			Features: resumeFeatures, Peer: sessionHello(s.peer), PeerHello: true, Server: s.me == b,
			Caps: s.me.link.Caps(), SendRing: s.me.tx, RecvRing: s.me.rx, RecvAddr: addr, RecvKey: key,
		})
		if err != nil {
			t.Fatal(err)
		}
		s.me.eng = e
		e.Start()
		e.Flush(s.me.link)
	}
}

// step does one round of work on s: completions, a read, a write.
// It reports whether anything happened.
func (s *sessionSide) step(t *testing.T, rng *rand.Rand, buf []byte) bool {
	progress := false
	// A side that is slow to take completions leaves data landed in its
	// ring unaccounted, and the sender's requests completed: a cut then
	// tests that the sender kept those bytes.
	if s.eng.Lost() == nil && rng.IntN(3) != 0 {
		progress = s.poll(t)
	}
	if k, err := s.eng.Read(buf[:1+rng.IntN(len(buf))]); k > 0 {
		s.got.Write(buf[:k])
		progress = true
	} else if err == io.EOF {
		s.eof = true
	} else if err != nil && err != ErrWouldBlock {
		t.Fatalf("read: %v", err)
	}
	if s.sent < len(s.src) {
		end := min(len(s.src), s.sent+1+rng.IntN(3000))
		k, err := s.eng.Write(s.src[s.sent:end])
		s.sent += k
		progress = progress || k > 0
		if err != nil && err != ErrWouldBlock {
			t.Fatalf("write: %v", err)
		}
	} else if s.closeWr && !s.eng.wrDone {
		if err := s.eng.CloseWrite(); err != nil {
			t.Fatalf("CloseWrite: %v", err)
		}
	}
	if s.eng.Lost() == nil {
		s.eng.Flush(s.link)
	}
	return progress
}

// poll takes one batch of completions.
func (s *sessionSide) poll(t *testing.T) bool {
	var cs [8]link.Completion
	n, err := s.link.Poll(cs[:])
	if err != nil {
		t.Fatalf("poll: %v", err)
	}
	for i := range cs[:n] {
		s.eng.Handle(&cs[i])
	}
	s.eng.AfterCompletions()
	s.eng.Flush(s.link)
	return n > 0
}

// relink gives both sides a new pipe over the same rings.
func relink(t *testing.T, a, b *sessionSide) {
	t.Helper()
	a.link.Close()
	b.link.Close()
	pipeOver(a, b)
	for _, s := range []*sessionSide{a, b} {
		addr, key := s.link.RecvRingKey()
		if err := s.eng.Relink(s.link.Caps(), addr, key); err != nil {
			t.Fatalf("Relink: %v", err)
		}
		s.relinked++
		s.eng.Flush(s.link)
	}
}

// resumeSeeds is how many random runs TestEngineResumeMidStream makes.
var resumeSeeds = flag.Int("resume.seeds", 60, "random runs of TestEngineResumeMidStream")

func TestEngineResumeMidStream(t *testing.T) {
	for seed := range uint64(*resumeSeeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 10))
			// Rings of different sizes on each side, and a transmit ring
			// smaller than the peer's receive ring, so that retention (not
			// the peer's ring) limits the sender, and credit must still come.
			a := &sessionSide{tx: make([]byte, 4096<<rng.IntN(2)), rx: make([]byte, 8192), closeWr: true}
			b := &sessionSide{tx: make([]byte, 8192), rx: make([]byte, 4096<<rng.IntN(2)), closeWr: true}
			a.src = randomBytes(rng, 200_000)
			b.src = randomBytes(rng, 150_000)
			newSession(t, a, b)
			buf := make([]byte, 5000)
			cuts := 0
			for steps := 0; !(a.eof && b.eof); steps++ {
				if steps > 2_000_000 {
					t.Fatalf("no end after %d steps: a sent %d got %d, b sent %d got %d, cuts %d", steps, a.sent, a.got.Len(), b.sent, b.got.Len(), cuts)
				}
				a.step(t, rng, buf)
				b.step(t, rng, buf)
				if rng.IntN(8) == 0 && cuts < 12 {
					cuts++
					switch rng.IntN(3) {
					case 0: // both ends see the path fail, after what landed
						a.link.Cut(nil)
						for a.eng.Lost() == nil || b.eng.Lost() == nil {
							a.poll(t)
							b.poll(t)
						}
					case 1: // one end finds out (say, by its keepalive); the other is told by the resume
						a.link.Silence()
						a.eng.Fail(&PathDeadError{})
						b.eng.Fail(&PathDeadError{})
					case 2:
						b.link.Silence()
						b.eng.Fail(fmt.Errorf("device gone: %w", link.ErrDown))
						a.eng.Fail(fmt.Errorf("resumed elsewhere: %w", link.ErrDown))
					}
					relink(t, a, b)
				}
				if err := a.eng.Err(); err != nil {
					t.Fatalf("a failed: %v", err)
				}
				if err := b.eng.Err(); err != nil {
					t.Fatalf("b failed: %v", err)
				}
			}
			if !bytes.Equal(a.got.Bytes(), b.src) || !bytes.Equal(b.got.Bytes(), a.src) {
				t.Fatalf("after %d cuts: a got %d of %d bytes (equal prefix %v), b got %d of %d", cuts,
					a.got.Len(), len(b.src), bytes.HasPrefix(b.src, a.got.Bytes()), b.got.Len(), len(a.src))
			}
			if cuts < 3 || a.relinked != cuts {
				t.Fatalf("%d cuts and %d relinks: the test did not test resumption", cuts, a.relinked)
			}
		})
	}
}

func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// A link failure ends a stream that is not resumable, as before.
func TestEngineLinkDownWithoutSessions(t *testing.T) {
	e, _, _ := newTestEngine(t, wire.FeatureRing|wire.FeatureShutdown, rdmanetHello, 0)
	e.Handle(&link.Completion{Kind: link.Failed, Err: link.ErrDown})
	if e.Lost() != nil || !errors.Is(e.Err(), link.ErrDown) {
		t.Fatalf("lost %v, err %v; want the stream failed", e.Lost(), e.Err())
	}
}

// A Resume that does not fit what was sent is a protocol error; so is one
// on a link that was not resumed, and anything before it on one that was.
func TestEngineHostileResume(t *testing.T) {
	peer := wire.Hello{Version: 1, Features: resumeFeatures, RecvDepth: 64, RingSize: 4096, SendRing: 4096}
	setup := func(t *testing.T) (*Engine, *recorder) {
		e, r, _ := newTestEngine(t, resumeFeatures, peer, 0)
		control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 4096, RKey: 9})
		if n, err := e.Write(make([]byte, 1000)); n != 1000 || err != nil {
			t.Fatalf("write: %d, %v", n, err)
		}
		e.Flush(r)
		control(e, wire.Message{Op: wire.OpCredit, ConsumedBytes: 100})
		e.Fail(link.ErrDown)
		if err := e.Relink(link.Caps{SendDepth: 8, RecvDepth: 8, ControlDepth: 2}, 0x2000, 3); err != nil {
			t.Fatal(err)
		}
		r.sent = r.sent[:0]
		e.Flush(r)
		m, err := wire.Decode(r.sent[0].Msg[:], true)
		if err != nil || m.Op != wire.OpResume || len(r.sent) != 2 {
			t.Fatalf("a relinked engine sent %d requests, the first %+v (%v); want Resume, then the announcement", len(r.sent), m, err)
		}
		return e, r
	}
	for name, m := range map[string]wire.Message{
		"received beyond what was sent": {Op: wire.OpResume, ReceivedBytes: 1001, ConsumedBytes: 100},
		"consumed going back":           {Op: wire.OpResume, ReceivedBytes: 500, ConsumedBytes: 99},
		"consumed beyond received":      {Op: wire.OpResume, ReceivedBytes: 500, ConsumedBytes: 501},
		"an announcement first":         {Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 4096, RKey: 9},
		"a credit first":                {Op: wire.OpCredit, ConsumedBytes: 200},
	} {
		t.Run(name, func(t *testing.T) {
			e, _ := setup(t)
			control(e, m)
			if !errors.Is(e.Err(), wire.ErrProtocol) {
				t.Fatalf("err %v, want a protocol error", e.Err())
			}
		})
	}
	t.Run("data first", func(t *testing.T) {
		e, _ := setup(t)
		e.Handle(&link.Completion{Kind: link.DataArrived, N: 10})
		if !errors.Is(e.Err(), wire.ErrProtocol) {
			t.Fatalf("err %v, want a protocol error", e.Err())
		}
	})
	t.Run("resume twice", func(t *testing.T) {
		e, _ := setup(t)
		control(e, wire.Message{Op: wire.OpResume, ReceivedBytes: 500, ConsumedBytes: 100})
		control(e, wire.Message{Op: wire.OpResume, ReceivedBytes: 500, ConsumedBytes: 100})
		if !errors.Is(e.Err(), wire.ErrProtocol) {
			t.Fatalf("err %v, want a protocol error", e.Err())
		}
	})
	t.Run("resume without relink", func(t *testing.T) {
		e, _, _ := newTestEngine(t, resumeFeatures, peer, 0)
		control(e, wire.Message{Op: wire.OpResume})
		if !errors.Is(e.Err(), wire.ErrProtocol) {
			t.Fatalf("err %v, want a protocol error", e.Err())
		}
	})
	t.Run("good resume sends the rest again", func(t *testing.T) {
		e, r := setup(t)
		r.sent = r.sent[:0]
		control(e, wire.Message{Op: wire.OpResume, ReceivedBytes: 600, ConsumedBytes: 100})
		control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 21, Length: 4096, RKey: 11})
		e.Flush(r)
		var n uint32
		for _, wr := range r.sent {
			if wr.Kind == link.SendData {
				if wr.Off != 600+n || wr.Remote != 1<<21+600+uint64(n) || wr.RKey != 11 {
					t.Fatalf("resent %+v, want ring offset %d to the new ring", wr, 600+n)
				}
				n += wr.N
			}
		}
		if n != 400 {
			t.Fatalf("resent %d bytes, want the 400 the peer did not receive", n)
		}
	})
}
