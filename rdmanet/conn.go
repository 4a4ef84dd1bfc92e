package rdmanet

import (
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/rdmanet/sdk/internal/connfd"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/session"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// Conn is an RDMA connection. It implements net.Conn.
//
// Bytes written are copied into a registered transmit ring and sent as RDMA
// writes into the peer's receive buffer; the caller's slice is never handed
// to the device. Received bytes are copied out of a registered receive
// buffer by Read. The stream protocol (windows, credit, coalescing, control
// messages, keepalive) is internal/stream's Engine; the queue pair under it
// is a link.Link. A blocked Read or Write takes the completions it waits for
// itself; an idle connection has no goroutine: the link tells it when
// completions come, and a short service takes them (internal/connfd.FD,
// over poller.go's linkDriver).
//
// Lifetimes follow internal/poll's FD: Close wakes every blocked call at
// once, waits for the calls in flight (a service among them), and only
// then hands the link to a background drain that delivers what was written
// (bounded by lingerTimeout) and frees the registered memory
// (internal/connfd, linger.go).
type Conn struct {
	link          link.Link
	rdma          *rdmalink.Link // the first link, when it is RDMA, while it is set up (nil over link.Pipe)
	sess          *session.Link  // c.link when the connection is a resumable session (session.go), or nil
	mem           *ringMem       // the rings, when the connection owns them (a session's)
	cfg           Config
	server        bool // answers GetServerFeature
	local, remote *Addr

	// fd: the calls in flight against Close with their read and write
	// locks, the deadlines, and who takes the link's completions
	// (internal/connfd.FD, driven through poller.go's linkDriver).
	fd connfd.FD

	mu      sync.Mutex     // guards eng, the FD's poller role and closing
	eng     *stream.Engine // nil until start
	closing bool           // Close has begun
	// disconnected: the link was disconnected because the connection
	// failed (failedLocked).
	disconnected bool
	buffers      completionBuffers // what the FD's batches are polled into

	ticker   *time.Timer   // keepalive and dead-path checks (tick.go)
	released chan struct{} // the link is closed and its memory freed (linger.go)
	// viewsGone: linger waits on it for the application to release the
	// ring memory it holds (view.go), when it holds some at Close.
	viewsGone chan struct{}

	// bytesSent and bytesReceived count what Write took and Read
	// returned, under mu (which both already hold), for Connections.
	bytesSent, bytesReceived uint64
	// peerClosedCounted: a Write found the peer gone, and it was counted.
	peerClosedCounted bool
}

// newLinkConn makes a connection over l, which is established: the
// agreed features and the peer's Hello (zero for a Valkey peer) decide the
// protocol. It announces the receive buffer and starts taking completions.
func newLinkConn(l link.Link, cfg Config, server bool, features wire.Features, peer wire.Hello) (*Conn, error) {
	c := &Conn{link: l, cfg: cfg, server: server}
	if err := c.begin(features, peer); err != nil {
		return nil, err
	}
	return c, nil
}

// begin builds the engine over c.link and starts the connection. A
// decoded Hello has a version; a Valkey peer's is zero.
func (c *Conn) begin(features wire.Features, peer wire.Hello) error {
	addr, key := c.link.RecvRingKey()
	ka := c.cfg.KeepAlive
	if ka < 0 {
		ka = 0
	}
	// Link features (write notices, receive credit) are the link's: its
	// Caps carry what the engine must know of them.
	sc := stream.Config{
		Features: features &^ wire.LinkFeatures, Peer: peer, PeerHello: peer.Version != 0, Server: c.server,
		Caps: c.link.Caps(), SendRing: c.link.SendRing(), RecvRing: c.link.RecvRing(),
		RecvAddr: addr, RecvKey: key, KeepAlive: ka,
		// Rings grow to Config's sizes, on a link that can replace them;
		// fixed rings start there, and shrinking goes back to the start.
		MaxSendRing: c.cfg.SendBuffer, MaxRecvRing: c.cfg.RecvBuffer, ShrinkAfter: shrinkAfter,
	}
	if n, ok := c.link.(link.PeerRingNamer); ok && features&wire.FeatureRing != 0 {
		// A group's stream: the peer's ring came with the open, so data
		// need not wait for its announcement.
		addr, size, rkey := n.PeerRing()
		sc.PeerRing = &wire.Message{Op: wire.OpRegisterXferMemory, Addr: addr, Length: size, RKey: rkey}
	}
	eng, err := stream.New(sc)
	if err != nil {
		return err
	}
	local, remote := c.link.Addrs()
	c.local, c.remote = &Addr{local}, &Addr{remote}
	c.eng = eng
	c.released = make(chan struct{})
	c.fd.Init(&c.mu, c.driver(), c.cfg.BusyPoll)

	c.mu.Lock()
	eng.Start()
	c.link.SetNotify(c.fd.Kick)
	c.flushLocked()
	c.startTicksLocked()
	c.fd.SettleLocked()
	c.mu.Unlock()
	register(c)
	return nil
}

// flushLocked posts what the engine queued and wakes the Reads and Writes
// that may now make progress; c.mu is held.
func (c *Conn) flushLocked() {
	c.eng.Flush(c.link)
	c.wakeReadyLocked()
}

// wakeReadyLocked wakes a blocked Read or Write whose wait is over (data,
// room, the end of the stream or an error); c.mu is held.
func (c *Conn) wakeReadyLocked() {
	c.fd.ReadyLocked(c.eng.Readable(), c.eng.Writable())
	c.lostLocked()
	if c.eng.Err() != nil {
		c.failedLocked()
	}
}

// failedLocked runs once the engine has failed: the link is disconnected at
// once, so that the peer learns it (as a TCP reset tells it) instead of
// waiting for its own keepalive, and a polling waiter is woken. c.mu is held.
func (c *Conn) failedLocked() {
	if !c.disconnected {
		c.disconnected = true
		c.link.Disconnect()
		countConnError(c.eng.Err())
	}
	c.fd.WakePollerLocked()
}

func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: Network, Source: c.local, Addr: c.remote, Err: err}
}

