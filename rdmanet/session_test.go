package rdmanet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/session"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// Resumable sessions over link.Pipe: the links are cut, silenced or taken
// away in mid-stream, and a new pipe over the same rings takes their place,
// as another RDMA path or TCP will in the lab.

const sessionFeatures = wire.FeatureRing | wire.FeatureShutdown | wire.FeatureResume | wire.FeatureClose

// sessionPair is a client and a server Conn in one session, and the
// current pipe between them.
type sessionPair struct {
	client, server *Conn
	cfg            Config

	mu     sync.Mutex
	a, b   *link.Pipe // the current pipe: the client's end, the server's
	dials  int
	refuse error                            // the next dials fail with it
	hold   chan struct{}                    // dials wait for it while not nil
	tamper func(h *wire.Hello) (gen uint32) // changes what the dialer asks for
	// noSlots: the dialer's next paths have no control slots (a link the
	// engine cannot run on).
	noSlots bool
	resumed atomic.Int32
}

func sessionPipe(cfg Config, ctx, crx, stx, srx []byte) (*link.Pipe, *link.Pipe) {
	pc := func(tx, rx []byte) link.PipeConfig {
		p := pipeConfig(cfg)
		p.SendMem, p.RecvMem = tx, rx
		if cfg.linkNeeds&wire.FeatureRecvCredit != 0 {
			// As over iWARP (conn_test.go's iwarp mode).
			p.RNRRetry, p.RecvCredit, p.EarlyCompletion = 0, true, true
		}
		return p
	}
	client, server := pc(ctx, crx), pc(stx, srx)
	server.SpeakSecond = server.RecvCredit
	return link.NewPipe(client, server)
}

// sessionTestConfig is cfg with its defaults, and a resume bound for tests.
func sessionTestConfig(t testing.TB, cfg Config) Config {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ResumeTimeout == 0 {
		cfg.ResumeTimeout = 10 * time.Second
	}
	return cfg
}

// newSessionConn makes a resumable connection over l, which is
// established with the session extension agreed: the session id, and on
// the dialing side the paths to make a new link on.
func newSessionConn(l link.Link, cfg Config, server bool, features wire.Features, peer wire.Hello, id wire.SessionID, paths []session.Path) (*Conn, error) {
	c := &Conn{link: l, cfg: cfg, server: server}
	c.becomeSession(session.Config{ID: id, Hello: cfg.helloOf(features &^ wire.LinkFeatures), Paths: paths})
	if err := c.begin(features, peer); err != nil {
		return nil, err
	}
	return c, nil
}

func newSessionPair(t testing.TB, cfg Config) *sessionPair {
	t.Helper()
	p, _ := newSessionPairPaths(t, cfg, false)
	return p
}

// newTwoPathSessionPair is a session pair whose dialer has two paths to
// the server, "primary" and "secondary", with the switch that breaks the
// first.
func newTwoPathSessionPair(t testing.TB, cfg Config) (*sessionPair, *atomic.Bool) {
	t.Helper()
	return newSessionPairPaths(t, cfg, true)
}

func newSessionPairPaths(t testing.TB, cfg Config, two bool) (*sessionPair, *atomic.Bool) {
	t.Helper()
	cfg = sessionTestConfig(t, cfg)
	p := &sessionPair{cfg: cfg}
	broken := new(atomic.Bool)
	paths := []session.Path{{Name: "memory", Dial: p.dial}}
	if two {
		paths = []session.Path{
			{Name: "primary", Dial: func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error) {
				if broken.Load() {
					return nil, wire.Hello{}, errors.New("test: the first path is down")
				}
				return p.dial(ctx, h)
			}},
			{Name: "secondary", Dial: p.dial},
		}
	}
	p.a, p.b = sessionPipe(cfg, make([]byte, cfg.SendBuffer), make([]byte, cfg.RecvBuffer), make([]byte, cfg.SendBuffer), make([]byte, cfg.RecvBuffer))
	var id wire.SessionID
	var err error
	for i := range id {
		id[i] = byte(rand.Uint32())
	}
	hello := cfg.helloOf(sessionFeatures)
	p.client, err = newSessionConn(p.a, cfg, false, sessionFeatures, hello, id, paths)
	if err != nil {
		t.Fatal(err)
	}
	p.server, err = newSessionConn(p.b, cfg, true, sessionFeatures, hello, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, broken
}

