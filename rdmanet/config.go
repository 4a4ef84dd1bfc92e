package rdmanet

import (
	"fmt"
	"os"
	"time"

	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/wire"
)

// Config sizes a connection's registered memory and queues. The zero value
// means the defaults.
//
// A connection starts with small rings (16 KiB to receive, 4 KiB to send)
// and grows them to RecvBuffer and SendBuffer as it streams; with its 32
// bytes per receive and control slot an idle connection uses 32 KiB of
// registered memory and a streaming one 528 KiB with the defaults
// (Config.Footprint). Both come from pools registered once per device and
// peer. Registered memory is locked and counts against RLIMIT_MEMLOCK
// (rdmanet raises the soft limit to the hard limit, and registration fails
// beyond it; a resumable session's rings keep their size). A connection
// holds no file descriptor of its own: each device's completion channel
// and the process's rdma_cm event channel are shared.
type Config struct {
	// RecvBuffer is the receive buffer the peer writes into, in bytes
	// (default 256 KiB; Valkey's own is 1 MiB). Rounded up to whole pages.
	RecvBuffer int
	// SendBuffer is the transmit ring written data is copied into before it
	// is sent (default 256 KiB).
	SendBuffer int
	// RecvDepth is how many receives are kept posted (default 255): messages
	// and writes the peer may have in flight before this side's completions
	// are taken. A depth one below a power of two fits every provider's
	// queue exactly: Soft-RoCE makes a queue of n entries with the next
	// power of two above n slots, so 256 would take 512.
	RecvDepth int
	// KeepAlive is how often an idle connection sends Keepalive (default 3 s,
	// as Valkey's server; negative disables); while other connections to
	// the same peer on the device are busy, which proves the path alive,
	// up to 4 x KeepAlive, so that thousands of idle connections do not
	// load the device with keepalives. It also bounds how long a
	// request may wait for its completion: a request posted to a peer that
	// is gone without a disconnect (its host died, the network or the link
	// broke, the device went silent) fails the connection when no send
	// completed for 2 x KeepAlive while it waited, on it or on any other
	// connection to the same peer on the device. So a dead path ends Reads
	// and Writes within 3 x KeepAlive, with an error whose Timeout() is true;
	// a busy machine, where completions are late but come, is not one: a
	// connection that waits behind others that progress (a device with
	// thousands of connections, in the lab) ends only after 10 x KeepAlive.
	KeepAlive time.Duration
	// BusyPoll is how a blocked Read or Write waits for its completions.
	// Only the blocked Read or Write polls, never a goroutine of the
	// connection's own, and it yields the CPU between polls.
	//
	// Default 0, adaptive: a Read or Write that has to wait, on a
	// connection whose recent waits for its peer were mostly quick (under
	// 1 ms, or, for the answer to what it wrote, answered while it
	// polled), polls for up to four times the longest of them (2 ms at
	// most; 5 ms for an answer) before it sleeps in the netpoller, as the
	// kernel's hybrid block polling does: a request and its answer cost
	// no wake-up when the answer is quick. A connection whose waits
	// were mostly longer (three in a row), or that waited for nothing in
	// the last 10 ms, sleeps at once: an idle connection never polls.
	// Every 16th wait of a connection that sleeps polls all the same, as
	// a probe, since both ends sleeping can be what makes the waits long;
	// an answer that comes while it polls makes it poll again. At most
	// GOMAXPROCS connections of a process poll at once; the others sleep.
	//
	// Positive: a busy connection polls for up to this long before it
	// sleeps, trading CPU for latency (rsockets spins about 10 us; under
	// the lab's emulated CPU 1 ms fits); a connection whose last sleep
	// lasted more than 10 x BusyPoll is taken to be idle and sleeps at
	// once. Such a connection keeps a queue pair of its own (no link
	// group): it polls its own completion queue. Either way a connection
	// that polls and takes turns (a Read after its write) leaves its
	// queue unarmed for 5 ms after a Read, since its next Read polls:
	// its completions raise no events. Negative: always sleep.
	// See BENCHMARKS.md.
	BusyPoll time.Duration
	// ResumeTimeout, when positive, makes the connection a resumable
	// session if the peer is rdmanet and agrees (docs/protocol.md): when
	// its path fails, the dialing side moves it to another RDMA path
	// (Dialer.FailoverAddrs), or to TCP to the same server port, with
	// nothing lost, and the application sees a pause. It bounds how long
	// the session may go without a link before it ends with a
	// *ResumeError. A peer that closes says so, and its close ends the
	// session at once. A link the peer ends without closing (it let go of
	// a path it took for dead, or its process died) ends the session as
	// the peer's close only if the peer does not come back: the server
	// waits KeepAlive + 3 s for the dialer to ask to resume, the dialer
	// tries the server's address again and finds whether anything still
	// listens there. Both sides must set it. Zero: no sessions (the
	// default: a session gives up on a vanished peer only after
	// ResumeTimeout, not within 3 x KeepAlive; see the README).
	ResumeTimeout time.Duration
	// FailbackInterval is how often, at most, a session that runs on
	// another path than its first (another RDMA path, or TCP) tries to move
	// back to the first, and from TCP to any RDMA path, in the dialer's
	// order (default 30 s; negative: never). A try that fails
	// doubles the wait, up to 8 x FailbackInterval. The move is made before
	// the old link is let go, so it costs no more than a resume.
	FailbackInterval time.Duration
	// PeerMemory bounds the registered memory that the connections with
	// one peer may hold on a device, rings and slots together, so that one
	// peer cannot take what others need (default: half of what
	// RLIMIT_MEMLOCK allows where it binds, at least 1 MiB; 4 GiB where it
	// does not bind; negative: no bound). Connections with other bounds have pools of
	// their own. Beyond it a connection is refused with a *PeerMemoryError (a listener
	// rejects the dial for resources, so a dialer on "tcp" falls back to
	// TCP), and a connection's rings stop growing.
	PeerMemory int
	// FixedRings makes a connection start with rings of RecvBuffer and
	// SendBuffer and keep them, as setting SO_RCVBUF turns off TCP's
	// autotuning: a connection that streams from its first byte does not
	// ramp up, at the price of its full registered memory while idle
	// (Config.Footprint). A resumable session's rings are fixed anyway.
	FixedRings bool
	// NoLinkGroups gives every connection to an rdmanet peer a queue pair
	// of its own, as Valkey's peers get. By default connections between
	// two rdmanet processes are streams of a link group (docs/engine.md,
	// "Link groups"): the first dial to a listener makes the group, an
	// RDMA connection to each of the listener's addresses the dialer
	// knows (the address dialed and Dialer.FailoverAddrs), and every later
	// dial to it opens a stream in one message and its answer, with no
	// queue pair, rdma_cm exchange or registration of its own. A group
	// finds a dead path once for all its streams and moves them to its
	// other links, or to one TCP connection to the listener's port when
	// no RDMA path is left, and back when one heals; a stream that finds
	// no link within 15 s (a partition; the listener's wait 3 x
	// KeepAlive more) fails with a *GroupMoveError, whose Timeout() is
	// true, and when every path is down and the listener's
	// host refuses TCP, the streams fail at once (the listener's process
	// is gone: within 3 x KeepAlive of its death). A connection that is a
	// session (ResumeTimeout), speaks Valkey's protocol, busy-polls
	// (BusyPoll) or keeps fixed rings (FixedRings) gets a queue pair of its
	// own, as does one to a listener that makes no groups (an older
	// rdmanet, or one with NoLinkGroups), one beyond the peer's bounds on
	// streams and memory, and one dialed while the group has only its TCP
	// link. RecvDepth sizes connections of their own only: a stream's
	// credit comes from its group's receives.
	NoLinkGroups bool
	// GroupSpread picks the link of its group a new stream opens on
	// (default SpreadLeastStreams). Only the dialer's counts.
	GroupSpread GroupSpread

	// ValkeyCompatible makes the connection speak Valkey's protocol only:
	// a dialer sends no Hello, a listener accepts no extension. Without it,
	// two rdmanet peers negotiate the ring and half-close (docs/protocol.md),
	// and a Valkey peer gets Valkey's protocol anyway.
	ValkeyCompatible bool

	// linkNeeds adds to the link features the device needs: tests run
	// the iWARP data path (write notices, receive credit) on Soft-RoCE.
	linkNeeds wire.Features
	// sharedRecv: a listener's connections from dialers that take credit
	// grants take their receives from a shared receive queue per device
	// and peer (internal/rdmalink/sharedrecv.go). Tests only, until make
	// bench has measured it beside receives of each connection's own; its
	// connections are connections of their own, not a group's streams.
	sharedRecv bool
}

