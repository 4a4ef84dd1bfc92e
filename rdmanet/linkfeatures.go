package rdmanet

import (
	"fmt"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// Link features (wire.LinkFeatures: write notices, receive credit) are
// agreed for each RDMA link, not once for a connection: a session's links
// may run on different devices. A dialer offers them all and says which
// its device needs (an iWARP device needs both); the listener uses those
// that either side needs and answers with exactly them. Valkey's protocol
// has neither, so a device that needs one cannot talk to a Valkey peer:
// that is verbs.ErrNoImmediate, and the dialer falls back to TCP for it
// (fallback.ReasonNoImmediate).

// linkEnd is what the choice of link features reads of an RDMA link (a
// *rdmalink.Link): what its device cannot do without, and its name and
// depths.
type linkEnd interface {
	Needs() wire.Features
	Caps() link.Caps
}

var _ linkEnd = (*rdmalink.Link)(nil)

// linkHello adds to h what the dialer's link l offers and needs.
func linkHello(h wire.Hello, l linkEnd) wire.Hello {
	h.Features |= wire.LinkFeatures
	h.Needs = l.Needs()
	return h
}

// chooseLinkFeatures is the listener's choice for a request whose Hello
// (if hello) is offer, on its link l: the link features either side needs.
func chooseLinkFeatures(offer wire.Hello, hello bool, l linkEnd, accepts wire.Features) (wire.Features, error) {
	need := l.Needs()
	if hello {
		need |= offer.Needs
	}
	switch {
	case need == 0:
		return 0, nil
	case accepts == 0:
		return 0, noImmediate(l, "this listener speaks Valkey's protocol only (Config.ValkeyCompatible)")
	case !hello:
		return 0, noImmediate(l, "the client speaks Valkey's protocol")
	case need&^offer.Features != 0:
		return 0, noImmediate(l, fmt.Sprintf("the client offers link features %#x of the %#x needed", uint32(offer.Features&wire.LinkFeatures), uint32(need)))
	}
	if depth := min(int(offer.RecvDepth), l.Caps().RecvDepth); need&wire.FeatureRecvCredit != 0 && depth < minRecvCreditDepth {
		return 0, fmt.Errorf("rdmanet: receive credit (iWARP) needs at least %d receives posted on each side, one has %d (rdmanet.Config.RecvDepth)", minRecvCreditDepth, depth)
	}
	return need, nil
}

// checkLinkAnswer is the dialer's check of the listener's answer: a peer
// without a Hello, or one that left out what this side's device needs,
// cannot carry this connection.
func checkLinkAnswer(agreed wire.Features, hello bool, l linkEnd) error {
	switch missing := l.Needs() &^ agreed; {
	case missing == 0:
		return nil
	case !hello:
		return noImmediate(l, "the server speaks Valkey's protocol")
	default:
		return noImmediate(l, fmt.Sprintf("the server did not agree on link features %#x", uint32(missing)))
	}
}

// minRecvCreditDepth is internal/stream's least depth for receive credit,
// checked here so that the refusal names the Config field.
const minRecvCreditDepth = 8

func noImmediate(l linkEnd, why string) error {
	return fmt.Errorf("%w: %s: %s", verbs.ErrNoImmediate, l.Caps().Name, why)
}
