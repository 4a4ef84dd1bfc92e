// Package pollfd parks goroutines on rdma-core's event file descriptors (a
// completion channel, an rdma_cm event channel) through Go's netpoller, so a
// wait costs a goroutine, never an OS thread blocked in C.
//
// The descriptor is duplicated and the duplicate is handed to the runtime's
// poller (os.NewFile on a non-blocking fd gives a pollable *os.File), so rdma-core
// keeps ownership of the original and destroys it as usual. The poller is
// edge-triggered: a wait retries its read function until that function has
// drained what it needs, and the runtime re-parks only after EAGAIN.
package pollfd

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrNotSupported is returned off Linux.
var ErrNotSupported = errors.New("pollfd: not supported on this platform")

// FD is a pollable duplicate of a descriptor owned by someone else.
type FD struct {
	file   *os.File
	raw    syscall.RawConn
	closed atomic.Bool

	// read is the owner's non-blocking read, given to New; poll is bound to
	// it once, so a wait allocates nothing. One Wait at a time: the owner
	// serialises them (readErr is per wait).
	read    func() (done bool, err error)
	poll    func(uintptr) bool
	readErr error
}

func (p *FD) bind(read func() (bool, error)) {
	p.read = read
	p.poll = func(uintptr) bool {
		done, err := p.read()
		if err != nil {
			p.readErr = err
			return true
		}
		return done
	}
}

// Wait calls the read function given to New until it reports done or an
// error, parking in the netpoller between attempts while it returns done ==
// false (nothing available). It returns ctx.Err() when ctx ends first, and
// os.ErrClosed after Close. The read function runs on the waiting goroutine.
// Callers must not Wait concurrently; with a context that cannot be cancelled
// a Wait does not allocate.
func (p *FD) Wait(ctx context.Context) error {
	// Fast path: the event may already be there, and no timer is needed.
	if done, err := p.read(); done || err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var cancelled bool
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { p.file.SetReadDeadline(time.Unix(1, 0)) })
		defer func() {
			if !stop() {
				// The deadline was forced into the past for this wait; clear it so
				// the next wait starts fresh.
				cancelled = true
				p.file.SetReadDeadline(time.Time{})
			}
		}()
	}
	p.readErr = nil
	err := p.raw.Read(p.poll)
	if err != nil {
		if p.closed.Load() {
			// RawConn reports internal/poll's "use of closed file"; callers match os.ErrClosed.
			return os.ErrClosed
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && (cancelled || ctx.Err() != nil) {
			return ctx.Err()
		}
		return err
	}
	return p.readErr
}

// SetDeadline sets the deadline for all waits, as os.File.SetReadDeadline does.
func (p *FD) SetDeadline(t time.Time) error { return p.file.SetReadDeadline(t) }

// Close wakes every waiter with os.ErrClosed and returns once none is running
// its read function, so the owner may then destroy the original descriptor.
func (p *FD) Close() error {
	p.closed.Store(true)
	return p.file.Close()
}
