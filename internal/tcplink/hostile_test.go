package tcplink

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// hostileKey is the ring key of the links that face a hostile peer, which
// knows it.
const hostileKey = 42

// hostile runs a link against a raw peer that writes frames, then ends its
// side of the socket. The link's end posts the requests pre first; it
// reposts receives as messages consume them. It returns the link's
// completions, up to its end, and what the link wrote.
func hostile(t testing.TB, tr string, frames []byte, pre ...link.SendWR) ([]link.Completion, []byte) {
	t.Helper()
	return hostileLink(t, tr, testSpec().config(), nil, frames, pre...)
}

// hostileLink is hostile with a link made with cfg, on which setup (if
// set) runs before the requests are posted.
func hostileLink(t testing.TB, tr string, cfg Config, setup func(*Link), frames []byte, pre ...link.SendWR) ([]link.Completion, []byte) {
	t.Helper()
	var ca, cb net.Conn
	if tr == "pipe" {
		ca, cb = halfPipes(t)
	} else {
		ca, cb = connPair(t, tr)
	}
	a, err := newLink(ca, cfg, hostileKey)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if setup != nil {
		setup(a)
	}
	if len(pre) > 0 {
		// The peer reads the requests before it writes, so that its Acks
		// may count them.
		post(t, a, pre...)
		header := dataHeader
		if cfg.Carrier {
			header = taggedHeader
		}
		size := 0
		for _, wr := range pre {
			size += map[link.SendKind]int{link.SendData: header + int(wr.N), link.SendControl: 33, link.SendMarker: 13}[wr.Kind]
		}
		if _, err := io.ReadFull(cb, make([]byte, size)); err != nil {
			t.Fatal(err)
		}
	}
	written := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(cb)
		written <- b
	}()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		cb.Write(frames)
		cb.(interface{ CloseWrite() error }).CloseWrite()
	}()
	cs := waitEnd(t, a)
	<-a.writerDone // the link wrote what it owed (an Abort)
	a.Close()
	<-wrote
	return cs, <-written
}

// halfPipes are two connected ends of a synchronous pipe, as net.Pipe, but
// with CloseWrite: each direction is a net.Pipe of its own.
func halfPipes(t testing.TB) (net.Conn, net.Conn) {
	ar, bw := net.Pipe()
	br, aw := net.Pipe()
	a, b := &halfPipe{ar, aw}, &halfPipe{br, bw}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

type halfPipe struct{ r, w net.Conn }

func (p *halfPipe) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p *halfPipe) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p *halfPipe) CloseWrite() error           { return p.w.Close() }
func (p *halfPipe) Close() error                { return errors.Join(p.r.Close(), p.w.Close()) }
func (p *halfPipe) LocalAddr() net.Addr         { return p.r.LocalAddr() }
func (p *halfPipe) RemoteAddr() net.Addr        { return p.r.RemoteAddr() }
func (p *halfPipe) SetDeadline(t time.Time) error {
	return errors.Join(p.r.SetDeadline(t), p.w.SetDeadline(t))
}
func (p *halfPipe) SetReadDeadline(t time.Time) error  { return p.r.SetReadDeadline(t) }
func (p *halfPipe) SetWriteDeadline(t time.Time) error { return p.w.SetWriteDeadline(t) }

// frames builds frames for hostile peers.
type frames []byte

func (f frames) data(rkey uint32, addr uint64, n uint32, payload string) frames {
	f = append(f, frameData)
	f = be.AppendUint32(f, rkey)
	f = be.AppendUint64(f, addr)
	f = be.AppendUint32(f, n)
	return append(f, payload...)
}

func (f frames) tagged(rkey uint32, addr uint64, tag, n uint32, payload string) frames {
	f = append(f, frameTagged)
	f = be.AppendUint32(f, rkey)
	f = be.AppendUint64(f, addr)
	f = be.AppendUint32(f, tag)
	f = be.AppendUint32(f, n)
	return append(f, payload...)
}

func (f frames) control(b byte) frames {
	f = append(f, frameControl)
	for i := range wire.MessageSize {
		f = append(f, b+byte(i))
	}
	return f
}