// dial is the client's resume path: the server's side of a resume, then a
// new pipe over both sides' rings.
func (p *sessionPair) dial(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error) {
	p.mu.Lock()
	p.dials++
	path := fmt.Sprintf("memory#%d", p.dials)
	tx, rx := p.client.link.SendRing(), p.client.link.RecvRing()
	hold, refuse, tamper, narrow := p.hold, p.refuse, p.tamper, p.noSlots
	p.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, wire.Hello{}, ctx.Err()
		}
	}
	if refuse != nil {
		return nil, wire.Hello{}, refuse
	}
	if !h.Resume || h.Session != p.server.sess.ID() {
		return nil, wire.Hello{}, fmt.Errorf("the dialer asked for %+v", h)
	}
	gen := h.Generation
	if tamper != nil {
		gen = tamper(&h)
	}
	next, err := p.server.sess.BeginResume(gen)
	if err != nil {
		return nil, wire.Hello{}, err
	}
	a, b := sessionPipe(p.cfg, tx, rx, p.server.link.SendRing(), p.server.link.RecvRing())
	var ca link.Link = a
	if narrow {
		ca = noSlots{a}
	}
	if err := p.server.sess.EndResume(b, path); err != nil {
		a.Close()
		return nil, wire.Hello{}, err
	}
	p.mu.Lock()
	p.a, p.b = a, b
	p.mu.Unlock()
	p.resumed.Add(1)
	peer := p.cfg.helloOf(sessionFeatures)
	peer.Generation = next
	return ca, peer, nil
}

// pipes returns the current pipe's ends.
func (p *sessionPair) pipes() (*link.Pipe, *link.Pipe) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.a, p.b
}

// fault breaks the current pipe in one of the ways a path breaks.
func (p *sessionPair) fault(rng *rand.Rand) string {
	a, b := p.pipes()
	switch rng.IntN(3) {
	case 0:
		a.Cut(errors.New("test: port down"))
		return "cut"
	case 1:
		// Silent, as rxe after a link went down: the engines find it by
		// their dead-path timers.
		a.Silence()
		return "silence"
	default:
		// Only the server's side learns, as when its device is removed;
		// the client finds out by its timer.
		b.Silence()
		b.Cut(nil)
		return "server-side"
	}
}

// TestSessionSurvivesFaultsMidStream, also on links as iWARP's (receive
// credit, early completions, the accepting side speaking second), whose
// state starts afresh on each new link.
func TestSessionSurvivesFaultsMidStream(t *testing.T) {
	for _, iwarp := range []bool{false, true} {
		t.Run(map[bool]string{false: "rdmanet", true: "iwarp"}[iwarp], func(t *testing.T) {
			cfg := Config{RecvBuffer: 32 << 10, SendBuffer: 16 << 10, RecvDepth: 16, KeepAlive: 250 * time.Millisecond}
			if iwarp {
				cfg.linkNeeds = wire.LinkFeatures
			}
			sessionSurvivesFaults(t, cfg)
		})
	}
}

// faultsDuring injects up to n faults, 2-21 ms apart, each after the
// last one's resumption, until done is closed; it counts them by kind.
func (p *sessionPair) faultsDuring(done <-chan struct{}, n int, src rand.Source) map[string]int {
	rng := rand.New(src)
	faults := map[string]int{}
	for i := int32(1); i <= int32(n); i++ {
		select {
		case <-done:
			return faults
		case <-time.After(time.Duration(2+rng.IntN(20)) * time.Millisecond):
		}
		faults[p.fault(rng)]++
		// The next fault waits for this one's resumption.
		for p.resumed.Load() < i {
			select {
			case <-done:
				return faults
			case <-time.After(time.Millisecond):
			}
		}
	}
	return faults
}

