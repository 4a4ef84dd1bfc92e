// Package link is the seam between rdmanet's connection engine and what
// carries its bytes: one end of a reliable, ordered connection with
// registered memory on both ends, as an RDMA reliable-connection queue pair
// gives. The engine (internal/stream.s Engine, driven by rdmanet.Conn) posts
// requests and takes completions through the small interface Link; it never
// sees verbs, rdma_cm or a file descriptor.
//
// Two implementations exist: the RDMA one in package rdmanet (a queue pair, its
// completion queue and channel, and its rdma_cm ID), and an in-memory pair in
// this package (Pipe) that behaves like a reliable connection and injects
// faults, so the engine and net.Conn's whole contract are tested on any
// machine. The model is wireguard-go's conn.Bind and its test bind.
//
// The seam is semantic, not verbs-shaped: a data request says "these bytes of
// my send ring go to this place in the peer's ring, and the peer learns how
// many arrived", whatever the link does for it (an RDMA write with immediate
// data; on a device without immediate data, a write followed by a small
// send). A connection is a session over a link, so that it can later move
// from one link to another.
package link

import (
	"errors"
	"net/netip"
	"time"
	"unsafe"

	"github.com/rdmanet/sdk/internal/wire"
)

// Link is one end of a reliable connection.
//
// Concurrency: Wait may run while any other method runs, and Wake and
// SetNotify may be called from any goroutine at any time; every other method is called by
// one goroutine at a time (the connection's lock). After Close, nothing may
// call the link or touch its memory: the connection makes sure of that by
// waiting for every call in flight before it closes the link.
//
// Errors: PostSend, PostRecv, Poll and Arm fail only when the link is
// broken or misused (more requests than Caps allow, a range outside the
// rings); the connection then fails with that error. A request the peer
// refuses, or a path that breaks, is reported by Poll as a Failed
// completion instead, after the completions before it.
type Link interface {
	// Caps is what this end has, fixed when it was made.
	Caps() Caps

	// SendRing is this end's registered transmit ring: a Write copies bytes
	// into it, and a SendData request sends a range of it. The bytes of a
	// request must not change until its completion (or a later signaled
	// one's) is taken.
	SendRing() []byte
	// RecvRing is where the peer's data lands.
	RecvRing() []byte
	// RecvRingKey is how the peer names RecvRing in its requests: the address
	// and key this end announces (RegisterXferMemory).
	RecvRingKey() (addr uint64, rkey uint32)

	// PostSend posts send requests, in order. At most Caps().SendDepth may be
	// outstanding, and of those at most Caps().ControlDepth SendControl
	// requests; a request is outstanding until its own completion, or a later
	// signaled one's, is taken. SendControl requests are always signaled.
	PostSend(wrs []SendWR) error
	// PostRecv posts n receives again, in place of n that the peer's
	// messages consumed (DataArrived and ControlArrived completions). At most
	// Caps().RecvDepth are posted at a time; all of them are posted when the
	// link is made, before the peer can send.
	PostRecv(n int) error

	// Poll takes up to len(cs) completions, in the order they happened. A
	// link that went down reports it once as a Disconnected or Failed
	// completion, after everything that arrived before; Poll then returns 0.
	Poll(cs []Completion) (int, error)
	// Arm asks that the next completion end a Wait. Completions are edge
	// events: arm, then poll once more before waiting, or a completion that
	// arrived in between goes unannounced.
	Arm() error
	// Wait sleeps until a completion arrives after Arm, Wake is called, or
	// the link goes down. It returns ErrWoken after Wake (a Wake before Wait
	// makes the next Wait return at once).
	Wait() error
	// Wake makes the current or the next Wait return ErrWoken.
	Wake()
	// SetNotify makes the link call f when a Wait would end, with nil,
	// while no Wait runs: a completion arrived after Arm, or the link went
	// down. So a connection with no Read or Write in flight needs no
	// goroutine asleep in Wait (as Go's net needs none for an idle
	// socket): f schedules the work. f is called from the link's or its
	// device's goroutine, and must not block or call the link. nil stops
	// the calls; a call already under way may still finish.
	SetNotify(f func())

	// Addrs are this end's address and the peer's.
	Addrs() (local, remote netip.AddrPort)
	// Disconnect ends the connection as rdma_disconnect does: requests
	// posted and not completed are flushed (they may or may not have landed
	// at the peer), and both ends' Poll report Disconnected after what they
	// had already received. A connection that wants what it wrote delivered
	// waits for the completions first (rdmanet's linger). Requests posted
	// after it are flushed.
	Disconnect() error
	// Close releases the link and its memory.
	Close() error
}

