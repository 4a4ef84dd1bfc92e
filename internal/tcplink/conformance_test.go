package tcplink

import (
	"testing"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
)

// TestConformance runs link.Link's conformance suite over loopback TCP and
// over net.Pipe (synchronous, unbuffered: every write waits for the
// reader).
func TestConformance(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		linktest.Run(t, func(t *testing.T, a, b linktest.Spec) (link.Link, link.Link) {
			return newPair(t, tr, specOf(a), specOf(b))
		})
	})
}

func specOf(s linktest.Spec) spec {
	return spec{sendRing: s.SendRing, recvRing: s.RecvRing, sendDepth: s.SendDepth, recvDepth: s.RecvDepth, controlDepth: s.ControlDepth}
}
