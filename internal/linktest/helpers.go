package linktest

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

// Helpers for link tests, the suite's and an implementation's own.

// CheckGoroutines fails t if, once t's later cleanups ran, more goroutines
// run than before; it waits for them to end (a timer's function may still
// be returning), up to HangGuard.
func CheckGoroutines(t testing.TB) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(HangGuard)
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

// PollAll takes every completion queued now.
func PollAll(t testing.TB, l link.Link) []link.Completion {
	t.Helper()
	var all []link.Completion
	cs := make([]link.Completion, 3) // small, so that Poll is called more than once
	for {
		n, err := l.Poll(cs)
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if n == 0 {
			return all
		}
		all = append(all, cs[:n]...)
	}
}

// WaitFor takes n completions, sleeping in Wait between them as the engine
// does (arm, poll once more, wait). A Wait that returns link.ErrWoken
// with no Wake of WaitFor's own (its hang guard's) is a reason to poll
// again: a link whose end wakes Wait (Options.EndWakes).
func WaitFor(t testing.TB, l link.Link, n int) []link.Completion {
	t.Helper()
	var hung atomic.Bool
	guard := time.AfterFunc(HangGuard, func() {
		hung.Store(true)
		l.Wake()
	})
	defer guard.Stop()
	var all []link.Completion
	cs := make([]link.Completion, n)
	for len(all) < n {
		k, err := l.Poll(cs[:n-len(all)])
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if k > 0 {
			all = append(all, cs[:k]...)
			continue
		}
		if err := l.Arm(); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		if k, err = l.Poll(cs[:n-len(all)]); err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if k > 0 {
			all = append(all, cs[:k]...)
			continue
		}
		if err := l.Wait(); err != nil && (err != link.ErrWoken || hung.Load()) {
			t.Fatalf("Wait, with %d of %d completions (%v): %v", len(all), n, Kinds(all), err)
		}
	}
	return all
}

