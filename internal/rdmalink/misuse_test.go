package rdmalink

import (
	"errors"
	"net"
	"testing"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/verbs"
)

// Link's checks of link.Link's contract on the host, on a link with a
// slot on a fake queue and no queue pair (a request that passed them
// would be posted to none): TestLabConformance runs the whole suite on
// real queue pairs.

// checkedLink is a fake link sized as the suite's default, with a 4 KiB
// transmit ring and a stream's ring of 100 bytes (key 7).
func checkedLink(t *testing.T) *Link {
	t.Helper()
	_, _, _, links := sharedLinks(1, 256, 16)
	l := links[0]
	l.caps = link.Caps{SendDepth: 4, RecvDepth: 4, ControlDepth: 2}
	l.sendMarks = make([]sendMark, len(l.sendIDs))
	l.res.tx = &region{b: make([]byte, 4096)}
	l.sendRings = map[uint32]*region{7: {b: make([]byte, 100)}}
	return l
}

// TestPostSendMisuse: a PostSend that breaks the contract fails with
// link.ErrMisuse before it posts anything, and leaves the link's counts
// as they were. A data range past its ring used to be posted, reading
// whatever the ring's slab held next to it (or panicking in MR.Slice
// past the slab), and nothing counted the requests outstanding.
func TestPostSendMisuse(t *testing.T) {
	marker := link.SendWR{Kind: link.SendMarker, Signaled: true}
	control := link.SendWR{Kind: link.SendControl, Signaled: true}
	data := func(ring, off, n uint32) link.SendWR {
		return link.SendWR{Kind: link.SendData, Signaled: true, Ring: ring, Off: off, N: n}
	}
	for _, tc := range []struct {
		name string
		wrs  []link.SendWR
		// outstanding, controls: what the link holds before.
		outstanding, controls uint32
	}{
		{"kind", []link.SendWR{{Kind: 0, Signaled: true}}, 0, 0},
		{"unsignaled control", []link.SendWR{{Kind: link.SendControl}}, 0, 0},
		{"data past the transmit ring", []link.SendWR{data(0, 4000, 97)}, 0, 0},
		{"data offset overflow", []link.SendWR{data(0, 1<<32-1, 2)}, 0, 0},
		{"data of no stream's ring", []link.SendWR{data(8, 0, 1)}, 0, 0},
		{"data past a stream's ring", []link.SendWR{data(7, 50, 51)}, 0, 0},
		{"a good request, then a bad one", []link.SendWR{marker, data(0, 4000, 97)}, 0, 0},
		{"send depth", []link.SendWR{marker, marker, marker, marker, marker}, 0, 0},
		{"send depth, with requests outstanding", []link.SendWR{marker, marker}, 3, 0},
		{"control depth", []link.SendWR{control, control, control}, 0, 0},
		{"control depth, with controls outstanding", []link.SendWR{control}, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := checkedLink(t)
			l.posted, l.ctlNext = tc.outstanding, uint64(tc.controls)
			err := l.PostSend(tc.wrs)
			if !errors.Is(err, link.ErrMisuse) {
				t.Fatalf("PostSend: %v, want an error matching link.ErrMisuse", err)
			}
			if l.posted != tc.outstanding || l.ctlNext != uint64(tc.controls) || l.sendNext != 0 || l.noticeNext != 0 {
				t.Errorf("after the refusal: posted %d, controls %d, send place %d, notices %d", l.posted, l.ctlNext, l.sendNext, l.noticeNext)
			}
		})
	}
}

