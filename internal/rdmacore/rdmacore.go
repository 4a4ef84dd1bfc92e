// Package rdmacore is rdmanet's only cgo code: it opens rdma-core (libibverbs.so.1
// and librdmacm.so.1) with dlopen at first use, declares the part of rdma-core's
// ABI that rdmanet uses (abi.h), and exposes thin, batched calls over it.
//
// Nothing links against rdma-core, so a program that imports rdmanet builds where
// Go builds and runs where rdma-core is missing; Load then says why RDMA is
// unavailable. In builds without cgo, or off Linux, every call returns
// ErrNotSupported. The packages verbs and cm are the idiomatic Go API on top.
package rdmacore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// ErrNotSupported is returned by every call in a build without cgo or off Linux.
var ErrNotSupported = errors.New("RDMA not supported in this build (needs linux and cgo)")

// UnavailableError says that rdma-core could not be loaded.
type UnavailableError struct {
	Library string // "libibverbs.so.1" or "librdmacm.so.1"
	Reason  string // dlopen's or dlvsym's message
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("rdma-core unavailable: %s: %s (on Debian: apt-get install libibverbs1 librdmacm1 ibverbs-providers)", e.Library, e.Reason)
}

// CallError is a failed call into rdma-core: which function, and the errno.
type CallError struct {
	Func  string
	Errno syscall.Errno
	// Descriptors is set when a call that opens file descriptors failed
	// while the process had all, or nearly all, that its RLIMIT_NOFILE
	// allows open. rdma-core does not always say so: at the limit
	// rdma_create_event_channel reports ENOENT (it falls back to making
	// its device node, which fails too). Such an error matches
	// syscall.EMFILE as well as Errno.
	Descriptors *DescriptorLimit
	// Memory is set when a registration failed (ENOMEM or EPERM) where
	// RLIMIT_MEMLOCK is the likely cause.
	Memory *MemoryLimit
}

// DescriptorLimit is the process's file descriptors when a call failed.
type DescriptorLimit struct {
	Open  int // open then (after the failed call)
	Limit int // RLIMIT_NOFILE's soft limit
}

// MemoryLimit is the process's pinned memory when a registration failed
// for RLIMIT_MEMLOCK: pinning Asked more bytes would have passed the limit,
// and the process has no CAP_IPC_LOCK to lift it.
type MemoryLimit struct {
	Asked  int64 // bytes the call would have pinned
	Pinned int64 // bytes pinned then (VmPin)
	Limit  int64 // RLIMIT_MEMLOCK's soft limit
}

func (e *CallError) Error() string {
	s := e.Func + ": " + e.Errno.Error()
	if d := e.Descriptors; d != nil {
		s += fmt.Sprintf(" (the process had %d of the %d file descriptors its RLIMIT_NOFILE allows open)", d.Open, d.Limit)
	}
	if m := e.Memory; m != nil {
		s += fmt.Sprintf(" (asked to pin %s with %s pinned of the %s RLIMIT_MEMLOCK allows, %s left, and no CAP_IPC_LOCK: "+
			"raise RLIMIT_MEMLOCK (ulimit -l, LimitMEMLOCK= in systemd, --ulimit memlock= in docker) or grant CAP_IPC_LOCK, or use smaller buffers)",
			IEC(m.Asked), IEC(m.Pinned), IEC(m.Limit), IEC(max(m.Limit-m.Pinned, 0)))
	}
	return s
}

