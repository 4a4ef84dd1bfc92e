package nbd

import (
	"errors"
	"log/slog"
	"net"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/rdmanet/sdk/examples/internal/conntrack"
)

// Options configures a Server. The zero value gives the defaults.
type Options struct {
	// ExportName is the export's name (default "", the default export,
	// which nbd://host:port names). A client that asks for another gets
	// NBD_REP_ERR_UNKNOWN.
	ExportName string
	// Description, if set, is sent to clients that ask (nbdinfo shows it).
	Description string
	// Workers is how many requests of one connection are served at once
	// (default 8): a queue depth above one overlaps a file's reads and
	// writes. Replies go out as requests complete, in any order.
	Workers int
	// Queue is how many requests of a connection may wait, read, for a
	// worker (default 64). When it is full the server stops reading the
	// connection until a worker is free.
	Queue int
	// MaxPayload is the largest read or write a request may carry (default
	// 32 MiB, the protocol's suggestion; clients learn it from
	// NBD_INFO_BLOCK_SIZE). A larger read gets EINVAL; a larger write's
	// data is read, discarded and answered EINVAL.
	MaxPayload uint32
	// InFlightBytes bounds the data of one connection's requests held in
	// memory at once, written or to be read (default 64 MiB; at least
	// MaxPayload).
	InFlightBytes int64
	// HandshakeTimeout bounds the handshake (default 30 s).
	HandshakeTimeout time.Duration
	// Logger receives connection errors; nil discards them.
	Logger *slog.Logger
	// OnConn, if set, is called with each accepted connection before its
	// handshake, in the connection's goroutine.
	OnConn func(net.Conn)
	// NoInPlace turns off reading requests and writing replies in place
	// over connections that can (InPlace, an rdmanet.Conn): they go
	// through buffers of their own, as over TCP.
	NoInPlace bool
}

const (
	defaultWorkers          = 8
	defaultQueue            = 64
	defaultMaxPayload       = 32 << 20
	defaultInFlightBytes    = 64 << 20
	defaultHandshakeTimeout = 30 * time.Second
	connBufferSize          = 64 << 10
	// The block sizes the server announces: any alignment works (it serves
	// byte ranges), and 4 KiB is a page.
	minBlock       = 1
	preferredBlock = 4096
)

// Server serves one export over the protocol. Create it with NewServer.
type Server struct {
	backend Backend
	opts    Options
	log     *slog.Logger
	flags   TransmissionFlags

	// tracker holds the listeners, connections and connection goroutines
	// that Close closes and waits for.
	tracker conntrack.Tracker
	// inlined counts the requests connections' readers ran themselves
	// (transmission.go), for the tests.
	inlined atomic.Int64
}

// NewServer returns a server of b's contents.
func NewServer(b Backend, opts Options) *Server {
	if opts.Workers <= 0 {
		opts.Workers = defaultWorkers
	}
	if opts.Queue <= 0 {
		opts.Queue = defaultQueue
	}
	if opts.MaxPayload == 0 {
		opts.MaxPayload = defaultMaxPayload
	}
	if opts.InFlightBytes <= 0 {
		opts.InFlightBytes = defaultInFlightBytes
	}
	opts.InFlightBytes = max(opts.InFlightBytes, int64(opts.MaxPayload))
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = defaultHandshakeTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		backend: b,
		opts:    opts,
		log:     log,
		// CAN_MULTI_CONN: every connection shares the one backend, and a
		// flush syncs all of it, so a flush on one connection covers the
		// writes answered on all of them.
		flags: FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes | FlagCanMultiConn,
	}
}

// Serve accepts connections on l and serves each in its own goroutine,
// until l fails or the server is closed. It closes l before returning.
// After Close it returns nil; otherwise Accept's error. Errors an Accept
// marks as temporary are retried after a pause of up to a second.
func (s *Server) Serve(l net.Listener) error {
	defer l.Close()
	if !s.tracker.AddListener(l) {
		return nil
	}
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
				s.log.Warn("nbd: accept failed; retrying", "err", err, "in", pause)
				time.Sleep(pause)
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

// Close closes the listeners and every connection (a hard disconnect:
// requests in flight get no reply), and returns once their goroutines have
// finished. It returns the first error of closing a listener.
func (s *Server) Close() error {
	return s.tracker.Close()
}

// serveConn runs a connection's handshake and then its transmission phase,
// until the client disconnects, breaks the protocol, or the server closes.
func (s *Server) serveConn(nc net.Conn) {
	defer s.tracker.Untrack(nc)
	// A last resort: a bug must cost its client's connection, not the
	// server. (The transmission phase's workers have their own.)
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("nbd: panic serving a client; connection closed", "remote", nc.RemoteAddr(), "panic", v, "stack", string(debug.Stack()))
		}
	}()
	if s.opts.OnConn != nil {
		s.opts.OnConn(nc)
	}
	h := newHandshake(s, nc)
	nc.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	transmit, err := h.run()
	if err != nil {
		s.log.Info("nbd: handshake failed; connection closed", "remote", nc.RemoteAddr(), "err", err)
		return
	}
	if !transmit {
		return
	}
	nc.SetDeadline(time.Time{})
	s.transmit(nc, h.r, h.w)
}
