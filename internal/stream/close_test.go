package stream

import (
	"errors"
	"io"
	"testing"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// A session whose sides say when they close (wire.FeatureClose): the end
// of a link is the peer closing only after its Close; before, the link was
// lost (the peer suspended the session, or died), and the session resumes.

const closeFeatures = resumeFeatures | wire.FeatureClose

var closeHello = wire.Hello{Version: 1, Features: closeFeatures, RecvDepth: 64, RingSize: 4096, SendRing: 4096}

// sentOps lists the control messages among wrs, and "data" for each data
// request, in posting order.
func sentOps(wrs []link.SendWR) []string {
	var ops []string
	for _, wr := range wrs {
		switch wr.Kind {
		case link.SendData:
			ops = append(ops, "data")
		case link.SendControl:
			m, _ := wire.Decode(wr.Msg[:], true)
			ops = append(ops, m.Op.String())
		}
	}
	return ops
}

func TestEngineDisconnectWithoutCloseIsLost(t *testing.T) {
	e, _, _ := newTestEngine(t, closeFeatures, closeHello, 0)
	e.Handle(&link.Completion{Kind: link.Disconnected})
	if !errors.Is(e.Lost(), ErrPeerLeftLink) || !errors.Is(e.Lost(), link.ErrDown) || e.Err() != nil {
		t.Fatalf("a link that ended without the peer's Close: lost %v, err %v; want it lost (ErrPeerLeftLink)", e.Lost(), e.Err())
	}
	if _, err := e.Read(make([]byte, 10)); err != ErrWouldBlock {
		t.Fatalf("Read of a suspended session: %v, want it to wait for the resume", err)
	}

	// Without the extension the end of the link is the peer closing, as
	// it always was (and is with Valkey peers).
	e, _, _ = newTestEngine(t, resumeFeatures, sessionHelloFor(resumeFeatures), 0)
	e.Handle(&link.Completion{Kind: link.Disconnected})
	if e.Lost() != nil {
		t.Fatalf("without FeatureClose a disconnect was taken for a lost link: %v", e.Lost())
	}
	if _, err := e.Read(make([]byte, 10)); err != io.EOF {
		t.Fatalf("Read after the peer disconnected: %v, want EOF", err)
	}
}

func sessionHelloFor(f wire.Features) wire.Hello {
	h := closeHello
	h.Features = f
	return h
}

func TestEnginePeerClose(t *testing.T) {
	e, r, _ := newTestEngine(t, closeFeatures, closeHello, 0)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 4096, RKey: 9})
	e.Handle(&link.Completion{Kind: link.DataArrived, N: 5})
	control(e, wire.Message{Op: wire.OpClose})
	e.Flush(r)
	buf := make([]byte, 10)
	if n, err := e.Read(buf); n != 5 || err != nil {
		t.Fatalf("Read = %d, %v; want the 5 bytes that came before Close", n, err)
	}
	if _, err := e.Read(buf); err != io.EOF {
		t.Fatalf("Read after the bytes: %v, want EOF", err)
	}
	if !e.Writable() {
		t.Fatal("not Writable after the peer closed: a Write must not wait for ever")
	}
	if _, err := e.Write([]byte("x")); !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("Write after the peer's Close: %v, want ErrPeerClosed", err)
	}
	// The end of the link that follows is no loss: nothing resumes.
	e.Handle(&link.Completion{Kind: link.Failed, Err: link.ErrDown})
	if e.Lost() != nil || e.Err() != nil {
		t.Fatalf("the link's end after the peer's Close: lost %v, err %v; want neither", e.Lost(), e.Err())
	}
	if !e.Drained() {
		t.Fatal("a connection whose peer closed and left is not done draining")
	}

	// A peer that did not agree on Close may not send it.
	e, _, _ = newTestEngine(t, resumeFeatures, sessionHelloFor(resumeFeatures), 0)
	control(e, wire.Message{Op: wire.OpClose})
	if !errors.Is(e.Err(), wire.ErrProtocol) {
		t.Fatalf("Close without the extension: %v, want a protocol error", e.Err())
	}
}