// GroupSpread is how a link group picks the link a new stream opens on.
type GroupSpread uint8

const (
	// SpreadLeastStreams opens a stream on the RDMA link of its group with
	// the fewest streams: connections spread over every path.
	SpreadLeastStreams GroupSpread = iota
	// SpreadFirstLink opens every stream on the group's first RDMA link
	// that works; the others stand by for failover (an active-backup bond).
	SpreadFirstLink
)

func (p GroupSpread) String() string {
	switch p {
	case SpreadLeastStreams:
		return "least-streams"
	case SpreadFirstLink:
		return "first-link"
	}
	return fmt.Sprintf("GroupSpread(%d)", uint8(p))
}

// extensions are the features this side offers or accepts.
func (c Config) extensions() wire.Features {
	if c.ValkeyCompatible {
		return 0
	}
	if c.ResumeTimeout > 0 {
		return wire.FeatureRing | wire.FeatureShutdown | wire.FeatureResume | wire.FeatureClose | wire.FeatureGrow | wire.FeatureEndAt
	}
	return wire.FeatureRing | wire.FeatureShutdown | wire.FeatureGrow | wire.FeatureEndAt
}

// hello is what this side puts in connect or accept private data.
func (c Config) hello(features wire.Features) []byte {
	if features == 0 {
		return nil
	}
	return c.helloOf(features).Encode()
}

