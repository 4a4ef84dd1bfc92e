package tcplink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

var be = binary.BigEndian

// The reader: it takes frames from the socket until the link ends.

func (l *Link) read() {
	defer close(l.readerDone)
	for {
		if l.br.Buffered() == 0 {
			// What one read gave is used up, and the next may block: the
			// peer learns what landed so far.
			l.publishAck()
		}
		t, err := l.br.ReadByte()
		if err != nil {
			l.readFailed(err)
			return
		}
		var more bool
		switch {
		case t == frameData && !l.cfg.Carrier:
			more = l.readData()
		case t == frameTagged && l.cfg.Carrier:
			more = l.readTagged()
		case t == frameData || t == frameTagged:
			// Both ends set Config.Carrier the same: a data frame of the
			// other kind says that they did not.
			l.mu.Lock()
			if l.cfg.Carrier {
				l.protocolErrorLocked("a data frame without a tag (%#x) on a link in carrier mode", t)
			} else {
				l.protocolErrorLocked("a tagged data frame (%#x) on a link not in carrier mode", t)
			}
			l.mu.Unlock()
		case t == frameControl:
			more = l.readControl()
		case t == frameMarker:
			more = l.readMarker()
		case t == frameAck:
			more = l.readAck()
		case t == frameDisconnect:
			l.mu.Lock()
			l.endLocked(link.Completion{Kind: link.Disconnected})
			l.mu.Unlock()
		case t == frameAbort:
			more = l.readAbort()
		default:
			l.mu.Lock()
			l.protocolErrorLocked("frame type %#x", t)
			l.mu.Unlock()
		}
		if !more {
			return
		}
	}
}

// readFull reads len(b) bytes, or ends the link with the socket's error.
func (l *Link) readFull(b []byte) bool {
	if _, err := io.ReadFull(l.br, b); err != nil {
		l.readFailed(err)
		return false
	}
	return true
}

func (l *Link) readData() bool {
	h := l.hdr[:dataHeader-1]
	if !l.readFull(h) {
		return false
	}
	rkey, addr, n := be.Uint32(h[0:]), be.Uint64(h[4:]), be.Uint32(h[12:])
	off, ok := l.ringOffset(addr, rkey, n)
	if !ok {
		l.remoteAccess(l.outsideError("data", addr, rkey, n))
		return false
	}
	if !l.takeRecv() {
		return false
	}
	// The bytes land in the ring as they arrive.
	if !l.readFull(l.cfg.RecvRing[off : off+uint64(n)]) {
		return false
	}
	return l.arrived(link.Completion{Kind: link.DataArrived, N: n})
}

// readTagged takes a Tagged data frame (carrier mode). Its payload goes
// through the reader's buffer: each piece is copied into the ring under
// the lock, once the ring is found still registered, so that nothing
// lands in a ring after ReleaseRecvRing returned, even while the rest of
// a payload is on its way. A ring released under a payload is the peer's
// remote access error: an honest peer writes into a ring only while the
// engine holds it.
func (l *Link) readTagged() bool {
	h := l.hdr[:taggedHeader-1]
	if !l.readFull(h) {
		return false
	}
	rkey, addr, tag, n := be.Uint32(h[0:]), be.Uint64(h[4:]), be.Uint32(h[12:]), be.Uint32(h[16:])
	l.mu.Lock()
	r, off, ok := l.recvRingAtLocked(addr, rkey, n)
	if !ok {
		l.remoteAccessLocked(l.outsideError("data", addr, rkey, n))
		l.mu.Unlock()
		return false
	}
	l.mu.Unlock()
	if !l.takeRecv() {
		return false
	}
	for left := uint64(n); ; {
		l.mu.Lock()
		switch {
		case l.down || l.closed:
			l.mu.Unlock()
			return false
		case !l.ringLiveLocked(rkey, r):
			l.remoteAccessLocked(fmt.Errorf("tcplink: %s: the peer's data request wrote [%#x, +%d) with key %#x, a ring released before all of it landed: %w",
				l.cfg.Name, addr, n, rkey, link.ErrRemoteAccess))
			l.mu.Unlock()
			return false
		case left == 0:
			l.landed++
			l.push(link.Completion{Kind: link.DataArrived, N: n, Tag: tag}, 0)
			l.mu.Unlock()
			return true
		}
		k := min(left, uint64(l.br.Buffered()))
		p, _ := l.br.Peek(int(k))
		copy(r.mem[off:], p)
		l.landing += k
		l.mu.Unlock()
		l.br.Discard(int(k))
		off += k
		left -= k
		if left > 0 && l.br.Buffered() == 0 {
			// The next read may block: the peer learns what landed
			// before this frame.
			l.publishAck()
			if _, err := l.br.Peek(1); err != nil {
				l.readFailed(err)
				return false
			}
		}
	}
}