func sessionSurvivesFaults(t *testing.T, cfg Config) {
	goroutineCheck(t)
	p := newSessionPair(t, cfg)
	const size = 32 << 20
	done := streamBothWays(t, p.client, p.server, size)
	faults := p.faultsDuring(done, 12, rand.NewPCG(1, 2))
	<-done
	t.Logf("faults %v, resumptions %d", faults, p.resumed.Load())
	if p.resumed.Load() < 3 {
		t.Errorf("%d resumptions: the streams ended before the faults tested anything", p.resumed.Load())
	}
	closeAndWait(t, p.client)
	closeAndWait(t, p.server)
}

// nettest's whole contract on a resumable connection whose link fails
// again and again.
func TestSessionNetConnWithFaults(t *testing.T) {
	goroutineCheck(t)
	var resumed atomic.Int32
	t.Cleanup(func() {
		t.Logf("%d resumptions", resumed.Load())
		if resumed.Load() == 0 {
			t.Error("no link failed: the test tested nothing")
		}
	})
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		p := newSessionPair(t, Config{KeepAlive: 250 * time.Millisecond})
		quit := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
			for {
				select {
				case <-quit:
					return
				case <-time.After(time.Duration(1+rng.IntN(20)) * time.Millisecond):
					p.fault(rng)
				}
			}
		}()
		return p.client, p.server, func() {
			close(quit)
			wg.Wait()
			resumed.Add(p.resumed.Load())
			p.client.Close()
			p.server.Close()
		}, nil
	})
}

// Deadlines work while the session has no link, and the stream goes on
// once it has one again.
func TestSessionDeadlinesDuringPause(t *testing.T) {
	goroutineCheck(t)
	p := newSessionPair(t, Config{KeepAlive: 250 * time.Millisecond})
	hold := make(chan struct{})
	p.mu.Lock()
	p.hold = hold
	p.mu.Unlock()
	a, _ := p.pipes()
	a.Cut(nil)

	p.client.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	var b [8]byte
	if _, err := p.client.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read during the pause: %v, want a deadline error", err)
	}
	p.client.SetWriteDeadline(time.Now().Add(30 * time.Millisecond))
	big := make([]byte, 4*p.cfg.SendBuffer) // more than the ring holds: it waits for the link
	if n, err := p.client.Write(big); !errors.Is(err, os.ErrDeadlineExceeded) || n >= len(big) {
		t.Fatalf("Write during the pause: %d, %v; want a deadline error", n, err)
	}
	p.client.SetDeadline(time.Time{})
	close(hold)
	msg := []byte("after the pause")
	go p.server.Write(msg)
	if _, err := io.ReadFull(p.client, b[:]); err != nil || string(b[:]) != string(msg[:8]) {
		t.Fatalf("after the pause read %q, %v", b, err)
	}
	closeAndWait(t, p.client)
	closeAndWait(t, p.server)
}

// A session that cannot resume ends within Config.ResumeTimeout, with an
// error naming every path tried; so does the server's side, which waits.
func TestSessionResumeTimeout(t *testing.T) {
	goroutineCheck(t)
	p := newSessionPair(t, Config{KeepAlive: 250 * time.Millisecond, ResumeTimeout: 300 * time.Millisecond})
	p.mu.Lock()
	p.refuse = errors.New("test: no route to host")
	p.mu.Unlock()
	a, _ := p.pipes()
	a.Cut(nil)
	start := time.Now()
	var b [1]byte
	_, err := p.client.Read(b[:])
	var re *ResumeError
	if !errors.As(err, &re) || re.Refused || len(re.Attempts) != 1 || re.Attempts[0].Tries < 2 || re.Attempts[0].Path != "memory" {
		t.Fatalf("Read: %v, want a *ResumeError after several attempts", err)
	}
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Errorf("%v is not a timeout", err)
	}
	if !errors.Is(err, link.ErrDown) {
		t.Errorf("%v does not say what broke the link", err)
	}
	t.Logf("after %v: %v", time.Since(start), err)
	if _, err := p.server.Read(b[:]); !errors.As(err, &re) {
		t.Fatalf("server Read: %v, want a *ResumeError", err)
	}
	closeAndWait(t, p.client)
	closeAndWait(t, p.server)
}

