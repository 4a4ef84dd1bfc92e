package rdmanet

import (
	"errors"
	"sync/atomic"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// ConnErrorKind classifies an error on an established RDMA connection: the
// field's "RDMA errors" beside failed connection attempts. The kinds are a
// fixed set (AllConnErrorKinds), so that a metric labelled by them stays small.
type ConnErrorKind string

const (
	// ErrorRetryExceeded: a work request failed because the device's
	// transport or RNR retries ran out (the peer or the path went away,
	// or a lossy network dropped too much).
	ErrorRetryExceeded ConnErrorKind = "retry-exceeded"
	// ErrorWorkCompletion: a work request failed with another error status.
	ErrorWorkCompletion ConnErrorKind = "work-completion"
	// ErrorLinkDown: the queue pair went to error with no completion to
	// explain it, or the device or address went away.
	ErrorLinkDown ConnErrorKind = "link-down"
	// ErrorDeadPath: the keepalive found the path silent (requests did
	// not complete within twice Config.KeepAlive): a keepalive loss.
	ErrorDeadPath ConnErrorKind = "dead-path"
	// ErrorProtocol: the peer broke the wire protocol.
	ErrorProtocol ConnErrorKind = "protocol"
	// ErrorPeerClosed: a Write found that the peer had disconnected (as
	// EPIPE does on TCP): it closed or died in mid-stream.
	ErrorPeerClosed ConnErrorKind = "peer-closed"
	// ErrorOther: any other failure.
	ErrorOther ConnErrorKind = "other"
)

// connErrorKinds lists every kind; metrics number them by their place here.
var connErrorKinds = [...]ConnErrorKind{
	ErrorRetryExceeded, ErrorWorkCompletion, ErrorLinkDown, ErrorDeadPath,
	ErrorProtocol, ErrorPeerClosed, ErrorOther,
}

// AllConnErrorKinds lists every ConnErrorKind.
func AllConnErrorKinds() []ConnErrorKind { return append([]ConnErrorKind(nil), connErrorKinds[:]...) }

// reasons are the fallback reasons, in fallback's order.
var reasons = fallback.AllReasons()

// ConnErrorKindOf says which kind of connection error err is (an error
// from a Conn's Read or Write, for example), as ReadMetrics counts it.
func ConnErrorKindOf(err error) ConnErrorKind {
	var wc *verbs.WCError
	var dead *stream.PathDeadError
	var proto *wire.ProtocolError
	switch {
	case errors.As(err, &dead):
		return ErrorDeadPath
	case errors.As(err, &wc):
		if wc.Status == verbs.WCRetryExcErr || wc.Status == verbs.WCRNRRetryExcErr {
			return ErrorRetryExceeded
		}
		return ErrorWorkCompletion
	case errors.As(err, &proto):
		return ErrorProtocol
	case errors.Is(err, stream.ErrPeerClosed):
		return ErrorPeerClosed
	case errors.Is(err, link.ErrDown):
		return ErrorLinkDown
	}
	return ErrorOther
}

// metrics are the package's counters beyond fallback.Counters.
var metrics struct {
	connectFailures []atomic.Uint64 // by reasons' order
	connErrors      [len(connErrorKinds)]atomic.Uint64
	// Link groups (issue 25): groups made and streams opened in them, by
	// side (dialed, accepted).
	groupsMade, groupStreams [2]atomic.Uint64
	groupMoves               [3]atomic.Uint64 // by group.MoveKind
}

// sideIndex numbers the sides for the counters by side.
func sideIndex(side string) int {
	if side == sideAccepted {
		return 1
	}
	return 0
}

func init() { metrics.connectFailures = make([]atomic.Uint64, len(reasons)) }

// countConnectFailure counts an RDMA connection attempt that failed.
func countConnectFailure(r fallback.Reason) {
	for i, x := range reasons {
		if x == r {
			metrics.connectFailures[i].Add(1)
			return
		}
	}
}

// countConnError counts an error on an established connection.
func countConnError(err error) {
	k := ConnErrorKindOf(err)
	for i, x := range connErrorKinds {
		if x == k {
			metrics.connErrors[i].Add(1)
			return
		}
	}
}

// Metrics are the package's counters at one moment, for a program's
// monitoring: connections by transport and fallbacks by reason, and what
// happens to connections once they are made. ReadMetrics is the one reader
// of them all (Stats and SessionStats, older, return subsets). Every
// counter only grows over the life of the process, except Open.
type Metrics struct {
	fallback.Snapshot // connections by transport, fallbacks by reason

	// ConnectFailures counts the dials whose RDMA connection attempt
	// failed, by reason (rejected, timeout, unreachable, resources,
	// rdma-error): a subset of Fallbacks, which also counts the dials that
	// did not try (no device, a route without RDMA, the policy).
	ConnectFailures map[fallback.Reason]uint64
	// ConnErrors counts the errors on established RDMA connections by
	// kind: each connection's failure once, and each link a resumable
	// session loses (it then fails over, see Sessions).
	ConnErrors map[ConnErrorKind]uint64

	// Open is how many RDMA connections are open now (Connections).
	Open int
	// BytesSent and BytesReceived count the bytes that Write took and Read
	// returned on every RDMA connection; RequestsPosted and
	// MessagesArrived the RDMA work requests posted (writes and control
	// messages) and the peers' messages that arrived.
	BytesSent, BytesReceived        uint64
	RequestsPosted, MessagesArrived uint64

	// Sessions counts the moves of resumable sessions: failovers by reason
	// and transports, and failbacks (Reason "failback").
	Sessions map[SessionMove]uint64

	// Groups counts the link groups made (issue 25), and GroupStreams the
	// connections made as streams in them, by side ("dialed",
	// "accepted"); GroupsOpen is how many groups are open now (Groups).
	Groups, GroupStreams map[string]uint64
	GroupsOpen           int
	// GroupMoves counts the streams of link groups that moved to another
	// link of their group, by kind: "failover" (their link failed),
	// "rebalance" (off a link that works, onto one that joined or healed),
	// and "failed" (their link failed and none took them in time).
	GroupMoves map[string]uint64

	// AsyncEvents counts the RDMA devices' asynchronous events read
	// (ibv_get_async_event), by type: "PORT_ERR", "PORT_ACTIVE",
	// "QP_FATAL", "CQ_ERR", "SRQ_LIMIT_REACHED", ... and "unknown". They
	// are read while a device has connections (AsyncEventError).
	AsyncEvents map[string]uint64
}

// AsyncEventError is the error of a connection that its device's
// asynchronous event ended (a port that went down, a queue pair or CQ
// error, a device failure), at once rather than after its keepalive. It
// is a path failure (ConnErrorKindOf says ErrorLinkDown; a session moves) unless
// the event blamed the connection's own requests.
type AsyncEventError = rdmalink.AsyncEventError

// ReadMetrics returns the package's counters.
func ReadMetrics() Metrics {
	m := Metrics{
		Snapshot:        counters.Snapshot(),
		ConnectFailures: make(map[fallback.Reason]uint64, len(reasons)),
		ConnErrors:      make(map[ConnErrorKind]uint64, len(connErrorKinds)),
		Sessions:        sessionMoveCounts(),
		AsyncEvents:     rdmalink.AsyncEventCounts(),
	}
	for i, r := range reasons {
		m.ConnectFailures[r] = metrics.connectFailures[i].Load()
	}
	for i, k := range connErrorKinds {
		m.ConnErrors[k] = metrics.connErrors[i].Load()
	}
	m.Groups, m.GroupStreams = map[string]uint64{}, map[string]uint64{}
	for i, side := range []string{sideDialed, sideAccepted} {
		m.Groups[side] = metrics.groupsMade[i].Load()
		m.GroupStreams[side] = metrics.groupStreams[i].Load()
	}
	m.GroupsOpen = openGroups()
	m.GroupMoves = map[string]uint64{}
	for k := range metrics.groupMoves {
		m.GroupMoves[group.MoveKind(k).String()] = metrics.groupMoves[k].Load()
	}
	t := liveTotals()
	m.Open, m.BytesSent, m.BytesReceived, m.RequestsPosted, m.MessagesArrived = t.open, t.sent, t.received, t.posted, t.arrived
	return m
}
