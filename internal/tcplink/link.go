package tcplink

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

// Config is what a link is made with.
type Config struct {
	// SendRing and RecvRing are owned by the caller (the session): the link
	// reads SendRing and writes RecvRing, never reallocates them, and stops
	// touching them when Close returns.
	SendRing, RecvRing []byte
	// Release, if set, is called once the link will touch the rings no
	// more: by the first Close as it returns, or by New when it fails.
	// The owner frees the rings only after every link over them released
	// them.
	Release func()
	// SendDepth, RecvDepth and ControlDepth are the link's Caps. RecvDepth
	// receives are posted when the link is made.
	SendDepth, RecvDepth, ControlDepth int
	// Name is Caps().Name; "tcp" if empty.
	Name string
	// Carrier puts the link in carrier mode (link.Carrier, carrier.go): it
	// carries a link group's streams, on rings another link of the group
	// made, and every data request carries its Tag (a Tagged data frame).
	// Both ends of a connection must set it the same: the caller agrees on
	// it with the peer before New (as on the rings' sizes); an end that
	// differs fails the connection with a protocol error at the first data
	// frame. In carrier mode SendRing and RecvRing may be empty.
	Carrier bool
}

// RingAddr is the fake address RecvRingKey gives every link's receive ring:
// a user-space-looking address, so that a ring offset passed as an address
// fails, and distinct from link.Pipe's. The ring's key is random per link.
const RingAddr = 0x7e00_0000_0000

// Frame types (see the package documentation).
const (
	frameData       = 0x01
	frameControl    = 0x02
	frameMarker     = 0x03
	frameAck        = 0x04
	frameDisconnect = 0x05
	frameAbort      = 0x06
	frameTagged     = 0x07
)

// Abort codes.
const (
	abortRemoteAccess = 1
	abortProtocol     = 2
)

const (
	dataHeader   = 17
	taggedHeader = 21
	// maxBatch is how many requests the writer takes in one batch (one
	// writev).
	maxBatch = 128
	// inlineMax: payloads up to this size are copied next to their header
	// rather than written from the ring as an iovec of their own.
	inlineMax = 128
	// batchBuf holds a batch's headers and inlined payloads: an Ack, the
	// requests, a Disconnect (an Abort goes alone).
	batchBuf = 9 + maxBatch*(taggedHeader+inlineMax) + 1
	// readBuf is the reader's buffer.
	readBuf = 64 << 10
)

// Link is one end of a link over a net.Conn. See the package documentation.
type Link struct {
	conn          net.Conn
	cfg           Config
	caps          link.Caps
	rkey          uint32
	local, remote netip.AddrPort

	mu       sync.Mutex
	waitCond sync.Cond // Wait sleeps on it
	// waits counts the Waits running; notify is SetNotify's function, called
	// instead when an event finds none.
	waits     int
	notify    func()
	writeCond sync.Cond // the writer sleeps on it
	recvCond  sync.Cond // the reader sleeps on it while no receive is posted

	// Send requests are numbered from 1 in post order (seq); reqs[s%len]
	// holds request s while it is outstanding. handed: requests given to
	// the writer (written or being written); acked: the peer's cumulative
	// Ack; retired: the last request whose SendDone Poll took, which
	// retires every request up to it. retired <= acked <= handed <= seq.
	reqs                          []link.SendWR
	seq, handed, acked, retired   uint64
	controls                      int  // SendControl requests outstanding
	disconnecting                 bool // Disconnect was called: later requests are flushed
	sendDisconnect                bool // the writer owes a Disconnect frame
	abort                         bool // the writer owes an Abort frame
	abortCode                     byte
	abortCount                    uint64
	peerGone                      bool // the writer found the peer gone (EPIPE and the like)
	landed, ackWanted, ackWritten uint64

	recvPosted int    // receives posted now
	rnrWaits   uint64 // messages that found no receive posted and waited (for tests)

	// Carrier mode (carrier.go): the receive rings by rkey (the first ring
	// and ShareRecvRing's), and the stream transmit rings by key
	// (ShareSendRing's). nextRKey, nextSendKey and nextAddr give the
	// registrations their names.
	recvRings   map[uint32]recvRing
	sendRings   map[uint32][]byte
	nextRKey    uint32
	nextSendKey uint32
	nextAddr    uint64
	addrWrapped bool
	// landing counts the payload bytes of tagged frames copied into the
	// receive rings (for tests that stop a peer mid-payload).
	landing uint64
	// writing: the writer encodes or writes a batch that reads a stream
	// transmit ring (batchSrcs), outside the lock; writerIdle is broadcast
	// when it is done with it (ReleaseSendRing waits for that on a link that
	// is down).
	writing    bool
	writerIdle sync.Cond

	cq     []entry // completions for Poll: cq[head:]
	head   int
	down   bool // the Disconnected or Failed completion was queued (it is last)
	armed  bool // Arm was called and no completion has arrived since
	event  bool // a completion arrived while armed: the next Wait returns
	woken  bool // Wake was called: the next Wait returns ErrWoken
	closed bool

	// Closed when the reader and the writer return. The writer returns soon
	// after the link ends, once it wrote what it owed (an Abort or a
	// Disconnect frame); the reader when it ends, or at Close.
	readerDone, writerDone chan struct{}

	// The writer's own (batch and batchSrcs are set under the lock).
	batch     []link.SendWR
	batchSrcs [][]byte    // a data request's bytes, by its index in batch
	hbuf      []byte      // headers and inlined payloads of a batch (never reallocated)
	vec       net.Buffers // the batch's pieces
	out       net.Buffers // what WriteTo consumes

	// The reader's own.
	br  *bufio.Reader
	hdr [32]byte
}