// The server refuses a resume with a stale or wrong generation, and the
// dialer ends the session at once instead of trying until its timeout.
func TestSessionRefusesStaleGeneration(t *testing.T) {
	for name, tamper := range map[string]func(*wire.Hello) uint32{
		"replayed": func(h *wire.Hello) uint32 { return h.Generation - 1 },
		"guessed":  func(h *wire.Hello) uint32 { return h.Generation + 7 },
	} {
		t.Run(name, func(t *testing.T) {
			goroutineCheck(t)
			p := newSessionPair(t, Config{KeepAlive: 250 * time.Millisecond})
			// One good resume first, so the generation is 1 and a replay of
			// the first request (generation 0) is stale.
			a, _ := p.pipes()
			a.Cut(nil)
			roundTrip(t, p.client, p.server)
			if p.resumed.Load() != 1 {
				t.Fatalf("%d resumptions, want 1", p.resumed.Load())
			}
			p.mu.Lock()
			p.tamper = tamper
			p.mu.Unlock()
			a, _ = p.pipes()
			a.Cut(nil)
			var b [1]byte
			_, err := p.client.Read(b[:])
			var re *ResumeError
			if !errors.As(err, &re) || !re.Refused || !errors.Is(re.Attempts[len(re.Attempts)-1].Err, ErrSessionRefused) {
				t.Fatalf("Read: %v, want a refused resume", err)
			}
			closeAndWait(t, p.client)
			closeAndWait(t, p.server)
		})
	}
}

// A peer that closes ends the session as today: no resumption.
func TestSessionPeerCloseIsNotAFailure(t *testing.T) {
	goroutineCheck(t)
	p := newSessionPair(t, Config{KeepAlive: 250 * time.Millisecond})
	roundTrip(t, p.client, p.server)
	closeAndWait(t, p.server)
	var b [1]byte
	if _, err := p.client.Read(b[:]); err != io.EOF {
		t.Fatalf("Read after the peer closed: %v, want EOF", err)
	}
	if _, err := p.client.Write(b[:]); err == nil {
		t.Fatal("Write after the peer closed succeeded")
	}
	p.mu.Lock()
	dials := p.dials
	p.mu.Unlock()
	if dials != 0 {
		t.Fatalf("%d resume dials after the peer closed", dials)
	}
	closeAndWait(t, p.client)
}

// A side whose keepalive takes a stall for a dead path lets go of a link
// that works. The other side sees the link end without a Close: a lost
// link, not the peer closing, so the session resumes. On the server, which
// cannot resume itself, this used to end the session.
//
// Each let-go waits for both sides to have moved: the server's side of a
// resume (p.resumed) is done before the dialer has its new link, and a
// side without a link has nothing to let go of.
func TestSessionFalseDeadPath(t *testing.T) {
	for _, side := range []string{"server", "client"} {
		t.Run(side, func(t *testing.T) {
			goroutineCheck(t)
			p := newSessionPair(t, Config{RecvBuffer: 32 << 10, SendBuffer: 16 << 10, KeepAlive: time.Second})
			done := streamBothWays(t, p.client, p.server, 4<<20)
			c := map[string]*Conn{"server": p.server, "client": p.client}[side]
			for range 3 {
				before := [2]int{p.client.Session().Failovers, p.server.Session().Failovers}
				if err := DeclareDeadPath(c); err != nil {
					t.Fatal(err)
				}
				for end := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
					cs, ss := p.client.Session(), p.server.Session()
					if cs.Failovers > before[0] && !cs.Suspended && ss.Failovers > before[1] && !ss.Suspended {
						break
					}
					if time.Now().After(end) { // a hang guard, not a timing check
						t.Fatalf("no resume after the %s let go of its link (%d resumes): client %+v, server %+v", side, p.resumed.Load(), cs, ss)
					}
				}
			}
			<-done
			if m := p.client.Session().LastMove; side == "server" && m.Reason != "peer-left" {
				t.Errorf("the client moved for %q, want peer-left", m.Reason)
			}
			closeAndWait(t, p.client)
			closeAndWait(t, p.server)
		})
	}
}

