package rdmanet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/verbs"
)

// Memory is memory registered once for large writes (issue 26's "large
// transfers"; docs/engine.md, "Zero-copy"): WriteFrom sends bytes of it
// straight into the peer's receive ring, from where they are, with no
// copy into the connection's transmit ring. The wire does not change, so
// it works toward Valkey peers and over every path a connection takes.
//
// The memory is mapped by NewMemory, whole pages, outside Go's heap, and
// registered with each RDMA device (and each peer's protection domain)
// the first time a connection there sends from it, in the background:
// WriteFrom copies until the registration is made, so that pinning a large
// Memory holds up no connection. The registration stays until Close.
// Registration pins the memory: it counts against RLIMIT_MEMLOCK. Where it cannot be registered (the limit, a TCP path, a
// platform without RDMA), WriteFrom copies as Write does, and Stats says
// how many bytes went which way.
type Memory struct {
	buf *verbs.Buffer // nil where mmap is not supported: Go memory, always copied
	mem *link.Mem

	sent, copied atomic.Uint64
	closeOnce    sync.Once
	closeErr     error
}

// MemoryStats says how WriteFrom sent a Memory's bytes.
type MemoryStats struct {
	// Sent: bytes sent from the memory where it is.
	Sent uint64
	// Copied: bytes WriteFrom copied into a transmit ring, where the
	// memory could not be registered or the connection's path cannot
	// send from it.
	Copied uint64
	// Kept: bytes of Sent that a resumable stream (a session, a link
	// group's stream) copied into its transmit ring after they were sent,
	// to send them again from there if its path fails: those the peer had
	// not yet acknowledged when their requests completed, or when the
	// path failed or the ring grew.
	Kept uint64
}

// ErrNotInMemory is WriteFrom's error for bytes that do not lie in the
// Memory named.
var ErrNotInMemory = stream.ErrNotInMemory

// MaxMemory is the largest Memory.
const MaxMemory = 1<<32 - 1<<16

// NewMemory maps size bytes, rounded up to whole pages, for WriteFrom.
func NewMemory(size int) (*Memory, error) {
	if size <= 0 || size > MaxMemory {
		return nil, fmt.Errorf("rdmanet: NewMemory of %d bytes (at most %d)", size, MaxMemory)
	}
	buf, err := verbs.NewBuffer(size)
	switch {
	case errors.Is(err, verbs.ErrNotSupported):
		return &Memory{mem: link.NewMem(make([]byte, size), nil)}, nil
	case err != nil:
		return nil, fmt.Errorf("rdmanet: NewMemory: %w", err)
	}
	return &Memory{buf: buf, mem: link.NewMem(buf.Bytes()[:size:size], buf)}, nil
}

// Bytes is the memory, to fill before WriteFrom.
func (m *Memory) Bytes() []byte { return m.mem.Bytes() }

// Stats says how WriteFrom sent the memory's bytes so far.
func (m *Memory) Stats() MemoryStats {
	return MemoryStats{Sent: m.sent.Load(), Copied: m.copied.Load(), Kept: m.mem.KeptBytes()}
}

// Idle returns a channel closed once no connection's request reads the
// memory: the completion of PostFrom's requests. WriteFrom waits for its
// own before it returns without an error; after an error (a deadline,
// Close, a failed connection) some of its bytes may still be in flight,
// until the connection's requests complete or its link closes (Close's
// linger bounds that).
func (m *Memory) Idle() <-chan struct{} { return m.mem.Idle() }

// Close waits until the memory is idle or ctx is done, then deregisters
// it from every device and unmaps it; Bytes must not be used after.
func (m *Memory) Close(ctx context.Context) error {
	select {
	case <-m.mem.Idle():
	case <-ctx.Done():
		return fmt.Errorf("rdmanet: Memory.Close: %d requests still read it: %w", m.mem.Busy(), ctx.Err())
	}
	m.closeOnce.Do(func() {
		m.mem.Close()
		if m.buf != nil {
			m.closeErr = m.buf.Close()
		}
	})
	return m.closeErr
}

// WriteFrom writes b, which lies in m, sending it from where it is: no
// copy is made into the transmit ring. It returns once b may be changed
// again, as io.Writer's contract asks: every request that reads it
// completed. In a resumable stream (a session, a link group's stream,
// the default between rdmanet peers) the ring keeps what the peer has not
// acknowledged, to send it again after a failover; the peer acknowledges
// as its reader frees a quarter of its ring, so bytes not yet
// acknowledged when their requests complete are copied into the ring then
// (m.Stats' Kept), as are those in flight when a path fails. At most a
// transmit ring of b is in flight at a time, and each WriteFrom waits for
// its last request: it suits large writes, which it spares a copy each
// (PostFrom overlaps them).
//
// Where m cannot be registered with the connection's device, or its path
// cannot send from memory (a session on TCP), WriteFrom copies as Write
// does (m.Stats counts both). It fails with ErrNotInMemory for bytes
// outside m and ErrBufferHeld while a write buffer is held. After an
// error, bytes posted before it may still be in flight: m.Idle says when
// they are not.
func (c *Conn) WriteFrom(m *Memory, b []byte) (int, error) {
	return c.writeFrom(m, b, true)
}

// PostFrom is WriteFrom that returns once b is posted, as Write does, not
// once it may change: m.Idle says when no request reads m any more. A
// writer that streams from several Memories in turn, waiting for each
// one's Idle before it refills it, keeps the ring full.
func (c *Conn) PostFrom(m *Memory, b []byte) (int, error) {
	return c.writeFrom(m, b, false)
}

// writeFrom is WriteFrom, and PostFrom without wait.
func (c *Conn) writeFrom(m *Memory, b []byte, wait bool) (int, error) {
	if _, ok := m.mem.OffsetOf(b); !ok {
		return 0, c.opError("write", ErrNotInMemory)
	}
	if !c.fd.RWLock(false) {
		return 0, c.opError("write", net.ErrClosed)
	}
	defer c.fd.RWUnlock(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	written, err := c.writeLoopLocked(func(written int) (int, error) {
		if s, ok := c.link.(link.MemSender); !ok || s.RegisterMem(m.mem) != nil {
			// Copied, as Write would.
			n, err := c.eng.Write(b[written:])
			m.copied.Add(uint64(n))
			return n, err
		}
		n, err := c.eng.WriteMem(m.mem, b[written:])
		m.sent.Add(uint64(n))
		return n, err
	})
	// Every byte is posted (or an error stopped them): wait until none is
	// read any more.
	for wait && err == nil && c.eng.MemHeld() {
		c.eng.WaitMem()
		if werr := c.fd.WaitLocked(true); werr != nil {
			return written, c.opError("write", werr)
		}
	}
	return written, err
}
