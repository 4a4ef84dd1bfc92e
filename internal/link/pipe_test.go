package link

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"
)

// hangGuard bounds every wait in these tests. It only turns a hang into a
// failure: no test compares how long something took against an upper bound.
const hangGuard = 10 * time.Second

func testConfig() PipeConfig {
	return PipeConfig{
		SendRing: 4096, RecvRing: 4096,
		SendDepth: 8, RecvDepth: 4, ControlDepth: 2,
		RNRRetry: 7,
	}
}

// newTestPipe returns a connected pair that is closed when the test ends,
// after which the test fails if goroutines outlive it.
func newTestPipe(t *testing.T, a, b PipeConfig) (*Pipe, *Pipe) {
	t.Helper()
	checkGoroutines(t)
	ea, eb := NewPipe(a, b)
	t.Cleanup(func() {
		ea.Close()
		eb.Close()
	})
	return ea, eb
}

// checkGoroutines fails t if, once t's later cleanups ran, more goroutines
// run than before; it waits for them to end (a timer's function may still be
// returning), up to hangGuard.
func checkGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(hangGuard)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("%d goroutines before the test, %d after:\n%s",
					before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// pollAll takes every completion queued now.
func pollAll(t *testing.T, e *Pipe) []Completion {
	t.Helper()
	var all []Completion
	cs := make([]Completion, 3) // small, so that Poll is called more than once
	for {
		n, err := e.Poll(cs)
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if n == 0 {
			return all
		}
		all = append(all, cs[:n]...)
	}
}

// waitFor takes n completions, sleeping in Wait between them as the engine
// does (arm, poll once more, wait).
func waitFor(t *testing.T, e *Pipe, n int) []Completion {
	t.Helper()
	guard := time.AfterFunc(hangGuard, e.Wake)
	defer guard.Stop()
	var all []Completion
	cs := make([]Completion, n)
	for len(all) < n {
		k, err := e.Poll(cs[:n-len(all)])
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if k > 0 {
			all = append(all, cs[:k]...)
			continue
		}
		if err := e.Arm(); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		if k, err = e.Poll(cs[:n-len(all)]); err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if k > 0 {
			all = append(all, cs[:k]...)
			continue
		}
		if err := e.Wait(); err != nil {
			t.Fatalf("Wait, with %d of %d completions (%v): %v", len(all), n, kinds(all), err)
		}
	}
	return all
}

// kinds summarizes completions for messages and comparisons: "send-done 1",
// "data-arrived 100", "control-arrived", "disconnected", "failed".
func kinds(cs []Completion) []string {
	var s []string
	for _, c := range cs {
		switch c.Kind {
		case SendDone:
			s = append(s, fmt.Sprintf("%v %d", c.Kind, c.ID))
		case DataArrived:
			s = append(s, fmt.Sprintf("%v %d", c.Kind, c.N))
		default:
			s = append(s, c.Kind.String())
		}
	}
	return s
}

func wantKinds(t *testing.T, who string, got []Completion, want ...string) {
	t.Helper()
	g := kinds(got)
	if fmt.Sprint(g) != fmt.Sprint(want) {
		t.Errorf("%s's completions: %q, want %q", who, g, want)
	}
}

// data returns a SendData request writing SendRing[off:off+n] at offset
// remote of the peer's ring.
func data(peer *Pipe, off, n, remote uint32, signaled bool, id uint64) SendWR {
	addr, rkey := peer.RecvRingKey()
	return SendWR{Kind: SendData, Signaled: signaled, ID: id, Off: off, N: n, Remote: addr + uint64(remote), RKey: rkey}
}

func control(id uint64, b byte) SendWR {
	wr := SendWR{Kind: SendControl, Signaled: true, ID: id}
	for i := range wr.Msg {
		wr.Msg[i] = b
	}
	return wr
}

func marker(peer *Pipe, id uint64) SendWR {
	addr, rkey := peer.RecvRingKey()
	return SendWR{Kind: SendMarker, Signaled: true, ID: id, Remote: addr, RKey: rkey}
}

func post(t *testing.T, e *Pipe, wrs ...SendWR) {
	t.Helper()
	if err := e.PostSend(wrs); err != nil {
		t.Fatalf("PostSend: %v", err)
	}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func TestPipeCaps(t *testing.T) {
	ac := testConfig()
	bc := PipeConfig{SendRing: 100, RecvRing: 200, SendDepth: 3, RecvDepth: 5, ControlDepth: 1}
	a, b := newTestPipe(t, ac, bc)
	want := Caps{SendDepth: 3, RecvDepth: 5, ControlDepth: 1, Name: "memory", Transport: "memory"}
	if got := b.Caps(); got != want {
		t.Errorf("Caps: %+v, want %+v", got, want)
	}
	if len(b.SendRing()) != 100 || len(b.RecvRing()) != 200 {
		t.Errorf("rings: %d and %d bytes, want 100 and 200", len(b.SendRing()), len(b.RecvRing()))
	}
	al, ar := a.Addrs()
	bl, br := b.Addrs()
	if al == bl || ar != bl || br != al || !al.Addr().IsLoopback() || !bl.Addr().IsLoopback() {
		t.Errorf("addresses: a %v->%v, b %v->%v", al, ar, bl, br)
	}
	aa, _ := a.RecvRingKey()
	ba, _ := b.RecvRingKey()
	if aa == ba || aa < ringBase || ba < ringBase {
		t.Errorf("ring addresses %#x and %#x", aa, ba)
	}
	if got := b.Stats().RecvPosted; got != 5 {
		t.Errorf("b has %d receives posted at the start, want 5", got)
	}
}

func TestPipeDataLandsInOrder(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	fill(a.SendRing(), 1)
	post(t, a,
		data(b, 0, 100, 1000, false, 1),
		data(b, 100, 50, 0, true, 2),
		data(b, 200, 0, 4096, false, 3), // zero bytes, at the ring's end
		data(b, 300, 30, 4066, true, 4),
	)
	wantKinds(t, "b", waitFor(t, b, 4), "data-arrived 100", "data-arrived 50", "data-arrived 0", "data-arrived 30")
	wantKinds(t, "a", waitFor(t, a, 2), "send-done 2", "send-done 4")
	s, r := a.SendRing(), b.RecvRing()
	if !bytes.Equal(r[1000:1100], s[0:100]) || !bytes.Equal(r[0:50], s[100:150]) || !bytes.Equal(r[4066:], s[300:330]) {
		t.Error("data landed at the wrong offsets")
	}
	if !bytes.Equal(r[50:1000], make([]byte, 950)) {
		t.Error("bytes outside the writes changed")
	}
	if got := a.Stats(); got.Posted != 4 || got.BytesLanded != 180 {
		t.Errorf("a's stats: %+v, want 4 posted and 180 bytes landed", got)
	}
	if got := b.Stats().RecvPosted; got != 0 {
		t.Errorf("b has %d receives posted after 4 messages, want 0", got)
	}
	if err := b.PostRecv(4); err != nil {
		t.Fatal(err)
	}
	if got := b.Stats().RecvPosted; got != 4 {
		t.Errorf("b has %d receives posted after reposting, want 4", got)
	}
}

// Bytes are read from the send ring when the request lands, not when it is
// posted, as a device reads them.
func TestPipeDataReadAtLanding(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	b.StopReposting(true)
	if err := b.PostRecv(0); err != nil {
		t.Fatal(err)
	}
	// Use up b's receives, so that the next message waits.
	post(t, a, data(b, 0, 1, 0, false, 1), data(b, 0, 1, 0, false, 2), data(b, 0, 1, 0, false, 3), data(b, 0, 1, 0, true, 4))
	waitFor(t, a, 1)
	a.SendRing()[10] = 'x'
	post(t, a, data(b, 10, 1, 10, true, 5))
	a.SendRing()[10] = 'y'
	b.StopReposting(false)
	pollAll(t, b)
	if err := b.PostRecv(1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, a, 1)
	if got := b.RecvRing()[10]; got != 'y' {
		t.Errorf("b got %q, want 'y'", got)
	}
}

func TestPipeControlAndMarker(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	post(t, a, control(1, 0xaa), marker(b, 2))
	post(t, a, control(3, 0xbb))
	post(t, a, SendWR{Kind: SendMarker, Remote: 0, RKey: 0, N: 5}) // unsignaled: not checked below
	cs := waitFor(t, b, 2)
	wantKinds(t, "b", cs, "control-arrived", "control-arrived")
	if cs[0].Msg != control(0, 0xaa).Msg || cs[1].Msg != control(0, 0xbb).Msg {
		t.Errorf("messages %x and %x", cs[0].Msg, cs[1].Msg)
	}
	// The unsignaled marker with a bad address fails the link after the rest.
	wantKinds(t, "a", waitFor(t, a, 4), "send-done 1", "send-done 2", "send-done 3", "failed")
	if got := b.Stats().RecvPosted; got != 2 {
		t.Errorf("b has %d receives posted, want 2 (markers consume none)", got)
	}
}

func TestPipeSignaledOnly(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	post(t, a, data(b, 0, 1, 0, false, 1), marker(b, 2), data(b, 0, 1, 0, false, 3), data(b, 0, 1, 0, true, 4))
	post(t, a, SendWR{Kind: SendMarker, ID: 5, Remote: marker(b, 0).Remote, RKey: marker(b, 0).RKey})
	waitFor(t, b, 3)
	wantKinds(t, "a", waitFor(t, a, 2), "send-done 2", "send-done 4")
	if cs := pollAll(t, a); len(cs) != 0 {
		t.Errorf("a got %q for unsignaled requests", kinds(cs))
	}
}

func TestPipeMisuse(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(a, b *Pipe) error
	}{
		{"send depth", func(a, b *Pipe) error {
			var wrs []SendWR
			for range 9 {
				wrs = append(wrs, marker(b, 1))
			}
			return a.PostSend(wrs)
		}},
		{"send depth across posts", func(a, b *Pipe) error {
			for range 8 {
				if err := a.PostSend([]SendWR{marker(b, 1)}); err != nil {
					return fmt.Errorf("below the depth: %v", err)
				}
			}
			return a.PostSend([]SendWR{marker(b, 1)})
		}},
		{"control depth", func(a, b *Pipe) error {
			return a.PostSend([]SendWR{control(1, 0), control(2, 0), control(3, 0)})
		}},
		{"unsignaled control", func(a, b *Pipe) error {
			wr := control(1, 0)
			wr.Signaled = false
			return a.PostSend([]SendWR{wr})
		}},
		{"data past the send ring", func(a, b *Pipe) error {
			return a.PostSend([]SendWR{data(b, 4000, 97, 0, true, 1)})
		}},
		{"data offset overflow", func(a, b *Pipe) error {
			return a.PostSend([]SendWR{data(b, 1<<32-1, 2, 0, true, 1)})
		}},
		{"kind", func(a, b *Pipe) error {
			return a.PostSend([]SendWR{{Kind: 0, Signaled: true}})
		}},
		{"receives beyond the depth", func(a, b *Pipe) error {
			return a.PostRecv(1)
		}},
		{"negative receives", func(a, b *Pipe) error {
			return a.PostRecv(-1)
		}},
		{"withheld receives count", func(a, b *Pipe) error {
			post(t, b, data(a, 0, 1, 0, true, 1))
			waitFor(t, a, 1)
			a.StopReposting(true)
			if err := a.PostRecv(1); err != nil {
				return fmt.Errorf("below the depth: %v", err)
			}
			return a.PostRecv(1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newTestPipe(t, testConfig(), testConfig())
			err := tc.do(a, b)
			if !errors.Is(err, errMisuse) {
				t.Fatalf("got %v, want a misuse error", err)
			}
			// A rejected PostSend posted none of its requests.
			if s := a.Stats(); s.Posted != 0 && s.Posted != 8 {
				t.Errorf("%d requests posted after the error", s.Posted)
			}
		})
	}
}

// A request stays outstanding until its own SendDone, or a later signaled
// one's, is taken by Poll: not when it lands.
func TestPipeOutstanding(t *testing.T) {
	ac := testConfig()
	ac.SendDepth = 4
	bc := testConfig()
	bc.RecvDepth = 16 // enough for every message here
	a, b := newTestPipe(t, ac, bc)
	post(t, a, data(b, 0, 1, 0, false, 1), marker(b, 2), data(b, 0, 1, 0, false, 3), marker(b, 4))
	waitFor(t, b, 2)
	if err := a.PostSend([]SendWR{marker(b, 5)}); !errors.Is(err, errMisuse) {
		t.Fatalf("fifth request with 4 landed but not taken: %v, want a misuse error", err)
	}
	cs := make([]Completion, 1)
	if n, err := a.Poll(cs); n != 1 || err != nil || cs[0].ID != 2 {
		t.Fatalf("Poll: %d %v %v", n, err, cs[0])
	}
	post(t, a, marker(b, 5), marker(b, 6)) // the first two retired
	if err := a.PostSend([]SendWR{marker(b, 7)}); !errors.Is(err, errMisuse) {
		t.Fatalf("fifth request: %v, want a misuse error", err)
	}
	wantKinds(t, "a", waitFor(t, a, 3), "send-done 4", "send-done 5", "send-done 6")
	post(t, a, marker(b, 7), marker(b, 8), marker(b, 9), marker(b, 10))

	// Control requests: ControlDepth 2, retired by their own SendDone or a
	// later one's.
	wantKinds(t, "a", waitFor(t, a, 4), "send-done 7", "send-done 8", "send-done 9", "send-done 10")
	post(t, a, control(11, 0), control(12, 0))
	if err := a.PostSend([]SendWR{control(13, 0)}); !errors.Is(err, errMisuse) {
		t.Fatalf("third control: %v, want a misuse error", err)
	}
	waitFor(t, a, 2)
	post(t, a, control(13, 0), marker(b, 14))
	waitFor(t, a, 2)
	post(t, a, control(15, 0))
}

func TestPipeUseAfterClose(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for name, err := range map[string]error{
		"PostSend":   a.PostSend([]SendWR{marker(b, 1)}),
		"PostRecv":   a.PostRecv(0),
		"Poll":       func() error { _, err := a.Poll(make([]Completion, 1)); return err }(),
		"Arm":        a.Arm(),
		"Wait":       a.Wait(),
		"Disconnect": a.Disconnect(),
	} {
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s after Close: %v, want net.ErrClosed", name, err)
		}
	}
	// The faults and Stats still work.
	a.Wake()
	a.SetDelay(time.Second)
	a.StopReposting(true)
	a.FailNext(nil)
	a.Silence()
	a.Cut(nil)
	a.Stats()
}
