package stream

import "github.com/rdmanet/sdk/internal/wire"

// recvCredit accounts for the peer's posted receives on a link whose
// messages must never find none (link.Caps.RecvCredit: iWARP, where a
// send without a receive ends the connection and a send may complete
// before the peer took it). Every message that consumes a receive (data,
// control) spends a credit; the peer returns them with the running total
// of receives it posted again, in Credit's Receives.
//
// Two rules keep the credits flowing both ways without a deadlock:
//   - data leaves recvCreditReserve credits, so a control message can
//     always go once data has taken what it may, and every control message
//     but Credit leaves the last one to Credit;
//   - a side returns credit once it posted again a quarter of its depth,
//     at least 2, since its last Credit: sending a Credit starts the count
//     afresh, and a Credit adds one to the peer's count, too few to make
//     the peer answer with a Credit of its own, so Credits never answer
//     Credits for ever.
//
// A sender short of credit has sent at least its depth less the reserve
// since the peer's last report; the peer posts those receives again as it
// takes them, which is more than its threshold (the depth is at least
// minRecvCreditDepth), so its Credit comes. If both sides are down to
// their last credit, each spent it on a Credit reporting at least the
// threshold, and each such Credit gives the other side room again.
//
// With grants (link.Caps.RecvGrant: both ends agreed on
// wire.FeatureRecvGrant), a receiver whose receives come from a pool
// shared with other links (a shared receive queue) decides how much
// credit to give back for the receives the peer's messages took: more to a
// link that streams, less when the pool is short (link.RecvGranter). Its
// Hello's RecvDepth is its first grant, and it never leaves the peer less
// than that, so the argument above holds with that depth. The sender then
// takes reports beyond the messages it sent, up to maxGranted.
type recvCredit struct {
	on     bool
	grants bool

	// Sending: the peer's receives at the start of the link, the messages
	// this side sent on it, and the peer's reported running total of
	// receives posted again (widened from the wire's 32 bits).
	peerDepth uint64
	sent      uint64
	peerAgain uint64

	// Receiving: credit this side gave back on the link (receives posted
	// again, or granted), how many of them the last Credit reported, and
	// how many make a Credit due; with grants, the first grant (ownDepth)
	// and the receives the peer's messages took.
	again    uint64
	reported uint64
	every    uint64
	first    uint64
	took     uint64
}

// maxGranted is the most credit a granting peer may give: a Hello's depth
// could say no more.
const maxGranted = 1<<16 - 1

// recvCreditReserve is how many of the peer's receives data leaves to
// control messages: one for Credit, two for a keepalive and a Shutdown.
const recvCreditReserve = 3

// minRecvCreditDepth is the fewest receives either side may keep posted
// with receive credit: below it the reserve and the threshold do not fit.
const minRecvCreditDepth = 8

func newRecvCredit(on, grants bool, peerDepth, ownDepth int) (recvCredit, error) {
	if !on {
		if grants {
			return recvCredit{}, protocolErrorf("receive credit grants without receive credit")
		}
		return recvCredit{}, nil
	}
	if peerDepth < minRecvCreditDepth || ownDepth < minRecvCreditDepth {
		return recvCredit{}, protocolErrorf("receive credit with %d receives posted here and %d at the peer, want at least %d each",
			ownDepth, peerDepth, minRecvCreditDepth)
	}
	return recvCredit{on: true, grants: grants, peerDepth: uint64(peerDepth), every: uint64(max(ownDepth/4, 2)), first: uint64(ownDepth)}, nil
}

// available is how many messages may be sent now.
func (c *recvCredit) available() uint64 {
	return c.peerDepth + c.peerAgain - c.sent
}

// canData reports whether a data message may be sent.
func (c *recvCredit) canData() bool { return !c.on || c.available() > recvCreditReserve }

// canControl reports whether a control message may be sent: credit
// (a Credit) needs only the last receive, any other two.
func (c *recvCredit) canControl(credit bool) bool {
	if !c.on {
		return true
	}
	if credit {
		return c.available() >= 1
	}
	return c.available() >= 2
}

// spend records a message sent.
func (c *recvCredit) spend() {
	if c.on {
		c.sent++
	}
}

// peerReport takes the peer's running total of receives posted again
// (modulo 2^32). It may not go back, nor beyond the messages sent: the
// peer cannot post again more receives than this side's messages took.
func (c *recvCredit) peerReport(total uint32) error {
	if !c.on {
		return nil
	}
	delta := uint64(total - uint32(c.peerAgain))
	ahead := uint64(0) // what a granting peer may give beyond the messages sent
	if c.grants {
		ahead = maxGranted - c.peerDepth
	}
	if delta > 1<<31 || c.peerAgain+delta > c.sent+ahead {
		return protocolErrorf("receive credit for %d receives posted again, %d reported before, %d messages sent",
			total, uint32(c.peerAgain), c.sent)
	}
	c.peerAgain += delta
	return nil
}

// outstanding is the credit the peer holds now, by this side's count: its
// first grant and what was given back since, less the receives its
// messages took (n of them just now, not given back yet).
func (c *recvCredit) outstanding(n int) int {
	return int(c.first + c.again - c.took - uint64(n))
}

// grant is how much credit to give back for n receives the peer's messages
// took, with want the pool's answer (link.RecvGranter): never so little
// that the peer is left less than its first grant, nor so much that it
// holds more than maxGranted.
func (c *recvCredit) grant(n, want int) int {
	held := c.outstanding(n)
	return min(max(want, int(c.first)-held, 0), maxGranted-held)
}

// postedAgain records that n receives the peer's messages took were
// posted again, and credit for g of them given back (g is n but with
// grants), and reports whether a Credit is due: with grants, once a
// quarter of what the peer holds is unreported, and half its first grant.
// A grant gives up to twice the receives taken, so without the second
// bound one message, a Credit among them, made a Credit due: Credits
// answered Credits until the grants reached MaxGrant, and a short-lived
// stream's one request and answer drew five of them. A sender down to
// its reserve holds at most 3 of at least its first grant (8 or more), so
// at least 5, over half of it, is unreported then: its Credit is due.
func (c *recvCredit) postedAgain(n, g int) bool {
	if !c.on {
		return false
	}
	c.took += uint64(n)
	c.again += uint64(g)
	every := c.every
	if c.grants {
		every = uint64(max(c.outstanding(0)/4, int(c.first)/2, 2))
	}
	return c.again-c.reported >= every
}

// stamp puts the running total into a Credit about to go.
func (c *recvCredit) stamp(m *wire.Message) {
	if c.on {
		m.Receives = uint32(c.again)
		c.reported = c.again
	}
}
