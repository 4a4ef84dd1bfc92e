package rdmanet

import (
	"cmp"
	"github.com/rdmanet/sdk/internal/group"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmanet/sdk/fallback"
)

// ConnInfo is the state of one live connection, as Connections reports it:
// what `ss -i` shows of a TCP socket.
type ConnInfo struct {
	Local, Remote string             // addresses
	Transport     fallback.Transport // "rdma", or "tcp" while a session runs over TCP
	Protocol      Protocol           // "rdmanet" or "valkey"
	Side          string             // "dialed" or "accepted"
	Session       bool               // a resumable session (Config.Resume)

	// Device, Port and QP are the RDMA device and port the connection uses
	// and its queue pair's number; empty over TCP (or a test's in-memory link).
	Device string `json:",omitempty"`
	Port   uint8  `json:",omitempty"`
	QP     uint32 `json:",omitempty"`
	// Stream is the connection's name in its link group (issue 25), or 0
	// for a connection with a queue pair of its own; Device, Port, QP and
	// DataPath are then the group's link's, which its streams share.
	Stream uint32 `json:",omitempty"`
	// DataPath is how data reaches the peer over RDMA:
	// "write-with-immediate", or "write-and-notice" where a device has no
	// immediate data (iWARP; docs/protocol.md). Empty over TCP.
	DataPath string `json:",omitempty"`

	// BytesSent and BytesReceived count the bytes Write took and Read
	// returned.
	BytesSent, BytesReceived uint64

	// Window is the flow control's state.
	Window Window

	// Idle is how long since this side last posted anything to the
	// device or saw a send complete (a receiving side posts credit and
	// keepalives, so a live connection is never idle for long).
	Idle time.Duration
	// LastError is why the connection failed, or why its session is
	// suspended, or "" while it works.
	LastError string `json:",omitempty"`
}

// Window is a connection's flow control at one moment.
type Window struct {
	SendSlots    int    // the send queue's work request slots
	SendInFlight int    // of which are posted and not known complete
	SendRing     uint64 // the transmit ring's size in bytes
	SendRingUsed uint64 // of which are written and not released yet
	PeerRoom     uint32 // bytes the peer's buffer takes now (window or credit)
	RecvUnread   uint32 // received bytes waiting for Read (contiguous)
}

// Sides of a connection.
const (
	sideDialed   = "dialed"
	sideAccepted = "accepted"
)

// live is the registry of connections that are established and not
// closed. A connection enters it when it starts (before Dial or Accept
// returns it) and leaves it when Close begins to finish, so the registry
// never holds a closed connection and is bounded by the connections open.
var live struct {
	sync.Mutex
	conns map[*Conn]struct{}
}

// closed are the counts of connections closed so far, so that process
// totals are the sum of these and of the live connections' counts: the
// data path counts each connection's bytes only, under the lock it
// already holds.
var closed struct {
	sent, received, posted, arrived atomic.Uint64
}

// totals are the process's counts over every connection.
type totals struct {
	open                            int
	sent, received, posted, arrived uint64
}

// countsLocked returns c's own counts; c.mu is held.
func (c *Conn) countsLocked() totals {
	s := c.eng.State()
	return totals{sent: c.bytesSent, received: c.bytesReceived, posted: s.Posted, arrived: s.Arrived}
}

// liveTotals adds the closed connections' counts and the live ones'.
func liveTotals() totals {
	t := totals{sent: closed.sent.Load(), received: closed.received.Load(), posted: closed.posted.Load(), arrived: closed.arrived.Load()}
	cs := liveConns()
	t.open = len(cs)
	for _, c := range cs {
		c.mu.Lock()
		ct := c.countsLocked()
		c.mu.Unlock()
		t.sent += ct.sent
		t.received += ct.received
		t.posted += ct.posted
		t.arrived += ct.arrived
	}
	return t
}

func register(c *Conn) {
	live.Lock()
	defer live.Unlock()
	if live.conns == nil {
		live.conns = make(map[*Conn]struct{})
	}
	live.conns[c] = struct{}{}
}

// unregister removes c from the registry and adds its bytes to the
// closed connections'; c.mu is not held.
func unregister(c *Conn) {
	live.Lock()
	_, ok := live.conns[c]
	delete(live.conns, c)
	live.Unlock()
	if !ok {
		return
	}
	c.mu.Lock()
	t := c.countsLocked()
	c.mu.Unlock()
	closed.sent.Add(t.sent)
	closed.received.Add(t.received)
	closed.posted.Add(t.posted)
	closed.arrived.Add(t.arrived)
}

// liveConns returns the connections in the registry.
func liveConns() []*Conn {
	live.Lock()
	defer live.Unlock()
	cs := make([]*Conn, 0, len(live.conns))
	for c := range live.conns {
		cs = append(cs, c)
	}
	return cs
}

// Connections returns the state of the package's live RDMA connections
// (*Conn, resumable sessions included, whichever path they run on), sorted
// by local then remote address. A connection is listed from when it is
// established until it is closed, even after it failed (LastError says
// why). TCP connections the package made or accepted as fallbacks are
// *net.TCPConn underneath and are not listed: `ss` shows them.
func Connections() []ConnInfo {
	cs := liveConns()
	infos := make([]ConnInfo, 0, len(cs))
	for _, c := range cs {
		infos = append(infos, c.info())
	}
	slices.SortFunc(infos, func(a, b ConnInfo) int {
		return cmp.Or(cmp.Compare(a.Local, b.Local), cmp.Compare(a.Remote, b.Remote))
	})
	return infos
}

// Info is the connection's state now, as Connections reports it.
func (c *Conn) Info() ConnInfo { return c.info() }

// info takes a snapshot of c, under c.mu. Its clock is read under the
// lock too: the engine posts under it, so nothing it reports is later than
// now (a time read before the lock made a busy connection's Idle negative).
func (c *Conn) info() ConnInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	i := ConnInfo{
		Local: c.local.String(), Remote: c.remote.String(),
		Transport: fallback.RDMA, Protocol: ProtocolValkey, Side: sideDialed,
		Session:   c.sess != nil,
		BytesSent: c.bytesSent, BytesReceived: c.bytesReceived,
	}
	if c.onTCPLocked() {
		i.Transport = fallback.TCP
	}
	if c.eng.Features() != 0 {
		i.Protocol = ProtocolRdmanet
	}
	if c.server {
		i.Side = sideAccepted
	}
	l := c.link
	if c.sess != nil {
		l = c.sess.Path()
	}
	if st, ok := l.(*group.Stream); ok {
		i.Stream = uint32(st.Tag())
		l = st.Base()
	}
	if l, ok := l.(deviceLink); ok {
		i.Device, i.Port, i.QP = l.Endpoint()
		i.DataPath = l.DataPath()
	}
	s := c.eng.State()
	i.Window = Window{
		SendSlots: s.SendSlots, SendInFlight: s.SendInFlight,
		SendRing: s.SendRing, SendRingUsed: s.SendRingUsed,
		PeerRoom: s.PeerRoom, RecvUnread: s.RecvUnread,
	}
	last := s.LastPost
	if s.LastProgress.After(last) {
		last = s.LastProgress
	}
	i.Idle = now.Sub(last).Round(time.Millisecond)
	if err := c.eng.Err(); err != nil {
		i.LastError = err.Error()
	} else if err := c.eng.Lost(); err != nil {
		i.LastError = err.Error()
	}
	return i
}

// deviceLink is a link on an RDMA device (rdmalink's), which says where it
// runs and how data moves on it.
type deviceLink interface {
	Endpoint() (device string, port uint8, qpNum uint32)
	DataPath() string
}
