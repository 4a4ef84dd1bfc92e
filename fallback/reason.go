package fallback

import (
	"context"
	"errors"
	"runtime"
	"syscall"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/verbs"
)

// Reason is why a connection does not use RDMA. Each value is also an error,
// so it can be matched with errors.Is in a connection's fallback reason or in
// the error of a dial that was not allowed to fall back. The strings are
// stable: logs, counters and `rdmanet doctor --json` use them. As an error
// it formats as a sentence (fmt's %s and %v use Error); string(r) is the
// short name.
type Reason string

const (
	// ReasonPolicy: the policy (a field or EnvPolicy) said TCP only.
	ReasonPolicy Reason = "policy"
	// ReasonNoCgo: this binary was built with CGO_ENABLED=0, and rdmanet
	// reaches rdma-core only through cgo.
	ReasonNoCgo Reason = "no-cgo"
	// ReasonUnsupportedOS: RDMA is supported on Linux only.
	ReasonUnsupportedOS Reason = "unsupported-os"
	// ReasonNoLibrary: libibverbs.so.1 or librdmacm.so.1 (rdma-core) could not be loaded.
	ReasonNoLibrary Reason = "no-rdma-core"
	// ReasonNoDevice: rdma-core is there but the host has no RDMA device
	// (or the kernel has no RDMA support).
	ReasonNoDevice Reason = "no-device"
	// ReasonRouteNoRDMA: the route to the peer leaves through a network
	// interface that has no RDMA device (loopback, a plain NIC).
	ReasonRouteNoRDMA Reason = "route-without-rdma"
	// ReasonRejected: the peer's host answered over RDMA but nothing accepted
	// the connection there (no RDMA listener on that port, or it refused).
	ReasonRejected Reason = "rejected"
	// ReasonTimeout: RDMA set-up did not finish within the attempt's bound:
	// the peer's host has no RDMA, or it was too busy to answer in time
	// (Error.PeerAnswers says which, when the dial knows).
	ReasonTimeout Reason = "timeout"
	// ReasonUnreachable: RDMA address or route resolution, or the connection,
	// failed (the peer is not reachable over RDMA from here).
	ReasonUnreachable Reason = "unreachable"
	// ReasonResources: a resource limit stopped RDMA set-up: locked memory
	// (RLIMIT_MEMLOCK) for registration, memory, queue pairs, file descriptors.
	ReasonResources Reason = "resources"
	// ReasonNoImmediate: the connection's RDMA device (this host's, or the
	// peer's, which refused) has no immediate data (iWARP), and one side
	// speaks only Valkey's protocol, which needs it.
	ReasonNoImmediate Reason = "no-immediate-data"
	// ReasonIWARPPort: a listener serving TCP and RDMA on one port could not
	// listen for RDMA there, because iWARP shares TCP's port numbers (on an
	// iWARP device's address, or the wildcard address of a host with one).
	ReasonIWARPPort Reason = "iwarp-port-in-use"
	// ReasonRDMAError: RDMA set-up failed in another way (the Error's Err says how).
	ReasonRDMAError Reason = "rdma-error"
)

// reasons lists every reason; Counters number them by their place here.
var reasons = [...]Reason{
	ReasonPolicy, ReasonNoCgo, ReasonUnsupportedOS, ReasonNoLibrary, ReasonNoDevice,
	ReasonRouteNoRDMA, ReasonRejected, ReasonTimeout, ReasonUnreachable, ReasonResources, ReasonNoImmediate, ReasonIWARPPort, ReasonRDMAError,
}

// AllReasons lists every reason.
func AllReasons() []Reason { return append([]Reason(nil), reasons[:]...) }

func (r Reason) Error() string { return "rdma unavailable: " + r.Describe() }

// Describe says in a few words what the reason means.
func (r Reason) Describe() string {
	switch r {
	case ReasonPolicy:
		return "the transport policy says TCP only"
	case ReasonNoCgo:
		return "built without cgo (CGO_ENABLED=0)"
	case ReasonUnsupportedOS:
		return "RDMA is supported on Linux only"
	case ReasonNoLibrary:
		return "rdma-core (libibverbs, librdmacm) could not be loaded"
	case ReasonNoDevice:
		return "no RDMA device on this host"
	case ReasonRouteNoRDMA:
		return "the route to the peer uses a network interface without RDMA"
	case ReasonRejected:
		return "the peer has no RDMA listener on that port (rejected)"
	case ReasonTimeout:
		return "RDMA connection set-up timed out (the peer's host may have no RDMA, or be too busy to answer in time)"
	case ReasonUnreachable:
		return "the peer is not reachable over RDMA"
	case ReasonResources:
		return "a resource limit (locked memory, memory, queue pairs) stopped RDMA set-up"
	case ReasonNoImmediate:
		return "an RDMA device of the connection has no immediate data (iWARP), which Valkey's protocol, spoken by one side, needs"
	case ReasonIWARPPort:
		return "iWARP shares TCP's port numbers, so one port cannot serve both TCP and iWARP"
	case ReasonRDMAError:
		return "RDMA set-up failed"
	}
	return string(r)
}

