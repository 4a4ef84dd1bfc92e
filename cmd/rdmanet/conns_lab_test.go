//go:build linux

package main

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestLabConns: while ping runs over RDMA against serve -debug (both in
// this process), `rdmanet conns` lists the ping's connection from A's
// device and serve's from B's, with queue pairs and bytes; once ping ends
// the list empties.
func TestLabConns(t *testing.T) {
	env := labenv.RequireRDMA(t)
	l, err := net.Listen("tcp", "127.0.0.1:0") // a free port for -debug
	if err != nil {
		t.Fatal(err)
	}
	debug := l.Addr().String()
	l.Close()
	srv := startServe(t, "-addr", netip.AddrPortFrom(env.AddrB, 0).String(), "-debug", debug)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := newLines()
	done := make(chan int, 1)
	go func() {
		done <- runContext(ctx, []string{"ping", "-i", "20ms", "-local", env.AddrA.String(), srv.addr}, out, &bytes.Buffer{})
	}()
	waitReplies(t, out, 3, 30*time.Second)

	var conns []rdmanet.ConnInfo
	if code := runJSON(t, &conns, "conns", debug); code != exitOK {
		t.Fatalf("conns %s: exit %d", debug, code)
	}
	var dialed, accepted *rdmanet.ConnInfo
	for i, c := range conns {
		switch {
		case c.Side == "dialed" && strings.HasPrefix(c.Local, env.AddrA.String()+":") && c.Remote == srv.addr:
			dialed = &conns[i]
		case c.Side == "accepted" && c.Local == srv.addr && strings.HasPrefix(c.Remote, env.AddrA.String()+":"):
			accepted = &conns[i]
		}
	}
	if dialed == nil || accepted == nil || len(conns) != 2 {
		t.Fatalf("conns lists %+v; want ping's connection and serve's, and nothing else", conns)
	}
	if dialed.Local != accepted.Remote {
		t.Errorf("ping's connection is from %s, serve's from %s", dialed.Local, accepted.Remote)
	}
	for _, c := range []struct {
		info *rdmanet.ConnInfo
		dev  string
	}{{dialed, env.DevA}, {accepted, env.DevB}} {
		i := c.info
		if i.Transport != fallback.RDMA || i.Protocol != rdmanet.ProtocolRdmanet || i.Device != c.dev || i.Port != 1 || i.QP == 0 ||
			i.BytesSent == 0 || i.BytesReceived == 0 || i.LastError != "" {
			t.Errorf("%s connection: %+v; want rdma/rdmanet on %s port 1, a QP, bytes both ways, no error", i.Side, *i, c.dev)
		}
	}
	if dialed.QP == accepted.QP && env.DevA == env.DevB {
		t.Errorf("both ends have QP %d on one device", dialed.QP)
	}
	_, table, _ := runCmd(t, "conns", debug)
	t.Logf("rdmanet conns %s:\n%s", debug, table)

	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("ping did not stop")
	}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		conns = nil
		if code := runJSON(t, &conns, "conns", debug); code != exitOK {
			t.Fatalf("conns %s: exit %d", debug, code)
		}
		if len(conns) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("connections still listed 30s after ping ended: %+v", conns)
		}
	}
}