// TestSendDoneRetires: a SendDone retires its request and every one
// before it, and what is posted after Disconnect counts for nothing. The
// lab found requests posted after Disconnect taking the places of those
// still in flight: a late completion of one reported another's id.
func TestSendDoneRetires(t *testing.T) {
	_, _, f, links := sharedLinks(1, 256, 16)
	l := links[0]
	l.caps = link.Caps{SendDepth: 4, RecvDepth: 4, ControlDepth: 2}
	l.sendMarks = make([]sendMark, len(l.sendIDs))
	// Three requests, the second a control message, as PostSend places
	// them (without a queue pair to post them to).
	for i, ctl := range []bool{false, true, false} {
		l.posted++
		if ctl {
			l.ctlNext++
		}
		l.sendID(uint64(10 + i))
	}
	if err := l.checkDepths(2, 0); !errors.Is(err, link.ErrMisuse) {
		t.Fatalf("two more of 4 with 3 outstanding: %v", err)
	}
	if err := l.checkDepths(1, 2); !errors.Is(err, link.ErrMisuse) {
		t.Fatalf("two more controls of 2 with 1 outstanding: %v", err)
	}
	f.add(verbs.WorkCompletion{ID: l.tag | 1, Opcode: verbs.WCSend})
	cs := make([]link.Completion, 4)
	if n, err := l.Poll(cs); err != nil || n != 1 || cs[0].Kind != link.SendDone || cs[0].ID != 11 {
		t.Fatalf("Poll: %d %v %+v", n, err, cs[0])
	}
	if err := l.checkDepths(3, 2); err != nil {
		t.Fatalf("with the first two retired: %v", err)
	}
	if err := l.checkDepths(4, 0); !errors.Is(err, link.ErrMisuse) {
		t.Fatalf("four more with 1 outstanding: %v", err)
	}
	// After Disconnect the queue pair flushes what is posted: any number
	// of requests is taken, and none is posted (the fake link has no
	// queue pair to post to) or takes a place of one still in flight,
	// whose completion may yet come.
	l.disconnecting = true
	wrs := make([]link.SendWR, 10)
	for i := range wrs {
		wrs[i] = link.SendWR{Kind: link.SendMarker, Signaled: true, ID: 99}
	}
	if err := l.PostSend(wrs); err != nil {
		t.Fatalf("after Disconnect: %v", err)
	}
	if l.sendNext != 3 || l.sendIDs[2] != 12 {
		t.Errorf("after Disconnect: send place %d, the third's id %d", l.sendNext, l.sendIDs[2])
	}
}

// TestCallsAfterClose: once Close began, every call but Close and Wake
// fails with net.ErrClosed (Close itself needs the link's cm ID, which
// a fake link has not: the suite closes real ones).
func TestCallsAfterClose(t *testing.T) {
	l := checkedLink(t)
	if err := l.PostRecv(-1); !errors.Is(err, link.ErrMisuse) {
		t.Errorf("PostRecv(-1): %v, want an error matching link.ErrMisuse", err)
	}
	l.gone.Store(true)
	for name, err := range map[string]error{
		"PostSend":   l.PostSend([]link.SendWR{{Kind: link.SendMarker, Signaled: true}}),
		"PostRecv":   l.PostRecv(0),
		"Poll":       func() error { _, err := l.Poll(make([]link.Completion, 1)); return err }(),
		"Arm":        l.Arm(),
		"Wait":       l.Wait(),
		"Disconnect": l.Disconnect(),
	} {
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s after Close: %v, want net.ErrClosed", name, err)
		}
	}
}

// TestNoRing: a ring of 0 bytes, or a first receive ring released, is
// no region: no memory, named by address and key 0. RecvRingKey used to
// dereference the released ring.
func TestNoRing(t *testing.T) {
	var r *region
	if r.Bytes() != nil || r.Addr() != 0 || r.RKey() != 0 || r.Slice(0, 0) != (verbs.SGE{}) {
		t.Errorf("no region: %v %d %d %+v", r.Bytes(), r.Addr(), r.RKey(), r.Slice(0, 0))
	}
	l := checkedLink(t)
	l.res.tx = nil
	if err := l.PostSend([]link.SendWR{{Kind: link.SendData, Signaled: true, N: 1}}); !errors.Is(err, link.ErrMisuse) {
		t.Errorf("a byte of an empty transmit ring: %v, want an error matching link.ErrMisuse", err)
	}
	if addr, rkey := l.RecvRingKey(); addr != 0 || rkey != 0 || l.RecvRing() != nil {
		t.Errorf("no receive ring: %#x %#x %d bytes", addr, rkey, len(l.RecvRing()))
	}
}
