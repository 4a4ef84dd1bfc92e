package group_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
)

// armCounter is a pipe end that counts its Arms.
type armCounter struct {
	*link.Pipe
	arms atomic.Int64
}

func (p *armCounter) Arm() error {
	p.arms.Add(1)
	return p.Pipe.Arm()
}

// TestSpinLeavesLinkUnarmed: while a stream's poller spins (Spin), the
// group's goroutine does not arm the link again after the completion that
// woke it: the messages that come meanwhile are the spinner's to take, and
// cost no wake-up. The last spinner to stop arms the link, and a message
// after it wakes the goroutine, which hands it to the stream.
func TestSpinLeavesLinkUnarmed(t *testing.T) {
	pa, pb := linktest.NewPipes(t, baseConfig(), baseConfig())
	counted := &armCounter{Pipe: pa}
	a, err := group.New(counted, group.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, err := group.New(pb, group.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	sa, sb := openPair(t, a, b)
	notified := make(chan struct{}, 16)
	sa.SetNotify(func() { notified <- struct{}{} })
	// settled waits until the goroutine's arms stop changing.
	settled := func() int64 {
		t.Helper()
		last := counted.arms.Load()
		for end := time.Now().Add(linktest.HangGuard); ; {
			time.Sleep(20 * time.Millisecond)
			n := counted.arms.Load()
			if n == last {
				return n
			}
			if time.Now().After(end) {
				t.Fatal("the link is armed again and again")
			}
			last = n
		}
	}
	send := func(id uint64) {
		t.Helper()
		linktest.Post(t, sb, linktest.Control(id, byte(id)))
		linktest.WaitFor(t, sb, 1) // its SendDone
	}
	take := func(what string) {
		t.Helper()
		linktest.WantKinds(t, what, linktest.WaitFor(t, sa, 1), "control-arrived")
		if err := sa.PostRecv(1); err != nil {
			t.Fatal(err)
		}
	}
	settled()
	sa.Spin(true)
	send(1) // wakes the goroutine, which was armed before the spin
	take("the first message while spinning")
	before := settled()
	for id := uint64(2); id < 6; id++ {
		send(id)
		take("a message while spinning")
	}
	if n := settled(); n != before {
		t.Errorf("the link was armed %d times for 4 messages while a stream spun, want 0", n-before)
	}
	sa.Spin(false)
	if n := settled(); n != before+1 {
		t.Errorf("the link was armed %d times as the spinner stopped, want once", n-before)
	}
	// Nobody polls now, and the stream is armed, as its poller arms it
	// before it sleeps: the goroutine takes the next message and tells
	// the stream.
	for len(notified) > 0 {
		<-notified
	}
	if err := sa.Arm(); err != nil {
		t.Fatal(err)
	}
	send(6)
	select {
	case <-notified:
	case <-time.After(linktest.HangGuard):
		t.Fatal("a message after the spin was not handed to the stream")
	}
	take("the message after the spin")
}
