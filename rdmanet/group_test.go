package rdmanet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
	"github.com/rdmanet/sdk/internal/wire"
)

// groupBase is a base pipe for streams streams: receives for each one's
// first grant and room to grant more, and receiver-not-ready fatal, so
// that an overrun of the credit fails loudly.
func groupBase(streams int) link.PipeConfig {
	return link.PipeConfig{SendRing: 64, RecvRing: 64, SendDepth: 256, ControlDepth: 32,
		RecvDepth: 64 + 16*streams, RecvCredit: true, RecvGrant: true}
}

// groupMuxes makes two groups over a pipe, closed when the test ends.
func groupMuxes(t testing.TB, gc group.Config, pc link.PipeConfig) (a, b *group.Mux) {
	t.Helper()
	a, b, _, _ = groupPipeMuxes(t, gc, gc, pc)
	return a, b
}

// groupPipeMuxes makes groups with ga and gb over a pipe's two ends, which
// it returns too, closed when the test ends.
func groupPipeMuxes(t testing.TB, ga, gb group.Config, pc link.PipeConfig) (a, b *group.Mux, pa, pb *link.Pipe) {
	t.Helper()
	pa, pb = linktest.NewPipes(t, pc, pc)
	a, b = groupsOver(t, ga, gb, pa, pb)
	return a, b, pa, pb
}

