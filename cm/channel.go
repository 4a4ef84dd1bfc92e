package cm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/internal/pollfd"
	"github.com/rdmanet/sdk/internal/rdmacore"
)

// The process's event channel. Every ID is made on one rdma_cm event
// channel, and one goroutine (the dispatcher) reads it, parked in Go's
// netpoller, and hands each event to its ID: a connection's ID costs no
// descriptor and no goroutine of its own. The channel is made with the
// first ID and goes with the last, so a process with no IDs holds none of
// it. A connection request's ID is on the channel from the start: nothing
// is migrated, and taking a request needs no descriptor.
//
// The dispatcher never blocks on an ID: an event for an ID that nobody
// waits on is queued (at most maxQueuedEvents), a request for a listener
// is queued up to the listener's backlog and refused beyond it, and an ID's
// event handler (HandleEvents) must not block.

// channel is one rdma_cm event channel and its dispatcher.
type channel struct {
	raw  rdmacore.EventChannel
	poll *pollfd.FD
	ev   rdmacore.CMEvent // what the dispatcher's last read took
	to   *ID              // the ID ev was for when read (target), or nil

	// destroyRaw and rejectRaw are rdma-core's calls on a request's ID that
	// has no *ID (its listener is gone); tests replace them.
	destroyRaw func(rdmacore.CMID) error
	rejectRaw  func(rdmacore.CMID, []byte) error

	// readMu is held while librdmacm takes an event, and while the queue
	// pair of an ID whose connect or accept took no answer is destroyed
	// (ID's connecting): rdma_get_cm_event moves the queue pair to RTR and
	// RTS when the peer's answer comes (to the error state on a reject), and
	// a destroy at that moment fails in the kernel, the object being in
	// use, without a word from rdma_destroy_qp. The queue pair then
	// stayed, and held its CQ and protection domain.
	readMu sync.Mutex

	mu   sync.Mutex
	ids  map[rdmacore.CMID]*ID // the IDs events are for
	refs int                   // IDs made on the channel and not yet closed
}

var (
	sharedMu sync.Mutex
	shared   *channel // the process's channel, while it has IDs
)

// maxQueuedEvents bounds the events queued for an ID that nobody takes:
// set-up takes one at a time, and a connection's end brings two or three.
const maxQueuedEvents = 16

// acquire returns the process's channel with a reference for one more ID,
// making it if there is none.
func acquire() (*channel, error) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared == nil {
		c, err := openChannel()
		if err != nil {
			return nil, err
		}
		shared = c
	}
	shared.mu.Lock()
	shared.refs++
	shared.mu.Unlock()
	return shared, nil
}

// release drops an ID's reference; the last one closes the channel. The
// dispatcher destroys it once it has stopped reading: it may be handing
// out an event when the last ID goes.
func (c *channel) release() {
	sharedMu.Lock()
	c.mu.Lock()
	c.refs--
	last := c.refs == 0
	c.mu.Unlock()
	if last && shared == c {
		shared = nil
	}
	sharedMu.Unlock()
	if last && c.poll != nil {
		c.poll.Close()
	}
}

func openChannel() (*channel, error) {
	raw, fd, err := rdmacore.CreateEventChannel()
	if err != nil {
		return nil, noDevice(err)
	}
	c := newChannel()
	c.raw = raw
	if c.poll, err = pollfd.New(fd, "rdma_cm event channel", c.read); err != nil {
		rdmacore.DestroyEventChannel(raw)
		return nil, err
	}
	go c.run()
	return c, nil
}

// newChannel is a channel without its descriptor, as tests make it.
func newChannel() *channel {
	return &channel{ids: make(map[rdmacore.CMID]*ID), destroyRaw: rdmacore.DestroyID, rejectRaw: rdmacore.Reject}
}

