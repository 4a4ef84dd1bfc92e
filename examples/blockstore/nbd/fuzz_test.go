package nbd

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// scriptConn is a net.Conn whose reads come from a script of bytes (then
// io.EOF, the client hanging up) and whose writes are collected.
type scriptConn struct {
	r  io.Reader
	mu sync.Mutex
	w  bytes.Buffer
}

func (c *scriptConn) Read(p []byte) (int, error) { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.w.Write(p)
}
func (c *scriptConn) Close() error                     { return nil }
func (c *scriptConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// guardedMemory fails the test on any call outside its size, which the
// server must never make.
type guardedMemory struct {
	*Memory
	t *testing.T
}

func (g guardedMemory) guard(what string, off, n int64) {
	if off < 0 || n < 0 || off+n > g.Size() {
		g.t.Errorf("%s [%d, +%d) outside the export of %d bytes", what, off, n, g.Size())
	}
}
func (g guardedMemory) ReadAt(p []byte, off int64) (int, error) {
	g.guard("ReadAt", off, int64(len(p)))
	return g.Memory.ReadAt(p, off)
}
func (g guardedMemory) WriteAt(p []byte, off int64) (int, error) {
	g.guard("WriteAt", off, int64(len(p)))
	return g.Memory.WriteAt(p, off)
}
func (g guardedMemory) Trim(off, n int64) error {
	g.guard("Trim", off, n)
	return g.Memory.Trim(off, n)
}
func (g guardedMemory) Zero(off, n int64, d bool) error {
	g.guard("Zero", off, n)
	return g.Memory.Zero(off, n, d)
}

// fuzzSeedRequests are well-formed and hostile request streams.
func fuzzSeedRequests() [][]byte {
	req := func(cmd Command, flags CommandFlags, handle, off uint64, length uint32, data ...byte) []byte {
		b := make([]byte, requestHeaderSize)
		encodeRequest(b, request{cmd: cmd, flags: flags, handle: handle, offset: off, length: length})
		return append(b, data...)
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	return [][]byte{
		nil,
		req(CmdRead, 0, 1, 0, 512),
		cat(req(CmdWrite, FlagFUA, 1, 100, 4, 1, 2, 3, 4), req(CmdRead, 0, 2, 98, 8), req(CmdFlush, 0, 3, 0, 0), req(CmdDisc, 0, 4, 0, 0)),
		cat(req(CmdTrim, 0, 1, 0, 4096), req(CmdWriteZeroes, FlagNoHole, 2, 1000, 5000)),
		req(CmdRead, 0, 1, 1<<16-10, 20),
		req(CmdWrite, 0, 1, 1<<64-2, 4, 9, 9, 9, 9),
		req(CmdRead, 0, 1, 0, 1<<31),
		req(CmdWrite, 0, 1, 0, 100, 1, 2, 3), // data cut short
		req(99, 0xffff, 1, 0, 0),
		req(CmdRead, FlagDF, 1, 0, 1)[:13],
		bytes.Repeat([]byte{0x25}, 64),
	}
}

// FuzzTransmission feeds a byte stream to a connection in the transmission
// phase: whatever it is, the server must not panic, must not touch the
// backend outside the export, must end when the stream does, and must send
// only well-formed simple replies, one for each request it answers.
//
//	go test -fuzz FuzzTransmission ./blockstore/nbd   (in examples/)
func FuzzTransmission(f *testing.F) {
	for _, s := range fuzzSeedRequests() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, script []byte) {
		const size = 1 << 16
		s := NewServer(guardedMemory{NewMemory(size), t}, Options{Workers: 2, Queue: 4, MaxPayload: 1 << 12})
		nc := &scriptConn{r: bytes.NewReader(script)}
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.transmit(nc, bufio.NewReader(nc), bufio.NewWriter(nc))
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection did not end with its input")
		}
		// Every reply is a simple reply, whole, and a read's data follows a
		// successful one: walk them knowing only the requests' lengths.
		lengths, unique := requestLengths(script)
		if !unique {
			return // replies in any order with shared handles: no one reading
		}
		out := nc.w.Bytes()
		for len(out) > 0 {
			if len(out) < replyHeaderSize {
				t.Fatalf("a reply cut short: % x", out)
			}
			rep, err := decodeSimpleReply(out)
			if err != nil {
				t.Fatal(err)
			}
			out = out[replyHeaderSize:]
			n, ok := lengths[rep.handle]
			if !ok {
				t.Fatalf("a reply for handle %d, which no request has", rep.handle)
			}
			if rep.errno == 0 {
				if len(out) < n {
					t.Fatalf("a read's data cut short")
				}
				out = out[n:]
			}
		}
	})
}