// groupsOver makes groups with ga and gb over base links ba and bb,
// closed when the test ends.
func groupsOver(t testing.TB, ga, gb group.Config, ba, bb link.Carrier) (a, b *group.Mux) {
	t.Helper()
	a, err := group.New(ba, ga)
	if err != nil {
		t.Fatal(err)
	}
	if b, err = group.New(bb, gb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

// groupStreamConfig is a group's stream sizes for connections with cfg,
// as a listener's (which accepts streams) sizes them.
func groupStreamConfig(cfg Config) group.Config { return groupConfig(cfg, 128, false) }

// testStreamConn makes a Conn over a group's stream.
func testStreamConn(t testing.TB, s *group.Stream, cfg Config, server bool) *Conn {
	t.Helper()
	c, err := streamConn(s, cfg, server)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// groupConnPair opens a stream of a's that b accepts and makes a Conn at
// each end.
func groupConnPair(t testing.TB, cfg Config, a, b *group.Mux) (client, server *Conn) {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
	defer cancel()
	accepted := make(chan *group.Stream, 1)
	go func() {
		s, err := b.Accept(ctx)
		if err != nil {
			t.Error(err)
		}
		accepted <- s
	}()
	sa, err := a.Open(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	sb := <-accepted
	if sb == nil {
		t.FailNow()
	}
	return testStreamConn(t, sa, cfg, false), testStreamConn(t, sb, cfg, true)
}

// TestGroupNetConn: a Conn over a group's stream keeps net.Conn's whole
// contract, with other streams of the group open beside it.
func TestGroupNetConn(t *testing.T) {
	goroutineCheck(t)
	cfg, _ := Config{}.withDefaults()
	a, b := groupMuxes(t, groupStreamConfig(cfg), groupBase(64))
	// Streams that stay open, idle, beside those the suite makes.
	for range 4 {
		x, y := groupConnPair(t, Config{}, a, b)
		t.Cleanup(func() { closeAndWait(t, x); closeAndWait(t, y) })
	}
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		x, y := groupConnPair(t, Config{}, a, b)
		return x, y, func() { x.Close(); y.Close() }, nil
	})
	// The suite closes without waiting: its streams go as the Conns
	// release their links.
	for _, m := range []*group.Mux{a, b} {
		deadline := time.Now().Add(2 * lingerTimeout)
		for m.Stats().Streams != 4 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if st := m.Stats(); st.Streams != 4 {
			t.Errorf("%d streams open after the suite, want the 4 idle ones: %+v", st.Streams, st)
		}
	}
}

// TestGroupThousandStreams: 1,000 streams over one link. One stream's
// reader does not read, and its writer fills the window; another streams
// without pause. Every other stream makes a round trip meanwhile: neither
// the stalled stream nor the large writer holds them up. Then the stalled
// reader reads, and both long streams arrive whole (SHA-256).
func TestGroupThousandStreams(t *testing.T) {
	goroutineCheck(t)
	const streams = 1000
	cfg, _ := Config{}.withDefaults()
	a, b := groupMuxes(t, groupStreamConfig(cfg), groupBase(streams))
	clients, servers := make([]*Conn, streams), make([]*Conn, streams)
	for i := range streams {
		clients[i], servers[i] = groupConnPair(t, Config{}, a, b)
	}
	defer func() {
		for i := range streams {
			closeAndWait(t, clients[i])
			closeAndWait(t, servers[i])
		}
	}()

	// Stream 0: 1 MiB written to a reader that does not read yet.
	const stalledSize = 1 << 20
	stalledSum := make(chan [32]byte, 1)
	go func() { stalledSum <- writeRandom(t, clients[0], stalledSize, 1) }()

	// Stream 1: a writer that does not pause until the round trips are done.
	stopBig := make(chan struct{})
	bigWritten := make(chan [2]any, 1)
	go func() {
		h := sha256.New()
		buf := make([]byte, 64<<10)
		n := 0
		for seed := byte(0); ; seed++ {
			select {
			case <-stopBig:
				clients[1].CloseWrite()
				bigWritten <- [2]any{n, h.Sum(nil)}
				return
			default:
			}
			for i := range buf {
				buf[i] = seed + byte(i)
			}
			if _, err := clients[1].Write(buf); err != nil {
				t.Errorf("large writer: %v", err)
				bigWritten <- [2]any{n, h.Sum(nil)}
				return
			}
			h.Write(buf)
			n += len(buf)
		}
	}()
	bigRead := make(chan [2]any, 1)
	go func() {
		h := sha256.New()
		n, err := io.Copy(h, servers[1])
		if err != nil {
			t.Errorf("large reader: %v", err)
		}
		bigRead <- [2]any{int(n), h.Sum(nil)}
	}()

	// The others: a round trip of 1 KiB each, all at once.
	var wg sync.WaitGroup
	for i := 2; i < streams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := bytes.Repeat([]byte{byte(i)}, 1024)
			go func() {
				buf := make([]byte, len(msg))
				if _, err := io.ReadFull(servers[i], buf); err != nil {
					t.Errorf("stream %d: server read: %v", i, err)
					return
				}
				servers[i].Write(buf)
			}()
			if _, err := clients[i].Write(msg); err != nil {
				t.Errorf("stream %d: write: %v", i, err)
				return
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(clients[i], got); err != nil || !bytes.Equal(got, msg) {
				t.Errorf("stream %d: answer %v, %v", i, err, bytes.Equal(got, msg))
			}
		}()
	}
	wg.Wait()
	select {
	case sum := <-stalledSum:
		t.Fatalf("the stalled stream's writer finished before its reader read (%x)", sum[:4])
	default:
	}
	close(stopBig)
	w, r := <-bigWritten, <-bigRead
	if w[0].(int) == 0 || w[0] != r[0] || !bytes.Equal(w[1].([]byte), r[1].([]byte)) {
		t.Errorf("large stream: wrote %v bytes, read %v; hashes equal %v", w[0], r[0], bytes.Equal(w[1].([]byte), r[1].([]byte)))
	}
	h := sha256.New()
	if _, err := io.CopyN(h, servers[0], stalledSize); err != nil {
		t.Fatal(err)
	}
	if sum := <-stalledSum; !bytes.Equal(sum[:], h.Sum(nil)) {
		t.Error("the stalled stream's bytes differ")
	}
	st := a.Stats()
	t.Logf("group a: %+v", st)
	if st.Streams != streams {
		t.Errorf("%d streams, want %d", st.Streams, streams)
	}
}

// TestGroupStreamRestsTakingTurns: a group's stream whose Reads wait for
// answers polls its base link and leaves it unarmed between round trips
// (connfd's rest, and the group's base link resting while its streams
// poll), so that the base links raise few completion events (on rxe, a
// tasklet each): arming after every Read or every kick raises one or
// more a round trip. A round trip slow enough for a poller to give up
// may raise some; the bound allows for them. Once the round trips end,
// the rests end within their timers: both base links are armed again.
// With an Accept waiting at both ends, as a listener's group always has
// one: an Accept that led the link on, rather than letting it rest once
// its streams polled, armed it again at each of their completions.
func TestGroupStreamRestsTakingTurns(t *testing.T) {
	for _, accepting := range []bool{false, true} {
		t.Run(fmt.Sprintf("accepting=%v", accepting), func(t *testing.T) {
			cfg, _ := Config{}.withDefaults()
			gc := groupStreamConfig(cfg)
			a, b, pa, pb := groupPipeMuxes(t, gc, gc, groupBase(1))
			client, server := groupConnPair(t, Config{}, a, b)
			defer client.Close()
			defer server.Close()
			if accepting {
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				defer wg.Wait()
				defer cancel()
				for _, m := range []*group.Mux{a, b} {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if s, err := m.Accept(ctx); err == nil {
							t.Errorf("a stream nobody opened: %#x", s.Tag())
						}
					}()
				}
			}
			const size, warm, rounds = 64, 50, 400
			echoed := echoRounds(server, size, warm+rounds)
			msg, back := make([]byte, size), make([]byte, size)
			roundTrip := func() { pingOnce(t, client, msg, back) }
			for range warm { // adaptive polling learns that the answers are quick
				roundTrip()
			}
			events := func() uint64 { return pa.Stats().Events + pb.Stats().Events }
			before, slow := events(), 0
			for range rounds {
				start := time.Now()
				roundTrip()
				if time.Since(start) > time.Millisecond {
					slow++
				}
			}
			t.Logf("events %d slow %d", events()-before, slow)
			if n := events() - before; n > rounds/2+2*uint64(slow) {
				t.Errorf("%d completion events over the base links in %d round trips (%d over 1 ms): the links were armed while the streams polled", n, rounds, slow)
			}
			if err := <-echoed; err != nil {
				t.Fatal(err)
			}
			for end := time.Now().Add(linktest.HangGuard); !pa.Stats().Armed || !pb.Stats().Armed; time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("base links armed %v and %v %v after the round trips ended", pa.Stats().Armed, pb.Stats().Armed, linktest.HangGuard)
				}
			}
		})
	}
}

