package rdmalink

import (
	"fmt"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/verbs"
)

// Rings that follow traffic (link.Rings): a connection's later rings are
// chunks of its peer group's pools too, so growing registers nothing in
// the common case, and a ring goes back to the pool only when the engine
// says nothing lands in it any more (the peer switched past it, and it
// was read), or when the queue pair is gone.

var _ link.Rings = (*Link)(nil)

// NewRecvRing takes a receive ring of size bytes from the group's
// remote-writable pool.
func (l *Link) NewRecvRing(size int) ([]byte, uint64, uint32, error) {
	r := l.res
	if r.borrowed {
		return nil, 0, 0, fmt.Errorf("rdmanet: a session's rings keep their size")
	}
	reg, err := r.group.region(r.group.remote, size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return nil, 0, 0, err
	}
	r.later = append(r.later, reg)
	return reg.Bytes(), reg.Addr(), reg.RKey(), nil
}

// ReleaseRecvRing gives a receive ring back to the pool.
func (l *Link) ReleaseRecvRing(mem []byte) error {
	r := l.res
	if r.rx != nil && link.SameRing(r.rx.Bytes(), mem) {
		err := r.rx.close()
		r.rx = nil
		return err
	}
	for i, reg := range r.later {
		if link.SameRing(reg.Bytes(), mem) {
			r.later = append(r.later[:i], r.later[i+1:]...)
			return reg.close()
		}
	}
	return fmt.Errorf("rdmanet: a receive ring of %d bytes this link does not hold: %w", len(mem), link.ErrMisuse)
}

// ReplaceSendRing takes a transmit ring of size bytes from the group's
// local pool and gives the old one back: no data request reads it.
func (l *Link) ReplaceSendRing(size int) ([]byte, error) {
	r := l.res
	if r.borrowed {
		return nil, fmt.Errorf("rdmanet: a session's rings keep their size")
	}
	reg, err := r.group.region(r.group.local, size, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	old := r.tx
	r.tx = reg
	return reg.Bytes(), old.close()
}
