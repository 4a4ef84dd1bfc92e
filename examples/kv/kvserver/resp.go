package kvserver

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
)

// ProtocolError is a request that breaks RESP. The server answers it with
// "-ERR Protocol error: <Msg>" and closes the connection, as Redis does:
// after a malformed request it cannot know where the next one starts.
type ProtocolError struct {
	Msg string
}

func (e *ProtocolError) Error() string { return "Protocol error: " + e.Msg }

// limits bound what one request may make the server hold.
type limits struct {
	maxBulk    int // bytes in one bulk string
	maxArgs    int // arguments in one multibulk request
	maxInline  int // bytes in one line: an inline request or a length header
	maxRequest int // argument bytes in one request, all arguments together
}

const (
	// bulkChunk is how far ahead of the bytes actually received a bulk
	// string's buffer grows, so a client that announces a large length and
	// sends nothing does not make the server allocate that length.
	bulkChunk = 64 << 10
	// Buffers that grew past these sizes for one large request are dropped
	// once it is done instead of being kept for the life of the connection.
	keepArenaBytes = 1 << 20
	keepArgCount   = 4 << 10
)

// requestReader reads requests from a client: RESP multibulk arrays of bulk
// strings ("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n") as clients send them, and inline
// commands ("GET k\r\n") as people type them.
type requestReader struct {
	br *bufio.Reader
	limits

	arena []byte   // the current request's arguments, back to back
	ends  []int    // where each argument ends in arena
	args  [][]byte // the arguments, slices of arena
	line  []byte   // the current header or inline line
}

func newRequestReader(r io.Reader, size int, l limits) *requestReader {
	return &requestReader{br: bufio.NewReaderSize(r, size), limits: l}
}

// ReadRequest reads the next non-empty request. The arguments stay valid
// until the next call. A connection that ends between requests gives io.EOF;
// one that ends inside a request gives io.ErrUnexpectedEOF; a malformed
// request gives a *ProtocolError.
func (rr *requestReader) ReadRequest() ([][]byte, error) {
	for {
		rr.reset()
		first, err := rr.br.Peek(1)
		if err != nil {
			return nil, err
		}
		if first[0] == '*' {
			err = rr.readMultibulk()
		} else {
			err = rr.readInline()
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return nil, err
		}
		// Redis ignores empty requests ("*0\r\n", a blank line) without a reply.
		if len(rr.ends) == 0 {
			continue
		}
		start := 0
		for _, end := range rr.ends {
			rr.args = append(rr.args, rr.arena[start:end:end])
			start = end
		}
		return rr.args, nil
	}
}

func (rr *requestReader) reset() {
	if cap(rr.arena) > keepArenaBytes {
		rr.arena = nil
	}
	if cap(rr.ends) > keepArgCount {
		rr.ends, rr.args = nil, nil
	}
	rr.arena, rr.ends = rr.arena[:0], rr.ends[:0]
	clear(rr.args) // let a dropped arena go
	rr.args = rr.args[:0]
}

// readLine reads a line up to "\n" and returns it without the "\n"; the
// line is valid until the next readLine. A line longer than maxInline is a
// protocol error with the message tooLong, reported as soon as that many
// bytes without a "\n" have arrived (bufio.Reader.ReadSlice would wait for
// a full buffer).
func (rr *requestReader) readLine(tooLong string) ([]byte, error) {
	rr.line = rr.line[:0]
	for {
		if _, err := rr.br.Peek(1); err != nil {
			return nil, err
		}
		buf, _ := rr.br.Peek(rr.br.Buffered())
		i := bytes.IndexByte(buf, '\n')
		n := i
		if i < 0 {
			n = len(buf)
		}
		if len(rr.line)+n > rr.maxInline {
			return nil, &ProtocolError{tooLong}
		}
		rr.line = append(rr.line, buf[:n]...)
		if i >= 0 {
			rr.br.Discard(i + 1)
			return rr.line, nil
		}
		rr.br.Discard(n)
	}
}

