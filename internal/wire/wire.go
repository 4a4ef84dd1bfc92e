// Package wire encodes and decodes rdmanet's RDMA wire protocol: Valkey's RDMA
// transport (32-byte control messages sent with IBV_WR_SEND, data as RDMA
// writes with immediate), plus rdmanet's extensions, which two rdmanet peers
// agree on through rdma_cm private data (Hello) and which are never sent to a
// peer that did not agree. docs/protocol.md describes both.
//
// Everything here is pure Go, with no I/O, so it is tested and fuzzed without
// RDMA. A malformed message is a *ProtocolError, never a panic.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// MessageSize is the size of every control message.
const MessageSize = 32

// Opcode is a control message's type (bytes 0-1, big-endian).
type Opcode uint16

// Valkey's opcodes.
const (
	OpGetServerFeature   Opcode = 0
	OpSetClientFeature   Opcode = 1
	OpKeepalive          Opcode = 2
	OpRegisterXferMemory Opcode = 3
)

// rdmanet's extension opcodes, valid only between peers that negotiated them.
const (
	// OpCredit returns receive capacity to the sender in ring mode: the total
	// bytes consumed from the ring so far and the receives reposted so far.
	OpCredit Opcode = 0x7201
	// OpShutdown says the sender will send no more data (CloseWrite).
	OpShutdown Opcode = 0x7202
	// OpResume opens a resumed session's new link: the running totals of
	// bytes the sender received and consumed, so that the peer sends again
	// what did not arrive.
	OpResume Opcode = 0x7203
	// OpWritten follows each data write on a link with FeatureWriteNotice:
	// the write before it put Length bytes into the receiver's ring. The
	// link turns it into the arrival of those bytes, as a write with
	// immediate data would have announced them.
	OpWritten Opcode = 0x7204
	// OpClose, with FeatureClose, says the sender closed the connection:
	// nothing follows it, and the end of the link that comes next is the
	// end of the session. Without it, a session's link that ends was
	// lost, not closed, and the session resumes.
	OpClose Opcode = 0x7205
	// OpRing, with FeatureGrow, offers the peer a new receive ring (Addr,
	// Length, RKey) in place of the one it writes into: larger while the
	// stream is busy, smaller once it is idle. The peer answers with
	// OpRingAt; one offer at a time.
	OpRing Opcode = 0x7206
	// OpRingAt, with FeatureGrow, answers OpRing: the sender's stream bytes
	// from position At on (a running total, as Credit's) go into the
	// offered ring, each at its position modulo the ring's size (as in
	// every ring); those before At went into the old one.
	// It follows every write before At and precedes every write after, so
	// once it arrived nothing more lands in the old ring.
	OpRingAt Opcode = 0x7207
	// OpRetain, with FeatureRetain, says that the sender's transmit ring
	// is now Length bytes: what a resumable sender retains until the peer
	// credits it. The peer credits every quarter of it (and of its own
	// receive ring, whichever is smaller) from then on, in place of the
	// Hello's SendRing, which is only the first ring's size.
	OpRetain Opcode = 0x7210
)

func (o Opcode) String() string {
	switch o {
	case OpGetServerFeature:
		return "GetServerFeature"
	case OpSetClientFeature:
		return "SetClientFeature"
	case OpKeepalive:
		return "Keepalive"
	case OpRegisterXferMemory:
		return "RegisterXferMemory"
	case OpCredit:
		return "Credit"
	case OpShutdown:
		return "Shutdown"
	case OpResume:
		return "Resume"
	case OpWritten:
		return "Written"
	case OpClose:
		return "Close"
	case OpRing:
		return "Ring"
	case OpRingAt:
		return "RingAt"
	case OpRetain:
		return "Retain"
	case OpStreamOpen:
		return "StreamOpen"
	case OpStreamAccept:
		return "StreamAccept"
	case OpStreamRefuse:
		return "StreamRefuse"
	case OpStreamClose:
		return "StreamClose"
	case OpStreamClosed:
		return "StreamClosed"
	case OpStreamMove:
		return "StreamMove"
	case OpStreamMoved:
		return "StreamMoved"
	}
	return fmt.Sprintf("Opcode(%#x)", uint16(o))
}

