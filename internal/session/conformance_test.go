package session

import (
	"testing"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
)

// TestConformance runs link.Link's conformance suite over a session on
// the in-memory link with no other path to move to: a session whose path
// does not change is the link under it.
func TestConformance(t *testing.T) {
	linktest.Run(t, func(t *testing.T, a, b linktest.Spec) (link.Link, link.Link) {
		pa, pb := linktest.PipePair(t, a, b)
		return newRig(t, pa, Config{}).l, newRig(t, pb, Config{}).l
	})
}