func (rr *requestReader) readMultibulk() error {
	line, err := rr.readLine("too big mbulk count string")
	if err != nil {
		return err
	}
	n, ok := parseLength(line[1:])
	if !ok || n > int64(rr.maxArgs) {
		return &ProtocolError{"invalid multibulk length"}
	}
	for i := int64(0); i < n; i++ {
		line, err := rr.readLine("too big bulk count string")
		if err != nil {
			return err
		}
		if len(line) == 0 || line[0] != '$' {
			got := "\n"
			if len(line) > 0 {
				got = string(line[:1])
			}
			return &ProtocolError{"expected '$', got '" + got + "'"}
		}
		size, ok := parseLength(line[1:])
		if !ok || size < 0 || size > int64(rr.maxBulk) {
			return &ProtocolError{"invalid bulk length"}
		}
		if int64(len(rr.arena))+size > int64(rr.maxRequest) {
			return &ProtocolError{"too big request"}
		}
		if err := rr.readBulk(int(size)); err != nil {
			return err
		}
	}
	return nil
}

// readBulk reads a bulk string's size bytes and its "\r\n" into the arena.
func (rr *requestReader) readBulk(size int) error {
	start := len(rr.arena)
	for need := size + 2; need > 0; {
		if len(rr.arena) == cap(rr.arena) {
			rr.arena = slices.Grow(rr.arena, min(need, max(cap(rr.arena), bulkChunk)))
		}
		n := min(need, cap(rr.arena)-len(rr.arena))
		if _, err := io.ReadFull(rr.br, rr.arena[len(rr.arena):len(rr.arena)+n]); err != nil {
			return err
		}
		rr.arena = rr.arena[:len(rr.arena)+n]
		need -= n
	}
	if !bytes.HasSuffix(rr.arena[start:], crlf) {
		return &ProtocolError{"expected CRLF after bulk string"}
	}
	rr.arena = rr.arena[:len(rr.arena)-2]
	rr.ends = append(rr.ends, len(rr.arena))
	return nil
}

// parseLength parses the decimal length of a "*" or "$" header, whose line
// must end in "\r".
func parseLength(b []byte) (int64, bool) {
	digits, ok := bytes.CutSuffix(b, []byte{'\r'})
	if !ok {
		return 0, false
	}
	return parseInt(digits)
}

func (rr *requestReader) readInline() error {
	line, err := rr.readLine("too big inline request")
	if err != nil {
		return err
	}
	line = bytes.TrimSuffix(line, []byte{'\r'})
	// Redis splits the line as a C string: a NUL ends it.
	if i := bytes.IndexByte(line, 0); i >= 0 {
		line = line[:i]
	}
	if !rr.splitInline(line) {
		return &ProtocolError{"unbalanced quotes in request"}
	}
	return nil
}

