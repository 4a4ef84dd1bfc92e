package link_test

import (
	"testing"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
)

// TestPipeConformance runs link.Link's conformance suite over the
// in-memory link, with receiver-not-ready retried for ever (RNRRetry 7), as
// rdmanet's RDMA links are set up.
func TestPipeConformance(t *testing.T) {
	linktest.Run(t, func(t *testing.T, a, b linktest.Spec) (link.Link, link.Link) {
		pa, pb := linktest.PipePair(t, a, b)
		return pa, pb
	})
}

// TestPipeCarrierConformance runs link.Carrier's conformance suite over
// the in-memory link; the rings the pair shares are made by the ends of
// another pipe, as a group's other link makes them.
func TestPipeCarrierConformance(t *testing.T) {
	linktest.RunCarrier(t, func(t *testing.T, a, b linktest.Spec) linktest.Carriers {
		ma, mb := linktest.PipePair(t, linktest.DefaultSpec(), linktest.DefaultSpec())
		pa, pb := linktest.PipePair(t, a, b)
		return linktest.Carriers{A: pa, B: pb, MakerA: ma, MakerB: mb}
	})
}
