package stream

// SendQueue accounts for the send queue and the transmit ring of one
// connection. Data is copied into the ring and posted as RDMA writes; control
// messages are posted as sends. Completions are requested (signaled) only on
// some work requests; since a reliable connection completes work requests in
// order, a signaled completion also retires every unsignaled one posted before
// it, and frees the ring bytes they used.
//
// The policy keeps the invariant that matters: whenever a writer has to wait
// for ring space or queue slots, the last work request posted was signaled, so
// a completion is on its way to wake it.
type SendQueue struct {
	depth       int    // send queue slots
	ring        uint64 // transmit ring size in bytes
	chunk       uint64 // largest single write, a quarter of the ring
	posted      uint64 // work requests posted, ever
	retired     uint64 // work requests known complete, ever
	put         uint64 // ring bytes posted, ever
	held        uint64 // ring bytes copied after put and not posted yet (Hold)
	freed       uint64 // ring bytes whose requests completed, ever
	sinceSignal int

	// With retain (a resumable session), bytes are released only once the
	// peer has also reported them consumed (acked), so that what the peer
	// may not have received can be sent again on another link.
	retain bool
	acked  uint64

	// Signaled work requests not yet completed, oldest first: a circle
	// that grows with what the connection has in flight, up to depth,
	// so that an idle connection holds a few.
	pending []pendingSignal
	head    int
	count   int
}

type pendingSignal struct {
	id      uint64 // the work request id
	posted  uint64 // SendQueue.posted after it
	put     uint64 // SendQueue.put after it
	control bool   // a control message (it holds one of the link's control slots)
}

// NewSendQueue sizes the accounting for a queue of depth slots and a ring of
// ringSize bytes.
func NewSendQueue(depth int, ringSize uint64) *SendQueue {
	return &SendQueue{
		depth:   depth,
		ring:    ringSize,
		chunk:   max(ringSize/4, 1),
		pending: make([]pendingSignal, min(depth, 4)),
	}
}

// RingSpace returns where in the ring the next data write may be copied:
// offset and length of the contiguous free space, at most one chunk. n is 0
// when the ring is full or no queue slot is free.
func (q *SendQueue) RingSpace() (off uint64, n uint64) {
	if q.SlotsFree() == 0 {
		return 0, 0
	}
	free := q.ring - (q.put + q.held - q.released())
	off = (q.put + q.held) % q.ring
	n = min(free, q.ring-off, q.chunk)
	return off, n
}

// contiguous returns where the next bytes written go in the ring, how
// many are free there up to the ring's end (a write buffer, view.go), and
// how many will be once every request in flight completed, without the
// peer's acknowledgement that a resumable session also waits for.
func (q *SendQueue) contiguous() (off, free, completing uint64) {
	off = (q.put + q.held) % q.ring
	free = min(q.ring-(q.put+q.held-q.released()), q.ring-off)
	completing = min(q.ring-q.held, q.ring-off)
	if q.retain {
		completing = min(q.ring-(q.put+q.held-q.acked), q.ring-off)
	}
	return off, free, completing
}

// Hold records n ring bytes copied at RingSpace's offset and kept back, to
// be posted later, together with bytes held after them, as one data write
// (PostHeld): small writes coalesce while a signaled request is in flight.
func (q *SendQueue) Hold(n uint64) { q.held += n }

// Held is how many ring bytes are held.
func (q *SendQueue) Held() uint64 { return q.held }

// PostHeld records the held bytes posted as one data write and decides
// whether it is signaled (always, with signal); id is the work request id to
// use.
func (q *SendQueue) PostHeld(signal bool) (n, id uint64, signaled bool) {
	n, q.held = q.held, 0
	id, signaled = q.postData(n, signal)
	return n, id, signaled
}

// SignaledPending reports whether a signaled work request is outstanding,
// so that a completion is on its way.
func (q *SendQueue) SignaledPending() bool { return q.count > 0 }

// SignaledOutstanding is how many signaled work requests are outstanding.
func (q *SendQueue) SignaledOutstanding() int { return q.count }

// SlotsFree is how many work requests may be posted now.
func (q *SendQueue) SlotsFree() int { return q.depth - int(q.posted-q.retired) }

// PostData records a data write of n ring bytes (from RingSpace) and decides
// whether it is signaled; id is the work request id to use.
// Bytes held are posted first, in the same write.
func (q *SendQueue) PostData(n uint64) (id uint64, signaled bool) {
	n, q.held = n+q.held, 0
	return q.postData(n, false)
}

