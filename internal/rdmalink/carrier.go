package rdmalink

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/verbs"
)

// A link that carries a group's streams (link.Carrier; internal/group):
// each stream's rings are chunks of the peer group's pools, as grown rings
// are (rings.go: a stream's receive rings are NewRecvRing's), so a stream
// registers nothing in the common case. Once both ends agreed on
// wire.FeatureGroup (Established), a data write's immediate is the
// stream's tag and its receive completion's byte_len its length; with
// write notices (iWARP), the Written notice names the stream in bytes 4-7
// as every control message of the group does.

var _ link.Carrier = (*Link)(nil)

// NewSendRing takes a stream's transmit ring from the peer group's local
// pool.
func (l *Link) NewSendRing(size int) ([]byte, uint32, error) {
	r := l.res
	if r.borrowed {
		return nil, 0, fmt.Errorf("rdmanet: a session's link carries no streams")
	}
	if size <= 0 {
		return nil, 0, fmt.Errorf("rdmanet: a transmit ring of %d bytes: %w", size, link.ErrMisuse)
	}
	reg, err := r.group.region(r.group.local, size, verbs.AccessLocalWrite)
	if err != nil {
		return nil, 0, err
	}
	if l.sendRings == nil {
		l.sendRings = map[uint32]*region{}
	}
	l.sendKeys++
	if l.sendKeys == 0 {
		l.sendKeys++
	}
	l.sendRings[l.sendKeys] = reg
	// Closed with the link if nothing gives it back before.
	r.later = append(r.later, reg)
	return reg.Bytes(), l.sendKeys, nil
}

// ReleaseSendRing gives a stream's transmit ring back to the pool.
func (l *Link) ReleaseSendRing(key uint32) error {
	reg, ok := l.sendRings[key]
	if !ok {
		return fmt.Errorf("rdmanet: no transmit ring %d on this link: %w", key, link.ErrMisuse)
	}
	delete(l.sendRings, key)
	r := l.res
	for i, x := range r.later {
		if x == reg {
			r.later = append(r.later[:i], r.later[i+1:]...)
			break
		}
	}
	return reg.close()
}

// sendLocal is the memory a data request sends from: the link's transmit
// ring, or a stream's.
func (l *Link) sendLocal(wr *link.SendWR) (verbs.SGE, error) {
	if wr.Ring == 0 {
		return l.res.tx.Slice(int(wr.Off), int(wr.N)), nil
	}
	reg, ok := l.sendRings[wr.Ring]
	if !ok || int(wr.Off)+int(wr.N) > len(reg.Bytes()) {
		return verbs.SGE{}, fmt.Errorf("rdmanet: data [%d, +%d) of transmit ring %d: %w", wr.Off, wr.N, wr.Ring, link.ErrMisuse)
	}
	return reg.Slice(int(wr.Off), int(wr.N)), nil
}

// noticeStream names the stream of a Written notice, on a carrier.
func noticeStream(msg []byte) uint32 { return binary.BigEndian.Uint32(msg[4:8]) }

// ShareRecvRing and ShareSendRing would register a moving stream's ring,
// another link's pool chunk, on this link's domain. Not built yet: a group
// over RDMA does not move its streams (internal/group's MoveTimeout is 0),
// so a move that asks fails the stream alone.
func (l *Link) ShareRecvRing(mem []byte) (uint64, uint32, error) {
	return 0, 0, fmt.Errorf("rdmanet: moving a stream's receive ring onto %s: %w", l.caps.Name, errors.ErrUnsupported)
}

func (l *Link) ShareSendRing(mem []byte) (uint32, error) {
	return 0, fmt.Errorf("rdmanet: moving a stream's transmit ring onto %s: %w", l.caps.Name, errors.ErrUnsupported)
}