// TestGroupStreamPostsAsOwn: a 64 B ping-pong on a group's stream, over a
// base link with the pool of receives a group's link has, makes as many
// ibv_post_send calls a round trip (link.PipeCalls, the calls a device
// would take) as on a connection of its own: the stream's credit rides
// the link as the connection's does. A grant that made a Credit due every
// few messages (a short pool, or a lower threshold) costs a third more.
func TestGroupStreamPostsAsOwn(t *testing.T) {
	const rounds = 400
	perRound := func(client, server *Conn, calls func() uint64) float64 {
		t.Helper()
		echoed := echoRounds(server, 64, 2*rounds)
		buf := make([]byte, 64)
		roundTrip := func() { pingOnce(t, client, buf, buf) }
		for range rounds { // past the first grants and the rings' growth
			roundTrip()
		}
		before := calls()
		for range rounds {
			roundTrip()
		}
		if err := <-echoed; err != nil {
			t.Fatal(err)
		}
		return float64(calls()-before) / rounds
	}
	c, s, a, b := memPair(t, Config{}, hostModes[0].features)
	own := perRound(c, s, func() uint64 { return a.Stats().Calls.PostSend + b.Stats().Calls.PostSend })
	closeAndWait(t, c)
	closeAndWait(t, s)

	cfg, _ := Config{}.withDefaults()
	gc := groupStreamConfig(cfg)
	pc := groupBase(1)
	pc.RecvDepth = groupRecvDepth
	x, y, pa, pb := groupPipeMuxes(t, gc, gc, pc)
	c, s = groupConnPair(t, Config{}, x, y)
	defer closeAndWait(t, c)
	defer closeAndWait(t, s)
	stream := perRound(c, s, func() uint64 { return pa.Stats().Calls.PostSend + pb.Stats().Calls.PostSend })
	t.Logf("posts a round trip: own %.2f, group's stream %.2f", own, stream)
	if stream > own+0.1 {
		t.Errorf("a group's stream posts %.2f times a round trip, a connection of its own %.2f", stream, own)
	}
}

