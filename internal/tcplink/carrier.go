package tcplink

import (
	"errors"
	"fmt"
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

// Carrier mode (Config.Carrier): the link carries a link group's streams
// (link.Carrier; internal/group) when every RDMA link of the group is down.
// It makes no memory: the streams keep the rings an RDMA link made, which
// ShareRecvRing and ShareSendRing register here. See the package
// documentation for the rules.

var _ link.Carrier = (*Link)(nil)

// ErrNoRings is wrapped by the error of NewRecvRing and NewSendRing: a TCP
// link makes no memory of its own, in carrier mode or not. It is not a
// misuse (link.ErrMisuse): a stream whose ring growth it refuses stays on
// the rings it has, and a group opens no stream on such a link (it only
// moves streams there, with their memory).
var ErrNoRings = errors.New("tcplink: a TCP link makes no rings")

// ringSpan is the address space of one receive ring: ShareRecvRing's rings
// are ringSpan apart, so that an address of one ring is in no other's
// range, and none is larger.
const ringSpan = 1 << 32

// recvRing is a receive ring registered on a carrier: its memory and the
// address its first byte has. The address is distinct for every
// registration, so it also tells a ring from a later one under the same
// key.
type recvRing struct {
	mem  []byte
	addr uint64
}

// initCarrier registers the first receive ring (RecvRing, perhaps empty)
// as any other: the reader finds every ring by its key.
func (l *Link) initCarrier() {
	l.recvRings = map[uint32]recvRing{l.rkey: {mem: l.cfg.RecvRing, addr: RingAddr}}
	l.sendRings = map[uint32][]byte{}
	l.nextRKey = l.rkey
	l.nextAddr = RingAddr + ringSpan
}

// NewRecvRing makes no ring: it fails with an error wrapping ErrNoRings.
func (l *Link) NewRecvRing(size int) ([]byte, uint64, uint32, error) {
	return nil, 0, 0, l.noRings("NewRecvRing", size)
}

// NewSendRing makes no ring: it fails with an error wrapping ErrNoRings.
func (l *Link) NewSendRing(size int) ([]byte, uint32, error) {
	return nil, 0, l.noRings("NewSendRing", size)
}

func (l *Link) noRings(op string, size int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.closedError(op)
	}
	if size <= 0 {
		return l.misuse("%s(%d)", op, size)
	}
	return fmt.Errorf("tcplink: %s: %s(%d): %w", l.cfg.Name, op, size, ErrNoRings)
}

// ShareRecvRing registers mem as a receive ring the peer may write into,
// named by a fresh key (unique among the link's live keys) and a fake
// address of its own. maker is not used: the memory stays its maker's,
// and the link writes into it until ReleaseRecvRing returns, or Close.
// mem must be 1 byte to 4 GiB long, and not registered here already.
func (l *Link) ShareRecvRing(_ link.Carrier, mem []byte) (uint64, uint32, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, 0, l.closedError("ShareRecvRing")
	}
	if !l.cfg.Carrier {
		return 0, 0, l.misuse("ShareRecvRing on a link not in carrier mode")
	}
	if len(mem) == 0 || uint64(len(mem)) > ringSpan {
		return 0, 0, l.misuse("ShareRecvRing: a ring of %d bytes", len(mem))
	}
	for _, r := range l.recvRings {
		if link.SameRing(r.mem, mem) {
			return 0, 0, l.misuse("ShareRecvRing: a ring already registered here")
		}
	}
	key := l.nextRKey + 1
	for key == 0 || l.recvRingLive(key) {
		key++
	}
	l.nextRKey = key
	addr := l.ringAddrLocked()
	l.recvRings[key] = recvRing{mem: mem, addr: addr}
	return addr, key, nil
}

func (l *Link) recvRingLive(key uint32) bool {
	_, ok := l.recvRings[key]
	return ok
}

// ringAddrLocked gives a receive ring its address: the next ringSpan of
// address space. After 2^32 rings or so the addresses start again, and
// skip those of live rings. l.mu is held.
func (l *Link) ringAddrLocked() uint64 {
	for {
		a := l.nextAddr
		l.nextAddr += ringSpan
		if l.nextAddr < a {
			l.nextAddr, l.addrWrapped = RingAddr+ringSpan, true
		}
		if !l.addrWrapped || !l.addrLiveLocked(a) {
			return a
		}
	}
}

func (l *Link) addrLiveLocked(a uint64) bool {
	for _, r := range l.recvRings {
		if r.addr == a {
			return true
		}
	}
	return false
}