// TestEngineSendsClose: Close comes last, after every byte written, and on
// a resumed link again, after the bytes sent again.
func TestEngineSendsClose(t *testing.T) {
	e, r, _ := newTestEngine(t, closeFeatures, closeHello, 0)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 4096, RKey: 9})
	completeAll(e, r)
	for range 3 {
		if _, err := e.Write(make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
	}
	e.Drain()
	e.Flush(r)
	ops := sentOps(r.sent)
	if len(ops) == 0 || ops[len(ops)-1] != "Close" {
		t.Fatalf("a closing session posted %v; want Close last", ops)
	}
	if e.Drained() {
		t.Fatal("drained before Close completed")
	}
	completeAll(e, r)
	if !e.Drained() {
		t.Fatal("not drained once Close completed")
	}

	// Lost before the peer took any of it: the resumed link says what it
	// received, sends the 300 bytes again, and then Close.
	e.Fail(link.ErrDown)
	if err := e.Relink(link.Caps{SendDepth: 8, RecvDepth: 8, ControlDepth: 2}, 0x2000, 3); err != nil {
		t.Fatal(err)
	}
	e.Flush(r)
	if ops := sentOps(r.sent); len(ops) != 1 || ops[0] != "Resume" {
		t.Fatalf("a closing session's new link posted %v before the peer's Resume; want only Resume", ops)
	}
	completeAll(e, r)
	control(e, wire.Message{Op: wire.OpResume})
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 2 << 20, Length: 4096, RKey: 10})
	e.Flush(r)
	if ops := sentOps(r.sent); len(ops) < 2 || ops[0] != "data" || ops[len(ops)-1] != "Close" {
		t.Fatalf("after the peer's Resume posted %v; want the bytes again, then Close", ops)
	}
}

// TestEngineEndFollowsHeldData: on a link with receive credit, bytes held
// back (coalescing) may find no credit left; Shutdown, a control message
// that may still be sent, must wait for them, or the peer would read the
// end of the stream before its last bytes.
func TestEngineEndFollowsHeldData(t *testing.T) {
	const peerDepth = 16
	e, r, _ := newIWARPEngine(t, peerDepth, false, 0)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 64 << 10, RKey: 9})
	e.Flush(r)
	completeAll(e, r)
	for e.rc.available() > recvCreditReserve+3 {
		e.Write(make([]byte, 10))
		e.Flush(r)
		completeAll(e, r)
	}
	// Small writes: the first goes at once, those after it are held
	// until it completes.
	for range 3 {
		e.Write(make([]byte, 10))
	}
	e.Flush(r)
	if e.sq.Held() == 0 {
		t.Fatalf("no small write was held behind the first: posted %+v, credit %d", r.sent, e.rc.available())
	}
	// This side's Credits for the peer's data (one per 4 receives posted
	// again) take the last data credits.
	for e.rc.canData() {
		for range 4 {
			e.Handle(&link.Completion{Kind: link.DataArrived, N: 1})
		}
		e.AfterCompletions()
		e.Flush(r) // posts the receives again, which makes a Credit due
		e.AfterCompletions()
		e.Flush(r) // and sends it
	}
	completeAll(e, r)
	if e.rc.canData() || e.sq.Held() == 0 {
		t.Fatalf("scenario not reached: data credit %v, held %d", e.rc.canData(), e.sq.Held())
	}
	if err := e.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	e.Flush(r)
	if ops := sentOps(r.sent); len(ops) != 0 {
		t.Fatalf("with bytes held for credit, CloseWrite posted %v; want nothing before them", ops)
	}
	sent := e.rc.sent
	control(e, wire.Message{Op: wire.OpCredit, Receives: uint32(sent)})
	e.Flush(r)
	if ops := sentOps(r.sent); len(ops) != 2 || ops[0] != "data" || ops[1] != "Shutdown" {
		t.Fatalf("after the peer's Credit posted %v; want the held bytes, then Shutdown", ops)
	}
}