// helloOf is this side's Hello with features.
func (c Config) helloOf(features wire.Features) wire.Hello {
	h := wire.Hello{Version: wire.HelloVersion, Features: features, RecvDepth: uint16(c.RecvDepth), RingSize: uint32(c.RecvBuffer)}
	if features&wire.FeatureResume != 0 {
		h.SendRing = uint32(c.SendBuffer)
	} else {
		// Not a session: the rings start small and grow (firstRings).
		h.RingSize = uint32(c.firstRings().RecvBuffer)
	}
	return h
}

const (
	defaultBuffer    = 256 << 10
	defaultRecvDepth = 255
	defaultKeepAlive = 3 * time.Second
	// sendQueueDepth is the send queue's size: outstanding RDMA writes and
	// control messages. 255, not 256, for the reason RecvDepth's default
	// is: with 256, Soft-RoCE maps 512 send entries of 512 bytes each
	// into the process (lab, 200 pairs: 342 KiB of queues an end with
	// 256 and 256, 222 KiB with 255 and 255).
	sendQueueDepth = 255
	// controlSlots is how many control messages may be in flight at once.
	controlSlots = 16
	// A connection that is not a session starts with rings of these sizes
	// (or Config's, if smaller) and grows them as it streams, up to
	// Config's (docs/protocol.md, "Rings that follow traffic"): 16 KiB for
	// the peer to write into, 4 KiB to copy writes into, which the first
	// write that fills it doubles. With the receive slots, an idle end
	// pins 32 KiB. After shrinkAfter without data they are small again.
	firstRecvBuffer = 16 << 10
	firstSendBuffer = 4 << 10
	shrinkAfter     = 15 * time.Second
	// transportRetries is how often an unacknowledged packet is sent again.
	transportRetries = 6
	// groupAckTimeout is a group link's wait for an acknowledgement before
	// a packet is sent again, as 4.096 us * 2^groupAckTimeout: 134 ms, as
	// SMC-R's links (SMC_QP_TIMEOUT). With transportRetries a link that
	// loses every packet fails in about 0.94 s of sending, where rdma_cm's
	// default on RoCE took 14.5 s in the lab (docs/lab.md: about 2.1 s a
	// try) and the keepalive's "no send completed" 2 x KeepAlive: the
	// group moves all its streams at once,
	// so a link found dead early costs one move, not a connection.
	groupAckTimeout = 15
	// minRing is the smallest ring Config allows.
	minRing = 4 << 10
)

