package tcplink

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// The ring a hostile peer of a link in carrier mode writes into: the first
// ring ShareRecvRing registers there. Its key and address follow from the
// link's first key (hostileKey) and RingAddr: the names are counted.
const (
	sharedKey  = hostileKey + 1
	sharedAddr = ringAddr + ringSpan
	sharedSize = 1000
)

// carrierConfig is testSpec's in carrier mode.
func carrierConfig() Config {
	cfg := testSpec().config()
	cfg.Carrier = true
	return cfg
}

// shareHostileRing registers the ring a hostile peer writes into, filled
// with 0x5a, and puts it in *ring.
func shareHostileRing(t testing.TB, ring *[]byte) func(*Link) {
	return func(l *Link) {
		mem := bytes.Repeat([]byte{0x5a}, sharedSize)
		addr, key, err := l.ShareRecvRing(nil, mem)
		if err != nil {
			t.Fatal(err)
		}
		if addr != sharedAddr || key != sharedKey {
			t.Fatalf("the first shared ring is at %#x with key %d, want %#x and %d", addr, key, uint64(sharedAddr), sharedKey)
		}
		*ring = mem
	}
}

// TestHostileCarrierPeer: a link in carrier mode checks every tagged data
// frame against the ring its key names, as it checks a data frame against
// its ring; a data frame without a tag is a protocol error.
func TestHostileCarrierPeer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		frames frames
		pre    []link.SendWR
		want   []string
		tags   []uint32 // the data's, if any arrived
		ring   string   // what the shared ring holds at 10 after, if not its filling
		err    error
		abort  byte
		count  uint64
	}{
		{name: "tagged data", frames: frames{}.tagged(sharedKey, sharedAddr+10, 0xabcd_0001, 3, "xyz").tagged(hostileKey, ringAddr+4090, 0, 6, "abcdef"),
			want: []string{"data-arrived 3", "data-arrived 6", "disconnected"}, tags: []uint32{0xabcd_0001, 0}, ring: "xyz"},
		{name: "zero bytes at the ring's end", frames: frames{}.tagged(sharedKey, sharedAddr+sharedSize, 9, 0, ""),
			want: []string{"data-arrived 0", "disconnected"}, tags: []uint32{9}},
		{name: "marker", frames: frames{}.marker(sharedKey, sharedAddr+sharedSize).control(0),
			want: []string{"control-arrived", "disconnected"}},
		{name: "unknown key", frames: frames{}.tagged(hostileKey+2, sharedAddr, 1, 1, "a"),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "below the ring", frames: frames{}.tagged(sharedKey, sharedAddr-1, 1, 1, "a"),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "past the ring", frames: frames{}.tagged(sharedKey, sharedAddr+sharedSize, 1, 1, "a"),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "longer than the ring", frames: frames{}.control(0).tagged(sharedKey, sharedAddr, 1, sharedSize+1, "a"),
			want: []string{"control-arrived", "failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess, count: 1},
		{name: "huge", frames: frames{}.tagged(sharedKey, sharedAddr, 1, 1<<32-1, "abc"),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "the first ring's address", frames: frames{}.tagged(sharedKey, ringAddr, 1, 1, "a"),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "the shared ring's address with the first key", frames: frames{}.tagged(hostileKey, sharedAddr, 1, 1, "a"),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "address overflow", frames: frames{}.tagged(sharedKey, 1<<64-1, 1, 2, "ab"),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "marker past the ring", frames: frames{}.marker(sharedKey, sharedAddr+sharedSize+1),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "data without a tag", frames: frames{}.tagged(sharedKey, sharedAddr+10, 1, 1, "a").data(hostileKey, ringAddr, 1, "a"),
			want: []string{"data-arrived 1", "failed"}, tags: []uint32{1}, ring: "a", err: wire.ErrProtocol, abort: abortProtocol, count: 1},
		{name: "truncated header", frames: frames{}.raw(frameTagged, 0, 0, 0, sharedKey),
			want: []string{"disconnected"}},
		{name: "truncated header after the key and address", frames: frames{}.tagged(sharedKey, sharedAddr, 1, 1, "a")[:14],
			want: []string{"disconnected"}},
		{name: "truncated payload", frames: frames{}.tagged(sharedKey, sharedAddr+10, 1, 10, "abc"),
			want: []string{"disconnected"}, ring: "abc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, tr string) {
				checkGoroutines(t)
				var ring []byte
				cs, written := hostileLink(t, tr, carrierConfig(), shareHostileRing(t, &ring), tc.frames, tc.pre...)
				checkHostile(t, cs, written, tc.want, tc.err, tc.abort, tc.count)
				var tags []uint32
				for _, c := range cs {
					if c.Kind == link.DataArrived {
						tags = append(tags, c.Tag)
					}
				}
				if !equalTags(tags, tc.tags) {
					t.Errorf("tags %v, want %v", tags, tc.tags)
				}
				want := bytes.Repeat([]byte{0x5a}, sharedSize)
				copy(want[10:], tc.ring)
				if !bytes.Equal(ring, want) {
					t.Errorf("the shared ring holds %q at 10, want %q and 0x5a elsewhere", ring[10:20], tc.ring)
				}
			})
		})
	}
}

