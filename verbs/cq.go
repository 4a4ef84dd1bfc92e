package verbs

import (
	"context"
	"fmt"
	"github.com/rdmanet/sdk/internal/guard"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rdmanet/sdk/internal/pollfd"
	"github.com/rdmanet/sdk/internal/rdmacore"
)

// CompChannel is a completion channel (struct ibv_comp_channel): a file
// descriptor that becomes readable when an armed CQ gets a completion.
type CompChannel struct {
	g    guard.Guard
	raw  rdmacore.CompChannel
	poll *pollfd.FD

	waitMu sync.Mutex  // one Wait at a time (pollfd's rule)
	got    rdmacore.CQ // the CQ of the event the last Wait took

	mu  sync.Mutex
	cqs map[rdmacore.CQ]*CQ // the CQs reporting to this channel

	staleEvents atomic.Uint64 // events for a CQ closed meanwhile (Wait)
}

// NewCompChannel creates a completion channel whose waits go through Go's netpoller.
func (c *Context) NewCompChannel() (*CompChannel, error) {
	if !c.g.Use() {
		return nil, ErrClosed
	}
	defer c.g.Done()
	raw, fd, err := rdmacore.CreateCompChannel(c.raw)
	if err != nil {
		return nil, err
	}
	ch := &CompChannel{raw: raw, cqs: make(map[rdmacore.CQ]*CQ)}
	if ch.poll, err = pollfd.New(fd, "ibv_comp_channel", ch.getEvent); err != nil {
		rdmacore.DestroyCompChannel(raw)
		return nil, err
	}
	live.channels.Add(1)
	return ch, nil
}

// getEvent takes one event if there is one (pollfd's read function).
func (ch *CompChannel) getEvent() (bool, error) {
	cq, err := rdmacore.GetCQEvent(ch.raw)
	if err == syscall.EAGAIN {
		return false, nil
	}
	if err == nil {
		calls.getEvent.Add(1)
	}
	ch.got = cq
	return err == nil, err
}

// Wait blocks until a CQ attached to the channel has a completion event, and
// returns that CQ. Events are one-shot: the caller re-arms the CQ with
// RequestNotify and then polls it until empty, or a completion that arrived
// between the last poll and the re-arm is never announced. Concurrent Waits
// take turns. With a context that cannot be cancelled, Wait does not allocate.
func (ch *CompChannel) Wait(ctx context.Context) (*CQ, error) {
	if !ch.g.Use() {
		return nil, ErrClosed
	}
	defer ch.g.Done()
	for {
		ch.waitMu.Lock()
		err := ch.poll.Wait(ctx)
		got := ch.got
		ch.got = nil // each event is taken once
		ch.waitMu.Unlock()
		if err != nil {
			return nil, err
		}
		ch.mu.Lock()
		cq := ch.cqs[got]
		ch.mu.Unlock()
		if cq != nil {
			cq.noteEvent()
			return cq, nil
		}
		// Not expected: a CQ's destroy waits until the events taken from
		// it are acknowledged (noteEvent, after this lookup), and only
		// then does its Close take it off the list. Until forget kept to
		// its own entry, the Close of a CQ at the same address took a
		// live CQ's, whose events came here (seen in the lab, with a link
		// group's CQs and a session's moving on one device, and as a
		// Close that hung). The handle may be freed memory: the event is
		// dropped, and counted. Returning an error here failed whichever
		// connection waited, and it was another's.
		ch.staleEvents.Add(1)
	}
}

// add lists cq as one of the channel's CQs, for Wait to find by the
// handle an event names.
func (ch *CompChannel) add(cq *CQ) {
	ch.mu.Lock()
	ch.cqs[cq.raw] = cq
	ch.mu.Unlock()
}

// forget takes a destroyed cq out of the channel's list, unless another
// CQ took its place: once ibv_destroy_cq returned, rdma-core may give the
// next CQ made the same address. Deleting that one's entry made Wait drop
// its events unacknowledged, and its ibv_destroy_cq, which waits for every
// event taken to be acknowledged, never returned (the lab, 2026-12-01: a
// connection's Close hung there, holding its device's resources).
func (ch *CompChannel) forget(cq *CQ) {
	ch.mu.Lock()
	if ch.cqs[cq.raw] == cq {
		delete(ch.cqs, cq.raw)
	}
	ch.mu.Unlock()
}

// StaleEvents counts the events Wait dropped for a CQ closed meanwhile.
func (ch *CompChannel) StaleEvents() uint64 { return ch.staleEvents.Load() }

// SetDeadline sets a deadline for all Waits, as os.File.SetReadDeadline does:
// a deadline in the past wakes pending Waits with os.ErrDeadlineExceeded.
// Owners use it to stop a goroutine that waits without a context.
func (ch *CompChannel) SetDeadline(t time.Time) error { return ch.poll.SetDeadline(t) }

// Close destroys the channel. Its CQs must be closed first; pending Waits
// return ErrClosed.
func (ch *CompChannel) Close() error {
	// Wake waiters before taking the write lock they hold the read side of.
	ch.poll.Close()
	return ch.g.Close(func() error {
		if err := rdmacore.DestroyCompChannel(ch.raw); err != nil {
			return err
		}
		live.channels.Add(-1)
		return nil
	})
}

// CQ is a completion queue (struct ibv_cq).
type CQ struct {
	g       guard.Guard
	raw     rdmacore.CQ
	size    int
	channel *CompChannel

	pollMu  sync.Mutex // rdma-core's poll is thread-safe; this guards unacked and closing
	unacked int        // events taken by Wait and not yet acknowledged
	// closing: Close has begun, and every event is acknowledged as it is
	// taken. On a channel that many CQs share, another CQ's waiter may
	// take this one's last event while Close destroys it, and
	// ibv_destroy_cq waits until every event it took is acknowledged.
	closing bool
}

