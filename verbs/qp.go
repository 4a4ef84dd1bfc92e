package verbs

import (
	"fmt"
	"github.com/rdmanet/sdk/internal/guard"
	"sync"
	"unsafe"

	"github.com/rdmanet/sdk/internal/rdmacore"
)

// QPCap holds a queue pair's capacities.
type QPCap = rdmacore.QPCap

// QP is a reliable-connected queue pair (struct ibv_qp). Package cm creates
// them (rdma_create_qp), bound to a connection.
type QP struct {
	g       guard.Guard
	raw     rdmacore.QP
	cap     QPCap
	destroy func()
	sendMu  sync.Mutex // one poster at a time keeps batches in order
	recvMu  sync.Mutex
}

// AdoptQP wraps a queue pair created through librdmacm (package cm uses it);
// destroy releases it.
func AdoptQP(raw rdmacore.QP, cap QPCap, destroy func()) *QP {
	live.qps.Add(1)
	return &QP{raw: raw, cap: cap, destroy: destroy}
}

// Num is the queue pair number.
func (qp *QP) Num() uint32 { return rdmacore.QPNum(qp.raw) }

// Raw is the rdma-core queue pair: an identity (asynchronous events name it).
func (qp *QP) Raw() rdmacore.QP { return qp.raw }

// Cap is the queue pair's actual capacities.
func (qp *QP) Cap() QPCap { return qp.cap }

// Close destroys the queue pair. Its outstanding work requests are flushed.
func (qp *QP) Close() error {
	return qp.g.Close(func() error {
		qp.destroy()
		live.qps.Add(-1)
		return nil
	})
}

// Opcode is a send work request's operation (enum ibv_wr_opcode).
type Opcode uint8

const (
	OpRDMAWrite        Opcode = rdmacore.OpRDMAWrite
	OpRDMAWriteWithImm Opcode = rdmacore.OpRDMAWriteWithImm
	OpSend             Opcode = rdmacore.OpSend
	OpSendWithImm      Opcode = rdmacore.OpSendWithImm
)

// SendFlags are enum ibv_send_flags.
type SendFlags uint8

const (
	SendFence     SendFlags = rdmacore.SendFence
	SendSignaled  SendFlags = rdmacore.SendSignaled
	SendSolicited SendFlags = rdmacore.SendSolicited
	SendInline    SendFlags = rdmacore.SendInline
)

// SendWR is a send work request with at most one scatter/gather element
// (Local.Length 0 means none). Its layout is rdmacore.SendReq's so a batch goes
// to C without copying.
type SendWR struct {
	ID         uint64
	Local      SGE
	RemoteAddr uint64 // RDMA writes: where in the peer's region
	RKey       uint32 // RDMA writes: the peer's region key
	Imm        uint32 // immediate data in host order (sent big-endian)
	Opcode     Opcode
	Flags      SendFlags
	_          [6]byte
}

// RecvWR is a receive work request with at most one scatter/gather element.
type RecvWR struct {
	ID    uint64
	Local SGE
}

// PostError is a post that stopped part way: Posted requests went to the device.
type PostError struct {
	Posted int
	Err    error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("verbs: posted %d work requests, then: %v", e.Posted, e.Err)
}

func (e *PostError) Unwrap() error { return e.Err }

// PostSend posts wrs in order, as few cgo calls as possible (64 per call).
// It does not allocate and does not keep wrs.
func (qp *QP) PostSend(wrs []SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if !qp.g.Use() {
		return ErrClosed
	}
	defer qp.g.Done()
	qp.sendMu.Lock()
	calls.postSend.Add(1)
	n, err := rdmacore.PostSend(qp.raw, unsafe.Slice((*rdmacore.SendReq)(unsafe.Pointer(&wrs[0])), len(wrs)))
	qp.sendMu.Unlock()
	if err != nil {
		return &PostError{Posted: n, Err: err}
	}
	return nil
}

// PostRecv posts receive requests, as PostSend does.
func (qp *QP) PostRecv(wrs []RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if !qp.g.Use() {
		return ErrClosed
	}
	defer qp.g.Done()
	qp.recvMu.Lock()
	calls.postRecv.Add(1)
	n, err := rdmacore.PostRecv(qp.raw, unsafe.Slice((*rdmacore.RecvReq)(unsafe.Pointer(&wrs[0])), len(wrs)))
	qp.recvMu.Unlock()
	if err != nil {
		return &PostError{Posted: n, Err: err}
	}
	return nil
}
