package nbd

import (
	"bufio"
	"errors"
	"io"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
)

// A connection in the transmission phase runs three kinds of goroutines:
//
//   - the reader (the connection's own goroutine) reads requests, checks
//     them, answers the bad ones at once and queues the others;
//   - Options.Workers workers take queued requests, run them on the
//     backend and pass them on as replies;
//   - the writer sends the replies, flushing when none is waiting.
//
// Requests are served concurrently and answered as they complete, which the
// protocol allows: a client matches replies to requests by handle. The queue
// and a budget of bytes (Options.InFlightBytes) bound what a connection
// holds. The writer never waits for the reader or the workers, and a worker
// only for the writer, so the connection always drains.
//
// On an Immediate backend (Memory), a request that comes alone (nothing
// queued, running or waiting to be written, and no more bytes read behind
// it) is served by the reader itself, which writes its reply: a client
// that waits for each answer (a queue depth of one) then costs no hand-off
// between goroutines, each a wake-up that took longer than the request
// itself in the lab. A request that comes while others are in flight goes
// to the workers as before.

// job is one request on its way from the reader to the writer.
type job struct {
	req   request
	data  []byte // a write's data, then a read's
	errno Errno
	cost  int64 // of the connection's budget, given back once answered
	// queued: the workers run it (counted in conn.inflight until its
	// reply is written).
	queued bool
}

// conn is one connection in the transmission phase.
type conn struct {
	s       *Server
	nc      net.Conn
	r       *bufio.Reader
	queue   chan *job
	replies chan *job
	budget  *budget
	// inflight counts the requests given to the workers and not yet
	// answered; wmu is the reply stream's, the writer's and the reader's
	// when it answers a request itself.
	inflight  atomic.Int32
	wmu       sync.Mutex
	w         *bufio.Writer
	immediate bool // the backend is Immediate: the reader may run a request
}

// transmit serves requests until the client disconnects (NBD_CMD_DISC or
// otherwise), breaks the framing, or the connection fails. After
// NBD_CMD_DISC, and whenever the reader stops, the requests already read are
// still served and answered, if the connection lets the answers through.
func (s *Server) transmit(nc net.Conn, r *bufio.Reader, w *bufio.Writer) {
	c := &conn{
		s:       s,
		nc:      nc,
		r:       r,
		queue:   make(chan *job, s.opts.Queue),
		replies: make(chan *job, s.opts.Queue),
		budget:  newBudget(s.opts.InFlightBytes),
		w:       w,
	}
	if b, ok := s.backend.(Immediate); ok {
		c.immediate = b.Immediate()
	}
	var workers sync.WaitGroup
	workers.Add(s.opts.Workers)
	for range s.opts.Workers {
		go func() {
			defer workers.Done()
			c.work()
		}()
	}
	written := make(chan struct{})
	go func() {
		defer close(written)
		c.writeReplies()
	}()

	err := c.readRequests()
	close(c.queue)
	workers.Wait()
	close(c.replies)
	<-written
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		s.log.Info("nbd: connection closed", "remote", nc.RemoteAddr(), "err", err)
	}
}

// readRequests reads requests until NBD_CMD_DISC (nil) or an error: the
// connection's, io.EOF where the client hung up between requests,
// io.ErrUnexpectedEOF where it did in the middle of one, or a bad magic.
func (c *conn) readRequests() error {
	var hb [requestHeaderSize]byte
	for {
		if _, err := io.ReadFull(c.r, hb[:]); err != nil {
			return err
		}
		req, err := decodeRequest(hb[:])
		if err != nil {
			return err
		}
		if req.cmd == CmdDisc {
			return nil
		}
		if errno := c.check(req); errno != 0 {
			// A write's data follows its header whatever the answer: read
			// past it to the next request.
			if req.cmd == CmdWrite {
				if _, err := io.CopyN(io.Discard, c.r, int64(req.length)); err != nil {
					return err
				}
			}
			c.replies <- &job{req: req, errno: errno}
			continue
		}
		j := &job{req: req}
		if req.cmd == CmdRead || req.cmd == CmdWrite {
			j.cost = int64(req.length)
			c.budget.acquire(j.cost)
		}
		if req.cmd == CmdWrite {
			j.data = getBuffer(int(req.length))
			if _, err := io.ReadFull(c.r, j.data); err != nil {
				// The client left in the middle of a write: none of it is
				// written.
				putBuffer(j.data)
				c.budget.release(j.cost)
				return err
			}
		}
		if c.immediate && c.inflight.Load() == 0 && c.r.Buffered() == 0 {
			c.s.inlined.Add(1)
			c.execute(j)
			c.reply(j)
			continue
		}
		j.queued = true
		c.inflight.Add(1)
		c.queue <- j
	}
}

