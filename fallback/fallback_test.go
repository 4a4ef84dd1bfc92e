package fallback

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/verbs"
)

func TestParsePolicy(t *testing.T) {
	for in, want := range map[string]Policy{
		"auto": Auto, "": Auto, " AUTO ": Auto,
		"rdma": RDMAOnly, "rdma-only": RDMAOnly, "RdmaOnly": RDMAOnly,
		"tcp": TCPOnly, "TCP-only": TCPOnly,
	} {
		got, err := ParsePolicy(in)
		if err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %v, %v; want %v", in, got, err, want)
		}
		if again, _ := ParsePolicy(got.String()); again != got {
			t.Errorf("ParsePolicy(%v.String()) = %v", got, again)
		}
	}
	var pe *PolicyError
	if _, err := ParsePolicy("fast"); !errors.As(err, &pe) || pe.Value != "fast" {
		t.Errorf("ParsePolicy(fast) error = %v, want a *PolicyError", err)
	}
}

func TestEffective(t *testing.T) {
	t.Setenv(EnvPolicy, "")
	if p, err := Effective(RDMAOnly); p != RDMAOnly || err != nil {
		t.Errorf("empty %s: %v, %v; want the field's policy", EnvPolicy, p, err)
	}
	t.Setenv(EnvPolicy, "tcp")
	if p, err := Effective(RDMAOnly); p != TCPOnly || err != nil {
		t.Errorf("%s=tcp: %v, %v; want tcp", EnvPolicy, p, err)
	}
	t.Setenv(EnvPolicy, "maybe")
	var pe *PolicyError
	if _, err := Effective(Auto); !errors.As(err, &pe) || pe.Source != EnvPolicy {
		t.Errorf("%s=maybe: %v, want a *PolicyError naming the variable", EnvPolicy, err)
	}
}

