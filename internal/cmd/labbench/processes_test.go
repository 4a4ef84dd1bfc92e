package main

import (
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/benchkit"
)

// The two-process row's figures come back as the child printed them, and
// a child whose connection fell back to TCP gives no figure.
func TestPingChildLine(t *testing.T) {
	l := benchkit.NewLatency([]time.Duration{300 * time.Microsecond, 100 * time.Microsecond, 200 * time.Microsecond})
	f, err := parsePingChild(toolRun{clientOut: "some log\n" + pingLine(l, fallback.RDMA, true) + "\n"})
	if err != nil {
		t.Fatal(err)
	}
	if f.p50 != 200 || f.p99 != 300 || f.mean != 200 || !f.hasPct || f.note != "" {
		t.Fatalf("parsed %+v", f)
	}
	f, err = parsePingChild(toolRun{clientOut: pingLine(l, fallback.RDMA, false)})
	if err != nil || f.note != "not a group's stream" {
		t.Fatalf("a connection of its own: %+v, %v", f, err)
	}
	if _, err := parsePingChild(toolRun{clientOut: pingLine(l, fallback.TCP, false)}); err == nil || !strings.Contains(err.Error(), "not RDMA") {
		t.Fatalf("a TCP connection's figures: %v", err)
	}
	if _, err := parsePingChild(toolRun{clientOut: "ping child: dial failed\n"}); err == nil {
		t.Fatal("no figures parsed as some")
	}
}

// The children's arguments: the field count and the trailing size and
// count are checked.
func TestChildRoundTrips(t *testing.T) {
	f, size, n, ok := childRoundTrips("198.18.0.1 198.18.0.2:1 64 2000", 4)
	if !ok || size != 64 || n != 2000 || f[0] != "198.18.0.1" {
		t.Fatalf("got %q %d %d %v", f, size, n, ok)
	}
	for _, bad := range []string{"198.18.0.2:1 64 2000", "a b 64", "a b x 2000", "a b 64 y", ""} {
		if _, _, _, ok := childRoundTrips(bad, 4); ok {
			t.Errorf("%q taken for 4 fields ending in SIZE N", bad)
		}
	}
}