func (l *Link) readControl() bool {
	if !l.readFull(l.hdr[:wire.MessageSize]) {
		return false
	}
	if !l.takeRecv() {
		return false
	}
	c := link.Completion{Kind: link.ControlArrived}
	copy(c.Msg[:], l.hdr[:])
	return l.arrived(c)
}

func (l *Link) readMarker() bool {
	h := l.hdr[:12]
	if !l.readFull(h) {
		return false
	}
	rkey, addr := be.Uint32(h[0:]), be.Uint64(h[4:])
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down || l.closed {
		return false
	}
	ok := false
	if l.cfg.Carrier {
		_, _, ok = l.recvRingAtLocked(addr, rkey, 0)
	} else {
		_, ok = l.ringOffset(addr, rkey, 0)
	}
	if !ok {
		l.remoteAccessLocked(l.outsideError("marker", addr, rkey, 0))
		return false
	}
	l.landed++
	return true
}

func (l *Link) readAck() bool {
	h := l.hdr[:8]
	if !l.readFull(h) {
		return false
	}
	count := be.Uint64(h)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down || l.closed {
		return false
	}
	if count < l.acked || count > l.handed {
		l.protocolErrorLocked("ack of %d requests after %d acknowledged, with %d written", count, l.acked, l.handed)
		return false
	}
	l.complete(count)
	return true
}

func (l *Link) readAbort() bool {
	h := l.hdr[:9]
	if !l.readFull(h) {
		return false
	}
	count, code := be.Uint64(h), h[8]
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down || l.closed {
		return false
	}
	if count < l.acked || count > l.handed {
		l.protocolErrorLocked("abort after %d requests, with %d acknowledged and %d written", count, l.acked, l.handed)
		return false
	}
	switch code {
	case abortRemoteAccess:
		if count == l.handed {
			l.protocolErrorLocked("remote access error after all %d requests written", count)
			return false
		}
		l.complete(count)
		wr := &l.reqs[(count+1)%uint64(len(l.reqs))]
		l.endLocked(link.Completion{Kind: link.Failed, Err: fmt.Errorf(
			"tcplink: %s: %v request ID %d failed: the peer refused it: %w", l.cfg.Name, wr.Kind, wr.ID, link.ErrRemoteAccess)})
	case abortProtocol:
		l.complete(count)
		l.endLocked(link.Completion{Kind: link.Failed, Err: &wire.ProtocolError{
			Reason: fmt.Sprintf("tcplink: %s: the peer found a malformed frame from this end", l.cfg.Name)}})
	default:
		l.protocolErrorLocked("abort code %d", code)
	}
	return false
}

// complete takes the peer's cumulative count of requests it took: the
// signaled ones among them complete. l.mu is held.
func (l *Link) complete(count uint64) {
	for s := l.acked + 1; s <= count; s++ {
		if wr := &l.reqs[s%uint64(len(l.reqs))]; wr.Signaled {
			l.push(link.Completion{Kind: link.SendDone, ID: wr.ID}, s)
		}
	}
	l.acked = count
}

// ringOffset checks a write of n bytes at addr with rkey against this end's
// announced ring and returns its offset in the ring.
func (l *Link) ringOffset(addr uint64, rkey uint32, n uint32) (uint64, bool) {
	if rkey != l.rkey || addr < RingAddr {
		return 0, false
	}
	off, size := addr-RingAddr, uint64(len(l.cfg.RecvRing))
	if off > size || uint64(n) > size-off {
		return 0, false
	}
	return off, true
}

