//go:build linux

package rdmanet

import (
	"context"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
)

// TestLabIWARPListenSocket: an iWARP listener's watch asks the kernel the
// right question. Soft-iWARP's listening TCP socket is found where the
// listener listens (sock_diag, tcpListening), and the watch, running
// through more than two of its checks while a connection is made, reports
// no loss; a listener on rxe is not watched at all, and once the iWARP
// listener closes its socket is gone. The loss itself is the host's
// TestIWARPListenWatch: making siw lose the socket here (`ss -K`) and then
// tearing the listener down, as the process's exit does, corrupts the
// VM's kernel (listen_iwarp.go).
func TestLabIWARPListenSocket(t *testing.T) {
	env := labenv.RequireRDMA(t)
	lc := ListenConfig{Config: Config{NoLinkGroups: true}}
	rxe, err := lc.Listen(context.Background(), "rdma", netip.AddrPortFrom(env.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer rxe.Close()
	if rxe.rdma.listensOnIWARP() {
		t.Errorf("a listener on rxe's %v is watched as iWARP's", env.AddrB)
	}

	p := env.IWARP()
	l, err := lc.Listen(context.Background(), "rdma", netip.AddrPortFrom(p.AddrB, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.rdma.listensOnIWARP() {
		t.Fatalf("a listener on siw's %v is not watched", p.AddrB)
	}
	ap := l.Addr().(*Addr).AddrPort
	if ok, err := tcpListening(ap); err != nil || !ok {
		t.Fatalf("tcpListening(%v) = %v, %v; want siw's socket found", ap, ok, err)
	}
	go func() {
		c, err := l.Accept()
		if err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	d := Dialer{LocalAddr: &Addr{netip.AddrPortFrom(p.AddrA, 0)}, Timeout: 30 * time.Second, Config: lc.Config}
	c, err := d.Dial("rdma", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * iwarpListenCheck) // the watch looks twice at least
	if why, st := l.RDMAError(), l.Stats(); why != nil || st.Stops != 0 {
		t.Errorf("a listener whose socket is there: RDMAError %v, Stats %+v", why, st)
	}
	c.Close()
	l.Close()
	if ok, err := tcpListening(ap); err != nil || ok {
		t.Errorf("after Close: tcpListening(%v) = %v, %v; want false", ap, ok, err)
	}
}
