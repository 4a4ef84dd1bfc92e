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

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/verbs"
)

// ListenConfig configures a listener, as net.ListenConfig does.
type ListenConfig struct {
	// Backlog is how many RDMA connection requests the listener holds at
	// once, in their handshake or established and waiting for Accept
	// (default 128); beyond it, as many again wait in the listening cm
	// ID's queue, and a request that finds that full is refused at once
	// with a resources reason (cm.ErrBacklogFull), which the dialer falls
	// back for and does not remember. A link group's streams wait for
	// Accept in a queue of Backlog of their own; a stream that finds it
	// full is refused, and its dialer asks again for up to 1.55 s (as a
	// TCP dialer sends its SYN again) before it makes a connection with a
	// queue pair of its own.
	Backlog int
	// Config sizes each accepted RDMA connection's buffers and queues.
	Config Config
	// Policy chooses the transports of a listener on a "tcp" network
	// (default fallback.Auto: RDMA and TCP at once, or TCP alone where RDMA
	// cannot be used). The environment variable fallback.EnvPolicy
	// overrides it. "rdma" networks serve RDMA only.
	Policy fallback.Policy
}

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
	l := &Listener{done: make(chan struct{})}
	backlog := cmp.Or(max(lc.Backlog, 0), 128)
	switch policy {
	case fallback.RDMAOnly:
		id, bound, why := listenRDMA(ap, backlog, listenCM)
		if why != nil {
			counters.FellBack(why.Reason)
			return nil, opErr(why)
		}
		l.startRDMA(id, bound, cfg, backlog, listenCM)
		return l, nil
	case fallback.TCPOnly:
		l.noRDMA = &fallback.Error{Reason: fallback.ReasonPolicy}
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
		port := l.tcp.Addr().(*net.TCPAddr).AddrPort().Port()
		id, bound, why := listenRDMA(netip.AddrPortFrom(ap.Addr(), port), backlog, listenCMBesideTCP)
		if why == nil {
			l.startRDMA(id, bound, cfg, backlog, listenCMBesideTCP)
			break
		}
		if iwarpPortConflict(ap.Addr(), why) {
			why = iwarpPortError(why.Err)
		} else if ap.Port() == 0 && errors.Is(why, syscall.EADDRINUSE) && try < 5 {
			l.tcp.Close()
			continue
		}
		l.noRDMA = why
		counters.FellBack(why.Reason)
		slog.Debug("rdmanet: listening on TCP only", "addr", l.tcp.Addr(), "reason", string(why.Reason), "err", why.Err)
		break
	}
	if l.rdma != nil {
		l.startTCPPump()
	}
	return l, nil
}

// listenRDMA makes the listening ID on ap, or says why it cannot.
func listenRDMA(ap netip.AddrPort, backlog int, listen listenFunc) (requestSource, netip.AddrPort, *fallback.Error) {
	if err := cm.Available(); err != nil {
		return nil, netip.AddrPort{}, &fallback.Error{Reason: fallback.Classify(err), Err: err}
	}
	// An address on an interface without RDMA can never take an RDMA
	// connection; say so rather than report rdma_cm's ENODEV.
	if !ap.Addr().IsUnspecified() {
		if _, err := verbs.DeviceForAddr(ap.Addr()); errors.Is(err, verbs.ErrNoDevice) {
			if _, derr := verbs.Devices(); derr == nil {
				return nil, netip.AddrPort{}, &fallback.Error{Reason: fallback.ReasonRouteNoRDMA, Err: err}
			}
		}
	}
	id, bound, err := listen(ap, backlog)
	if err != nil {
		return nil, netip.AddrPort{}, &fallback.Error{Reason: fallback.Classify(err), Err: err}
	}
	return id, bound, nil
}

