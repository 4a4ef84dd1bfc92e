package nbd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// startServer serves b on a loopback TCP port until the test ends and
// returns the port's address.
func startServer(t *testing.T, b Backend, opts Options) (string, *Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(b, opts)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve after Close: %v", err)
		}
	})
	return ln.Addr().String(), s
}

// dialClient connects a Client to addr, closed when the test ends.
func dialClient(t *testing.T, addr string) *Client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := NewClient(ctx, nc, ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// randomBytes returns n random bytes.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// tempFile makes a file of the given contents in the test's directory.
func tempFile(t *testing.T, contents []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "export")
	if err := os.WriteFile(path, contents, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// rawConn is a connection in the transmission phase driven by hand, to send
// what no well-behaved client would.
type rawConn struct {
	t    *testing.T
	nc   net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	info ExportInfo
}

// dialRaw connects to addr and negotiates the default export.
func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	rc := &rawConn{t: t, nc: nc, r: bufio.NewReader(nc), w: bufio.NewWriter(nc)}
	rc.info, err = clientHandshake(rc.r, rc.w, "")
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// send sends a request header and data, as they are.
func (rc *rawConn) send(req request, data []byte) {
	rc.t.Helper()
	var b [requestHeaderSize]byte
	encodeRequest(b[:], req)
	rc.w.Write(b[:])
	rc.w.Write(data)
	if err := rc.w.Flush(); err != nil {
		rc.t.Fatalf("sending %v: %v", req.cmd, err)
	}
}

// reply reads a simple reply's header, and dataLen bytes of data if it
// reports success.
func (rc *rawConn) reply(dataLen int) (simpleReply, []byte, error) {
	var b [replyHeaderSize]byte
	if _, err := io.ReadFull(rc.r, b[:]); err != nil {
		return simpleReply{}, nil, err
	}
	rep, err := decodeSimpleReply(b[:])
	if err != nil || rep.errno != 0 {
		return rep, nil, err
	}
	data := make([]byte, dataLen)
	_, err = io.ReadFull(rc.r, data)
	return rep, data, err
}

// roundTrip sends a request and returns its reply's error code.
func (rc *rawConn) roundTrip(req request, data []byte, dataLen int) (Errno, []byte) {
	rc.t.Helper()
	rc.send(req, data)
	rep, got, err := rc.reply(dataLen)
	if err != nil {
		rc.t.Fatalf("%v: %v", req.cmd, err)
	}
	if rep.handle != req.handle {
		rc.t.Fatalf("%v: reply for handle %d, want %d", req.cmd, rep.handle, req.handle)
	}
	return rep.errno, got
}

// expectClosed checks that the server hangs up.
func (rc *rawConn) expectClosed() {
	rc.t.Helper()
	rc.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, rc.r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		rc.t.Fatalf("the server did not close the connection (%d bytes came)", n)
	}
}

// TestReadWriteRoundTrip: what is written reads back, through the raw
// protocol, with the handles given.
func TestReadWriteRoundTrip(t *testing.T) {
	addr, _ := startServer(t, NewMemory(1<<20), Options{})
	rc := dialRaw(t, addr)
	if rc.info.Size != 1<<20 {
		t.Fatalf("size %d, want %d", rc.info.Size, 1<<20)
	}
	data := randomBytes(8192)
	if errno, _ := rc.roundTrip(request{cmd: CmdWrite, handle: 7, offset: 4096, length: 8192}, data, 0); errno != 0 {
		t.Fatalf("write: %v", errno)
	}
	errno, got := rc.roundTrip(request{cmd: CmdRead, handle: 8, offset: 4096, length: 8192}, nil, 8192)
	if errno != 0 || !bytes.Equal(got, data) {
		t.Fatalf("read: %v, data equal: %v", errno, bytes.Equal(got, data))
	}
	// A request of no bytes at the very end is in range.
	if errno, _ := rc.roundTrip(request{cmd: CmdRead, handle: 9, offset: 1 << 20}, nil, 0); errno != 0 {
		t.Fatalf("empty read at the end: %v", errno)
	}
	rc.send(request{cmd: CmdDisc}, nil)
	rc.expectClosed()
}

// TestDiscAnswersPending: after NBD_CMD_DISC the server still answers the
// requests sent before it, then hangs up.
func TestDiscAnswersPending(t *testing.T) {
	addr, _ := startServer(t, NewMemory(1<<20), Options{Workers: 4})
	rc := dialRaw(t, addr)
	const n = 50
	for i := range n {
		rc.send(request{cmd: CmdRead, handle: uint64(i), offset: uint64(i) * 4096, length: 4096}, nil)
	}
	rc.send(request{cmd: CmdDisc}, nil)
	seen := make(map[uint64]bool)
	for range n {
		rep, _, err := rc.reply(4096)
		if err != nil || rep.errno != 0 {
			t.Fatalf("reply %d: %v, %v", len(seen), err, rep.errno)
		}
		seen[rep.handle] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct handles answered, want %d", len(seen), n)
	}
	rc.expectClosed()
}
