// Package leakcheck lets tests fail when verbs objects or cm IDs outlive them.
package leakcheck

import (
	"bytes"
	"runtime"
	"strings"
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
// later, ran). A failure logs the goroutines of the SDK that are still
// alive: a connection that never freed its link is one of them (its
// linger, a Close, a dial's late answer), and names the path that leaked.
func Check(t testing.TB) { CheckWithin(t, Settle) }

// CheckWithin is Check with its own bound, for objects whose documented
// lifetime is longer than Settle (a link group's links, which go with the
// group).
func CheckWithin(t testing.TB, within time.Duration) {
	t.Cleanup(func() {
		r, ids := Released(within)
		if r != (verbs.ResourceCounts{}) {
			t.Errorf("verbs objects left open after %v: %+v", within, r)
		}
		if ids != 0 {
			t.Errorf("%d cm IDs left open after %v", ids, within)
		}
		if r != (verbs.ResourceCounts{}) || ids != 0 {
			t.Logf("the SDK's goroutines still alive:\n%s", SDKGoroutines())
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

// sdkModule prefixes the SDK's functions in a stack.
const sdkModule = "github.com/rdmanet/sdk/"

// SDKGoroutines is the stacks of the goroutines that run the SDK's code,
// but for tests' own and this one, separated by blank lines.
func SDKGoroutines() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out strings.Builder
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		s := string(g)
		if strings.Contains(s, "leakcheck.SDKGoroutines") || !runsSDK(s) {
			continue
		}
		out.WriteString(s)
		out.WriteString("\n\n")
	}
	return out.String()
}

// runsSDK reports whether a goroutine's stack has a function of the SDK's
// packages, not of their tests'.
func runsSDK(stack string) bool {
	for line := range strings.SplitSeq(stack, "\n") {
		if strings.HasPrefix(line, sdkModule) && !strings.Contains(line, "_test.") {
			return true
		}
	}
	return false
}
