package nbd

import (
	"encoding/binary"
	"fmt"
)

// The protocol's numbers, as the NBD protocol document (doc/proto.md in the
// NetworkBlockDevice/nbd repository) names them. Every integer on the wire
// is big-endian.

// Magic numbers.
const (
	magicNBD          = 0x4e42444d41474943 // "NBDMAGIC", the server's first 8 bytes
	magicOption       = 0x49484156454f5054 // "IHAVEOPT", newstyle; also starts each option
	magicOldstyle     = 0x00420281861253   // in place of IHAVEOPT: an oldstyle server
	magicOptionReply  = 0x0003e889045565a9
	magicRequest      = 0x25609513
	magicSimpleReply  = 0x67446698
	magicStructReply  = 0x668e33ef // structured replies, which this package does not negotiate
	zeroPadding       = 124        // zero bytes after NBD_OPT_EXPORT_NAME's reply, unless NO_ZEROES
	requestHeaderSize = 28
	replyHeaderSize   = 16
)

// Handshake flags (server) and client flags.
const (
	flagFixedNewstyle = 1 << 0
	flagNoZeroes      = 1 << 1
)

// Options a client sends during the handshake.
const (
	optExportName      = 1
	optAbort           = 2
	optList            = 3
	optStartTLS        = 5
	optInfo            = 6
	optGo              = 7
	optStructuredReply = 8
)

// Option reply types; errors have bit 31 set.
const (
	repAck    = 1
	repServer = 2
	repInfo   = 3

	repFlagError    = 1 << 31
	repErrUnsup     = repFlagError | 1
	repErrPolicy    = repFlagError | 2
	repErrInvalid   = repFlagError | 3
	repErrPlatform  = repFlagError | 4
	repErrTLSReqd   = repFlagError | 5
	repErrUnknown   = repFlagError | 6
	repErrShutdown  = repFlagError | 7
	repErrBlockSize = repFlagError | 8
	repErrTooBig    = repFlagError | 9
)

// Information types in NBD_REP_INFO replies to NBD_OPT_INFO and NBD_OPT_GO.
const (
	infoExport      = 0
	infoName        = 1
	infoDescription = 2
	infoBlockSize   = 3
)

// TransmissionFlags describe an export and what it supports; the server sends
// them at the end of the handshake.
type TransmissionFlags uint16

// Transmission flags.
const (
	FlagHasFlags        TransmissionFlags = 1 << 0
	FlagReadOnly        TransmissionFlags = 1 << 1
	FlagSendFlush       TransmissionFlags = 1 << 2
	FlagSendFUA         TransmissionFlags = 1 << 3
	FlagRotational      TransmissionFlags = 1 << 4
	FlagSendTrim        TransmissionFlags = 1 << 5
	FlagSendWriteZeroes TransmissionFlags = 1 << 6
	FlagSendDF          TransmissionFlags = 1 << 7
	FlagCanMultiConn    TransmissionFlags = 1 << 8
)

// Command is a request's type.
type Command uint16

// Commands.
const (
	CmdRead        Command = 0
	CmdWrite       Command = 1
	CmdDisc        Command = 2
	CmdFlush       Command = 3
	CmdTrim        Command = 4
	CmdCache       Command = 5
	CmdWriteZeroes Command = 6
	CmdBlockStatus Command = 7
)

func (c Command) String() string {
	switch c {
	case CmdRead:
		return "READ"
	case CmdWrite:
		return "WRITE"
	case CmdDisc:
		return "DISC"
	case CmdFlush:
		return "FLUSH"
	case CmdTrim:
		return "TRIM"
	case CmdCache:
		return "CACHE"
	case CmdWriteZeroes:
		return "WRITE_ZEROES"
	case CmdBlockStatus:
		return "BLOCK_STATUS"
	}
	return fmt.Sprintf("command %d", uint16(c))
}

// CommandFlags modify a request.
type CommandFlags uint16

// Command flags.
const (
	// FlagFUA (force unit access): the reply to a write, trim or write-zeroes
	// comes only once its data is on stable storage.
	FlagFUA CommandFlags = 1 << 0
	// FlagNoHole: a write-zeroes must leave the range allocated.
	FlagNoHole CommandFlags = 1 << 1
	// FlagDF: a structured read reply in one chunk (not negotiated here).
	FlagDF CommandFlags = 1 << 2
)