// ackBatch is how many completion events are acknowledged at once: ibv_ack_cq_events
// takes a mutex, so acknowledging each event alone would cost a lock and a cgo call.
const ackBatch = 32

// NewCQ creates a completion queue with room for at least size completions.
// Events go to ch when it is not nil; vector picks the completion vector.
func (c *Context) NewCQ(size int, ch *CompChannel, vector int) (*CQ, error) {
	if !c.g.Use() {
		return nil, ErrClosed
	}
	defer c.g.Done()
	var rawCh rdmacore.CompChannel
	if ch != nil {
		if !ch.g.Use() {
			return nil, ErrClosed
		}
		defer ch.g.Done()
		rawCh = ch.raw
	}
	raw, actual, err := rdmacore.CreateCQ(c.raw, size, rawCh, vector)
	if err != nil {
		return nil, err
	}
	cq := &CQ{raw: raw, size: actual, channel: ch}
	if ch != nil {
		ch.add(cq)
	}
	live.cqs.Add(1)
	return cq, nil
}

// Raw is the rdma-core handle, for package cm.
func (cq *CQ) Raw() rdmacore.CQ { return cq.raw }

// Size is the queue's actual capacity.
func (cq *CQ) Size() int { return cq.size }

func (cq *CQ) noteEvent() {
	cq.pollMu.Lock()
	cq.unacked++
	if cq.unacked >= ackBatch || cq.closing {
		rdmacore.AckCQEvents(cq.raw, cq.unacked)
		cq.unacked = 0
	}
	cq.pollMu.Unlock()
}

// RequestNotify arms the queue: the next completion (or the next solicited
// one) raises one event on its channel.
func (cq *CQ) RequestNotify(solicitedOnly bool) error {
	if !cq.g.Use() {
		return ErrClosed
	}
	defer cq.g.Done()
	calls.reqNotify.Add(1)
	return rdmacore.ReqNotifyCQ(cq.raw, solicitedOnly)
}

// Poll moves up to len(wcs) completions into wcs and returns how many; 0 means
// the queue is empty. It does not allocate.
func (cq *CQ) Poll(wcs []WorkCompletion) (int, error) {
	if !cq.g.Use() {
		return 0, ErrClosed
	}
	defer cq.g.Done()
	if len(wcs) == 0 {
		return 0, nil
	}
	n, err := rdmacore.PollCQ(cq.raw, unsafe.Slice((*rdmacore.WC)(unsafe.Pointer(&wcs[0])), len(wcs)))
	calls.poll.Add(1)
	if n == 0 {
		calls.emptyPoll.Add(1)
	}
	return n, err
}

// Close acknowledges outstanding events and destroys the queue. QPs using it
// must be closed first.
func (cq *CQ) Close() error {
	return cq.g.Close(func() error {
		cq.pollMu.Lock()
		cq.closing = true
		if cq.unacked > 0 {
			rdmacore.AckCQEvents(cq.raw, cq.unacked)
			cq.unacked = 0
		}
		cq.pollMu.Unlock()
		if err := rdmacore.DestroyCQ(cq.raw); err != nil {
			cq.pollMu.Lock()
			cq.closing = false
			cq.pollMu.Unlock()
			return err
		}
		if cq.channel != nil {
			cq.channel.forget(cq)
		}
		live.cqs.Add(-1)
		return nil
	})
}

// WorkCompletion is one completed work request (struct ibv_wc, in part). Its
// layout is rdmacore.WC's, so Poll fills a caller's slice without copying.
type WorkCompletion struct {
	ID        uint64
	Status    WCStatus
	Opcode    WCOpcode
	ByteLen   uint32
	Imm       uint32 // immediate data in host order, when Flags has WCWithImm
	VendorErr uint32
	Flags     WCFlags
	QPNum     uint32
	_         uint32
}

// Err returns nil for a successful completion, else a *WCError.
func (wc *WorkCompletion) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, VendorErr: wc.VendorErr, Opcode: wc.Opcode, ID: wc.ID}
}

// WCFlags is enum ibv_wc_flags.
type WCFlags uint32

// WCWithImm: the completion carries immediate data.
const WCWithImm WCFlags = rdmacore.WCWithImm

// WCOpcode is enum ibv_wc_opcode.
type WCOpcode uint32

const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("opcode(%d)", uint32(o))
}

// WCStatus is enum ibv_wc_status.
type WCStatus uint32

const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocQPOpErr     WCStatus = 2
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCGeneralErr     WCStatus = 21
)

// wcStatusText follows ibv_wc_status_str.
var wcStatusText = [...]string{
	"success", "local length error", "local QP operation error",
	"local EE context operation error", "local protection error",
	"Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error",
	"remote access error", "remote operation error", "transport retry counter exceeded",
	"RNR retry counter exceeded", "local RDD violation error",
	"remote invalid RD request", "aborted error", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout error", "general error",
}

func (s WCStatus) String() string {
	if int(s) < len(wcStatusText) {
		return wcStatusText[s]
	}
	return fmt.Sprintf("status(%d)", uint32(s))
}

// WCError is a work request that completed with an error status.
type WCError struct {
	Status    WCStatus
	VendorErr uint32
	Opcode    WCOpcode
	ID        uint64
}

func (e *WCError) Error() string {
	return fmt.Sprintf("verbs: work request %d (%v) failed: %v (vendor error %#x)", e.ID, e.Opcode, e.Status, e.VendorErr)
}
