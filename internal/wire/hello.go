package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Hello is what an rdmanet peer puts in rdma_cm private data: in the connect
// request (what the client offers) and in the accept (what the server chose).
// Valkey ignores connect private data and sends none with its accept, so a
// peer without a Hello is a Valkey peer and gets exactly Valkey's protocol.
type Hello struct {
	Version  uint8
	Features Features
	// RecvDepth is how many receives the sender of the Hello keeps posted:
	// the other side's limit on messages and data writes in flight.
	RecvDepth uint16
	// RingSize is the size of the sender's receive ring, in bytes.
	RingSize uint32

	// The session, with FeatureResume (docs/protocol.md, "Resumable
	// sessions"). A dialer's first connect carries no session; the
	// server's accept names the one it made. A dialer's resume connect
	// (Resume) names the session and the generation it last had; the
	// server's accept gives the next generation.
	Resume     bool
	Session    SessionID
	Generation uint32
	// SendRing is the size of the sender's transmit ring, in bytes: what it
	// can retain, and so how often the peer must return credit.
	SendRing uint32
	// TCPPort, in a dialer's Hello, is the TCP source port it keeps for
	// resuming the session over TCP: a server tells such a connection from
	// a plain TCP client's by it, without waiting for its first bytes.
	TCPPort uint16

	// Needs are the link features (LinkFeatures) the sender's device
	// cannot work without, among those it offers: a dialer on an iWARP
	// device needs FeatureWriteNotice and FeatureRecvCredit. The server
	// uses a link feature when either side needs it.
	Needs Features

	// The group, with FeatureGroup (docs/protocol.md, "Link groups").
	// Process names the sender's process (random, for the process's life):
	// a dialer knows the same server behind several addresses by it, and
	// a link of a group must reach the process the group's first did.
	// Group, in a dialer's Hello, is the group the link joins (0: a new
	// one); in the server's accept, the group's id, which the dialer's
	// later links present.
	Process uint64
	Group   uint64
}

// SessionID names a resumable session: 128 random bits from crypto/rand,
// chosen by the server. Knowing it is what lets a connection resume the
// session, so it is never logged whole.
type SessionID [16]byte

// IsZero reports whether id names no session.
func (id SessionID) IsZero() bool { return id == SessionID{} }

// String is the first 4 bytes in hex: enough to tell sessions apart in a
// log, too little to resume one.
func (id SessionID) String() string { return fmt.Sprintf("%x…", id[:4]) }

// Features are the extensions a Hello offers or accepts. The values are
// on the wire: never renumber them.
type Features uint32

const (
	// FeatureRing: the receive buffer is a ring; the sender wraps, and the
	// receiver returns space and receives continuously with Credit messages
	// instead of re-registering the buffer once it is full.
	FeatureRing Features = 1 << iota
	// FeatureShutdown: Shutdown messages carry half-close (CloseWrite).
	FeatureShutdown
	// FeatureResume: the connection is a session that may move to another
	// link (another RDMA path, or TCP) and resume there with nothing lost.
	// It needs FeatureRing.
	FeatureResume
	// FeatureWriteNotice: data goes as an RDMA write followed by a Written
	// message saying how many bytes it wrote, not as a write with
	// immediate data, which iWARP devices do not have. A property of one
	// link: each link of a session agrees on it afresh.
	FeatureWriteNotice
	// FeatureRecvCredit: no message is sent without a receive posted for
	// it at the peer, which returns receives in Credit's Receives: iWARP
	// has no receiver-not-ready retry, so a message that finds no receive
	// ends the connection. It needs FeatureRing; a property of one link.
	FeatureRecvCredit
	// FeatureClose: a side that closes a session's connection says so
	// (Close) before its link ends, so that a link that ends without it
	// is a lost link, which the session resumes past, and not the peer
	// closing. It needs FeatureResume.
	FeatureClose
	// FeatureGrow: a receive ring may be replaced while the stream runs
	// (Ring, answered by RingAt), so a connection starts with small rings
	// and grows them as it streams (docs/protocol.md, "Rings that follow
	// traffic"). The Hello's RingSize is the first ring's size. It needs
	// FeatureRing. With FeatureResume, rings grow only on a link that
	// makes them (a group's stream); a session's keep their size.
	FeatureGrow
	// FeatureRecvGrant: with FeatureRecvCredit, a receiver may give back
	// more credit than the receives the peer's messages took, or less: a
	// receiver whose receives come from a pool shared by many connections
	// (a shared receive queue) grants them as the pool allows, and its
	// Hello's RecvDepth is its first grant, which it never takes back. A
	// Credit's Receives may then run ahead of the messages sent (the
	// credit held stays under 65,536). A property of one link.
	FeatureRecvGrant
	// FeatureGroup: the connection is the link of a group that carries
	// many streams (docs/protocol.md, "Link groups"): each data write's
	// immediate names its stream, and every control message names it in
	// bytes 4-7. It needs FeatureRing, FeatureRecvCredit and
	// FeatureRecvGrant (the streams' credit comes from the link's pool of
	// receives), and is not offered with FeatureResume.
	FeatureGroup
	// FeatureGroupMove: the group has a link per path and moves a failed
	// link's streams to another (StreamMove); its streams are resumable
	// (their engines speak Resume). It needs FeatureGroup.
	FeatureGroupMove
	// FeatureRetain: a resumable stream whose transmit ring grows and
	// shrinks (FeatureGrow) says its size each time it changes (Retain),
	// so that the peer credits every quarter of what it retains, not of
	// the first ring's size (the Hello's SendRing): a stream answering
	// 4 KiB requests sent a Credit of its own for each answer. It needs
	// FeatureGrow.
	FeatureRetain
	// FeatureEndAt: Shutdown and Close say where the sender's bytes end
	// (bytes 8-15: its running byte total, as RingAt's position), and the
	// receiver checks that every one of them arrived: a data write whose
	// arrival was lost ends the stream with a protocol error, not with an
	// EOF short of what was sent. It needs FeatureRing and FeatureShutdown.
	FeatureEndAt
	// FeatureOpenRing: a group's StreamOpen and StreamAccept announce the
	// ring each end's data lands in (they name it), so neither stream's
	// engine sends a RegisterXferMemory as it starts: an open, a request
	// and its answer, and a close take four messages, not eight. A ring
	// announced later (after a move, or grown) is announced as before. It
	// needs FeatureGroup.
	FeatureOpenRing
)

