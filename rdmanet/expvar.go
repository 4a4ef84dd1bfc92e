package rdmanet

import (
	"cmp"
	"expvar"
	"slices"
)

// PublishExpvar publishes the package's metrics (ReadMetrics) as the
// expvar variable name, so that they appear in /debug/vars beside the
// runtime's. It is not done at init, since a program may not want it and
// expvar.Publish panics on a name published twice: call it once, e.g.
// rdmanet.PublishExpvar("rdmanet"). The value is a JSON object:
//
//	{"dialed": {"rdma": 3, "tcp": 1}, "accepted": {...},
//	 "fallbacks": {"no-device": 1, ...}, "connect_failures": {"timeout": 1, ...},
//	 "conn_errors": {"retry-exceeded": 0, ...}, "open": 2,
//	 "bytes_sent": ..., "bytes_received": ..., "requests_posted": ..., "messages_arrived": ...,
//	 "session_moves": [{"reason": "dead-path", "from": "rdma", "to": "tcp", "count": 1}],
//	 "async_events": {"PORT_ERR": 1, "PORT_ACTIVE": 0, ..., "unknown": 0}}
func PublishExpvar(name string) {
	expvar.Publish(name, expvar.Func(func() any { return ReadMetrics().jsonValue() }))
}

// sessionMoveJSON is one SessionMove count, as expvar shows it.
type sessionMoveJSON struct {
	Reason string `json:"reason"`
	From   string `json:"from"`
	To     string `json:"to"`
	Count  uint64 `json:"count"`
}

// jsonValue is m with string keys only, as encoding/json needs.
func (m Metrics) jsonValue() map[string]any {
	moves := make([]sessionMoveJSON, 0, len(m.Sessions))
	for k, n := range m.Sessions {
		moves = append(moves, sessionMoveJSON{Reason: k.Reason, From: string(k.From), To: string(k.To), Count: n})
	}
	slices.SortFunc(moves, func(a, b sessionMoveJSON) int {
		return cmp.Or(cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To))
	})
	return map[string]any{
		"dialed":           m.Dialed,
		"accepted":         m.Accepted,
		"fallbacks":        m.Fallbacks,
		"connect_failures": m.ConnectFailures,
		"conn_errors":      m.ConnErrors,
		"open":             m.Open,
		"bytes_sent":       m.BytesSent,
		"bytes_received":   m.BytesReceived,
		"requests_posted":  m.RequestsPosted,
		"messages_arrived": m.MessagesArrived,
		"session_moves":    moves,
		"async_events":     m.AsyncEvents,
	}
}
