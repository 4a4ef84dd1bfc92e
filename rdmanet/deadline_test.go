package rdmanet

import (
	"testing"
	"time"

	"github.com/rdmanet/sdk/verbs"
)

func TestDeadline(t *testing.T) {
	d := newDeadline()
	if isClosed(d.expired()) {
		t.Fatal("no deadline, yet expired")
	}
	d.set(time.Now().Add(-time.Second))
	if !isClosed(d.expired()) {
		t.Fatal("past deadline not expired")
	}
	d.set(time.Time{})
	if isClosed(d.expired()) {
		t.Fatal("cleared deadline still expired")
	}
	// An hour, so that no stall of a loaded machine can make it pass; then
	// moved close, on the same channel.
	d.set(time.Now().Add(time.Hour))
	ch := d.expired()
	if isClosed(ch) {
		t.Fatal("future deadline expired early")
	}
	d.set(time.Now().Add(20 * time.Millisecond))
	if d.expired() != ch {
		t.Fatal("moving a pending deadline gave a new channel; its waiters would miss it")
	}
	select {
	case <-ch:
	case <-time.After(time.Minute): // a hang guard
		t.Fatal("deadline never fired")
	}
	// Moving an expired deadline into the future gives a fresh channel.
	d.set(time.Now().Add(time.Hour))
	if isClosed(d.expired()) {
		t.Fatal("extended deadline still expired")
	}
	// A waiter on the old channel is woken when the deadline moves into the past.
	ch = d.expired()
	d.set(time.Now().Add(-time.Millisecond))
	if !isClosed(ch) {
		t.Fatal("moving the deadline into the past did not wake a waiter")
	}
}

// TestNotSupportedIsOneError: a build without RDMA reports one sentinel,
// whichever package the caller matches it with.
func TestNotSupportedIsOneError(t *testing.T) {
	if ErrNotSupported != verbs.ErrNotSupported {
		t.Fatal("rdmanet.ErrNotSupported is not verbs.ErrNotSupported")
	}
}