func (q *SendQueue) postData(n uint64, signal bool) (id uint64, signaled bool) {
	q.posted++
	q.put += n
	q.sinceSignal++
	free := q.ring - (q.put - q.released())
	// Signal every quarter queue, and whenever space is getting short, so a
	// writer who finds too little space always has a completion coming.
	if signal || q.sinceSignal >= max(q.depth/4, 1) || free < q.ring/2 || q.SlotsFree() < q.depth/2 {
		return q.signal(false), true
	}
	return q.posted, false
}

// PostControl records a control message; control messages are always
// signaled, so that the link's slot they use comes back.
func (q *SendQueue) PostControl() (id uint64) {
	q.posted++
	return q.signal(true)
}

func (q *SendQueue) signal(control bool) uint64 {
	q.sinceSignal = 0
	p := pendingSignal{id: q.posted, posted: q.posted, put: q.put, control: control}
	if q.count == len(q.pending) {
		grown := make([]pendingSignal, min(2*len(q.pending), q.depth))
		for i := range q.count {
			grown[i] = q.pending[(q.head+i)%len(q.pending)]
		}
		q.pending, q.head = grown, 0
	}
	q.pending[(q.head+q.count)%len(q.pending)] = p
	q.count++
	return p.id
}

// Complete retires the signaled work request id and all unsignaled ones
// before it, and reports whether it was a control message. A completion that
// is not the oldest signaled request is a broken invariant of the transport
// and is reported as an error.
func (q *SendQueue) Complete(id uint64) (control bool, err error) {
	if q.count == 0 || q.pending[q.head].id != id {
		return false, protocolErrorf("completion for work request %d out of order", id)
	}
	p := q.pending[q.head]
	q.head = (q.head + 1) % len(q.pending)
	q.count--
	q.retired = p.posted
	q.freed = p.put
	return p.control, nil
}

// released is the running total of ring bytes that may be written over.
func (q *SendQueue) released() uint64 {
	if q.retain {
		return min(q.freed, q.acked)
	}
	return q.freed
}

// Retain makes the queue keep ring bytes until Ack releases them as well
// as their completion. Positions are running totals of the stream's bytes
// (the ring's offset is the total modulo its size), so what the peer
// reports in stream bytes is a ring position here too.
func (q *SendQueue) Retain() { q.retain = true }

// Ack records that the peer consumed the stream up to consumed.
func (q *SendQueue) Ack(consumed uint64) { q.acked = max(q.acked, consumed) }

// Relink returns the accounting for the same ring over a new link with
// depth slots: nothing is outstanding there, and every byte copied so far
// (posted, held, or still to be sent again after an earlier Rewind: unsent)
// counts as sent until Rewind says what arrived.
func (q *SendQueue) Relink(depth int, unsent uint64) *SendQueue {
	n := NewSendQueue(depth, q.ring)
	n.retain, n.acked = q.retain, q.acked
	n.put = q.put + q.held + unsent
	n.freed = n.put
	return n
}

// Rewind goes back to received, where the peer's stream ends, to send the
// bytes after it again; consumed is what the peer has read. Requests
// already posted on this link (control messages) hold no ring bytes.
func (q *SendQueue) Rewind(received, consumed uint64) {
	q.Ack(consumed)
	q.put, q.held, q.freed = received, 0, received
	for i := range q.count {
		p := &q.pending[(q.head+i)%len(q.pending)]
		p.put = min(p.put, received)
	}
}

// PostMarker records a signaled work request that carries no data (a
// zero-length write), posted when unsignaled requests must be retired, as
// before an orderly close.
func (q *SendQueue) PostMarker() (id uint64) {
	q.posted++
	return q.signal(false)
}

// Completed reports whether every byte put in the ring was posted and its
// request completed. Retaining, some may still wait for the peer's
// acknowledgement: Kept says which.
func (q *SendQueue) Completed() bool { return q.held == 0 && q.put == q.freed }

// Kept is the span of ring bytes held for the peer's acknowledgement once
// their requests completed (retaining): from the stream position from, n
// bytes.
func (q *SendQueue) Kept() (from, n uint64) {
	r := q.released()
	return r, q.put - r
}

// Resize makes the ring size bytes: a new ring, taken while Completed,
// holding the Kept bytes at their positions.
func (q *SendQueue) Resize(size uint64) { q.ring, q.chunk = size, max(size/4, 1) }

// Idle reports whether every posted work request has completed.
func (q *SendQueue) Idle() bool { return q.posted == q.retired }

// Unsignaled reports whether work requests were posted after the last
// signaled one: they complete only when a later signaled request does.
func (q *SendQueue) Unsignaled() bool { return q.sinceSignal > 0 }
