package rdmanet

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// These tests run Conn over link.Pipe, the in-memory link: the whole
// net.Conn contract, faults, hostile peers and lifetimes, on any machine.
// The lab runs the same Conn over real queue pairs.

// hostModes are the two wire protocols.
var hostModes = []struct {
	name     string
	features wire.Features
}{
	{"rdmanet", wire.FeatureRing | wire.FeatureShutdown | wire.FeatureGrow},
	{"valkey", 0},
	// As over iWARP: a message that finds no receive ends the connection,
	// and the accepting side must not speak first.
	{"iwarp", wire.FeatureRing | wire.FeatureShutdown | wire.FeatureGrow | wire.LinkFeatures},
}

// pipeConfig is the in-memory link for one side with cfg: its first,
// small rings, which grow as over RDMA (link.Rings).
func pipeConfig(cfg Config) link.PipeConfig {
	first := cfg.firstRings()
	return link.PipeConfig{
		SendRing: first.SendBuffer, RecvRing: first.RecvBuffer,
		SendDepth: cfg.sendDepth(), RecvDepth: cfg.RecvDepth, ControlDepth: controlSlots,
		RNRRetry: 7,
	}
}

// helloOf is what an rdmanet side with cfg says in its Hello, or nothing
// in Valkey's protocol.
func helloOf(cfg Config, features wire.Features) wire.Hello {
	if features == 0 {
		return wire.Hello{}
	}
	return wire.Hello{Version: wire.HelloVersion, Features: features, RecvDepth: uint16(cfg.RecvDepth), RingSize: uint32(cfg.firstRings().RecvBuffer)}
}

// memPair connects a client and a server Conn over a pipe; a and b are the
// pipe's ends (client's, server's), for faults.
func memPair(t testing.TB, cfg Config, features wire.Features) (client, server *Conn, a, b *link.Pipe) {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ca, cb := pipeConfig(cfg), pipeConfig(cfg)
	if features&wire.FeatureRecvCredit != 0 {
		ca.RNRRetry, ca.RecvCredit, ca.EarlyCompletion = 0, true, true
		cb.RNRRetry, cb.RecvCredit, cb.SpeakSecond, cb.EarlyCompletion = 0, true, true, true
	}
	a, b = link.NewPipe(ca, cb)
	return memConns(t, cfg, features, a, b)
}

// memConns makes Conns over the ends of a pipe (or links wrapping them).
func memConns(t testing.TB, cfg Config, features wire.Features, a, b link.Link) (client, server *Conn, pa, pb *link.Pipe) {
	t.Helper()
	var err error
	if b.Caps().SpeakSecond {
		// The accepting side starts first, as it may on iWARP, where it
		// must not speak before the dialer.
		if server, err = newLinkConn(b, cfg, true, features, helloOf(cfg, features)); err != nil {
			t.Fatal(err)
		}
	}
	if client, err = newLinkConn(a, cfg, false, features, helloOf(cfg, features)); err != nil {
		t.Fatal(err)
	}
	if server == nil {
		if server, err = newLinkConn(b, cfg, true, features, helloOf(cfg, features)); err != nil {
			t.Fatal(err)
		}
	}
	pa, _ = unwrapPipe(a)
	pb, _ = unwrapPipe(b)
	return client, server, pa, pb
}

func unwrapPipe(l link.Link) (*link.Pipe, bool) {
	switch l := l.(type) {
	case *link.Pipe:
		return l, true
	case *guardLink:
		return l.Pipe, true
	}
	return nil, false
}

// closeAndWait closes c and waits until it released its link.
func closeAndWait(t testing.TB, c *Conn) {
	t.Helper()
	c.Close()
	select {
	case <-c.released:
	case <-time.After(2 * lingerTimeout):
		t.Fatalf("connection not released %v after Close", 2*lingerTimeout)
	}
}

// goroutineCheck fails t if goroutines started during the test outlive it
// (after a settling wait: closed connections finish in the background).
func goroutineCheck(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		if n := waitGoroutines(before, 2*lingerTimeout); n > before {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines left, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
	})
}

