package stream

import "github.com/rdmanet/sdk/internal/wire"

// controlQueue is what control messages this side owes the peer, waiting
// for one of the link's control slots. It is bounded by construction: each
// kind is a flag (a second announcement or keepalive before the first went
// out is the same message; a credit carries running totals, so only the
// newest matters), and server-feature replies are a count the engine
// bounds. A peer can make this side owe it no more than that, however
// fast it sends.
type controlQueue struct {
	want           controlWant
	credit         wire.Message // the newest Credit, when wantCredit
	announce       wire.Message // this side's RegisterXferMemory
	resume         wire.Message // this side's Resume, on a resumed link
	ring           wire.Message // this side's Ring: a receive ring offered
	retain         wire.Message // this side's Retain: its transmit ring's size
	featureReplies int          // GetServerFeature answers owed
	slots          int          // the link's control slots
	outstanding    int          // control messages posted and not completed
}

type controlWant uint16

const (
	wantAnnounce controlWant = 1 << iota
	wantCredit
	wantKeepalive
	wantShutdown
	wantResume
	wantClose
	wantRing   // offer a receive ring (Ring)
	wantRingAt // switch to the peer's offered ring (RingAt), once nothing is held
	wantRetain // say what the transmit ring retains now (Retain)
)

// wantEnd are the messages that end this side's stream: they follow every
// byte written, so they wait while any is still to be posted.
const wantEnd = wantShutdown | wantClose

// next takes the next message to send. While draining only Shutdown and
// Close may go (they are part of the stream the peer reads); credit and
// keepalive would only keep a closing connection busy.
//
// creditOnly takes nothing but a Credit: with receive credit, the peer's
// last receive is kept for it (recvCredit). dataFirst holds back the
// messages that end the stream (wantEnd): written bytes are still to be
// posted, and must reach the peer before them.
func (q *controlQueue) next(draining, creditOnly bool, order controlOrder) (wire.Message, bool) {
	dataFirst := order.dataFirst
	if creditOnly {
		if !draining && q.want&wantCredit != 0 {
			q.want &^= wantCredit
			return q.creditMessage(), true
		}
		return wire.Message{}, false
	}
	switch {
	case draining:
		// A session that resumes while draining says what it received
		// first, as any resumed link does.
		if q.want&wantResume != 0 {
			q.want &^= wantResume
			return q.resume, true
		}
		if dataFirst {
			break
		}
		if q.want&wantShutdown != 0 {
			q.want &^= wantShutdown
			return wire.Message{Op: wire.OpShutdown}, true
		}
		if q.want&wantClose != 0 {
			q.want &^= wantClose
			return wire.Message{Op: wire.OpClose}, true
		}
	case q.want&wantResume != 0:
		// First on a resumed link: the peer sends nothing before it has it.
		q.want &^= wantResume
		return q.resume, true
	case q.want&wantAnnounce != 0:
		q.want &^= wantAnnounce
		return q.announce, true
	case q.want&wantRingAt != 0 && !order.heldFirst:
		// The engine fills in the position as it switches.
		q.want &^= wantRingAt
		return wire.Message{Op: wire.OpRingAt}, true
	case q.want&wantRing != 0:
		q.want &^= wantRing
		return q.ring, true
	case q.want&wantRetain != 0:
		q.want &^= wantRetain
		return q.retain, true
	case q.featureReplies > 0:
		q.featureReplies--
		// Valkey's answer: the same opcode, no features.
		return wire.Message{Op: wire.OpGetServerFeature}, true
	case q.want&wantCredit != 0:
		q.want &^= wantCredit
		return q.creditMessage(), true
	case q.want&wantShutdown != 0 && !dataFirst:
		q.want &^= wantShutdown
		return wire.Message{Op: wire.OpShutdown}, true
	case q.want&wantKeepalive != 0:
		q.want &^= wantKeepalive
		return wire.Message{Op: wire.OpKeepalive}, true
	}
	return wire.Message{}, false
}

// pending reports whether a message waits that next would send.
func (q *controlQueue) pending(draining bool, order controlOrder) bool {
	want := q.want
	if order.dataFirst {
		want &^= wantEnd
	}
	if order.heldFirst {
		want &^= wantRingAt
	}
	if draining {
		return want&(wantEnd|wantResume) != 0
	}
	return want != 0 || q.featureReplies > 0
}

// controlOrder says which control messages wait for data: the end of the
// stream (Shutdown, Close) for every byte to send, sent again included
// (dataFirst); a switch to the peer's offered ring (RingAt) only for the
// bytes held and the peer's Resume (heldFirst): bytes sent again after it
// go to the new ring, at their stream positions, as any bytes after the
// switch do (a ring offered right after a resume waited for the bytes sent
// again, which wait for the switch).
type controlOrder struct{ dataFirst, heldFirst bool }

// creditMessage is the Credit owed: the newest one queued, or, when receive
// credit alone made one due, a Credit the engine fills in as it posts it.
func (q *controlQueue) creditMessage() wire.Message {
	m := q.credit
	m.Op = wire.OpCredit
	return m
}