func TestClassify(t *testing.T) {
	noCgo := ReasonNoCgo
	if runtime.GOOS != "linux" {
		noCgo = ReasonUnsupportedOS
	}
	for _, tc := range []struct {
		err  error
		want Reason
	}{
		{fmt.Errorf("x: %w", verbs.ErrNotSupported), noCgo},
		{&verbs.UnavailableError{}, ReasonNoLibrary},
		{fmt.Errorf("verbs: %w: ENOSYS", verbs.ErrNoDevice), ReasonNoDevice},
		{&cm.EventError{Op: "connect", Event: cm.EventRejected, Status: cm.RejectInvalidServiceID}, ReasonRejected},
		{&cm.EventError{Op: "connect", Event: cm.EventRejected, Status: cm.RejectConsumer}, ReasonRejected},
		{context.DeadlineExceeded, ReasonTimeout},
		{&cm.EventError{Op: "connect", Event: cm.EventUnreachable, Status: -int(syscall.ETIMEDOUT)}, ReasonTimeout},
		{&cm.EventError{Op: "resolve address", Event: cm.EventAddrError, Status: -int(syscall.ENODEV)}, ReasonUnreachable},
		{&cm.EventError{Op: "resolve route", Event: cm.EventRouteError}, ReasonUnreachable},
		{&verbs.CallError{Func: "ibv_reg_mr", Errno: syscall.ENOMEM}, ReasonResources},
		{&verbs.CallError{Func: "ibv_reg_mr", Errno: syscall.EPERM}, ReasonResources},
		{&verbs.CallError{Func: "ibv_create_qp", Errno: syscall.EPERM}, ReasonRDMAError},
		{&verbs.CallError{Func: "rdma_create_event_channel", Errno: syscall.EMFILE}, ReasonResources},
		// At the descriptor limit rdma-core may say ENOENT or ENODEV.
		{&verbs.CallError{Func: "rdma_create_event_channel", Errno: syscall.ENOENT, Descriptors: &verbs.DescriptorLimit{Open: 4090, Limit: 4096}}, ReasonResources},
		// A port clash on iWARP is passing; an address that is not local
		// (EADDRNOTAVAIL from a bind or resolve) is unreachable.
		{fmt.Errorf("%w: %w", cm.ErrLocalPortBusy, &verbs.CallError{Func: "rdma_connect", Errno: syscall.EADDRNOTAVAIL}), ReasonResources},
		{&verbs.CallError{Func: "rdma_bind_addr", Errno: syscall.EADDRNOTAVAIL}, ReasonUnreachable},
		{errors.New("something else"), ReasonRDMAError},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

func TestErrorMatches(t *testing.T) {
	setup := &cm.EventError{Op: "connect", Event: cm.EventRejected, Status: cm.RejectInvalidServiceID}
	var err error = fmt.Errorf("dial: %w", &Error{Reason: ReasonRejected, Err: setup})
	if !errors.Is(err, ReasonRejected) || errors.Is(err, ReasonTimeout) {
		t.Errorf("errors.Is by reason is wrong for %v", err)
	}
	if !errors.Is(err, cm.ErrRejected) {
		t.Errorf("%v does not match the set-up error's sentinel", err)
	}
	var ee *cm.EventError
	if !errors.As(err, &ee) || ee != setup {
		t.Errorf("errors.As does not find the set-up error in %v", err)
	}
	if !errors.Is(&Error{Reason: ReasonPolicy}, ReasonPolicy) {
		t.Error("an Error without a set-up error does not match its reason")
	}
	for _, r := range AllReasons() {
		if r.Describe() == string(r) || r.Describe() == "" {
			t.Errorf("reason %s has no description", r)
		}
	}
}

func TestMemory(t *testing.T) {
	now := time.Unix(1000, 0)
	m := NewMemory(time.Minute, 2)
	m.now = func() time.Time { return now }
	a := netip.MustParseAddrPort("198.18.1.2:6379")
	b := netip.MustParseAddrPort("198.18.1.3:6379")
	c := netip.MustParseAddrPort("198.18.1.4:6379")

	m.Remember(a, &Error{Reason: ReasonResources})
	if m.Recall(a) != nil {
		t.Error("a resource failure (this host's, not the destination's) was remembered")
	}
	m.Remember(a, &Error{Reason: ReasonTimeout})
	got := m.Recall(a)
	if got == nil || got.Reason != ReasonTimeout || !got.Remembered {
		t.Fatalf("Recall = %+v, want a remembered timeout", got)
	}
	if again := m.Recall(a); again == got {
		t.Error("Recall returned its own entry, which a caller could change")
	}
	if m.Recall(b) != nil {
		t.Error("Recall of an unknown destination returned a failure")
	}

	now = now.Add(10 * time.Second)
	m.Remember(b, &Error{Reason: ReasonRejected})
	m.Remember(c, &Error{Reason: ReasonUnreachable}) // full: a, which expires first, goes
	if m.Len() != 2 || m.Recall(a) != nil || m.Recall(b) == nil || m.Recall(c) == nil {
		t.Errorf("after filling past max: %d entries, a=%v b=%v c=%v", m.Len(), m.Recall(a), m.Recall(b), m.Recall(c))
	}
	now = now.Add(time.Minute)
	if m.Recall(b) != nil {
		t.Error("an entry outlived its TTL")
	}
	m.Remember(a, &Error{Reason: ReasonTimeout})
	m.Forget(a)
	if m.Recall(a) != nil {
		t.Error("Forget did not forget")
	}
	m.Remember(a, &Error{Reason: ReasonTimeout})
	m.Clear()
	if m.Len() != 0 {
		t.Error("Clear left entries")
	}
}

func TestCounters(t *testing.T) {
	var c Counters
	c.Dialed(RDMA)
	c.Dialed(TCP)
	c.Dialed(TCP)
	c.Accepted(RDMA)
	c.FellBack(ReasonRejected)
	c.FellBack(ReasonRejected)
	c.FellBack(ReasonNoDevice)
	s := c.Snapshot()
	if s.Dialed[RDMA] != 1 || s.Dialed[TCP] != 2 || s.Accepted[RDMA] != 1 || s.Accepted[TCP] != 0 {
		t.Errorf("connections: %+v", s)
	}
	if s.Fallbacks[ReasonRejected] != 2 || s.Fallbacks[ReasonNoDevice] != 1 || s.Fallbacks[ReasonTimeout] != 0 || len(s.Fallbacks) != len(AllReasons()) {
		t.Errorf("fallbacks: %v", s.Fallbacks)
	}
}

func TestSourceFor(t *testing.T) {
	src, err := SourceFor(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil || src != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("SourceFor(127.0.0.1) = %v, %v", src, err)
	}
	if _, err := SourceFor(netip.MustParseAddrPort("0.0.0.0:80")); err == nil {
		t.Error("SourceFor(0.0.0.0) found a source")
	}
}

func TestDiagnoseStopsAtTheFirstFailure(t *testing.T) {
	steps := Diagnose(netip.MustParseAddrPort("127.0.0.1:1"), netip.Addr{})
	last := steps[len(steps)-1]
	if last.Err == nil {
		t.Fatalf("Diagnose found RDMA usable over loopback: %+v", steps)
	}
	for _, s := range steps[:len(steps)-1] {
		if s.Err != nil {
			t.Errorf("step %q failed but Diagnose went on", s.Name)
		}
	}
	if Check(netip.MustParseAddrPort("127.0.0.1:1"), netip.Addr{}).Reason != last.Err.Reason {
		t.Error("Check disagrees with Diagnose")
	}
	t.Logf("%+v", steps)
}

func TestMemoryAnswers(t *testing.T) {
	now := time.Unix(1000, 0)
	m := NewMemory(time.Minute, 2)
	m.now = func() time.Time { return now }
	a := netip.MustParseAddrPort("198.18.0.2:6379")
	b := netip.MustParseAddrPort("198.18.0.3:6379")
	c := netip.MustParseAddrPort("198.18.0.4:6379")

	m.Remember(a, &Error{Reason: ReasonTimeout})
	if m.Answers(a) {
		t.Fatal("a destination that never answered Answers")
	}
	m.Answered(a)
	if m.Recall(a) != nil {
		t.Error("an answer did not forget the timeout remembered for the destination")
	}
	if !m.Answers(a) {
		t.Error("a destination that answered does not Answer")
	}
	// Silence from a host that answered on one port is a busy host on any
	// port: a port nobody listens on is answered with a reject at once.
	if samehost := netip.AddrPortFrom(a.Addr(), 7000); !m.Answers(samehost) || m.Answers(netip.AddrPortFrom(b.Addr(), a.Port())) {
		t.Errorf("another port of a's host answers: %v, the same port of another host: %v; want true, false",
			m.Answers(samehost), m.Answers(netip.AddrPortFrom(b.Addr(), a.Port())))
	}
	m.Remember(a, &Error{Reason: ReasonTimeout, PeerAnswers: true})
	if m.Recall(a) != nil {
		t.Error("the timeout of a peer that answers RDMA (busy) was remembered")
	}
	m.Remember(a, &Error{Reason: ReasonRejected, PeerAnswers: true})
	if m.Recall(a) != nil {
		t.Error("a listener's refusal was remembered")
	}

	m.ForgetAnswer(a)
	if m.Answers(a) {
		t.Error("ForgetAnswer kept the answer")
	}
	m.Answered(a)

	now = now.Add(10 * time.Second)
	m.Answered(b)
	m.Answered(c) // full: a, which expires first, goes
	if m.Answers(a) || !m.Answers(b) || !m.Answers(c) {
		t.Errorf("after filling past max: a=%v b=%v c=%v", m.Answers(a), m.Answers(b), m.Answers(c))
	}
	if len(m.answered) > 2 {
		t.Errorf("%d answers kept, max 2", len(m.answered))
	}
	now = now.Add(time.Minute)
	if m.Answers(b) {
		t.Error("an answer outlived its TTL")
	}
	m.Answered(a)
	m.Clear()
	if m.Answers(a) {
		t.Error("Clear kept an answer")
	}
}

func TestErrorOfABusyPeer(t *testing.T) {
	const noRDMA = "may have no RDMA"
	if s := (&Error{Reason: ReasonTimeout}).Error(); !strings.Contains(s, noRDMA) {
		t.Errorf("a timeout toward a peer not known to answer says %q; it should say the host may have no RDMA", s)
	}
	for _, r := range []Reason{ReasonTimeout, ReasonRejected} {
		e := &Error{Reason: r, PeerAnswers: true}
		s := e.Error()
		if strings.Contains(s, noRDMA) || strings.Contains(s, "no RDMA listener") || !strings.Contains(s, "busy") {
			t.Errorf("%s from a peer that answers RDMA says %q", r, s)
		}
		if !errors.Is(e, r) {
			t.Errorf("%v does not match its reason", e)
		}
	}
}

// TestHostVerdictRefreshedOffThePath: a stale verdict is still the answer
// while a goroutine finds the new one.
func TestHostVerdictRefreshedOffThePath(t *testing.T) {
	hostCheck() // the real verdict, found once
	real := host.verdict.Load()
	t.Cleanup(func() { host.verdict.Store(real) })
	stale := &hostVerdict{err: &Error{Reason: ReasonPolicy}, until: time.Now().Add(-time.Second)}
	host.verdict.Store(stale)
	if got := hostCheck(); got != stale.err {
		t.Fatalf("hostCheck with a stale verdict = %v; want the stale verdict, answered at once", got)
	}
	for deadline := time.Now().Add(30 * time.Second); host.verdict.Load() == stale; {
		if time.Now().After(deadline) {
			t.Fatal("the stale verdict was never found again")
		}
		time.Sleep(time.Millisecond)
	}
	if got, want := hostCheck(), diagnoseHost(); (got == nil) != (want[len(want)-1].Err == nil) {
		t.Errorf("after the refresh hostCheck = %v; Diagnose says %+v", got, want)
	}
}

// TestHostVerdictOfResourcesNotReused: a verdict of ReasonResources (the
// process was at its descriptor limit when rdma-core listed the devices)
// is the answer of no later dial, however fresh: the next dial finds the
// verdict again (issue 23's descriptor burst saw RDMA refused for 5 s
// after the limit was raised).
func TestHostVerdictOfResourcesNotReused(t *testing.T) {
	hostCheck()
	real := host.verdict.Load()
	t.Cleanup(func() { host.verdict.Store(real) })
	passing := &hostVerdict{err: &Error{Reason: ReasonResources}, until: time.Now().Add(time.Hour)}
	host.verdict.Store(passing)
	got, want := hostCheck(), diagnoseHost()
	if got == passing.err || host.verdict.Load() == passing {
		t.Fatalf("hostCheck answered the verdict of a passing failure again: %v", got)
	}
	if (got == nil) != (want[len(want)-1].Err == nil) {
		t.Errorf("hostCheck = %v; Diagnose says %+v", got, want)
	}
	// Any other verdict is answered while fresh.
	lasting := &hostVerdict{err: &Error{Reason: ReasonPolicy}, until: time.Now().Add(time.Hour)}
	host.verdict.Store(lasting)
	if got := hostCheck(); got != lasting.err {
		t.Errorf("hostCheck with a fresh verdict = %v; want it", got)
	}
}
