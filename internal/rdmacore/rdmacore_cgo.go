//go:build linux && cgo

package rdmacore

/*
#cgo LDFLAGS: -ldl
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"sync"
	"syscall"
	"unsafe"
)

// The Go mirrors of shim.h's plain structs must match them byte for byte.
var (
	_ [unsafe.Sizeof(SendReq{}) - unsafe.Sizeof(C.struct_rn_send_req{})]byte
	_ [unsafe.Sizeof(C.struct_rn_send_req{}) - unsafe.Sizeof(SendReq{})]byte
	_ [unsafe.Sizeof(RecvReq{}) - unsafe.Sizeof(C.struct_rn_recv_req{})]byte
	_ [unsafe.Sizeof(C.struct_rn_recv_req{}) - unsafe.Sizeof(RecvReq{})]byte
	_ [unsafe.Sizeof(WC{}) - unsafe.Sizeof(C.struct_rn_wc{})]byte
	_ [unsafe.Sizeof(C.struct_rn_wc{}) - unsafe.Sizeof(WC{})]byte
	_ [unsafe.Offsetof(SendReq{}.RemoteAddr) - unsafe.Offsetof(C.struct_rn_send_req{}.remote_addr)]byte
	_ [unsafe.Offsetof(C.struct_rn_send_req{}.remote_addr) - unsafe.Offsetof(SendReq{}.RemoteAddr)]byte
	_ [unsafe.Offsetof(SendReq{}.Opcode) - unsafe.Offsetof(C.struct_rn_send_req{}.opcode)]byte
	_ [unsafe.Offsetof(C.struct_rn_send_req{}.opcode) - unsafe.Offsetof(SendReq{}.Opcode)]byte

	_ [unsafe.Offsetof(WC{}.QPNum) - unsafe.Offsetof(C.struct_rn_wc{}.qp_num)]byte
	_ [unsafe.Offsetof(C.struct_rn_wc{}.qp_num) - unsafe.Offsetof(WC{}.QPNum)]byte
)

var loaded = sync.OnceValue(func() error {
	var msg [512]C.char
	switch C.rn_load(&msg[0], C.size_t(len(msg))) {
	case 0:
		return nil
	case 1:
		return &UnavailableError{Library: "libibverbs.so.1", Reason: C.GoString(&msg[0])}
	default:
		return &UnavailableError{Library: "librdmacm.so.1", Reason: C.GoString(&msg[0])}
	}
})

// Load opens rdma-core once; later calls return the first result. Every other
// function in this package requires a successful Load.
func Load() error { return loaded() }

func errnoOf(err error) syscall.Errno {
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return 0
}

// ---- devices ---------------------------------------------------------------

func ListDevices() ([]DeviceInfo, error) {
	const max = 64
	var names [max * 64]C.char
	var guids [max]C.uint64_t
	var transport [max]C.int
	n, err := C.rn_list_devices(&names[0], &guids[0], &transport[0], max)
	if n < 0 {
		return nil, callError("ibv_get_device_list", errnoOf(err))
	}
	out := make([]DeviceInfo, int(n))
	for i := range out {
		out[i] = DeviceInfo{
			Name:          C.GoString(&names[i*64]),
			GUID:          uint64(guids[i]),
			TransportType: int(transport[i]),
		}
	}
	return out, nil
}

func OpenDevice(name string) (Context, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	ctx, err := C.rn_open_device(cname)
	if ctx == nil {
		return nil, callError("ibv_open_device", errnoOf(err))
	}
	return Context(ctx), nil
}

func CloseDevice(ctx Context) error {
	if rc, err := C.rn_close_device((*C.struct_rn_ibv_context)(ctx)); rc != 0 {
		return callError("ibv_close_device", errnoOf(err))
	}
	return nil
}

// ContextDeviceName is the name of the device ctx was opened on.
func ContextDeviceName(ctx Context) string {
	return C.GoString(&(*C.struct_rn_ibv_context)(ctx).device.name[0])
}

// ContextTransport is the transport (enum ibv_transport_type) of the device
// ctx was opened on.
func ContextTransport(ctx Context) int {
	return int((*C.struct_rn_ibv_context)(ctx).device.transport_type)
}

func NumCompVectors(ctx Context) int {
	return int((*C.struct_rn_ibv_context)(ctx).num_comp_vectors)
}

func QueryDevice(ctx Context) (DeviceAttr, error) {
	var a C.struct_rn_ibv_device_attr
	if rc := C.rn_query_device((*C.struct_rn_ibv_context)(ctx), &a); rc != 0 {
		return DeviceAttr{}, callError("ibv_query_device", syscall.Errno(rc))
	}
	return DeviceAttr{
		FirmwareVersion: C.GoString(&a.fw_ver[0]),
		NodeGUID:        beToHost64(uint64(a.node_guid)),
		MaxMRSize:       uint64(a.max_mr_size),
		VendorID:        uint32(a.vendor_id),
		VendorPartID:    uint32(a.vendor_part_id),
		MaxQP:           int(a.max_qp),
		MaxQPWR:         int(a.max_qp_wr),
		MaxSGE:          int(a.max_sge),
		MaxCQ:           int(a.max_cq),
		MaxCQE:          int(a.max_cqe),
		MaxMR:           int(a.max_mr),
		MaxPD:           int(a.max_pd),
		MaxQPRdAtom:     int(a.max_qp_rd_atom),
		PhysPortCount:   int(a.phys_port_cnt),
	}, nil
}

func QueryPort(ctx Context, port uint8) (PortAttr, error) {
	var a C.struct_rn_ibv_port_attr
	if rc := C.rn_query_port((*C.struct_rn_ibv_context)(ctx), C.uint8_t(port), &a); rc != 0 {
		return PortAttr{}, callError("ibv_query_port", syscall.Errno(rc))
	}
	return PortAttr{
		State:       int(a.state),
		MaxMTU:      int(a.max_mtu),
		ActiveMTU:   int(a.active_mtu),
		GIDTableLen: int(a.gid_tbl_len),
		MaxMsgSize:  uint32(a.max_msg_sz),
		LinkLayer:   int(a.link_layer),
	}, nil
}

func QueryGID(ctx Context, port uint8, index int) ([16]byte, error) {
	var gid [16]byte
	rc, err := C.rn_query_gid((*C.struct_rn_ibv_context)(ctx), C.uint8_t(port), C.int(index), (*C.uint8_t)(&gid[0]))
	if rc != 0 {
		return gid, callError("ibv_query_gid", errnoOf(err))
	}
	return gid, nil
}

// ---- protection domains and memory regions ---------------------------------

func AllocPD(ctx Context) (PD, error) {
	pd, err := C.rn_alloc_pd((*C.struct_rn_ibv_context)(ctx))
	if pd == nil {
		return nil, callError("ibv_alloc_pd", errnoOf(err))
	}
	return PD(pd), nil
}

func DeallocPD(pd PD) error {
	if rc := C.rn_dealloc_pd(unsafe.Pointer(pd)); rc != 0 {
		return callError("ibv_dealloc_pd", syscall.Errno(rc))
	}
	return nil
}

// RegMR registers [addr, addr+length). The memory must not be Go-managed: it
// stays in use by the device until DeregMR.
func RegMR(pd PD, addr unsafe.Pointer, length int, access int) (mr MR, lkey, rkey uint32, err error) {
	m, cerr := C.rn_reg_mr(unsafe.Pointer(pd), addr, C.size_t(length), C.int(access))
	if m == nil {
		err := callError("ibv_reg_mr", errnoOf(cerr))
		if ce := err.(*CallError); ce.Errno == syscall.ENOMEM || ce.Errno == syscall.EPERM {
			ce.Memory = memoryLimitFor(int64(length))
		}
		return nil, 0, 0, err
	}
	return MR(m), uint32(m.lkey), uint32(m.rkey), nil
}

func DeregMR(mr MR) error {
	if rc := C.rn_dereg_mr((*C.struct_rn_ibv_mr)(mr)); rc != 0 {
		return callError("ibv_dereg_mr", syscall.Errno(rc))
	}
	return nil
}

// ---- completion channels and queues ----------------------------------------

// CreateCompChannel returns the channel and its file descriptor.
func CreateCompChannel(ctx Context) (CompChannel, int, error) {
	ch, err := C.rn_create_comp_channel((*C.struct_rn_ibv_context)(ctx))
	if ch == nil {
		return nil, -1, callError("ibv_create_comp_channel", errnoOf(err))
	}
	return CompChannel(ch), int(ch.fd), nil
}

func DestroyCompChannel(ch CompChannel) error {
	if rc := C.rn_destroy_comp_channel((*C.struct_rn_ibv_comp_channel)(ch)); rc != 0 {
		return callError("ibv_destroy_comp_channel", syscall.Errno(rc))
	}
	return nil
}

// CreateCQ returns the queue and its actual size (at least cqe).
func CreateCQ(ctx Context, cqe int, ch CompChannel, vector int) (CQ, int, error) {
	cq, err := C.rn_create_cq((*C.struct_rn_ibv_context)(ctx), C.int(cqe), (*C.struct_rn_ibv_comp_channel)(ch), C.int(vector))
	if cq == nil {
		return nil, 0, callError("ibv_create_cq", errnoOf(err))
	}
	return CQ(cq), int(cq.cqe), nil
}

func DestroyCQ(cq CQ) error {
	if rc := C.rn_destroy_cq((*C.struct_rn_ibv_cq)(cq)); rc != 0 {
		return callError("ibv_destroy_cq", syscall.Errno(rc))
	}
	return nil
}

// GetCQEvent takes one event from a non-blocking channel; syscall.EAGAIN (bare)
// when there is none.
func GetCQEvent(ch CompChannel) (CQ, error) {
	cq, err := C.rn_get_cq_event((*C.struct_rn_ibv_comp_channel)(ch))
	if cq == nil {
		if errnoOf(err) == syscall.EAGAIN {
			return nil, syscall.EAGAIN
		}
		return nil, callError("ibv_get_cq_event", errnoOf(err))
	}
	return CQ(cq), nil
}

func AckCQEvents(cq CQ, n int) {
	C.rn_ack_cq_events((*C.struct_rn_ibv_cq)(cq), C.uint(n))
}

func ReqNotifyCQ(cq CQ, solicitedOnly bool) error {
	s := C.int(0)
	if solicitedOnly {
		s = 1
	}
	if rc := C.rn_req_notify_cq((*C.struct_rn_ibv_cq)(cq), s); rc != 0 {
		return callError("ibv_req_notify_cq", syscall.Errno(rc))
	}
	return nil
}

// PollCQ fills wcs with up to len(wcs) completions (at most 64 per call).
func PollCQ(cq CQ, wcs []WC) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	n := C.rn_poll_cq((*C.struct_rn_ibv_cq)(cq), (*C.struct_rn_wc)(unsafe.Pointer(&wcs[0])), C.int(len(wcs)))
	if n < 0 {
		return 0, callError("ibv_poll_cq", syscall.EIO)
	}
	return int(n), nil
}

// ---- queue pairs -----------------------------------------------------------

func QPNum(qp QP) uint32 { return uint32((*C.struct_rn_ibv_qp)(qp).qp_num) }

// PostSend posts reqs as chains of up to 64 per provider call and returns how
// many were posted before a failure.
func PostSend(qp QP, reqs []SendReq) (int, error) {
	if len(reqs) == 0 {
		return 0, nil
	}
	r := C.rn_post_send((*C.struct_rn_ibv_qp)(qp), (*C.struct_rn_send_req)(unsafe.Pointer(&reqs[0])), C.int(len(reqs)))
	posted, rc := int(uint32(r)), syscall.Errno(r>>32)
	if rc != 0 {
		return posted, callError("ibv_post_send", rc)
	}
	return posted, nil
}

func PostRecv(qp QP, reqs []RecvReq) (int, error) {
	if len(reqs) == 0 {
		return 0, nil
	}
	r := C.rn_post_recv((*C.struct_rn_ibv_qp)(qp), (*C.struct_rn_recv_req)(unsafe.Pointer(&reqs[0])), C.int(len(reqs)))
	posted, rc := int(uint32(r)), syscall.Errno(r>>32)
	if rc != 0 {
		return posted, callError("ibv_post_recv", rc)
	}
	return posted, nil
}

// ---- shared receive queues -------------------------------------------------

// CreateSRQ creates a shared receive queue in pd for maxWR receives of one
// SGE each, armed to raise SRQ_LIMIT_REACHED below limit receives (0: not
// armed), and returns it with the size the provider gave it.
func CreateSRQ(pd PD, maxWR, limit int) (SRQ, int, error) {
	wr := C.uint32_t(maxWR)
	srq, err := C.rn_create_srq(unsafe.Pointer(pd), &wr, C.uint32_t(limit))
	if srq == nil {
		return nil, 0, callError("ibv_create_srq", errnoOf(err))
	}
	return SRQ(srq), int(wr), nil
}

// ArmSRQ sets srq's limit (ibv_modify_srq with IBV_SRQ_LIMIT).
func ArmSRQ(srq SRQ, limit int) error {
	if rc := C.rn_arm_srq((*C.struct_rn_ibv_srq)(srq), C.uint32_t(limit)); rc != 0 {
		return callError("ibv_modify_srq", syscall.Errno(rc))
	}
	return nil
}

func DestroySRQ(srq SRQ) error {
	if rc := C.rn_destroy_srq((*C.struct_rn_ibv_srq)(srq)); rc != 0 {
		return callError("ibv_destroy_srq", syscall.Errno(rc))
	}
	return nil
}

// PostSRQRecv is PostRecv for a shared receive queue.
func PostSRQRecv(srq SRQ, reqs []RecvReq) (int, error) {
	if len(reqs) == 0 {
		return 0, nil
	}
	r := C.rn_post_srq_recv((*C.struct_rn_ibv_srq)(srq), (*C.struct_rn_recv_req)(unsafe.Pointer(&reqs[0])), C.int(len(reqs)))
	posted, rc := int(uint32(r)), syscall.Errno(r>>32)
	if rc != 0 {
		return posted, callError("ibv_post_srq_recv", rc)
	}
	return posted, nil
}

// ---- rdma_cm ---------------------------------------------------------------

// CreateEventChannel returns the channel and its file descriptor.
func CreateEventChannel() (EventChannel, int, error) {
	ch, err := C.rn_create_event_channel()
	if ch == nil {
		return nil, -1, callError("rdma_create_event_channel", errnoOf(err))
	}
	return EventChannel(ch), int(ch.fd), nil
}

func DestroyEventChannel(ch EventChannel) {
	C.rn_destroy_event_channel((*C.struct_rn_rdma_event_channel)(ch))
}

// CreateID creates an id in the TCP port space (RDMA_PS_TCP, as Valkey uses).
func CreateID(ch EventChannel) (CMID, error) {
	var id *C.struct_rn_rdma_cm_id
	if rc, err := C.rn_create_id((*C.struct_rn_rdma_event_channel)(ch), &id); rc != 0 {
		return nil, callError("rdma_create_id", errnoOf(err))
	}
	return CMID(id), nil
}

func cmCall(fn string, rc C.int, err error) error {
	if rc != 0 {
		return callError(fn, errnoOf(err))
	}
	return nil
}

func DestroyID(id CMID) error {
	rc, err := C.rn_destroy_id((*C.struct_rn_rdma_cm_id)(id))
	return cmCall("rdma_destroy_id", rc, err)
}

func BindAddr(id CMID, sa *Sockaddr) error {
	rc, err := C.rn_bind_addr((*C.struct_rn_rdma_cm_id)(id), unsafe.Pointer(sa))
	return cmCall("rdma_bind_addr", rc, err)
}

// ResolveAddr starts address resolution; src may be nil.
func ResolveAddr(id CMID, src, dst *Sockaddr, timeoutMs int) error {
	rc, err := C.rn_resolve_addr((*C.struct_rn_rdma_cm_id)(id), unsafe.Pointer(src), unsafe.Pointer(dst), C.int(timeoutMs))
	return cmCall("rdma_resolve_addr", rc, err)
}

func ResolveRoute(id CMID, timeoutMs int) error {
	rc, err := C.rn_resolve_route((*C.struct_rn_rdma_cm_id)(id), C.int(timeoutMs))
	return cmCall("rdma_resolve_route", rc, err)
}

func Listen(id CMID, backlog int) error {
	rc, err := C.rn_listen((*C.struct_rn_rdma_cm_id)(id), C.int(backlog))
	return cmCall("rdma_listen", rc, err)
}

func connOrAccept(fn string, accept C.int, id CMID, p *ConnParam) error {
	var pdata unsafe.Pointer
	if len(p.PrivateData) > 0 {
		pdata = unsafe.Pointer(&p.PrivateData[0])
	}
	rc, err := C.rn_conn((*C.struct_rn_rdma_cm_id)(id), accept, pdata, C.int(len(p.PrivateData)),
		C.uint8_t(p.ResponderResources), C.uint8_t(p.InitiatorDepth), C.uint8_t(p.RetryCount), C.uint8_t(p.RNRRetryCount))
	return cmCall(fn, rc, err)
}

// Connect and Accept take at most 255 bytes of private data (the transport may allow less).
func Connect(id CMID, p *ConnParam) error { return connOrAccept("rdma_connect", 0, id, p) }
func Accept(id CMID, p *ConnParam) error  { return connOrAccept("rdma_accept", 1, id, p) }

func Reject(id CMID, privateData []byte) error {
	var pdata unsafe.Pointer
	if len(privateData) > 0 {
		pdata = unsafe.Pointer(&privateData[0])
	}
	rc, err := C.rn_reject((*C.struct_rn_rdma_cm_id)(id), pdata, C.int(len(privateData)))
	return cmCall("rdma_reject", rc, err)
}

func Disconnect(id CMID) error {
	rc, err := C.rn_disconnect((*C.struct_rn_rdma_cm_id)(id))
	return cmCall("rdma_disconnect", rc, err)
}

func MigrateID(id CMID, ch EventChannel) error {
	rc, err := C.rn_migrate_id((*C.struct_rn_rdma_cm_id)(id), (*C.struct_rn_rdma_event_channel)(ch))
	return cmCall("rdma_migrate_id", rc, err)
}

// GetCMEvent copies one event from a non-blocking channel, to be
// acknowledged with AckCMEvent; syscall.EAGAIN (bare) when there is none.
func GetCMEvent(ch EventChannel) (CMEvent, error) {
	var out C.struct_rn_cm_event_out
	var raw *C.struct_rn_rdma_cm_event
	if rc, err := C.rn_get_cm_event((*C.struct_rn_rdma_event_channel)(ch), &out, &raw); rc != 0 {
		if errnoOf(err) == syscall.EAGAIN {
			return CMEvent{}, syscall.EAGAIN
		}
		return CMEvent{}, callError("rdma_get_cm_event", errnoOf(err))
	}
	ev := CMEvent{
		Raw:      unsafe.Pointer(raw),
		ID:       CMID(out.id),
		ListenID: CMID(out.listen_id),
		Type:     int(out.event),
		Status:   int(out.status),
		Param: ConnParam{
			ResponderResources: uint8(out.responder_resources),
			InitiatorDepth:     uint8(out.initiator_depth),
			RetryCount:         uint8(out.retry_count),
			RNRRetryCount:      uint8(out.rnr_retry_count),
			QPNum:              uint32(out.qp_num),
		},
	}
	if out.private_data_len > 0 {
		ev.Param.PrivateData = C.GoBytes(unsafe.Pointer(&out.private_data[0]), C.int(out.private_data_len))
	}
	return ev, nil
}

// AckCMEvent acknowledges an event GetCMEvent returned (rdma_ack_cm_event);
// one made by hand (Raw nil) needs none.
func AckCMEvent(ev CMEvent) {
	if ev.Raw != nil {
		C.rn_ack_cm_event((*C.struct_rn_rdma_cm_event)(ev.Raw))
	}
}

// CreateQP creates an RC queue pair on id (rdma_create_qp) and returns it with
// the actual capacities. With srq, its receives come from the shared queue
// (want.MaxRecvWR is ignored).
func CreateQP(id CMID, pd PD, sendCQ, recvCQ CQ, srq SRQ, want QPCap, signalAll bool) (QP, QPCap, error) {
	c := C.struct_rn_ibv_qp_cap{
		max_send_wr:     C.uint32_t(want.MaxSendWR),
		max_recv_wr:     C.uint32_t(want.MaxRecvWR),
		max_send_sge:    C.uint32_t(want.MaxSendSGE),
		max_recv_sge:    C.uint32_t(want.MaxRecvSGE),
		max_inline_data: C.uint32_t(want.MaxInlineData),
	}
	all := C.int(0)
	if signalAll {
		all = 1
	}
	if srq != nil {
		c.max_recv_wr, c.max_recv_sge = 0, 0
	}
	rc, err := C.rn_create_qp((*C.struct_rn_rdma_cm_id)(id), unsafe.Pointer(pd), (*C.struct_rn_ibv_cq)(sendCQ), (*C.struct_rn_ibv_cq)(recvCQ), (*C.struct_rn_ibv_srq)(srq), &c, all)
	if rc != 0 {
		return nil, QPCap{}, callError("rdma_create_qp", errnoOf(err))
	}
	got := QPCap{
		MaxSendWR:     uint32(c.max_send_wr),
		MaxRecvWR:     uint32(c.max_recv_wr),
		MaxSendSGE:    uint32(c.max_send_sge),
		MaxRecvSGE:    uint32(c.max_recv_sge),
		MaxInlineData: uint32(c.max_inline_data),
	}
	return QP((*C.struct_rn_rdma_cm_id)(id).qp), got, nil
}

// SetAckTimeout sets the queue pair's local ACK timeout, 4.096 us * 2^exp,
// before connect or accept: how long an unacknowledged packet waits before
// it is sent again (retry count times, then the work request fails).
func SetAckTimeout(id CMID, exp uint8) error {
	rc, err := C.rn_set_ack_timeout((*C.struct_rn_rdma_cm_id)(id), C.uint8_t(exp))
	return cmCall("rdma_set_option(ACK_TIMEOUT)", rc, err)
}

// DestroyQP destroys the queue pair created on id by CreateQP.
func DestroyQP(id CMID) { C.rn_destroy_qp((*C.struct_rn_rdma_cm_id)(id)) }

// IDContext is the verbs context librdmacm bound id to (nil before address
// resolution or bind to a device address). librdmacm owns it.
func IDContext(id CMID) Context { return Context((*C.struct_rn_rdma_cm_id)(id).verbs) }

func IDPortNum(id CMID) uint8 { return uint8((*C.struct_rn_rdma_cm_id)(id).port_num) }

func IDLocalAddr(id CMID) *Sockaddr {
	return (*Sockaddr)(unsafe.Pointer(&(*C.struct_rn_rdma_cm_id)(id).src_addr))
}

func IDPeerAddr(id CMID) *Sockaddr {
	return (*Sockaddr)(unsafe.Pointer(&(*C.struct_rn_rdma_cm_id)(id).dst_addr))
}

// beToHost64 reads a __be64 field as a number.
func beToHost64(v uint64) uint64 {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], v)
	return binary.BigEndian.Uint64(b[:])
}

// ---- asynchronous events ---------------------------------------------------

// AsyncFD is the context's asynchronous event descriptor (context->async_fd).
func AsyncFD(ctx Context) int { return int((*C.struct_rn_ibv_context)(ctx).async_fd) }

// GetAsyncEvent copies and acknowledges one event from the context's
// asynchronous event descriptor, once that is non-blocking; syscall.EAGAIN
// (bare) when there is none.
func GetAsyncEvent(ctx Context) (AsyncEvent, error) {
	var out C.struct_rn_async_event_out
	if rc, err := C.rn_get_async_event((*C.struct_rn_ibv_context)(ctx), &out); rc != 0 {
		if errnoOf(err) == syscall.EAGAIN {
			return AsyncEvent{}, syscall.EAGAIN
		}
		return AsyncEvent{}, callError("ibv_get_async_event", errnoOf(err))
	}
	return AsyncEvent{
		Type:  int(out.event_type),
		Port:  uint8(out.port_num),
		QPNum: uint32(out.qp_num),
		CQ:    CQ(out.cq),
		QP:    QP(out.qp),
		SRQ:   SRQ(out.srq),
	}, nil
}