// waitGoroutines waits up to within for the process's goroutines to be at
// most n, and returns how many there are then.
func waitGoroutines(n int, within time.Duration) int {
	end := time.Now().Add(within)
	for {
		got := runtime.NumGoroutine()
		if got <= n || time.Now().After(end) {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestMemNetConn(t *testing.T) {
	for _, m := range hostModes {
		for _, busy := range []time.Duration{0, 20 * time.Microsecond} {
			name := m.name
			if busy > 0 {
				name += " busy-polling"
			}
			t.Run(name, func(t *testing.T) {
				goroutineCheck(t)
				nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
					a, b, _, _ := memPair(t, Config{BusyPoll: busy}, m.features)
					return a, b, func() { a.Close(); b.Close() }, nil
				})
			})
		}
	}
}

// TestMemIntegrity streams random data each way at once, with write sizes
// from 1 byte to several rings, over a link that delays its requests, and
// checks SHA-256 on both sides.
func TestMemIntegrity(t *testing.T) {
	for _, m := range hostModes {
		t.Run(m.name, func(t *testing.T) {
			goroutineCheck(t)
			cfg := Config{RecvBuffer: 16 << 10, SendBuffer: 8 << 10, RecvDepth: 8}
			a, b, pa, pb := memPair(t, cfg, m.features)
			pa.SetDelay(50 * time.Microsecond)
			pb.SetDelay(20 * time.Microsecond)
			<-streamBothWays(t, a, b, 4<<20)
			closeAndWait(t, a)
			closeAndWait(t, b)
		})
	}
}

// streamBothWays streams size random bytes each way between a and b at
// once, and checks SHA-256 on both sides when both are done; the channel
// closes then.
func streamBothWays(t testing.TB, a, b net.Conn, size int) <-chan struct{} {
	var wg sync.WaitGroup
	sums := make([][2][32]byte, 2)
	for i, ends := range [][2]net.Conn{{a, b}, {b, a}} {
		wg.Add(2)
		go func() {
			defer wg.Done()
			sums[i][0] = writeRandom(t, ends[0], size, uint64(i))
		}()
		go func() {
			defer wg.Done()
			h := sha256.New()
			if n, err := io.CopyN(h, ends[1], int64(size)); err != nil {
				t.Errorf("direction %d: read %d bytes: %v", i, n, err)
			}
			copy(sums[i][1][:], h.Sum(nil))
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		wg.Wait()
		for i := range sums {
			if sums[i][0] != sums[i][1] {
				t.Errorf("direction %d: SHA-256 differs", i)
			}
		}
	}()
	return done
}

// writeRandom writes size random bytes to w in pieces of random sizes and
// returns their SHA-256.
func writeRandom(t testing.TB, w io.Writer, size int, seed uint64) [32]byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	h := sha256.New()
	buf := make([]byte, 40<<10)
	for left := size; left > 0; {
		n := min(left, 1+rng.IntN(len(buf)))
		if rng.IntN(4) == 0 {
			n = min(left, 1+rng.IntN(64))
		}
		for i := range buf[:n] {
			buf[i] = byte(rng.Uint32())
		}
		h.Write(buf[:n])
		if _, err := w.Write(buf[:n]); err != nil {
			t.Errorf("write: %v", err)
			break
		}
		left -= n
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// TestMemCloseDeliversWritten: bytes written before Close arrive, then EOF,
// although Close returns at once (the drain goes on in the background).
func TestMemCloseDeliversWritten(t *testing.T) {
	for _, m := range hostModes {
		t.Run(m.name, func(t *testing.T) {
			goroutineCheck(t)
			a, b, pa, _ := memPair(t, Config{}, m.features)
			pa.SetDelay(20 * time.Millisecond) // the writes are still in flight at Close
			msg := bytes.Repeat([]byte("0123456789"), 1000)
			// The reader runs meanwhile: the rings start small (16 KiB to
			// receive), so Writes wait for it as they wait for a TCP
			// peer beyond its buffers.
			type result struct {
				got []byte
				err error
			}
			read := make(chan result, 1)
			go func() { got, err := io.ReadAll(b); read <- result{got, err} }()
			for range 5 {
				if _, err := a.Write(msg); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			r := <-read
			if r.err != nil || len(r.got) != 5*len(msg) {
				t.Fatalf("read %d bytes, %v; want %d, then EOF", len(r.got), r.err, 5*len(msg))
			}
			closeAndWait(t, b)
			<-a.released
		})
	}
}

// TestMemFaults: each way the link can fail ends both connections with an
// error of the right kind, and no call hangs.
func TestMemFaults(t *testing.T) {
	cfg := Config{KeepAlive: 200 * time.Millisecond}
	cut := errors.New("cable pulled")
	cases := []struct {
		name   string
		inject func(a, b *link.Pipe)
		check  func(err error) bool
	}{
		{"silent path", func(a, b *link.Pipe) { a.Silence() }, isPathDead},
		{"peer stops reposting", func(a, b *link.Pipe) { b.StopReposting(true) }, isPathDead},
		{"cut", func(a, b *link.Pipe) { a.Cut(cut) }, func(err error) bool { return errors.Is(err, cut) && errors.Is(err, link.ErrDown) }},
		{"request fails", func(a, b *link.Pipe) { a.FailNext(cut) }, func(err error) bool { return errors.Is(err, cut) }},
	}
	for _, c := range cases {
		for _, m := range hostModes {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				goroutineCheck(t)
				a, b, pa, pb := memPair(t, cfg, m.features)
				defer closeAndWait(t, a)
				defer closeAndWait(t, b)
				c.inject(pa, pb)
				errs := make(chan error, 2)
				go func() { // a keeps writing, so that a request is in flight
					buf := make([]byte, 1000)
					for {
						if _, err := a.Write(buf); err != nil {
							errs <- err
							return
						}
					}
				}()
				go func() { // b reads until it fails (it may see EOF if a's failure disconnects)
					_, err := io.Copy(io.Discard, b)
					errs <- err
				}()
				for range 2 {
					select {
					case err := <-errs:
						// Over iWARP a link that withholds receives it
						// reports posted ends the connection at once.
						rnr := m.features&wire.FeatureRecvCredit != 0 && c.name == "peer stops reposting" && errors.Is(err, link.ErrRNR)
						if err != nil && !c.check(err) && !rnr && !errors.Is(err, stream.ErrPeerClosed) {
							t.Errorf("error %v is not of the injected kind", err)
						}
					case <-time.After(20 * cfg.KeepAlive):
						t.Fatalf("a call still blocked %v after the fault", 20*cfg.KeepAlive)
					}
				}
			})
		}
	}
}

func isPathDead(err error) bool {
	var pd *stream.PathDeadError
	var ne net.Error
	return errors.As(err, &pd) && errors.As(err, &ne) && ne.Timeout() && errors.Is(err, link.ErrDown) && !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestMemPeerClosed: the peer's Close ends the stream with EOF after its
// data, and Writes fail.
func TestMemPeerClosed(t *testing.T) {
	goroutineCheck(t)
	a, b, _, _ := memPair(t, Config{}, hostModes[0].features)
	a.Write([]byte("last words"))
	closeAndWait(t, a)
	got, err := io.ReadAll(b)
	if string(got) != "last words" || err != nil {
		t.Fatalf("ReadAll = %q, %v", got, err)
	}
	if _, err := b.Write([]byte("x")); !errors.Is(err, stream.ErrPeerClosed) {
		t.Fatalf("Write after the peer closed = %v", err)
	}
	closeAndWait(t, b)
}

// TestMemHostilePeer: a peer that breaks the protocol ends its own
// connection with a protocol error; another connection is unaffected, and
// nothing panics.
func TestMemHostilePeer(t *testing.T) {
	cases := []struct {
		name     string
		features wire.Features
		send     func(p *link.Pipe, victimRing uint64, key uint32)
	}{
		{"unknown opcode", 0, func(p *link.Pipe, _ uint64, _ uint32) {
			var msg [32]byte
			msg[0], msg[1] = 0x12, 0x34
			p.PostSend([]link.SendWR{{Kind: link.SendControl, Signaled: true, ID: 1, Msg: msg}})
		}},
		{"extension opcode without the extension", 0, func(p *link.Pipe, _ uint64, _ uint32) {
			p.PostSend([]link.SendWR{{Kind: link.SendControl, Signaled: true, ID: 1, Msg: encode(wire.Message{Op: wire.OpCredit})}})
		}},
		{"data beyond the window", 0, func(p *link.Pipe, ring uint64, key uint32) {
			// The whole window, then a byte more before it was announced again.
			size := uint32(len(p.SendRing()))
			p.PostSend([]link.SendWR{
				{Kind: link.SendData, Signaled: true, ID: 1, N: size, Remote: ring, RKey: key},
				{Kind: link.SendData, Signaled: true, ID: 2, N: 1, Remote: ring, RKey: key},
			})
		}},
		{"ring of the wrong size", hostModes[0].features, func(p *link.Pipe, ring uint64, key uint32) {
			p.PostSend([]link.SendWR{{Kind: link.SendControl, Signaled: true, ID: 1, Msg: encode(wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 40, Length: 12345, RKey: 1})}})
		}},
		{"credit for bytes never sent", hostModes[0].features, func(p *link.Pipe, ring uint64, key uint32) {
			p.PostSend([]link.SendWR{
				{Kind: link.SendControl, Signaled: true, ID: 1, Msg: encode(wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 40, Length: 256 << 10, RKey: 1})},
				{Kind: link.SendControl, Signaled: true, ID: 2, Msg: encode(wire.Message{Op: wire.OpCredit, ConsumedBytes: 1 << 30})},
			})
		}},
		{"feature flood", 0, func(p *link.Pipe, ring uint64, key uint32) {
			// The victim's answers never land: the hostile end keeps no
			// receive posted, so they wait (RNR) and the victim's control
			// slots fill, whatever the timing of its polls.
			p.StopReposting(true)
			for i := 0; i < 40; i++ {
				p.PostSend([]link.SendWR{{Kind: link.SendControl, Signaled: true, ID: uint64(i + 1), Msg: encode(wire.Message{Op: wire.OpGetServerFeature})}})
				var cs [64]link.Completion
				p.Poll(cs[:])
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			goroutineCheck(t)
			cfg, _ := Config{}.withDefaults()
			// The hostile peer is a raw pipe end with room for its flood.
			hostileCfg := pipeConfig(cfg)
			hostileCfg.ControlDepth, hostileCfg.SendDepth, hostileCfg.RecvDepth = 64, 64, 1
			// It can fill the victim's receive window from its send ring.
			hostileCfg.SendRing = pipeConfig(cfg).RecvRing
			victimEnd, hostile := link.NewPipe(pipeConfig(cfg), hostileCfg)
			victim, err := newLinkConn(victimEnd, cfg, true, c.features, helloOf(cfg, c.features))
			if err != nil {
				t.Fatal(err)
			}
			bystanderA, bystanderB, _, _ := memPair(t, Config{}, hostModes[0].features)
			ring, key := victimEnd.RecvRingKey()
			c.send(hostile, ring, key)
			// What arrived before the violation is readable; then the error.
			victim.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = io.Copy(io.Discard, victim)
			if !errors.Is(err, wire.ErrProtocol) {
				t.Fatalf("victim's Read = %v, want a protocol error", err)
			}
			if _, err := victim.Write([]byte("x")); !errors.Is(err, wire.ErrProtocol) {
				t.Fatalf("victim's Write = %v, want the protocol error", err)
			}
			bystanderA.Write([]byte("fine"))
			buf := make([]byte, 4)
			if _, err := io.ReadFull(bystanderB, buf); err != nil || string(buf) != "fine" {
				t.Fatalf("another connection: %q, %v", buf, err)
			}
			closeAndWait(t, victim)
			hostile.Close()
			closeAndWait(t, bystanderA)
			closeAndWait(t, bystanderB)
		})
	}
}

func encode(m wire.Message) (b [wire.MessageSize]byte) {
	m.Encode(&b)
	return b
}

// guardLink wraps a pipe end and records any use after Close: memory a
// real link frees on Close (registered buffers, unmapped) must never be
// touched again, by a poller, a spinner or a timer.
type guardLink struct {
	*link.Pipe
	closed   atomic.Bool
	violated atomic.Value // string: the first call after Close
}

func (g *guardLink) check(op string) {
	if g.closed.Load() {
		g.violated.CompareAndSwap(nil, op)
	}
}
func (g *guardLink) PostSend(w []link.SendWR) error { g.check("PostSend"); return g.Pipe.PostSend(w) }
func (g *guardLink) PostRecv(n int) error           { g.check("PostRecv"); return g.Pipe.PostRecv(n) }
func (g *guardLink) Poll(cs []link.Completion) (int, error) {
	g.check("Poll")
	return g.Pipe.Poll(cs)
}
func (g *guardLink) Arm() error       { g.check("Arm"); return g.Pipe.Arm() }
func (g *guardLink) Wait() error      { g.check("Wait"); return g.Pipe.Wait() }
func (g *guardLink) SendRing() []byte { g.check("SendRing"); return g.Pipe.SendRing() }
func (g *guardLink) RecvRing() []byte { g.check("RecvRing"); return g.Pipe.RecvRing() }
func (g *guardLink) Close() error {
	err := g.Pipe.Close()
	g.closed.Store(true)
	return err
}

// TestMemCloseRaces: Close racing blocked and spinning Reads and Writes,
// many times. Every call returns (net.ErrClosed, or what it did before),
// Close returns, and nothing touches the link after it was closed.
func TestMemCloseRaces(t *testing.T) {
	goroutineCheck(t)
	rounds := 2000
	if testing.Short() {
		rounds = 200
	}
	for i := 0; i < rounds; i++ {
		cfg, _ := Config{RecvBuffer: 4096, SendBuffer: 4096, RecvDepth: 4}.withDefaults()
		if i%2 == 1 {
			cfg.BusyPoll = 50 * time.Microsecond
		}
		features := hostModes[i%len(hostModes)].features
		pa, pb := link.NewPipe(pipeConfig(cfg), pipeConfig(cfg))
		ga, gb := &guardLink{Pipe: pa}, &guardLink{Pipe: pb}
		a, b, _, _ := memConns(t, cfg, features, ga, gb)
		var calls sync.WaitGroup
		calls.Add(3)
		go func() { // a Read that blocks: nothing is sent to a
			defer calls.Done()
			_, err := a.Read(make([]byte, 10))
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("round %d: blocked Read = %v, want net.ErrClosed", i, err)
			}
		}()
		go func() { // a Write that fills b's ring and blocks: b never reads
			defer calls.Done()
			buf := make([]byte, 4096)
			for {
				if _, err := a.Write(buf); err != nil {
					if !errors.Is(err, net.ErrClosed) {
						t.Errorf("round %d: blocked Write = %v, want net.ErrClosed", i, err)
					}
					return
				}
			}
		}()
		go func() { // b's side reads a little, to keep completions coming
			defer calls.Done()
			b.Read(make([]byte, 100))
		}()
		if i%3 == 0 {
			runtime.Gosched()
		} else {
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
		}
		a.Close()
		b.Close()
		calls.Wait()
		<-a.released
		<-b.released
		for _, g := range []*guardLink{ga, gb} {
			if v := g.violated.Load(); v != nil {
				t.Fatalf("round %d: %s called after the link was closed", i, v)
			}
		}
	}
}

// TestMemCloseIsPrompt: Close does not wait for the drain: with the peer
// unable to take anything (a silent link), Close still returns before the
// drain could end, and wakes the blocked Write; the link is released after
// lingerTimeout.
func TestMemCloseIsPrompt(t *testing.T) {
	goroutineCheck(t)
	a, b, pa, _ := memPair(t, Config{KeepAlive: -1}, hostModes[0].features)
	pa.Silence()
	blocked := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := a.Write(buf); err != nil {
				blocked <- err
				return
			}
		}
	}()
	// Wait until the Write has posted (after the announcement, posted at
	// start): on a silent link nothing completes, so the Write soon blocks
	// and the drain can never finish early.
	for end := time.Now().Add(30 * time.Second); pa.Stats().Posted < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("nothing posted in 30 s")
		}
	}
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close still running after 30 s")
	}
	// The drain cannot end before lingerTimeout on a silent link: if Close
	// had waited for it, the link would be released by now.
	select {
	case <-a.released:
		t.Fatal("Close returned only after the drain ended")
	default:
	}
	if err := <-blocked; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("blocked Write = %v", err)
	}
	select {
	case <-a.released:
	case <-time.After(3 * lingerTimeout):
		t.Fatal("not released")
	}
	closeAndWait(t, b)
}

