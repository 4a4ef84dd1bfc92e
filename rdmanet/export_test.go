package rdmanet

import (
	"fmt"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"

	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// SetAcceptTimeout sets the bound on an accepted connection's handshake
// until the test ends; set it before the listener takes a request.
func SetAcceptTimeout(t testing.TB, d time.Duration) {
	acceptTimeout = d
	t.Cleanup(func() { acceptTimeout = defaultAcceptTimeout })
}

// EndLateWatches ends the watches of connection requests that dials gave
// up on, and waits until they released their cm IDs, so that a test can
// count what is left open.
var EndLateWatches = endLateWatches

// DeclareDeadPath makes c do what its keepalive does when the dead-path
// bound passes (tick.go), whatever the path: a busy host's stall taken for
// a dead path. It fails when c has no link to let go of: a session that
// is suspended on this side (it lost its link, or its new link is not yet
// attached), or a connection that ended. The keepalive does not run then
// (stream.Engine.Tick), and the engine would ignore the failure.
func DeclareDeadPath(c *Conn) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.eng.Err() != nil:
		return fmt.Errorf("DeclareDeadPath: the connection ended: %w", c.eng.Err())
	case c.eng.Lost() != nil:
		return fmt.Errorf("DeclareDeadPath: the session has no link: it is suspended after %w", c.eng.Lost())
	}
	c.eng.Fail(&stream.PathDeadError{Outstanding: 2 * c.cfg.KeepAlive})
	c.flushLocked()
	return nil
}

// PathProgress is what c's link knows of its path's progress
// (link.PathWatcher): when a send last completed and a message last
// arrived on any connection to the same peer on the device; ok is false
// for a link that does not know.
func PathProgress(c *Conn) (sent, heard time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w, ok := c.link.(link.PathWatcher)
	if !ok {
		return time.Time{}, time.Time{}, false
	}
	sent, heard = w.PathProgress()
	return sent, heard, true
}

// WithSharedRecv returns cfg with a listener's connections from dialers
// that take credit grants on a shared receive queue (Config.sharedRecv).
func WithSharedRecv(cfg Config) Config {
	cfg.sharedRecv = true
	return cfg
}

// GroupStream reports whether c runs over a group's stream.
func GroupStream(c *Conn) bool {
	_, ok := c.link.(*group.Stream)
	return ok
}

// SharedRecv reports whether c's link takes its receives from a shared
// receive queue.
func SharedRecv(c *Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rdma != nil && c.rdma.SharedRecv()
}

// WithIWARPDataPath returns cfg with the link features of an iWARP device
// (write notices, receive credit) needed whatever the device: the lab runs
// iWARP's data path on Soft-RoCE with it.
func WithIWARPDataPath(cfg Config) Config {
	cfg.linkNeeds = wire.LinkFeatures
	return cfg
}

// OnDialStarted makes dials call f with each connection once its engine
// runs, before the dial returns, until the test ends.
func OnDialStarted(t testing.TB, f func(*Conn)) {
	dialStarted = f
	t.Cleanup(func() { dialStarted = nil })
}