// LinkFeatures are the features that belong to one link rather than to the
// stream: a session's links may differ in them.
const LinkFeatures = FeatureWriteNotice | FeatureRecvCredit | FeatureRecvGrant

// HelloVersion is the version this package speaks.
const HelloVersion = 1

// helloMagic starts every Hello. It is distinctive enough that private data
// from another application is not mistaken for a Hello.
var helloMagic = [8]byte{'r', 'd', 'm', 'a', 'n', 'e', 't', 0}

// HelloSize is a Hello's encoded size, and SessionHelloSize its size with
// FeatureResume. Both fit the 56 bytes of private data that rdma_cm allows
// in an InfiniBand or RoCE connect request.
const (
	HelloSize        = 20
	SessionHelloSize = 48
	GroupHelloSize   = 38
)

// Flags in byte 9: the connect resumes the Hello's session (sessions only);
// the sender needs FeatureWriteNotice; it needs FeatureRecvCredit; it
// needs FeatureRecvGrant.
const (
	helloFlagResume     = 1
	helloFlagNeedNotice = 2
	helloFlagNeedCredit = 4
	helloFlagNeedGrant  = 8
)

// Encode returns h in wire format.
func (h Hello) Encode() []byte {
	size := HelloSizeOf(h.Features)
	b := make([]byte, size)
	copy(b, helloMagic[:])
	b[8] = h.Version
	be := binary.BigEndian
	be.PutUint32(b[10:], uint32(h.Features))
	be.PutUint16(b[14:], h.RecvDepth)
	be.PutUint32(b[16:], h.RingSize)
	if h.Needs&FeatureWriteNotice != 0 {
		b[9] |= helloFlagNeedNotice
	}
	if h.Needs&FeatureRecvCredit != 0 {
		b[9] |= helloFlagNeedCredit
	}
	if h.Needs&FeatureRecvGrant != 0 {
		b[9] |= helloFlagNeedGrant
	}
	if size == SessionHelloSize {
		if h.Resume {
			b[9] |= helloFlagResume
		}
		copy(b[20:36], h.Session[:])
		be.PutUint32(b[36:], h.Generation)
		be.PutUint32(b[40:], h.SendRing)
		be.PutUint16(b[44:], h.TCPPort)
	}
	if size == GroupHelloSize {
		be.PutUint64(b[20:], h.Process)
		be.PutUint64(b[28:], h.Group)
		be.PutUint16(b[36:], h.TCPPort)
	}
	return b
}

// HelloSizeOf is the size of a Hello that offers f: what a reader of a
// byte stream (a TCP resume or join) reads after the first HelloSize
// bytes told it f.
func HelloSizeOf(f Features) int {
	switch {
	case f&FeatureResume != 0:
		return SessionHelloSize
	case f&FeatureGroup != 0:
		return GroupHelloSize
	}
	return HelloSize
}

// HasHelloMagic reports whether b starts as every Hello does: how a
// listener tells a session's resume over TCP from a plain client's bytes.
func HasHelloMagic(b []byte) bool { return bytes.HasPrefix(b, helloMagic[:]) }

// StartsHelloMagic reports whether b, shorter than the magic, is its start.
func StartsHelloMagic(b []byte) bool { return bytes.HasPrefix(helloMagic[:], b) }

// HelloMagicSize is how many bytes HasHelloMagic needs.
const HelloMagicSize = len(helloMagic)