// TestIdleConnectionsHaveNoGoroutine: as in Go's net, a connection with
// no Read or Write in flight has no goroutine of its own: not while it is
// idle after a round trip, and not once its peer is gone. (A poller per
// connection used to sleep in the link's Wait, and once the peer was gone
// it spun on the ended link until Close.) Completions that come while
// nobody waits still reach the connection: the peer's close is read.
func TestIdleConnectionsHaveNoGoroutine(t *testing.T) {
	for _, m := range hostModes {
		t.Run(m.name, func(t *testing.T) {
			const pairs = 40
			fp, err := Config{}.Footprint()
			if err != nil {
				t.Fatal(err)
			}
			base := runtime.NumGoroutine() + 2*pairs*fp.Goroutines
			clients, servers := make([]*Conn, pairs), make([]*Conn, pairs)
			for i := range pairs {
				clients[i], servers[i], _, _ = memPair(t, Config{}, m.features)
				defer servers[i].Close()
				echoOnce(t, clients[i], servers[i])
			}
			// The first read of each end took completions as a poller;
			// what came after (credit, the echo's completion) was taken
			// by a service, which has ended.
			goroutinesAtMost(t, base+4, "with 40 idle pairs open")
			for _, c := range clients {
				c.Close()
			}
			goroutinesAtMost(t, base+4, "after the clients' Close") // their lingers end
			for _, s := range servers {
				s.SetReadDeadline(time.Now().Add(hangGuard))
				if _, err := io.ReadAll(s); err != nil {
					t.Fatalf("the server's Read after the client's Close: %v", err)
				}
			}
			goroutinesAtMost(t, base+4, "with 40 servers whose peer is gone")
		})
	}
}

