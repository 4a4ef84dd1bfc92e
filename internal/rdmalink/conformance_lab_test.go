//go:build linux

package rdmalink

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// TestLabConformance runs link.Link's conformance suite over connected
// pairs of rdmalink's links on each of the lab's providers, and
// link.Carrier's over carriers on Soft-RoCE, whose shared rings one pair
// on the second path makes for them all (a group's other link).
//
// What RDMA does not promise of the suite's model is said by the
// Options: a zero-byte write is checked by no device (markers), Wait on
// an ended link returns link.ErrWoken, and the end of a Disconnect comes
// with the peer's answer; on iWARP a refused request ends the connection
// without a cause, and a send completes once it is on the wire.
func TestLabConformance(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, p := range env.Pairs() {
		t.Run(p.Provider, func(t *testing.T) {
			opts := linktest.Options{ZeroLengthUnchecked: true, EndWakes: true, DisconnectAnswered: true}
			if p.Provider == labenv.ProviderSIW {
				opts.RefusalEnds = true
			}
			start := time.Now()
			t.Run("Link", func(t *testing.T) {
				linktest.RunWith(t, func(t *testing.T, a, b linktest.Spec) (link.Link, link.Link) {
					checkResources(t)
					return labPair(t, p.AddrA, p.AddrB, a, b, 0)
				}, opts)
			})
			t.Logf("%s: Link's suite took %v", p.Provider, time.Since(start).Round(time.Millisecond))
			if p.Provider != labenv.ProviderRXE {
				return
			}
			start = time.Now()
			t.Run("Carrier", func(t *testing.T) {
				// The makers, on the second path (a stream that moves from
				// one path's link to the other's), serve every pair and are
				// closed after them all: what they made for the pairs goes
				// with them, so the resources are checked once, here.
				checkResources(t)
				ma, mb := labPair(t, env.AddrA2, env.AddrB2, linktest.DefaultSpec(), linktest.DefaultSpec(), wire.FeatureGroup)
				linktest.RunCarrierWith(t, func(t *testing.T, a, b linktest.Spec) linktest.Carriers {
					ca, cb := labPair(t, p.AddrA, p.AddrB, a, b, wire.FeatureGroup)
					return linktest.Carriers{A: ca, B: cb, MakerA: ma, MakerB: mb}
				}, opts)
			})
			t.Logf("%s: Carrier's suite took %v", p.Provider, time.Since(start).Round(time.Millisecond))
		})
	}
}

