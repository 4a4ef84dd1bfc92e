//go:build linux

package rdmanet_test

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestLabSecondPath: the lab's path 2 carries RDMA between A and B on
// devices of its own, and keeps carrying it while every packet on path 1 is
// dropped: the two paths are independent, as failover tests need.
func TestLabSecondPath(t *testing.T) {
	env := labenv.RequireRDMA(t)
	checkLeaks(t)
	p := env.Paths()[1]
	roundTrip := func(t *testing.T) {
		t.Helper()
		before := []int64{sentPackets(t, p.DevA), sentPackets(t, p.DevB)}
		c, s := pathPipe(t, p, rdmanet.Config{})
		defer c.Close()
		defer s.Close()
		if got := c.LocalAddr().(*rdmanet.Addr).Addr(); got != p.A {
			t.Errorf("client's local address %v, want %v", got, p.A)
		}
		if got := s.RemoteAddr().(*rdmanet.Addr).Addr(); got != p.A {
			t.Errorf("server sees the client at %v, want %v", got, p.A)
		}
		msg := bytes.Repeat([]byte("path 2 "), 10000)
		go func() { c.Write(msg) }()
		got := make([]byte, len(msg))
		s.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("server read: %v (equal %v)", err, bytes.Equal(got, msg))
		}
		go func() { s.Write(msg[:100]) }()
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(c, got[:100]); err != nil {
			t.Fatalf("client read: %v", err)
		}
		// The packets went out of path 2's devices.
		for i, dev := range []string{p.DevA, p.DevB} {
			if n := sentPackets(t, dev); n <= before[i] {
				t.Errorf("%s sent no packet (%d before, %d after)", dev, before[i], n)
			}
		}
	}
	t.Run("alone", roundTrip)
	t.Run("path 1 dropping everything", func(t *testing.T) {
		env.Paths()[0].DropAll(t)
		roundTrip(t)
	})
}

// pathPipe connects a client on p.A to a server on p.B over RDMA.
func pathPipe(t *testing.T, p labenv.Path, cfg rdmanet.Config) (client, server net.Conn) {
	t.Helper()
	client, server, ln, err := dialPair(p.A, p.B, cfg, 20*time.Second)
	if ln != nil {
		ln.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return client, server
}

// sentPackets is an rxe device's count of packets sent.
func sentPackets(t *testing.T, dev string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/class/infiniband", dev, "ports/1/hw_counters/sent_pkts"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