// echoOnce writes a byte from a to b and back.
func echoOnce(t *testing.T, a, b *Conn) {
	t.Helper()
	buf := []byte{1}
	for _, d := range [][2]*Conn{{a, b}, {b, a}} {
		if _, err := d[0].Write(buf); err != nil {
			t.Fatal(err)
		}
		d[1].SetReadDeadline(time.Now().Add(hangGuard))
		if _, err := io.ReadFull(d[1], buf); err != nil {
			t.Fatal(err)
		}
	}
}

// goroutinesAtMost waits up to hangGuard for the process's goroutines to
// be at most n.
func goroutinesAtMost(t *testing.T, n int, when string) {
	t.Helper()
	if got := waitGoroutines(n, hangGuard); got > n {
		t.Fatalf("%s: %d goroutines, want at most %d", when, got, n)
	}
}

// TestIdleConnectionTakesItsCompletions: a connection nobody reads or
// writes still takes its completions (through the link's notify function,
// with no goroutine of its own): its keepalives complete, so its dead-path
// check never fires, and the peer's keepalives are answered. An idle
// connection that took nothing would find its path dead after 2 x
// KeepAlive.
func TestIdleConnectionTakesItsCompletions(t *testing.T) {
	const ka = 20 * time.Millisecond
	for _, m := range hostModes {
		t.Run(m.name, func(t *testing.T) {
			a, b, pa, _ := memPair(t, Config{KeepAlive: ka}, m.features)
			defer closeAndWait(t, a)
			defer closeAndWait(t, b)
			before := pa.Stats()
			time.Sleep(30 * ka)
			if after := pa.Stats(); after.Posted < before.Posted+5 {
				t.Fatalf("%d keepalives went out in %v of idleness, want 5 or more", after.Posted-before.Posted, 30*ka)
			}
			echoOnce(t, a, b)
		})
	}
}