// A peer that ends its link without closing and does not come back (its
// process died, and its kernel ended the link) ends the session as a
// plain connection's peer does, with no resumption: the server's side
// after peerLeftWait, the dialer's as soon as its resume on the same path
// is refused.
func TestSessionPeerDiesWithoutClosing(t *testing.T) {
	for _, dies := range []string{"client", "server"} {
		t.Run(dies, func(t *testing.T) {
			goroutineCheck(t)
			p := newSessionPair(t, Config{KeepAlive: 250 * time.Millisecond})
			roundTrip(t, p.client, p.server)
			p.mu.Lock()
			p.refuse = fmt.Errorf("%w: test: the session is unknown here", ErrSessionRefused)
			p.mu.Unlock()
			survivor := map[string]*Conn{"client": p.server, "server": p.client}[dies]
			a, b := p.pipes()
			map[string]*link.Pipe{"client": a, "server": b}[dies].Close()
			var buf [1]byte
			if _, err := survivor.Read(buf[:]); err != io.EOF {
				t.Fatalf("Read after the %s died: %v, want EOF", dies, err)
			}
			if _, err := survivor.Write(buf[:]); !errors.Is(err, stream.ErrPeerClosed) {
				t.Errorf("Write after the %s died: %v, want ErrPeerClosed", dies, err)
			}
			if st := survivor.Session(); st.Failovers != 0 || st.Suspended {
				t.Errorf("session %+v after the %s died", st, dies)
			}
			closeAndWait(t, p.client)
			closeAndWait(t, p.server)
		})
	}
}

// roundTrip sends a byte each way.
func roundTrip(t *testing.T, a, b *Conn) {
	t.Helper()
	var buf [1]byte
	for _, c := range [][2]*Conn{{a, b}, {b, a}} {
		if _, err := c[0].Write([]byte{'x'}); err != nil {
			t.Fatalf("write: %v", err)
		}
		if _, err := io.ReadFull(c[1], buf[:]); err != nil {
			t.Fatalf("read: %v", err)
		}
	}
}

// A session moves to its second path when the first breaks, and back to
// the first once it works again, while both directions stream: every byte
// arrives once, in order.
func TestSessionFailsBack(t *testing.T) {
	goroutineCheck(t)
	before := ReadMetrics().Sessions
	p, broken := newTwoPathSessionPair(t, Config{RecvBuffer: 32 << 10, SendBuffer: 16 << 10, KeepAlive: time.Second, FailbackInterval: 20 * time.Millisecond})
	const size = 16 << 20
	done := streamBothWays(t, p.client, p.server, size)
	for round := 1; round <= 3; round++ {
		broken.Store(true)
		a, _ := p.pipes()
		a.Cut(nil)
		eventuallySession(t, p.client, "failover to the second path", func(s SessionState) bool { return s.Path == "secondary" })
		if m := p.client.Session().LastMove; m.FromPath == "secondary" || m.ToPath != "secondary" || m.Reason == "failback" || m.At.IsZero() || m.Pause <= 0 {
			t.Errorf("round %d: after the failover, LastMove %+v", round, m)
		}
		broken.Store(false)
		eventuallySession(t, p.client, "failback", func(s SessionState) bool { return s.Path == "primary" && s.Failbacks == round })
		if m := p.client.Session().LastMove; m.FromPath != "secondary" || m.ToPath != "primary" || m.Reason != "failback" || m.To != "memory" {
			t.Errorf("round %d: after the failback, LastMove %+v", round, m)
		}
	}
	<-done
	t.Logf("client %+v", p.client.Session())
	fb := SessionMove{Reason: "failback", From: "memory", To: "memory"}
	if got := ReadMetrics().Sessions[fb] - before[fb]; got != 3 {
		t.Errorf("%d failbacks counted, want 3", got)
	}
	closeAndWait(t, p.client)
	closeAndWait(t, p.server)
}