// takeRecv consumes a posted receive for a message, waiting for one if
// none is: the reader reads nothing more meanwhile. It reports false when
// the link ended instead.
func (l *Link) takeRecv() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.recvPosted == 0 {
		l.rnrWaits++
	}
	for l.recvPosted == 0 && !l.down && !l.closed && !l.peerGone {
		// What landed before this message is acknowledged now, not when
		// a receive is posted.
		l.publishAckLocked()
		l.recvCond.Wait()
	}
	switch {
	case l.down || l.closed:
		return false
	case l.recvPosted == 0:
		// The writer found the peer gone: this message never lands.
		l.endLocked(link.Completion{Kind: link.Disconnected})
		return false
	}
	l.recvPosted--
	return true
}

// arrived reports a message that landed.
func (l *Link) arrived(c link.Completion) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down || l.closed {
		return false
	}
	l.landed++
	l.push(c, 0)
	return true
}

func (l *Link) publishAck() {
	l.mu.Lock()
	l.publishAckLocked()
	l.mu.Unlock()
}

// publishAckLocked has the writer acknowledge what landed. l.mu is held.
func (l *Link) publishAckLocked() {
	if l.landed > l.ackWanted {
		l.ackWanted = l.landed
		l.writeCond.Signal()
	}
}

// remoteAccess fails the link with err for a request of the peer's outside
// the rings or with a wrong key, and has the writer tell the peer.
func (l *Link) remoteAccess(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.remoteAccessLocked(err)
}

// remoteAccessLocked is remoteAccess with l.mu held.
func (l *Link) remoteAccessLocked(err error) {
	if l.down || l.closed {
		return
	}
	l.abort, l.abortCode, l.abortCount = true, abortRemoteAccess, l.landed
	l.endLocked(link.Completion{Kind: link.Failed, Err: err})
}

// outsideError is the remote access error of a request of the peer's that
// named a range in none of the rings.
func (l *Link) outsideError(kind string, addr uint64, rkey, n uint32) error {
	if l.cfg.Carrier {
		return fmt.Errorf("tcplink: %s: the peer's %s request wrote [%#x, +%d) with key %#x, in none of this end's rings: %w",
			l.cfg.Name, kind, addr, n, rkey, link.ErrRemoteAccess)
	}
	return fmt.Errorf("tcplink: %s: the peer's %s request wrote [%#x, +%d) with key %#x, the ring is [%#x, +%d) with key %#x: %w",
		l.cfg.Name, kind, addr, n, rkey, uint64(RingAddr), len(l.cfg.RecvRing), l.rkey, link.ErrRemoteAccess)
}

// protocolErrorLocked fails the link for a malformed frame from the peer,
// and has the writer tell the peer. l.mu is held.
func (l *Link) protocolErrorLocked(format string, args ...any) {
	if l.down || l.closed {
		return
	}
	l.abort, l.abortCode, l.abortCount = true, abortProtocol, l.landed
	l.endLocked(link.Completion{Kind: link.Failed, Err: &wire.ProtocolError{
		Reason: fmt.Sprintf("tcplink: %s: %s", l.cfg.Name, fmt.Sprintf(format, args...))}})
}

// readFailed ends the link for a socket error while reading, unless Close
// caused it.
func (l *Link) readFailed(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down || l.closed {
		return
	}
	if peerGone(err) {
		l.endLocked(link.Completion{Kind: link.Disconnected})
		return
	}
	l.endLocked(link.Completion{Kind: link.Failed, Err: fmt.Errorf("tcplink: %s: read: %w: %w", l.cfg.Name, err, link.ErrDown)})
}

// peerGone reports whether a socket error means that the peer closed the
// connection or its process died (its kernel closed the socket): the end
// of the connection, not a path failure.
func peerGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.ErrClosedPipe) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// The writer: it writes what the link owes the peer, in batches, until the
// link ends.

func (l *Link) write() {
	defer close(l.writerDone)
	for {
		last, ok := l.nextBatch()
		if !ok {
			return
		}
		l.out = l.vec
		_, err := l.out.WriteTo(l.conn)
		clear(l.vec) // drop the references to the send rings
		l.vec = l.vec[:0]
		clear(l.batchSrcs[:len(l.batch)])
		if l.writing {
			// Done with the stream rings the batch read: ReleaseSendRing
			// may wait for that.
			l.mu.Lock()
			l.writing = false
			l.writerIdle.Broadcast()
			l.mu.Unlock()
		}
		if err != nil {
			l.writeFailed(err)
			return
		}
		if last {
			return
		}
	}
}

