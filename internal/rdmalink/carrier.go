package rdmalink

import (
	"encoding/binary"
	"fmt"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// A link that carries a group's streams (link.Carrier; internal/group):
// each stream's rings are chunks of the peer group's pools, as grown rings
// are (rings.go), so a stream registers nothing in the common case. Once
// both ends agreed on wire.FeatureGroup (Established), a data write's
// immediate is the stream's tag and its receive completion's byte_len its
// length; with write notices (iWARP), the Written notice names the stream
// in bytes 4-7 as every control message of the group does.

var _ link.Carrier = (*Link)(nil)

// streamRings are one stream's regions.
type streamRings struct{ tx, rx *region }

// NewStreamRings takes a stream's rings from the peer group's pools.
func (l *Link) NewStreamRings(send, recv int) (link.StreamRings, error) {
	r := l.res
	if r.borrowed {
		return link.StreamRings{}, fmt.Errorf("rdmanet: a session's link carries no streams")
	}
	if send <= 0 || recv <= 0 {
		return link.StreamRings{}, fmt.Errorf("rdmanet: stream rings of %d and %d bytes: %w", send, recv, link.ErrMisuse)
	}
	tx, err := r.group.region(r.group.local, send, verbs.AccessLocalWrite)
	if err != nil {
		return link.StreamRings{}, err
	}
	rx, err := r.group.region(r.group.remote, recv, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		tx.close()
		return link.StreamRings{}, err
	}
	if l.streams == nil {
		l.streams = map[uint32]streamRings{}
	}
	l.streamKeys++
	if l.streamKeys == 0 {
		l.streamKeys++
	}
	l.streams[l.streamKeys] = streamRings{tx: tx, rx: rx}
	// Closed with the link if nothing gives them back before.
	r.later = append(r.later, tx, rx)
	return link.StreamRings{Send: tx.Bytes(), SendKey: l.streamKeys, Recv: rx.Bytes(), RecvAddr: rx.Addr(), RecvKey: rx.RKey()}, nil
}

// FreeStreamRings gives a stream's rings back to the pools.
func (l *Link) FreeStreamRings(sr link.StreamRings) error {
	s, ok := l.streams[sr.SendKey]
	if !ok || !link.SameRing(s.tx.Bytes(), sr.Send) || !link.SameRing(s.rx.Bytes(), sr.Recv) {
		return fmt.Errorf("rdmanet: stream rings this link did not make: %w", link.ErrMisuse)
	}
	delete(l.streams, sr.SendKey)
	r := l.res
	kept := r.later[:0]
	for _, reg := range r.later {
		if reg != s.tx && reg != s.rx {
			kept = append(kept, reg)
		}
	}
	clear(r.later[len(kept):])
	r.later = kept
	return errorsJoin(s.tx.close(), s.rx.close())
}

func errorsJoin(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// streamLocal is the memory a data request sends from: the link's
// transmit ring, or a stream's.
func (l *Link) streamLocal(wr *link.SendWR) (verbs.SGE, error) {
	if wr.Ring == 0 {
		return l.res.tx.Slice(int(wr.Off), int(wr.N)), nil
	}
	s, ok := l.streams[wr.Ring]
	if !ok || int(wr.Off)+int(wr.N) > len(s.tx.Bytes()) {
		return verbs.SGE{}, fmt.Errorf("rdmanet: data [%d, +%d) of stream ring %d: %w", wr.Off, wr.N, wr.Ring, link.ErrMisuse)
	}
	return s.tx.Slice(int(wr.Off), int(wr.N)), nil
}

// noticeStream names the stream of a Written notice, on a carrier.
func noticeStream(msg []byte) uint32 { return binary.BigEndian.Uint32(msg[4:8]) }

var _ = wire.MessageSize
