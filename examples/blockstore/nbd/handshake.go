package nbd

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
)

// maxOptionData bounds an option's data the server reads; the options it
// knows need far less (an export name is at most 4 KiB). Longer data is
// read, discarded and answered NBD_REP_ERR_TOO_BIG.
const maxOptionData = 64 << 10

// handshake is the server's side of the fixed newstyle handshake on one
// connection: the greeting, then options until the client asks for the
// export (NBD_OPT_GO or NBD_OPT_EXPORT_NAME) or gives up.
type handshake struct {
	s        *Server
	r        *bufio.Reader
	w        *bufio.Writer
	noZeroes bool // the client set NBD_FLAG_C_NO_ZEROES
}

func newHandshake(s *Server, nc net.Conn) *handshake {
	return &handshake{s: s, r: bufio.NewReaderSize(nc, connBufferSize), w: bufio.NewWriterSize(nc, connBufferSize)}
}

// run returns true when the client enters the transmission phase, false
// when it aborted, and an error when the connection failed or the client
// broke the protocol so that it must be closed.
func (h *handshake) run() (bool, error) {
	var greeting [18]byte
	binary.BigEndian.PutUint64(greeting[0:], magicNBD)
	binary.BigEndian.PutUint64(greeting[8:], magicOption)
	binary.BigEndian.PutUint16(greeting[16:], flagFixedNewstyle|flagNoZeroes)
	h.w.Write(greeting[:])
	if err := h.w.Flush(); err != nil {
		return false, err
	}
	var cf [4]byte
	if _, err := io.ReadFull(h.r, cf[:]); err != nil {
		return false, err
	}
	// A client that did not set NBD_FLAG_C_FIXED_NEWSTYLE gets fixed
	// newstyle all the same, which the protocol allows; unknown flags must
	// close the connection.
	clientFlags := binary.BigEndian.Uint32(cf[:])
	if clientFlags&^(flagFixedNewstyle|flagNoZeroes) != 0 {
		return false, fmt.Errorf("nbd: unknown client flags %#x", clientFlags)
	}
	h.noZeroes = clientFlags&flagNoZeroes != 0

	var hb [optionHeaderSize]byte
	for {
		if _, err := io.ReadFull(h.r, hb[:]); err != nil {
			return false, err
		}
		opt, err := decodeOptionHeader(hb[:])
		if err != nil {
			return false, err
		}
		if opt.length > maxOptionData {
			if _, err := io.CopyN(io.Discard, h.r, int64(opt.length)); err != nil {
				return false, err
			}
			if opt.option == optExportName {
				return false, fmt.Errorf("nbd: NBD_OPT_EXPORT_NAME with %d bytes of name", opt.length)
			}
			if err := h.reply(opt.option, repErrTooBig, []byte("option data too long")); err != nil {
				return false, err
			}
			if err := h.w.Flush(); err != nil {
				return false, err
			}
			continue
		}
		data := make([]byte, opt.length)
		if _, err := io.ReadFull(h.r, data); err != nil {
			return false, err
		}
		transmit, done, err := h.option(opt.option, data)
		if err == nil {
			err = h.w.Flush()
		}
		if err != nil || done {
			return transmit, err
		}
	}
}

// option answers one option; done is true when the handshake is over.
func (h *handshake) option(option uint32, data []byte) (transmit, done bool, err error) {
	name := h.s.opts.ExportName
	switch option {
	case optExportName:
		// No error reply is possible here: an unknown name closes the
		// connection.
		if string(data) != name {
			return false, true, fmt.Errorf("nbd: NBD_OPT_EXPORT_NAME of unknown export %q", data)
		}
		var b [10 + zeroPadding]byte
		binary.BigEndian.PutUint64(b[0:], uint64(h.s.backend.Size()))
		binary.BigEndian.PutUint16(b[8:], uint16(h.s.flags))
		n := len(b)
		if h.noZeroes {
			n = 10
		}
		_, err := h.w.Write(b[:n])
		return true, true, err
	case optAbort:
		return false, true, h.reply(option, repAck, nil)
	case optList:
		if len(data) != 0 {
			return false, false, h.reply(option, repErrInvalid, []byte("NBD_OPT_LIST takes no data"))
		}
		entry := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
		if err := h.reply(option, repServer, append(entry, name...)); err != nil {
			return false, true, err
		}
		return false, false, h.reply(option, repAck, nil)
	case optInfo, optGo:
		g, ok := decodeGoRequest(data)
		if !ok {
			return false, false, h.reply(option, repErrInvalid, []byte("malformed NBD_OPT_INFO or NBD_OPT_GO"))
		}
		if g.name != name {
			return false, false, h.reply(option, repErrUnknown, []byte(fmt.Sprintf("no export named %q", g.name)))
		}
		if err := h.info(option, g.infos); err != nil {
			return false, true, err
		}
		if err := h.reply(option, repAck, nil); err != nil {
			return false, true, err
		}
		return option == optGo, option == optGo, nil
	case optStartTLS:
		return false, false, h.reply(option, repErrUnsup, []byte("TLS is not supported"))
	}
	// NBD_OPT_STRUCTURED_REPLY, meta contexts, extended headers and options
	// still to come.
	return false, false, h.reply(option, repErrUnsup, nil)
}

// info sends the NBD_REP_INFO replies of NBD_OPT_INFO and NBD_OPT_GO: the
// export's size and flags, which the client must get, and its block sizes,
// which the protocol lets a server send unasked (a client that knows the
// maximum payload does not send more); its name and description if asked.
func (h *handshake) info(option uint32, asked []uint16) error {
	if err := h.reply(option, repInfo, encodeInfoExport(uint64(h.s.backend.Size()), h.s.flags)); err != nil {
		return err
	}
	if err := h.reply(option, repInfo, encodeInfoBlockSize(minBlock, preferredBlock, h.s.opts.MaxPayload)); err != nil {
		return err
	}
	for _, kind := range asked {
		var err error
		switch kind {
		case infoName:
			err = h.reply(option, repInfo, encodeInfoString(infoName, h.s.opts.ExportName))
		case infoDescription:
			if h.s.opts.Description != "" {
				err = h.reply(option, repInfo, encodeInfoString(infoDescription, h.s.opts.Description))
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// reply sends an option reply.
func (h *handshake) reply(option, replyType uint32, data []byte) error {
	var b [optionReplyHeaderSize]byte
	encodeOptionReplyHeader(b[:], optionReplyHeader{option: option, replyType: replyType, length: uint32(len(data))})
	h.w.Write(b[:])
	_, err := h.w.Write(data)
	return err
}