// startRDMA serves RDMA connections from id, listening on bound.
func (l *Listener) startRDMA(id requestSource, bound netip.AddrPort, cfg Config, backlog int, listen listenFunc) {
	l.rdmaAddr = &Addr{bound}
	l.rdma = newRDMASide(bound, cfg, backlog)
	l.rdma.servesTCP = l.tcp != nil
	l.rdma.listen = listen // to listen again the same way
	l.rdma.start(id)
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
//
// Its RDMA side handshakes requests concurrently (up to
// ListenConfig.Backlog in hand, established or not yet) and retries passing
// errors (EMFILE, ENOMEM) after a pause; when its listening ID fails (the
// device is removed, the address changes) it makes it again on the same
// address and port, meanwhile serving TCP alone: Transports and RDMAError
// say so at every moment.
type Listener struct {
	tcp      *net.TCPListener // nil: no TCP
	rdma     *rdmaSide        // nil: no RDMA side (see noRDMA)
	rdmaAddr *Addr            // the RDMA side's address
	noRDMA   *fallback.Error  // why there is no RDMA side, or nil

	// With both sides, a goroutine accepts TCP connections and hands them
	// to Accept through tcpConns.
	tcpConns chan acceptResult
	pump     sync.WaitGroup
	done     chan struct{} // closed by Close
	closing  sync.Once
}

type acceptResult struct {
	c   net.Conn
	err error
}

// startTCPPump starts handing the TCP side's connections to Accept, which
// then waits on both sides.
func (l *Listener) startTCPPump() {
	l.pump.Add(1)
	l.tcpConns = make(chan acceptResult)
	go l.pumpTCP()
}

// pumpTCP hands what the TCP side accepts to Accept until the listener
// closes. Its errors go to Accept too: some are passing, like EMFILE, as
// for net.TCPListener.
func (l *Listener) pumpTCP() {
	defer l.pump.Done()
	for {
		tc, err := l.tcp.AcceptTCP()
		if err == nil && !l.classifyTCP(tc) {
			continue // a session's resume, or it may be: not for Accept (yet)
		}
		var c net.Conn
		if err == nil {
			c = l.wrapTCP(tc)
		}
		select {
		case l.tcpConns <- acceptResult{c, err}:
		case <-l.done:
			if c != nil {
				c.Close()
			}
			return
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// Accept waits for the next connection and returns it: a *Conn for RDMA, a
// *TCPConn for TCP. Close unblocks it with net.ErrClosed. An RDMA request
// that cannot be served (its resources cannot be allocated, or its
// handshake does not finish) is rejected and Accept waits for the next;
// errors taking RDMA requests are retried, never returned, so on the RDMA
// side Accept returns a connection or, after Close, net.ErrClosed.
//
// As a TCP listener may return a connection its client has reset, Accept
// may return a link group's stream whose dialer never saw it open: the
// group's link failed before the answer reached the dialer, which opened
// the stream again on another link. Such a stream receives nothing, and
// its Read and Write fail once the group's move timeout (15 s, plus
// 3 x KeepAlive at the listener) has passed (docs/protocol.md).
func (l *Listener) Accept() (net.Conn, error) {
	if l.rdma == nil {
		return l.acceptTCP()
	}
	select {
	case <-l.done:
		return nil, l.closedError()
	default:
	}
	select {
	case c := <-l.rdma.ready:
		l.rdma.taken()
		return c, nil
	case r := <-l.tcpConns: // nil, so never ready, without a TCP side
		return r.c, r.err
	case <-l.done:
		return nil, l.closedError()
	}
}

func (l *Listener) closedError() error {
	network := "tcp"
	if l.tcp == nil {
		network = Network
	}
	return &net.OpError{Op: "accept", Net: network, Addr: l.Addr(), Err: net.ErrClosed}
}

func (l *Listener) acceptTCP() (net.Conn, error) {
	c, err := l.tcp.AcceptTCP()
	if err != nil {
		return nil, err
	}
	return l.wrapTCP(c), nil
}

// wrapTCP makes an accepted TCP connection the Listener's and counts it.
func (l *Listener) wrapTCP(c *net.TCPConn) *TCPConn {
	counters.Accepted(fallback.TCP)
	var why error
	if e := l.rdmaWhy(); e != nil {
		why = e
	}
	return &TCPConn{TCPConn: c, why: why}
}

// Close stops listening; pending Accepts return net.ErrClosed. Connections
// already accepted stay open; those established but not yet returned by
// Accept are closed, and handshakes in progress end.
func (l *Listener) Close() error {
	err := net.ErrClosed
	l.closing.Do(func() {
		close(l.done)
		err = nil
		if l.tcp != nil {
			err = l.tcp.Close()
		}
		if l.rdma != nil {
			l.rdma.close()
		}
		l.pump.Wait()
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

// Transports lists what the listener serves now: fallback.RDMA,
// fallback.TCP or both. While the RDMA side is being made again after a
// failure, it is not listed.
func (l *Listener) Transports() []fallback.Transport {
	ts := make([]fallback.Transport, 0, 2)
	if l.rdma != nil {
		if up, _ := l.rdma.serving(); up {
			ts = append(ts, fallback.RDMA)
		}
	}
	if l.tcp != nil {
		ts = append(ts, fallback.TCP)
	}
	return ts
}

// RDMAError says why the listener serves no RDMA now (a *fallback.Error),
// or nil when it does.
func (l *Listener) RDMAError() error {
	if e := l.rdmaWhy(); e != nil {
		return e
	}
	return nil
}

func (l *Listener) rdmaWhy() *fallback.Error {
	if l.rdma == nil {
		return l.noRDMA
	}
	_, why := l.rdma.serving()
	return why
}

// Stats counts what happened on the listener's RDMA side (zero without one).
func (l *Listener) Stats() ListenerStats {
	if l.rdma == nil {
		return ListenerStats{}
	}
	return l.rdma.stats()
}

// rejectPrefix starts the private data of a reject that says why, so the
// dialer can report the server's reason instead of a bare "rejected".
const rejectPrefix = "rdmanet: "

// maxRejectData is what a reject may carry on InfiniBand and RoCE.
const maxRejectData = 148

// refusedForResources starts the reason of a reject for want of resources
// (descriptors, memory, queue pairs), so the dialer falls back for
// fallback.ReasonResources, which it does not remember: this server may
// have them again for the next dial.
const refusedForResources = string(fallback.ReasonResources) + ": "

// rejectReason is the private data of a reject for err.
func rejectReason(err error) []byte {
	msg := rejectPrefix + err.Error()
	if fallback.Classify(err) == fallback.ReasonResources {
		msg = rejectPrefix + refusedForResources + err.Error()
	}
	if len(msg) > maxRejectData {
		msg = msg[:maxRejectData]
	}
	return []byte(msg)
}
