package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"
)

// Client is an NBD client on one connection. Its methods may be called from
// many goroutines at once: each sends its request as soon as it is called
// and waits for the reply that carries its handle, so n goroutines keep n
// requests in flight (a queue depth of n) on the one connection.
type Client struct {
	nc   net.Conn
	info ExportInfo

	wmu sync.Mutex // the request stream
	w   *bufio.Writer
	hdr [requestHeaderSize]byte

	mu      sync.Mutex
	pending map[uint64]*call
	handle  uint64
	err     error // why the connection is unusable, once it is

	// The reply stream is read by one goroutine at a time, the reader: a
	// call that waits for its reply takes the role when it is free (role
	// holds the token then), reads replies, hands each to its call, and
	// gives the role back once its own came. A call whose reply another
	// reader hands over wakes up; one that reads its own reply needs no
	// hand-off, which is what a caller that waits for each answer (a queue
	// depth of one) costs: a wake-up between goroutines took longer than
	// the request itself in the lab. No goroutine reads while no call
	// waits.
	r    *bufio.Reader
	role chan struct{}

	// zc: requests are written in place (an rdmanet.Conn; see InPlace),
	// or nil: a request goes into the transmit ring with its data,
	// without bufio's copy. Replies are read through r: a read's data
	// goes from the receive ring straight into the caller's buffer once
	// the reader's buffer is empty (bufio reads a large read directly),
	// which is what a view would do, and a header costs one call, where
	// a view and its release are two.
	zc InPlace
}

// call is a request waiting for its reply.
type call struct {
	data  []byte // where a read's data goes
	reply chan error
}

// ClientOptions configures NewClient.
type ClientOptions struct {
	// ExportName is the export to ask for (default "", the default export).
	ExportName string
	// NoInPlace turns off writing requests in place over a connection
	// that can (InPlace).
	NoInPlace bool
}

// ErrClientClosed is the error of calls on a closed Client.
var ErrClientClosed = errors.New("nbd: client closed")

