package rdmalink

import (
	"encoding/binary"
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
	// Closed with the link if nothing gives it back before.
	r.later = append(r.later, reg)
	return reg.Bytes(), l.addSendRing(reg), nil
}

// addSendRing names a stream's transmit ring by a key of its own.
func (l *Link) addSendRing(reg *region) uint32 {
	if l.sendRings == nil {
		l.sendRings = map[uint32]*region{}
	}
	l.sendKeys++
	if l.sendKeys == 0 {
		l.sendKeys++
	}
	l.sendRings[l.sendKeys] = reg
	return l.sendKeys
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
	if wr.Mem != nil {
		return l.memLocal(wr)
	}
	reg := l.res.tx
	if wr.Ring != 0 {
		var ok bool
		if reg, ok = l.sendRings[wr.Ring]; !ok {
			return verbs.SGE{}, fmt.Errorf("rdmanet: data of transmit ring %d, which this link does not have: %w", wr.Ring, link.ErrMisuse)
		}
	}
	// The region's memory region may be its slab's: past the ring, the
	// device would read other rings.
	if uint64(wr.Off)+uint64(wr.N) > uint64(len(reg.Bytes())) {
		return verbs.SGE{}, fmt.Errorf("rdmanet: data [%d, +%d) of the %d-byte transmit ring %d: %w", wr.Off, wr.N, len(reg.Bytes()), wr.Ring, link.ErrMisuse)
	}
	return reg.Slice(int(wr.Off), int(wr.N)), nil
}

// noticeStream names the stream of a Written notice, on a carrier.
func noticeStream(msg []byte) uint32 { return binary.BigEndian.Uint32(msg[4:8]) }

// ShareRecvRing registers a moving stream's receive ring, which maker (a
// link of the same group, on another device perhaps) took from its pool,
// on this link's domain: the same memory, a key of this device's. The
// registration counts against the peer's bound as a ring does.
func (l *Link) ShareRecvRing(maker link.Carrier, mem []byte) (uint64, uint32, error) {
	reg, err := l.shareRegion(maker, mem, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return 0, 0, err
	}
	l.res.later = append(l.res.later, reg)
	return reg.Addr(), reg.RKey(), nil
}

// ShareSendRing registers a moving stream's transmit ring, maker's, on
// this link's domain, and names it by a key of this link's.
func (l *Link) ShareSendRing(maker link.Carrier, mem []byte) (uint32, error) {
	reg, err := l.shareRegion(maker, mem, verbs.AccessLocalWrite)
	if err != nil {
		return 0, err
	}
	l.res.later = append(l.res.later, reg)
	return l.addSendRing(reg), nil
}

func (l *Link) shareRegion(maker link.Carrier, mem []byte, access verbs.Access) (*region, error) {
	r := l.res
	if r.borrowed {
		return nil, fmt.Errorf("rdmanet: a session's link carries no streams")
	}
	m, ok := maker.(*Link)
	if !ok {
		return nil, fmt.Errorf("rdmanet: a ring of a %T moved onto an RDMA link: %w", maker, link.ErrMisuse)
	}
	src := m.regionOf(mem)
	if src == nil {
		return nil, fmt.Errorf("rdmanet: a ring of %d bytes its maker does not hold: %w", len(mem), link.ErrMisuse)
	}
	if m != l && l.regionOf(mem) != nil {
		// A second registration would outlive the release of the first,
		// which is all ReleaseRecvRing and ReleaseSendRing find.
		return nil, fmt.Errorf("rdmanet: a ring of %d bytes registered on this link already: %w", len(mem), link.ErrMisuse)
	}
	return r.group.sharedRegion(src.mr.Buffer(), mem, access)
}

// regionOf is the stream ring of this link's whose memory mem is.
func (l *Link) regionOf(mem []byte) *region {
	for _, reg := range l.res.later {
		if link.SameRing(reg.Bytes(), mem) {
			return reg
		}
	}
	return nil
}
