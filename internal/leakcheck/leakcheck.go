// Package leakcheck lets tests fail when verbs objects or cm IDs outlive them.
package leakcheck

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
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
//
// A leak stays for the process's life: after a check failed, later ones
// count only what is open beyond what it found (leftOpen), so one leak
// fails one test, not every test after it, each after a full wait (in
// CI, ten tests at 15 s each; at a group's 75 s, past the run's bound).
func CheckWithin(t testing.TB, within time.Duration) {
	t.Cleanup(func() {
		leftOpen.Lock()
		base := leftOpen.open
		leftOpen.Unlock()
		got := releasedTo(base, within)
		if !got.beyond(base) {
			// What an earlier leak left and was freed since counts no
			// more: a later leak of the same kind fails again.
			leftOpen.Lock()
			leftOpen.open = leftOpen.open.least(got)
			leftOpen.Unlock()
			return
		}
		t.Errorf("verbs objects left open after %v: %+v; %d cm IDs", within, got.r, got.ids)
		if base != (open{}) {
			t.Logf("an earlier test had left open %+v and %d cm IDs", base.r, base.ids)
		}
		t.Logf("the SDK's goroutines still alive:\n%s", SDKGoroutines())
		if ks := KernelStacks(); ks != "" {
			t.Logf("threads blocked in the kernel elsewhere than Go's own waits:\n%s", ks)
		}
		leftOpen.Lock()
		leftOpen.open = got
		leftOpen.Unlock()
	})
}

// open is what is open: verbs objects and cm IDs.
type open struct {
	r   verbs.ResourceCounts
	ids int64
}

// beyond reports whether o has more of any kind than base.
func (o open) beyond(base open) bool {
	a, b := o.r, base.r
	return a.Contexts > b.Contexts || a.PDs > b.PDs || a.MRs > b.MRs || a.CQs > b.CQs ||
		a.CompChannels > b.CompChannels || a.QPs > b.QPs || a.SRQs > b.SRQs || a.Buffers > b.Buffers ||
		o.ids > base.ids
}

// least is, of each kind, the fewer of o's and b's.
func (o open) least(b open) open {
	x, y := o.r, b.r
	return open{verbs.ResourceCounts{
		Contexts: min(x.Contexts, y.Contexts), PDs: min(x.PDs, y.PDs), MRs: min(x.MRs, y.MRs),
		CQs: min(x.CQs, y.CQs), CompChannels: min(x.CompChannels, y.CompChannels), QPs: min(x.QPs, y.QPs),
		SRQs: min(x.SRQs, y.SRQs), Buffers: min(x.Buffers, y.Buffers),
	}, min(o.ids, b.ids)}
}

// leftOpen is what the last failed check found open, less what was
// released since.
var leftOpen struct {
	sync.Mutex
	open
}

// Released waits, up to within, until no verbs object and no cm ID is open,
// and returns what is still open then (nothing, unless within ran out).
func Released(within time.Duration) (verbs.ResourceCounts, int64) {
	o := releasedTo(open{}, within)
	return o.r, o.ids
}

// releasedTo waits, up to within, until nothing beyond base is open, and
// returns what is open then.
func releasedTo(base open, within time.Duration) open {
	for end := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		o := open{verbs.Resources(), cm.LiveIDs()}
		if !o.beyond(base) || time.Now().After(end) {
			return o
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

// idleWaits are the kernel functions a thread of a Go program sleeps in
// while it has nothing to do (the scheduler's futexes, the netpoller's
// epoll, a timer's sleep): a stack that ends in one of them says nothing
// about a leak.
var idleWaits = []string{"futex_wait", "ep_poll", "do_nanosleep", "do_sys_poll", "do_select"}

// KernelStacks is the kernel stacks of the process's threads that are
// blocked elsewhere than in idleWaits, or "" when none is or they cannot
// be read (only root may read them; the lab runs as root). A Close that
// never returns from rdma-core is blocked in the kernel, and its stack
// says on what (a destroy waiting for a reference, a device's task).
func KernelStacks() string {
	tasks, _ := filepath.Glob("/proc/self/task/*/stack")
	var out strings.Builder
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			continue
		}
		s := string(b)
		idle := false
		for _, w := range idleWaits {
			idle = idle || strings.Contains(s, w)
		}
		if !idle {
			comm, _ := os.ReadFile(filepath.Join(filepath.Dir(f), "comm"))
			fmt.Fprintf(&out, "thread %s (%s):\n%s\n", filepath.Base(filepath.Dir(f)), strings.TrimSpace(string(comm)), s)
		}
	}
	return out.String()
}
