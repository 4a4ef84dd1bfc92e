//go:build linux && !race

// Allocation counts mean nothing under the race detector, which allocates
// itself; scripts/lab-test runs these in a pass without it.

package cm_test

import (
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/leakcheck"
	"github.com/rdmanet/sdk/verbs"
	"testing"
)

// TestLabDataPathDoesNotAllocate: posting and polling cross into C with the
// caller's slices, with no allocation.
func TestLabDataPathDoesNotAllocate(t *testing.T) {
	env := labenv.RequireRDMA(t)
	leakcheck.Check(t)
	client, server, peer, _ := connectPair(t, env, 4)
	wrs := []verbs.SendWR{{Local: client.mr.Slice(0, 8), Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled, RemoteAddr: peer.addr, RKey: peer.rkey}}
	wcs := make([]verbs.WorkCompletion, 8)
	allocs := testing.AllocsPerRun(50, func() {
		if err := client.qp.PostSend(wrs); err != nil {
			t.Fatal(err)
		}
		for n := 0; n == 0; {
			var err error
			if n, err = client.cq.Poll(wcs); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("PostSend+Poll allocate %v times per run, want 0", allocs)
	}
	recv := []verbs.RecvWR{{ID: 1, Local: server.mr.Slice(0, 64)}}
	if allocs := testing.AllocsPerRun(20, func() {
		if err := server.qp.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("PostRecv allocates %v times per run, want 0", allocs)
	}
}
