//go:build linux && labfaults

package rdmanet_test

// Setting lab-a down poisons rxe0 for the VM's life (linkdown_lab_test.go):
// this test builds with the labfaults tag only, and runs in a VM of its own.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestLabPortDownAsyncEvent: the dialing side's netdev on path 1 goes
// down (rxe reports IBV_EVENT_PORT_ERR on its asynchronous event channel)
// under an idle plain connection and an idle resumable session on that
// path. With a KeepAlive of 30 s, only the event can explain a failure
// within a second: the plain connection's blocked Read fails within 1 s
// with the event's error, and the session moves to path 2 within 1 s
// (path 2's neighbour known: see below).
func TestLabPortDownAsyncEvent(t *testing.T) {
	env := labenv.RequireRDMA(t)
	paths := env.Paths()
	if len(paths) < 2 {
		t.Skip("needs two paths")
	}
	const keepAlive = 30 * time.Second
	const bound = time.Second
	cfg := rdmanet.Config{KeepAlive: keepAlive, ResumeTimeout: 30 * time.Second, FailbackInterval: -1}

	// A plain connection on path 1: one of its own (a group's stream
	// would wait for another link).
	pa, pb, ln, err := dialPair(paths[0].A, paths[0].B, rdmanet.Config{KeepAlive: keepAlive, NoLinkGroups: true}, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	defer pa.Close()
	defer pb.Close()

	// Path 2 once, so that its neighbour is known: a first address
	// resolution on a path took 2 s in the lab (cold ARP), which is the
	// new path's cost, not the failure's detection.
	wa, wb, wln, err := dialPair(paths[1].A, paths[1].B, rdmanet.Config{}, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	wa.Close()
	wb.Close()
	wln.Close()

	// A session on path 1 that may move to path 2.
	lc := rdmanet.ListenConfig{Config: cfg}
	sln, err := lc.Listen(context.Background(), "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer sln.Close()
	port := sln.Addr().(*net.TCPAddr).AddrPort().Port()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := sln.Accept()
		accepted <- c
	}()
	d := rdmanet.Dialer{
		LocalAddr:     &rdmanet.Addr{AddrPort: netip.AddrPortFrom(paths[0].A, 0)},
		Timeout:       20 * time.Second,
		Config:        cfg,
		FailoverAddrs: []string{paths[1].B.String()},
	}
	nc, err := d.Dial("rdma", netip.AddrPortFrom(paths[0].B, port).String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ns := <-accepted
	if ns == nil {
		t.Fatal("accept failed")
	}
	defer ns.Close()
	sc := nc.(*rdmanet.Conn)
	if st := sc.Session(); !st.Resumable || !strings.Contains(st.Path, paths[0].B.String()) {
		t.Fatalf("session %+v; want a resumable one on path 1 (%v)", st, paths[0].B)
	}

	readErr := func(c net.Conn) chan error {
		ch := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 1))
			ch <- err
		}()
		return ch
	}
	aErr, bErr := readErr(pa), readErr(pb)
	time.Sleep(100 * time.Millisecond) // the reads are parked
	before := rdmanet.ReadMetrics().AsyncEvents

	linkDown(t, paths[0].NetdevA)
	start := time.Now()

	select {
	case err := <-aErr:
		took := time.Since(start)
		var ae *rdmanet.AsyncEventError
		switch {
		case took > bound:
			t.Errorf("the plain connection failed after %v, bound %v: %v", took, bound, err)
		case !errors.As(err, &ae) || !errors.Is(err, link.ErrDown):
			t.Errorf("the plain connection failed after %v with %v; want an AsyncEventError (PORT_ERR)", took, err)
		default:
			t.Logf("plain connection (dialer, hit side) failed after %v: %v", took.Round(time.Millisecond), err)
		}
	case <-time.After(keepAlive):
		t.Fatalf("the plain connection still reads %v after its port went down", keepAlive)
	}
	select {
	case err := <-bErr:
		t.Logf("plain connection (listener, peer of the veth) failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(5 * time.Second):
		t.Logf("plain connection (listener) still reading 5 s after")
	}

	// The session: lost at once, and on path 2 soon after.
	var lost, moved time.Duration
	for deadline := start.Add(keepAlive); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		st := sc.Session()
		if lost == 0 && (st.Suspended || st.Failovers > 0) {
			lost = time.Since(start)
		}
		if st.Failovers > 0 && !st.Suspended && strings.Contains(st.Path, paths[1].B.String()) {
			moved = time.Since(start)
			t.Logf("session lost its link after %v, moved after %v: %+v", lost.Round(time.Millisecond), moved.Round(time.Millisecond), st.LastMove)
			break
		}
	}
	switch {
	case moved == 0:
		t.Errorf("the session did not move to path 2 within %v (lost its link after %v): %+v", keepAlive, lost, sc.Session())
	case moved > bound:
		t.Errorf("the session moved after %v, bound %v", moved, bound)
	}
	// The session still carries bytes, on path 2.
	go nc.Write([]byte("x"))
	ns.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := ns.Read(make([]byte, 1)); err != nil {
		t.Errorf("the moved session: %v", err)
	}

	after := rdmanet.ReadMetrics().AsyncEvents
	if after["PORT_ERR"] <= before["PORT_ERR"] {
		t.Errorf("PORT_ERR counted %d before, %d after", before["PORT_ERR"], after["PORT_ERR"])
	}
	t.Logf("asynchronous events counted: %v", after)
}