// WaitEnd takes completions until the link's last one (Disconnected or
// Failed), reposting receives as messages consume them, and returns them
// all.
func WaitEnd(t testing.TB, l link.Link) []link.Completion {
	t.Helper()
	var all []link.Completion
	for {
		c := WaitFor(t, l, 1)[0]
		all = append(all, c)
		switch c.Kind {
		case link.Disconnected, link.Failed:
			if more := PollAll(t, l); len(more) > 0 {
				t.Fatalf("completions after the last one: %v", Kinds(more))
			}
			return all
		case link.DataArrived, link.ControlArrived:
			if err := l.PostRecv(1); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Kinds summarizes completions: "send-done 1", "data-arrived 100",
// "control-arrived", "disconnected", "failed".
func Kinds(cs []link.Completion) []string {
	var s []string
	for _, c := range cs {
		switch c.Kind {
		case link.SendDone:
			s = append(s, fmt.Sprintf("%v %d", c.Kind, c.ID))
		case link.DataArrived:
			s = append(s, fmt.Sprintf("%v %d", c.Kind, c.N))
		default:
			s = append(s, c.Kind.String())
		}
	}
	return s
}

// WantKinds fails t unless got are want (Kinds), in order.
func WantKinds(t testing.TB, who string, got []link.Completion, want ...string) {
	t.Helper()
	g := Kinds(got)
	if fmt.Sprint(g) != fmt.Sprint(want) {
		t.Errorf("%s's completions: %q, want %q", who, g, want)
	}
}

// CheckEnd checks that cs are first (in order), then any of maybe (each at
// most once, in any order), then Disconnected.
func CheckEnd(t testing.TB, who string, cs []link.Completion, first []string, maybe ...string) {
	t.Helper()
	CheckEndWith(t, who, cs, "disconnected", first, maybe...)
}

// CheckEndWith is CheckEnd with another last completion (as Kinds names it).
func CheckEndWith(t testing.TB, who string, cs []link.Completion, last string, first []string, maybe ...string) {
	t.Helper()
	g := Kinds(cs)
	bad := func() {
		t.Errorf("%s's completions %q: want %q, then any of %q, then %s", who, g, first, maybe, last)
	}
	if len(g) < len(first)+1 || fmt.Sprint(g[:len(first)]) != fmt.Sprint(first) || g[len(g)-1] != last {
		bad()
		return
	}
	left := append([]string(nil), maybe...)
next:
	for _, k := range g[len(first) : len(g)-1] {
		for i, m := range left {
			if k == m {
				left = append(left[:i], left[i+1:]...)
				continue next
			}
		}
		bad()
		return
	}
}

// RefusedEnd checks the completions of a link whose peer refused one of
// its requests, or that refused one of its peer's, under
// Options.RefusalEnds: first (in order), then any of maybe, then
// Disconnected or a Failed that matches cause and not link.ErrDown.
func RefusedEnd(t testing.TB, who string, cs []link.Completion, cause error, first []string, maybe ...string) {
	t.Helper()
	if len(cs) == 0 {
		t.Errorf("%s: no completions", who)
		return
	}
	end := cs[len(cs)-1]
	CheckEndWith(t, who, cs, end.Kind.String(), first, maybe...)
	switch {
	case end.Kind == link.Disconnected:
	case end.Kind != link.Failed:
		t.Errorf("%s ended with %v, want disconnected or failed", who, end.Kind)
	case !errors.Is(end.Err, cause) || errors.Is(end.Err, link.ErrDown):
		t.Errorf("%s failed with %v, want an error matching %v and not link.ErrDown", who, end.Err, cause)
	}
}

// RefusedEndAtSender is RefusedEnd at the end whose request was refused,
// which may also fail with link.ErrDown (Options.RefusalEnds: on iWARP,
// the peer's TERMINATE may put its queue pair in error before the request
// completes).
func RefusedEndAtSender(t testing.TB, who string, cs []link.Completion, cause error, first []string, maybe ...string) {
	t.Helper()
	if len(cs) > 0 {
		if end := cs[len(cs)-1]; end.Kind == link.Failed && errors.Is(end.Err, link.ErrDown) {
			CheckEndWith(t, who, cs, end.Kind.String(), first, maybe...)
			t.Logf("%s ended with %v: its queue pair failed before the refusal came", who, end.Err)
			return
		}
	}
	RefusedEnd(t, who, cs, cause, first, maybe...)
}

// Data returns a SendData request writing SendRing[off:off+n] at offset
// remote of the peer's ring.
func Data(peer link.Link, off, n, remote uint32, signaled bool, id uint64) link.SendWR {
	addr, rkey := peer.RecvRingKey()
	return link.SendWR{Kind: link.SendData, Signaled: signaled, ID: id, Off: off, N: n, Remote: addr + uint64(remote), RKey: rkey}
}

// Control returns a control request whose message counts up from b, but
// for bytes 4-7, which no message uses and a link that carries streams
// keeps for their names (link.Carrier).
func Control(id uint64, b byte) link.SendWR {
	wr := link.SendWR{Kind: link.SendControl, Signaled: true, ID: id}
	for i := range wr.Msg {
		if i < 4 || i >= 8 {
			wr.Msg[i] = b + byte(i)
		}
	}
	return wr
}

// Marker returns a signaled marker at the start of the peer's ring.
func Marker(peer link.Link, id uint64) link.SendWR {
	addr, rkey := peer.RecvRingKey()
	return link.SendWR{Kind: link.SendMarker, Signaled: true, ID: id, Remote: addr, RKey: rkey}
}

// Post posts wrs, failing t if PostSend fails.
func Post(t testing.TB, l link.Link, wrs ...link.SendWR) {
	t.Helper()
	if err := l.PostSend(wrs); err != nil {
		t.Fatalf("PostSend: %v", err)
	}
}

// Fill fills b with a pattern that starts at seed.
func Fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}
