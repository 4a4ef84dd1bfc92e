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
		linktest.CheckGoroutines(t)
		pa, pb := link.NewPipe(pipeConfig(a), pipeConfig(b))
		t.Cleanup(func() {
			pa.Close()
			pb.Close()
		})
		return pa, pb
	})
}

func pipeConfig(s linktest.Spec) link.PipeConfig {
	return link.PipeConfig{
		SendRing: s.SendRing, RecvRing: s.RecvRing,
		SendDepth: s.SendDepth, RecvDepth: s.RecvDepth, ControlDepth: s.ControlDepth,
		RNRRetry: 7,
	}
}
