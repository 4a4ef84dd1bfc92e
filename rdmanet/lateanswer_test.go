package rdmanet

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
)

// TestDialMemoryOfABusyPeer: a timeout toward a peer that answers RDMA is
// not remembered and does not say the host may have no RDMA; a late answer
// forgets a timeout remembered before it.
func TestDialMemoryOfABusyPeer(t *testing.T) {
	ForgetFailures()
	t.Cleanup(ForgetFailures)
	dst := netip.MustParseAddrPort("198.18.0.2:7471")
	timeout := context.DeadlineExceeded

	why := attemptFailed(dst, timeout)
	if why.Reason != fallback.ReasonTimeout || why.PeerAnswers || failures.Recall(dst) == nil {
		t.Fatalf("first timeout: %+v, remembered %v; want a remembered timeout (nothing known of the peer)", why, failures.Recall(dst))
	}
	lateAnswer(dst, cm.EventUnreachable) // not an answer
	if failures.Recall(dst) == nil {
		t.Fatal("an UNREACHABLE after the dial forgot the timeout")
	}
	lateAnswer(dst, cm.EventEstablished)
	if got := failures.Recall(dst); got != nil {
		t.Fatalf("a late answer left %v remembered", got)
	}
	why = attemptFailed(dst, timeout)
	if !why.PeerAnswers || failures.Recall(dst) != nil {
		t.Errorf("a timeout toward a peer that answered: %+v, remembered %v; want a busy peer, not remembered", why, failures.Recall(dst))
	}
	if s := why.Error(); !errors.Is(why, fallback.ReasonTimeout) || strings.Contains(s, "may have no RDMA") {
		t.Errorf("its message: %q", s)
	}

	other := netip.MustParseAddrPort("198.18.0.2:7472")
	lateAnswer(other, cm.EventRejected)
	if !failures.Answers(other) {
		t.Error("a late reject is an answer too")
	}

	refused := &cm.EventError{Op: "connect", Event: cm.EventRejected, Status: cm.RejectConsumer}
	third := netip.MustParseAddrPort("198.18.0.3:7471")
	if why := attemptFailed(third, refused); !why.PeerAnswers || failures.Recall(third) != nil {
		t.Errorf("a listener's refusal: %+v, remembered %v; want not remembered", why, failures.Recall(third))
	}
	noListener := &cm.EventError{Op: "connect", Event: cm.EventRejected, Status: cm.RejectInvalidServiceID}
	if why := attemptFailed(third, noListener); why.PeerAnswers || failures.Recall(third) == nil {
		t.Errorf("no listener on the port: %+v, remembered %v; want remembered", why, failures.Recall(third))
	}
}