// NewClient runs the handshake on nc (fixed newstyle, NBD_OPT_GO, falling
// back to NBD_OPT_EXPORT_NAME for a server without it) and returns a Client
// of the export. ctx bounds the handshake. On an error nc is closed.
func NewClient(ctx context.Context, nc net.Conn, opts ClientOptions) (*Client, error) {
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	r := bufio.NewReaderSize(nc, connBufferSize)
	w := bufio.NewWriterSize(nc, connBufferSize)
	info, err := clientHandshake(r, w, opts.ExportName)
	if !stop() || ctx.Err() != nil {
		err = errors.Join(ctx.Err(), err)
	}
	if err == nil && info.Size > math.MaxInt64 {
		err = fmt.Errorf("nbd: export size %d is too large", info.Size)
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	c := &Client{nc: nc, info: info, w: w, pending: make(map[uint64]*call), r: r, role: make(chan struct{}, 1)}
	if zc, ok := nc.(InPlace); ok && !opts.NoInPlace && r.Buffered() == 0 {
		c.zc = zc
	}
	c.role <- struct{}{}
	return c, nil
}

// clientHandshake negotiates the export.
func clientHandshake(r *bufio.Reader, w *bufio.Writer, name string) (ExportInfo, error) {
	var info ExportInfo
	var greeting [18]byte
	if _, err := io.ReadFull(r, greeting[:]); err != nil {
		return info, fmt.Errorf("nbd: reading the server's greeting: %w", err)
	}
	be := binary.BigEndian
	if m := be.Uint64(greeting[0:]); m != magicNBD {
		return info, errBadMagic{"greeting", m}
	}
	if m := be.Uint64(greeting[8:]); m != magicOption {
		if m == magicOldstyle {
			return info, errors.New("nbd: the server speaks the oldstyle handshake, which this client does not")
		}
		return info, errBadMagic{"newstyle", m}
	}
	serverFlags := be.Uint16(greeting[16:])
	if serverFlags&flagFixedNewstyle == 0 {
		return info, errors.New("nbd: the server does not speak the fixed newstyle handshake")
	}
	clientFlags := uint32(flagFixedNewstyle)
	noZeroes := serverFlags&flagNoZeroes != 0
	if noZeroes {
		clientFlags |= flagNoZeroes
	}
	w.Write(be.AppendUint32(nil, clientFlags))

	if err := sendOption(w, optGo, encodeGoRequest(goRequest{name: name, infos: []uint16{infoBlockSize}})); err != nil {
		return info, err
	}
	gotExport := false
	for {
		h, data, err := readOptionReply(r, optGo)
		if err != nil {
			return info, err
		}
		switch {
		case h.replyType == repInfo:
			got, ok := decodeInfo(data, &info)
			if !ok {
				return info, fmt.Errorf("nbd: malformed NBD_REP_INFO (%d bytes)", len(data))
			}
			gotExport = gotExport || got
			continue
		case h.replyType == repAck:
			if !gotExport {
				return info, errors.New("nbd: the server acknowledged NBD_OPT_GO without the export's size")
			}
			return info, nil
		case h.replyType == repErrUnsup:
			// An old server: ask the old way, which fails by hanging up.
			if err := sendOption(w, optExportName, []byte(name)); err != nil {
				return info, err
			}
			n := 10
			if !noZeroes {
				n += zeroPadding
			}
			b := make([]byte, n)
			if _, err := io.ReadFull(r, b); err != nil {
				return info, fmt.Errorf("nbd: export %q: %w", name, err)
			}
			info.Size, info.Flags = be.Uint64(b), TransmissionFlags(be.Uint16(b[8:]))
			return info, nil
		case h.replyType&repFlagError != 0:
			return info, &OptionError{Option: h.option, Reply: h.replyType, Message: string(data)}
		default:
			return info, fmt.Errorf("nbd: unexpected reply type %#x to NBD_OPT_GO", h.replyType)
		}
	}
}

func sendOption(w *bufio.Writer, option uint32, data []byte) error {
	var b [optionHeaderSize]byte
	encodeOptionHeader(b[:], optionHeader{option: option, length: uint32(len(data))})
	w.Write(b[:])
	w.Write(data)
	return w.Flush()
}

// readOptionReply reads one option reply to option.
func readOptionReply(r *bufio.Reader, option uint32) (optionReplyHeader, []byte, error) {
	var b [optionReplyHeaderSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return optionReplyHeader{}, nil, fmt.Errorf("nbd: reading an option reply: %w", err)
	}
	h, err := decodeOptionReplyHeader(b[:])
	if err != nil {
		return h, nil, err
	}
	if h.option != option {
		return h, nil, fmt.Errorf("nbd: a reply to option %d, not %d", h.option, option)
	}
	if h.length > maxOptionData {
		return h, nil, fmt.Errorf("nbd: an option reply of %d bytes", h.length)
	}
	data := make([]byte, h.length)
	if _, err := io.ReadFull(r, data); err != nil {
		return h, nil, fmt.Errorf("nbd: reading an option reply: %w", err)
	}
	return h, data, nil
}

// OptionError is a server's refusal of an option during the handshake.
type OptionError struct {
	Option, Reply uint32
	Message       string // the server's, if it sent one
}

func (e *OptionError) Error() string {
	s := fmt.Sprintf("nbd: the server refused option %d: ", e.Option)
	switch e.Reply {
	case repErrUnsup:
		s += "unsupported"
	case repErrPolicy:
		s += "forbidden by policy"
	case repErrInvalid:
		s += "invalid"
	case repErrPlatform:
		s += "unsupported on its platform"
	case repErrTLSReqd:
		s += "TLS required"
	case repErrUnknown:
		s += "unknown export"
	case repErrShutdown:
		s += "shutting down"
	case repErrBlockSize:
		s += "block size required"
	case repErrTooBig:
		s += "too big"
	default:
		s += fmt.Sprintf("error %#x", e.Reply)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Info returns what the handshake said of the export.
func (c *Client) Info() ExportInfo { return c.info }

// Size returns the export's size in bytes.
func (c *Client) Size() int64 { return int64(c.info.Size) }

// Read reads len(p) bytes at off. A server's error is an Errno.
func (c *Client) Read(p []byte, off int64) error {
	return c.do(request{cmd: CmdRead, offset: uint64(off), length: uint32(len(p))}, nil, p)
}

// Write writes p at off; with FlagFUA the reply waits until p is on stable
// storage.
func (c *Client) Write(p []byte, off int64, flags CommandFlags) error {
	return c.do(request{cmd: CmdWrite, flags: flags, offset: uint64(off), length: uint32(len(p))}, p, nil)
}

// Flush returns once every write answered before it is on stable storage.
func (c *Client) Flush() error { return c.do(request{cmd: CmdFlush}, nil, nil) }

// Trim tells the server that a range is no longer needed; it then reads as
// anything.
func (c *Client) Trim(off, length int64, flags CommandFlags) error {
	if length < 0 || length > math.MaxUint32 {
		return EINVAL // the protocol's length is 32 bits
	}
	return c.do(request{cmd: CmdTrim, flags: flags, offset: uint64(off), length: uint32(length)}, nil, nil)
}

// WriteZeroes makes a range read as zeroes (FlagNoHole: keeping it allocated).
func (c *Client) WriteZeroes(off, length int64, flags CommandFlags) error {
	if length < 0 || length > math.MaxUint32 {
		return EINVAL
	}
	return c.do(request{cmd: CmdWriteZeroes, flags: flags, offset: uint64(off), length: uint32(length)}, nil, nil)
}

// ReadAt is io.ReaderAt's Read.
func (c *Client) ReadAt(p []byte, off int64) (int, error) {
	if err := c.Read(p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAt is io.WriterAt's Write.
func (c *Client) WriteAt(p []byte, off int64) (int, error) {
	if err := c.Write(p, off, 0); err != nil {
		return 0, err
	}
	return len(p), nil
}

// do sends a request and waits for its reply.
func (c *Client) do(req request, payload, readInto []byte) error {
	if off := int64(req.offset); off < 0 {
		return EINVAL
	}
	if uint64(len(readInto)) > math.MaxUint32 || uint64(len(payload)) > math.MaxUint32 {
		return EINVAL
	}
	cl := &call{data: readInto, reply: make(chan error, 1)}
	// The request is registered and sent under wmu, so that none goes out
	// after Close's NBD_CMD_DISC.
	c.wmu.Lock()
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		c.wmu.Unlock()
		return err
	}
	c.handle++
	req.handle = c.handle
	c.pending[req.handle] = cl
	c.mu.Unlock()
	err := c.sendLocked(req, payload)
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("nbd: sending a request: %w", err))
	}
	for {
		select {
		case err := <-cl.reply:
			return err
		case <-c.role:
		}
		// A reader that gave the role up may have handed this call its
		// reply while this one took the role: reading on would wait for
		// a reply that is not coming.
		select {
		case err := <-cl.reply:
			c.role <- struct{}{}
			return err
		default:
		}
		c.readReplies(cl)
		c.role <- struct{}{}
	}
}

// sendLocked sends a request and its data; c.wmu is held.
func (c *Client) sendLocked(req request, payload []byte) error {
	if c.zc == nil {
		encodeRequest(c.hdr[:], req)
		c.w.Write(c.hdr[:])
		c.w.Write(payload)
		return c.w.Flush()
	}
	b, err := c.zc.WriteBuffer(requestHeaderSize + len(payload))
	if err != nil {
		return err
	}
	encodeRequest(b, req)
	copy(b[requestHeaderSize:], payload)
	_, err = c.zc.Commit(len(b))
	return err
}

// readReplies reads replies, as the reader, and hands each to its call
// until mine's came (mine nil: until the connection ends), or the
// connection fails, which fails every call waiting.
func (c *Client) readReplies(mine *call) {
	var hb [replyHeaderSize]byte
	for {
		if _, err := io.ReadFull(c.r, hb[:]); err != nil {
			c.fail(fmt.Errorf("nbd: reading a reply: %w", err))
			return
		}
		rep, err := decodeSimpleReply(hb[:])
		if err != nil {
			if binary.BigEndian.Uint32(hb[:]) == magicStructReply {
				err = errors.New("nbd: a structured reply, which this client did not ask for")
			}
			c.fail(err)
			return
		}
		c.mu.Lock()
		cl := c.pending[rep.handle]
		delete(c.pending, rep.handle)
		c.mu.Unlock()
		if cl == nil {
			c.fail(fmt.Errorf("nbd: a reply with handle %d, which no request has", rep.handle))
			return
		}
		var replyErr error
		if rep.errno != 0 {
			replyErr = rep.errno
		} else if cl.data != nil {
			if _, err := io.ReadFull(c.r, cl.data); err != nil {
				err = fmt.Errorf("nbd: reading a reply's data: %w", err)
				cl.reply <- err
				c.fail(err)
				return
			}
		}
		cl.reply <- replyErr
		if cl == mine {
			return
		}
	}
}

// fail makes the client unusable with err, unless it already is, closes the
// connection and fails every call waiting for a reply.
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	pending := c.pending
	c.pending = make(map[uint64]*call)
	c.mu.Unlock()
	c.nc.Close()
	for _, cl := range pending {
		cl.reply <- c.err
	}
}

// Close disconnects: it sends NBD_CMD_DISC, after which the server answers
// the requests in flight and hangs up, waits up to a few seconds for that,
// and closes the connection. Calls made from then on, and calls whose reply
// did not come, fail with ErrClientClosed.
func (c *Client) Close() error {
	c.wmu.Lock()
	c.mu.Lock()
	broken := c.err != nil
	if !broken {
		c.err = ErrClientClosed
	}
	c.mu.Unlock()
	if !broken {
		c.sendLocked(request{cmd: CmdDisc}, nil)
	}
	c.wmu.Unlock()
	if !broken {
		// Read what the server answers until it hangs up, as the reader
		// (once the calls reading now have their replies).
		c.nc.SetReadDeadline(time.Now().Add(closeWait))
		<-c.role
		c.readReplies(nil)
		c.role <- struct{}{}
	}
	c.fail(ErrClientClosed)
	return nil
}

// closeWait bounds how long Close waits for the server to answer what is in
// flight and hang up.
const closeWait = 5 * time.Second
