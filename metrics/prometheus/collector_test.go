package prometheus

import (
	"net"
	"testing"

	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestCollectorLint: the metrics pass Prometheus' own lint (names, units,
// help), and register without conflicts.
func TestCollectorLint(t *testing.T) {
	c := NewCollector()
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	if err := prom.NewPedanticRegistry().Register(c); err != nil {
		t.Fatal(err)
	}
}

// connections returns rdmanet_connections_total for transport and side.
func connections(t *testing.T, c *Collector, transport fallback.Transport, side string) float64 {
	t.Helper()
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "rdmanet_connections_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["transport"] == string(transport) && labels["side"] == side {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no rdmanet_connections_total{transport=%q,side=%q}", transport, side)
	return 0
}

// TestCollectorValuesMove: a connection over TCP counts in
// rdmanet_connections_total with its transport and sides. (On this host,
// without RDMA, a "tcp" dial uses TCP; in the lab it would use RDMA, so
// the transport is the one the connection reports.)
func TestCollectorValuesMove(t *testing.T) {
	ln, err := rdmanet.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	c := NewCollector()
	transport := fallback.TCP
	beforeDialed := connections(t, c, transport, "dialed")
	beforeAccepted := connections(t, c, transport, "accepted")
	conn, err := rdmanet.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tr, _ := rdmanet.TransportOf(conn); tr != transport {
		t.Skipf("the dial used %s; this test counts a TCP connection", tr)
	}
	if s, ok := <-accepted; ok {
		defer s.Close()
	}
	if got := connections(t, c, transport, "dialed"); got != beforeDialed+1 {
		t.Errorf("dialed tcp %v -> %v, want one more", beforeDialed, got)
	}
	if got := connections(t, c, transport, "accepted"); got != beforeAccepted+1 {
		t.Errorf("accepted tcp %v -> %v, want one more", beforeAccepted, got)
	}
}