// Read reads received bytes into b. It returns io.EOF once the peer has closed
// and everything it sent has been read.
func (c *Conn) Read(b []byte) (int, error) {
	return c.read(func() (int, error) { return c.eng.Read(b) })
}

// read runs take, an engine's read (Read's, or ReadView's), under the read
// lock and c.mu until it does not block: the connection closing, the read
// deadline and the waits between are every reader's.
func (c *Conn) read(take func() (int, error)) (int, error) {
	if !c.fd.RWLock(true) {
		return 0, c.opError("read", net.ErrClosed)
	}
	defer c.fd.RWUnlock(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closing {
			return 0, c.opError("read", net.ErrClosed)
		}
		if c.fd.DeadlinePassed(false) {
			return 0, c.opError("read", os.ErrDeadlineExceeded)
		}
		n, err := take()
		c.bytesReceived += uint64(n)
		if err != stream.ErrWouldBlock {
			c.flushLocked() // a credit or an announcement may be due; more may be readable
			if err == nil || err == io.EOF || err == io.ErrUnexpectedEOF {
				return n, err // (only a view ends with io.ErrUnexpectedEOF)
			}
			return n, c.opError("read", err)
		}
		if c.eng.Queued() {
			c.flushLocked() // the space given back while views are held (stream.Engine.View)
		}
		if err := c.fd.WaitLocked(false); err != nil {
			return 0, c.opError("read", err)
		}
	}
}

