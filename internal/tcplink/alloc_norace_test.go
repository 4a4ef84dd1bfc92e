//go:build !race

// Allocation counts mean nothing under the race detector, which allocates
// itself.

package tcplink

import (
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

// TestNoAllocationsPerRequest: in steady state, requests and their
// completions allocate nothing, in the caller or in the link's goroutines
// (AllocsPerRun counts the whole process).
func TestNoAllocationsPerRequest(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a, b := newPair(t, tr, testSpec(), testSpec())
			cs := make([]link.Completion, 8)
			wrs := []link.SendWR{
				data(b, 0, 100, 0, false, 1),     // inlined
				data(b, 100, 2000, 100, true, 2), // from the ring
				control(3, 0),
			}
			round := func() {
				if err := a.PostSend(wrs); err != nil {
					t.Fatal(err)
				}
				take(t, b, cs, 3)
				if err := b.PostRecv(3); err != nil {
					t.Fatal(err)
				}
				take(t, a, cs, 2)
			}
			for range 10 {
				round()
			}
			if allocs := testing.AllocsPerRun(200, round); allocs != 0 {
				t.Errorf("a round of 3 requests allocates %v times, want 0", allocs)
			}
		})
	}
}

// TestNoAllocationsPerTaggedRequest: in carrier mode too, tagged data
// from streams' transmit rings into their shared receive rings (inlined,
// from the ring, and a payload larger than the reader's buffer, which
// lands in pieces), and from SendRing, allocate nothing in steady state.
func TestNoAllocationsPerTaggedRequest(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			sp := testSpec()
			sp.carrier, sp.recvDepth = true, 8
			a, b := newPair(t, tr, sp, sp)
			_, k1 := shareSend(t, a, 4096)
			_, k2 := shareSend(t, a, 256<<10)
			_, addr1, rkey1 := shareRecv(t, b, 4096)
			_, addr2, rkey2 := shareRecv(t, b, 256<<10)
			cs := make([]link.Completion, 8)
			wrs := []link.SendWR{
				{Kind: link.SendData, Ring: k1, Tag: 1, N: 100, Remote: addr1, RKey: rkey1},                                     // inlined
				{Kind: link.SendData, Ring: k1, Tag: 1, Off: 100, N: 2000, Remote: addr1 + 100, RKey: rkey1},                    // from the ring
				{Kind: link.SendData, Ring: k2, Tag: 2, N: 200 << 10, Remote: addr2 + 1000, RKey: rkey2, Signaled: true, ID: 3}, // in pieces
				data(b, 0, 500, 0, true, 4),
				control(5, 0),
			}
			round := func() {
				if err := a.PostSend(wrs); err != nil {
					t.Fatal(err)
				}
				take(t, b, cs, 5)
				if cs[2].Tag != 2 || cs[2].N != 200<<10 {
					t.Fatalf("the large data arrived as %v %d with tag %d", cs[2].Kind, cs[2].N, cs[2].Tag)
				}
				if err := b.PostRecv(5); err != nil {
					t.Fatal(err)
				}
				take(t, a, cs, 3)
			}
			for range 10 {
				round()
			}
			if allocs := testing.AllocsPerRun(200, round); allocs != 0 {
				t.Errorf("a round of 5 tagged requests allocates %v times, want 0", allocs)
			}
		})
	}
}

// take takes n completions into cs, allocating nothing.
func take(t *testing.T, l *Link, cs []link.Completion, n int) {
	deadline := time.Now().Add(hangGuard)
	for got := 0; got < n; {
		k, err := l.Poll(cs[got:n])
		if err != nil {
			t.Fatal(err)
		}
		if k > 0 {
			got += k
			continue
		}
		l.Arm()
		if k, _ = l.Poll(cs[got:n]); k > 0 {
			got += k
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d completions", got, n)
		}
		// No timer: Wake after the guard would allocate. A link that
		// hangs ends here only when the test binary's timeout does.
		if err := l.Wait(); err != nil {
			t.Fatal(err)
		}
	}
}