// Errno is the error code of a reply: the protocol's small set, numbered as
// Linux's errno values.
type Errno uint32

// The errors the protocol defines.
const (
	EPERM     Errno = 1
	EIO       Errno = 5
	ENOMEM    Errno = 12
	EINVAL    Errno = 22
	ENOSPC    Errno = 28
	EOVERFLOW Errno = 75
	ENOTSUP   Errno = 95
	ESHUTDOWN Errno = 108
)

func (e Errno) Error() string {
	switch e {
	case EPERM:
		return "nbd: operation not permitted (EPERM)"
	case EIO:
		return "nbd: input/output error (EIO)"
	case ENOMEM:
		return "nbd: cannot allocate memory (ENOMEM)"
	case EINVAL:
		return "nbd: invalid argument (EINVAL)"
	case ENOSPC:
		return "nbd: no space left on device (ENOSPC)"
	case EOVERFLOW:
		return "nbd: value too large (EOVERFLOW)"
	case ENOTSUP:
		return "nbd: operation not supported (ENOTSUP)"
	case ESHUTDOWN:
		return "nbd: server shutting down (ESHUTDOWN)"
	}
	return fmt.Sprintf("nbd: error %d", uint32(e))
}

// request is a transmission-phase request header; a write's data follows it
// on the wire.
type request struct {
	flags  CommandFlags
	cmd    Command
	handle uint64
	offset uint64
	length uint32
}

// encodeRequest puts r's header into b[:requestHeaderSize].
func encodeRequest(b []byte, r request) {
	be := binary.BigEndian
	be.PutUint32(b[0:], magicRequest)
	be.PutUint16(b[4:], uint16(r.flags))
	be.PutUint16(b[6:], uint16(r.cmd))
	be.PutUint64(b[8:], r.handle)
	be.PutUint64(b[16:], r.offset)
	be.PutUint32(b[24:], r.length)
}

// errBadMagic: the stream is not (or no longer) NBD; its framing is lost, so
// the only answer is to hang up.
type errBadMagic struct {
	what string
	got  uint64
}

func (e errBadMagic) Error() string {
	return fmt.Sprintf("nbd: bad %s magic %#x", e.what, e.got)
}

// decodeRequest reads a request header from b[:requestHeaderSize].
func decodeRequest(b []byte) (request, error) {
	be := binary.BigEndian
	if m := be.Uint32(b[0:]); m != magicRequest {
		return request{}, errBadMagic{"request", uint64(m)}
	}
	return request{
		flags:  CommandFlags(be.Uint16(b[4:])),
		cmd:    Command(be.Uint16(b[6:])),
		handle: be.Uint64(b[8:]),
		offset: be.Uint64(b[16:]),
		length: be.Uint32(b[24:]),
	}, nil
}

// encodeSimpleReply puts a simple reply's header into b[:replyHeaderSize];
// a successful read's data follows it.
func encodeSimpleReply(b []byte, errno Errno, handle uint64) {
	be := binary.BigEndian
	be.PutUint32(b[0:], magicSimpleReply)
	be.PutUint32(b[4:], uint32(errno))
	be.PutUint64(b[8:], handle)
}

// simpleReply is a decoded simple reply header.
type simpleReply struct {
	errno  Errno
	handle uint64
}

func decodeSimpleReply(b []byte) (simpleReply, error) {
	be := binary.BigEndian
	if m := be.Uint32(b[0:]); m != magicSimpleReply {
		return simpleReply{}, errBadMagic{"reply", uint64(m)}
	}
	return simpleReply{errno: Errno(be.Uint32(b[4:])), handle: be.Uint64(b[8:])}, nil
}

// Option haggling messages: an option's header (IHAVEOPT, option, length)
// and an option reply's header (magic, option, type, length).
const (
	optionHeaderSize      = 16
	optionReplyHeaderSize = 20
)

type optionHeader struct {
	option uint32
	length uint32
}

func encodeOptionHeader(b []byte, h optionHeader) {
	be := binary.BigEndian
	be.PutUint64(b[0:], magicOption)
	be.PutUint32(b[8:], h.option)
	be.PutUint32(b[12:], h.length)
}

func decodeOptionHeader(b []byte) (optionHeader, error) {
	be := binary.BigEndian
	if m := be.Uint64(b[0:]); m != magicOption {
		return optionHeader{}, errBadMagic{"option", m}
	}
	return optionHeader{option: be.Uint32(b[8:]), length: be.Uint32(b[12:])}, nil
}