var _ link.Link = (*Link)(nil)

// entry is a queued completion; seq is the request a SendDone completes.
type entry struct {
	c   link.Completion
	seq uint64
}

// New makes a link over c, on which the caller has done any handshake, and
// starts its reader and writer. The link owns c from now on: Close closes
// it. New clears any deadline the handshake left on c (the link's reader
// waits as long as the peer is silent: finding a dead path is the engine's
// job, by its completions), and on a *net.TCPConn it makes sure
// TCP_NODELAY is set (Go's default).
func New(c net.Conn, cfg Config) (*Link, error) {
	return newLink(c, cfg, rand.Uint32())
}

// newLink is New with the ring's key given (tests fix it).
func newLink(c net.Conn, cfg Config, rkey uint32) (_ *Link, err error) {
	defer func() {
		if err != nil && cfg.Release != nil {
			cfg.Release()
		}
	}()
	if cfg.SendDepth < 0 || cfg.RecvDepth < 0 || cfg.ControlDepth < 0 {
		return nil, fmt.Errorf("tcplink: negative depth in %+v", cfg)
	}
	if cfg.Name == "" {
		cfg.Name = "tcp"
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("tcplink: %s: clearing deadlines: %w", cfg.Name, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		if err := tc.SetNoDelay(true); err != nil {
			return nil, fmt.Errorf("tcplink: %s: TCP_NODELAY: %w", cfg.Name, err)
		}
	}
	l := &Link{
		conn: c,
		cfg:  cfg,
		caps: link.Caps{
			SendDepth:    cfg.SendDepth,
			RecvDepth:    cfg.RecvDepth,
			ControlDepth: cfg.ControlDepth,
			Name:         cfg.Name,
			Transport:    "tcp",
		},
		rkey:       rkey,
		local:      addrPort(c.LocalAddr()),
		remote:     addrPort(c.RemoteAddr()),
		reqs:       make([]link.SendWR, max(cfg.SendDepth, 1)),
		recvPosted: cfg.RecvDepth,
		cq:         make([]entry, 0, cfg.SendDepth+cfg.RecvDepth+1),
		batch:      make([]link.SendWR, 0, maxBatch),
		batchSrcs:  make([][]byte, maxBatch),
		hbuf:       make([]byte, 0, batchBuf),
		vec:        make(net.Buffers, 0, 2*maxBatch+2),
		br:         bufio.NewReaderSize(c, readBuf),
	}
	l.waitCond.L = &l.mu
	l.writeCond.L = &l.mu
	l.recvCond.L = &l.mu
	l.writerIdle.L = &l.mu
	if cfg.Carrier {
		l.initCarrier()
	}
	l.readerDone, l.writerDone = make(chan struct{}), make(chan struct{})
	go l.read()
	go l.write()
	return l, nil
}

// addrPort is a net.Addr as an address and port, or the zero value when it
// is not an IP address (net.Pipe's).
func addrPort(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case nil:
		return netip.AddrPort{}
	default:
		var err error
		if ap, err = netip.ParseAddrPort(a.String()); err != nil {
			return netip.AddrPort{}
		}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// Caps returns the configured depths; MaxInline is 0 (nothing is sent at
// post time).
func (l *Link) Caps() link.Caps { return l.caps }

// SendRing returns Config.SendRing. A request's bytes are read when the
// writer writes it, some time after PostSend.
func (l *Link) SendRing() []byte { return l.cfg.SendRing }

// RecvRing returns Config.RecvRing, where the peer's data lands.
func (l *Link) RecvRing() []byte { return l.cfg.RecvRing }

// RecvRingKey returns RingAddr and this link's random key.
func (l *Link) RecvRingKey() (addr uint64, rkey uint32) { return RingAddr, l.rkey }

// Addrs returns the socket's addresses (zero for a net.Conn whose addresses
// are not IP addresses).
func (l *Link) Addrs() (local, remote netip.AddrPort) { return l.local, l.remote }

// PostSend validates every request first and queues all or none of them for
// the writer; it never blocks on the network.
func (l *Link) PostSend(wrs []link.SendWR) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.closedError("PostSend")
	}
	controls := 0
	for i := range wrs {
		wr := &wrs[i]
		switch wr.Kind {
		case link.SendData:
			src, ok := l.dataSrcLocked(wr)
			if !ok {
				return l.misuse("PostSend: request %d: no transmit ring with key %d", i, wr.Ring)
			}
			if uint64(wr.Off)+uint64(wr.N) > uint64(len(src)) {
				return l.misuse("PostSend: request %d: data [%d, %d) outside the %d-byte send ring %d",
					i, wr.Off, uint64(wr.Off)+uint64(wr.N), len(src), wr.Ring)
			}
		case link.SendControl:
			if !wr.Signaled {
				return l.misuse("PostSend: request %d: unsignaled control", i)
			}
			controls++
		case link.SendMarker:
		default:
			return l.misuse("PostSend: request %d: kind %d", i, wr.Kind)
		}
	}
	if l.disconnecting || l.down {
		// Flushed: they never complete, so they do not count either.
		return nil
	}
	if out := l.seq - l.retired; out+uint64(len(wrs)) > uint64(l.cfg.SendDepth) {
		return l.misuse("PostSend: %d requests outstanding and %d more, SendDepth %d",
			out, len(wrs), l.cfg.SendDepth)
	}
	if l.controls+controls > l.cfg.ControlDepth {
		return l.misuse("PostSend: %d control requests outstanding and %d more, ControlDepth %d",
			l.controls, controls, l.cfg.ControlDepth)
	}
	for i := range wrs {
		l.seq++
		l.reqs[l.seq%uint64(len(l.reqs))] = wrs[i]
	}
	l.controls += controls
	if len(wrs) > 0 {
		l.writeCond.Signal()
	}
	return nil
}

