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

	"github.com/rdmanet/sdk/rdmanet"
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

// In place: over a connection that reads and writes in place (an
// rdmanet.Conn: InPlace) and on an Immediate backend, a write's data is
// a view into the connection's receive ring, written to the backend from
// there and then released, and a read's reply is a write buffer in the
// transmit ring that the backend's bytes are read straight into. The
// bytes are copied once each way, between the ring and the backend,
// where bufio and a buffer of the job's own made it three times.

// InPlace is a connection that reads and writes in place, as
// rdmanet.Conn does (rdmanet.ZeroCopier), and says how many bytes it
// holds unread.
type InPlace interface {
	ReadView(n int) ([]byte, error)
	ReleaseView(v []byte) error
	WriteBuffer(n int) ([]byte, error)
	Commit(n int) (int, error)
	Buffered() int
}

// memorySender is a connection that sends registered memory from where
// it is (rdmanet.Conn's PostFrom).
type memorySender interface {
	PostFrom(m *rdmanet.Memory, b []byte) (int, error)
}

// fromMemoryMin is the smallest read whose data the server sends from a
// registered Memory backend: a smaller one is one more request to post,
// for a copy that costs little.
const fromMemoryMin = 32 << 10

// job is one request on its way from the reader to the writer.
type job struct {
	req   request
	view  []byte // a write's data in place (InPlace), until written
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
	// zc: requests are read and replies written in place, or nil;
	// released says that a view was released (capacity 1).
	zc       InPlace
	released chan struct{}
	// from and mem: a large read's data is sent from the backend's
	// registered memory (NewRegisteredMemory), or from is nil.
	from memorySender
	mem  *Memory
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
	// In place only on an Immediate backend, whose reads the writer runs
	// as it writes the reply (a file's would wait for each other there);
	// and only from the first byte the handshake's reader left.
	if zc, ok := nc.(InPlace); ok && c.immediate && !s.opts.NoInPlace && r.Buffered() == 0 && w.Buffered() == 0 {
		c.zc, c.released = zc, make(chan struct{}, 1)
		if m, ok := s.backend.(*Memory); ok && m.reg != nil {
			if from, ok := nc.(memorySender); ok {
				c.from, c.mem = from, m
			}
		}
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
	for {
		req, err := c.readHeader()
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
				if _, err := io.CopyN(io.Discard, c.reader(), int64(req.length)); err != nil {
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
			if err := c.readData(j); err != nil {
				// The client left in the middle of a write: none of it is
				// written.
				c.budget.release(j.cost)
				return err
			}
		}
		if c.immediate && c.inflight.Load() == 0 && c.buffered() == 0 {
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

// readHeader reads the next request's header: through the reader's
// buffer, or, in place, with the connection's Read into the header's own
// 28 bytes (one call, where a view and its release are two).
func (c *conn) readHeader() (request, error) {
	var hb [requestHeaderSize]byte
	if c.zc == nil {
		if _, err := io.ReadFull(c.r, hb[:]); err != nil {
			return request{}, err
		}
		return decodeRequest(hb[:])
	}
	for got := 0; got < len(hb); {
		n, err := c.nc.Read(hb[got:])
		got += n
		switch {
		case err == nil:
		case errors.Is(err, rdmanet.ErrViewsFull):
			if !c.waitRelease() {
				return request{}, err
			}
		case err == io.EOF && got > 0:
			return request{}, io.ErrUnexpectedEOF
		default:
			return request{}, err
		}
	}
	return decodeRequest(hb[:])
}

// readData reads a write's data: into a buffer of the job's, or as a view
// in place, which the job holds until the backend has the bytes.
func (c *conn) readData(j *job) error {
	if c.zc == nil {
		j.data = getBuffer(int(j.req.length))
		if _, err := io.ReadFull(c.r, j.data); err != nil {
			putBuffer(j.data)
			j.data = nil
			return err
		}
		return nil
	}
	v, err := c.view(int(j.req.length))
	if err != nil {
		if len(v) > 0 {
			c.zc.ReleaseView(v)
		}
		return err
	}
	j.view = v
	return nil
}

// view reads n bytes in place, waiting for releases while the views held
// fill the ring (waitRelease).
func (c *conn) view(n int) ([]byte, error) {
	for {
		v, err := c.zc.ReadView(n)
		if !errors.Is(err, rdmanet.ErrViewsFull) || !c.waitRelease() {
			return v, err
		}
	}
}

// waitRelease waits for a view to be released, after the connection said
// that the views held fill its ring: they are the queued writes', which
// release them as they run. A release may come between the error and the
// wait (the job may even be answered by then): its token says so. It
// reports false if no job holds a view, so that none will be released.
func (c *conn) waitRelease() bool {
	select {
	case <-c.released:
		return true
	default:
	}
	if c.inflight.Load() == 0 {
		return false
	}
	<-c.released
	return true
}

// releaseView gives a write's data back to the connection.
func (c *conn) releaseView(j *job) {
	c.zc.ReleaseView(j.view)
	j.view = nil
	select {
	case c.released <- struct{}{}:
	default:
	}
}

// reader is where plain reads of the request stream come from.
func (c *conn) reader() io.Reader {
	if c.zc != nil {
		return c.nc
	}
	return c.r
}

// buffered is how many bytes of requests were received and not yet read.
func (c *conn) buffered() int {
	if c.zc != nil {
		return c.zc.Buffered()
	}
	return c.r.Buffered()
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
		if j.errno != 0 && j.data != nil {
			putBuffer(j.data)
			j.data = nil
		}
	}()
	defer c.recoverEIO(j) // first, so that the buffer above goes back
	b := c.s.backend
	off, length := int64(j.req.offset), int64(j.req.length)
	fua := j.req.flags&FlagFUA != 0
	var err error
	switch j.req.cmd {
	case CmdRead:
		if c.zc != nil {
			return // read into the reply's buffer (writeReplyLocked)
		}
		j.data = getBuffer(int(length))
		err = c.readAt(j.data, off)
	case CmdWrite:
		if j.view != nil {
			_, err = b.WriteAt(j.view, off)
			c.releaseView(j)
		} else {
			_, err = b.WriteAt(j.data, off)
			putBuffer(j.data)
			j.data = nil
		}
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
		c.failed(j, err)
	}
}

// recoverEIO, deferred, answers a request whose backend call panicked
// with EIO, and logs the panic.
func (c *conn) recoverEIO(j *job) {
	if v := recover(); v != nil {
		c.s.log.Error("nbd: panic serving a request; answered EIO", "remote", c.nc.RemoteAddr(), "cmd", j.req.cmd, "panic", v, "stack", string(debug.Stack()))
		j.errno = EIO
	}
}

// readAt reads len(b) bytes at off from the backend: a short read is an
// error, and io.EOF with the last bytes is not (io.ReaderAt may say it).
func (c *conn) readAt(b []byte, off int64) error {
	n, err := c.s.backend.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// failed answers j with the protocol's errno for err, and logs it.
func (c *conn) failed(j *job, err error) {
	j.errno = errnoOf(err)
	c.s.log.Warn("nbd: request failed", "remote", c.nc.RemoteAddr(), "cmd", j.req.cmd, "offset", int64(j.req.offset), "length", int64(j.req.length), "err", err, "errno", uint32(j.errno))
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
	var batch []*job
	for j := range c.replies {
		// Replies waiting go out together, in place as through bufio: one
		// write buffer for them all (replyBatch), one Commit.
		batch = append(batch[:0], j)
		if c.zc != nil {
			batch = c.moreReplies(batch)
		}
		if !broken {
			c.wmu.Lock()
			var err error
			if c.zc != nil {
				err = c.writeRepliesInPlaceLocked(batch)
			} else {
				err = c.writeReplyLocked(j, len(c.replies) == 0)
			}
			c.wmu.Unlock()
			if err != nil {
				broken = true
				c.nc.Close()
			}
		}
		for _, j := range batch {
			c.done(j)
			if j.queued {
				c.inflight.Add(-1)
			}
		}
	}
	if !broken && c.zc == nil {
		c.wmu.Lock()
		c.w.Flush()
		c.wmu.Unlock()
	}
}

// replyBatch bounds the replies written in place together: as much as
// bufio's buffer held.
const replyBatch = connBufferSize

// moreReplies adds to batch the replies waiting, up to replyBatch bytes.
func (c *conn) moreReplies(batch []*job) []*job {
	size := replySize(batch[0])
	for size < replyBatch {
		select {
		case j, ok := <-c.replies:
			if !ok {
				return batch
			}
			batch = append(batch, j)
			size += replySize(j)
		default:
			return batch
		}
	}
	return batch
}

// replySize is the size of j's reply on the wire.
func replySize(j *job) int {
	if j.req.cmd == CmdRead && j.errno == 0 {
		return replyHeaderSize + int(j.req.length)
	}
	return replyHeaderSize
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
	if c.zc != nil {
		return c.writeRepliesInPlaceLocked([]*job{j})
	}
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

// writeRepliesInPlaceLocked writes the replies of batch in place, in one
// write buffer: each header, and each read's bytes read from the backend
// straight into the transmit ring. A read that fails is answered with its
// error and no data, and the bytes after it close up behind it. A large
// read from a registered Memory ends the buffer with its header, and its
// data follows from the backend's memory, where it is (PostFrom).
func (c *conn) writeRepliesInPlaceLocked(batch []*job) error {
	for len(batch) > 0 {
		k, reg, data := len(batch), (*rdmanet.Memory)(nil), []byte(nil)
		for i, j := range batch {
			if reg, data = c.sendable(j); reg != nil {
				k = i + 1
				break
			}
		}
		if err := c.writeRunInPlaceLocked(batch[:k], reg != nil); err != nil {
			return err
		}
		if reg != nil {
			if _, err := c.from.PostFrom(reg, data); err != nil {
				return err
			}
		}
		batch = batch[k:]
	}
	return nil
}

// sendable returns where j's data is in the backend's registered memory,
// if j is a read large enough to send from there.
func (c *conn) sendable(j *job) (*rdmanet.Memory, []byte) {
	if c.from == nil || j.req.cmd != CmdRead || j.errno != 0 || j.req.length < fromMemoryMin {
		return nil, nil
	}
	return c.mem.sendable(int64(j.req.offset), int64(j.req.length))
}

// writeRunInPlaceLocked writes replies in one write buffer; with
// headerLast, the last is a read's header alone, its data to follow.
func (c *conn) writeRunInPlaceLocked(run []*job, headerLast bool) error {
	n := 0
	for _, j := range run {
		n += replySize(j)
	}
	if headerLast {
		n -= int(run[len(run)-1].req.length)
	}
	b, err := c.zc.WriteBuffer(n)
	if err != nil {
		return err
	}
	at := 0
	for i, j := range run {
		if headerLast && i == len(run)-1 {
			encodeSimpleReply(b[at:at+replyHeaderSize], j.errno, j.req.handle)
			at += replyHeaderSize
			break
		}
		if j.req.cmd == CmdRead && j.errno == 0 {
			c.readInto(j, b[at+replyHeaderSize:at+replyHeaderSize+int(j.req.length)])
		}
		encodeSimpleReply(b[at:at+replyHeaderSize], j.errno, j.req.handle)
		at += replySize(j) // a failed read's is the header's alone now
	}
	_, err = c.zc.Commit(at)
	return err
}

// readInto runs a read on the backend into b, setting j's error if it
// fails (or panics).
func (c *conn) readInto(j *job, b []byte) {
	defer c.recoverEIO(j)
	if err := c.readAt(b, int64(j.req.offset)); err != nil {
		c.failed(j, err)
	}
}

// done gives back what an answered request held.
func (c *conn) done(j *job) {
	if j.view != nil {
		c.releaseView(j)
	}
	if j.data != nil {
		putBuffer(j.data)
		j.data = nil
	}
	c.budget.release(j.cost)
}
