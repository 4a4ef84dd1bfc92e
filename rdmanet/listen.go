package rdmanet

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// ListenConfig configures a listener, as net.ListenConfig does.
type ListenConfig struct {
	// Backlog is how many RDMA connection requests may wait for Accept
	// (default 128).
	Backlog int
	// Config sizes each accepted RDMA connection's buffers and queues.
	Config Config
	// Policy chooses the transports of a listener on a "tcp" network
	// (default fallback.Auto: RDMA and TCP at once, or TCP alone where RDMA
	// cannot be used). The environment variable fallback.EnvPolicy
	// overrides it. "rdma" networks serve RDMA only.
	Policy fallback.Policy
}

// acceptTimeout bounds the handshake of one accepted connection, so a peer
// that requests and never completes cannot stall Accept.
const acceptTimeout = 10 * time.Second

// Listen listens on address ("host:port"; an empty host means every
// address). On network "tcp", "tcp4" or "tcp6" it serves RDMA and TCP on
// the same port number at once (rdma_cm's ports are separate from TCP's),
// or TCP alone where RDMA cannot be used (Listener.RDMAError says why); on
// "rdma", "rdma4" or "rdma6" it serves RDMA only.
func Listen(network, address string) (*Listener, error) {
	var lc ListenConfig
	return lc.Listen(context.Background(), network, address)
}

// Listen listens on address; see the package's Listen. The context bounds
// only the set-up.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (*Listener, error) {
	opErr := func(err error) error { return &net.OpError{Op: "listen", Net: network, Err: err} }
	family, rdmaNetwork, err := parseNetwork(network)
	if err != nil {
		return nil, opErr(err)
	}
	policy := fallback.RDMAOnly
	if !rdmaNetwork {
		if policy, err = fallback.Effective(lc.Policy); err != nil {
			return nil, opErr(err)
		}
	}
	cfg, err := lc.Config.withDefaults()
	if err != nil {
		return nil, opErr(err)
	}
	ap, err := resolveAddr(ctx, family, address)
	if err != nil {
		return nil, opErr(err)
	}
	l := &Listener{cfg: cfg, backlog: cmp.Or(max(lc.Backlog, 0), 128), done: make(chan struct{})}
	switch policy {
	case fallback.RDMAOnly:
		if err := l.listenRDMA(ap); err != nil {
			counters.FellBack(err.Reason)
			return nil, opErr(err)
		}
		return l, nil
	case fallback.TCPOnly:
		l.rdmaWhy = &fallback.Error{Reason: fallback.ReasonPolicy}
		counters.FellBack(fallback.ReasonPolicy)
		if err := l.listenTCP(ctx, network, ap); err != nil {
			return nil, opErr(err)
		}
		return l, nil
	}
	// Both: TCP first, so that port 0 picks a free port number that RDMA
	// then takes too. Another rdma_cm listener may hold that number; pick
	// again a few times.
	for try := 0; ; try++ {
		if err := l.listenTCP(ctx, network, ap); err != nil {
			return nil, opErr(err)
		}
		bound := netip.AddrPortFrom(ap.Addr(), l.tcp.Addr().(*net.TCPAddr).AddrPort().Port())
		why := l.listenRDMA(bound)
		if why == nil {
			break
		}
		if ap.Port() == 0 && errors.Is(why, syscall.EADDRINUSE) && try < 5 {
			l.tcp.Close()
			continue
		}
		l.rdmaWhy = why
		counters.FellBack(why.Reason)
		slog.Debug("rdmanet: listening on TCP only", "addr", l.tcp.Addr(), "reason", string(why.Reason), "err", why.Err)
		break
	}
	if l.rdma != nil {
		l.pumps.Add(2)
		l.accepted = make(chan acceptResult)
		go l.pump(l.acceptRDMA, true)
		go l.pump(l.acceptTCP, false)
	}
	return l, nil
}

// listenRDMA starts the RDMA side on ap, or says why it cannot.
func (l *Listener) listenRDMA(ap netip.AddrPort) *fallback.Error {
	if err := cm.Available(); err != nil {
		return &fallback.Error{Reason: fallback.Classify(err), Err: err}
	}
	// An address on an interface without RDMA can never take an RDMA
	// connection; say so rather than report rdma_cm's ENODEV.
	if !ap.Addr().IsUnspecified() {
		if _, err := verbs.DeviceForAddr(ap.Addr()); errors.Is(err, verbs.ErrNoDevice) {
			if _, derr := verbs.Devices(); derr == nil {
				return &fallback.Error{Reason: fallback.ReasonRouteNoRDMA, Err: err}
			}
		}
	}
	id, err := cm.NewID()
	if err == nil {
		if err = id.Bind(ap); err == nil {
			err = id.Listen(l.backlog)
		}
		if err != nil {
			id.Close()
		}
	}
	if err != nil {
		return &fallback.Error{Reason: fallback.Classify(err), Err: err}
	}
	l.rdma, l.rdmaAddr = id, &Addr{id.LocalAddr()}
	return nil
}

// listenTCP starts the TCP side on ap; network is "tcp", "tcp4" or "tcp6"
// (only those networks serve TCP).
func (l *Listener) listenTCP(ctx context.Context, network string, ap netip.AddrPort) error {
	var lc net.ListenConfig
	host := ""
	if !ap.Addr().IsUnspecified() {
		host = ap.Addr().String()
	}
	ln, err := lc.Listen(ctx, network, net.JoinHostPort(host, strconv.Itoa(int(ap.Port()))))
	if err != nil {
		return err
	}
	l.tcp = ln.(*net.TCPListener)
	return nil
}

