package nbd

import (
	"bytes"
	"math"
	"os"
	"testing"
	"time"
)

// TestBadRequests: each hostile or mistaken request gets the error the
// protocol asks for, or (where the framing is lost) a closed connection;
// the connection goes on serving after an error reply; other connections
// are served throughout; and nothing is written, inside the export or
// beyond it. The export is the first 256 KiB of a larger file, whose tail
// (and size) must stay as they were.
func TestBadRequests(t *testing.T) {
	const (
		size       = 256 << 10
		tail       = 64 << 10
		maxPayload = 64 << 10
	)
	type step struct {
		req  request
		data []byte // sent after the header, as it is
		raw  []byte // sent instead of a request
	}
	cases := []struct {
		name   string
		steps  []step
		want   Errno // the reply's; 0: the server must hang up instead
		closed bool  // the client hangs up after sending (not waiting for a reply)
	}{
		{name: "read past the end",
			steps: []step{{req: request{cmd: CmdRead, offset: size - 512, length: 1024}}}, want: EINVAL},
		{name: "read beyond the end",
			steps: []step{{req: request{cmd: CmdRead, offset: size + 4096, length: 512}}}, want: EINVAL},
		{name: "read whose end overflows",
			steps: []step{{req: request{cmd: CmdRead, offset: math.MaxUint64 - 511, length: 1024}}}, want: EINVAL},
		{name: "read larger than the maximum payload",
			steps: []step{{req: request{cmd: CmdRead, length: maxPayload + 1}}}, want: EINVAL},
		{name: "write past the end",
			steps: []step{{req: request{cmd: CmdWrite, offset: size - 512, length: 1024}, data: bytes.Repeat([]byte{0xee}, 1024)}}, want: ENOSPC},
		{name: "write whose end overflows",
			steps: []step{{req: request{cmd: CmdWrite, offset: math.MaxUint64 - 511, length: 1024}, data: bytes.Repeat([]byte{0xee}, 1024)}}, want: ENOSPC},
		{name: "write larger than the maximum payload",
			steps: []step{{req: request{cmd: CmdWrite, length: maxPayload + 1}, data: bytes.Repeat([]byte{0xee}, maxPayload+1)}}, want: EINVAL},
		{name: "write with an unknown flag",
			steps: []step{{req: request{cmd: CmdWrite, flags: 1 << 9, length: 512}, data: bytes.Repeat([]byte{0xee}, 512)}}, want: EINVAL},
		{name: "write with NO_HOLE, which is write-zeroes' flag",
			steps: []step{{req: request{cmd: CmdWrite, flags: FlagNoHole, length: 512}, data: bytes.Repeat([]byte{0xee}, 512)}}, want: EINVAL},
		{name: "read with DF, not offered",
			steps: []step{{req: request{cmd: CmdRead, flags: FlagDF, length: 512}}}, want: EINVAL},
		{name: "trim past the end",
			steps: []step{{req: request{cmd: CmdTrim, offset: size - 4096, length: 8192}}}, want: EINVAL},
		{name: "write-zeroes past the end",
			steps: []step{{req: request{cmd: CmdWriteZeroes, offset: size - 4096, length: 8192}}}, want: ENOSPC},
		{name: "write-zeroes whose end overflows",
			steps: []step{{req: request{cmd: CmdWriteZeroes, offset: math.MaxUint64, length: math.MaxUint32}}}, want: ENOSPC},
		{name: "unknown command",
			steps: []step{{req: request{cmd: 99, length: 512}}}, want: EINVAL},
		{name: "CACHE, not offered",
			steps: []step{{req: request{cmd: CmdCache, length: 512}}}, want: EINVAL},
		{name: "BLOCK_STATUS, not negotiated",
			steps: []step{{req: request{cmd: CmdBlockStatus, length: 512}}}, want: EINVAL},
		{name: "bad magic", // no framing left: hang up
			steps: []step{{raw: bytes.Repeat([]byte{0x42}, requestHeaderSize)}}},
		{name: "hang-up in the middle of a write's data",
			steps: []step{{req: request{cmd: CmdWrite, length: 8192}, data: bytes.Repeat([]byte{0xee}, 1000)}}, closed: true},
		{name: "hang-up in the middle of a request header",
			steps: []step{{raw: []byte{0x25, 0x60, 0x95, 0x13, 0, 0, 0, 1, 0, 0}}}, closed: true},
	}

	original := randomBytes(size + tail)
	path := tempFile(t, original)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	backend, err := NewFile(f, size)
	if err != nil {
		t.Fatal(err)
	}
	addr, srv := startServer(t, backend, Options{MaxPayload: maxPayload})
	bystander := dialClient(t, addr) // another client, served throughout

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := dialRaw(t, addr)
			for i, s := range tc.steps {
				s.req.handle = uint64(100 + i)
				if s.raw != nil {
					rc.w.Write(s.raw)
					rc.w.Flush()
					continue
				}
				rc.send(s.req, s.data)
			}
			switch {
			case tc.closed:
				rc.nc.Close()
				// Whatever the server does with what it got, it has done
				// once it let the connection go.
				waitConns(t, srv, 1)
			case tc.want == 0:
				rc.expectClosed()
			default:
				rep, _, err := rc.reply(0)
				if err != nil {
					t.Fatalf("no reply: %v", err)
				}
				if rep.errno != tc.want || rep.handle != 100 {
					t.Fatalf("reply %v for handle %d, want %v for 100", rep.errno, rep.handle, tc.want)
				}
				// The connection goes on.
				errno, got := rc.roundTrip(request{cmd: CmdRead, handle: 200, offset: 0, length: 4096}, nil, 4096)
				if errno != 0 || !bytes.Equal(got, original[:4096]) {
					t.Fatalf("a read after the error: %v (data right: %v)", errno, bytes.Equal(got, original[:4096]))
				}
			}
			got := make([]byte, 4096)
			if err := bystander.Read(got, size-4096); err != nil || !bytes.Equal(got, original[size-4096:size]) {
				t.Fatalf("the other client's read: %v (data right: %v)", err, bytes.Equal(got, original[size-4096:size]))
			}
			onDisk, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(onDisk) != len(original) {
				t.Fatalf("the file is %d bytes, was %d", len(onDisk), len(original))
			}
			if !bytes.Equal(onDisk[size:], original[size:]) {
				t.Fatal("the file beyond the export changed")
			}
			if !bytes.Equal(onDisk[:size], original[:size]) {
				t.Fatal("the export changed")
			}
		})
	}
}

// waitConns waits until s has n connections.
func waitConns(t *testing.T, s *Server, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := s.tracker.NumConns()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server has %d connections, want %d", got, n)
		}
	}
}
