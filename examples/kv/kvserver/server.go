// Package kvserver is an in-memory key-value server that speaks the Redis
// protocol (RESP2), so redis-cli, redis-benchmark and Redis client libraries
// work with it unchanged.
//
// It serves whatever net.Listener it is given and treats each connection as
// a plain net.Conn: the same server runs over RDMA (rdmanet) or TCP.
//
// Values are strings (byte slices) in one database (db 0). The commands are
// the string, key and connection commands that clients and tools use; see
// the README beside the kv example for the list.
package kvserver

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmanet/sdk/examples/internal/conntrack"
)

// Options configures a Server. The zero value gives the defaults.
type Options struct {
	// MaxBulk is the largest bulk string (one argument) a request may carry
	// (default 64 MiB; Redis allows 512 MiB).
	MaxBulk int
	// MaxArgs is the most arguments one request may carry (default 1 Mi).
	MaxArgs int
	// MaxInline is the longest inline request or length header line (default
	// 64 KiB, as Redis).
	MaxInline int
	// MaxRequest bounds the bytes of all arguments of one request together
	// (default 128 MiB). A connection's request buffers never grow past
	// about twice MaxRequest, plus 32 bytes per argument and MaxInline, and
	// only as fast as the client actually sends bytes: a length it announces
	// is not allocated ahead.
	MaxRequest int
	// Logger receives connection errors (protocol errors, panics); nil
	// discards them.
	Logger *slog.Logger
	// OnConn, if set, is called with each accepted connection, in the
	// connection's goroutine, before its first request is read.
	OnConn func(net.Conn)
}

const (
	defaultMaxBulk    = 64 << 20
	defaultMaxArgs    = 1 << 20
	defaultMaxInline  = 64 << 10
	defaultMaxRequest = 128 << 20
	connBufferSize    = 16 << 10
)

// Server serves the Redis protocol on listeners. Create it with New.
type Server struct {
	opts   Options
	limits limits
	log    *slog.Logger
	ks     *keyspace
	start  time.Time
	// now is the clock for expiry in Unix milliseconds (tests replace it).
	now func() int64

	lastClientID atomic.Int64
	clients      atomic.Int64

	// tracker holds the listeners, connections and goroutines (the
	// connections' and the periodic expiry's) that Close closes and waits
	// for; its Done channel stops the periodic expiry.
	tracker conntrack.Tracker
	// startExpiry starts the periodic expiry, on the first Serve: a Server
	// that is never served runs no goroutine.
	startExpiry sync.Once
}

// New returns a Server with an empty database.
func New(opts Options) *Server {
	l := limits{maxBulk: opts.MaxBulk, maxArgs: opts.MaxArgs, maxInline: opts.MaxInline, maxRequest: opts.MaxRequest}
	if l.maxBulk <= 0 {
		l.maxBulk = defaultMaxBulk
	}
	if l.maxArgs <= 0 {
		l.maxArgs = defaultMaxArgs
	}
	if l.maxInline <= 0 {
		l.maxInline = defaultMaxInline
	}
	if l.maxRequest <= 0 {
		l.maxRequest = defaultMaxRequest
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		opts:   opts,
		limits: l,
		log:    log,
		ks:     newKeyspace(),
		start:  time.Now(),
		now:    func() int64 { return time.Now().UnixMilli() },
	}
}

// Serve accepts connections on l and serves each in its own goroutine,
// until l fails or the server is closed. It closes l before returning. After
// Close it returns nil; otherwise it returns Accept's error (if l was closed
// by someone else, one that matches net.ErrClosed).
//
// Errors an Accept marks as temporary (for example running out of file
// descriptors) are retried after a pause of up to a second.
func (s *Server) Serve(l net.Listener) error {
	defer l.Close()
	if !s.tracker.AddListener(l) {
		return nil
	}
	s.startExpiry.Do(func() { s.tracker.Go(s.expireLoop) })
	defer s.tracker.RemoveListener(l)

	var pause time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.tracker.Closed() {
				return nil
			}
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				s.log.Warn("kvserver: accept failed; retrying", "err", err, "in", pause)
				select {
				case <-time.After(pause):
				case <-s.tracker.Done():
				}
				continue
			}
			return err
		}
		pause = 0
		if !s.tracker.Track(nc) {
			nc.Close()
			return nil
		}
		go s.serveConn(nc)
	}
}

// Close closes the listeners and every client connection, and returns once
// their goroutines have finished. It returns the first error of closing a
// listener.
func (s *Server) Close() error {
	return s.tracker.Close()
}

// expireLoop runs the periodic expiry until the server is closed.
func (s *Server) expireLoop() {
	t := time.NewTicker(expireInterval)
	defer t.Stop()
	done := s.tracker.Done()
	for {
		select {
		case <-t.C:
			s.ks.expireCycle(s.now)
		case <-done:
			return
		}
	}
}

// serveConn serves one client until it quits, its connection fails, it
// sends a malformed request or the server closes.
func (s *Server) serveConn(nc net.Conn) {
	defer s.tracker.Untrack(nc)
	// A last resort: a bug in a command must cost its client's connection,
	// not the server. Commands take the keyspace lock with defer, so none is
	// left held.
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("kvserver: panic serving a client; connection closed", "remote", nc.RemoteAddr(), "panic", v, "stack", string(debug.Stack()))
		}
	}()
	s.clients.Add(1)
	defer s.clients.Add(-1)
	if s.opts.OnConn != nil {
		s.opts.OnConn(nc)
	}

	c := &conn{srv: s, nc: nc, id: s.lastClientID.Add(1)}
	c.w = replyWriter{Writer: bufio.NewWriterSize(nc, connBufferSize)}
	c.r = newRequestReader(&flushingReader{conn: nc, w: c.w.Writer}, connBufferSize, s.limits)
	for {
		args, err := c.r.ReadRequest()
		if err != nil {
			var pe *ProtocolError
			if errors.As(err, &pe) {
				c.w.error("ERR " + pe.Error())
				c.w.Flush()
				s.log.Info("kvserver: closing a client after a protocol error", "remote", nc.RemoteAddr(), "err", err)
				lingerClose(nc)
			}
			return
		}
		if !c.exec(args) {
			c.w.Flush()
			return
		}
	}
}

// After a protocol error the connection lingers this long, or until the
// client has sent this much more, before it is closed.
const (
	lingerTime  = time.Second
	lingerBytes = 256 << 10
)

// lingerClose half-closes nc, where it can, and reads what the client still
// sends for a while, before serveConn closes it. Closing a TCP connection
// with request bytes unread resets it, and a reset can destroy the error
// reply in flight: the client would see "connection reset" instead of why.
func lingerClose(nc net.Conn) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	nc.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, nc, lingerBytes)
}

// conn is one client's connection and state.
type conn struct {
	srv  *Server
	nc   net.Conn
	r    *requestReader
	w    replyWriter
	id   int64
	name string // CLIENT SETNAME
	lib  string // CLIENT SETINFO LIB-NAME
	ver  string // CLIENT SETINFO LIB-VER

	values []entryRef // MGET's scratch
}

// entryRef is a value found for a reply; ok is false for a missing key.
type entryRef struct {
	value []byte
	ok    bool
}
