// Package prometheus exports rdmanet's metrics (rdmanet.ReadMetrics) to
// Prometheus. It is a Go module of its own, so that programs using rdmanet
// without Prometheus do not depend on its client library:
//
//	import rdmanetprom "github.com/rdmanet/sdk/metrics/prometheus"
//
//	prometheus.MustRegister(rdmanetprom.NewCollector())
//
// The metrics follow Prometheus' conventions: counters end in _total, byte
// counts say bytes, and every label has a fixed, small set of values
// (transports, sides, fallback reasons, error kinds, session move reasons).
// Values are read when Prometheus scrapes; nothing is counted twice.
package prometheus

import (
	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
)

// Collector collects rdmanet's metrics. It is a prom.Collector.
type Collector struct {
	connections, fallbacks, connectFailures, connErrors *prom.Desc
	open, bytes, requests, messages, sessionMoves       *prom.Desc
	groups, groupStreams, groupsOpen, groupMoves        *prom.Desc
}

// NewCollector returns a collector of the process's rdmanet metrics.
// Register it once: the metrics are the process's, not the collector's.
func NewCollector() *Collector {
	return &Collector{
		connections: prom.NewDesc("rdmanet_connections_total",
			"Connections made by rdmanet, by transport (rdma, tcp) and side (dialed, accepted).",
			[]string{"transport", "side"}, nil),
		fallbacks: prom.NewDesc("rdmanet_fallbacks_total",
			"Dials and listeners that could not use RDMA, by reason, whether they then used TCP or failed.",
			[]string{"reason"}, nil),
		connectFailures: prom.NewDesc("rdmanet_connect_failures_total",
			"Dials whose RDMA connection attempt failed, by reason.",
			[]string{"reason"}, nil),
		connErrors: prom.NewDesc("rdmanet_connection_errors_total",
			"Errors on established RDMA connections, by kind (retry-exceeded, work-completion, link-down, dead-path, protocol, peer-closed, other).",
			[]string{"kind"}, nil),
		open: prom.NewDesc("rdmanet_connections_open",
			"RDMA connections open now.", nil, nil),
		bytes: prom.NewDesc("rdmanet_bytes_total",
			"Bytes written to (sent) and read from (received) RDMA connections.",
			[]string{"direction"}, nil),
		requests: prom.NewDesc("rdmanet_work_requests_posted_total",
			"RDMA work requests posted: data writes and control messages.", nil, nil),
		messages: prom.NewDesc("rdmanet_messages_arrived_total",
			"Messages (data writes and control messages) that arrived from peers.", nil, nil),
		sessionMoves: prom.NewDesc("rdmanet_session_moves_total",
			"Moves of resumable sessions to another link: failovers by reason, and failbacks (reason failback), with the transports left and taken.",
			[]string{"reason", "from", "to"}, nil),
		groups: prom.NewDesc("rdmanet_groups_total",
			"Link groups made: RDMA connections that carry connections as streams, by side (dialed, accepted).",
			[]string{"side"}, nil),
		groupStreams: prom.NewDesc("rdmanet_group_streams_total",
			"Connections made as streams of link groups, by side (dialed, accepted).",
			[]string{"side"}, nil),
		groupsOpen: prom.NewDesc("rdmanet_groups_open",
			"Link groups open now.", nil, nil),
		groupMoves: prom.NewDesc("rdmanet_group_stream_moves_total",
			"Streams of link groups moved to another link of their group, by kind: failover (their link failed), rebalance (onto a link that joined or healed), failed (no link took them in time).",
			[]string{"kind"}, nil),
	}
}

// Describe sends the metrics' descriptions.
func (c *Collector) Describe(ch chan<- *prom.Desc) {
	for _, d := range []*prom.Desc{c.connections, c.fallbacks, c.connectFailures, c.connErrors,
		c.open, c.bytes, c.requests, c.messages, c.sessionMoves, c.groups, c.groupStreams, c.groupsOpen, c.groupMoves} {
		ch <- d
	}
}

// Collect reads rdmanet's metrics and sends them.
func (c *Collector) Collect(ch chan<- prom.Metric) {
	m := rdmanet.ReadMetrics()
	counter := func(d *prom.Desc, v uint64, labels ...string) {
		ch <- prom.MustNewConstMetric(d, prom.CounterValue, float64(v), labels...)
	}
	for _, t := range []fallback.Transport{fallback.RDMA, fallback.TCP} {
		counter(c.connections, m.Dialed[t], string(t), "dialed")
		counter(c.connections, m.Accepted[t], string(t), "accepted")
	}
	for _, r := range fallback.AllReasons() {
		counter(c.fallbacks, m.Fallbacks[r], string(r))
		counter(c.connectFailures, m.ConnectFailures[r], string(r))
	}
	for _, k := range rdmanet.AllConnErrorKinds() {
		counter(c.connErrors, m.ConnErrors[k], string(k))
	}
	ch <- prom.MustNewConstMetric(c.open, prom.GaugeValue, float64(m.Open))
	counter(c.bytes, m.BytesSent, "sent")
	counter(c.bytes, m.BytesReceived, "received")
	counter(c.requests, m.RequestsPosted)
	counter(c.messages, m.MessagesArrived)
	for mv, n := range m.Sessions {
		counter(c.sessionMoves, n, mv.Reason, string(mv.From), string(mv.To))
	}
	for _, side := range []string{"dialed", "accepted"} {
		counter(c.groups, m.Groups[side], side)
		counter(c.groupStreams, m.GroupStreams[side], side)
	}
	ch <- prom.MustNewConstMetric(c.groupsOpen, prom.GaugeValue, float64(m.GroupsOpen))
	for kind, n := range m.GroupMoves {
		counter(c.groupMoves, n, kind)
	}
}

var _ prom.Collector = (*Collector)(nil)