// echoRounds echoes n messages of size bytes on server, in a goroutine,
// and says how that ended.
func echoRounds(server net.Conn, size, n int) <-chan error {
	echoed := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range n {
			if _, err := io.ReadFull(server, buf); err != nil {
				echoed <- err
				return
			}
			if _, err := server.Write(buf); err != nil {
				echoed <- err
				return
			}
		}
		echoed <- nil
	}()
	return echoed
}

// pingOnce writes msg on client and reads its echo into back.
func pingOnce(t *testing.T, client net.Conn, msg, back []byte) {
	t.Helper()
	if _, err := client.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(client, back); err != nil {
		t.Fatal(err)
	}
}

// TestGroupConnInfo: a stream's Info names it, and its ends differ.
func TestGroupConnInfo(t *testing.T) {
	goroutineCheck(t)
	cfg, _ := Config{}.withDefaults()
	a, b := groupMuxes(t, groupStreamConfig(cfg), groupBase(4))
	x, y := groupConnPair(t, Config{}, a, b)
	defer closeAndWait(t, x)
	defer closeAndWait(t, y)
	xi, yi := x.Info(), y.Info()
	if xi.Stream == 0 || yi.Stream == 0 || xi.Side != sideDialed || yi.Side != sideAccepted {
		t.Errorf("stream ends' info: %+v and %+v", xi, yi)
	}
	if xi.Local != yi.Remote || xi.Remote != yi.Local {
		t.Errorf("addresses %s -> %s and %s -> %s do not mirror", xi.Local, xi.Remote, yi.Local, yi.Remote)
	}
	c, peer, _, _ := memPair(t, Config{}, wire.FeatureRing)
	defer closeAndWait(t, c)
	defer closeAndWait(t, peer)
	if s := c.Info().Stream; s != 0 {
		t.Errorf("a connection of its own has stream %#x", s)
	}
}

// BenchmarkHostGroupOpen: a stream opened in an existing group over the
// in-memory link, a byte each way, and both ends closed: what a dial
// costs above the device.
func BenchmarkHostGroupOpen(b *testing.B) {
	cfg, _ := Config{}.withDefaults()
	a, m := groupMuxes(b, groupStreamConfig(cfg), groupBase(64))
	b.ReportAllocs()
	buf := []byte{1}
	for range b.N {
		x, y := groupConnPair(b, Config{}, a, m)
		if _, err := x.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(y, buf); err != nil {
			b.Fatal(err)
		}
		x.Close()
		y.Close()
	}
}

// TestGroupStreamOpenMessages: a connection that opens a stream of a
// group, sends a byte, reads its echo and closes (what a dial benchmark or
// a short RPC does) takes 7 requests on the link at both ends together:
// StreamOpen and StreamAccept, which name both rings (feature 4096), the
// two bytes, the closing side's marker after its unsignaled data, and
// StreamClose and StreamClosed. Each is a post and its completion, a
// system call on rxe: it took 12 when each engine announced its ring again
// and credits went back for the first messages and for each other.
func TestGroupStreamOpenMessages(t *testing.T) {
	cfg, _ := Config{}.withDefaults()
	gc := groupConfig(cfg, 128, true)
	gc.Features = groupStreamOffer
	a, b, pa, pb := groupPipeMuxes(t, gc, gc, groupBase(8))
	posted := func() uint64 { return pa.Stats().Posted + pb.Stats().Posted }
	const cycles = 20
	before := posted()
	buf := []byte{1}
	for range cycles {
		x, y := groupConnPair(t, Config{}, a, b)
		x.SetDeadline(time.Now().Add(linktest.HangGuard))
		y.SetDeadline(time.Now().Add(linktest.HangGuard))
		if _, err := x.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(y, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := y.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(x, buf); err != nil {
			t.Fatal(err)
		}
		x.Close()
		if _, err := y.Read(buf); err != io.EOF {
			t.Fatalf("the server's read after the client's Close: %v, want EOF", err)
		}
		y.Close()
	}
	for end := time.Now().Add(linktest.HangGuard); a.Stats().Streams+b.Stats().Streams > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("streams still open: %+v, %+v", a.Stats(), b.Stats())
		}
	}
	per := float64(posted()-before) / cycles
	t.Logf("%.2f requests on the link a connection", per)
	if per > 7 {
		t.Errorf("%.2f requests on the link for an open, a byte each way and a close, want at most 7", per)
	}
}

