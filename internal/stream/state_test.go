package stream

import (
	"testing"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// TestStateFollowsTraffic: State shows a write in flight (slots, ring
// bytes, the peer's room taken), counts what was posted and what arrived,
// and shows the ring free again once the requests complete (a small write
// may go unsignaled: Drain's signaled marker retires it).
func TestStateFollowsTraffic(t *testing.T) {
	e, r, clk := newTestEngine(t, wire.FeatureRing|wire.FeatureShutdown, rdmanetHello, 0)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 0x9000, Length: 4096, RKey: 9})
	completeAll(e, r)
	idle := e.State()
	if idle.SendSlots != 64 || idle.SendRing != 4096 || idle.SendInFlight != 0 || idle.SendRingUsed != 0 || idle.PeerRoom != 4096 {
		t.Fatalf("idle state %+v", idle)
	}
	if idle.Posted != 1 || idle.Arrived != 1 {
		t.Errorf("after the announcements: posted %d, arrived %d; want 1 and 1", idle.Posted, idle.Arrived)
	}
	clk.advance(1)
	if n, err := e.Write(make([]byte, 1000)); n != 1000 || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	e.Flush(r)
	busy := e.State()
	if busy.SendInFlight == 0 || busy.SendRingUsed != 1000 || busy.PeerRoom != 4096-1000 || busy.Posted <= idle.Posted || !busy.LastPost.After(idle.LastPost) {
		t.Errorf("with 1000 bytes in flight: %+v (idle %+v)", busy, idle)
	}
	e.Drain() // a signaled marker after an unsignaled write retires it
	e.Flush(r)
	completeAll(e, r)
	if done := e.State(); done.SendInFlight != 0 || done.SendRingUsed != 0 {
		t.Errorf("after completion: %+v", done)
	}
	e.Handle(&link.Completion{Kind: link.DataArrived, N: 10})
	e.AfterCompletions()
	if s := e.State(); s.RecvUnread != 10 || s.Arrived != idle.Arrived+1 {
		t.Errorf("10 bytes arrived: %+v", s)
	}
}
