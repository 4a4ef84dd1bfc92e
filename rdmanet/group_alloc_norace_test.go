//go:build !race

package rdmanet

import (
	"io"
	"testing"
)

// TestGroupStreamNoAllocations: a group's stream, over the in-memory link,
// allocates nothing per Write+Read of 4 KiB once warm (its queues in the
// group reuse their arrays: popped from the front as slices, they
// allocated three times per round trip). The service that a completion
// arriving with no Read or Write waiting starts (connfd.FD.Kick) is a
// goroutine, about one in two round trips here: less than one
// allocation per round trip on average, which AllocsPerRun rounds down.
func TestGroupStreamNoAllocations(t *testing.T) {
	cfg, _ := Config{KeepAlive: -1}.withDefaults()
	a, b := groupMuxes(t, groupStreamConfig(cfg), groupBase(2))
	x, y := groupConnPair(t, Config{KeepAlive: -1}, a, b)
	defer x.Close()
	defer y.Close()
	msg := make([]byte, 4096)
	buf := make([]byte, 4096)
	rt := func() {
		if _, err := x.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(y, buf); err != nil {
			t.Fatal(err)
		}
	}
	for range 500 {
		rt()
	}
	if allocs := testing.AllocsPerRun(2000, rt); allocs != 0 {
		t.Errorf("Write+Read of 4 KiB over a group's stream allocate %v times, want 0", allocs)
	}
}