func (f frames) marker(rkey uint32, addr uint64) frames {
	f = append(f, frameMarker)
	f = be.AppendUint32(f, rkey)
	return be.AppendUint64(f, addr)
}

func (f frames) ack(n uint64) frames { return be.AppendUint64(append(f, frameAck), n) }

func (f frames) abort(n uint64, code byte) frames {
	return append(be.AppendUint64(append(f, frameAbort), n), code)
}

func (f frames) raw(b ...byte) frames { return append(f, b...) }

// lastFrame returns the type of the last frame the link wrote after the
// requests the peer read first, and an Abort's count and code.
func lastFrame(t testing.TB, b []byte) (typ byte, count uint64, code byte) {
	t.Helper()
	for len(b) > 0 {
		typ = b[0]
		size := map[byte]int{frameAck: 9, frameAbort: 10, frameControl: 33, frameDisconnect: 1}[typ]
		if size == 0 || len(b) < size {
			t.Fatalf("the link wrote %x", b)
		}
		if typ == frameAbort {
			count, code = be.Uint64(b[1:]), b[9]
		}
		b = b[size:]
	}
	return typ, count, code
}

const ringAddr = uint64(RingAddr)

func TestHostilePeer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		frames frames
		pre    []link.SendWR
		want   []string
		err    error // the last completion's, if it is Failed
		abort  byte  // the Abort's code, if the link sends one
		count  uint64
	}{
		{name: "unknown type", frames: frames{}.raw(0xff),
			want: []string{"failed"}, err: wire.ErrProtocol, abort: abortProtocol},
		{name: "type zero", frames: frames{}.control(1).raw(0),
			want: []string{"control-arrived", "failed"}, err: wire.ErrProtocol, abort: abortProtocol, count: 1},
		{name: "ack of requests never sent", frames: frames{}.ack(5),
			want: []string{"failed"}, err: wire.ErrProtocol, abort: abortProtocol},
		{name: "ack beyond those sent", frames: frames{}.ack(3), pre: []link.SendWR{control(1, 0), control(2, 0)},
			want: []string{"failed"}, err: wire.ErrProtocol, abort: abortProtocol},
		{name: "ack", frames: frames{}.ack(0).ack(1).ack(1), pre: []link.SendWR{control(1, 0)},
			want: []string{"send-done 1", "disconnected"}},
		{name: "abort with an unknown code", frames: frames{}.abort(0, 9),
			want: []string{"failed"}, err: wire.ErrProtocol, abort: abortProtocol},
		{name: "remote access abort with no request", frames: frames{}.abort(0, abortRemoteAccess),
			want: []string{"failed"}, err: wire.ErrProtocol, abort: abortProtocol},
		{name: "remote access abort", frames: frames{}.abort(1, abortRemoteAccess), pre: []link.SendWR{control(1, 0), control(2, 0)},
			want: []string{"send-done 1", "failed"}, err: link.ErrRemoteAccess},
		{name: "protocol abort", frames: frames{}.abort(0, abortProtocol),
			want: []string{"failed"}, err: wire.ErrProtocol},
		{name: "huge data frame", frames: frames{}.data(hostileKey, ringAddr, 1<<32-1, "abc"),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "data frame with the wrong key", frames: frames{}.data(hostileKey+1, ringAddr, 1, "a"),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "data below the ring", frames: frames{}.data(hostileKey, ringAddr-1, 1, "a"),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "address overflow", frames: frames{}.data(hostileKey, 1<<64-1, 2, "ab"),
			want: []string{"failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess},
		{name: "marker past the ring", frames: frames{}.control(0).marker(hostileKey, ringAddr+4097),
			want: []string{"control-arrived", "failed"}, err: link.ErrRemoteAccess, abort: abortRemoteAccess, count: 1},
		{name: "data then garbage", frames: frames{}.data(hostileKey, ringAddr+5, 3, "abc").marker(hostileKey, ringAddr+4096).raw(0x99),
			want: []string{"data-arrived 3", "failed"}, err: wire.ErrProtocol, abort: abortProtocol, count: 2},
		{name: "tagged data on a link not in carrier mode", frames: frames{}.tagged(hostileKey, ringAddr, 1, 1, "a"),
			want: []string{"failed"}, err: wire.ErrProtocol, abort: abortProtocol},
		{name: "truncated header", frames: frames{}.raw(frameData, 0, 0),
			want: []string{"disconnected"}},
		{name: "truncated payload", frames: frames{}.data(hostileKey, ringAddr, 10, "abc"),
			want: []string{"disconnected"}},
		{name: "truncated ack", frames: frames{}.raw(frameAck, 0, 0, 0),
			want: []string{"disconnected"}},
		{name: "disconnect then garbage", frames: frames{}.control(0).raw(frameDisconnect, 0xff),
			want: []string{"control-arrived", "disconnected"}},
		{name: "more messages than receives", frames: frames{}.control(0).control(1).control(2).control(3).control(4).control(5).
			data(hostileKey, ringAddr, 1, "x").data(hostileKey, ringAddr, 1, "y").data(hostileKey, ringAddr, 1, "z"),
			want: []string{"control-arrived", "control-arrived", "control-arrived", "control-arrived", "control-arrived",
				"control-arrived", "data-arrived 1", "data-arrived 1", "data-arrived 1", "disconnected"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, tr string) {
				checkGoroutines(t)
				cs, written := hostile(t, tr, tc.frames, tc.pre...)
				checkHostile(t, cs, written, tc.want, tc.err, tc.abort, tc.count)
			})
		})
	}
}

