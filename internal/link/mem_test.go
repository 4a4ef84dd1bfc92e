package link

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestMemRegisterAsync: a registration made in the background is started
// once, answered ErrMemRegistering until it is made (and then nil), waited
// for by Register, and made without the memory's lock: requests that send
// from the memory (Hold, Done) go on meanwhile.
func TestMemRegisterAsync(t *testing.T) {
	m := NewMem(make([]byte, 64), nil)
	release := make(chan struct{})
	var regs, starts, drops atomic.Int32
	reg := func() (func(), error) {
		regs.Add(1)
		<-release
		// A slow drop: Close must not return before it ends.
		return func() { time.Sleep(10 * time.Millisecond); drops.Add(1) }, nil
	}
	start := func(run func()) {
		starts.Add(1)
		go run()
	}
	domain := "device"
	for range 3 {
		if err := m.RegisterAsync(domain, reg, start); err != ErrMemRegistering {
			t.Fatalf("RegisterAsync while it is made: %v, want ErrMemRegistering", err)
		}
	}
	waited := make(chan error, 1)
	go func() { waited <- m.Register(domain, reg) }()
	m.Hold()
	m.Done()
	select {
	case err := <-waited:
		t.Fatalf("Register returned %v before the registration was made", err)
	case <-time.After(10 * time.Millisecond):
	}
	close(release)
	if err := <-waited; err != nil {
		t.Fatalf("Register that waited: %v", err)
	}
	if err := m.RegisterAsync(domain, reg, start); err != nil {
		t.Fatalf("RegisterAsync once made: %v", err)
	}
	if regs.Load() != 1 || starts.Load() != 1 {
		t.Fatalf("made %d times, started %d times; want once", regs.Load(), starts.Load())
	}
	m.Close()
	if drops.Load() != 1 {
		t.Fatalf("dropped %d times at Close, want once", drops.Load())
	}
	if err := m.RegisterAsync(domain, reg, start); !errors.Is(err, ErrMemClosed) {
		t.Fatalf("RegisterAsync after Close: %v, want ErrMemClosed", err)
	}
}

// TestMemRegisterRefused: a refused registration is the answer from then
// on in its domain, not tried again; another domain tries its own.
func TestMemRegisterRefused(t *testing.T) {
	m := NewMem(make([]byte, 64), nil)
	refused := errors.New("pinned-memory limit")
	var regs atomic.Int32
	reg := func() (func(), error) { regs.Add(1); return nil, refused }
	inline := func(run func()) { run() }
	for range 3 {
		if err := m.RegisterAsync("a", reg, inline); err != refused {
			t.Fatalf("RegisterAsync: %v, want the refusal", err)
		}
	}
	if err := m.Register("b", reg); err != refused {
		t.Fatalf("Register in another domain: %v, want the refusal", err)
	}
	if regs.Load() != 2 {
		t.Fatalf("tried %d times, want once a domain", regs.Load())
	}
	m.Close()
}

// TestMemCloseWhileRegistering: Close waits for a registration being made
// (the memory must stay mapped under it) and drops it once made.
func TestMemCloseWhileRegistering(t *testing.T) {
	m := NewMem(make([]byte, 64), nil)
	release := make(chan struct{})
	var drops atomic.Int32
	reg := func() (func(), error) {
		<-release
		// A slow drop: Close must not return before it ends.
		return func() { time.Sleep(10 * time.Millisecond); drops.Add(1) }, nil
	}
	if err := m.RegisterAsync("device", reg, func(run func()) { go run() }); err != ErrMemRegistering {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		m.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while the registration was being made")
	case <-time.After(10 * time.Millisecond):
	}
	close(release)
	<-closed
	if drops.Load() != 1 {
		t.Fatalf("the registration made during Close was dropped %d times, want once", drops.Load())
	}
}