// brokenLink fails one of its calls (Poll, Arm or Wait) for good once
// broken: the device's queue or channel is gone under the connection.
type brokenLink struct {
	*link.Pipe
	op     string
	broken atomic.Bool
}

var errBrokenLink = errors.New("the device's completion queue is gone")

func (l *brokenLink) fails(op string) error {
	if l.broken.Load() && l.op == op {
		return errBrokenLink
	}
	return nil
}
func (l *brokenLink) Poll(cs []link.Completion) (int, error) {
	if err := l.fails("Poll"); err != nil {
		return 0, err
	}
	return l.Pipe.Poll(cs)
}
func (l *brokenLink) Arm() error {
	if err := l.fails("Arm"); err != nil {
		return err
	}
	return l.Pipe.Arm()
}
func (l *brokenLink) Wait() error {
	if err := l.fails("Wait"); err != nil {
		return err
	}
	return l.Pipe.Wait()
}

// TestLinkCallFails: when the link's Poll, Arm or Wait fails for good, a
// blocked Read returns that error (no hang, no retry loop), the peer
// learns it, and every later call fails the same way.
func TestLinkCallFails(t *testing.T) {
	for _, op := range []string{"Poll", "Arm", "Wait"} {
		t.Run(op, func(t *testing.T) {
			goroutineCheck(t)
			cfg, err := Config{}.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			pa, pb := link.NewPipe(pipeConfig(cfg), pipeConfig(cfg))
			bl := &brokenLink{Pipe: pa, op: op}
			a, b, _, _ := memConns(t, cfg, wire.FeatureRing|wire.FeatureShutdown, bl, pb)
			defer closeAndWait(t, b)
			defer closeAndWait(t, a)
			echoOnce(t, a, b)
			read := make(chan error, 1)
			go func() {
				_, err := a.Read(make([]byte, 1))
				read <- err
			}()
			time.Sleep(20 * time.Millisecond) // the Read polls, or waits to
			bl.broken.Store(true)
			// The peer's write makes a completion come, which the Read's
			// Poll or Wait meets; a Read that armed already meets Arm
			// with the next.
			if _, err := b.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			a.SetReadDeadline(time.Now().Add(hangGuard))
			select {
			case err := <-read:
				if err == nil && op != "Poll" {
					// The byte came before the Read armed, or while it
					// slept in the link's Wait: the next Read meets it.
					_, err = a.Read(make([]byte, 1))
				}
				if !errors.Is(err, errBrokenLink) {
					t.Fatalf("Read = %v, want the link's error", err)
				}
			case <-time.After(2 * hangGuard):
				t.Fatal("Read still blocked")
			}
			if _, err := a.Write([]byte("y")); !errors.Is(err, errBrokenLink) {
				t.Fatalf("a later Write = %v, want the link's error", err)
			}
			// The failed side disconnects: the peer learns of the end at
			// once, not after its keepalive.
			b.SetReadDeadline(time.Now().Add(cfg.KeepAlive / 2))
			if _, err := io.ReadAll(b); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the peer's Read = %v, want the link's end", err)
			}
		})
	}
}

// TestConnRefusesABadHello: a peer's Hello the engine cannot work with (a
// ring of no bytes) fails the connection's start with a protocol error,
// and leaves nothing running.
func TestConnRefusesABadHello(t *testing.T) {
	goroutineCheck(t)
	cfg, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	a, b := link.NewPipe(pipeConfig(cfg), pipeConfig(cfg))
	defer a.Close()
	defer b.Close()
	features := wire.FeatureRing | wire.FeatureShutdown
	bad := helloOf(cfg, features)
	bad.RingSize = 0
	c, err := newLinkConn(a, cfg, false, features, bad)
	var pe *wire.ProtocolError
	if c != nil || !errors.As(err, &pe) || !strings.Contains(err.Error(), "ring of 0 bytes") {
		t.Fatalf("newLinkConn with a ring of 0 bytes: %v, %v", c, err)
	}
}