// requestLengths parses a script as the server does, and returns the data
// length of a successful reply for each handle (a read's length; 0 for
// other commands), and whether the handles are all different (if not, the
// replies cannot be told apart).
func requestLengths(script []byte) (lengths map[uint64]int, unique bool) {
	lengths = make(map[uint64]int)
	unique = true
	for len(script) >= requestHeaderSize {
		req, err := decodeRequest(script)
		if err != nil {
			break
		}
		script = script[requestHeaderSize:]
		n := 0
		if req.cmd == CmdRead {
			n = int(req.length)
		}
		if _, dup := lengths[req.handle]; dup {
			unique = false
		}
		lengths[req.handle] = n
		if req.cmd == CmdWrite {
			if uint64(len(script)) < uint64(req.length) {
				break
			}
			script = script[req.length:]
		}
		if req.cmd == CmdDisc {
			break
		}
	}
	return lengths, unique
}

// FuzzHandshake feeds a byte stream to the handshake (after the client's
// flags): the server must not panic, must end when the stream does, and
// every option reply must be whole.
func FuzzHandshake(f *testing.F) {
	opt := func(option uint32, data []byte) []byte {
		b := make([]byte, optionHeaderSize)
		encodeOptionHeader(b, optionHeader{option: option, length: uint32(len(data))})
		return append(b, data...)
	}
	flags := binary.BigEndian.AppendUint32(nil, flagFixedNewstyle|flagNoZeroes)
	f.Add(flags)
	f.Add(append(bytes.Clone(flags), opt(optGo, encodeGoRequest(goRequest{infos: []uint16{1, 2, 3}}))...))
	f.Add(append(bytes.Clone(flags), opt(optList, nil)...))
	f.Add(append(bytes.Clone(flags), opt(optInfo, []byte{0, 0, 0, 200, 'x'})...))
	f.Add(append(bytes.Clone(flags), opt(optExportName, nil)...))
	f.Add(append(bytes.Clone(flags), opt(optAbort, nil)...))
	f.Add(append(bytes.Clone(flags), opt(77, []byte("junk"))...))
	f.Add([]byte{0, 0, 0, 4})
	f.Fuzz(func(t *testing.T, script []byte) {
		s := NewServer(guardedMemory{NewMemory(1 << 16), t}, Options{})
		nc := &scriptConn{r: bytes.NewReader(script)}
		h := newHandshake(s, nc)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if transmit, err := h.run(); transmit && err == nil {
				s.transmit(nc, h.r, h.w)
			}
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the handshake did not end with its input")
		}
		out := nc.w.Bytes()
		if len(out) < 18 {
			t.Fatalf("greeting % x", out)
		}
		out = out[18:]
		// Option replies, until the transmission phase's first bytes.
		for len(out) >= optionReplyHeaderSize && binary.BigEndian.Uint64(out) == magicOptionReply {
			h, _ := decodeOptionReplyHeader(out)
			if uint64(len(out)) < optionReplyHeaderSize+uint64(h.length) {
				t.Fatalf("an option reply cut short")
			}
			out = out[optionReplyHeaderSize+h.length:]
		}
	})
}
