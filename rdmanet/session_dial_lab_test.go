//go:build linux

package rdmanet_test

import (
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestLabSessionLostAtDial: a dialer's link is lost as soon as its engine
// runs, before the dial returns. The dialer resumes the session: it has its
// resume paths from the start, so it redials, instead of waiting as a
// server does for a resume that never comes (issue 23).
func TestLabSessionLostAtDial(t *testing.T) {
	env := labenv.RequireRDMA(t)
	checkLeaks(t)
	ln, port := sessionListener(t)
	rdmanet.OnDialStarted(t, func(c *rdmanet.Conn) {
		if err := rdmanet.DeclareDeadPath(c); err != nil {
			t.Error(err)
			return
		}
		for start := time.Now(); c.Session().Failovers == 0; time.Sleep(10 * time.Millisecond) {
			if time.Since(start) > 10*time.Second {
				t.Errorf("the dialer did not resume its session in 10 s after losing its link: %+v", c.Session())
				return
			}
		}
	})
	d := rdmanet.Dialer{
		LocalAddr: &rdmanet.Addr{AddrPort: netip.AddrPortFrom(env.AddrA, 0)},
		Timeout:   30 * time.Second,
		Config:    sessionConfig,
	}
	nc, ns := dialSession(t, ln, d, netip.AddrPortFrom(env.AddrB, port))
	if t.Failed() {
		return
	}
	t.Logf("the dialer resumed: %+v", nc.Session())
	for _, c := range [][2]*rdmanet.Conn{{nc, ns}, {ns, nc}} {
		c[0].SetDeadline(time.Now().Add(10 * time.Second))
		c[1].SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c[0].Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c[1], make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}
}