// SessionStats counts moves by reason and transports. Which side sees
// which reason races (a side told by the peer's resume before it polls its
// own failure counts peer-resumed), and other tests' closing sessions may
// still move, so it checks lower bounds.
func TestSessionStatsCountMoves(t *testing.T) {
	goroutineCheck(t)
	key := func(reason string) SessionMove { return SessionMove{Reason: reason, From: "memory", To: "memory"} }
	delta := func(before map[SessionMove]uint64, reasons ...string) uint64 {
		after := ReadMetrics().Sessions
		var n uint64
		for _, r := range reasons {
			n += after[key(r)] - before[key(r)]
		}
		return n
	}
	p := newSessionPair(t, Config{KeepAlive: 250 * time.Millisecond})
	before := ReadMetrics().Sessions
	a, _ := p.pipes()
	a.Cut(nil)
	roundTrip(t, p.client, p.server)
	if n := delta(before, "link-down", "peer-resumed"); n < 2 {
		t.Errorf("a cut both sides resumed from: %d moves counted, want 2 (%v)", n, ReadMetrics().Sessions)
	}
	before = ReadMetrics().Sessions
	a, _ = p.pipes()
	a.Silence()
	roundTrip(t, p.client, p.server) // the dead-path timers find it
	if n := delta(before, "dead-path"); n < 1 {
		t.Errorf("a silent path: %d dead-path moves counted, want 1 or more (%v)", n, ReadMetrics().Sessions)
	}
	if n := delta(before, "dead-path", "peer-resumed"); n < 2 {
		t.Errorf("a silent path: %d moves counted, want 2 (%v)", n, ReadMetrics().Sessions)
	}
	closeAndWait(t, p.client)
	closeAndWait(t, p.server)
}

// TestSessionCloseDuringFailback: Close while a failback's dial is under
// way returns at once, and the failback ends when its dial does, leaving
// nothing behind.
func TestSessionCloseDuringFailback(t *testing.T) {
	goroutineCheck(t)
	p, broken := newTwoPathSessionPair(t, Config{KeepAlive: time.Second, FailbackInterval: 20 * time.Millisecond})
	roundTrip(t, p.client, p.server)
	broken.Store(true)
	a, _ := p.pipes()
	a.Cut(nil)
	eventuallySession(t, p.client, "failover to the second path", func(s SessionState) bool { return s.Path == "secondary" })
	hold := make(chan struct{})
	p.mu.Lock()
	p.hold = hold
	dials := p.dials
	p.mu.Unlock()
	broken.Store(false)
	for end := time.Now().Add(hangGuard); ; time.Sleep(time.Millisecond) {
		p.mu.Lock()
		dialing := p.dials > dials
		p.mu.Unlock()
		if dialing {
			break
		}
		if time.Now().After(end) {
			t.Fatal("no failback dial")
		}
	}
	if st := p.client.Session(); st.Path != "secondary" {
		t.Fatalf("while the failback dials: %+v", st)
	}
	closed := make(chan struct{})
	go func() { p.client.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(hangGuard):
		t.Fatal("Close waited for the failback's dial")
	}
	close(hold)
	closeAndWait(t, p.client)
	closeAndWait(t, p.server)
}

