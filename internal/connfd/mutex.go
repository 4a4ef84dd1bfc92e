// Package connfd is what a connection holds as internal/poll's FD holds it
// for a file descriptor: the calls in flight against Close, with a read
// lock and a write lock (Mutex), and the deadlines (Deadline).
//
// Mutex keeps, as poll's fdMutex does, the references of the calls in
// flight, a read lock and a write lock (one Read and one Write at a time,
// as a stream needs), and closed, in one state word. A call takes a
// reference (Incref, or RWLock with its lock); Close marks the word
// closed, which refuses every later call and wakes the calls waiting for a
// lock, and then waits until the calls in flight have returned. Only then
// may what they use (a link, registered memory) be handed on to be freed.
// The uncontended paths are one compare-and-swap.
package connfd

import (
	"sync"
	"sync/atomic"
)

// The state word, from its lowest bit:
//
//	closed         1 bit
//	read locked    1 bit
//	write locked   1 bit
//	references    20 bits: calls in flight, the lock holders' included
//	read waiters  20 bits: calls waiting for the read lock
//	write waiters 20 bits: calls waiting for the write lock
const (
	closed    = 1 << 0
	readLock  = 1 << 1
	writeLock = 1 << 2
	refUnit   = 1 << 3
	refMask   = (1<<20 - 1) << 3
	readWait  = 1 << 23
	readMask  = (1<<20 - 1) << 23
	writeWait = 1 << 43
	writeMask = (1<<20 - 1) << 43
)

// Mutex is the state word and the semaphores its waiters sleep on. The
// zero value is open, with no call in flight.
type Mutex struct {
	state atomic.Uint64
	// rsema and wsema: calls waiting for the read or the write lock;
	// idle: Close, waiting for the last reference.
	rsema, wsema, idle sema
}

// tooMany is the panic of a word whose count overflows: more than a
// million calls at once on one connection.
const tooMany = "connfd: too many calls in flight or waiting"

// Incref takes a reference for a call that needs neither lock (a
// keepalive's tick, a half-close's bookkeeping). It reports false once
// Close has begun.
func (m *Mutex) Incref() bool {
	for {
		old := m.state.Load()
		if old&closed != 0 {
			return false
		}
		next := old + refUnit
		if next&refMask == 0 {
			panic(tooMany)
		}
		if m.state.CompareAndSwap(old, next) {
			return true
		}
	}
}

// Decref drops a reference that Incref took.
func (m *Mutex) Decref() {
	for {
		old := m.state.Load()
		if old&refMask == 0 {
			panic("connfd: Decref without a reference")
		}
		next := old - refUnit
		if m.state.CompareAndSwap(old, next) {
			m.lastRef(next)
			return
		}
	}
}

// lastRef lets Close go on when next, the word after a reference went, is
// closed with none left.
func (m *Mutex) lastRef(next uint64) {
	if next&(closed|refMask) == closed {
		m.idle.release(1)
	}
}

// lockBits are one lock's bits in the word, and its semaphore.
func (m *Mutex) lockBits(read bool) (lock, wait, mask uint64, s *sema) {
	if read {
		return readLock, readWait, readMask, &m.rsema
	}
	return writeLock, writeWait, writeMask, &m.wsema
}

// RWLock takes a reference and the read lock (read) or the write lock,
// waiting for the call that holds it. It reports false, holding nothing,
// once Close has begun: at once, or when Close wakes it from its wait.
func (m *Mutex) RWLock(read bool) bool {
	lock, wait, mask, s := m.lockBits(read)
	for {
		old := m.state.Load()
		if old&closed != 0 {
			return false
		}
		var next uint64
		if old&lock == 0 {
			next = (old | lock) + refUnit
			if next&refMask == 0 {
				panic(tooMany)
			}
		} else {
			next = old + wait
			if next&mask == 0 {
				panic(tooMany)
			}
		}
		if !m.state.CompareAndSwap(old, next) {
			continue
		}
		if old&lock == 0 {
			return true
		}
		// The holder's RWUnlock, or Close, counts this waiter out and
		// wakes it; then it tries again.
		s.acquire()
	}
}

// RWUnlock gives back the lock RWLock took and its reference, and wakes
// one call waiting for that lock.
func (m *Mutex) RWUnlock(read bool) {
	lock, wait, mask, s := m.lockBits(read)
	for {
		old := m.state.Load()
		if old&lock == 0 || old&refMask == 0 {
			panic("connfd: RWUnlock of a lock not held")
		}
		next := (old &^ lock) - refUnit
		waiter := old&mask != 0
		if waiter {
			next -= wait
		}
		if !m.state.CompareAndSwap(old, next) {
			continue
		}
		if waiter {
			s.release(1)
		}
		m.lastRef(next)
		return
	}
}

// Close marks the word closed: from now on Incref and RWLock refuse, and
// the calls waiting for a lock are woken to refuse. It reports false if
// Close had begun already. Otherwise it calls wake, which must wake the
// calls in flight (they are blocked in the connection's own waits), and
// returns once every one of them has dropped its reference.
func (m *Mutex) Close(wake func()) bool {
	for {
		old := m.state.Load()
		if old&closed != 0 {
			return false
		}
		// Closed, with the waiters counted out: each wakes, finds the
		// word closed, and refuses.
		next := (old | closed) &^ (readMask | writeMask)
		if !m.state.CompareAndSwap(old, next) {
			continue
		}
		m.rsema.release(int((old & readMask) / readWait))
		m.wsema.release(int((old & writeMask) / writeWait))
		wake()
		if next&refMask != 0 {
			m.idle.acquire()
		}
		return true
	}
}

// Closed reports whether Close has begun.
func (m *Mutex) Closed() bool { return m.state.Load()&closed != 0 }

// sema is a counting semaphore; its zero value has no permit.
type sema struct {
	mu      sync.Mutex
	permits int
	wake    chan struct{} // closed and replaced when permits arrive for waiters
}

// acquire takes a permit, waiting for one.
func (s *sema) acquire() {
	s.mu.Lock()
	for s.permits == 0 {
		if s.wake == nil {
			s.wake = make(chan struct{})
		}
		w := s.wake
		s.mu.Unlock()
		<-w
		s.mu.Lock()
	}
	s.permits--
	s.mu.Unlock()
}

// release adds n permits and wakes the waiters to take them.
func (s *sema) release(n int) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	s.permits += n
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
	s.mu.Unlock()
}
