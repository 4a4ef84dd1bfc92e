package rdmanet

import (
	"context"
	"errors"
	"net"
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

// TestTCPJoinOfAnEndedGroupRefused: a TCP join of a group that ended here
// lately is refused as an unknown group, so that its dialer ends the group
// too. The dialer may not know yet: the listener closed, its group ended
// with it, and the dialer, whose stream was still closing, took the
// disconnect for a failed path and joined over TCP. The join was handed
// to Accept as a plain client's connection (TestLabPingBench, make test
// under load: the server read the join's Hello as a request).
func TestTCPJoinOfAnEndedGroupRefused(t *testing.T) {
	t.Cleanup(func() {
		acceptedGroups.Lock()
		acceptedGroups.ended = nil
		acceptedGroups.Unlock()
	})
	cfg, _ := Config{}.withDefaults()
	mux, _ := groupMuxes(t, groupStreamConfig(cfg), groupBase(4)) // checks goroutines once the rig closed
	r := newRig(t, true, 4)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port for the dialer to keep
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	h := wire.Hello{Process: 42, Features: groupOffer | wire.FeatureGroupMove, TCPPort: port}
	h.Group = reserveAcceptedGroup(r.l.rdma.addr.Port(), h, loopback)
	setAcceptedGroup(h.Group, mux)
	mux.Close()
	for end := time.Now().Add(hangGuard); ; time.Sleep(time.Millisecond) {
		acceptedGroups.Lock()
		gone := acceptedGroups.m[h.Group] == nil
		acceptedGroups.Unlock()
		if gone {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the group that ended is still listed")
		}
	}

	accepted := r.accept()
	d := net.Dialer{Control: reuseAddr, LocalAddr: &net.TCPAddr{IP: loopback.AsSlice(), Port: int(port)}}
	nc, err := d.Dial("tcp", r.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc := nc.(*net.TCPConn)
	defer tc.Close()
	tc.SetDeadline(time.Now().Add(hangGuard))
	join := wire.Hello{Version: wire.HelloVersion, Features: groupOffer | wire.FeatureGroupMove,
		RecvDepth: groupRecvDepth, RingSize: groupLinkRing, Process: 42, Group: h.Group}
	_, err = tcpHelloExchange(tc, join)
	var refused *tcpRefusedError
	if !errors.As(err, &refused) || refused.reason != unknownGroupReason {
		t.Fatalf("a TCP join of a group that ended: %v; want a refusal: %s", err, unknownGroupReason)
	}
	if st := r.l.Stats(); st.TCPSniffs != 1 {
		t.Errorf("listener stats %+v; want 1 sniffed connection", st)
	}
	select {
	case res := <-accepted:
		t.Fatalf("Accept returned %v, %v", res.c, res.err)
	case <-time.After(20 * time.Millisecond):
	}

	// The port is remembered for a while, and as many groups as
	// maxEndedGroups at most.
	from := netip.AddrPortFrom(loopback, port)
	if !tcpJoinFrom(from) {
		t.Error("the ended group's port is no longer taken for a join's")
	}
	acceptedGroups.Lock()
	forgetEndedGroupsLocked(time.Now().Add(endedGroupMemory + time.Second))
	left := len(acceptedGroups.ended)
	acceptedGroups.Unlock()
	if left != 0 || tcpJoinFrom(from) {
		t.Errorf("%d ended groups kept past endedGroupMemory", left)
	}
	for i := range maxEndedGroups + 10 {
		h := wire.Hello{Process: 42, Features: groupOffer | wire.FeatureGroupMove, TCPPort: uint16(i + 1)}
		setAcceptedGroup(reserveAcceptedGroup(r.l.rdma.addr.Port(), h, loopback), mux) // ended: dropped at once
	}
	for end := time.Now().Add(hangGuard); ; time.Sleep(time.Millisecond) {
		acceptedGroups.Lock()
		listed, ended := len(acceptedGroups.m), len(acceptedGroups.ended)
		acceptedGroups.Unlock()
		if listed == 0 {
			if ended != maxEndedGroups {
				t.Errorf("%d ended groups kept, want %d", ended, maxEndedGroups)
			}
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d ended groups still listed", listed)
		}
	}
}
