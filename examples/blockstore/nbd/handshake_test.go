package nbd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// optionConn is a connection in option haggling, driven by hand.
type optionConn struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

// dialOptions connects, checks the greeting and sends clientFlags.
func dialOptions(t *testing.T, addr string, clientFlags uint32) *optionConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	oc := &optionConn{t: t, nc: nc, r: bufio.NewReader(nc)}
	var g [18]byte
	if _, err := io.ReadFull(oc.r, g[:]); err != nil {
		t.Fatal(err)
	}
	be := binary.BigEndian
	if be.Uint64(g[0:]) != magicNBD || be.Uint64(g[8:]) != magicOption || be.Uint16(g[16:]) != flagFixedNewstyle|flagNoZeroes {
		t.Fatalf("greeting % x", g)
	}
	oc.write(be.AppendUint32(nil, clientFlags))
	return oc
}

func (oc *optionConn) write(b []byte) {
	oc.t.Helper()
	if _, err := oc.nc.Write(b); err != nil {
		oc.t.Fatal(err)
	}
}

func (oc *optionConn) option(option uint32, data []byte) {
	oc.t.Helper()
	var b [optionHeaderSize]byte
	encodeOptionHeader(b[:], optionHeader{option: option, length: uint32(len(data))})
	oc.write(append(b[:], data...))
}

type optionReply struct {
	replyType uint32
	data      []byte
}

// replies reads option replies to option up to and including the first
// that is not NBD_REP_INFO or NBD_REP_SERVER.
func (oc *optionConn) replies(option uint32) []optionReply {
	oc.t.Helper()
	var out []optionReply
	for {
		h, data, err := readOptionReply(oc.r, option)
		if err != nil {
			oc.t.Fatalf("option %d: %v", option, err)
		}
		out = append(out, optionReply{h.replyType, data})
		if h.replyType != repInfo && h.replyType != repServer {
			return out
		}
	}
}

func (oc *optionConn) expectClosed() {
	oc.t.Helper()
	oc.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, oc.r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		oc.t.Fatal("the server did not close the connection")
	}
}

// TestHandshakeOptions: every option gets its reply, errors included, and
// haggling goes on after each until NBD_OPT_GO.
func TestHandshakeOptions(t *testing.T) {
	addr, _ := startServer(t, NewMemory(1<<20), Options{ExportName: "disk", Description: "a test disk"})
	oc := dialOptions(t, addr, flagFixedNewstyle)
	be := binary.BigEndian
	check := func(option uint32, data []byte, want ...uint32) []optionReply {
		t.Helper()
		oc.option(option, data)
		got := oc.replies(option)
		var types []uint32
		for _, r := range got {
			types = append(types, r.replyType)
		}
		if !equalUint32s(types, want) {
			t.Fatalf("option %d: replies %#x, want %#x", option, types, want)
		}
		return got
	}

	list := check(optList, nil, repServer, repAck)
	if want := append(be.AppendUint32(nil, 4), "disk"...); !bytes.Equal(list[0].data, want) {
		t.Errorf("NBD_REP_SERVER data %q, want %q", list[0].data, want)
	}
	check(optList, []byte{1}, repErrInvalid)
	check(optStructuredReply, nil, repErrUnsup)
	check(optStartTLS, nil, repErrUnsup)
	check(12345, []byte("whatever"), repErrUnsup)
	check(optInfo, encodeGoRequest(goRequest{name: "other"}), repErrUnknown)
	check(optGo, encodeGoRequest(goRequest{name: "other"}), repErrUnknown)
	check(optGo, []byte{0, 0, 0, 9, 'd'}, repErrInvalid)                             // name longer than the data
	check(optGo, append(encodeGoRequest(goRequest{name: "disk"}), 0), repErrInvalid) // a byte too many
	check(optInfo, bytes.Repeat([]byte{1}, maxOptionData+1), repErrTooBig)

	info := check(optInfo, encodeGoRequest(goRequest{name: "disk", infos: []uint16{infoName, infoDescription}}),
		repInfo, repInfo, repInfo, repInfo, repAck)
	var e ExportInfo
	for _, r := range info[:len(info)-1] {
		if _, ok := decodeInfo(r.data, &e); !ok {
			t.Fatalf("malformed info % x", r.data)
		}
	}
	if e.Size != 1<<20 || e.Flags != FlagHasFlags|FlagSendFlush|FlagSendFUA|FlagSendTrim|FlagSendWriteZeroes|FlagCanMultiConn ||
		e.MinBlock != 1 || e.PreferredBlock != 4096 || e.MaxPayload != 32<<20 {
		t.Errorf("export info %+v", e)
	}
	if string(info[2].data[2:]) != "disk" || string(info[3].data[2:]) != "a test disk" {
		t.Errorf("name and description %q, %q", info[2].data, info[3].data)
	}

	// NBD_OPT_GO then enters transmission: a request gets its reply.
	check(optGo, encodeGoRequest(goRequest{name: "disk"}), repInfo, repInfo, repAck)
	var req [requestHeaderSize]byte
	encodeRequest(req[:], request{cmd: CmdFlush, handle: 1})
	oc.write(req[:])
	var rep [replyHeaderSize]byte
	if _, err := io.ReadFull(oc.r, rep[:]); err != nil {
		t.Fatal(err)
	}
	if r, err := decodeSimpleReply(rep[:]); err != nil || r.errno != 0 || r.handle != 1 {
		t.Fatalf("flush reply %+v, %v", r, err)
	}
}