// nextBatch waits for something to write and encodes it into l.vec: an
// Abort alone; or an Ack, the requests posted since the last batch (up to
// maxBatch) and a Disconnect. last: nothing may follow the batch. ok is
// false when the writer has nothing more to do.
func (l *Link) nextBatch() (last, ok bool) {
	l.mu.Lock()
	for !l.closed && !l.abort && !l.down && l.ackWanted == l.ackWritten && l.handed == l.seq {
		l.writeCond.Wait()
	}
	l.hbuf = l.hbuf[:0]
	switch {
	case l.closed:
		l.mu.Unlock()
		return false, false
	case l.abort:
		l.abort = false
		l.hbuf = append(l.hbuf, frameAbort)
		l.hbuf = be.AppendUint64(l.hbuf, l.abortCount)
		l.hbuf = append(l.hbuf, l.abortCode)
		l.mu.Unlock()
		l.vec = append(l.vec, l.hbuf)
		return true, true
	case l.down && !l.sendDisconnect:
		l.mu.Unlock()
		return false, false
	}
	ack, hasAck := l.ackWanted, l.ackWanted > l.ackWritten
	l.ackWritten = l.ackWanted
	l.batch = l.batch[:0]
	if !l.down {
		n := uint64(len(l.reqs))
		for l.handed < l.seq && len(l.batch) < maxBatch {
			l.handed++
			wr := &l.reqs[l.handed%n]
			if wr.Kind == link.SendData {
				// The ring is registered: ReleaseSendRing refuses a ring
				// an unacknowledged request sends from while the link is
				// up, and nothing is taken once it is down.
				src, _ := l.dataSrcLocked(wr)
				l.batchSrcs[len(l.batch)] = src[uint64(wr.Off) : uint64(wr.Off)+uint64(wr.N)]
				l.writing = l.writing || (wr.Ring != 0 && wr.Mem == nil)
			}
			l.batch = append(l.batch, *wr)
		}
	}
	disconnect := l.sendDisconnect
	l.sendDisconnect = false
	l.mu.Unlock()

	h, mark := l.hbuf, 0
	if hasAck {
		h = append(h, frameAck)
		h = be.AppendUint64(h, ack)
	}
	for i := range l.batch {
		wr := &l.batch[i]
		switch wr.Kind {
		case link.SendData:
			if l.cfg.Carrier {
				h = append(h, frameTagged)
				h = be.AppendUint32(h, wr.RKey)
				h = be.AppendUint64(h, wr.Remote)
				h = be.AppendUint32(h, wr.Tag)
			} else {
				h = append(h, frameData)
				h = be.AppendUint32(h, wr.RKey)
				h = be.AppendUint64(h, wr.Remote)
			}
			h = be.AppendUint32(h, wr.N)
			p := l.batchSrcs[i]
			if len(p) <= inlineMax {
				h = append(h, p...)
				continue
			}
			if mark < len(h) {
				l.vec = append(l.vec, h[mark:])
			}
			l.vec = append(l.vec, p)
			mark = len(h)
		case link.SendControl:
			h = append(h, frameControl)
			h = append(h, wr.Msg[:]...)
		case link.SendMarker:
			h = append(h, frameMarker)
			h = be.AppendUint32(h, wr.RKey)
			h = be.AppendUint64(h, wr.Remote)
		}
	}
	if disconnect {
		h = append(h, frameDisconnect)
	}
	if mark < len(h) {
		l.vec = append(l.vec, h[mark:])
	}
	l.hbuf = h
	return disconnect, true
}

// writeFailed ends the link for a socket error while writing, unless Close
// caused it. A peer that is gone is left to the reader, which reports
// Disconnected after the frames that arrived before the socket's end.
func (l *Link) writeFailed(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down || l.closed {
		return
	}
	if peerGone(err) {
		l.peerGone = true
		l.recvCond.Broadcast()
		return
	}
	l.endLocked(link.Completion{Kind: link.Failed, Err: fmt.Errorf("tcplink: %s: write: %w: %w", l.cfg.Name, err, link.ErrDown)})
}