// Listener accepts RDMA connections, TCP connections, or both at once. It
// implements net.Listener.
type Listener struct {
	cfg     Config
	backlog int

	rdma     *cm.ID // nil: no RDMA
	rdmaAddr *Addr
	rdmaWhy  *fallback.Error  // why there is no RDMA side, or nil
	tcp      *net.TCPListener // nil: no TCP

	// With both sides, a goroutine per side accepts and hands connections
	// to Accept through accepted.
	accepted chan acceptResult
	pumps    sync.WaitGroup
	done     chan struct{} // closed by Close
	closing  sync.Once
}

type acceptResult struct {
	c   net.Conn
	err error
}

// pump hands what accept returns to Accept until the listener closes, or,
// if fatal, until accept fails (the RDMA side's errors are all fatal; the
// TCP side's may be passing, like EMFILE, as for net.TCPListener).
func (l *Listener) pump(accept func() (net.Conn, error), fatal bool) {
	defer l.pumps.Done()
	for {
		c, err := accept()
		select {
		case l.accepted <- acceptResult{c, err}:
		case <-l.done:
			if c != nil {
				c.Close()
			}
			return
		}
		if err != nil && (fatal || errors.Is(err, net.ErrClosed)) {
			return
		}
	}
}

// Accept waits for the next connection and returns it: a *Conn for RDMA, a
// *TCPConn for TCP. Close unblocks it with net.ErrClosed. An RDMA request
// that cannot be served (its resources cannot be allocated, or its
// handshake does not finish) is rejected and Accept waits for the next.
func (l *Listener) Accept() (net.Conn, error) {
	switch {
	case l.accepted != nil:
		select {
		case r := <-l.accepted:
			return r.c, r.err
		case <-l.done:
			return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: net.ErrClosed}
		}
	case l.rdma != nil:
		return l.acceptRDMA()
	default:
		return l.acceptTCP()
	}
}

func (l *Listener) acceptTCP() (net.Conn, error) {
	c, err := l.tcp.AcceptTCP()
	if err != nil {
		return nil, err
	}
	counters.Accepted(fallback.TCP)
	var why error
	if l.rdmaWhy != nil {
		why = l.rdmaWhy
	}
	return &TCPConn{TCPConn: c, why: why}, nil
}

func (l *Listener) acceptRDMA() (net.Conn, error) {
	for {
		req, err := l.rdma.GetRequest(context.Background())
		if err != nil {
			if errors.Is(err, cm.ErrClosed) {
				err = net.ErrClosed
			}
			return nil, &net.OpError{Op: "accept", Net: Network, Addr: l.rdmaAddr, Err: err}
		}
		// A Valkey client sends no private data: Valkey's protocol.
		h, ok, err := wire.DecodeHello(req.Param.PrivateData)
		if err != nil {
			req.ID.Reject(rejectReason(err))
			req.ID.Close()
			continue
		}
		var agreed wire.Features
		if ok {
			agreed = h.Features & l.cfg.extensions()
		}
		c, err := newConn(req.ID, l.cfg, true)
		if err != nil {
			req.ID.Reject(rejectReason(err))
			req.ID.Close()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), acceptTimeout)
		// Retry forever on RNR, as for dials: the peer's writes wait for a
		// reposted receive instead of failing.
		err = req.ID.Accept(ctx, cm.ConnParam{PrivateData: l.cfg.hello(agreed), ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7})
		cancel()
		if err != nil {
			req.ID.Close()
			c.discard()
			continue
		}
		if err := c.start(agreed, h); err != nil {
			req.ID.Disconnect()
			req.ID.Close()
			c.discard()
			continue
		}
		counters.Accepted(fallback.RDMA)
		return c, nil
	}
}

// Close stops listening; pending Accepts return net.ErrClosed. Connections
// already accepted stay open; one accepted but not yet returned is closed.
func (l *Listener) Close() error {
	err := net.ErrClosed
	l.closing.Do(func() {
		close(l.done)
		var errs []error
		if l.rdma != nil {
			errs = append(errs, l.rdma.Close())
		}
		if l.tcp != nil {
			errs = append(errs, l.tcp.Close())
		}
		l.pumps.Wait()
		err = errors.Join(errs...)
	})
	if err != nil {
		return &net.OpError{Op: "close", Net: "tcp", Addr: l.Addr(), Err: err}
	}
	return nil
}

// Addr is the listening address: a *net.TCPAddr when the listener serves
// TCP (the RDMA side, if any, has the same IP and port number), else the
// RDMA side's *Addr.
func (l *Listener) Addr() net.Addr {
	if l.tcp != nil {
		return l.tcp.Addr()
	}
	return l.rdmaAddr
}

// Transports lists what the listener serves: fallback.RDMA, fallback.TCP or both.
func (l *Listener) Transports() []fallback.Transport {
	var ts []fallback.Transport
	if l.rdma != nil {
		ts = append(ts, fallback.RDMA)
	}
	if l.tcp != nil {
		ts = append(ts, fallback.TCP)
	}
	return ts
}

// RDMAError says why the listener serves no RDMA (a *fallback.Error), or
// nil when it does.
func (l *Listener) RDMAError() error {
	if l.rdmaWhy == nil {
		return nil
	}
	return l.rdmaWhy
}

// rejectPrefix starts the private data of a reject that says why, so the
// dialer can report the server's reason instead of a bare "rejected".
const rejectPrefix = "rdmanet: "

// maxRejectData is what a reject may carry on InfiniBand and RoCE.
const maxRejectData = 148

func rejectReason(err error) []byte {
	msg := rejectPrefix + err.Error()
	if len(msg) > maxRejectData {
		msg = msg[:maxRejectData]
	}
	return []byte(msg)
}