// splitInline splits an inline request into arguments as Redis does
// (sdssplitargs): blanks separate arguments; "double quotes" take \n \r \t
// \b \a \xHH and \<any> escapes, 'single quotes' take \'; a closing quote
// must be followed by a blank or the end of the line.
func (rr *requestReader) splitInline(line []byte) bool {
	i := 0
	for {
		for i < len(line) && isSpace(line[i]) {
			i++
		}
		if i == len(line) {
			return true
		}
		inDouble, inSingle := false, false
		for done := false; !done; {
			switch {
			case inDouble:
				if i == len(line) {
					return false
				}
				c := line[i]
				switch {
				case c == '\\' && i+3 < len(line) && line[i+1] == 'x' && isHex(line[i+2]) && isHex(line[i+3]):
					rr.arena = append(rr.arena, unhex(line[i+2])<<4|unhex(line[i+3]))
					i += 4
				case c == '\\' && i+1 < len(line):
					rr.arena = append(rr.arena, unescape(line[i+1]))
					i += 2
				case c == '"':
					if i+1 < len(line) && !isSpace(line[i+1]) {
						return false
					}
					done = true
					i++
				default:
					rr.arena = append(rr.arena, c)
					i++
				}
			case inSingle:
				if i == len(line) {
					return false
				}
				c := line[i]
				switch {
				case c == '\\' && i+1 < len(line) && line[i+1] == '\'':
					rr.arena = append(rr.arena, '\'')
					i += 2
				case c == '\'':
					if i+1 < len(line) && !isSpace(line[i+1]) {
						return false
					}
					done = true
					i++
				default:
					rr.arena = append(rr.arena, c)
					i++
				}
			default:
				if i == len(line) {
					done = true
					break
				}
				switch c := line[i]; c {
				case ' ', '\n', '\r', '\t':
					done = true
				case '"':
					inDouble = true
				case '\'':
					inSingle = true
				default:
					rr.arena = append(rr.arena, c)
				}
				i++
			}
		}
		rr.ends = append(rr.ends, len(rr.arena))
	}
}

// isSpace is C's isspace in the C locale.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func unescape(c byte) byte {
	switch c {
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	case 'b':
		return '\b'
	case 'a':
		return '\a'
	}
	return c
}

// parseInt parses a decimal int64 as Redis's string2ll does: an optional
// "-", no "+", no blanks, no leading zeros ("0" itself is fine, "-0" is not).
func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	if len(b) == 1 && b[0] == '0' {
		return 0, true
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || b[0] < '1' || b[0] > '9' {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		if v > (1<<63)/10 {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
		if v > 1<<63 {
			return 0, false
		}
	}
	if neg {
		if v > 1<<63 {
			return 0, false
		}
		return int64(-v), true
	}
	if v > 1<<63-1 {
		return 0, false
	}
	return int64(v), true
}

var crlf = []byte("\r\n")

// replyWriter writes RESP2 replies into a buffer. Its errors are the
// bufio.Writer's: sticky, and seen at the next Flush.
type replyWriter struct {
	*bufio.Writer
	num [24]byte
}

func (w *replyWriter) status(s string) {
	w.WriteByte('+')
	w.WriteString(s)
	w.Write(crlf)
}

// error writes an error reply; msg starts with its code ("ERR ...").
// Newlines inside would end the reply early, so they become spaces, as in
// Redis.
func (w *replyWriter) error(msg string) {
	w.WriteByte('-')
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		w.WriteByte(c)
	}
	w.Write(crlf)
}

func (w *replyWriter) header(kind byte, n int64) {
	b := append(w.num[:0], kind)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, '\r', '\n')
	w.Write(b)
}

func (w *replyWriter) integer(n int64) { w.header(':', n) }
func (w *replyWriter) array(n int)     { w.header('*', int64(n)) }
func (w *replyWriter) null()           { w.WriteString("$-1\r\n") }

func (w *replyWriter) bulk(b []byte) {
	w.header('$', int64(len(b)))
	w.Write(b)
	w.Write(crlf)
}

func (w *replyWriter) bulkString(s string) {
	w.header('$', int64(len(s)))
	w.WriteString(s)
	w.Write(crlf)
}

// flushingReader flushes the pending replies before every read from the
// connection, that is, whenever the request reader has used up the bytes it
// holds and is about to wait for more. Replies to a pipelined batch thus go
// out together, in as few writes as the batch needs, and a reply is never
// held back while the server waits for a request that may depend on it (the
// rest of a request a client split is also waited for with the replies to
// the earlier ones sent).
type flushingReader struct {
	conn net.Conn
	w    *bufio.Writer
}

func (f *flushingReader) Read(p []byte) (int, error) {
	if f.w.Buffered() > 0 {
		if err := f.w.Flush(); err != nil {
			return 0, err
		}
	}
	return f.conn.Read(p)
}
