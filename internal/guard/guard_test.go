package guard

import (
	"errors"
	"testing"
	"time"
)

func TestCloseOnceAndRetryAfterFailure(t *testing.T) {
	var g Guard
	calls := 0
	busy := errors.New("busy")
	if err := g.Close(func() error { calls++; return busy }); err != busy {
		t.Fatalf("Close = %v, want the destroy error", err)
	}
	if !g.Use() {
		t.Fatal("a failed Close must leave the object open")
	}
	g.Done()
	for i := 0; i < 2; i++ {
		if err := g.Close(func() error { calls++; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 2 {
		t.Fatalf("destroy ran %d times, want 2 (one failure, one success)", calls)
	}
	if g.Use() {
		t.Fatal("Use after Close succeeded")
	}
}

func TestCloseWaitsForOperations(t *testing.T) {
	var g Guard
	if !g.Use() {
		t.Fatal("Use on a new guard failed")
	}
	closed := make(chan struct{})
	go func() {
		g.Close(func() error { return nil })
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close finished while an operation was in progress")
	case <-time.After(50 * time.Millisecond):
	}
	g.Done()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not finish after the operation ended")
	}
}