// check returns the error a request gets without reaching the backend, or 0.
func (c *conn) check(req request) Errno {
	var allowed CommandFlags
	switch req.cmd {
	case CmdRead, CmdWrite, CmdFlush, CmdTrim:
		// FUA is valid on every command once offered (and means nothing on
		// a read or a flush).
		allowed = FlagFUA
	case CmdWriteZeroes:
		allowed = FlagFUA | FlagNoHole
	default:
		// Unknown, or not offered (CACHE, BLOCK_STATUS).
		return EINVAL
	}
	if req.flags&^allowed != 0 {
		return EINVAL
	}
	size := uint64(c.s.backend.Size())
	beyond := req.offset > size || uint64(req.length) > size-req.offset
	switch req.cmd {
	case CmdRead:
		if req.length > c.s.opts.MaxPayload || beyond {
			return EINVAL
		}
	case CmdWrite:
		if req.length > c.s.opts.MaxPayload {
			return EINVAL
		}
		if beyond {
			return ENOSPC // as the protocol asks of writes beyond the end
		}
	case CmdTrim:
		if beyond {
			return EINVAL
		}
	case CmdWriteZeroes:
		if beyond {
			return ENOSPC
		}
	}
	return 0
}

// work runs queued requests until the queue closes.
func (c *conn) work() {
	for j := range c.queue {
		c.execute(j)
		c.replies <- j
	}
}

// execute runs one checked request on the backend and sets its reply.
func (c *conn) execute(j *job) {
	defer func() {
		if v := recover(); v != nil {
			c.s.log.Error("nbd: panic serving a request; answered EIO", "remote", c.nc.RemoteAddr(), "cmd", j.req.cmd, "panic", v, "stack", string(debug.Stack()))
			j.errno = EIO
		}
		if j.errno != 0 && j.data != nil {
			putBuffer(j.data)
			j.data = nil
		}
	}()
	b := c.s.backend
	off, length := int64(j.req.offset), int64(j.req.length)
	fua := j.req.flags&FlagFUA != 0
	var err error
	switch j.req.cmd {
	case CmdRead:
		j.data = getBuffer(int(length))
		var n int
		n, err = b.ReadAt(j.data, off)
		if n == len(j.data) {
			err = nil // io.ReaderAt may say io.EOF with the last bytes
		} else if err == nil {
			err = io.ErrUnexpectedEOF
		}
	case CmdWrite:
		_, err = b.WriteAt(j.data, off)
		putBuffer(j.data)
		j.data = nil
		if err == nil && fua {
			err = b.Sync()
		}
	case CmdFlush:
		err = b.Sync()
	case CmdTrim:
		err = b.Trim(off, length)
		if err == nil && fua {
			err = b.Sync()
		}
	case CmdWriteZeroes:
		err = b.Zero(off, length, j.req.flags&FlagNoHole == 0)
		if err == nil && fua {
			err = b.Sync()
		}
	}
	if err != nil {
		j.errno = errnoOf(err)
		c.s.log.Warn("nbd: request failed", "remote", c.nc.RemoteAddr(), "cmd", j.req.cmd, "offset", off, "length", length, "err", err, "errno", uint32(j.errno))
	}
}

// errnoOf maps a backend's error to the protocol's few, as it asks: a full
// disk or quota is ENOSPC, a read-only one EPERM, anything else EIO.
func errnoOf(err error) Errno {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EFBIG):
		return ENOSPC
	case errors.Is(err, syscall.EROFS), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return EPERM
	}
	return EIO
}

// writeReplies sends replies until the channel closes. After a failed write
// it closes the connection, which stops the reader, and goes on draining so
// that no worker waits for it.
func (c *conn) writeReplies() {
	broken := false
	for j := range c.replies {
		if !broken {
			c.wmu.Lock()
			err := c.writeReplyLocked(j, len(c.replies) == 0)
			c.wmu.Unlock()
			if err != nil {
				broken = true
				c.nc.Close()
			}
		}
		c.done(j)
		if j.queued {
			c.inflight.Add(-1)
		}
	}
	if !broken {
		c.wmu.Lock()
		c.w.Flush()
		c.wmu.Unlock()
	}
}

// reply is the reader answering a request it ran itself. A failed write
// closes the connection, which ends the reader's next read.
func (c *conn) reply(j *job) {
	c.wmu.Lock()
	err := c.writeReplyLocked(j, true)
	c.wmu.Unlock()
	if err != nil {
		c.nc.Close()
	}
	c.done(j)
}

// writeReplyLocked writes j's reply, and flushes if flush says.
func (c *conn) writeReplyLocked(j *job, flush bool) error {
	var hb [replyHeaderSize]byte
	encodeSimpleReply(hb[:], j.errno, j.req.handle)
	_, err := c.w.Write(hb[:])
	if err == nil && j.data != nil {
		_, err = c.w.Write(j.data)
	}
	if err == nil && flush {
		err = c.w.Flush()
	}
	return err
}

// done gives back what an answered request held.
func (c *conn) done(j *job) {
	if j.data != nil {
		putBuffer(j.data)
		j.data = nil
	}
	c.budget.release(j.cost)
}
