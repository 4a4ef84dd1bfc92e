package connfd

import (
	"sync"
	"testing"
	"time"
)

// hangGuard bounds a wait that must end.
const hangGuard = 10 * time.Second

// done reports whether ch is closed within d.
func done(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

func TestCloseRefusesLaterCalls(t *testing.T) {
	var m Mutex
	if !m.Incref() {
		t.Fatal("Incref refused on an open word")
	}
	m.Decref()
	if !m.Close(func() {}) {
		t.Fatal("the first Close reported false")
	}
	if m.Close(func() { t.Error("a second Close woke the calls") }) {
		t.Error("a second Close reported true")
	}
	if m.Incref() || m.RWLock(true) || m.RWLock(false) || !m.Closed() {
		t.Errorf("after Close: a call was let in (state %#x)", m.state.Load())
	}
}

// TestCloseWaitsForCalls: Close returns only once the calls in flight
// dropped their references, and calls wake before it waits.
func TestCloseWaitsForCalls(t *testing.T) {
	var m Mutex
	if !m.Incref() || !m.RWLock(true) || !m.RWLock(false) {
		t.Fatal("refused on an open word")
	}
	woken := make(chan struct{})
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		m.Close(func() { close(woken) })
	}()
	if !done(woken, hangGuard) {
		t.Fatal("Close did not wake the calls")
	}
	for _, drop := range []func(){m.Decref, func() { m.RWUnlock(true) }, func() { m.RWUnlock(false) }} {
		if done(closed, 20*time.Millisecond) {
			t.Fatal("Close returned with calls in flight")
		}
		drop()
	}
	if !done(closed, hangGuard) {
		t.Fatal("Close did not return after the last call")
	}
}

// TestLocksExclude: one holder of each lock at a time (the race detector
// checks the counters), the two locks independent of each other.
func TestLocksExclude(t *testing.T) {
	var m Mutex
	var reads, writes int
	var wg sync.WaitGroup
	for i := range 16 {
		read := i%2 == 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				if !m.RWLock(read) {
					t.Error("RWLock refused on an open word")
					return
				}
				if read {
					reads++
				} else {
					writes++
				}
				m.RWUnlock(read)
			}
		}()
	}
	wg.Wait()
	if reads != 8000 || writes != 8000 {
		t.Errorf("reads %d, writes %d; want 8000 each", reads, writes)
	}
	if s := m.state.Load(); s != 0 {
		t.Errorf("state %#x after every call returned, want 0", s)
	}
	// A Read in progress does not hold up a Write.
	if !m.RWLock(true) || !m.RWLock(false) {
		t.Fatal("the write lock waited for the read lock")
	}
	m.RWUnlock(false)
	m.RWUnlock(true)
}

// TestCloseWakesWaiters: calls waiting for a lock are refused when Close
// begins, not when the holder returns.
func TestCloseWakesWaiters(t *testing.T) {
	var m Mutex
	if !m.RWLock(false) {
		t.Fatal("refused on an open word")
	}
	const waiters = 5
	refused := make(chan bool, waiters)
	for range waiters {
		go func() { refused <- !m.RWLock(false) }()
	}
	for m.state.Load()&writeMask != waiters*writeWait {
		time.Sleep(time.Millisecond) // until every waiter is counted
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		m.Close(func() {})
	}()
	for range waiters {
		select {
		case ok := <-refused:
			if !ok {
				t.Error("a waiter got the lock after Close began")
			}
		case <-time.After(hangGuard):
			t.Fatal("a waiter was not woken by Close")
		}
	}
	if done(closed, 20*time.Millisecond) {
		t.Fatal("Close returned while the holder held the lock")
	}
	m.RWUnlock(false)
	if !done(closed, hangGuard) {
		t.Fatal("Close did not return after the holder's unlock")
	}
}

// TestUnlockHandsTheLockOn: a waiter gets the lock when the holder gives
// it back.
func TestUnlockHandsTheLockOn(t *testing.T) {
	var m Mutex
	m.RWLock(true)
	got := make(chan struct{})
	go func() {
		if m.RWLock(true) {
			close(got)
		}
	}()
	for m.state.Load()&readMask == 0 {
		time.Sleep(time.Millisecond)
	}
	if done(got, 20*time.Millisecond) {
		t.Fatal("the waiter took a lock that was held")
	}
	m.RWUnlock(true)
	if !done(got, hangGuard) {
		t.Fatal("the waiter did not get the lock")
	}
	m.RWUnlock(true)
}

func TestMisusePanics(t *testing.T) {
	for name, f := range map[string]func(m *Mutex){
		"Decref without a reference": func(m *Mutex) { m.Decref() },
		"RWUnlock without the lock":  func(m *Mutex) { m.RWUnlock(true) },
		"RWUnlock of the other lock": func(m *Mutex) { m.RWLock(true); m.RWUnlock(false) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f(new(Mutex))
		})
	}
}

func TestTooManyPanics(t *testing.T) {
	var m Mutex
	m.state.Store(refMask) // a million references
	defer func() {
		if recover() != tooMany {
			t.Error("the overflow did not panic")
		}
	}()
	m.Incref()
}

// BenchmarkUncontended: a Read's RWLock and RWUnlock with nobody else.
func BenchmarkUncontended(b *testing.B) {
	var m Mutex
	for b.Loop() {
		m.RWLock(true)
		m.RWUnlock(true)
	}
}