func equalTags(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzCarrierFrames is FuzzFrames for a link in carrier mode, with a
// shared ring: whatever a peer writes, the link neither panics nor hangs,
// writes nothing outside the payloads it accepted, and ends with
// Disconnected, or Failed with a protocol or remote access error.
func FuzzCarrierFrames(f *testing.F) {
	for _, seed := range []frames{
		frames{}.tagged(sharedKey, sharedAddr, 7, 3, "abc").control(7).marker(sharedKey, sharedAddr+sharedSize).ack(1).ack(2),
		frames{}.tagged(hostileKey, ringAddr+4000, 1, 96, string(make([]byte, 96))).tagged(sharedKey, sharedAddr+900, 2, 100, string(make([]byte, 100))),
		frames{}.tagged(sharedKey+1, sharedAddr, 1, 1, "a"),
		frames{}.data(hostileKey, ringAddr, 1, "a"),
		frames{}.raw(frameTagged, 0, 0),
		frames{}.raw(frameDisconnect),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var ring []byte
		cs, _ := hostileLink(t, "pipe", carrierConfig(), shareHostileRing(t, &ring), b,
			control(1, 0), link.SendWR{Kind: link.SendData, Signaled: true, ID: 2, N: 10})
		last := cs[len(cs)-1]
		switch {
		case last.Kind == link.Disconnected:
		case last.Kind == link.Failed && (errors.Is(last.Err, wire.ErrProtocol) || errors.Is(last.Err, link.ErrRemoteAccess)):
		default:
			t.Fatalf("the link ended with %v: %v", last.Kind, last.Err)
		}
	})
}

// landingNow is how many payload bytes of tagged frames the link copied
// into its rings.
func (l *Link) landingNow() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.landing
}

// TestReleaseMidPayload: a ring released while a payload is landing in it
// takes nothing more of it (the memory may be another link's, gone once
// ReleaseRecvRing returned), and the link fails with a remote access
// error, which the peer learns. The peer writes the header and half the
// payload, waits until the link has taken that half, the test releases
// the ring, and the peer writes the rest. The race detector also reports
// a write into the ring after the release.
func TestReleaseMidPayload(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		checkGoroutines(t)
		ca, cb := connPair(t, tr)
		l, err := newLink(ca, carrierConfig(), hostileKey)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var ring []byte
		shareHostileRing(t, &ring)(l)
		written := make(chan []byte, 1)
		go func() {
			b, _ := io.ReadAll(cb)
			written <- b
		}()
		frame := frames{}.control(0).tagged(sharedKey, sharedAddr+100, 5, 600, string(bytes.Repeat([]byte{0xaa}, 300))+string(bytes.Repeat([]byte{0xbb}, 300)))
		half := len(frame) - 300
		peerErr := make(chan error, 1)
		go func() {
			_, err := cb.Write(frame[:half])
			peerErr <- err
		}()
		if err := <-peerErr; err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(hangGuard)
		for l.landingNow() < 300 {
			if time.Now().After(deadline) {
				t.Fatalf("the link took %d bytes of the payload, want 300", l.landingNow())
			}
			time.Sleep(time.Millisecond)
		}
		if err := l.ReleaseRecvRing(ring); err != nil {
			t.Fatal(err)
		}
		want := bytes.Repeat([]byte{0x5a}, sharedSize)
		copy(want[100:400], bytes.Repeat([]byte{0xaa}, 300))
		if !bytes.Equal(ring, want) {
			t.Fatal("the ring holds other bytes than the half payload the link took")
		}
		// The memory is its maker's again: the maker writes it while the
		// peer sends the rest.
		go func() {
			_, err := cb.Write(frame[half:])
			peerErr <- err
		}()
		for i := range ring {
			ring[i] = 0x33
		}
		cs := waitFor(t, l, 2)
		wantKinds(t, "the link", cs, "control-arrived", "failed")
		if err := cs[1].Err; !errors.Is(err, link.ErrRemoteAccess) {
			t.Fatalf("the link ended with %v (%v), want a remote access error", cs[1].Kind, err)
		}
		<-l.writerDone // the Abort is written
		l.Close()
		<-peerErr // the rest was written, or the socket closed under it
		if !bytes.Equal(ring, bytes.Repeat([]byte{0x33}, sharedSize)) {
			t.Error("the link wrote into the ring after ReleaseRecvRing")
		}
		typ, count, code := lastFrame(t, <-written)
		if typ != frameAbort || count != 1 || code != abortRemoteAccess {
			t.Errorf("the link's last frame: type %#x, count %d, code %d; want an Abort after 1 with code %d", typ, count, code, abortRemoteAccess)
		}
	})
}

