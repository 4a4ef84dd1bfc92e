package stream

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// TestEnginesShareARecvPool: 16 connections whose receiving ends take
// their receives from one pool (link.RecvPool, a shared receive queue) of
// fewer receives than their peers could use at once, streaming together,
// one with a reader that keeps falling behind. With credit grants the pool
// never runs dry, the streams get more than their first grants while the
// pool has room, every byte arrives in order, and closing the ends gives
// the pool back whole.
func TestEnginesShareARecvPool(t *testing.T) {
	const (
		pairs  = 16
		first  = 8   // each receiving end's first grant
		size   = 192 // the pool: room for the first grants, and 64 more
		bytes_ = 256 << 10
	)
	pool := link.NewRecvPool(size)
	rng := rand.New(rand.NewPCG(1, 2))
	features := wire.FeatureRing | wire.FeatureShutdown
	type conn struct{ a, b *growSide }
	var conns []conn
	for range pairs {
		send := link.PipeConfig{SendRing: 16 << 10, RecvRing: 16 << 10, SendDepth: 16, RecvDepth: 16, ControlDepth: 4, RNRRetry: 7, RecvCredit: true, RecvGrant: true}
		recv := send
		recv.RecvDepth, recv.RecvPool = first, pool
		la, lb := link.NewPipe(send, recv)
		c := conn{&growSide{link: la}, &growSide{link: lb}}
		for _, s := range []*growSide{c.a, c.b} {
			peer := c.b.link
			if s == c.b {
				peer = c.a.link
			}
			addr, key := s.link.RecvRingKey()
			e, err := New(Config{
				Features: features, PeerHello: true, Server: s == c.b,
				Peer: wire.Hello{Version: 1, Features: features | wire.LinkFeatures, RecvDepth: uint16(peer.Caps().RecvDepth), RingSize: 16 << 10},
				Caps: s.link.Caps(), SendRing: s.link.SendRing(), RecvRing: s.link.RecvRing(), RecvAddr: addr, RecvKey: key,
				KeepAlive: time.Hour,
			})
			if err != nil {
				t.Fatal(err)
			}
			s.eng = e
			e.Start()
			e.Flush(s.link)
		}
		c.a.src = randomBytes(rng, bytes_)
		conns = append(conns, c)
	}
	buf := make([]byte, 64<<10)
	for steps := 0; ; steps++ {
		done := true
		for i, c := range conns {
			c.a.step(t, rng, buf, true)
			// Connection 0's reader falls behind: it reads one step in ten.
			if i != 0 || steps%10 == 0 {
				c.b.step(t, rng, buf, false)
			} else {
				c.b.poll(t)
			}
			done = done && c.b.got.Len() == len(c.a.src)
		}
		if done {
			break
		}
		if steps > 200_000 {
			t.Fatalf("stuck after %d steps: %+v", steps, pool.Stats())
		}
	}
	for i, c := range conns {
		if !bytes.Equal(c.b.got.Bytes(), c.a.src) {
			t.Fatalf("connection %d: the bytes read differ from those written", i)
		}
	}
	st := pool.Stats()
	t.Logf("pool: %+v", st)
	if st.Dry != 0 {
		t.Errorf("the pool ran dry %d times: credit was granted beyond it", st.Dry)
	}
	if st.MostGranted <= pairs*first || st.MostGranted > size {
		t.Errorf("the peers held at most %d credit together; want more than their first grants (%d) and no more than the pool (%d)", st.MostGranted, pairs*first, size)
	}
	for _, c := range conns {
		c.a.link.Close()
		c.b.link.Close()
	}
	if st := pool.Stats(); st.Granted != 0 || st.Posted != size {
		t.Errorf("after every end closed, the pool has %d granted and %d of %d posted", st.Granted, st.Posted, size)
	}
}