// Rings is a link whose rings may be replaced while the connection runs,
// so that a connection starts with small rings and grows them as it
// streams (issue 24; docs/protocol.md, "Rings that follow traffic"). The
// link owns every ring it made, and frees those still held when it closes.
// Called under the same rule as PostSend.
type Rings interface {
	// NewRecvRing makes a receive ring of size bytes that the peer may
	// write into, named to it by addr and rkey, for the engine to offer.
	// An error (the pool is dry, a bound reached, pinning failed) leaves
	// the connection on the rings it has.
	NewRecvRing(size int) (mem []byte, addr uint64, rkey uint32, err error)
	// ReleaseRecvRing takes back a ring from NewRecvRing, or the first one
	// (RecvRing), that nothing lands in any more: the peer moved to
	// another ring, and every byte it wrote before was read.
	ReleaseRecvRing(mem []byte) error
	// ReplaceSendRing replaces the transmit ring with one of size bytes and
	// frees the old one. No data request is outstanding.
	ReplaceSendRing(size int) ([]byte, error)
}

// RecvGranter is a link whose receives come from a pool shared with other
// links (a shared receive queue). After the peer's messages took n
// receives, which PostRecv gave back to the pool, the engine asks how much
// credit to give the peer: held is what it holds now. More than n grows
// its share (a link that streams), fewer shrinks it (the pool is short);
// the engine never leaves the peer less than its first grant. Used only
// where Caps.RecvGrant. Called under the same rule as PostSend.
type RecvGranter interface {
	Grant(held, n int) int
}

// Carrier is a link that carries many streams (internal/group): every
// stream has rings of its own, made while the link runs, and its requests
// and arrivals name it. A SendData request with Ring set sends from that
// transmit ring, and its DataArrived at the peer reports the request's
// Tag (on RDMA, the immediate names the stream and the receive's byte_len
// gives N). Its receive rings are NewRecvRing's, as a connection's grown
// rings are (Rings), so a stream's rings grow as any connection's do.
// Called under the same rule as PostSend.
type Carrier interface {
	Link
	// NewRecvRing and ReleaseRecvRing are Rings': a receive ring the peer
	// may write into, and its return once nothing lands in it.
	NewRecvRing(size int) (mem []byte, addr uint64, rkey uint32, err error)
	ReleaseRecvRing(mem []byte) error
	// NewSendRing makes a transmit ring of size bytes, which SendWR.Ring
	// names by key (never 0). An error (the pool is dry, a bound reached,
	// pinning failed) refuses the stream, or its growth.
	NewSendRing(size int) (mem []byte, key uint32, err error)
	// ReleaseSendRing gives back a transmit ring no request sends from.
	ReleaseSendRing(key uint32) error
	// ShareRecvRing and ShareSendRing register on this link a ring that
	// maker, another link of the same group, made: a stream that moves to
	// this link keeps its memory, which holds what it has not yet sent or
	// read. Releasing such a ring here (ReleaseRecvRing, ReleaseSendRing)
	// drops only the registration; the memory is maker's to give back,
	// after every registration of it was dropped.
	ShareRecvRing(maker Carrier, mem []byte) (addr uint64, rkey uint32, err error)
	ShareSendRing(maker Carrier, mem []byte) (key uint32, err error)
}

