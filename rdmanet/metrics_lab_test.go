//go:build linux

package rdmanet_test

import (
	"errors"
	"io"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// sumErrors is the total of ConnErrors.
func sumErrors(m rdmanet.Metrics) (n uint64) {
	for _, v := range m.ConnErrors {
		n += v
	}
	return n
}

// TestLabMetricsAndConns: a peer process streams to this one over RDMA;
// the connection is listed with B's device and a queue pair, and the
// counters move with the traffic. The peer is then killed mid-stream: the
// error this side sees is counted once under its kind, and the connection
// leaves the list when it is closed.
func TestLabMetricsAndConns(t *testing.T) {
	env := labenv.RequireRDMA(t)
	checkLeaks(t)
	before := rdmanet.ReadMetrics()
	ln, err := rdmanet.Listen("rdma", netip.AddrPortFrom(env.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, cmd := streamingPeer(t, ln, ln.Addr().String())
	local, remote := c.LocalAddr().String(), c.RemoteAddr().String()

	during := rdmanet.ReadMetrics()
	if got := during.BytesReceived - before.BytesReceived; got < 1<<20 {
		t.Errorf("bytes received moved by %d, want at least 1 MiB", got)
	}
	if during.MessagesArrived <= before.MessagesArrived || during.RequestsPosted <= before.RequestsPosted || during.Open != before.Open+1 {
		t.Errorf("messages arrived %d -> %d, requests posted %d -> %d, open %d -> %d; want growth and one more open",
			before.MessagesArrived, during.MessagesArrived, before.RequestsPosted, during.RequestsPosted, before.Open, during.Open)
	}
	var info *rdmanet.ConnInfo
	conns := rdmanet.Connections()
	for i := range conns {
		if conns[i].Local == local && conns[i].Remote == remote {
			info = &conns[i]
		}
	}
	if info == nil {
		t.Fatalf("%s <- %s not in %+v", local, remote, conns)
	}
	if info.Device != env.DevB || info.Port != 1 || info.QP == 0 || info.Side != "accepted" || info.BytesReceived < 1<<20 || info.LastError != "" {
		t.Errorf("listed as %+v; want accepted on %s port 1 with a QP, 1 MiB received, no error", *info, env.DevB)
	}
	t.Logf("listed: %+v", *info)

	cmd.Process.Signal(syscall.SIGKILL)
	start := time.Now()
	readErr := error(nil)
	buf := make([]byte, 64<<10)
	c.SetReadDeadline(start.Add(30 * time.Second))
	for readErr == nil {
		_, readErr = c.Read(buf)
	}
	if errors.Is(readErr, os.ErrDeadlineExceeded) {
		t.Fatalf("Read still blocked 30s after the peer was killed")
	}
	_, writeErr := c.Write([]byte("anyone there?"))
	if writeErr == nil {
		t.Fatal("Write to a killed peer succeeded")
	}
	after := rdmanet.ReadMetrics()
	// The connection's failure is one error: the Read's if it failed, the
	// Write's if the Read saw the peer's disconnect as an end (EOF).
	seen := writeErr
	if readErr != io.EOF {
		seen = readErr
	}
	kind := rdmanet.ConnErrorKindOf(seen)
	if n := sumErrors(after) - sumErrors(during); n != 1 || after.ConnErrors[kind] != during.ConnErrors[kind]+1 {
		t.Errorf("errors by kind %v -> %v; want one more %s (Read: %v, Write: %v)", during.ConnErrors, after.ConnErrors, kind, readErr, writeErr)
	}
	t.Logf("peer killed: Read %v, Write %v; counted as %s", readErr, writeErr, kind)

	c.Close()
	for _, ci := range rdmanet.Connections() {
		if ci.Local == local && ci.Remote == remote {
			t.Errorf("still listed after Close: %+v", ci)
		}
	}
	if m := rdmanet.ReadMetrics(); m.Open != before.Open || m.BytesReceived < during.BytesReceived {
		t.Errorf("after Close: open %d (before %d), bytes received %d (at least %d)", m.Open, before.Open, m.BytesReceived, during.BytesReceived)
	}
}