// Message is one decoded control message. Which fields mean something depends
// on Op; the rest are zero.
type Message struct {
	Op Opcode

	// GetServerFeature, SetClientFeature.
	Select   uint16
	Features uint64

	// RegisterXferMemory: the sender's receive buffer. Written: the bytes
	// the write before it put into the ring (Length).
	Addr   uint64
	Length uint32
	RKey   uint32

	// Credit and Resume: running totals since the connection began.
	ConsumedBytes uint64
	Receives      uint32 // Credit
	// Resume: the running total of bytes received (arrived, read or not).
	ReceivedBytes uint64
	// RingAt: the stream position from which bytes go to the offered ring.
	// Shutdown and Close, with FeatureEndAt: where the sender's bytes end.
	At uint64
}

// ErrProtocol is matched (errors.Is) by every *ProtocolError.
var ErrProtocol = errors.New("rdmanet: protocol error")

// ProtocolError is a message or event the protocol does not allow. The
// connection it arrived on cannot continue.
type ProtocolError struct {
	Reason string
}

func (e *ProtocolError) Error() string     { return "rdmanet: protocol error: " + e.Reason }
func (e *ProtocolError) Is(err error) bool { return err == ErrProtocol }

func protocolErrorf(format string, args ...any) error {
	return &ProtocolError{Reason: fmt.Sprintf(format, args...)}
}

// Encode writes m into b in wire format; reserved bytes are zero.
func (m *Message) Encode(b *[MessageSize]byte) {
	*b = [MessageSize]byte{}
	be := binary.BigEndian
	be.PutUint16(b[0:], uint16(m.Op))
	switch m.Op {
	case OpGetServerFeature, OpSetClientFeature:
		be.PutUint16(b[2:], m.Select)
		be.PutUint64(b[24:], m.Features)
	case OpRegisterXferMemory, OpRing:
		be.PutUint64(b[16:], m.Addr)
		be.PutUint32(b[24:], m.Length)
		be.PutUint32(b[28:], m.RKey)
	case OpRingAt, OpShutdown, OpClose:
		be.PutUint64(b[8:], m.At)
	case OpCredit:
		be.PutUint64(b[16:], m.ConsumedBytes)
		be.PutUint32(b[24:], m.Receives)
	case OpResume:
		be.PutUint64(b[8:], m.ReceivedBytes)
		be.PutUint64(b[16:], m.ConsumedBytes)
	case OpWritten, OpRetain:
		be.PutUint32(b[24:], m.Length)
	}
}

// Decode reads one control message. extended says whether rdmanet's extension
// opcodes were negotiated; without it they are unknown opcodes, as for Valkey.
// Reserved bytes are ignored, as Valkey ignores them.
func Decode(b []byte, extended bool) (Message, error) {
	if len(b) != MessageSize {
		return Message{}, protocolErrorf("control message of %d bytes, want %d", len(b), MessageSize)
	}
	be := binary.BigEndian
	m := Message{Op: Opcode(be.Uint16(b[0:]))}
	switch m.Op {
	case OpGetServerFeature, OpSetClientFeature:
		m.Select = be.Uint16(b[2:])
		m.Features = be.Uint64(b[24:])
	case OpKeepalive:
	case OpRegisterXferMemory:
		m.Addr = be.Uint64(b[16:])
		m.Length = be.Uint32(b[24:])
		m.RKey = be.Uint32(b[28:])
	case OpCredit, OpShutdown, OpResume, OpWritten, OpClose, OpRing, OpRingAt, OpRetain:
		if !extended {
			return Message{}, protocolErrorf("opcode %v without the rdmanet extension", m.Op)
		}
		switch m.Op {
		case OpCredit:
			m.ConsumedBytes = be.Uint64(b[16:])
			m.Receives = be.Uint32(b[24:])
		case OpResume:
			m.ReceivedBytes = be.Uint64(b[8:])
			m.ConsumedBytes = be.Uint64(b[16:])
		case OpWritten, OpRetain:
			m.Length = be.Uint32(b[24:])
		case OpRing:
			m.Addr = be.Uint64(b[16:])
			m.Length = be.Uint32(b[24:])
			m.RKey = be.Uint32(b[28:])
		case OpRingAt, OpShutdown, OpClose:
			m.At = be.Uint64(b[8:])
		}
	default:
		return Message{}, protocolErrorf("unknown opcode %#x", uint16(m.Op))
	}
	return m, nil
}