// TestReleaseSendRingOutstanding: while the link is up, a transmit ring
// that an unacknowledged request sends from cannot be released (misuse);
// once the request completed, it can.
func TestReleaseSendRingOutstanding(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		sb := testSpec()
		sb.recvDepth = 1
		sa, sb := testSpec(), sb
		sa.carrier, sb.carrier = true, true
		a, b := newPair(t, tr, sa, sb)
		smem, key := shareSend(t, a, 100)
		_, addr, rkey := shareRecv(t, b, 100)
		fill(smem, 1)
		// b's one receive goes to a control message; the data waits.
		post(t, a, control(1, 0), link.SendWR{Kind: link.SendData, Signaled: true, ID: 2, Ring: key, N: 100, Remote: addr, RKey: rkey})
		wantKinds(t, "b", waitFor(t, b, 1), "control-arrived")
		wantKinds(t, "a", waitFor(t, a, 1), "send-done 1")
		if err := a.ReleaseSendRing(key); !errors.Is(err, link.ErrMisuse) {
			t.Fatalf("ReleaseSendRing with a request from it outstanding: %v, want link.ErrMisuse", err)
		}
		if err := b.PostRecv(1); err != nil {
			t.Fatal(err)
		}
		wantKinds(t, "b", waitFor(t, b, 1), "data-arrived 100")
		wantKinds(t, "a", waitFor(t, a, 1), "send-done 2")
		if err := a.ReleaseSendRing(key); err != nil {
			t.Fatalf("ReleaseSendRing once the request completed: %v", err)
		}
	})
}

// TestReleaseSendRingAfterCompletion: once a request from a transmit ring
// completed, the ring may be released at once, though the writer is still
// writing the rest of the batch the request was in (to a peer that waits
// for a receive): the link goes on.
func TestReleaseSendRingAfterCompletion(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		sa, sb := testSpec(), testSpec()
		sa.sendRing, sb.recvRing = 8<<20, 8<<20 // more than a socket holds
		sb.recvDepth = 1
		sa.carrier, sb.carrier = true, true
		a, b := newPair(t, tr, sa, sb)
		_, key := shareSend(t, a, 100)
		_, addr, rkey := shareRecv(t, b, 100)
		baddr, brkey := b.RecvRingKey()
		// One batch: the second request waits at b for a receive, and the
		// writer with it.
		post(t, a, link.SendWR{Kind: link.SendData, Signaled: true, ID: 1, Ring: key, N: 100, Remote: addr, RKey: rkey},
			link.SendWR{Kind: link.SendData, Signaled: true, ID: 2, N: 8 << 20, Remote: baddr, RKey: brkey})
		wantKinds(t, "a", waitFor(t, a, 1), "send-done 1")
		if err := a.ReleaseSendRing(key); err != nil {
			t.Fatalf("ReleaseSendRing after its request completed: %v", err)
		}
		wantKinds(t, "b", waitFor(t, b, 1), "data-arrived 100")
		if err := b.PostRecv(1); err != nil {
			t.Fatal(err)
		}
		wantKinds(t, "b", waitFor(t, b, 1), "data-arrived 8388608")
		wantKinds(t, "a", waitFor(t, a, 1), "send-done 2")
	})
}

// noDeadlines is a net.Conn whose deadlines cannot be set (after New
// cleared them).
type noDeadlines struct {
	net.Conn
	refuse bool
}

func (c *noDeadlines) SetWriteDeadline(t time.Time) error {
	if c.refuse {
		return errors.New("no deadlines here")
	}
	return c.Conn.SetWriteDeadline(t)
}

func (l *Link) writingNow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writing
}