func (c Config) withDefaults() (Config, error) {
	if c.RecvBuffer == 0 {
		c.RecvBuffer = defaultBuffer
	}
	if c.SendBuffer == 0 {
		c.SendBuffer = defaultBuffer
	}
	if c.RecvDepth == 0 {
		c.RecvDepth = defaultRecvDepth
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = defaultKeepAlive
	}

	switch {
	case c.RecvBuffer < minRing || c.RecvBuffer > 1<<30:
		return c, fmt.Errorf("rdmanet: RecvBuffer %d outside 4 KiB to 1 GiB", c.RecvBuffer)
	case c.SendBuffer < minRing || c.SendBuffer > 1<<30:
		return c, fmt.Errorf("rdmanet: SendBuffer %d outside 4 KiB to 1 GiB", c.SendBuffer)
	case c.RecvDepth < 2 || c.RecvDepth > 16384:
		return c, fmt.Errorf("rdmanet: RecvDepth %d outside 2 to 16384", c.RecvDepth)
	}
	return c, nil
}

func (c Config) sendDepth() int { return sendQueueDepth }

// linkConfig is what the RDMA link of a connection with this Config holds
// at its largest: a session's, whose rings keep their size.
func (c Config) linkConfig() rdmalink.Config {
	return rdmalink.Config{
		SendBuffer: c.SendBuffer, RecvBuffer: c.RecvBuffer,
		SendDepth: c.sendDepth(), RecvDepth: c.RecvDepth, ControlDepth: controlSlots,
		Needs: c.linkNeeds, PeerBound: int64(c.PeerMemory),
	}
}

// firstRings is the link of a connection that is not a session, as it
// starts: small rings, which the engine grows.
func (c Config) firstRings() rdmalink.Config {
	lc := c.linkConfig()
	if c.FixedRings {
		return lc
	}
	lc.SendBuffer, lc.RecvBuffer = min(c.SendBuffer, firstSendBuffer), min(c.RecvBuffer, firstRecvBuffer)
	return lc
}

// Footprint is what one RDMA connection end holds.
type Footprint struct {
	// RegisteredBytes is the memory an idle connection uses of what is
	// registered with a RoCE or InfiniBand device, locked and counted
	// against RLIMIT_MEMLOCK (unless the process has CAP_IPC_LOCK): its
	// rings and its receive and control slots. They are chunks of pools
	// registered once per device and peer (with the defaults 16 and 4 KiB
	// of rings, 8 KiB of receive slots, 4 KiB of control slots: 32 KiB);
	// a pool pins up to 15 chunks of each size beyond those in use, and
	// keeps up to 256 KiB of slabs with none in use for the next
	// connections. A
	// session's rings are registered on their own, whole. The queues' own
	// memory is apart, in Queues.
	RegisteredBytes int
	// StreamingRegisteredBytes is RegisteredBytes while the connection
	// streams: its rings grow to RecvBuffer and SendBuffer, and go back
	// after 15 s without data. A session's are the same as when idle.
	StreamingRegisteredBytes int
	// IWARPRegisteredBytes is RegisteredBytes on an iWARP device that
	// cannot send 32 bytes inline: with no immediate data there, a notice
	// slot per send queue entry is registered too (docs/protocol.md,
	// "iWARP"). Where it can (siw), the notices pin nothing.
	IWARPRegisteredBytes int
	// FileDescriptors a connection holds of its own: none. A device's
	// completion channel is shared by every connection on it, and the
	// rdma_cm event channel by every connection of the process (each a
	// descriptor and its netpoller duplicate, made with the first
	// connection and gone with the last).
	FileDescriptors int
	// SessionFileDescriptors is what a dialed end of a resumable session
	// (ResumeTimeout) holds beyond FileDescriptors: the socket that
	// reserves its TCP port, to resume over TCP from it. Zero without
	// ResumeTimeout, for an accepted end, and where sessions cannot resume
	// over TCP.
	SessionFileDescriptors int
	// Queues is what an end's queues take of the device provider's own
	// memory, beside RegisteredBytes, for each provider whose sizes
	// rdmanet knows: Soft-RoCE ("rxe") and Soft-iWARP ("siw"), where it is
	// kernel memory mapped into the process (in its RSS, not pinned; with
	// the defaults, about 150 and 110 KiB, most of it the send queue and
	// the completion entries it reserves). Hardware providers allocate
	// their queues in the process and pin them (mlx5's send queues), at
	// sizes that depend on the device: they are not listed.
	Queues []QueueFootprint
	// Goroutines an idle connection holds of its own: none, as in Go's
	// net. A blocked Read or Write takes its completions in its own
	// goroutine; what comes while none waits is taken by a goroutine that
	// lives only that long; each device has one dispatcher for all its
	// connections; a closed connection delivers what it wrote in one, for
	// up to 5 s.
	Goroutines int
}