// Write sends b. It returns once every byte is in the transmit ring and
// posted to the device, or held to go out with the next completion (small
// Writes coalesce while earlier ones are in flight), splitting b as the
// rings and the peer's window allow.
func (c *Conn) Write(b []byte) (int, error) {
	if !c.fd.RWLock(false) {
		return 0, c.opError("write", net.ErrClosed)
	}
	defer c.fd.RWUnlock(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writeLocked(b)
}

// writeLocked is Write under the write lock and c.mu: a Write's bytes, or
// a committed write buffer's (view.go).
func (c *Conn) writeLocked(b []byte) (int, error) {
	return c.writeLoopLocked(func(written int) (int, error) { return c.eng.Write(b[written:]) })
}

// writeLoopLocked runs take, an engine's write of the bytes from written
// on (Write's, or WriteFrom's), under the write lock and c.mu until it
// took them all: the connection closing, the write deadline, a failed
// post and the waits between are every writer's.
func (c *Conn) writeLoopLocked(take func(written int) (int, error)) (int, error) {
	written := 0
	for {
		if c.closing {
			return written, c.opError("write", net.ErrClosed)
		}
		if c.fd.DeadlinePassed(true) {
			return written, c.opError("write", os.ErrDeadlineExceeded)
		}
		n, err := take(written)
		written += n
		c.bytesSent += uint64(n)
		if n > 0 {
			c.fd.WroteLocked()
		}
		c.flushLocked()
		if err == nil {
			err = c.eng.Err() // posting what was taken may have failed
		}
		switch {
		case err == nil:
			return written, nil
		case err != stream.ErrWouldBlock:
			if err == stream.ErrPeerClosed && !c.peerClosedCounted {
				c.peerClosedCounted = true
				countConnError(err)
			}
			return written, c.opError("write", err)
		}
		if err := c.fd.WaitLocked(true); err != nil {
			return written, c.opError("write", err)
		}
	}
}

// Close closes the connection. Pending Reads and Writes return
// net.ErrClosed at once, and Close returns as soon as they have. Bytes
// already written are still delivered: in the background, for up to
// lingerTimeout, the connection waits for the peer to acknowledge them,
// then disconnects and frees its memory, as a kernel does for a closed TCP
// socket.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return c.opError("close", net.ErrClosed)
	}
	c.closing = true
	c.ticker.Stop()
	if c.sess != nil {
		c.sess.StopFailback()
	}
	l := c.link
	c.mu.Unlock()
	// Refuse later calls, wake the ones asleep on the link, and wait for
	// those in flight (a service among them) to return. The link's
	// events are linger's from now on.
	c.fd.Close(l.Wake)
	unregister(c)
	go c.linger()
	return nil
}

// CloseWrite shuts down the sending side: the peer reads what was written,
// then io.EOF, and may still write to this side. It needs the half-close
// extension, which two rdmanet peers negotiate; with a Valkey peer (or
// Config.ValkeyCompatible) it returns ErrHalfCloseUnsupported.
func (c *Conn) CloseWrite() error {
	if !c.fd.RWLock(false) { // after any Write in progress
		return c.opError("close", net.ErrClosed)
	}
	defer c.fd.RWUnlock(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return c.opError("close", net.ErrClosed)
	}
	err := c.eng.CloseWrite()
	c.flushLocked()
	if err != nil {
		return c.opError("close", err)
	}
	return nil
}

// Protocol names the wire protocol of a connection.
type Protocol string

const (
	// ProtocolValkey is Valkey's RDMA transport: the peer is Valkey (or
	// libvalkey), or one side set Config.ValkeyCompatible.
	ProtocolValkey Protocol = "valkey"
	// ProtocolRdmanet is Valkey's transport with rdmanet's extensions (a ring
	// with continuous credit return, half-close), agreed between two rdmanet peers.
	ProtocolRdmanet Protocol = "rdmanet"
)

// Protocol reports which wire protocol the connection speaks.
func (c *Conn) Protocol() Protocol {
	if c.eng.Features() != 0 {
		return ProtocolRdmanet
	}
	return ProtocolValkey
}

// LocalAddr returns the local address (*Addr).
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's address (*Addr).
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both the read and the write deadline.
func (c *Conn) SetDeadline(t time.Time) error {
	c.fd.SetReadDeadline(t)
	c.fd.SetWriteDeadline(t)
	return nil
}

// SetReadDeadline sets the deadline for pending and future Reads.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.fd.SetReadDeadline(t)
	return nil
}

// SetWriteDeadline sets the deadline for pending and future Writes.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.fd.SetWriteDeadline(t)
	return nil
}
