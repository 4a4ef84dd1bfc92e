package group_test

import (
	"context"
	"errors"
	"testing"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
	"github.com/rdmanet/sdk/internal/wire"
)

// FuzzGroup: whatever a peer sends on a group's link after a stream
// opened (control messages of any bytes, data writes with any tag), the
// group goes on or ends with a protocol error, its stream ends with it or
// works on, and Close returns: no panic, no hang.
func FuzzGroup(f *testing.F) {
	seed := func(kind byte, msg [wire.MessageSize]byte) []byte { return append([]byte{kind}, msg[:]...) }
	var b [wire.MessageSize]byte
	(&wire.GroupMessage{Op: wire.OpStreamClose, To: wire.MakeStreamTag(1, 1), From: wire.MakeStreamTag(1, 1)}).Encode(&b)
	f.Add(seed(0, b))
	(&wire.GroupMessage{Op: wire.OpStreamOpen, From: wire.MakeStreamTag(2, 1), Grant: 8, RingSize: 64, RKey: 1, Addr: 1}).Encode(&b)
	f.Add(seed(0, b))
	wire.SetStream(&b, wire.MakeStreamTag(1, 1))
	f.Add(append(seed(0, b), seed(1, b)...))
	for _, reason := range []uint32{wire.ReasonNone, wire.MoveRebalance} {
		(&wire.GroupMessage{Op: wire.OpStreamMove, To: wire.MakeStreamTag(1, 1), From: wire.MakeStreamTag(1, 1), Grant: 8, Reason: reason}).Encode(&b)
		f.Add(seed(0, b))
	}
	(&wire.GroupMessage{Op: wire.OpStreamMoved, To: wire.MakeStreamTag(1, 1), From: wire.MakeStreamTag(1, 1), Grant: 8}).Encode(&b)
	f.Add(seed(0, b))
	f.Fuzz(func(t *testing.T, data []byte) {
		// A group that moves streams, at the side that waits for moves:
		// the peer may send StreamMove, and anything else, after its open.
		m, pb := rawPeer(t, moveConfig(false))
		ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
		defer cancel()
		opened := make(chan *group.Stream, 1)
		go func() {
			s, _ := m.Open(ctx, 9)
			opened <- s
		}()
		open := receiveOpen(t, pb)
		acc := wire.GroupMessage{Op: wire.OpStreamAccept, To: open.From, From: wire.MakeStreamTag(1, 1), Grant: 8, RingSize: 4096, Addr: 1 << 40, RKey: 1}
		linktest.Post(t, pb, groupMsg(acc))
		s := <-opened
		if s == nil {
			t.Fatal("open failed")
		}
		defer s.Close()
		const chunk = 1 + wire.MessageSize
		for i := 0; i+chunk <= len(data) && i < 32*chunk; i += chunk {
			var wr link.SendWR
			if data[i]&1 == 0 {
				wr = link.SendWR{Kind: link.SendControl, Signaled: true, ID: uint64(i)}
				copy(wr.Msg[:], data[i+1:i+chunk])
			} else {
				tag := uint32(data[i+1])<<24 | uint32(data[i+2])<<16 | uint32(data[i+3])<<8 | uint32(data[i+4])
				wr = link.SendWR{Kind: link.SendData, Signaled: true, ID: uint64(i), N: uint32(data[i+5] % 64), Remote: open.Addr, RKey: open.RKey, Tag: tag}
			}
			if err := pb.PostSend([]link.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			linktest.PollAll(t, pb)
		}
		// Whatever came of it, a message of the group's own settles it.
		linktest.Post(t, pb, groupMsg(wire.GroupMessage{Op: wire.OpStreamRefuse, To: wire.MakeStreamTag(3, 3)}))
		if err := waitErr(t, m); !errors.Is(err, wire.ErrProtocol) && !errors.Is(err, group.ErrDown) {
			t.Errorf("group ended with %v", err)
		}
		linktest.WaitEnd(t, s)
	})
}