// ShareSendRing registers mem as a transmit ring, named by a fresh key
// (never 0, unique among the link's live transmit rings) that
// SendWR.Ring gives. maker is not used: the memory stays its maker's.
// The writer reads a request's bytes from it when it writes the request,
// as it does from SendRing.
func (l *Link) ShareSendRing(_ link.Carrier, mem []byte) (uint32, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, l.closedError("ShareSendRing")
	}
	if !l.cfg.Carrier {
		return 0, l.misuse("ShareSendRing on a link not in carrier mode")
	}
	if len(mem) == 0 {
		return 0, l.misuse("ShareSendRing: no memory")
	}
	key := l.nextSendKey + 1
	for key == 0 || l.sendRings[key] != nil {
		key++
	}
	l.nextSendKey = key
	l.sendRings[key] = mem
	return key, nil
}

// ReleaseRecvRing drops the registration of a receive ring (ShareRecvRing's,
// or the first one): once it returns, the link never writes into mem
// again, and a frame of the peer's that names the ring, or that was
// landing in it, fails the link with a remote access error. Anything else
// is misuse.
func (l *Link) ReleaseRecvRing(mem []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.closedError("ReleaseRecvRing")
	}
	for key, r := range l.recvRings {
		if link.SameRing(r.mem, mem) {
			delete(l.recvRings, key)
			return nil
		}
	}
	return l.misuse("ReleaseRecvRing: a ring of %d bytes not registered here", len(mem))
}

// ReleaseSendRing drops the registration of a transmit ring: once it
// returns, the link never reads it again. While the link is up, a data
// request from the ring that the peer has not yet acknowledged makes it
// misuse (the engine releases a ring no request sends from, after its
// completion). Once the link is down, requests not written never will
// be; if the writer is writing some from the ring, ReleaseSendRing cuts
// that write short (a write deadline in the past, or closing the socket
// where deadlines fail) and waits for the writer to let go of the ring.
func (l *Link) ReleaseSendRing(key uint32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.closedError("ReleaseSendRing")
	}
	if key == 0 || l.sendRings[key] == nil {
		return l.misuse("ReleaseSendRing: no transmit ring with key %d", key)
	}
	if !l.down {
		// The peer acknowledged a request only once it took all of its
		// bytes, so the writer is done with those: it may still be
		// writing the rest of their batch, but from other rings.
		for s := l.acked + 1; s <= l.seq; s++ {
			if wr := &l.reqs[s%uint64(len(l.reqs))]; wr.Kind == link.SendData && wr.Ring == key && wr.Mem == nil {
				return l.misuse("ReleaseSendRing: data request ID %d from transmit ring %d is outstanding", wr.ID, key)
			}
		}
		delete(l.sendRings, key)
		return nil
	}
	// Down: the writer takes no more requests, but it may be writing some
	// from the ring that will never be acknowledged.
	delete(l.sendRings, key)
	cut := false
	for l.writing && l.batchReads(key) {
		if !cut {
			cut = true
			if l.conn.SetWriteDeadline(time.Unix(1, 0)) != nil {
				l.conn.Close()
			}
		}
		l.writerIdle.Wait()
	}
	return nil
}

// batchReads reports whether the writer's batch sends from transmit ring
// key. l.mu is held.
func (l *Link) batchReads(key uint32) bool {
	for i := range l.batch {
		if wr := &l.batch[i]; wr.Kind == link.SendData && wr.Ring == key && wr.Mem == nil {
			return true
		}
	}
	return false
}

// dataSrcLocked is where a data request's bytes are: the application's
// registered memory (link.Mem), or the transmit ring it names. l.mu is
// held.
func (l *Link) dataSrcLocked(wr *link.SendWR) ([]byte, bool) {
	if wr.Mem != nil {
		return wr.Mem.Bytes(), true
	}
	return l.sendRingLocked(wr.Ring)
}

// RegisterMem is link.MemSender's: the writer sends from any memory, so
// there is nothing to register.
func (l *Link) RegisterMem(m *link.Mem) error { return nil }

// sendRingLocked is the transmit ring a request names: SendRing (key 0),
// or a stream's. l.mu is held.
func (l *Link) sendRingLocked(key uint32) ([]byte, bool) {
	if key == 0 {
		return l.cfg.SendRing, true
	}
	b := l.sendRings[key]
	return b, b != nil
}

// recvRingAtLocked checks a write of n bytes at addr with rkey against the
// receive rings (carrier mode) and returns the ring and the offset in it.
// l.mu is held.
func (l *Link) recvRingAtLocked(addr uint64, rkey uint32, n uint32) (recvRing, uint64, bool) {
	r, ok := l.recvRings[rkey]
	if !ok || addr < r.addr {
		return recvRing{}, 0, false
	}
	off, size := addr-r.addr, uint64(len(r.mem))
	if off > size || uint64(n) > size-off {
		return recvRing{}, 0, false
	}
	return r, off, true
}

// ringLiveLocked reports whether r is still registered under rkey.
// l.mu is held.
func (l *Link) ringLiveLocked(rkey uint32, r recvRing) bool {
	cur, ok := l.recvRings[rkey]
	return ok && cur.addr == r.addr
}