// labPair connects a link on src (the dialer, a) to one on dst (the
// listener, b), sized as sa and sb, as rdmanet's dial and accept do: each
// end's link is made on its cm ID before the connect or the accept (so
// that every receive is posted before the peer may send), the dialer's
// request carries the link features it needs and the accept those both
// agreed on (with extra, wire.FeatureGroup for carriers), both sides retry
// receiver-not-ready for ever (RNR retry 7) and the transport 6 times,
// and each end takes its cm events once established. On a link whose
// accepting end speaks second (iWARP's MPA), the dialer's first message
// goes before the pair is handed over, and b posts its receive again.
//
// At cleanup both links are closed (with their cm IDs) and the listener,
// and no goroutine of theirs is left.
func labPair(t *testing.T, src, dst netip.Addr, sa, sb linktest.Spec, extra wire.Features) (*Link, *Link) {
	t.Helper()
	linktest.CheckGoroutines(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ln, err := cm.NewID()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if err := ln.Bind(netip.AddrPortFrom(dst, 0)); err != nil {
		t.Fatal(err)
	}
	if err := ln.Listen(4); err != nil {
		t.Fatal(err)
	}
	addr := ln.LocalAddr()

	type accepted struct {
		l   *Link
		err error
	}
	done := make(chan accepted, 1)
	go func() {
		l, err := acceptLink(ctx, ln, sb, extra)
		done <- accepted{l, err}
	}()
	a, err := dialLink(ctx, src, addr, sa)
	// As rdmanet's dial: a request whose local port clashed (iWARP, under
	// load: make test at eeb16a8) is made again from another ID.
	for try := 1; errors.Is(err, cm.ErrLocalPortBusy) && try < 3; try++ {
		t.Logf("dial %v from %v: %v; again from another port", addr, src, err)
		a, err = dialLink(ctx, src, addr, sa)
	}
	if err != nil {
		cancel() // the accept waits for a request that will not come
	}
	acc := <-done
	if acc.l != nil {
		t.Cleanup(func() { acc.l.Close() })
	}
	if a != nil {
		t.Cleanup(func() { a.Close() })
	}
	if err != nil {
		t.Fatalf("dial %v from %v: %v", addr, src, err)
	}
	if acc.err != nil {
		t.Fatalf("accept on %v: %v", addr, acc.err)
	}
	b := acc.l
	if b.Caps().SpeakSecond {
		speakFirst(t, a, b)
	}
	return a, b
}

// linkConfig sizes a link as s.
func linkConfig(s linktest.Spec) Config {
	return Config{SendBuffer: s.SendRing, RecvBuffer: s.RecvRing, SendDepth: s.SendDepth, RecvDepth: s.RecvDepth, ControlDepth: s.ControlDepth}
}

// dialLink is the dialer's side of labPair. Its request's private data is
// the link features it needs, and the accept's those agreed on.
func dialLink(ctx context.Context, src netip.Addr, dst netip.AddrPort, s linktest.Spec) (_ *Link, err error) {
	id, err := cm.NewID()
	if err != nil {
		return nil, err
	}
	var l *Link
	defer func() {
		if err != nil {
			id.Close()
			if l != nil {
				l.Discard()
			}
		}
	}()
	if err := id.Resolve(ctx, src, dst); err != nil {
		return nil, err
	}
	if l, err = New(id, linkConfig(s)); err != nil {
		return nil, err
	}
	peer, err := id.Connect(ctx, cm.ConnParam{PrivateData: binary.BigEndian.AppendUint32(nil, uint32(l.Needs())),
		ResponderResources: 1, InitiatorDepth: 1, RetryCount: 6, RNRRetryCount: 7})
	if err != nil {
		return nil, err
	}
	if len(peer.PrivateData) < 4 {
		id.Disconnect()
		return nil, fmt.Errorf("the accept carried %d bytes", len(peer.PrivateData))
	}
	if err := l.Established(wire.Features(binary.BigEndian.Uint32(peer.PrivateData)), false); err != nil {
		id.Disconnect()
		return nil, err
	}
	l.StartEvents()
	return l, nil
}

// acceptLink is the listener's side of labPair: it takes one request on
// ln and accepts it with a link sized as s.
func acceptLink(ctx context.Context, ln *cm.ID, s linktest.Spec, extra wire.Features) (_ *Link, err error) {
	req, err := ln.GetRequest(ctx)
	if err != nil {
		return nil, err
	}
	var l *Link
	defer func() {
		if err != nil {
			req.ID.Close()
			if l != nil {
				l.Discard()
			}
		}
	}()
	if l, err = New(req.ID, linkConfig(s)); err != nil {
		req.ID.Reject(nil)
		return nil, err
	}
	if len(req.Param.PrivateData) < 4 {
		req.ID.Reject(nil)
		return nil, fmt.Errorf("the request carried %d bytes", len(req.Param.PrivateData))
	}
	agreed := (wire.Features(binary.BigEndian.Uint32(req.Param.PrivateData))|l.Needs())&wire.LinkFeatures | extra
	err = req.ID.Accept(ctx, cm.ConnParam{PrivateData: binary.BigEndian.AppendUint32(nil, uint32(agreed)),
		ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7})
	if err != nil {
		return nil, err
	}
	if err := l.Established(agreed, true); err != nil {
		req.ID.Disconnect()
		return nil, err
	}
	l.StartEvents()
	return l, nil
}

// speakFirst sends the dialer's first message, a control message that b
// takes and posts its receive again for: on iWARP the accepting end
// sends nothing before the dialer's first message arrived (MPA, RFC
// 6581), as rdmanet's engine holds its requests for it
// (link.Caps.SpeakSecond). Both ends are as new after it.
func speakFirst(t *testing.T, a, b *Link) {
	t.Helper()
	linktest.Post(t, a, linktest.Control(0, 0))
	linktest.WantKinds(t, "b", linktest.WaitFor(t, b, 1), "control-arrived")
	if err := b.PostRecv(1); err != nil {
		t.Fatal(err)
	}
	linktest.WantKinds(t, "a", linktest.WaitFor(t, a, 1), "send-done 0")
}

// checkResources fails t if, once its later cleanups ran, the process
// holds other verbs objects or cm IDs than before: every link, ID and
// listener went, and with their last the devices' shared queues,
// channels, protection domains and pools.
func checkResources(t *testing.T) {
	verbsBefore, idsBefore := verbs.Resources(), cm.LiveIDs()
	t.Cleanup(func() {
		if r, ids := verbs.Resources(), cm.LiveIDs(); r != verbsBefore || ids != idsBefore {
			t.Errorf("verbs objects %+v and %d cm IDs after the pair, %+v and %d before", r, ids, verbsBefore, idsBefore)
		}
	})
}