// PostRecv posts n receives; a message that waits for one lands.
func (l *Link) PostRecv(n int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.closedError("PostRecv")
	}
	if n < 0 {
		return l.misuse("PostRecv(%d)", n)
	}
	if l.recvPosted+n > l.cfg.RecvDepth {
		return l.misuse("PostRecv: %d posted and %d more, RecvDepth %d", l.recvPosted, n, l.cfg.RecvDepth)
	}
	l.recvPosted += n
	if n > 0 {
		l.recvCond.Signal()
	}
	return nil
}

// Poll takes queued completions. Once it has returned the Disconnected or
// Failed completion, which is always the last, it returns 0.
func (l *Link) Poll(cs []link.Completion) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, l.closedError("Poll")
	}
	n := 0
	for n < len(cs) && l.head < len(l.cq) {
		en := &l.cq[l.head]
		cs[n] = en.c
		if en.c.Kind == link.SendDone {
			l.retire(en.seq)
		}
		*en = entry{}
		l.head++
		n++
	}
	if l.head == len(l.cq) {
		l.cq, l.head = l.cq[:0], 0
	}
	return n, nil
}

// retire ends the outstanding requests up to seq, whose SendDone was taken.
func (l *Link) retire(seq uint64) {
	for s := l.retired + 1; s <= seq; s++ {
		if l.reqs[s%uint64(len(l.reqs))].Kind == link.SendControl {
			l.controls--
		}
	}
	l.retired = seq
}

