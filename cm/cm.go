// Package cm is a Go API over librdmacm: connection set-up for reliable
// connected queue pairs, addressed by IP address and port like TCP.
//
// Every ID of the process is on one event channel, which one goroutine reads,
// parked in Go's netpoller, handing each event to its ID (channel.go): an ID
// costs no descriptor and no goroutine of its own. Waiting for a step of the
// set-up (address and route resolution, connect, accept) concerns that ID
// alone, and every wait honours a context; a connection watches for its end
// with a handler (HandleEvents) instead of a waiting goroutine. Each event is
// copied into Go, matched to its ID and then acknowledged, within the read,
// so no event is ever left unacknowledged (librdmacm's destroy call waits for
// that), and an ID closed meanwhile cannot have given its memory, and with it
// the event's pointer, to a new one. A queue pair whose connect may still be
// answered is not destroyed during a read: librdmacm moves it to RTR and RTS
// there, and the kernel refuses a destroy of a queue pair in use.
//
// IDs use the TCP port space (RDMA_PS_TCP), as Valkey does: a port number here
// is separate from the kernel's TCP port of the same number.
package cm

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/rdmanet/sdk/internal/rdmacore"
	"github.com/rdmanet/sdk/verbs"
)

// EventType is enum rdma_cm_event_type.
type EventType int

const (
	EventAddrResolved EventType = iota
	EventAddrError
	EventRouteResolved
	EventRouteError
	EventConnectRequest
	EventConnectResponse
	EventConnectError
	EventUnreachable
	EventRejected
	EventEstablished
	EventDisconnected
	EventDeviceRemoval
	EventMulticastJoin
	EventMulticastError
	EventAddrChange
	EventTimewaitExit
)

var eventNames = [...]string{
	"ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR", "CONNECT_REQUEST",
	"CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE", "REJECTED", "ESTABLISHED",
	"DISCONNECTED", "DEVICE_REMOVAL", "MULTICAST_JOIN", "MULTICAST_ERROR", "ADDR_CHANGE",
	"TIMEWAIT_EXIT",
}

func (t EventType) String() string {
	if t >= 0 && int(t) < len(eventNames) {
		return eventNames[t]
	}
	return fmt.Sprintf("EVENT(%d)", int(t))
}

// ConnParam is what one side offers in connect or accept, and what the other
// side sees (struct rdma_conn_param, in part).
type ConnParam struct {
	// PrivateData travels with the request, accept or reject: at most 56 bytes
	// on a connect and 196 on an accept for InfiniBand and RoCE.
	PrivateData        []byte
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8 // ignored on accept
	RNRRetryCount      uint8
	QPNum              uint32 // the peer's queue pair number, when received
}

func (p ConnParam) core() rdmacore.ConnParam {
	return rdmacore.ConnParam{
		PrivateData:        p.PrivateData,
		ResponderResources: p.ResponderResources,
		InitiatorDepth:     p.InitiatorDepth,
		RetryCount:         p.RetryCount,
		RNRRetryCount:      p.RNRRetryCount,
	}
}

func connParamOf(p rdmacore.ConnParam) ConnParam {
	return ConnParam{
		PrivateData:        p.PrivateData,
		ResponderResources: p.ResponderResources,
		InitiatorDepth:     p.InitiatorDepth,
		RetryCount:         p.RetryCount,
		RNRRetryCount:      p.RNRRetryCount,
		QPNum:              p.QPNum,
	}
}

// Event is one rdma_cm event, already acknowledged.
type Event struct {
	Type   EventType
	Status int // 0, a negative errno, or (REJECTED) the transport's reject reason
	Param  ConnParam
}

var (
	ErrNotSupported = rdmacore.ErrNotSupported
	// ErrClosed is returned when an ID is used after Close.
	ErrClosed = errors.New("cm: ID is closed")
	// ErrRejected: the peer (or its host, when nothing listens there) refused.
	ErrRejected = errors.New("cm: connection rejected")
	// ErrUnreachable: the peer did not answer, or no path reaches it.
	ErrUnreachable = errors.New("cm: peer unreachable")
	// ErrConnectFailed: the peer answered, but the connection could not
	// be established (CONNECT_ERROR: the exchange after the answer
	// failed, as on a host too busy to finish it in time). Unlike
	// ErrUnreachable it says nothing of whether RDMA reaches the peer.
	ErrConnectFailed = errors.New("cm: connection set-up failed after the peer answered")
	// ErrAddrResolution: no RDMA device reaches the address.
	ErrAddrResolution = errors.New("cm: address resolution failed")
	// ErrRouteResolution: no route to the peer over RDMA.
	ErrRouteResolution = errors.New("cm: route resolution failed")
	// ErrDisconnected: the connection ended.
	ErrDisconnected = errors.New("cm: disconnected")
	// ErrLocalPortBusy: on iWARP, rdma_connect's TCP connection could not
	// use the local port rdma_cm chose for the ID (EADDRNOTAVAIL: a
	// connection of the same ports is still in the kernel, TIME_WAIT).
	// Another ID, with another port, may connect.
	ErrLocalPortBusy = errors.New("cm: the local port is busy")
)

type (
	UnavailableError = rdmacore.UnavailableError
	CallError        = rdmacore.CallError
)

// Reject reasons of the InfiniBand CM (RoCE uses it too) that rdmanet tells apart.
const (
	RejectInvalidServiceID = 8  // nothing listens on that port
	RejectConsumer         = 28 // the peer's application rejected
)

// EventError is a set-up step that ended with the wrong event.
type EventError struct {
	Op          string    // "resolve address", "connect", ...
	Event       EventType // what arrived instead of success
	Status      int
	PrivateData []byte // from the peer, with a reject
}

func (e *EventError) Error() string {
	s := fmt.Sprintf("cm: %s: %v", e.Op, e.Event)
	switch {
	case e.Event == EventRejected && e.NoListener():
		s += " (nothing listens on that port)"
	case e.Event == EventRejected:
		s += fmt.Sprintf(" (reason %d)", e.Status)
	case e.Status < 0:
		s += ": " + syscall.Errno(-e.Status).Error()
	}
	return s
}

// NoListener reports a reject by the peer's host because nothing listens on the port.
func (e *EventError) NoListener() bool {
	return e.Event == EventRejected && (e.Status == RejectInvalidServiceID || e.Status == -int(syscall.ECONNREFUSED))
}

// Is matches the sentinel for the event: ErrRejected, ErrUnreachable, ...
func (e *EventError) Is(target error) bool {
	switch target {
	case ErrRejected:
		return e.Event == EventRejected
	case ErrUnreachable:
		return e.Event == EventUnreachable
	case ErrConnectFailed:
		return e.Event == EventConnectError
	case ErrAddrResolution:
		return e.Event == EventAddrError
	case ErrRouteResolution:
		return e.Event == EventRouteError
	case ErrDisconnected:
		return e.Event == EventDisconnected || e.Event == EventDeviceRemoval || e.Event == EventTimewaitExit
	}
	return false
}

// Unwrap gives the errno the event carried, if any (e.g. ENODEV, ETIMEDOUT).
func (e *EventError) Unwrap() error {
	if e.Status < 0 {
		return syscall.Errno(-e.Status)
	}
	return nil
}

// Available loads rdma-core and reports why RDMA cannot be used, or nil.
func Available() error { return verbs.Available() }
