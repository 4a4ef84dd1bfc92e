// Package leakcheck lets tests fail when verbs objects or cm IDs outlive them.
package leakcheck

import (
	"testing"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/verbs"
)

// Settle bounds how long objects may take to go after a test's connections
// were closed: a closed connection delivers what was written and frees its
// memory in the background, for up to 5 s (rdmanet's linger), as a kernel
// does for a closed TCP socket.
const Settle = 15 * time.Second

// Check registers a cleanup that fails t if any verbs object or cm ID is
// still open Settle after t ends (after t's other cleanups, registered
// later, ran).
func Check(t testing.TB) {
	t.Cleanup(func() {
		r, ids := Released(Settle)
		if r != (verbs.ResourceCounts{}) {
			t.Errorf("verbs objects left open after %v: %+v", Settle, r)
		}
		if ids != 0 {
			t.Errorf("%d cm IDs left open after %v", ids, Settle)
		}
	})
}

// Released waits, up to within, until no verbs object and no cm ID is open,
// and returns what is still open then (nothing, unless within ran out).
func Released(within time.Duration) (verbs.ResourceCounts, int64) {
	for end := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		r, ids := verbs.Resources(), cm.LiveIDs()
		if (r == verbs.ResourceCounts{} && ids == 0) || time.Now().After(end) {
			return r, ids
		}
	}
}
