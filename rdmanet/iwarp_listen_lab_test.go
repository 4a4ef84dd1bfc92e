//go:build linux

package rdmanet_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestLabIWARPListenerLost: Soft-iWARP's listening TCP socket destroyed
// under a listener (`ss -K`, as Debian 12's siw loses it under a burst of
// connections: rdmanet/listen_iwarp.go). The listener finds it gone and
// listens again on the same port, and a dial on "rdma" made right after the
// loss, refused at first, connects: nothing is refused for good.
func TestLabIWARPListenerLost(t *testing.T) {
	env := labenv.RequireRDMA(t)
	p := env.IWARP()
	// Connections of their own: a group's stream opens over its link, and
	// would not meet the listener.
	cfg := rdmanet.Config{NoLinkGroups: true}
	lc := rdmanet.ListenConfig{Config: cfg}
	ln, err := lc.Listen(context.Background(), "rdma", netip.AddrPortFrom(p.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go echoAll(t, ln, 8) // the test's three connections, with room
	rdmanet.ForgetFailures()
	defer rdmanet.ForgetFailures()
	d := rdmanet.Dialer{LocalAddr: &rdmanet.Addr{AddrPort: netip.AddrPortFrom(p.AddrA, 0)}, Timeout: 30 * time.Second, Config: cfg}
	echo := func(what string) {
		t.Helper()
		c, err := d.Dial("rdma", ln.Addr().String())
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer c.Close()
		roundTrip(t, c)
	}
	echo("before the loss")

	port := strconv.Itoa(int(ln.Addr().(*rdmanet.Addr).Port()))
	listening := func() bool {
		out, err := exec.Command("ss", "-Hltn", "sport = :"+port).CombinedOutput()
		if err != nil {
			t.Fatalf("ss: %v: %s", err, out)
		}
		return strings.Contains(string(out), "LISTEN")
	}
	if !listening() {
		t.Fatal("no TCP socket listens on the iWARP listener's port")
	}
	if out, err := exec.Command("ss", "-K", "-ltn", "sport = :"+port).CombinedOutput(); err != nil || listening() {
		t.Fatalf("ss -K did not destroy the listening socket: %v: %s", err, out)
	}
	lost := time.Now()
	// Right away: the first request is refused, and the dial asks again
	// until the listener is back.
	echo("after the loss")
	t.Logf("a dial made at the loss connected after %v; the listener: %+v", time.Since(lost).Round(time.Millisecond), ln.Stats())
	if st := ln.Stats(); st.Stops != 1 || st.Restarts != 1 {
		t.Errorf("listener stats %+v, want one stop and one restart", st)
	}
	if !listening() {
		t.Error("no TCP socket listens on the port after the listener was made again")
	}
	if why := ln.RDMAError(); why != nil {
		t.Errorf("RDMAError = %v once listening again", why)
	}
	echo("once listening again")

	// Closed for good, the port refuses every request: the dial fails
	// after asking three times (about 3 s), not at once as before the
	// listener could be lost, and not later.
	ln.Close()
	began := time.Now()
	_, err = d.DialContext(context.Background(), "rdma", ln.Addr().String())
	var opErr *net.OpError
	if err == nil || !errors.As(err, &opErr) {
		t.Fatalf("dial to a closed listener: %v, want a *net.OpError", err)
	}
	took := time.Since(began)
	t.Logf("a dial to the closed listener failed after %v: %v", took.Round(time.Millisecond), err)
	if took > 20*time.Second {
		t.Errorf("a dial to the closed listener took %v", took)
	}
}
