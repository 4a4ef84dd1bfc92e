package wire

import "encoding/binary"

// A link group's messages (internal/group; docs/protocol.md, "Link
// groups"): control messages on a link that carries many streams, between
// rdmanet peers that agreed on the group. Every control message on such a
// link names its stream in bytes 4-7 (a StreamTag, as the immediate of the
// stream's data writes does), which no other message uses; the group's own
// messages name stream 0 there, and the streams they are about in their
// fields.
const (
	// OpStreamOpen asks for a stream: From is the opener's tag for it,
	// Port the listener's port the stream is for, FromPort the opener's
	// port for it, RingSize and Grant the opener's receive ring and the
	// credit it gives first.
	OpStreamOpen Opcode = 0x7208
	// OpStreamAccept answers StreamOpen (To) with the acceptor's tag (From),
	// ring size and first grant. The acceptor's stream messages follow it.
	OpStreamAccept Opcode = 0x7209
	// OpStreamRefuse answers StreamOpen (To) with a Reason.
	OpStreamRefuse Opcode = 0x720a
	// OpStreamClose ends the stream To (the receiver's tag; From is the
	// sender's): the sender sends nothing more on it. Reason 0 is an
	// orderly end; any other, a failure the receiver's stream reports too.
	OpStreamClose Opcode = 0x720b
	// OpStreamClosed answers StreamClose: nothing more of the stream
	// follows it, so the receiver may give its rings back.
	OpStreamClosed Opcode = 0x720c
	// OpStreamMove moves the stream To (the receiver's tag; From is the
	// sender's) onto the link it arrives on, from the dialer of the group,
	// whose link it was on failed (Reason 0: the receiver drops that link
	// too) or is being left for this one (MoveRebalance: that link goes
	// on). Grant is the credit the receiver holds at first on the new
	// link. Both sides' engines then resume the stream (Resume).
	OpStreamMove Opcode = 0x720d
	// OpStreamMoved answers StreamMove: Reason 0 and the Grant the dialer
	// holds on the new link, or why the stream could not move (it fails).
	OpStreamMoved Opcode = 0x720e
)

// MoveRebalance is a StreamMove's Reason when the stream leaves a link
// that works (the dialer spreads its streams again, or moves them back to
// a path that healed).
const MoveRebalance = 1

// StreamTag names a stream on a group's link: its slot at the receiver
// (bits 8-31) and the slot's generation (bits 0-7, never 0), so that a
// message for a stream that ended is told from one for the stream that
// took its slot. 0 names the group.
type StreamTag uint32

// MakeStreamTag returns the tag of slot's generation gen (1-255).
func MakeStreamTag(slot uint32, gen uint8) StreamTag { return StreamTag(slot<<8 | uint32(gen)) }

// Slot and Gen are the tag's parts.
func (t StreamTag) Slot() uint32 { return uint32(t) >> 8 }
func (t StreamTag) Gen() uint8   { return uint8(t) }

// MaxStreamSlot is the largest slot a tag holds.
const MaxStreamSlot = 1<<24 - 1

// StreamOf returns the stream a control message names (bytes 4-7).
func StreamOf(b *[MessageSize]byte) StreamTag {
	return StreamTag(binary.BigEndian.Uint32(b[4:]))
}

// SetStream makes a control message name stream t.
func SetStream(b *[MessageSize]byte, t StreamTag) { binary.BigEndian.PutUint32(b[4:], uint32(t)) }

// IsGroupOp reports whether op is one of the group's own messages.
func IsGroupOp(op Opcode) bool { return op >= OpStreamOpen && op <= OpStreamMoved }

// Refusal and close reasons.
const (
	ReasonNone         = 0 // an orderly close
	ReasonNoListener   = 1 // Refuse: nothing listens on the port
	ReasonLimit        = 2 // Refuse: the peer's bound on streams or pooled memory
	ReasonMemory       = 3 // Refuse: no rings for the stream
	ReasonBacklog      = 4 // Refuse: the listener's accept queue is full
	ReasonRemoteAccess = 5 // Close: a write outside the peer's rings
	ReasonRNR          = 6 // Close: a message beyond the credit given
	ReasonProtocol     = 7 // Close: a stream message the protocol does not allow
	ReasonGone         = 8 // Moved: the stream ended before it could move
)

