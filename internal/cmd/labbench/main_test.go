package main

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
)

// pipeDialer makes net.Pipe pairs (which honour deadlines).
var pipeDialer = dialer{how: "net.Pipe", pair: func(context.Context) (net.Conn, net.Conn, error) {
	c, s := net.Pipe()
	return c, s, nil
}}

func TestInProcess(t *testing.T) {
	b := newBench(noEnv, options{scale: 1, rounds: 1, timeout: 10 * time.Second}, io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := b.goPingPong(ctx, pipeDialer, 64, 50)
	if !f.ok() || !f.hasPct || f.p50 <= 0 || f.p99 < f.p50 || f.how != "net.Pipe" {
		t.Errorf("ping-pong over a pipe: %+v", f)
	}
	f = b.goStream(ctx, pipeDialer, 4096, 1<<20)
	if !f.ok() || f.mbps <= 0 {
		t.Errorf("stream over a pipe: %+v", f)
	}

	failing := dialer{how: "nothing", pair: func(context.Context) (net.Conn, net.Conn, error) {
		return nil, nil, errors.New("no route")
	}}
	if f := b.goStream(ctx, failing, 64, 100); f.ok() || !strings.Contains(f.missing, "connecting: no route") {
		t.Errorf("failed connection: %+v", f)
	}
}

// A measurement that stalls ends with the connections' deadlines and is
// reported with the error.
func TestInProcessDeadline(t *testing.T) {
	b := newBench(noEnv, options{scale: 1, rounds: 1}, io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	f := b.inProcess(ctx, pipeDialer, func(client, server net.Conn) (figure, error) {
		_, err := benchkit.Stream(io.Discard, server, 64, 100) // nobody writes
		return figure{}, err
	})
	if f.ok() || !strings.Contains(f.missing, "i/o timeout") {
		t.Errorf("stalled stream: %+v", f)
	}
}

// A measurement that ignores its deadlines is reported as hung, with the
// goroutines involved.
func TestInProcessHung(t *testing.T) {
	defer func(g time.Duration) { hangGrace = g }(hangGrace)
	hangGrace = 100 * time.Millisecond
	b := newBench(noEnv, options{scale: 1, rounds: 1, timeout: 100 * time.Millisecond}, io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	stuck := make(chan struct{})
	defer close(stuck)
	f := b.inProcess(ctx, pipeDialer, func(client, server net.Conn) (figure, error) {
		<-stuck
		return figure{}, nil
	})
	if f.ok() || !strings.HasPrefix(f.missing, "HUNG") || !strings.Contains(f.raw, "goroutine") || b.hungGo != 1 {
		t.Errorf("hung measurement: %+v", f)
	}
}

// noEnv is an empty lab description: these tests need no lab (and do not
// import labenv, which would make scripts/lab-test run them in the lab).
var noEnv = (&bench{}).env

func TestRunOutsideLab(t *testing.T) {
	t.Setenv("RDMANET_LAB", "")
	var out, errs strings.Builder
	if got := run(nil, &out, &errs); got != 2 || out.Len() != 0 || !strings.Contains(errs.String(), "not in the rdmanet lab") {
		t.Errorf("run outside the lab: status %d, stdout %q, stderr %q", got, out.String(), errs.String())
	}
	errs.Reset()
	if got := run([]string{"-rounds", "0"}, &out, &errs); got != 2 || !strings.Contains(errs.String(), "usage:") {
		t.Errorf("-rounds 0: status %d, stderr %q", got, errs.String())
	}
}

// When the budget cuts the rounds short, issue 26's target rows and their
// references make the rounds asked for all the same, and no other figure
// does; the ids they are known by are newBench's.
func TestRunAllTargetRounds(t *testing.T) {
	slow := func(ctx context.Context, size int, total int64) figure {
		time.Sleep(50 * time.Millisecond)
		return figure{mbps: 1}
	}
	ping := func(ctx context.Context, size, n int) figure { return figure{p50: 1, hasPct: true} }
	b := newBench(noEnv, options{scale: 1, rounds: 3, timeout: time.Second, budget: 300 * time.Millisecond}, io.Discard)
	for _, id := range []string{zeroCopyID, perftestID, busyPollID} {
		if !slices.ContainsFunc(b.impls, func(im impl) bool { return im.id == id }) {
			t.Errorf("no implementation %q among newBench's", id)
		}
	}
	b.impls = []impl{{id: "fake", stream: slow, pingpong: ping}, {id: zeroCopyID, stream: slow},
		{id: perftestID, stream: slow, pingpong: ping}, {id: busyPollID, stream: slow, pingpong: ping}}
	b.withGroups = false
	b.runAll()
	if b.done != 1 || b.targetRounds != 3 {
		t.Fatalf("%d rounds and %d of the target rows, want 1 and 3", b.done, b.targetRounds)
	}
	for k, fs := range b.res {
		if want := map[bool]int{false: 1, true: 3}[issue26Target(k)]; len(fs) != want {
			t.Errorf("%v: %d rounds, want %d", k, len(fs), want)
		}
	}
	for _, k := range []key{{zeroCopyID, stream, 64 << 10}, {perftestID, stream, 64 << 10}, {busyPollID, pingpong, 64}, {perftestID, pingpong, 64}} {
		if !issue26Target(k) || len(b.res[k]) != 3 {
			t.Errorf("%v: target %v, %d rounds; want a target with 3", k, issue26Target(k), len(b.res[k]))
		}
	}
}

// runAll makes whole rounds: one that would end after the budget is not
// started, so every figure has as many rounds.
func TestRunAllRounds(t *testing.T) {
	fake := impl{id: "fake", label: "fake", stream: func(ctx context.Context, size int, total int64) figure {
		time.Sleep(50 * time.Millisecond)
		return figure{mbps: 1}
	}}
	for _, c := range []struct {
		budget time.Duration
		want   int
	}{{10 * time.Second, 3}, {300 * time.Millisecond, 1}} {
		b := newBench(noEnv, options{scale: 1, rounds: 3, timeout: time.Second, budget: c.budget}, io.Discard)
		b.impls = []impl{fake}
		b.withGroups = false // its reserve is TestRunAllKeepsGroupsTime's
		b.runAll()
		if b.done != c.want {
			t.Errorf("budget %v: %d rounds, want %d", c.budget, b.done, c.want)
		}
		for _, size := range benchkit.StreamSizes {
			if got := len(b.res[key{"fake", stream, size}]); got != c.want {
				t.Errorf("budget %v: %d rounds of size %d, want %d", c.budget, got, size, c.want)
			}
		}
	}
}