// DecodeHello reads a Hello from private data. ok is false when the data holds
// no Hello (a Valkey peer, or none at all); data that starts like a Hello but
// is malformed is a *ProtocolError. Bytes after the Hello are ignored: the
// transport pads private data with zeros.
func DecodeHello(data []byte) (h Hello, ok bool, err error) {
	if len(data) < len(helloMagic) || !bytes.Equal(data[:len(helloMagic)], helloMagic[:]) {
		return Hello{}, false, nil
	}
	if len(data) < HelloSize {
		return Hello{}, false, protocolErrorf("hello of %d bytes, want %d", len(data), HelloSize)
	}
	be := binary.BigEndian
	h = Hello{
		Version:   data[8],
		Features:  Features(be.Uint32(data[10:])),
		RecvDepth: be.Uint16(data[14:]),
		RingSize:  be.Uint32(data[16:]),
	}
	if h.Version == 0 {
		return Hello{}, false, protocolErrorf("hello version 0")
	}
	if h.RecvDepth == 0 {
		return Hello{}, false, protocolErrorf("hello with no receives")
	}
	if data[9]&helloFlagNeedNotice != 0 {
		h.Needs |= FeatureWriteNotice
	}
	if data[9]&helloFlagNeedCredit != 0 {
		h.Needs |= FeatureRecvCredit
	}
	if data[9]&helloFlagNeedGrant != 0 {
		h.Needs |= FeatureRecvGrant
	}
	if h.Needs&^h.Features != 0 {
		return Hello{}, false, protocolErrorf("hello needing features %#x it does not offer (%#x)", uint32(h.Needs), uint32(h.Features))
	}
	if h.Features&FeatureRecvCredit != 0 && h.Features&FeatureRing == 0 {
		return Hello{}, false, protocolErrorf("hello offering receive credit without the ring")
	}
	if h.Features&FeatureRecvGrant != 0 && h.Features&FeatureRecvCredit == 0 {
		return Hello{}, false, protocolErrorf("hello offering credit grants without receive credit")
	}
	if h.Features&FeatureGrow != 0 && h.Features&FeatureRing == 0 {
		return Hello{}, false, protocolErrorf("hello offering ring growth without the ring")
	}
	if need := FeatureRing | FeatureRecvCredit | FeatureRecvGrant; h.Features&FeatureGroup != 0 && h.Features&need != need {
		return Hello{}, false, protocolErrorf("hello offering a link group without the ring and credit grants")
	}
	if h.Features&FeatureGroup != 0 && h.Features&FeatureResume != 0 {
		return Hello{}, false, protocolErrorf("hello offering a link group and a session")
	}
	if h.Features&FeatureClose != 0 && h.Features&FeatureResume == 0 {
		return Hello{}, false, protocolErrorf("hello offering Close without sessions")
	}
	if h.Features&FeatureGroupMove != 0 && h.Features&FeatureGroup == 0 {
		return Hello{}, false, protocolErrorf("hello offering moves without a link group")
	}
	if h.Features&FeatureRetain != 0 && h.Features&FeatureGrow == 0 {
		return Hello{}, false, protocolErrorf("hello offering Retain without ring growth")
	}
	if need := FeatureRing | FeatureShutdown; h.Features&FeatureEndAt != 0 && h.Features&need != need {
		return Hello{}, false, protocolErrorf("hello offering end positions without the ring and half-close")
	}
	if h.Features&FeatureOpenRing != 0 && h.Features&FeatureGroup == 0 {
		return Hello{}, false, protocolErrorf("hello offering rings named by the open without a link group")
	}
	if h.Features&FeatureGroup != 0 {
		if len(data) < GroupHelloSize {
			return Hello{}, false, protocolErrorf("hello offering a link group in %d bytes, want %d", len(data), GroupHelloSize)
		}
		h.Process, h.Group = be.Uint64(data[20:]), be.Uint64(data[28:])
		h.TCPPort = be.Uint16(data[36:])
	}
	if h.Features&FeatureResume != 0 {
		if len(data) < SessionHelloSize {
			return Hello{}, false, protocolErrorf("hello offering sessions in %d bytes, want %d", len(data), SessionHelloSize)
		}
		if h.Features&FeatureRing == 0 {
			return Hello{}, false, protocolErrorf("hello offering sessions without the ring")
		}
		h.Resume = data[9]&helloFlagResume != 0
		copy(h.Session[:], data[20:36])
		h.Generation = be.Uint32(data[36:])
		h.SendRing = be.Uint32(data[40:])
		h.TCPPort = be.Uint16(data[44:])
		if h.SendRing == 0 {
			return Hello{}, false, protocolErrorf("hello offering sessions with no transmit ring")
		}
		if h.Resume && h.Session.IsZero() {
			return Hello{}, false, protocolErrorf("resume without a session")
		}
	}
	return h, true, nil
}