// Resumer is a link that outlives the paths under it: a resumable
// session (internal/session), or a stream of a group that moves its
// streams (internal/group). The connection hands it the loss its engine
// found (a silent path: stream.PathDeadError); it reports whether the
// loss is a failure of this side's path, which the connection counts, and
// the link says later, with a Resumed or Ended completion, how it went.
// It is called whenever the engine is suspended, so it ignores a loss it
// already took.
type Resumer interface {
	Lost(cause error) (failure bool)
}

// RingKeyer is a link whose receive rings change while it runs and that
// names any of them (a group's stream, whose rings grew and moved with it):
// the address and key by which the peer writes into mem on the link now.
type RingKeyer interface {
	RingKey(mem []byte) (addr uint64, rkey uint32, ok bool)
}

// PeerRingNamer is a link whose peer named its receive ring before the
// stream began (a link group's stream: the open and its answer carry the
// rings), so that the engine may write into it at once
// (stream.Config.PeerRing) rather than wait for the peer's
// RegisterXferMemory.
type PeerRingNamer interface {
	PeerRing() (addr uint64, size uint32, rkey uint32)
}

// ErrMisuse is wrapped by the errors a link's calls return when the caller
// breaks Link's contract (more requests than Caps allow, a range outside
// the rings, an unknown kind), so that the conformance suite
// (internal/linktest) tells misuse from a broken link.
var ErrMisuse = errors.New("misuse")

// Emptier is a link that knows whether its last Poll took everything it
// had: it polled its completion queue itself, not only what another
// link's poll had set aside for it, and found it short. A caller that
// must leave nothing behind (a poll after Arm) then needs no poll more,
// which finds nothing. A link that says false says nothing.
type Emptier interface {
	Emptied() bool
}

// PathWatcher is a link that shares its path (its device and the peer)
// with other links and knows their progress: when a send last completed
// and a message last arrived on any of them. A connection whose own
// requests wait while the path progresses is queued behind the others on
// a busy device, not cut off (stream.Engine.PathProgress).
type PathWatcher interface {
	PathProgress() (sent, heard time.Time)
}

