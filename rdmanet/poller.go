package rdmanet

import (
	"errors"
	"time"

	"github.com/rdmanet/sdk/internal/connfd"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/stream"
)

// Who takes completions, and when, is the FD's (internal/connfd.FD): a
// blocked Read or Write polls the link itself when nobody else does, and
// an idle connection has no goroutine (the link kicks a short service).
// linkDriver is what the FD drives: the connection's link of the moment
// and its engine, under c.mu.
type linkDriver Conn

// pollBatch is how many completions one Poll takes; spinBatch, how many a
// Read or Write takes at a time while it spins beside the poller.
const (
	pollBatch = 32
	spinBatch = 8
)

// completionBuffers are the buffers the FD's batches name.
type completionBuffers struct {
	poller              [pollBatch]link.Completion
	readSpin, writeSpin [spinBatch]link.Completion
}

func (c *Conn) driver() *linkDriver { return (*linkDriver)(c) }

// SweepLocked polls one batch of completions and handles them; it reports
// whether there were any. Whoever polls does it under c.mu, so batches are
// taken and handled one at a time, in the link's order, which the send
// queue's accounting and the stream (a Shutdown after its data) rely on.
func (d *linkDriver) SweepLocked(b connfd.Batch) bool {
	c := (*Conn)(d)
	var cs []link.Completion
	switch b {
	case connfd.ReadSpinBatch:
		cs = c.buffers.readSpin[:]
	case connfd.WriteSpinBatch:
		cs = c.buffers.writeSpin[:]
	default:
		cs = c.buffers.poller[:]
	}
	n, err := c.link.Poll(cs)
	if err != nil {
		c.eng.Fail(err)
		c.wakeReadyLocked()
		return false
	}
	if n == 0 {
		return false
	}
	c.handleLocked(cs[:n])
	c.wakeReadyLocked()
	return true
}

// ArmLocked arms the link; a failure fails the connection.
func (d *linkDriver) ArmLocked() bool {
	c := (*Conn)(d)
	if err := c.link.Arm(); err != nil {
		c.eng.Fail(err)
		c.wakeReadyLocked()
		return false
	}
	return true
}

// WaitLocked sleeps in the link's Wait.
func (d *linkDriver) WaitLocked() (completion bool, err error) {
	c := (*Conn)(d)
	c.mu.Unlock()
	err = c.link.Wait()
	c.mu.Lock()
	if err == nil {
		return true, nil
	}
	if errors.Is(err, link.ErrWoken) {
		return false, nil
	}
	if !c.closing {
		c.eng.Fail(err)
		c.wakeReadyLocked()
	}
	return false, err
}

func (d *linkDriver) WakeLocked() { d.link.Wake() }

func (d *linkDriver) FailedLocked() bool { return d.eng.Err() != nil }

func (d *linkDriver) QuietLocked() bool {
	return d.closing || d.eng.Err() != nil || d.eng.PeerGone()
}

// TickLocked runs the engine's due checks while the connection lingers
// (Close stopped the ticker), so a path that goes silent during the drain
// is found, and a session resumes past it.
func (d *linkDriver) TickLocked() time.Time {
	c := (*Conn)(d)
	if next := c.eng.NextTick(); !next.IsZero() && !time.Now().Before(next) {
		c.pathProgressLocked()
		c.eng.Tick()
		c.eng.Flush(c.link)
		c.lostLocked()
	}
	return c.eng.NextTick()
}

func (d *linkDriver) DrainedLocked() bool { return d.eng.Drained() }

// handleLocked gives a batch of completions to the engine and posts what
// it answers with; c.mu is held.
func (c *Conn) handleLocked(cs []link.Completion) {
	for i := range cs {
		switch cs[i].Kind {
		case link.Resumed: // a session's new path (internal/session), a stream's new link
			addr, key := c.link.RecvRingKey()
			if k, ok := c.link.(link.RingKeyer); ok {
				// Its ring may have grown: the one the peer writes into now.
				if a, r, ok := k.RingKey(c.eng.RecvWriteMem()); ok {
					addr, key = a, r
				}
			}
			if err := c.eng.Relink(c.link.Caps(), addr, key); err != nil {
				c.eng.End(err)
			}
			c.rdma = nil // the first link's, for its set-up only
			c.rearmLocked()
		case link.Ended: // a session, or a group's stream, that will have no path
			if cs[i].Err == stream.ErrPeerLeftLink {
				c.eng.PeerLeft()
			} else {
				c.eng.End(groupEndError(cs[i].Err))
			}
		default:
			c.eng.Handle(&cs[i])
		}
	}
	c.eng.AfterCompletions()
	c.eng.Flush(c.link)
	clear(cs) // drop references to errors
}

// lostLocked hands a link the engine lost to the link that resumes it (a
// session, a group's stream); c.mu is held.
func (c *Conn) lostLocked() {
	if cause := c.eng.Lost(); cause != nil {
		if r, ok := c.link.(link.Resumer); ok && r.Lost(cause) {
			countConnError(cause)
		}
	}
}