// QueueFootprint is what one connection end's queues take of a device
// provider's memory.
type QueueFootprint struct {
	Provider string // the kernel driver: "rxe" or "siw"
	// SendQueue and RecvQueue are the end's queue pair's, as mapped
	// (whole pages).
	SendQueue, RecvQueue int
	// CompletionShare is the end's part of a completion queue that the
	// device's connections share: the entries it reserves there.
	CompletionShare int
	// Pinned: counted against RLIMIT_MEMLOCK (false for rxe and siw).
	Pinned bool
}

// Bytes is the end's whole share.
func (q QueueFootprint) Bytes() int { return q.SendQueue + q.RecvQueue + q.CompletionShare }

// queueFootprints is Footprint.Queues for a link made with lc.
func queueFootprints(lc rdmalink.Config) []QueueFootprint {
	var qs []QueueFootprint
	for _, p := range []struct {
		name    string
		notices bool
	}{{rdmalink.ProviderRXE, false}, {rdmalink.ProviderSIW, true}} {
		if sq, rq, cq, ok := rdmalink.QueueMemoryOf(p.name, lc, p.notices); ok {
			qs = append(qs, QueueFootprint{Provider: p.name, SendQueue: sq, RecvQueue: rq, CompletionShare: cq})
		}
	}
	return qs
}

// fdsPerConn is Footprint.FileDescriptors; TestLabFootprint counts them.
const fdsPerConn = 0

// goroutinesPerConn is Footprint.Goroutines;
// TestIdleConnectionsHaveNoGoroutine and TestLabManyConnections count them.
const goroutinesPerConn = 0

// Footprint returns what one connection with this Config holds, or the
// error Dial and Listen would give for the Config.
func (c Config) Footprint() (Footprint, error) {
	c, err := c.withDefaults()
	if err != nil {
		return Footprint{}, err
	}
	idle, streaming := c.firstRings(), c.linkConfig()
	var ownRings int // a session's rings, registered whole on each link
	if c.ResumeTimeout > 0 {
		page := os.Getpagesize()
		pages := func(n int) int { return (n + page - 1) / page * page }
		ownRings = pages(c.RecvBuffer) + pages(c.SendBuffer)
		idle.SendBuffer, idle.RecvBuffer = 0, 0
		streaming = idle
	}
	fp := Footprint{
		RegisteredBytes:          ownRings + rdmalink.Registered(idle, false),
		StreamingRegisteredBytes: ownRings + rdmalink.Registered(streaming, false),
		IWARPRegisteredBytes:     ownRings + rdmalink.Registered(idle, true),
		Queues:                   queueFootprints(idle),
		FileDescriptors:          fdsPerConn,
		Goroutines:               goroutinesPerConn,
	}
	if c.ResumeTimeout > 0 {
		fp.SessionFileDescriptors = sessionPortFDs
	}
	return fp, nil
}
