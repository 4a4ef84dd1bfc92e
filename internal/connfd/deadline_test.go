package connfd

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestDeadline(t *testing.T) {
	var woken atomic.Int32
	var d Deadline
	d.Init(func() { woken.Add(1) })
	if d.Passed() {
		t.Fatal("no deadline, yet expired")
	}
	d.Set(time.Now().Add(-time.Second))
	if !d.Passed() || woken.Load() != 1 {
		t.Fatalf("past deadline: passed %v, woken %d times", d.Passed(), woken.Load())
	}
	d.Set(time.Time{})
	if d.Passed() {
		t.Fatal("cleared deadline still expired")
	}
	// An hour, so that no stall of a loaded machine can make it pass; then
	// moved close, on the same channel.
	d.Set(time.Now().Add(time.Hour))
	ch := d.Expired()
	if d.Passed() {
		t.Fatal("future deadline expired early")
	}
	d.Set(time.Now().Add(20 * time.Millisecond))
	if d.Expired() != ch {
		t.Fatal("moving a pending deadline gave a new channel; its waiters would miss it")
	}
	select {
	case <-ch:
	case <-time.After(time.Minute): // a hang guard
		t.Fatal("deadline never fired")
	}
	for end := time.Now().Add(time.Minute); woken.Load() != 2 && time.Now().Before(end); {
		time.Sleep(time.Millisecond) // wake runs after the channel closes
	}
	if woken.Load() != 2 {
		t.Errorf("the timer's deadline woke %d times in all, want 2", woken.Load())
	}
	// Moving an expired deadline into the future gives a fresh channel.
	d.Set(time.Now().Add(time.Hour))
	if d.Passed() {
		t.Fatal("extended deadline still expired")
	}
	// A waiter on the old channel is woken when the deadline moves into the past.
	ch = d.Expired()
	d.Set(time.Now().Add(-time.Millisecond))
	select {
	case <-ch:
	default:
		t.Fatal("moving the deadline into the past did not wake a waiter")
	}
}