// TestGroupStreamRingsGrow: a stream's rings start small and grow as a
// connection's do while it streams (the mux checks each write against the
// rings the peer offered, Ring messages included); every byte arrives
// (SHA-256), and the grown rings go back to the link with the stream.
func TestGroupStreamRingsGrow(t *testing.T) {
	goroutineCheck(t)
	cfg, _ := Config{}.withDefaults()
	pc := groupBase(4)
	a, b := groupMuxes(t, groupStreamConfig(cfg), pc)
	x, y := groupConnPair(t, Config{}, a, b)
	first := x.Info().Window.SendRing
	<-streamBothWays(t, x, y, 8<<20)
	grown := x.Info().Window.SendRing
	if grown <= first {
		t.Errorf("transmit ring %d bytes after streaming 8 MiB, %d before: it did not grow", grown, first)
	}
	closeAndWait(t, x)
	closeAndWait(t, y)
	deadline := time.Now().Add(2 * lingerTimeout)
	for a.Stats().Streams+b.Stats().Streams > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := a.Stats().Streams + b.Stats().Streams; n != 0 {
		t.Errorf("%d streams left after both ends closed", n)
	}
	t.Logf("transmit ring: %d bytes at first, %d after streaming", first, grown)
}

// TestGroupStreamRetain: a moving group's streams are resumable, and
// retain what they send until credited; with wire.FeatureRetain agreed,
// each says what its transmit ring retains as it grows, so that the peer
// credits every quarter of that and not of the first 4 KiB ring. A client
// asking 28 bytes and answered 4 KiB each time (an NBD read at queue
// depth 1) sent a Credit with each request, two sends a round trip. With
// a peer that did not agree the streams still work, crediting as before.
// The answers, a quarter of a 16 KiB ring, never fill the server's
// transmit ring: it grows for a ring's worth written within a second
// (1.26 sends a round trip when it stayed at 64 KiB, 1.14 at 256 KiB).
func TestGroupStreamRetain(t *testing.T) {
	sends := map[bool]float64{}
	for _, retain := range []bool{false, true} {
		cfg, _ := Config{}.withDefaults()
		gc := groupConfig(cfg, 128, true)
		if retain {
			gc.Features = wire.FeatureRetain
		}
		a, b, pa, _ := groupPipeMuxes(t, gc, gc, groupBase(4))
		x, y := groupConnPair(t, Config{}, a, b)
		go func() {
			req, answer := make([]byte, 28), make([]byte, 4096+16)
			for {
				if _, err := io.ReadFull(y, req); err != nil {
					return
				}
				answer[0] = req[0]
				if _, err := y.Write(answer); err != nil {
					return
				}
			}
		}()
		req, answer := make([]byte, 28), make([]byte, 4096+16)
		ask := func(n int) {
			for i := range n {
				req[0] = byte(i)
				if _, err := x.Write(req); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(x, answer); err != nil {
					t.Fatal(err)
				}
				if answer[0] != byte(i) {
					t.Fatalf("answer %d to request %d", answer[0], byte(i))
				}
			}
		}
		ask(100) // the rings grow
		before := pa.Stats().Posted
		const requests = 400
		ask(requests)
		sends[retain] = float64(pa.Stats().Posted-before) / requests
		if ring, most := y.Info().Window.SendRing, uint64(cfg.SendBuffer); retain && ring != most {
			// A ring's worth of answers within a second grows it, though
			// none fills it: the client credits every quarter of it.
			t.Errorf("the server's transmit ring is %d bytes after %d answers of 4 KiB, want its largest, %d", ring, 100+requests, most)
		}
		x.Close()
		y.Close()
		a.Close()
		b.Close()
	}
	t.Logf("the client's sends a round trip: %.2f without Retain, %.2f with it", sends[false], sends[true])
	if sends[true] > 1.2 {
		t.Errorf("with Retain agreed the client made %.2f sends a round trip, want at most 1.2 (a Credit every quarter of the server's grown transmit ring)", sends[true])
	}
}