// TestSessionServerResumeAbandoned: a resume the server began and could
// not finish (its answer to the dialer could not be written) leaves the
// session as it was, on its link, and a later resume is not refused as
// busy.
func TestSessionServerResumeAbandoned(t *testing.T) {
	goroutineCheck(t)
	p := newSessionPair(t, Config{KeepAlive: time.Second})
	roundTrip(t, p.client, p.server)
	gen := p.server.sess.Snapshot().Generation
	if _, err := p.server.sess.BeginResume(gen); err != nil {
		t.Fatal(err)
	}
	if _, err := p.server.sess.BeginResume(gen); !errors.Is(err, errResumeBusy) {
		t.Fatalf("a second resume while one is under way: %v, want busy", err)
	}
	if err := p.server.sess.EndResume(nil, ""); err != nil {
		t.Fatal(err)
	}
	if state := p.server.sess.Snapshot().State; state != session.Active {
		t.Fatalf("after an abandoned resume the server's session is %v, want active", state)
	}
	roundTrip(t, p.client, p.server)
	if _, err := p.server.sess.BeginResume(gen); err != nil {
		t.Fatalf("a resume after the abandoned one: %v", err)
	}
	p.server.sess.EndResume(nil, "")
	closeAndWait(t, p.client)
	closeAndWait(t, p.server)
}

// TestSessionResumesWhileLingering: a session whose path goes silent
// after Close, with bytes still undelivered, finds the dead path in the
// linger's own checks, resumes, and delivers them before it releases its
// link; the peer reads them all, then the end of the stream.
func TestSessionResumesWhileLingering(t *testing.T) {
	goroutineCheck(t)
	p := newSessionPair(t, Config{KeepAlive: 250 * time.Millisecond})
	roundTrip(t, p.client, p.server)
	a, _ := p.pipes()
	a.Silence()
	data := make([]byte, 8<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if _, err := p.client.Write(data); err != nil {
		t.Fatal(err)
	}
	p.client.Close()
	p.server.SetReadDeadline(time.Now().Add(hangGuard))
	got, err := io.ReadAll(p.server)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the server read %d bytes (%v), want the %d written before Close", len(got), err, len(data))
	}
	select {
	case <-p.client.released:
	case <-time.After(2 * lingerTimeout):
		t.Fatal("the client's link was not released")
	}
	if st := p.client.Session(); st.Failovers != 1 || st.LastMove.Reason != "dead-path" {
		t.Errorf("the client's session after the linger: %+v", st)
	}
	closeAndWait(t, p.server)
}

// noSlots is a pipe end whose Caps say it has no control slots.
type noSlots struct{ *link.Pipe }

func (n noSlots) Caps() link.Caps {
	c := n.Pipe.Caps()
	c.ControlDepth = 0
	return c
}

// TestSessionPathTheEngineCannotUse: a new path the engine cannot run on
// (no control slots) ends the session with the engine's error, which a
// blocked Read returns; nothing hangs.
func TestSessionPathTheEngineCannotUse(t *testing.T) {
	goroutineCheck(t)
	p := newSessionPair(t, Config{KeepAlive: 250 * time.Millisecond, ResumeTimeout: 500 * time.Millisecond})
	p.mu.Lock()
	p.noSlots = true
	p.mu.Unlock()
	a, _ := p.pipes()
	a.Cut(nil)
	p.client.SetReadDeadline(time.Now().Add(hangGuard))
	var b [1]byte
	if _, err := p.client.Read(b[:]); err == nil || !strings.Contains(err.Error(), "without send or control slots") {
		t.Fatalf("Read: %v, want the engine's refusal of the new path", err)
	}
	closeAndWait(t, p.client)
	closeAndWait(t, p.server)
}