// SameRing reports whether a and b are the same ring: the same memory,
// as ReleaseRecvRing names a ring.
func SameRing(a, b []byte) bool {
	return len(a) == len(b) && len(a) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// Caps is what one end of a link has.
type Caps struct {
	// SendDepth is how many send requests may be outstanding.
	SendDepth int
	// RecvDepth is how many receives this end keeps posted: how many
	// messages (data or control) the peer may have in flight to it.
	RecvDepth int
	// ControlDepth is how many SendControl requests may be outstanding (the
	// link's slots for control messages).
	ControlDepth int
	// MaxInline is the largest send the device copies at post time
	// (informational: the link decides).
	MaxInline int
	// Name says what the link is, for errors and diagnostics ("rxe0 port 1",
	// "memory").
	Name string
	// Transport is what carries the link: "rdma", "tcp" or "memory", as
	// fallback.Transport names the first two (for metrics and paths, so
	// that a connection never asks which type its link is).
	Transport string
	// RecvCredit: a message that finds no receive posted at the peer ends
	// the connection (iWARP has no receiver-not-ready retry, and its
	// devices may complete a send before the peer took it), so the engine
	// sends none without a receive credit from the peer (Credit's
	// Receives). Both ends of the link agreed on it.
	RecvCredit bool
	// RecvGrant: with RecvCredit, both ends agreed that a receiver may give
	// back more credit than its receives the peer's messages took, or less
	// (wire.FeatureRecvGrant): a link whose receives come from a pool that
	// other links share (a shared receive queue) grants as the pool allows
	// (RecvGranter), and RecvDepth is its first grant.
	RecvGrant bool
	// SpeakSecond: this end accepted the connection on a transport whose
	// passive side must not send before the active side's first message
	// arrived (iWARP's MPA, RFC 5044 and RFC 6581); the engine holds its
	// requests until then.
	SpeakSecond bool
}

// SendKind is what a send request does.
type SendKind uint8

const (
	// SendData sends SendRing()[Off:Off+N] to the peer's ring at Remote
	// (with the peer's RKey); the peer's Poll reports DataArrived with N.
	// It consumes one of the peer's posted receives.
	SendData SendKind = iota + 1
	// SendControl sends the 32 bytes of Msg; the peer's Poll reports
	// ControlArrived with them. It consumes one of the peer's posted receives.
	SendControl
	// SendMarker is a zero-length write to Remote (RKey): nothing arrives at
	// the peer and it consumes no receive. Signaled, its completion tells that
	// everything posted before it completed (as before an orderly close).
	SendMarker
)

func (k SendKind) String() string {
	switch k {
	case SendData:
		return "data"
	case SendControl:
		return "control"
	case SendMarker:
		return "marker"
	}
	return "SendKind(?)"
}

// SendWR is one send request.
type SendWR struct {
	Kind SendKind
	// Signaled asks for a SendDone completion with ID. An unsignaled request
	// completes silently with the next signaled one.
	Signaled bool
	ID       uint64
	// Off and N: SendData's range of SendRing; with Mem set, of
	// Mem.Bytes(), which the link sends from where it is (a MemSender
	// registered it: RegisterMem).
	Off, N uint32
	Mem    *Mem
	// Remote and RKey: where SendData and SendMarker write in the peer's ring.
	Remote uint64
	RKey   uint32
	// Msg: SendControl's message, in wire format.
	Msg [wire.MessageSize]byte
	// Ring and Tag, on a Carrier: SendData sends from the stream ring whose
	// SendKey is Ring (0: SendRing), and the peer's DataArrived reports Tag.
	Ring, Tag uint32
}

// CompletionKind is what a completion reports.
type CompletionKind uint8

const (
	// SendDone: the signaled send request ID completed, and so did every
	// request posted before it.
	SendDone CompletionKind = iota + 1
	// DataArrived: N bytes from the peer landed in RecvRing, after the ones
	// before them (the engine knows where); one posted receive was consumed.
	DataArrived
	// ControlArrived: a control message from the peer, Msg; one posted
	// receive was consumed.
	ControlArrived
	// Disconnected: the connection was disconnected, by either end (the
	// peer closed, or its process died and its kernel disconnected for it;
	// or this end's Disconnect completed). Nothing more arrives.
	Disconnected
	// Failed: the link failed (Err): a request failed, the device or the
	// address went away, the path broke. Nothing more arrives.
	Failed
	// Resumed: a link that outlives its paths (a session's) runs on a new
	// path, over the same rings, after the engine lost the last one: the
	// engine relinks with the link's Caps and RecvRingKey now.
	Resumed
	// Ended: such a link has no path, and will have none (Err: why; the
	// stream's ErrPeerLeftLink when the peer left its last path and did not
	// come back).
	Ended
)

func (k CompletionKind) String() string {
	switch k {
	case SendDone:
		return "send-done"
	case DataArrived:
		return "data-arrived"
	case ControlArrived:
		return "control-arrived"
	case Disconnected:
		return "disconnected"
	case Failed:
		return "failed"
	case Resumed:
		return "resumed"
	case Ended:
		return "ended"
	}
	return "CompletionKind(?)"
}

// Completion is one completion: a send request finished, a message arrived,
// or the link went down.
type Completion struct {
	Kind CompletionKind
	ID   uint64 // SendDone
	N    uint32 // DataArrived
	Tag  uint32 // DataArrived on a Carrier: the SendWR's Tag
	Msg  [wire.MessageSize]byte
	Err  error // Failed, Ended
}

// ErrWoken is Wait's answer to Wake.
var ErrWoken = errors.New("link: woken")

// ErrDown is matched by the Err of a Failed completion whose link went down
// without a request failing (a device removed, an address changed): a path
// failure, where another path may work.
var ErrDown = errors.New("link: down")
