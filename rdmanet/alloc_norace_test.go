//go:build linux && !race

// Allocation counts mean nothing under the race detector, which allocates
// itself; scripts/lab-test runs these in a pass without it.

package rdmanet_test

import (
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/leakcheck"
	"github.com/rdmanet/sdk/rdmanet"
	"io"
	"testing"
)

// TestLabNoAllocationsPerReadWrite: in steady state a Write and the Read that
// takes its bytes allocate nothing.
func TestLabNoAllocationsPerReadWrite(t *testing.T) {
	env := labenv.RequireRDMA(t)
	leakcheck.Check(t)
	// A connection of its own; a group's stream is
	// TestGroupStreamNoAllocations', on the host.
	a, b, stop := pipe(t, env, rdmanet.Config{KeepAlive: -1, NoLinkGroups: true})
	defer stop()
	msg := make([]byte, 4096)
	buf := make([]byte, 4096)
	roundTrip := func() {
		if _, err := a.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b, buf); err != nil {
			t.Fatal(err)
		}
	}
	// Warm up: windows announced, and the rings grown to their size for
	// this traffic (growing allocates: new rings are registered).
	for range 500 {
		roundTrip()
	}
	if allocs := testing.AllocsPerRun(200, roundTrip); allocs != 0 {
		t.Errorf("Write+Read of 4 KiB allocate %v times, want 0", allocs)
	}
}
