package rdmanet

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// fakeLinkEnd is an RDMA link as the choice of link features sees it.
type fakeLinkEnd struct {
	needs     wire.Features
	recvDepth int
}

func (f fakeLinkEnd) Needs() wire.Features { return f.needs }
func (f fakeLinkEnd) Caps() link.Caps {
	return link.Caps{Name: "siw0 port 1", RecvDepth: f.recvDepth}
}

// TestChooseLinkFeatures: the listener uses the link features either side
// needs, and refuses with verbs.ErrNoImmediate a pairing that cannot carry
// them (a Valkey peer or listener), naming why.
func TestChooseLinkFeatures(t *testing.T) {
	roce := fakeLinkEnd{recvDepth: 256}
	iwarp := fakeLinkEnd{needs: wire.LinkFeatures, recvDepth: 256}
	offers := func(needs wire.Features, depth uint16) wire.Hello {
		return wire.Hello{Features: wire.LinkFeatures, Needs: needs, RecvDepth: depth}
	}
	for _, tc := range []struct {
		name    string
		offer   wire.Hello
		hello   bool
		l       linkEnd
		accepts wire.Features
		want    wire.Features
		err     string // in the error; "" for none
	}{
		{"RoCE both", offers(0, 256), true, roce, wire.LinkFeatures, 0, ""},
		{"a Valkey client on RoCE", wire.Hello{}, false, roce, wire.LinkFeatures, 0, ""},
		{"an iWARP listener", offers(0, 256), true, iwarp, wire.LinkFeatures, wire.LinkFeatures, ""},
		{"an iWARP client", offers(wire.LinkFeatures, 256), true, roce, wire.LinkFeatures, wire.LinkFeatures, ""},
		{"one feature needed", offers(wire.FeatureWriteNotice, 256), true, roce, wire.LinkFeatures, wire.FeatureWriteNotice, ""},
		{"a Valkey-only listener on iWARP", offers(0, 256), true, iwarp, 0, 0, "speaks Valkey's protocol only"},
		{"a Valkey client on iWARP", wire.Hello{}, false, iwarp, wire.LinkFeatures, 0, "the client speaks Valkey's protocol"},
		{"a client that does not offer them", wire.Hello{Features: wire.FeatureWriteNotice, RecvDepth: 256}, true, iwarp, wire.LinkFeatures, 0, "offers link features"},
		{"too few receives for credit", offers(wire.LinkFeatures, 4), true, roce, wire.LinkFeatures, 0, "Config.RecvDepth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chooseLinkFeatures(tc.offer, tc.hello, tc.l, tc.accepts)
			switch {
			case tc.err == "" && (err != nil || got != tc.want):
				t.Errorf("= %#x, %v; want %#x", got, err, tc.want)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("= %#x, %v; want an error saying %q", got, err, tc.err)
			case tc.err != "" && tc.err != "Config.RecvDepth" && !errors.Is(err, verbs.ErrNoImmediate):
				t.Errorf("%v does not match verbs.ErrNoImmediate", err)
			}
		})
	}
}

// TestCheckLinkAnswer: the dialer accepts an answer that agreed on what
// its device needs, and otherwise fails with verbs.ErrNoImmediate.
func TestCheckLinkAnswer(t *testing.T) {
	iwarp := fakeLinkEnd{needs: wire.LinkFeatures}
	if err := checkLinkAnswer(wire.LinkFeatures, true, iwarp); err != nil {
		t.Errorf("an answer with both features: %v", err)
	}
	if err := checkLinkAnswer(0, false, fakeLinkEnd{}); err != nil {
		t.Errorf("a Valkey server to a RoCE dialer: %v", err)
	}
	for _, tc := range []struct {
		agreed wire.Features
		hello  bool
		says   string
	}{
		{0, false, "the server speaks Valkey's protocol"},
		{wire.FeatureWriteNotice, true, "did not agree on link features"},
	} {
		err := checkLinkAnswer(tc.agreed, tc.hello, iwarp)
		if !errors.Is(err, verbs.ErrNoImmediate) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "siw0 port 1") {
			t.Errorf("agreed %#x, hello %v: %v; want verbs.ErrNoImmediate saying %q and the link", tc.agreed, tc.hello, err, tc.says)
		}
	}
	if h := linkHello(wire.Hello{Features: wire.FeatureResume}, iwarp); h.Features != wire.FeatureResume|wire.LinkFeatures || h.Needs != wire.LinkFeatures {
		t.Errorf("linkHello = %+v; want the link features offered and needed", h)
	}
}

// TestIWARPPortConflict: EADDRINUSE is iWARP's port space colliding with
// the TCP side only for an iWARP device's address (loopback is none) or
// the wildcard on a host with one, and no other error is; the listener's
// reason for it names the TCP side.
func TestIWARPPortConflict(t *testing.T) {
	if iwarpPortConflict(netip.MustParseAddr("127.0.0.1"), syscall.EADDRINUSE) {
		t.Error("127.0.0.1: EADDRINUSE taken for iWARP's port space")
	}
	if iwarpPortConflict(netip.IPv4Unspecified(), syscall.ENODEV) {
		t.Error("ENODEV taken for a port conflict")
	}
	why := iwarpPortError(syscall.EADDRINUSE)
	if why.Reason != fallback.ReasonIWARPPort || !errors.Is(why, syscall.EADDRINUSE) || !errors.Is(why, errIWARPSharesPorts) {
		t.Errorf("iwarpPortError = %+v", why)
	}
	if deviceTransport("nosuchdevice0") != verbs.TransportUnspecified {
		t.Error("a device that does not exist has a transport")
	}
}
