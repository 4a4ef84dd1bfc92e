package nbd

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmanet/sdk/rdmanet"
)

// inPlaceConn is an InPlace connection over TCP, for the server's in-place
// paths on the host: its views and write buffers are copies, and it
// counts them and checks every release (the rdmanet tests check the rings).
type inPlaceConn struct {
	net.Conn
	br *bufio.Reader

	mu         sync.Mutex
	held       map[*byte]int // views not yet released, by their first byte
	views      int
	badRelease int
	full       int // ReadViews refused for the views held
	buf        []byte
	committed  int
	posted     int // PostFroms
}

func (c *inPlaceConn) Read(b []byte) (int, error) { return c.br.Read(b) }
func (c *inPlaceConn) Buffered() int              { return c.br.Buffered() }

// viewsLimit: an inPlaceConn holding this many views says its ring is
// full of them (rdmanet.ErrViewsFull), as an rdmanet.Conn does at its
// ring's size, so that the server must wait for its workers' releases.
const viewsLimit = 6

func (c *inPlaceConn) ReadView(n int) ([]byte, error) {
	c.mu.Lock()
	if len(c.held) >= viewsLimit {
		c.full++
		c.mu.Unlock()
		return nil, rdmanet.ErrViewsFull
	}
	c.mu.Unlock()
	b := make([]byte, n)
	k, err := io.ReadFull(c.br, b)
	if k == 0 {
		return nil, err
	}
	c.mu.Lock()
	c.held[&b[0]] = k
	c.views++
	c.mu.Unlock()
	return b[:k], err
}

func (c *inPlaceConn) ReleaseView(v []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(v) == 0 || c.held[unsafe.SliceData(v)] != len(v) {
		c.badRelease++
		return errors.New("not a view held")
	}
	delete(c.held, unsafe.SliceData(v))
	return nil
}

func (c *inPlaceConn) WriteBuffer(n int) ([]byte, error) {
	c.buf = make([]byte, n)
	return c.buf, nil
}

// PostFrom writes b, a copy here, and counts it.
func (c *inPlaceConn) PostFrom(m *rdmanet.Memory, b []byte) (int, error) {
	c.mu.Lock()
	c.posted++
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *inPlaceConn) Commit(n int) (int, error) {
	c.mu.Lock()
	c.committed++
	c.mu.Unlock()
	return c.Conn.Write(c.buf[:n])
}

// inPlaceListener makes every accepted connection an inPlaceConn.
type inPlaceListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*inPlaceConn
}

func (l *inPlaceListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &inPlaceConn{Conn: nc, br: bufio.NewReader(nc), held: map[*byte]int{}}
	l.mu.Lock()
	l.conns = append(l.conns, c)
	l.mu.Unlock()
	return c, nil
}

// TestServerInPlace: over a connection that reads and writes in place,
// writes' data are views released once written to the backend, replies
// are write buffers (several replies to one when they wait together),
// and the client's requests are write buffers, at queue depths 1 and 32,
// with every byte checked; with NoInPlace, none are. With a registered
// Memory backend, every large read's data is sent from it (PostFrom).
func TestServerInPlace(t *testing.T) {
	const size = 4 << 20
	for _, block := range []int{4096, 128 << 10} {
		for _, depth := range []int{1, 32} {
			for _, mode := range []string{"inplace", "registered", "noinplace"} {
				off, registered := mode == "noinplace", mode == "registered"
				t.Run(fmt.Sprintf("%d/qd%d/%s", block, depth, mode), func(t *testing.T) {
					tl, err := net.Listen("tcp", "127.0.0.1:0")
					if err != nil {
						t.Fatal(err)
					}
					ln := &inPlaceListener{Listener: tl}
					backend := NewMemory(size)
					if registered {
						if backend, err = NewRegisteredMemory(size); err != nil {
							t.Fatal(err)
						}
						defer func() {
							if err := backend.Close(context.Background()); err != nil {
								t.Errorf("backend Close: %v", err)
							}
						}()
					}
					s := NewServer(backend, Options{NoInPlace: off, Logger: slog.New(slog.NewTextHandler(tlogWriter{t}, nil))})
					served := make(chan error, 1)
					go func() { served <- s.Serve(ln) }()
					// The client in place too, unless NoInPlace.
					nc, err := net.Dial("tcp", tl.Addr().String())
					if err != nil {
						t.Fatal(err)
					}
					cc := &inPlaceConn{Conn: nc, br: bufio.NewReader(nc), held: map[*byte]int{}}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					c, err := NewClient(ctx, cc, ClientOptions{NoInPlace: off})
					if err != nil {
						t.Fatal(err)
					}
					src := randomBytes(size)
					blocks := rand.New(rand.NewPCG(uint64(depth), uint64(block))).Perm(size / block)
					if err := forBlocks(depth, blocks, func(i int) error {
						return c.Write(src[i*block:(i+1)*block], int64(i*block), 0)
					}); err != nil {
						t.Fatalf("write: %v", err)
					}
					dst := make([]byte, size)
					if err := forBlocks(depth, blocks, func(i int) error {
						return c.Read(dst[i*block:(i+1)*block], int64(i*block))
					}); err != nil {
						t.Fatalf("read: %v", err)
					}
					if sha256.Sum256(dst) != sha256.Sum256(src) {
						t.Fatal("what was read back differs from what was written")
					}
					c.Close()
					if err := s.Close(); err != nil {
						t.Errorf("Close: %v", err)
					}
					<-served
					cc.mu.Lock()
					if !off && (cc.committed < 2*size/block || len(cc.held) > 0 || cc.badRelease > 0) {
						t.Errorf("client: %d write buffers, %d views, %d held, %d bad releases", cc.committed, cc.views, len(cc.held), cc.badRelease)
					}
					cc.mu.Unlock()
					ln.mu.Lock()
					defer ln.mu.Unlock()
					if len(ln.conns) != 1 {
						t.Fatalf("%d connections", len(ln.conns))
					}
					pc := ln.conns[0]
					pc.mu.Lock()
					defer pc.mu.Unlock()
					t.Logf("views %d (%d refused: ring full), commits %d, sent from memory %d", pc.views, pc.full, pc.committed, pc.posted)
					if fromMem := registered && block >= fromMemoryMin; (pc.posted == size/block) != fromMem || !fromMem && pc.posted != 0 {
						t.Errorf("%d reads of %d sent from the backend's memory; registered %v", pc.posted, size/block, registered)
					}
					switch {
					case pc.badRelease > 0:
						t.Errorf("%d releases of what was not a view held", pc.badRelease)
					case len(pc.held) > 0:
						t.Errorf("%d views never released", len(pc.held))
					case off && pc.views+pc.committed > 0:
						t.Errorf("NoInPlace: %d views and %d write buffers", pc.views, pc.committed)
					case !off && (pc.views < size/block || pc.committed == 0):
						// Replies waiting go out together: fewer buffers than replies.
						t.Errorf("%d views and %d write buffers for %d writes and %d reads", pc.views, pc.committed, size/block, size/block)
					}
				})
			}
		}
	}
}

type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }
