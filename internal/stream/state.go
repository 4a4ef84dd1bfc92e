package stream

import "time"

// State is a snapshot of an engine's flow control, for diagnostics (what
// `ss -i` shows of a TCP socket's window and queue).
type State struct {
	// SendSlots is the send queue's size; SendInFlight how many of its
	// work requests are posted and not known complete.
	SendSlots, SendInFlight int
	// SendRing is the transmit ring's size; SendRingUsed how many of its
	// bytes are written and not yet released (in flight, held back to
	// coalesce, or kept for a resumable session until the peer reads them).
	SendRing, SendRingUsed uint64
	// RecvRing is the size of the receive ring the peer writes into.
	RecvRing uint64
	// PeerRoom is how many bytes the peer's receive buffer takes now: its
	// window (Valkey's protocol) or the credit it returned (the ring).
	PeerRoom uint32
	// RecvUnread is how many received bytes wait to be read contiguously
	// (on the ring, those before its end; the rest follow).
	RecvUnread uint32
	// Posted counts the work requests posted (data writes and control
	// messages) and Arrived the peer's messages that arrived, over the
	// engine's life.
	Posted, Arrived uint64
	// LastPost is when anything was last posted; LastProgress when a send
	// last completed (or a request was posted with none outstanding).
	LastPost, LastProgress time.Time
}

// State returns a snapshot of the engine's flow control.
func (e *Engine) State() State {
	q := e.sq
	_, unread := e.recv.Readable()
	return State{
		SendSlots: q.depth, SendInFlight: int(q.posted - q.retired),
		SendRing: q.ring, SendRingUsed: q.put + q.held - q.released(),
		PeerRoom: e.send.Room(), RecvUnread: unread, RecvRing: uint64(e.recvSize()),
		Posted: e.postedBefore + q.posted, Arrived: e.arrivedMsgs,
		LastPost: e.lastPost, LastProgress: e.lastProgress,
	}
}
