// Package verbs is a Go API over libibverbs: devices, protection domains,
// registered memory, completion queues and channels, and queue pairs.
//
// rdma-core is opened with dlopen at first use (see Available), so importing
// this package adds no link-time dependency: on a host without rdma-core, or
// in a build without cgo, every call returns an error that says why.
//
// Waiting for a completion (CompChannel.Wait) parks the goroutine in Go's
// netpoller. Posting and polling cross into C once per batch of up to 64 work
// requests or completions. Every object's Close is safe to call twice; using
// an object after Close returns ErrClosed.
//
// Queue pairs are created through rdma_cm: see package cm.
package verbs

import (
	"errors"
	"sync/atomic"

	"github.com/rdmanet/sdk/internal/rdmacore"
)

var (
	// ErrNotSupported: this build cannot use RDMA (no cgo, or not Linux).
	ErrNotSupported = rdmacore.ErrNotSupported
	// ErrClosed is returned when an object is used after Close.
	ErrClosed = errors.New("verbs: object is closed")
	// ErrNoDevice: rdma-core is there but no RDMA device is.
	ErrNoDevice = errors.New("verbs: no RDMA device")
	// ErrBusy: Close of an object that others still use (a Buffer with live MRs).
	ErrBusy = errors.New("verbs: object still in use")
	// ErrNoImmediate: the device has no immediate data (RDMA writes and
	// sends with immediate), as iWARP devices have none, and the peer's
	// protocol needs it.
	ErrNoImmediate = errors.New("verbs: the device has no immediate data")
)

type (
	// UnavailableError says that libibverbs or librdmacm could not be loaded.
	UnavailableError = rdmacore.UnavailableError
	// CallError is a failed rdma-core call: the function's name and the errno.
	CallError = rdmacore.CallError
	// DescriptorLimit is the process's file descriptors when a call that
	// opens some failed at its RLIMIT_NOFILE (CallError.Descriptors).
	DescriptorLimit = rdmacore.DescriptorLimit
)

// Available loads rdma-core (once) and reports why RDMA cannot be used, or nil.
// It does not look for devices: see Devices.
func Available() error { return rdmacore.Load() }

// live counts every object this package created and has not yet closed, so
// tests and operators can see leaks (Resources).
var live struct {
	contexts, pds, mrs, cqs, channels, qps, srqs, buffers atomic.Int64
}

// calls counts the calls into rdma-core that the data path makes, so that
// a benchmark can say what a round trip costs in them (Calls): on a
// software device (rxe) ibv_post_send, ibv_req_notify_cq and reading a
// completion event are system calls, the costliest steps of a wake-up.
var calls struct {
	postSend, postRecv, poll, emptyPoll, reqNotify, getEvent atomic.Uint64
}

// CallCounts counts this process's calls into rdma-core on the data path
// since it started.
type CallCounts struct {
	// PostSend and PostRecv count ibv_post_send calls and ibv_post_recv
	// (or ibv_post_srq_recv) calls, each of which may post many requests.
	PostSend, PostRecv uint64
	// Poll counts ibv_poll_cq calls, EmptyPoll those that found nothing.
	Poll, EmptyPoll uint64
	// ReqNotify counts ibv_req_notify_cq calls (arming a queue), GetEvent
	// the completion events read from channels (ibv_get_cq_event).
	ReqNotify, GetEvent uint64
}

// Calls returns the calls into rdma-core made so far.
func Calls() CallCounts {
	return CallCounts{
		PostSend:  calls.postSend.Load(),
		PostRecv:  calls.postRecv.Load(),
		Poll:      calls.poll.Load(),
		EmptyPoll: calls.emptyPoll.Load(),
		ReqNotify: calls.reqNotify.Load(),
		GetEvent:  calls.getEvent.Load(),
	}
}

// Sub is the calls made between before and c.
func (c CallCounts) Sub(before CallCounts) CallCounts {
	return CallCounts{
		PostSend:  c.PostSend - before.PostSend,
		PostRecv:  c.PostRecv - before.PostRecv,
		Poll:      c.Poll - before.Poll,
		EmptyPoll: c.EmptyPoll - before.EmptyPoll,
		ReqNotify: c.ReqNotify - before.ReqNotify,
		GetEvent:  c.GetEvent - before.GetEvent,
	}
}

// ResourceCounts is the number of live objects of each kind.
type ResourceCounts struct {
	Contexts, PDs, MRs, CQs, CompChannels, QPs, SRQs, Buffers int64
}

// Resources returns how many objects of each kind are open in this process.
// Contexts that librdmacm owns are not counted.
func Resources() ResourceCounts {
	return ResourceCounts{
		Contexts:     live.contexts.Load(),
		PDs:          live.pds.Load(),
		MRs:          live.mrs.Load(),
		CQs:          live.cqs.Load(),
		CompChannels: live.channels.Load(),
		QPs:          live.qps.Load(),
		SRQs:         live.srqs.Load(),
		Buffers:      live.buffers.Load(),
	}
}