// read takes one event if there is one (pollfd's read function), and the
// ID it is for (a request's: its listener), before acknowledging it: until
// then rdma_destroy_id of that ID waits, so its pointer cannot name an ID
// made since, in the memory of one closed meanwhile.
func (c *channel) read() (bool, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	ev, err := rdmacore.GetCMEvent(c.raw)
	if err == syscall.EAGAIN {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	c.ev, c.to = ev, c.target(ev)
	rdmacore.AckCMEvent(ev)
	return true, nil
}

// run is the dispatcher: it reads events until the last ID is gone, then
// destroys the channel.
func (c *channel) run() {
	defer rdmacore.DestroyEventChannel(c.raw)
	c.serve(func() error { return c.poll.Wait(context.Background()) }, time.Sleep)
}

// Pauses after failed reads of the channel: doubling from the first to the
// last, and back to none after a read that succeeds.
const (
	firstReadPause = 5 * time.Millisecond
	lastReadPause  = time.Second
)

// serve dispatches each event that wait reads (into c.ev and c.to) until
// wait says the channel is closed. A read that fails is retried after a pause:
// librdmacm could not read an event (it handles a request it cannot take
// itself), and, as a listener does after an error, the dispatcher waits a
// moment and reads again. The channel's owner is the process, so nobody
// else can be told; the first failure of a run is logged.
func (c *channel) serve(wait func() error, sleep func(time.Duration)) {
	var pause time.Duration
	for {
		err := wait()
		switch {
		case err == nil:
			pause = 0
			c.dispatchTo(c.ev, c.to)
			c.ev, c.to = rdmacore.CMEvent{}, nil
		case errors.Is(err, os.ErrClosed):
			return
		default:
			if pause == 0 {
				slog.Warn("rdmanet: reading rdma_cm events failed; retrying", "err", err)
			}
			pause = min(max(2*pause, firstReadPause), lastReadPause)
			sleep(pause)
		}
	}
}

// destroyQP destroys raw's queue pair, never while librdmacm takes an
// event (readMu): for an ID whose connect may still be answered.
func (c *channel) destroyQP(raw rdmacore.CMID) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	rdmacore.DestroyQP(raw)
}

// registerLocked makes a request's raw ID an ID on c. c.mu is held.
func (c *channel) registerLocked(raw rdmacore.CMID) *ID {
	id := newID(raw, c)
	c.ids[raw] = id
	c.refs++
	liveIDs.Add(1)
	return id
}

// target is the ID ev is for: a request's listener, or ev's ID; nil when
// it was closed.
func (c *channel) target(ev rdmacore.CMEvent) *ID {
	raw := ev.ID
	if EventType(ev.Type) == EventConnectRequest {
		raw = ev.ListenID
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[raw]
}

// dispatchTo hands ev to to, the ID it was for when read: a request to
// its listener. An event for an ID closed before (nil) concerns nobody;
// one closed since drops it (deliver).
func (c *channel) dispatchTo(ev rdmacore.CMEvent, to *ID) {
	if EventType(ev.Type) == EventConnectRequest {
		c.request(ev, to)
		return
	}
	if to != nil {
		to.deliver(ev)
	}
}

// ErrBacklogFull refuses a request that finds its listener's queue of
// requests not yet taken (as long as Listen's backlog) full. It matches
// syscall.EAGAIN: the listener is busy for a moment, not without RDMA.
var ErrBacklogFull = fmt.Errorf("cm: the listener's backlog of requests is full: %w", syscall.EAGAIN)

// request queues a connection request for its listener ln, or refuses
// it.
func (c *channel) request(ev rdmacore.CMEvent, ln *ID) {
	if ln == nil {
		// The listener was closed: destroying the request's ID refuses it.
		c.destroyRaw(ev.ID)
		return
	}
	c.mu.Lock()
	nid := c.registerLocked(ev.ID)
	c.mu.Unlock()
	if err := ln.queueRequest(&Request{ID: nid, Param: connParamOf(ev.Param)}); err != nil {
		ln.refuse(nid, err)
	}
}

// unregister forgets id: no event reaches it after this returns.
func (c *channel) unregister(id *ID) {
	c.mu.Lock()
	if c.ids[id.raw] == id {
		delete(c.ids, id.raw)
	}
	c.mu.Unlock()
}