// GroupMessage is one decoded group message; which fields mean something
// depends on Op. In wire format (big-endian; docs/protocol.md):
//
//	bytes  StreamOpen          StreamAccept   StreamRefuse  StreamClose(d)  StreamMove(d)
//	0-1    opcode              opcode         opcode        opcode          opcode
//	2-3    Grant               Grant          0             0               Grant (0 if refused)
//	4-7    0 (the group)       0              0             0               0
//	8-11   Port, FromPort      To             To            To              To
//	12-15  From                From           0             From            From
//	16-19  RingSize            RingSize       Reason        Reason (Close)  Reason
//	20-23  RKey                RKey           0             0               0
//	24-31  Addr                Addr           0             0               0
//
// Addr, RKey and RingSize are the sender's receive ring for the stream,
// which the receiver's writes must stay inside.
type GroupMessage struct {
	Op       Opcode
	To, From StreamTag
	Port     uint16 // Open: the listener's port
	FromPort uint16 // Open: the opener's port for the stream
	Grant    uint16 // Open, Accept, Move, Moved: the credit the receiver holds at first
	RingSize uint32 // Open, Accept
	RKey     uint32 // Open, Accept
	Addr     uint64 // Open, Accept
	Reason   uint32 // Refuse, Close, Move, Moved
}

// Encode writes m in wire format; bytes 4-7 name the group (0).
func (m *GroupMessage) Encode(b *[MessageSize]byte) {
	*b = [MessageSize]byte{}
	be := binary.BigEndian
	be.PutUint16(b[0:], uint16(m.Op))
	be.PutUint32(b[12:], uint32(m.From))
	switch m.Op {
	case OpStreamOpen:
		be.PutUint16(b[8:], m.Port)
		be.PutUint16(b[10:], m.FromPort)
	default:
		be.PutUint32(b[8:], uint32(m.To))
	}
	switch m.Op {
	case OpStreamOpen, OpStreamAccept:
		be.PutUint16(b[2:], m.Grant)
		be.PutUint32(b[16:], m.RingSize)
		be.PutUint32(b[20:], m.RKey)
		be.PutUint64(b[24:], m.Addr)
	case OpStreamRefuse, OpStreamClose:
		be.PutUint32(b[16:], m.Reason)
	case OpStreamMove, OpStreamMoved:
		be.PutUint16(b[2:], m.Grant)
		be.PutUint32(b[16:], m.Reason)
	}
	if m.Op == OpStreamRefuse {
		be.PutUint32(b[12:], 0)
	}
}

// DecodeGroup reads a group message. One that names a stream in bytes
// 4-7, lacks a tag it needs (or has one of generation 0), or opens a
// stream with no ring or no credit, is a *ProtocolError.
func DecodeGroup(b *[MessageSize]byte) (GroupMessage, error) {
	be := binary.BigEndian
	m := GroupMessage{Op: Opcode(be.Uint16(b[0:])), From: StreamTag(be.Uint32(b[12:]))}
	if !IsGroupOp(m.Op) {
		return GroupMessage{}, protocolErrorf("opcode %v is not a group message", m.Op)
	}
	if t := StreamOf(b); t != 0 {
		return GroupMessage{}, protocolErrorf("%v names stream %#x", m.Op, uint32(t))
	}
	if m.Op == OpStreamOpen {
		m.Port, m.FromPort = be.Uint16(b[8:]), be.Uint16(b[10:])
	} else {
		m.To = StreamTag(be.Uint32(b[8:]))
	}
	// A refusal need not name the refuser's stream (there may be none).
	needTo, needFrom := m.Op != OpStreamOpen, m.Op != OpStreamRefuse && (m.Op != OpStreamMoved || be.Uint32(b[16:]) == ReasonNone)
	switch m.Op {
	case OpStreamOpen, OpStreamAccept:
		m.Grant = be.Uint16(b[2:])
		m.RingSize = be.Uint32(b[16:])
		m.RKey = be.Uint32(b[20:])
		m.Addr = be.Uint64(b[24:])
		if m.RingSize == 0 || m.Grant == 0 {
			return GroupMessage{}, protocolErrorf("%v with ring size %d and grant %d", m.Op, m.RingSize, m.Grant)
		}
	case OpStreamRefuse, OpStreamClose:
		m.Reason = be.Uint32(b[16:])
	case OpStreamMove, OpStreamMoved:
		m.Grant, m.Reason = be.Uint16(b[2:]), be.Uint32(b[16:])
		if m.Op == OpStreamMove && m.Reason > MoveRebalance {
			return GroupMessage{}, protocolErrorf("%v with reason %d", m.Op, m.Reason)
		}
		if (m.Grant == 0) != (m.Op == OpStreamMoved && m.Reason != ReasonNone) {
			return GroupMessage{}, protocolErrorf("%v with grant %d and reason %d", m.Op, m.Grant, m.Reason)
		}
	}
	if m.Op == OpStreamRefuse {
		m.From = 0 // not carried
	}
	if needTo && m.To.Gen() == 0 || needFrom && m.From.Gen() == 0 {
		return GroupMessage{}, protocolErrorf("%v with tags %#x and %#x", m.Op, uint32(m.To), uint32(m.From))
	}
	return m, nil
}
