package tcplink

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
	"github.com/rdmanet/sdk/internal/wire"
)

// recordingCarrier is a link in carrier mode that keeps the errors of the
// calls a group makes to register and release rings, which the group does
// not report.
type recordingCarrier struct {
	*Link
	mu   sync.Mutex
	errs []error
	regs int // registrations made and not released
}

func (c *recordingCarrier) note(err error, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.errs = append(c.errs, err)
		return
	}
	c.regs += d
}

func (c *recordingCarrier) ShareRecvRing(maker link.Carrier, mem []byte) (uint64, uint32, error) {
	addr, rkey, err := c.Link.ShareRecvRing(maker, mem)
	c.note(err, 1)
	return addr, rkey, err
}

func (c *recordingCarrier) ShareSendRing(maker link.Carrier, mem []byte) (uint32, error) {
	key, err := c.Link.ShareSendRing(maker, mem)
	c.note(err, 1)
	return key, err
}

func (c *recordingCarrier) ReleaseRecvRing(mem []byte) error {
	err := c.Link.ReleaseRecvRing(mem)
	c.note(err, -1)
	return err
}

func (c *recordingCarrier) ReleaseSendRing(key uint32) error {
	err := c.Link.ReleaseSendRing(key)
	c.note(err, -1)
	return err
}

func (c *recordingCarrier) state() ([]error, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...), c.regs
}

// TestGroupLastPath: a link group whose only link (a link.Pipe, as an RDMA
// link) fails moves its streams onto a TCP link in carrier mode that both
// sides add: the streams keep the rings the pipe made, their data goes
// both ways over TCP, and when they close, the group drops their
// registrations on the TCP link without an error.
func TestGroupLastPath(t *testing.T) {
	checkGoroutines(t)
	pc := link.PipeConfig{SendRing: 64, RecvRing: 64, SendDepth: 64, RecvDepth: 512, ControlDepth: 16, RecvCredit: true, RecvGrant: true}
	pa, pb := linktest.NewPipes(t, pc, pc)
	ca, cb := group.DefaultConfig(), group.DefaultConfig()
	ca.MoveTimeout, ca.Mover = linktest.HangGuard, true
	cb.MoveTimeout = linktest.HangGuard
	a, err := group.New(pa, ca)
	if err != nil {
		t.Fatal(err)
	}
	b, err := group.New(pb, cb)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	const streams = 3
	var xs, ys []*group.Stream
	for range streams {
		x, y := openStreams(t, a, b)
		xs, ys = append(xs, x), append(ys, y)
		ping(t, x, y, []byte("over the pipe"), 1)
	}

	pa.Cut(nil)
	for i := range streams {
		linktest.WantKinds(t, "dialer", linktest.WaitFor(t, xs[i], 1), "failed")
		linktest.WantKinds(t, "listener", linktest.WaitFor(t, ys[i], 1), "failed")
	}
	sp := spec{sendDepth: 64, recvDepth: 512, controlDepth: 16, carrier: true}
	ta, tb := newPair(t, "tcp", sp, sp)
	ra, rb := &recordingCarrier{Link: ta}, &recordingCarrier{Link: tb}
	if err := b.AddLink(rb); err != nil {
		t.Fatal(err)
	}
	if err := a.AddLink(ra); err != nil {
		t.Fatal(err)
	}
	for i := range streams {
		linktest.WantKinds(t, "dialer", linktest.WaitFor(t, xs[i], 1), "resumed")
		linktest.WantKinds(t, "listener", linktest.WaitFor(t, ys[i], 1), "resumed")
		announce(t, ys[i], xs[i])
		announce(t, xs[i], ys[i])
	}
	for i := range streams {
		ping(t, xs[i], ys[i], bytes.Repeat([]byte{byte('a' + i)}, 1000+i), 10)
		ping(t, ys[i], xs[i], bytes.Repeat([]byte{byte('A' + i)}, 2000+i), 20)
	}
	if ta.landingNow() < 2000*streams || tb.landingNow() < 1000*streams {
		t.Errorf("the TCP links took %d and %d bytes of tagged data", ta.landingNow(), tb.landingNow())
	}
	if ls := a.Links(); len(ls) != 1 || ls[0].Base != link.Link(ra) || ls[0].Streams != streams {
		t.Errorf("the dialer's links: %+v, want the TCP link with %d streams", ls, streams)
	}
	if errs, regs := ra.state(); len(errs) != 0 || regs != 2*streams {
		t.Errorf("the dialer's TCP link: %d registrations, errors %v; want %d and none", regs, errs, 2*streams)
	}

	for i := range streams {
		xs[i].Close()
		ys[i].Close()
	}
	deadline := time.Now().Add(linktest.HangGuard)
	for a.Stats().Streams+b.Stats().Streams > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("streams left: %d and %d", a.Stats().Streams, b.Stats().Streams)
		}
		time.Sleep(time.Millisecond)
	}
	for who, c := range map[string]*recordingCarrier{"dialer": ra, "listener": rb} {
		if errs, regs := c.state(); len(errs) != 0 || regs != 0 {
			t.Errorf("the %s's TCP link after the streams closed: %d registrations left, errors %v", who, regs, errs)
		}
	}
}

// openStreams opens a stream of a's that b accepts.
func openStreams(t *testing.T, a, b *group.Mux) (*group.Stream, *group.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	type res struct {
		s   *group.Stream
		err error
	}
	acc := make(chan res, 1)
	go func() {
		s, err := b.Accept(ctx)
		acc <- res{s, err}
	}()
	x, err := a.Open(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	r := <-acc
	if r.err != nil {
		t.Fatal(r.err)
	}
	return x, r.s
}

// announce names to's ring to from's side, as its engine does on a new
// link: the group checks writes against the rings announced.
func announce(t *testing.T, to, from *group.Stream) {
	t.Helper()
	addr, key := to.RecvRingKey()
	m := wire.Message{Op: wire.OpRegisterXferMemory, Addr: addr, Length: uint32(len(to.RecvRing())), RKey: key}
	wr := link.SendWR{Kind: link.SendControl, Signaled: true, ID: 100}
	m.Encode(&wr.Msg)
	post(t, to, wr)
	wantKinds(t, "announced to", waitFor(t, from, 1), "control-arrived")
	waitFor(t, to, 1) // its SendDone
	if err := from.PostRecv(1); err != nil {
		t.Fatal(err)
	}
}

// ping writes b into the peer's ring with a control message after it, and
// checks that both arrive, in order.
func ping(t *testing.T, from, to *group.Stream, b []byte, id uint64) {
	t.Helper()
	copy(from.SendRing(), b)
	addr, key := to.RecvRingKey()
	post(t, from,
		link.SendWR{Kind: link.SendData, ID: id, N: uint32(len(b)), Remote: addr, RKey: key},
		control(id+1, b[0]))
	cs := waitFor(t, to, 2)
	wantKinds(t, "receiver", cs, fmt.Sprintf("data-arrived %d", len(b)), "control-arrived")
	if got := to.RecvRing()[:len(b)]; !bytes.Equal(got, b) {
		t.Errorf("the ring holds %q, want %q", got[:min(len(got), 20)], b[:min(len(b), 20)])
	}
	if err := to.PostRecv(2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, from, 1) // the control message's SendDone
}