// TestGroupsView: Groups lists a live group with its links and streams,
// the handler's groups view serves it, and a group that ended drops out.
func TestGroupsView(t *testing.T) {
	goroutineCheck(t)
	cfg, _ := Config{}.withDefaults()
	a, b := groupMuxes(t, groupStreamConfig(cfg), groupBase(8))
	before := ReadMetrics()
	registerGroup(a, sideDialed, 0x1234, 0x5678)
	if m := ReadMetrics(); m.Groups[sideDialed] != before.Groups[sideDialed]+1 || m.GroupsOpen != before.GroupsOpen+1 {
		t.Errorf("metrics: groups %v, %d open; before %v, %d open", m.Groups, m.GroupsOpen, before.Groups, before.GroupsOpen)
	}
	x, y := groupConnPair(t, Config{}, a, b)
	local, _ := a.Base().Addrs()
	find := func() (GroupInfo, bool) {
		for _, g := range Groups() {
			if len(g.Links) > 0 && g.Links[0].Local == local.String() {
				return g, true
			}
		}
		return GroupInfo{}, false
	}
	g, ok := find()
	if !ok || g.Side != sideDialed || g.Streams != 1 || g.Opened != 1 || g.ID != "0000000000001234" || g.PeerProcess != "0000000000005678" ||
		len(g.Links) != 1 || g.Links[0].Streams != 1 || g.Links[0].Pool == 0 || g.Links[0].Granted == 0 {
		t.Errorf("group %+v (listed %v)", g, ok)
	}
	rec := httptest.NewRecorder()
	ConnsHandler().ServeHTTP(rec, httptest.NewRequest("GET", ConnsPath+"?view=groups", nil))
	var served []GroupInfo
	// The streams' engines post as they start (their rings, credit), so
	// only what does not move is compared.
	same := func(x GroupInfo) bool {
		return len(x.Links) == 1 && x.Links[0].Local == g.Links[0].Local && x.Links[0].Remote == g.Links[0].Remote &&
			x.Side == g.Side && x.Streams == g.Streams && x.Opened == g.Opened && x.ID == g.ID
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &served); err != nil || !slices.ContainsFunc(served, same) {
		t.Errorf("groups view %s: %v; want it to hold %+v", rec.Body, err, g)
	}
	closeAndWait(t, x)
	closeAndWait(t, y)
	a.Close()
	if _, ok := find(); ok {
		t.Error("a closed group is still listed")
	}
}

// TestGroupOpenWaitsForBacklog: a stream the listener's full accept queue
// refuses is asked for again, and opens once Accept made room; with no
// Accept, the refusal is the error once the waits are spent, and a dial
// whose context ends while it waits ends with the context's error.
func TestGroupOpenWaitsForBacklog(t *testing.T) {
	cfg, _ := Config{}.withDefaults()
	gc := groupStreamConfig(cfg)
	gc.Backlog = 1
	a, b := groupMuxes(t, gc, groupBase(4))
	ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
	defer cancel()
	first, err := openStream(ctx, a, 7) // fills the queue
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	saved := backlogBackoff
	t.Cleanup(func() { backlogBackoff = saved })
	backlogBackoff = []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond}

	var refused *group.RefusedError
	if _, err := openStream(ctx, a, 7); !errors.As(err, &refused) || refused.Reason != wire.ReasonBacklog {
		t.Fatalf("open with the queue full and nobody accepting: %v, want refused for the backlog", err)
	}
	refusedBefore := b.Stats().Refused
	if refusedBefore < uint64(len(backlogBackoff)+1) {
		t.Errorf("the listener refused %d opens, want one and each asked again (%d)", refusedBefore, len(backlogBackoff)+1)
	}

	go func() {
		time.Sleep(25 * time.Millisecond)
		if s, err := b.Accept(ctx); err != nil {
			t.Error(err)
		} else {
			defer s.Close()
		}
	}()
	second, err := openStream(ctx, a, 7)
	if err != nil {
		t.Fatalf("open once Accept made room: %v", err)
	}
	defer second.Close()

	short, cancelShort := context.WithTimeout(ctx, 15*time.Millisecond)
	defer cancelShort()
	if _, err := openStream(short, a, 7); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("open whose context ends while it waits: %v, want the context's error", err)
	}
}
