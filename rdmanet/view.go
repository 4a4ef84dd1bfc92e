package rdmanet

import (
	"errors"
	"io"
	"net"
	"os"

	"github.com/rdmanet/sdk/internal/stream"
)

// Zero-copy reading and writing (issue 26; docs/engine.md, "Zero-copy").
//
// ReadView and ReleaseView read in place, in the shape of bufio.Reader's
// Peek and Discard; WriteBuffer and Commit write in place, in the shape
// of bufio.Writer's AvailableBuffer. They are opt-in: Read and Write are
// unchanged, and may be mixed with them.
//
// Ring memory outlives every view of it and the write buffer: a ring
// with views is never given back or unmapped (one that growth or
// shrinking replaced waits for its last view), the transmit ring is not
// replaced under a write buffer, and a closed connection's rings are
// freed only once the last view is released and the write buffer
// committed (or abandoned with Commit(0)). Release them, after Close too.

var (
	// ErrNotView: ReleaseView of a slice that is not a view held on the
	// connection (never returned by ReadView, released already, or
	// resliced).
	ErrNotView = stream.ErrNotView
	// ErrViewsFull: the views held fill the receive ring, which is at
	// its largest, so the bytes a ReadView waits for cannot come until
	// some are released.
	ErrViewsFull = stream.ErrViewsFull
	// ErrTooManyViews: a ReadView while MaxViews views are held.
	ErrTooManyViews = stream.ErrTooManyViews
	// ErrBufferHeld: a Write or a WriteBuffer while a write buffer is held.
	ErrBufferHeld = stream.ErrBufferHeld
	// ErrNoBuffer: a Commit without a write buffer, or of more bytes than it has.
	ErrNoBuffer = stream.ErrNoBuffer
)

// MaxViews is how many views a connection holds at once.
const MaxViews = stream.MaxViews

// ReadView waits for the next n bytes of the stream and returns them, in
// place in the receive ring: no copy is made. Reads after it return the
// bytes after them. The view stays valid, and its bytes unchanged, until
// ReleaseView; until then its space in the ring is not given back to the
// peer, so hold views briefly, as a kernel's socket buffer would fill.
//
// Where the n bytes are not contiguous in the ring (they wrap at its end,
// or n exceeds it) and toward a Valkey peer, the view is a copy, released
// like any other. At the end of the stream it returns the bytes that
// remain with io.ErrUnexpectedEOF, or io.EOF if none do; the read deadline
// and Close apply as to Read. ErrViewsFull says that the views held keep
// the bytes from coming.
func (c *Conn) ReadView(n int) ([]byte, error) {
	return c.readView(func() ([]byte, error) { return c.eng.View(n) })
}

// readView runs take, an engine's view, in the read loop (Conn.read).
func (c *Conn) readView(take func() ([]byte, error)) ([]byte, error) {
	var v []byte
	_, err := c.read(func() (int, error) {
		var err error
		v, err = take()
		return len(v), err
	})
	return v, err
}

// ReadViewUpTo waits for received bytes and returns those contiguous in
// the receive ring, up to most, in place: as ReadView, but for as many as
// can be had without a copy (at least one), as a streaming reader wants
// (bufio.Reader.Peek of what is Buffered). Toward a Valkey peer it is a
// copy of what arrived. Release it as any view.
func (c *Conn) ReadViewUpTo(most int) ([]byte, error) {
	return c.readView(func() ([]byte, error) { return c.eng.ViewUpTo(most) })
}

// ReleaseView gives back a view that ReadView returned, whole: its space in
// the ring goes back to the peer once the views before it are released
// too. It may be called from any goroutine, and after Close.
func (c *Conn) ReleaseView(v []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.eng.Release(v); err != nil {
		return c.opError("release", err)
	}
	c.memoryReturnedLocked()
	return nil
}

// WriteBuffer returns n bytes to fill and Commit: free space in the
// transmit ring, after every byte written, which Commit sends from where
// it is. It waits, as Write does, until n bytes there are free; where
// they are not contiguous (the ring wraps, or n exceeds it) the buffer is
// a copy, which Commit copies as Write would. Writes and WriteBuffer
// return ErrBufferHeld until the buffer is committed.
func (c *Conn) WriteBuffer(n int) ([]byte, error) {
	if !c.fd.RWLock(false) {
		return nil, c.opError("write", net.ErrClosed)
	}
	defer c.fd.RWUnlock(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closing {
			return nil, c.opError("write", net.ErrClosed)
		}
		if c.fd.DeadlinePassed(true) {
			return nil, c.opError("write", os.ErrDeadlineExceeded)
		}
		b, err := c.eng.Reserve(n)
		c.flushLocked()
		switch {
		case err == nil:
			return b, nil
		case err != stream.ErrWouldBlock:
			return nil, c.opError("write", err)
		}
		if err := c.fd.WaitLocked(true); err != nil {
			return nil, c.opError("write", err)
		}
	}
}

