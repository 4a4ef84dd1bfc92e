package rdmanet

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/wire"
)

// TestJoinWaitsForTheGroupBeingMade: a link that joins a group whose
// first link's accept has not finished (the dialer's first link is up
// once this side accepted it, and its second path dials at once) waits
// for the group, and finds it made, or finds none if the making failed.
// It was refused as an unknown group, and the dialer ended the group with
// every stream it had (TestLabGroupToTCP under the race detector, 2 of 9
// runs).
func TestJoinWaitsForTheGroupBeingMade(t *testing.T) {
	cfg, _ := Config{}.withDefaults()
	mux, _ := groupMuxes(t, groupStreamConfig(cfg), groupBase(4))
	const port = 7
	dialer := netip.MustParseAddr("198.51.100.1")
	for _, made := range []*group.Mux{mux, nil} {
		h := wire.Hello{Process: 42}
		h.Group = reserveAcceptedGroup(port, h, dialer)
		found := make(chan *group.Mux, 1)
		go func() { found <- findAcceptedGroup(context.Background(), h, port) }()
		select {
		case m := <-found:
			t.Fatalf("a join found %p while the group was being made", m)
		case <-time.After(20 * time.Millisecond):
		}
		setAcceptedGroup(h.Group, made)
		if m := <-found; m != made {
			t.Errorf("a join found %p, want %p", m, made)
		}
	}
	// A join that waits no longer, and one that names another dialer's
	// group or another port, find none.
	h := wire.Hello{Process: 42}
	h.Group = reserveAcceptedGroup(port, h, dialer)
	defer setAcceptedGroup(h.Group, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if m := findAcceptedGroup(ctx, h, port); m != nil {
		t.Errorf("a join whose wait ended found %p", m)
	}
	other := h
	other.Process = 43
	for _, tc := range []struct {
		h    wire.Hello
		port uint16
	}{{other, port}, {h, port + 1}} {
		if m := findAcceptedGroup(context.Background(), tc.h, tc.port); m != nil {
			t.Errorf("a join of process %d at port %d found %p", tc.h.Process, tc.port, m)
		}
	}
}
