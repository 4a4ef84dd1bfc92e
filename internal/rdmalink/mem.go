package rdmalink

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/verbs"
)

// Registered application memory (link.Mem): a data request with Mem set
// sends from it. It is registered on the peer group's protection domain
// once, from the first use by any of the group's links (in the
// background: RegisterMem), and stays until
// the memory closes or the domain goes (release). It is the
// application's memory, so it does not count against the peer's bound
// (Config.PeerBound), which bounds what a peer makes this side pin.

// memRegs are a group's registrations of application memory.
type memRegs struct {
	mu  sync.Mutex
	mrs map[*link.Mem]*verbs.MR
}

// RegisterMem reports whether m is registered on the link's domain
// (link.MemSender), and starts its registration there if it is not: on a
// goroutine of its own, as pinning a large buffer takes long (a second
// for 256 MiB under the lab's emulation), and made under the connection's
// lock, or a group's, it held every stream of the group and every
// connection sending from m until it was done. The caller copies until it
// is. Pinning may fail (RLIMIT_MEMLOCK): the caller copies for good.
func (l *Link) RegisterMem(m *link.Mem) error {
	if l.gone.Load() {
		return closedError("RegisterMem")
	}
	g := l.res.group
	if g == nil {
		return fmt.Errorf("rdmanet: RegisterMem on a link with no domain: %w", link.ErrMisuse)
	}
	return m.RegisterAsync(g, g.memRegistration(m), func(run func()) {
		// The domain outlives the registration: the group is held (the
		// link holds it now, so it is not going).
		g.hold()
		go func() {
			run()
			if err := g.release(); err != nil {
				slog.Debug("rdmanet: releasing a peer group after registering memory", "err", err)
			}
		}()
	})
}

// registerMem registers m on the group's domain now, or waits for its
// registration being made there.
func (g *peerGroup) registerMem(m *link.Mem) error {
	return m.Register(g, g.memRegistration(m))
}

// memRegistration registers m on the group's domain and records it.
func (g *peerGroup) memRegistration(m *link.Mem) func() (func(), error) {
	return func() (func(), error) {
		buf, ok := m.Owner().(*verbs.Buffer)
		if !ok {
			return nil, fmt.Errorf("rdmanet: registered memory of %T, not a verbs.Buffer: %w", m.Owner(), link.ErrMisuse)
		}
		mr, err := g.pd.RegisterPart(buf, m.Bytes(), verbs.AccessLocalWrite)
		if err != nil {
			return nil, fmt.Errorf("rdmanet: registering %d bytes of application memory on %s: %w", len(m.Bytes()), g.device, err)
		}
		g.mems.mu.Lock()
		if g.mems.mrs == nil {
			g.mems.mrs = map[*link.Mem]*verbs.MR{}
		}
		g.mems.mrs[m] = mr
		g.mems.mu.Unlock()
		return func() { g.dropMem(m) }, nil
	}
}

// memMR is m's registration on the group's domain, made now if it was
// not (a stream that moved here sends from memory registered on its old
// link's device).
func (g *peerGroup) memMR(m *link.Mem) (*verbs.MR, error) {
	g.mems.mu.Lock()
	mr := g.mems.mrs[m]
	g.mems.mu.Unlock()
	if mr != nil {
		return mr, nil
	}
	if err := g.registerMem(m); err != nil {
		return nil, err
	}
	g.mems.mu.Lock()
	defer g.mems.mu.Unlock()
	if mr = g.mems.mrs[m]; mr == nil {
		return nil, link.ErrMemClosed
	}
	return mr, nil
}

// dropMem deregisters m from the group's domain, if it is registered.
func (g *peerGroup) dropMem(m *link.Mem) {
	g.mems.mu.Lock()
	mr := g.mems.mrs[m]
	delete(g.mems.mrs, m)
	g.mems.mu.Unlock()
	if mr != nil {
		mr.Close()
	}
}

// dropMems deregisters every application memory from the group's domain,
// which goes.
func (g *peerGroup) dropMems() {
	g.mems.mu.Lock()
	mrs := g.mems.mrs
	g.mems.mrs = nil
	g.mems.mu.Unlock()
	for m, mr := range mrs {
		m.Forget(g)
		mr.Close()
	}
}

// memLocal is the memory a data request from registered memory sends.
func (l *Link) memLocal(wr *link.SendWR) (verbs.SGE, error) {
	if uint64(wr.Off)+uint64(wr.N) > uint64(len(wr.Mem.Bytes())) {
		return verbs.SGE{}, fmt.Errorf("rdmanet: data [%d, +%d) of %d bytes of registered memory: %w", wr.Off, wr.N, len(wr.Mem.Bytes()), link.ErrMisuse)
	}
	if l.res.group == nil {
		return verbs.SGE{}, fmt.Errorf("rdmanet: data from registered memory on a link with no domain: %w", link.ErrMisuse)
	}
	mr, err := l.res.group.memMR(wr.Mem)
	if err != nil {
		return verbs.SGE{}, err
	}
	return mr.Slice(int(wr.Off), int(wr.N)), nil
}