// IEC writes n bytes in binary units: whole where exact ("8 MiB"), else
// to one decimal ("7.9 MiB").
func IEC(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	if n%div == 0 {
		return fmt.Sprintf("%d %ciB", n/div, "KMGTPE"[exp])
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// memoryLimitFor is the MemoryLimit to report for a registration of asked
// bytes that failed, if RLIMIT_MEMLOCK is the likely cause: the process
// has no CAP_IPC_LOCK and the bytes would not have fitted under it.
func memoryLimitFor(asked int64) *MemoryLimit {
	pinned, limit, capIPCLock, ok := PinnedMemory()
	if !ok || capIPCLock || limit < 0 || pinned+asked <= limit {
		return nil
	}
	return &MemoryLimit{Asked: asked, Pinned: pinned, Limit: limit}
}

// parseStatus reads VmPin (in bytes) and CAP_IPC_LOCK in the effective
// set from the text of /proc/self/status.
func parseStatus(status string) (pinned int64, capIPCLock, ok bool) {
	var havePin, haveCap bool
	for _, line := range strings.Split(status, "\n") {
		key, value, found := strings.Cut(line, ":")
		if !found {
			continue
		}
		value = strings.TrimSpace(value)
		switch key {
		case "VmPin":
			kb, err := strconv.ParseInt(strings.TrimSuffix(value, " kB"), 10, 64)
			pinned, havePin = kb<<10, err == nil
		case "CapEff":
			bits, err := strconv.ParseUint(value, 16, 64)
			const capIPCLockBit = 14
			capIPCLock, haveCap = bits&(1<<capIPCLockBit) != 0, err == nil
		}
	}
	return pinned, capIPCLock, havePin && haveCap
}

func (e *CallError) Unwrap() error { return e.Errno }

// Is matches syscall.EMFILE when the descriptor limit is the likely cause.
func (e *CallError) Is(target error) bool {
	return e.Descriptors != nil && target == syscall.EMFILE
}

// opensDescriptors are the calls that open file descriptors (the first
// rdma_create_id opens every device).
var opensDescriptors = map[string]bool{
	"rdma_create_event_channel": true, "rdma_create_id": true, "ibv_create_comp_channel": true,
	"ibv_open_device": true, "ibv_get_device_list": true,
}

// descriptorSlack is how near the limit counts as at it: the failed call
// gave back what it had opened, and other goroutines open and close
// descriptors meanwhile.
const descriptorSlack = 16

func callError(fn string, errno syscall.Errno) error {
	if errno == 0 {
		// rdma-core reported failure without an errno; EIO is the honest default.
		errno = syscall.EIO
	}
	e := &CallError{Func: fn, Errno: errno}
	if opensDescriptors[fn] {
		if open, limit, ok := DescriptorUse(); ok && open+descriptorSlack >= limit {
			e.Descriptors = &DescriptorLimit{Open: open, Limit: limit}
		}
	}
	return e
}

// Handles to objects that rdma-core allocates. They are only ever passed back.
type (
	Context      unsafe.Pointer // struct ibv_context *
	PD           unsafe.Pointer // struct ibv_pd *
	MR           unsafe.Pointer // struct ibv_mr *
	CompChannel  unsafe.Pointer // struct ibv_comp_channel *
	CQ           unsafe.Pointer // struct ibv_cq *
	QP           unsafe.Pointer // struct ibv_qp *
	SRQ          unsafe.Pointer // struct ibv_srq *
	EventChannel unsafe.Pointer // struct rdma_event_channel *
	CMID         unsafe.Pointer // struct rdma_cm_id *
)

// SendReq is one send work request with at most one scatter/gather element.
// Its layout is mirrored by struct rn_send_req in shim.h.
type SendReq struct {
	ID         uint64
	Addr       uint64 // local address inside a registered region
	Length     uint32
	LKey       uint32
	RemoteAddr uint64
	RKey       uint32
	Imm        uint32 // host order; rdma-core gets it big-endian
	Opcode     uint8
	Flags      uint8
	_          [6]byte
}

// RecvReq is one receive work request (struct rn_recv_req).
type RecvReq struct {
	ID     uint64
	Addr   uint64
	Length uint32
	LKey   uint32
}

// WC is one work completion (struct rn_wc).
type WC struct {
	ID        uint64
	Status    uint32
	Opcode    uint32
	ByteLen   uint32
	Imm       uint32 // host order
	VendorErr uint32
	Flags     uint32
	QPNum     uint32
	_         uint32
}

// Work request opcodes, send flags, completion flags and access flags of rdma-core.
const (
	OpRDMAWrite        = 0
	OpRDMAWriteWithImm = 1
	OpSend             = 2
	OpSendWithImm      = 3

	SendFence     = 1
	SendSignaled  = 2
	SendSolicited = 4
	SendInline    = 8

	WCWithImm = 2

	AccessLocalWrite  = 1
	AccessRemoteWrite = 2
	AccessRemoteRead  = 4
)

// DeviceInfo describes one RDMA device from ibv_get_device_list.
type DeviceInfo struct {
	Name          string
	GUID          uint64
	TransportType int
}

// DeviceAttr is the part of struct ibv_device_attr rdmanet reports.
type DeviceAttr struct {
	FirmwareVersion string
	NodeGUID        uint64
	MaxMRSize       uint64
	VendorID        uint32
	VendorPartID    uint32
	MaxQP           int
	MaxQPWR         int
	MaxSGE          int
	MaxCQ           int
	MaxCQE          int
	MaxMR           int
	MaxPD           int
	MaxQPRdAtom     int
	PhysPortCount   int
}

// PortAttr is the part of struct ibv_port_attr rdmanet reports.
type PortAttr struct {
	State       int
	MaxMTU      int
	ActiveMTU   int
	GIDTableLen int
	MaxMsgSize  uint32
	LinkLayer   int
}

// QPCap is struct ibv_qp_cap: requested, then actual, queue sizes.
type QPCap struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// ConnParam is the part of struct rdma_conn_param rdmanet sets and reads.
type ConnParam struct {
	PrivateData        []byte
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8
	RNRRetryCount      uint8
	QPNum              uint32 // read only
}

// CMEvent is a copy of one struct rdma_cm_event; Raw is the original, until
// AckCMEvent.
type CMEvent struct {
	Raw      unsafe.Pointer
	ID       CMID
	ListenID CMID
	Type     int
	Status   int
	Param    ConnParam
}

// AsyncEvent is a copy of one struct ibv_async_event; the original is
// already acknowledged. Type is enum ibv_event_type; which of the other
// fields is set depends on it: Port for port events, QP, QPNum and CQ (the
// queue pair's send CQ) for queue pair events, CQ for CQ_ERR, SRQ for SRQ
// events. The pointers are identities only: the objects may be gone.
type AsyncEvent struct {
	Type  int
	Port  uint8
	QPNum uint32
	CQ    CQ
	QP    QP
	SRQ   SRQ
}

// Sockaddr is a struct sockaddr_storage as Linux lays it out.
type Sockaddr [128]byte

const (
	afInet  = 2
	afInet6 = 10
)

// EncodeSockaddr writes ap as a sockaddr_in or sockaddr_in6.
func EncodeSockaddr(ap netip.AddrPort) Sockaddr {
	var sa Sockaddr
	a := ap.Addr()
	if a.Is4() || a.Is4In6() {
		binary.NativeEndian.PutUint16(sa[0:], afInet)
		binary.BigEndian.PutUint16(sa[2:], ap.Port())
		v4 := a.Unmap().As4()
		copy(sa[4:8], v4[:])
		return sa
	}
	binary.NativeEndian.PutUint16(sa[0:], afInet6)
	binary.BigEndian.PutUint16(sa[2:], ap.Port())
	v6 := a.As16()
	copy(sa[8:24], v6[:])
	if z := a.Zone(); z != "" {
		if ifi, err := interfaceIndex(z); err == nil {
			binary.NativeEndian.PutUint32(sa[24:], uint32(ifi))
		}
	}
	return sa
}

// DecodeSockaddr reads a sockaddr_in or sockaddr_in6; anything else is the zero AddrPort.
func DecodeSockaddr(sa *Sockaddr) netip.AddrPort {
	switch binary.NativeEndian.Uint16(sa[0:]) {
	case afInet:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), binary.BigEndian.Uint16(sa[2:]))
	case afInet6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(sa[8:24])), binary.BigEndian.Uint16(sa[2:]))
	}
	return netip.AddrPort{}
}