// Arm makes the next completion end a Wait; one that arrived before does not.
func (l *Link) Arm() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.closedError("Arm")
	}
	l.armed, l.event = true, false
	return nil
}

// Wait returns nil after a completion arrived while armed, or at once while
// the link is down (nothing more will arrive); ErrWoken after Wake; an error
// wrapping net.ErrClosed once the link is closed.
func (l *Link) Wait() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waits++
	defer func() { l.waits-- }()
	for {
		switch {
		case l.closed:
			return l.closedError("Wait")
		case l.woken:
			l.woken = false
			return link.ErrWoken
		case l.event:
			l.event = false
			return nil
		case l.down:
			return nil
		}
		l.waitCond.Wait()
	}
}

// SetNotify makes f be called when a completion or the end finds no Wait.
func (l *Link) SetNotify(f func()) {
	l.mu.Lock()
	l.notify = f
	l.mu.Unlock()
}

// signal ends a Wait, or calls the notify function if none runs; l.mu is
// held.
func (l *Link) signal() {
	l.waitCond.Broadcast()
	if l.waits == 0 && l.notify != nil {
		l.notify()
	}
}

// Wake makes the current or the next Wait return ErrWoken. It may be called
// at any time, also after Close.
func (l *Link) Wake() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.woken = true
	l.waitCond.Broadcast()
}

// Disconnect ends the connection as rdma_disconnect does: requests not yet
// written are flushed (written ones may or may not land; none completes
// any more), this end's Poll reports Disconnected after what already
// arrived, and a Disconnect frame tells the peer, whose Poll reports
// Disconnected after what arrived before it. An Ack of everything that
// landed here goes before the Disconnect frame, so the peer's requests
// that landed complete before its Disconnected. Requests posted after it are
// flushed. A second Disconnect, or one after the link ended, does nothing.
func (l *Link) Disconnect() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.closedError("Disconnect")
	}
	if l.disconnecting {
		return nil
	}
	l.disconnecting = true
	if l.down {
		return nil
	}
	// What landed here is acknowledged before the Disconnect frame, as a
	// device has acknowledged it at once.
	l.publishAckLocked()
	l.sendDisconnect = true
	l.endLocked(link.Completion{Kind: link.Disconnected})
	return nil
}

// Close closes the socket and returns once the link's goroutines have
// returned: after it, the link never touches SendRing or RecvRing again. A
// peer that was not disconnected sees the socket end (Disconnected). A Wait
// in progress returns. Close is idempotent.
func (l *Link) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.waitCond.Broadcast()
	l.writeCond.Broadcast()
	l.recvCond.Broadcast()
	l.mu.Unlock()
	err := l.conn.Close()
	<-l.readerDone
	<-l.writerDone
	if l.cfg.Release != nil {
		l.cfg.Release()
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("tcplink: %s: close: %w", l.cfg.Name, err)
	}
	return nil
}

// push queues a completion and ends a Wait if the link is armed. l.mu is
// held.
func (l *Link) push(c link.Completion, seq uint64) {
	if len(l.cq) == cap(l.cq) && l.head > 0 {
		// Reuse the array: a steady stream of completions allocates nothing.
		k := copy(l.cq, l.cq[l.head:])
		clear(l.cq[k:])
		l.cq, l.head = l.cq[:k], 0
	}
	l.cq = append(l.cq, entry{c: c, seq: seq})
	if l.armed {
		l.armed, l.event = false, true
		l.signal()
	}
}

// endLocked queues the link's last completion, unless it ended already, and
// wakes everyone: a Wait, the writer (which then writes what it owes and
// returns) and the reader. l.mu is held.
func (l *Link) endLocked(c link.Completion) {
	if l.down {
		return
	}
	l.down = true
	l.cq = append(l.cq, entry{c: c})
	l.signal()
	l.writeCond.Broadcast()
	l.recvCond.Broadcast()
}

func (l *Link) closedError(op string) error {
	return fmt.Errorf("tcplink: %s: %s: %w", l.cfg.Name, op, net.ErrClosed)
}

func (l *Link) misuse(format string, args ...any) error {
	return fmt.Errorf("tcplink: %s: %s: %w", l.cfg.Name, fmt.Sprintf(format, args...), link.ErrMisuse)
}
