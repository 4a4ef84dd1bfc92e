package rdmalink

import (
	"math/bits"
	"os"
)

// Queue memory: a connection's queue pair, and its share of a completion
// queue, are memory the provider allocates. On the software providers
// (rxe, siw) it is kernel memory mapped into the process: it counts in the
// process's RSS, and neither against RLIMIT_MEMLOCK nor in Pools.
// Hardware providers allocate it in the process and register it, pinned
// (mlx5's send queue); their entry sizes depend on the device's
// capabilities and are not modelled here.
//
// The sizes follow the kernel's (rdma/rdma_user_rxe.h, rdma/siw-abi.h,
// drivers/infiniband/sw), and TestLabFootprint checks them against the
// process's mappings of the device.

// Providers whose queue sizes QueueMemoryOf knows.
const (
	ProviderRXE = "rxe"
	ProviderSIW = "siw"
)

// Kernel entry sizes, in bytes.
const (
	rxeSendWQE  = 208 // struct rxe_send_wqe, before its inline data or SGEs
	rxeRecvWQE  = 40  // struct rxe_recv_wqe, before its SGEs
	rxeSGE      = 16
	rxeCQE      = 72  // the kernel's struct ib_wc, the larger member of struct rxe_cqe
	rxeQueueBuf = 384 // struct rxe_queue_buf: the indices ahead of the entries
	rxeMinEntry = 64  // an entry is at least a cache line
	siwSQE      = 120 // struct siw_sqe
	siwRQE      = 112 // struct siw_rqe
	siwCQE      = 32  // struct siw_cqe
)

// QueueMemoryOf is what a link made with cfg takes of provider's memory for
// its queues, with write notices (iWARP) or not: its send and receive
// queues as mapped (whole pages), and its share of a completion queue
// shared by the device's links (the entries it reserves there; a queue is
// made for many links, and rounded up by the provider). ok is false for a
// provider whose sizes are not known here. None of it is pinned.
func QueueMemoryOf(provider string, cfg Config, notices bool) (sendQueue, recvQueue, completionShare int, ok bool) {
	sendWRs := cfg.SendDepth
	if notices {
		sendWRs *= 2 // a write and its notice per data request
	}
	cqEntries := sendWRs + cfg.RecvDepth // reserved on the shared queue (resources.need, with receives of its own)
	page := os.Getpagesize()
	pages := func(n int) int { return (n + page - 1) / page * page }
	switch provider {
	case ProviderRXE:
		// rxe_queue_init: entries rounded up to a power of two (a cache
		// line at least), one slot more than asked, rounded up to a power
		// of two, behind the queue's indices. The send entry holds the
		// inline data or the SGEs, whichever is larger.
		queue := func(wrs, entry int) int {
			return pages(rxeQueueBuf + pow2(wrs+1)*pow2(max(entry, rxeMinEntry)))
		}
		inline := int(inlineSizes[0])
		return queue(sendWRs, rxeSendWQE+max(rxeSGE, inline)), queue(cfg.RecvDepth, rxeRecvWQE+rxeSGE), cqEntries * pow2(rxeCQE), true
	case ProviderSIW:
		// siw_create_qp and siw_create_cq: entries rounded up to a power
		// of two, of fixed size.
		return pages(pow2(sendWRs) * siwSQE), pages(pow2(cfg.RecvDepth) * siwRQE), cqEntries * siwCQE, true
	}
	return 0, 0, 0, false
}

// pow2 is the least power of two at least n (n > 0).
func pow2(n int) int {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len(uint(n-1))
}

// Vendor ids the software providers report (ibv_query_device): RXE_VENDOR_ID
// and SIW_VENDOR_ID in the kernel.
const (
	rxeVendorID = 0xffffff
	siwVendorID = 0x626d74
)

// ProviderOf names the provider of a device by the vendor id it reports,
// for the providers QueueMemoryOf knows, and "" for others.
func ProviderOf(vendorID uint32) string {
	switch vendorID {
	case rxeVendorID:
		return ProviderRXE
	case siwVendorID:
		return ProviderSIW
	}
	return ""
}