// Hint says how an operator could make RDMA work, or "" when there is nothing
// to suggest.
func (r Reason) Hint() string {
	switch r {
	case ReasonPolicy:
		return "unset " + EnvPolicy + " or set it to auto, and check the program's policy"
	case ReasonNoCgo:
		return "build with CGO_ENABLED=1 (a C compiler is needed at build time only)"
	case ReasonUnsupportedOS:
		return "run on Linux"
	case ReasonNoLibrary:
		return "install rdma-core's libraries (Debian: apt-get install libibverbs1 librdmacm1 ibverbs-providers)"
	case ReasonNoDevice:
		return "load the NIC's RDMA driver, or add Soft-RoCE: modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0"
	case ReasonRouteNoRDMA:
		return "dial an address reached through an RDMA-capable interface, or give the Dialer a LocalAddr on one"
	case ReasonRejected:
		return "start the server with rdmanet.Listen (or another RDMA listener) on that port"
	case ReasonTimeout:
		return "check that the peer's host has RDMA (rdmanet devices) and that UDP port 4791 (RoCEv2) passes"
	case ReasonNoImmediate:
		return "reach Valkey peers through a RoCE or InfiniBand device; rdmanet peers agree on write notices over iWARP"
	case ReasonIWARPPort:
		return "listen on network \"rdma\" for iWARP clients, or serve both on an address of a RoCE or InfiniBand device"
	case ReasonResources:
		return "raise RLIMIT_MEMLOCK (ulimit -l, LimitMEMLOCK= in systemd) or use smaller buffers (rdmanet.Config)"
	}
	return ""
}

// Error is why RDMA was not used for one connection: the reason, the error
// RDMA set-up returned (nil when a check decided before trying), whether
// the reason was remembered from an earlier dial to the same destination
// rather than found now, and whether the peer answers RDMA. It matches its
// Reason and its Err with errors.Is.
type Error struct {
	Reason     Reason
	Remembered bool  // from Memory: this dial did not try RDMA
	Err        error // what RDMA set-up returned, if it was tried

	// PeerAnswers: the peer's host answers RDMA, so the failure says it was
	// busy, not that it lacks RDMA. Set for a timeout toward a host that
	// answered over RDMA recently (Memory.Answers), and for a reject by
	// an RDMA listener that is there but refused (busy, out of resources).
	// Memory never keeps such a failure.
	PeerAnswers bool
}

func (e *Error) Error() string {
	s := string(e.Reason) + ": " + e.describe()
	if e.Remembered {
		s += " (remembered from an earlier dial)"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// describe is the reason's description, or, for a peer that answers RDMA,
// what its failure means instead.
func (e *Error) describe() string {
	if e.PeerAnswers {
		switch e.Reason {
		case ReasonTimeout:
			return "the peer's host answers RDMA but did not answer this request in time (busy)"
		case ReasonRejected:
			return "the peer's RDMA listener refused the connection (busy, or out of resources)"
		}
	}
	return e.Reason.Describe()
}

// Unwrap gives the reason and the set-up error, for errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Reason}
	}
	return []error{e.Reason, e.Err}
}

// Classify names the reason for an error of RDMA set-up (from verbs, cm or
// rdmanet). A context deadline means ReasonTimeout: callers classify only
// errors of an attempt whose own deadline passed, not the caller's.
func Classify(err error) Reason {
	var unavailable *verbs.UnavailableError
	var ev *cm.EventError
	// An error that names its reason (a *Error, or a peer's refusal that
	// said why) has that reason.
	for _, r := range reasons {
		if errors.Is(err, r) {
			return r
		}
	}
	switch {
	case errors.Is(err, verbs.ErrNotSupported):
		if runtime.GOOS != "linux" {
			return ReasonUnsupportedOS
		}
		return ReasonNoCgo
	case errors.As(err, &unavailable):
		return ReasonNoLibrary
	case errors.Is(err, verbs.ErrNoDevice):
		return ReasonNoDevice
	case errors.Is(err, verbs.ErrNoImmediate):
		return ReasonNoImmediate
	case errors.As(err, &ev) && ev.Event == cm.EventRejected:
		return ReasonRejected
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		return ReasonTimeout
	case errors.Is(err, syscall.ENOMEM), errors.Is(err, syscall.EPERM) && isRegistration(err),
		errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE), errors.Is(err, syscall.ENOSPC),
		errors.Is(err, syscall.EAGAIN), errors.Is(err, cm.ErrLocalPortBusy):
		// A port clash (cm.ErrLocalPortBusy) is the moment's too: not
		// remembered, unlike EADDRNOTAVAIL's unreachable address below.
		return ReasonResources
	case errors.Is(err, cm.ErrAddrResolution), errors.Is(err, cm.ErrRouteResolution), errors.Is(err, cm.ErrUnreachable),
		errors.Is(err, syscall.ENODEV), errors.Is(err, syscall.EADDRNOTAVAIL),
		errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return ReasonUnreachable
	}
	return ReasonRDMAError
}

// isRegistration reports an error of memory registration, where EPERM means
// RLIMIT_MEMLOCK (some kernels say EPERM rather than ENOMEM there).
func isRegistration(err error) bool {
	var ce *verbs.CallError
	return errors.As(err, &ce) && ce.Func == "ibv_reg_mr"
}