// checkHostile checks the completions and the frames of a link that faced
// a hostile peer: its completions are want; the last one's error matches
// err (a *wire.ProtocolError if err is wire.ErrProtocol), never
// link.ErrDown; and the last frame it wrote is an Abort after count
// requests with code abort, or (abort 0) no Abort.
func checkHostile(t *testing.T, cs []link.Completion, written []byte, want []string, err error, abort byte, count uint64) {
	t.Helper()
	wantKinds(t, "the link", cs, want...)
	last := cs[len(cs)-1]
	if err != nil && !errors.Is(last.Err, err) {
		t.Errorf("error %v, want %v", last.Err, err)
	}
	if err == wire.ErrProtocol {
		var pe *wire.ProtocolError
		if !errors.As(last.Err, &pe) {
			t.Errorf("error %v is not a *wire.ProtocolError", last.Err)
		}
	}
	if errors.Is(last.Err, link.ErrDown) {
		t.Errorf("error %v matches link.ErrDown", last.Err)
	}
	typ, n, code := lastFrame(t, written)
	if abort != 0 && (typ != frameAbort || code != abort || n != count) {
		t.Errorf("the link's last frame: type %#x, count %d, code %d; want an Abort after %d with code %d",
			typ, n, code, count, abort)
	}
	if abort == 0 && typ == frameAbort {
		t.Errorf("the link sent an Abort with code %d", code)
	}
}

// FuzzFrames: whatever a peer writes, the link neither panics nor hangs
// nor allocates by what it was told, and it ends with Disconnected (the
// peer's socket ended), or Failed with a protocol or remote access error.
func FuzzFrames(f *testing.F) {
	for _, seed := range []frames{
		frames{}.data(hostileKey, ringAddr, 3, "abc").control(7).marker(hostileKey, ringAddr+4096).ack(1).ack(2),
		frames{}.raw(frameDisconnect),
		frames{}.abort(1, abortRemoteAccess),
		frames{}.abort(0, abortProtocol),
		frames{}.data(hostileKey, ringAddr+4000, 96, string(make([]byte, 96))).ack(3),
		frames{}.control(0).control(1).control(2).control(3).control(4).control(5),
		frames{}.raw(0xff, 0, 0, 0, 0),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cs, _ := hostile(t, "pipe", b, control(1, 0), link.SendWR{Kind: link.SendData, Signaled: true, ID: 2, N: 10})
		last := cs[len(cs)-1]
		switch {
		case last.Kind == link.Disconnected:
		case last.Kind == link.Failed && (errors.Is(last.Err, wire.ErrProtocol) || errors.Is(last.Err, link.ErrRemoteAccess)):
		default:
			t.Fatalf("the link ended with %v: %v", last.Kind, last.Err)
		}
	})
}