// Commit sends the first n bytes of the buffer WriteBuffer returned and
// ends the buffer; Commit(0) abandons it. It returns as Write does: once
// the bytes are posted, with how many were and an error if not all were.
// After Close it ends the buffer and returns net.ErrClosed.
func (c *Conn) Commit(n int) (int, error) {
	if !c.fd.RWLock(false) {
		c.mu.Lock()
		c.eng.EndReserve()
		c.memoryReturnedLocked()
		c.mu.Unlock()
		return 0, c.opError("write", net.ErrClosed)
	}
	defer c.fd.RWUnlock(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.eng.Reserved()
	if b == nil || n < 0 || n > len(b) {
		return 0, c.opError("write", ErrNoBuffer)
	}
	defer c.memoryReturnedLocked()
	defer c.eng.EndReserve()
	return c.writeLocked(b[:n])
}

// Buffered returns how many received bytes can be read now, without
// waiting: a server that finds none behind a request knows the request
// came alone, as bufio.Reader.Buffered tells of its buffer.
func (c *Conn) Buffered() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.eng.Buffered()
}

// memoryReturnedLocked lets a closed connection free its rings once the
// application holds none of their memory (linger); c.mu is held.
func (c *Conn) memoryReturnedLocked() {
	if !c.closing {
		c.flushLocked() // a Credit may be due
		return
	}
	if c.viewsGone != nil && !c.eng.HoldsMemory() {
		close(c.viewsGone)
		c.viewsGone = nil
	}
}

// ZeroCopier reads and writes in place: a *Conn, or ZeroCopyOf's copying
// stand-in for any other net.Conn.
type ZeroCopier interface {
	ReadView(n int) ([]byte, error)
	ReadViewUpTo(most int) ([]byte, error)
	ReleaseView(v []byte) error
	WriteBuffer(n int) ([]byte, error)
	Commit(n int) (int, error)
	WriteFrom(m *Memory, b []byte) (int, error)
}

// ZeroCopyOf returns c's zero-copy calls: c itself when it is an RDMA
// connection (*Conn); for any other net.Conn (a TCP fallback, say), calls
// of the same meaning that copy: a view is a new slice filled with
// io.ReadFull, and a write buffer is a slice that Commit writes. Code
// written against it runs over every connection Dial and Accept return.
func ZeroCopyOf(c net.Conn) ZeroCopier {
	if rc, ok := c.(*Conn); ok {
		return rc
	}
	return &copyingZeroCopier{conn: c}
}

// copyingZeroCopier is ZeroCopier over a net.Conn that has no rings.
type copyingZeroCopier struct {
	conn net.Conn
	buf  []byte // the write buffer held, if any
	held bool
}

func (z *copyingZeroCopier) ReadView(n int) ([]byte, error) {
	if n <= 0 {
		return nil, errors.New("rdmanet: ReadView of a non-positive length")
	}
	b := make([]byte, n)
	k, err := io.ReadFull(z.conn, b)
	if k == 0 {
		return nil, err
	}
	return b[:k], err
}

// ReadViewUpTo reads what one Read gives, up to most bytes, into a new
// slice.
func (z *copyingZeroCopier) ReadViewUpTo(most int) ([]byte, error) {
	if most <= 0 {
		return nil, errors.New("rdmanet: ReadViewUpTo of a non-positive length")
	}
	b := make([]byte, most)
	k, err := z.conn.Read(b)
	if k == 0 {
		return nil, err
	}
	return b[:k], err
}

// ReleaseView has nothing to give back: the view was the caller's copy.
func (z *copyingZeroCopier) ReleaseView([]byte) error { return nil }

func (z *copyingZeroCopier) WriteBuffer(n int) ([]byte, error) {
	switch {
	case n <= 0:
		return nil, errors.New("rdmanet: WriteBuffer of a non-positive length")
	case z.held:
		return nil, ErrBufferHeld
	}
	if cap(z.buf) < n {
		z.buf = make([]byte, n)
	}
	z.buf, z.held = z.buf[:n], true
	return z.buf, nil
}

func (z *copyingZeroCopier) Commit(n int) (int, error) {
	if !z.held || n < 0 || n > len(z.buf) {
		return 0, ErrNoBuffer
	}
	z.held = false
	return z.conn.Write(z.buf[:n])
}

// WriteFrom writes b, a copy as any Write over the connection is.
func (z *copyingZeroCopier) WriteFrom(m *Memory, b []byte) (int, error) {
	if _, ok := m.mem.OffsetOf(b); !ok {
		return 0, ErrNotInMemory
	}
	n, err := z.conn.Write(b)
	m.copied.Add(uint64(n))
	return n, err
}
