package rdmanet

import (
	"net"
	"sync"

	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/tcplink"
	"github.com/rdmanet/sdk/verbs"
)

// ringMem is a connection's rings when it owns them: a resumable session's,
// which every link of the session uses in turn. The rings are unmapped
// only when nothing can touch them: the connection is done with them
// (close, once it has lingered) and every link made over them was closed.
// A link may outlive the connection's use of the rings: a failback or a
// resume still dialing when the connection closes, or an old link being
// retired. Unmapping memory that a queue pair has registered fails (and
// would leak it); unmapping memory that a TCP link reads would crash.
type ringMem struct {
	tx, rx *verbs.Buffer

	mu     sync.Mutex
	closed bool // the connection is done with the rings
	links  int  // links made over the rings and not yet closed
}

func newRingMem(cfg Config) (*ringMem, error) {
	tx, err := verbs.NewBuffer(cfg.SendBuffer)
	if err != nil {
		return nil, err
	}
	rx, err := verbs.NewBuffer(cfg.RecvBuffer)
	if err != nil {
		tx.Close()
		return nil, err
	}
	return &ringMem{tx: tx, rx: rx}, nil
}

// hold counts a link about to be made over the rings; it fails once the
// connection is done with them.
func (m *ringMem) hold() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return net.ErrClosed
	}
	m.links++
	return nil
}

// release ends a link's hold.
func (m *ringMem) release() {
	m.mu.Lock()
	m.links--
	unmap := m.closed && m.links == 0
	m.mu.Unlock()
	if unmap {
		m.unmap()
	}
}

// close is the connection's end with the rings: they are unmapped now, or
// when the last link over them releases them. A nil ringMem is none.
func (m *ringMem) close() {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.closed = true
	unmap := m.links == 0
	m.mu.Unlock()
	if unmap {
		m.unmap()
	}
}

func (m *ringMem) unmap() {
	m.tx.Close()
	m.rx.Close()
}

// lendTo makes cfg's link use the rings, holding them until the link
// releases them (rdmalink.Config.Release).
func (m *ringMem) lendTo(cfg *rdmalink.Config) error {
	if err := m.hold(); err != nil {
		return err
	}
	cfg.SendMem, cfg.RecvMem, cfg.Release = m.tx, m.rx, m.release
	return nil
}

// lendToTCP is lendTo for a TCP link.
func (m *ringMem) lendToTCP(cfg *tcplink.Config) error {
	if err := m.hold(); err != nil {
		return err
	}
	cfg.SendRing, cfg.RecvRing, cfg.Release = m.tx.Bytes(), m.rx.Bytes(), m.release
	return nil
}