type optionReplyHeader struct {
	option    uint32
	replyType uint32
	length    uint32
}

func encodeOptionReplyHeader(b []byte, h optionReplyHeader) {
	be := binary.BigEndian
	be.PutUint64(b[0:], magicOptionReply)
	be.PutUint32(b[8:], h.option)
	be.PutUint32(b[12:], h.replyType)
	be.PutUint32(b[16:], h.length)
}

func decodeOptionReplyHeader(b []byte) (optionReplyHeader, error) {
	be := binary.BigEndian
	if m := be.Uint64(b[0:]); m != magicOptionReply {
		return optionReplyHeader{}, errBadMagic{"option reply", m}
	}
	return optionReplyHeader{option: be.Uint32(b[8:]), replyType: be.Uint32(b[12:]), length: be.Uint32(b[16:])}, nil
}

// goRequest is the data of NBD_OPT_INFO and NBD_OPT_GO: an export name and
// the information types the client asks for.
type goRequest struct {
	name  string
	infos []uint16
}

// maxNameLength is the protocol's bound on a string (an export name).
const maxNameLength = 4096

func encodeGoRequest(g goRequest) []byte {
	b := make([]byte, 0, 4+len(g.name)+2+2*len(g.infos))
	b = binary.BigEndian.AppendUint32(b, uint32(len(g.name)))
	b = append(b, g.name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(g.infos)))
	for _, i := range g.infos {
		b = binary.BigEndian.AppendUint16(b, i)
	}
	return b
}

// decodeGoRequest parses NBD_OPT_INFO's or NBD_OPT_GO's data; ok is false if
// its lengths do not add up to exactly len(b).
func decodeGoRequest(b []byte) (g goRequest, ok bool) {
	be := binary.BigEndian
	if len(b) < 6 {
		return g, false
	}
	n := uint64(be.Uint32(b))
	if n > maxNameLength || 4+n+2 > uint64(len(b)) {
		return g, false
	}
	g.name = string(b[4 : 4+n])
	rest := b[4+n:]
	count := int(be.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 2*count {
		return g, false
	}
	for i := range count {
		g.infos = append(g.infos, be.Uint16(rest[2*i:]))
	}
	return g, true
}

// ExportInfo describes what the handshake told a client about an export.
type ExportInfo struct {
	Size  uint64
	Flags TransmissionFlags
	// The block sizes the server asked for (NBD_INFO_BLOCK_SIZE), or zero if
	// it did not say: requests should be multiples of MinBlock, are best
	// multiples of PreferredBlock, and must carry at most MaxPayload bytes.
	MinBlock, PreferredBlock, MaxPayload uint32
}

func encodeInfoExport(size uint64, flags TransmissionFlags) []byte {
	b := binary.BigEndian.AppendUint16(nil, infoExport)
	b = binary.BigEndian.AppendUint64(b, size)
	return binary.BigEndian.AppendUint16(b, uint16(flags))
}

func encodeInfoBlockSize(min, preferred, max uint32) []byte {
	b := binary.BigEndian.AppendUint16(nil, infoBlockSize)
	b = binary.BigEndian.AppendUint32(b, min)
	b = binary.BigEndian.AppendUint32(b, preferred)
	return binary.BigEndian.AppendUint32(b, max)
}

func encodeInfoString(kind uint16, s string) []byte {
	return append(binary.BigEndian.AppendUint16(nil, kind), s...)
}

// decodeInfo applies one NBD_REP_INFO's data to e; ok is false if it is
// malformed. Types it does not know are skipped, as the protocol asks.
func decodeInfo(b []byte, e *ExportInfo) (gotExport, ok bool) {
	be := binary.BigEndian
	if len(b) < 2 {
		return false, false
	}
	switch be.Uint16(b) {
	case infoExport:
		if len(b) != 12 {
			return false, false
		}
		e.Size = be.Uint64(b[2:])
		e.Flags = TransmissionFlags(be.Uint16(b[10:]))
		return true, true
	case infoBlockSize:
		if len(b) != 14 {
			return false, false
		}
		e.MinBlock, e.PreferredBlock, e.MaxPayload = be.Uint32(b[2:]), be.Uint32(b[6:]), be.Uint32(b[10:])
	}
	return false, true
}