// TestReleaseSendRingCutsWrite: on a link that is down, a transmit ring
// the writer is writing from, to a peer that reads slowly, is released at
// once: the write is cut short (by a deadline, or by closing the socket
// where deadlines fail), and ReleaseSendRing returns once nothing reads
// the ring any more (the race detector sees the test's writes to it
// after).
func TestReleaseSendRingCutsWrite(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		name := map[bool]string{false: "deadline", true: "close"}[refuse]
		t.Run(name, func(t *testing.T) {
			checkGoroutines(t)
			ca, cb := net.Pipe() // unbuffered: a write waits for the peer's reads, which copy from the ring
			defer cb.Close()
			var got atomic.Int64
			go func() {
				buf := make([]byte, 512)
				for {
					n, err := cb.Read(buf)
					got.Add(int64(n))
					if err != nil {
						return
					}
					time.Sleep(time.Millisecond)
				}
			}()
			nd := &noDeadlines{Conn: ca}
			l, err := New(nd, carrierConfig())
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			nd.refuse = refuse
			smem, key := shareSend(t, l, 64<<10)
			post(t, l, link.SendWR{Kind: link.SendData, Signaled: true, ID: 1, Ring: key, N: 64 << 10, Remote: RingAddr, RKey: 1})
			deadline := time.Now().Add(hangGuard)
			for !l.writingNow() || got.Load() < 2048 {
				if time.Now().After(deadline) {
					t.Fatalf("the peer read %d bytes", got.Load())
				}
				time.Sleep(time.Millisecond)
			}
			if err := l.ReleaseSendRing(key); !errors.Is(err, link.ErrMisuse) {
				t.Fatalf("ReleaseSendRing of a ring being written, the link up: %v, want link.ErrMisuse", err)
			}
			if err := l.Disconnect(); err != nil {
				t.Fatal(err)
			}
			released := make(chan error, 1)
			go func() { released <- l.ReleaseSendRing(key) }()
			select {
			case err := <-released:
				if err != nil {
					t.Fatalf("ReleaseSendRing on a link that is down: %v", err)
				}
			case <-time.After(hangGuard):
				t.Fatal("ReleaseSendRing waits for a write that never ends")
			}
			if l.writingNow() {
				t.Fatal("ReleaseSendRing returned while the writer still writes from the ring")
			}
			for i := range smem {
				smem[i] = 1
			}
			wantKinds(t, "the link", waitEnd(t, l), "disconnected")
		})
	}
}

// TestNoRings: a TCP link makes no rings, in either mode, and says so
// with ErrNoRings, which is no misuse (a stream's growth stops softly);
// not in carrier mode, registering rings and naming a transmit ring are
// misuse.
func TestNoRings(t *testing.T) {
	for _, carrier := range []bool{false, true} {
		sp := testSpec()
		sp.carrier = carrier
		a, b := newPair(t, "pipe", sp, sp)
		if _, _, _, err := a.NewRecvRing(4096); !errors.Is(err, ErrNoRings) || errors.Is(err, link.ErrMisuse) {
			t.Errorf("carrier %v: NewRecvRing: %v, want ErrNoRings and no misuse", carrier, err)
		}
		if _, _, err := a.NewSendRing(4096); !errors.Is(err, ErrNoRings) || errors.Is(err, link.ErrMisuse) {
			t.Errorf("carrier %v: NewSendRing: %v, want ErrNoRings and no misuse", carrier, err)
		}
		if carrier {
			continue
		}
		if _, _, err := a.ShareRecvRing(nil, make([]byte, 10)); !errors.Is(err, link.ErrMisuse) {
			t.Errorf("ShareRecvRing not in carrier mode: %v, want link.ErrMisuse", err)
		}
		if _, err := a.ShareSendRing(nil, make([]byte, 10)); !errors.Is(err, link.ErrMisuse) {
			t.Errorf("ShareSendRing not in carrier mode: %v, want link.ErrMisuse", err)
		}
		if err := a.ReleaseRecvRing(a.RecvRing()); !errors.Is(err, link.ErrMisuse) {
			t.Errorf("ReleaseRecvRing not in carrier mode: %v, want link.ErrMisuse", err)
		}
		wr := data(b, 0, 1, 0, true, 1)
		wr.Ring = 1
		if err := a.PostSend([]link.SendWR{wr}); !errors.Is(err, link.ErrMisuse) {
			t.Errorf("data from transmit ring 1 not in carrier mode: %v, want link.ErrMisuse", err)
		}
	}
}