func equalUint32s(a, b []uint32) bool {
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

// TestHandshakeExportName: the old way in, with and without the 124 zeroes.
func TestHandshakeExportName(t *testing.T) {
	addr, _ := startServer(t, NewMemory(1<<20), Options{})
	for _, noZeroes := range []bool{false, true} {
		flags := uint32(flagFixedNewstyle)
		want := 10 + zeroPadding
		if noZeroes {
			flags |= flagNoZeroes
			want = 10
		}
		oc := dialOptions(t, addr, flags)
		oc.option(optExportName, nil)
		b := make([]byte, want)
		if _, err := io.ReadFull(oc.r, b); err != nil {
			t.Fatal(err)
		}
		if size := binary.BigEndian.Uint64(b); size != 1<<20 {
			t.Errorf("size %d", size)
		}
		if !bytes.Equal(b[10:], make([]byte, want-10)) {
			t.Errorf("padding % x", b[10:])
		}
		// Next comes the transmission phase: a flush's reply, not padding.
		var req [requestHeaderSize]byte
		encodeRequest(req[:], request{cmd: CmdFlush, handle: 5})
		oc.write(req[:])
		var rep [replyHeaderSize]byte
		if _, err := io.ReadFull(oc.r, rep[:]); err != nil {
			t.Fatal(err)
		}
		if r, err := decodeSimpleReply(rep[:]); err != nil || r.handle != 5 {
			t.Fatalf("flush reply %+v, %v (noZeroes %v)", r, err, noZeroes)
		}
	}
}

// TestHandshakeHangsUp: what the protocol answers by closing.
func TestHandshakeHangsUp(t *testing.T) {
	addr, _ := startServer(t, NewMemory(1<<20), Options{})
	t.Run("unknown client flags", func(t *testing.T) {
		dialOptions(t, addr, 1<<5).expectClosed()
	})
	t.Run("bad option magic", func(t *testing.T) {
		oc := dialOptions(t, addr, flagFixedNewstyle)
		oc.write(make([]byte, optionHeaderSize))
		oc.expectClosed()
	})
	t.Run("NBD_OPT_EXPORT_NAME of an unknown export", func(t *testing.T) {
		oc := dialOptions(t, addr, flagFixedNewstyle)
		oc.option(optExportName, []byte("nope"))
		oc.expectClosed()
	})
	t.Run("NBD_OPT_ABORT", func(t *testing.T) {
		oc := dialOptions(t, addr, flagFixedNewstyle)
		oc.option(optAbort, nil)
		if r := oc.replies(optAbort); len(r) != 1 || r[0].replyType != repAck {
			t.Fatalf("replies %+v", r)
		}
		oc.expectClosed()
	})
	t.Run("handshake timeout", func(t *testing.T) {
		addr, _ := startServer(t, NewMemory(1<<20), Options{HandshakeTimeout: 100 * time.Millisecond})
		dialOptions(t, addr, flagFixedNewstyle).expectClosed()
	})
}

// TestClientUnknownExport: the client reports the server's refusal.
func TestClientUnknownExport(t *testing.T) {
	addr, _ := startServer(t, NewMemory(1<<20), Options{ExportName: "disk"})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, err = NewClient(context.Background(), nc, ClientOptions{ExportName: "other"})
	var oe *OptionError
	if !errors.As(err, &oe) || oe.Reply != repErrUnknown {
		t.Fatalf("NewClient: %v, want an OptionError of NBD_REP_ERR_UNKNOWN", err)
	}
}
