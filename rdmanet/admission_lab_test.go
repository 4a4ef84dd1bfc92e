package rdmanet_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestLabPeerMemory: one peer cannot take more registered memory than
// Config.PeerMemory allows. A listener refuses the connection beyond it
// for resources (a dialer on "tcp" falls back to TCP), a dialer whose own
// bound is reached fails with a *PeerMemoryError (a session's rings count
// too), and a connection closed makes room again.
func TestLabPeerMemory(t *testing.T) {
	env := labenv.RequireRDMA(t)
	p := env.RoCE()
	fp, err := rdmanet.Config{}.Footprint()
	if err != nil {
		t.Fatal(err)
	}
	// Room for a few idle connections' chunks: slabs double (1, 2, then 4
	// chunks), so the fourth connection needs slabs past the bound.
	bound := 4 * fp.RegisteredBytes
	lc := rdmanet.ListenConfig{Config: rdmanet.Config{PeerMemory: bound}}
	ln, err := lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(p.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go benchkit.EchoOneAndHold(ln)
	// Connections of their own: a group's streams take their rings from
	// the same bound, but a stream refused opens a connection of its own.
	d := rdmanet.Dialer{LocalAddr: &net.TCPAddr{IP: p.AddrA.AsSlice()}, Timeout: 20 * time.Second,
		Config: rdmanet.Config{NoLinkGroups: true}}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var refused error
	for i := 0; i < 16; i++ {
		c, err := d.Dial("rdma", ln.Addr().String())
		if err != nil {
			refused = err
			break
		}
		conns = append(conns, c)
	}
	t.Logf("%d connections, then: %v; pools %+v", len(conns), refused, rdmalink.Pools())
	if refused == nil || len(conns) < 2 {
		t.Fatalf("%d connections and no refusal under a bound of %d bytes", len(conns), bound)
	}
	var sr *rdmanet.ServerRefusedError
	if !errors.As(refused, &sr) || !errors.Is(refused, fallback.ReasonResources) || !strings.Contains(sr.Reason, "PeerMemory") {
		t.Fatalf("beyond the bound: %v, want the server's refusal for resources naming PeerMemory", refused)
	}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conns = append(conns, c)
	if tr, why := rdmanet.TransportOf(c); tr != fallback.TCP || !errors.Is(why, fallback.ReasonResources) {
		t.Fatalf("a tcp dial beyond the bound: %v (%v), want TCP for resources", tr, why)
	}
	// Room again once one goes (its chunks go back when its link is
	// released, after the close's drain).
	conns[0].Close()
	conns = conns[1:]
	var again net.Conn
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if again, err = d.Dial("rdma", ln.Addr().String()); err == nil {
			break
		}
	}
	if again == nil {
		t.Fatalf("no room after a connection closed: %v", err)
	}
	conns = append(conns, again)

	// The dialer's own bound: its error is typed.
	small := rdmanet.Dialer{LocalAddr: &net.TCPAddr{IP: p.AddrA.AsSlice()}, Timeout: 20 * time.Second,
		Config: rdmanet.Config{PeerMemory: fp.RegisteredBytes / 2}}
	ln2, err := rdmanet.Listen("rdma", netip.AddrPortFrom(p.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	_, err = small.Dial("rdma", ln2.Addr().String())
	var pm *rdmanet.PeerMemoryError
	if !errors.As(err, &pm) || pm.Bound != int64(fp.RegisteredBytes/2) || !errors.Is(err, fallback.ReasonResources) {
		t.Fatalf("a dial past the dialer's own bound: %v, want a *PeerMemoryError", err)
	}

	// A session's rings, registered outside the pools on each link, count
	// against the bound too: twice an idle connection's chunks hold no
	// session's 256 KiB rings.
	session := rdmanet.Config{ResumeTimeout: time.Minute}
	slc := rdmanet.ListenConfig{Config: session}
	ln3, err := slc.Listen(context.Background(), "rdma", netip.AddrPortFrom(p.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln3.Close()
	session.PeerMemory = 2 * fp.RegisteredBytes
	sd := rdmanet.Dialer{LocalAddr: &net.TCPAddr{IP: p.AddrA.AsSlice()}, Timeout: 20 * time.Second, Config: session}
	if c, err := sd.Dial("rdma", ln3.Addr().String()); !errors.As(err, &pm) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("a session past the dialer's bound: %v, want a *PeerMemoryError", err)
	}
}
