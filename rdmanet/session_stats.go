package rdmanet

import (
	"maps"
	"sync"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/link"
)

// SessionMove is one kind of move of a session from a link to the next:
// why it left the old link, and the transports of both.
type SessionMove struct {
	// Reason is why the old link was left: "dead-path" (keepalive found
	// it), "link-down" (a queue-pair error, a device or address event, a
	// broken TCP connection), "peer-left" (the peer let go of the link
	// without closing: its keepalive found the path dead first, or its
	// device failed), "peer-resumed" (the peer resumed the session
	// elsewhere: it found the path dead first), or "failback" (the dialer
	// moved back to its first path, or from TCP to an RDMA path).
	Reason   string
	From, To fallback.Transport
}

// sessionMoves counts the process's session moves.
var sessionMoves struct {
	mu sync.Mutex
	m  map[SessionMove]uint64
}

// SessionStats returns how many times sessions moved, by reason and by
// transports: failovers, and failbacks (Reason "failback").
//
// Deprecated: ReadMetrics returns these counters (Metrics.Sessions) with
// the package's others.
func SessionStats() map[SessionMove]uint64 { return sessionMoveCounts() }

// sessionMoveCounts is a copy of the session moves counted so far.
func sessionMoveCounts() map[SessionMove]uint64 {
	sessionMoves.mu.Lock()
	defer sessionMoves.mu.Unlock()
	return maps.Clone(sessionMoves.m)
}

func countMove(m SessionMove) {
	sessionMoves.mu.Lock()
	defer sessionMoves.mu.Unlock()
	if sessionMoves.m == nil {
		sessionMoves.m = make(map[SessionMove]uint64)
	}
	sessionMoves.m[m]++
}

// transportOfLink names a link's transport ("memory" for the tests' pipes).
func transportOfLink(l link.Link) fallback.Transport {
	return fallback.Transport(l.Caps().Transport)
}
