package rdmalink

import (
	"errors"
	"fmt"
	"log/slog"
	"unsafe"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// resources are one connection's verbs objects. The queue pair belongs to the
// cm ID and goes with it.
type resources struct {
	group *peerGroup // the device's resources for the peer: the protection domain and the pools
	share *compShare // the device's completion channel and queues
	cq    *sharedCQ  // the queue the queue pair completes on (cqshare.go)
	slot  uint32     // the link's slot on cq, and the slot's generation
	gen   uint32
	need  cqNeed // reserved on cq: every request the queue pair may hold
	qp    *verbs.QP
	rx    *region // the peer writes here
	tx    *region // the transmit ring
	recvs *region // receive slots, 32 bytes each (none with shared)
	// shared is the peer group's shared receive queue the queue pair takes
	// its receives from (Config.SharedRecv), and held the credit the peer
	// holds on it (Link.Grant).
	shared *sharedRecv
	held   int
	ctl    *region // control send slots, 32 bytes each
	// Notice slots (write notices), 32 bytes each: sent inline where the
	// device can (unregistered memory, noticeMem: it pins nothing), or
	// from registered memory where it cannot (notice).
	noticeMem *verbs.Buffer
	notice    *region
	later     []*region // receive rings made since (rings.go)
	// borrowed: rx and tx are the caller's (Config.SendMem and RecvMem, a
	// session's rings), which keep their size.
	borrowed bool
	released bool // close ran

	release      func() // Config.Release, until called
	recvDepth    int
	controlDepth int
	notices      bool // made for write notices: a write and a send per data request, and notice slots
	sendWRs      int  // the send queue's size
	maxInline    uint32
	name         string // the device and port, for errors and diagnostics
	// The device, port and queue pair number, kept apart so that they
	// may be reported after the queue pair is gone.
	device string
	port   uint8
	qpNum  uint32
}

func newResources(id *cm.ID, cfg Config, notices bool) (_ *resources, err error) {
	raiseMemlock()
	// r, not the result: a failure returns nil, and what was made so far
	// must still be released.
	r := &resources{recvDepth: cfg.RecvDepth, controlDepth: cfg.ControlDepth, notices: notices, release: cfg.Release, sendWRs: cfg.SendDepth}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	ctx := id.Context()
	if ctx == nil {
		return nil, errors.New("rdmanet: connection has no RDMA device")
	}
	noticeSlots := 0
	if notices {
		r.sendWRs, noticeSlots = 2*cfg.SendDepth, cfg.SendDepth
	}
	// A queue pair that fails may flush every request it holds, signaled
	// or not: its shared completion queue keeps room for all of them. On a
	// shared receive queue, its receives are that queue's (cqNeed).
	need := cqNeed{entries: r.sendWRs + cfg.RecvDepth}
	attr, err := checkLimits(ctx, r.sendWRs, cfg.RecvDepth, need.entries)
	if err != nil {
		return nil, err
	}
	if r.group, err = acquireGroup(ctx, id.RemoteAddr().Addr(), cfg.PeerBound); err != nil {
		return nil, err
	}
	pd := r.group.pd
	if cfg.SharedRecv && !notices {
		// A device or a bound that refuses a shared queue leaves the link
		// receives of its own, as without one.
		if r.shared, err = r.group.joinShared(firstGrant); err == nil {
			r.held = firstGrant
			need = cqNeed{entries: r.sendWRs, recvQueue: r.shared.id, recvEntries: r.shared.size}
		} else {
			slog.Debug("rdmanet: no shared receive queue; the connection keeps receives of its own", "device", ctx.Name(), "err", err)
		}
	}
	if r.share, err = acquireCompShare(ctx); err != nil {
		return nil, err
	}
	share := r.share
	r.cq, r.slot, r.gen, err = share.joinCQ(need, attr.MaxCQE, func(size int) (*sharedCQ, error) {
		cq, err := ctx.NewCQ(size, share.vch, 0)
		if err != nil {
			return nil, err
		}
		q := newSharedCQ(cq, cq.Size())
		q.vcq = cq
		return q, nil
	})
	if err != nil {
		return nil, err
	}
	r.need = need
	remote, local := verbs.AccessLocalWrite|verbs.AccessRemoteWrite, verbs.AccessLocalWrite
	if cfg.SendMem != nil && cfg.RecvMem != nil {
		r.borrowed = true
		if r.rx, err = r.group.borrowedRegion(cfg.RecvMem, remote); err != nil {
			return nil, err
		}
		if r.tx, err = r.group.borrowedRegion(cfg.SendMem, local); err != nil {
			return nil, err
		}
	} else {
		// A ring of 0 bytes (a carrier's whose streams have rings of
		// their own) is none: it pins nothing, as Registered says, and
		// no write of the peer's lands in a chunk behind it.
		if cfg.RecvBuffer > 0 {
			if r.rx, err = r.group.region(r.group.remote, cfg.RecvBuffer, remote); err != nil {
				return nil, err
			}
		}
		if cfg.SendBuffer > 0 {
			if r.tx, err = r.group.region(r.group.local, cfg.SendBuffer, local); err != nil {
				return nil, err
			}
		}
	}
	// Two regions, not one: each fills its pool's class (8 KiB of
	// receive slots for the default 256) with little left over.
	if r.shared == nil {
		if r.recvs, err = r.group.region(r.group.local, cfg.RecvDepth*wire.MessageSize, local); err != nil {
			return nil, err
		}
	}
	if r.ctl, err = r.group.region(r.group.local, cfg.ControlDepth*wire.MessageSize, local); err != nil {
		return nil, err
	}
	qpc := cm.QPConfig{SendCQ: r.cq.vcq, RecvCQ: r.cq.vcq, Cap: verbs.QPCap{
		MaxSendWR: uint32(r.sendWRs), MaxRecvWR: uint32(cfg.RecvDepth),
		MaxSendSGE: 1, MaxRecvSGE: 1,
	}}
	if r.shared != nil {
		qpc.SRQ = r.shared.srq
	}
	// Devices differ in how much they send inline (some none, some Intel
	// E810 firmware under 102 bytes): ask for the most that helps and back
	// off until the device takes it. A failure with no inline at all is the
	// real error.
	for _, inline := range inlineSizes {
		qpc.Cap.MaxInlineData = inline
		if r.qp, err = id.CreateQP(pd, qpc); err == nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	r.maxInline = r.qp.Cap().MaxInlineData
	if noticeSlots > 0 {
		if wire.MessageSize <= r.maxInline {
			// Copied by the post call: no registration, nothing pinned.
			if r.noticeMem, err = verbs.NewBuffer(noticeSlots * wire.MessageSize); err != nil {
				return nil, err
			}
		} else if r.notice, err = r.group.region(r.group.local, noticeSlots*wire.MessageSize, local); err != nil {
			return nil, err
		}
	}
	r.name = fmt.Sprintf("%s port %d", ctx.Name(), id.Port())
	r.device, r.port, r.qpNum = ctx.Name(), id.Port(), r.qp.Num()
	return r, nil
}

// inlineSizes are the inline sizes asked of a device, largest first:
// every control message and notice (32 bytes), and writes that small, are
// copied by the post call itself, saving the device a read of registered
// memory. No more: the inline size sets every send queue entry's size. On
// rxe an entry is 208 bytes and the inline room, rounded up to a power of
// two, so 32 makes it 256 bytes and 64 made it 512 (a send queue of 255
// took 128 KiB of the process's memory, now 64 KiB); the writes between 33
// and 64 bytes it sent inline gained nothing measurable (docs/engine.md).
var inlineSizes = []uint32{wire.MessageSize, 0}

func (r *resources) recvSlot(i int) verbs.SGE {
	return r.recvs.Slice(i*wire.MessageSize, wire.MessageSize)
}

func (r *resources) recvSlotBytes(i int) []byte {
	return r.recvs.Bytes()[i*wire.MessageSize : (i+1)*wire.MessageSize]
}

// recvMsg is the message a receive completion with work request id id
// landed: in a slot of the link's, or of its shared queue's.
func (r *resources) recvMsg(id uint64) []byte {
	if id&wrShared != 0 {
		return r.shared.slotBytes(int(id & wrIndexMask))
	}
	return r.recvSlotBytes(int(id & wrIndexMask))
}

func (r *resources) ctlSlotBytes(i int) []byte {
	return r.ctl.Bytes()[i*wire.MessageSize : (i+1)*wire.MessageSize]
}

func (r *resources) sendSlot(i int) verbs.SGE {
	return r.ctl.Slice(i*wire.MessageSize, wire.MessageSize)
}

func (r *resources) sendSlotBytes(i int) *[wire.MessageSize]byte {
	return (*[wire.MessageSize]byte)(r.ctlSlotBytes(i))
}

func (r *resources) noticeSlot(i int) verbs.SGE {
	if r.noticeMem != nil {
		b := r.noticeSlotBytes(i)
		return verbs.SGE{Addr: uint64(uintptr(unsafe.Pointer(b))), Length: wire.MessageSize}
	}
	return r.notice.Slice(i*wire.MessageSize, wire.MessageSize)
}

func (r *resources) noticeSlotBytes(i int) *[wire.MessageSize]byte {
	var mem []byte
	if r.noticeMem != nil {
		mem = r.noticeMem.Bytes()
	} else {
		mem = r.notice.Bytes()
	}
	return (*[wire.MessageSize]byte)(mem[i*wire.MessageSize:])
}

// close releases everything, in the order rdma-core requires. The queue
// pair is the cm ID's, and goes first (a second Close, the ID's, does
// nothing): none of its completions can come after, so its place on the
// shared queue can be given back.
func (r *resources) close() error {
	if r.released {
		// Released once: its places on the shared queue, the channel
		// and the group are others' now.
		return nil
	}
	r.released = true
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if r.qp != nil {
		add(r.qp.Close())
	}
	release := r.share != nil
	if r.cq != nil {
		if empty := r.share.leaveCQ(r.cq, r.slot, r.need); empty != nil {
			if err := empty.vcq.Close(); err != nil {
				add(err)
				release = false // the channel must outlive a queue still on it
			}
		}
	}
	if release {
		// After the queue: the channel goes with its last queue.
		r.share.release()
	}
	if r.shared != nil {
		// After the queue pair and the queue's drain: its receives are
		// back on the shared queue; the credit its peer held is free.
		r.shared.leave(firstGrant, r.held)
		r.shared = nil
	}
	// After the queue pair: nothing lands in the rings any more, and a
	// chunk may go to another connection of the peer.
	for _, reg := range append([]*region{r.rx, r.tx, r.recvs, r.ctl, r.notice}, r.later...) {
		add(reg.close())
	}
	r.rx, r.tx, r.recvs, r.ctl, r.notice, r.later = nil, nil, nil, nil, nil, nil
	if r.noticeMem != nil {
		add(r.noticeMem.Close())
		r.noticeMem = nil
	}
	if release := r.release; release != nil {
		r.release = nil
		release()
	}
	if r.group != nil {
		add(r.group.release())
	}
	return errors.Join(errs...)
}
