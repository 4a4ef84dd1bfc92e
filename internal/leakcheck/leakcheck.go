// Package leakcheck lets tests fail when verbs objects or cm IDs outlive them.
package leakcheck

import (
	"testing"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/verbs"
)

// Check registers a cleanup that fails t if any verbs object or cm ID is
// still open when t ends (after t's other cleanups, registered later, ran).
func Check(t testing.TB) {
	t.Cleanup(func() {
		if r := verbs.Resources(); r != (verbs.ResourceCounts{}) {
			t.Errorf("verbs objects left open: %+v", r)
		}
		if n := cm.LiveIDs(); n != 0 {
			t.Errorf("%d cm IDs left open", n)
		}
	})
}
