package tcplink

import (
	"testing"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
)

// TestConformance runs link.Link's conformance suite over loopback TCP and
// over net.Pipe (synchronous, unbuffered: every write waits for the
// reader), in carrier mode and not.
func TestConformance(t *testing.T) {
	for _, mode := range []string{"plain", "carrier"} {
		t.Run(mode, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, tr string) {
				linktest.Run(t, func(t *testing.T, a, b linktest.Spec) (link.Link, link.Link) {
					sa, sb := specOf(a), specOf(b)
					sa.carrier, sb.carrier = mode == "carrier", mode == "carrier"
					return newPair(t, tr, sa, sb)
				})
			})
		})
	}
}

// TestCarrierConformance runs link.Carrier's conformance suite over links
// in carrier mode. Over TCP, the rings the pair shares are made by the ends
// of a link.Pipe, as a group's RDMA link makes them; over net.Pipe they
// are plain memory.
func TestCarrierConformance(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		linktest.RunCarrier(t, func(t *testing.T, a, b linktest.Spec) linktest.Carriers {
			var c linktest.Carriers
			if tr == "tcp" {
				// Made first, so closed after the pair.
				c.MakerA, c.MakerB = linktest.PipePair(t, linktest.DefaultSpec(), linktest.DefaultSpec())
			}
			sa, sb := specOf(a), specOf(b)
			sa.carrier, sb.carrier = true, true
			c.A, c.B = newPair(t, tr, sa, sb)
			return c
		})
	})
}

func specOf(s linktest.Spec) spec {
	return spec{sendRing: s.SendRing, recvRing: s.RecvRing, sendDepth: s.SendDepth, recvDepth: s.RecvDepth, controlDepth: s.ControlDepth}
}
