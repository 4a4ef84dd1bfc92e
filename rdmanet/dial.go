package rdmanet

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/session"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// Dialer connects to RDMA listeners, falling back to TCP where its network
// and policy allow; its zero value is ready to use. Its fields mirror
// net.Dialer's where they make sense.
type Dialer struct {
	// Timeout bounds the whole dial: address and route resolution, the RDMA
	// attempt and, after a fallback, the TCP connect. Zero means no limit
	// beyond the context's.
	Timeout time.Duration
	// LocalAddr, if set, picks the local address and so the RDMA device:
	// an *Addr, a *net.TCPAddr or a *net.IPAddr (only the IP is used).
	LocalAddr net.Addr
	// Config sizes the connection's buffers and queues.
	Config Config
	// Policy chooses the transports of a dial on a "tcp" network (default
	// fallback.Auto: RDMA when it works, TCP otherwise). The environment
	// variable fallback.EnvPolicy overrides it. "rdma" networks never fall back.
	Policy fallback.Policy
	// RDMATimeout bounds, in a dial that may fall back, the wait for the
	// peer's answer to the RDMA connection request (default 1 s): a peer
	// whose host has no RDMA never answers, and the dial falls back to TCP
	// after this long. The failure is then remembered for a minute, so later
	// dials to that address go straight to TCP (see ForgetFailures), and a
	// request answered after the dial stopped waiting (it is watched for a
	// few seconds more) forgets it. A host that answered over RDMA within
	// that minute, on any port, is busy, not without RDMA: the dial waits
	// up to 10 s for its answer instead (at most half of what its context
	// has left), and if it falls back all the same the failure is not
	// remembered (the fallback's Error says PeerAnswers). With the default,
	// a dial whose own steps before the request (resolving the route,
	// making its queues, registering memory) were slow, as on a loaded
	// host, waits 10 times as long as they took if that is longer, up to
	// the same 10 s: its handshake is slow, which is not a host without
	// RDMA. Another timeout set here is kept as given.
	RDMATimeout time.Duration
	// FailoverAddrs are other addresses of the same server ("ip" or
	// "ip:port"; the port defaults to the dialed one), for a resumable
	// session (Config.ResumeTimeout) to move to when the path it runs on
	// fails: another port of the server, on another network.
	FailoverAddrs []string
}

// defaultRDMATimeout is Dialer.RDMATimeout's default: far above an RDMA
// connection's set-up (under a millisecond on hardware, tens of milliseconds
// in the lab's emulated CPU), so that a fallback means the peer's host did
// not answer.
const defaultRDMATimeout = time.Second

// Dial connects to address ("host:port"). On network "tcp", "tcp4" or
// "tcp6" it uses RDMA when it can and TCP otherwise (see Dialer.DialContext);
// on "rdma", "rdma4" or "rdma6" it uses RDMA only.
func Dial(network, address string) (net.Conn, error) {
	var d Dialer
	return d.DialContext(context.Background(), network, address)
}

// Dial connects to address; see DialContext.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DialContext connects to address ("host:port").
//
// On network "rdma", "rdma4" or "rdma6" the connection is RDMA (a *Conn) or
// the dial fails. On "tcp", "tcp4" or "tcp6" it is RDMA when RDMA works and
// TCP (a *TCPConn) when it does not, as Policy and fallback.EnvPolicy
// allow; TransportOf tells which and why. Nothing is sent to a TCP peer
// that a plain TCP client would not send: RDMA is tried first, over rdma_cm,
// and the TCP connection is made only after it failed.
//
// The context bounds the whole dial; when it ends, the dial fails rather
// than fall back. Errors are *net.OpError. When RDMA was required and
// could not be used, the error wraps a *fallback.Error, so errors.Is
// matches its reason (fallback.ReasonNoDevice, ...) and the set-up error
// (cm.ErrRejected, ...).
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	opErr := func(addr net.Addr, err error) error {
		return &net.OpError{Op: "dial", Net: network, Source: d.LocalAddr, Addr: addr, Err: err}
	}
	family, rdmaNetwork, err := parseNetwork(network)
	if err != nil {
		return nil, opErr(nil, err)
	}
	policy := fallback.RDMAOnly
	if !rdmaNetwork {
		if policy, err = fallback.Effective(d.Policy); err != nil {
			return nil, opErr(nil, err)
		}
	}
	cfg, err := d.Config.withDefaults()
	if err != nil {
		return nil, opErr(nil, err)
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	dst, err := resolveAddr(ctx, family, address)
	if err != nil {
		return nil, opErr(nil, err)
	}
	raddr := net.Addr(&Addr{dst})
	if !rdmaNetwork {
		raddr = net.TCPAddrFromAddrPort(dst)
	}
	src, err := localIP(d.LocalAddr)
	if err != nil {
		return nil, opErr(raddr, err)
	}

	var why *fallback.Error
	switch {
	case policy == fallback.TCPOnly:
		why = &fallback.Error{Reason: fallback.ReasonPolicy}
	case policy == fallback.Auto:
		why = failures.Recall(dst)
	}
	if why == nil {
		why = fallback.Check(dst, src)
	}
	if why == nil {
		var answerWait time.Duration
		if policy == fallback.Auto {
			answerWait = cmp.Or(d.RDMATimeout, defaultRDMATimeout)
		}
		alts, err := d.failoverAddrs(dst)
		if err != nil {
			return nil, opErr(raddr, err)
		}
		var c *Conn
		viaGroup := false
		if cfg.groups() {
			c, viaGroup, err = dialStream(ctx, src, dst, alts, cfg, answerWait)
		}
		if !viaGroup {
			c, err = dialRetrying(ctx, dst, policy, func() (*Conn, error) {
				return dial(ctx, src, dst, alts, cfg, answerWait)
			})
		}
		if err == nil {
			failures.Answered(dst)
			counters.Dialed(fallback.RDMA)
			return c, nil
		}
		if ctx.Err() != nil {
			// The caller's context ended: that is the dial's outcome.
			return nil, opErr(raddr, err)
		}
		// Only the answer's wait has a deadline of its own: a deadline
		// error with the caller's context alive is the peer's silence.
		why = attemptFailed(dst, err)
		countConnectFailure(why.Reason)
	}
	counters.FellBack(why.Reason)
	if policy == fallback.RDMAOnly {
		return nil, opErr(raddr, why)
	}
	// Checked first: building the log call's arguments allocates, and the
	// dial to a host without RDMA must cost what net.Dial costs.
	if slog.Default().Enabled(ctx, slog.LevelDebug) {
		slog.Debug("rdmanet: dialing over TCP", "addr", dst, "reason", string(why.Reason), "remembered", why.Remembered, "err", why.Err)
	}
	td := net.Dialer{}
	if src.IsValid() {
		td.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	tc, err := td.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		return nil, err // already a *net.OpError
	}
	counters.Dialed(fallback.TCP)
	return &TCPConn{TCPConn: tc.(*net.TCPConn), why: why}, nil
}

// maxPortTries is how many connection requests, each from an ID of its
// own, a dial makes while they fail for a passing reason (dialRetrying).
// rdma_cm picks each ID's port at random, so a second clash of ports in a
// row is rare; the third's error is the dial's.
const maxPortTries = 3

// dialRetrying makes attempt, and makes it again while it fails for a
// passing reason and ctx lasts, up to maxPortTries in all:
//   - rdma_connect found its local port busy (cm.ErrLocalPortBusy: on
//     iWARP, the kernel still holds a connection of the same ports), which
//     another ID's port does not meet;
//   - in a dial that may not fall back (an "rdma" network), the request
//     timed out toward a host that answered over RDMA within the failure
//     memory's TTL: a busy peer, as a TCP dialer sends its SYN again. (In
//     the lab, with the host loaded and 5,000 connections open on
//     Soft-iWARP, the kernel's own connect timed out, UNREACHABLE.) A dial
//     that may fall back waited for a busy peer already (busyAnswerWait)
//     and goes to TCP instead;
//   - the peer answered, and the set-up failed after its answer
//     (cm.ErrConnectFailed: in the lab, with the host loaded and 5,000
//     connections opening on rxe, "CONNECT_ERROR: operation not
//     permitted"): RDMA reaches the peer, so the dial does not give it up
//     for one such failure.
//
// A session's resume on an RDMA path retries the same way (with
// fallback.Auto: a timeout goes on to its next path).
func dialRetrying[T any](ctx context.Context, dst netip.AddrPort, policy fallback.Policy, attempt func() (T, error)) (c T, err error) {
	c, err = attempt()
	for try := 1; err != nil && try < maxPortTries && ctx.Err() == nil; try++ {
		busyTimeout := policy == fallback.RDMAOnly && failures.Answers(dst) && fallback.Classify(err) == fallback.ReasonTimeout
		if !errors.Is(err, cm.ErrLocalPortBusy) && !busyTimeout && !errors.Is(err, cm.ErrConnectFailed) {
			break
		}
		slog.Debug("rdmanet: the connection request failed for a passing reason; making it again", "addr", dst, "try", try+1, "err", err)
		c, err = attempt()
	}
	return c, err
}

// dial makes an RDMA connection. answerWait, if positive, bounds the wait
// for the peer's answer to the connection request (the rest is bounded by
// ctx): a host without RDMA never answers, while address and route
// resolution, and the first use of rdma_cm in a process, take their own
// time whatever the peer. alts are the server's other addresses, for a
// session to resume on.
func dial(ctx context.Context, src netip.Addr, dst netip.AddrPort, alts []netip.AddrPort, cfg Config, answerWait time.Duration) (_ *Conn, err error) {
	if err := cm.Available(); err != nil {
		return nil, err
	}
	id, err := cm.NewID()
	if err != nil {
		return nil, err
	}
	setupStart := time.Now()
	var c *Conn
	defer func() {
		if err != nil && id != nil {
			id.Close()
			if c != nil {
				c.discard()
			}
		}
	}()
	if err := id.Resolve(ctx, src, dst); err != nil {
		return nil, err
	}
	if err := dialSetups.enter(ctx); err != nil {
		return nil, err
	}
	offer := cfg.extensions()
	var mem *ringMem
	var port *tcpPortReservation
	if offer&wire.FeatureResume != 0 {
		// A session keeps a TCP source port, to resume over TCP from it;
		// without one it resumes over RDMA only.
		if port, err = reserveTCPPort(dst.Addr()); err != nil {
			slog.Debug("rdmanet: no TCP port for resuming sessions", "err", err)
		}
		mem, err = newRingMem(cfg)
	}
	defer func() {
		if err != nil || c.sess == nil {
			port.close()
		}
	}()
	if err == nil {
		c, err = newConn(id, cfg, false, mem, false)
	}
	dialSetups.leave()
	if err != nil {
		mem.close()
		return nil, err
	}
	var hello []byte
	if offer != 0 {
		h := linkHello(cfg.helloOf(offer), c.rdma)
		if port != nil {
			h.TCPPort = port.port
		}
		hello = h.Encode()
	} else if c.rdma.Needs() != 0 {
		return nil, noImmediate(c.rdma, "Config.ValkeyCompatible speaks Valkey's protocol only")
	}
	peer, err := connectAnswered(ctx, id, dst, hello, answerWait, time.Since(setupStart))
	if err != nil {
		if watchUnanswered(err, dst, id, c.discard) {
			id = nil // the watch owns it, and c, now
		}
		return nil, err
	}
	// A Valkey server accepts with no private data: Valkey's protocol.
	h, ok, err := wire.DecodeHello(peer.PrivateData)
	if err != nil {
		return nil, err
	}
	var agreed wire.Features
	if ok {
		agreed = h.Features & (offer | wire.LinkFeatures)
	}
	if err := checkLinkAnswer(agreed&wire.LinkFeatures, ok, c.rdma); err != nil {
		id.Disconnect()
		return nil, err
	}
	if agreed&wire.FeatureResume != 0 {
		if h.Session.IsZero() {
			return nil, &wire.ProtocolError{Reason: "the server agreed on sessions and named none"}
		}
		// The paths are the session's before the engine starts: once it
		// runs, a lost link starts the session's recovery, which reads
		// them to tell the dialer (which redials) from the server (which
		// waits).
		paths := rdmaResumePaths(mem, src, append([]netip.AddrPort{dst}, alts...), cfg)
		resume := cfg.helloOf(agreed &^ wire.LinkFeatures)
		if port != nil {
			paths = append(paths, tcpResumePath(mem, port.port, id.LocalAddr().Addr(), dst, cfg))
			resume.TCPPort = port.port
		}
		c.becomeSession(session.Config{ID: h.Session, Gen: h.Generation, Hello: resume, Paths: paths, Closed: port.close})
	}
	if err := c.start(agreed, h); err != nil {
		return nil, err
	}
	if dialStarted != nil {
		dialStarted(c)
	}
	return c, nil
}

// connectAnswered sends id's connection request with private data and
// waits for the peer's answer, at most answerWait for the answer itself
// (answerContext; the rest is bounded by ctx). A peer that did not answer
// in time is errNoAnswer or errNoBusyAnswer, the ID still open; a reject
// with an rdmanet server's reason is a *ServerRefusedError.
//
// setup is how long the dial's own steps before the request took (address
// and route resolution, the wait for a set-up turn, its queues and memory):
// a dial whose own steps were slow waits longer (loadedAnswerWait).
func connectAnswered(ctx context.Context, id *cm.ID, dst netip.AddrPort, private []byte, answerWait, setup time.Duration) (cm.ConnParam, error) {
	answerWait = loadedAnswerWait(ctx, answerWait, setup)
	connectCtx, stopWait := answerContext(ctx, dst, answerWait, busyAnswerWait)
	defer stopWait()
	sent := time.Now()
	peer, err := id.Connect(connectCtx, dialParam(private))
	if err != nil {
		if cause := context.Cause(connectCtx); ctx.Err() == nil && (cause == errNoAnswer || cause == errNoBusyAnswer) {
			return peer, fmt.Errorf("%w (waited %v; this dial's own set-up took %v)", cause, time.Since(sent).Round(time.Millisecond), setup.Round(time.Millisecond))
		}
		return peer, withRejectReason(err)
	}
	return peer, nil
}

// dialParam is a connection request's parameters, as libvalkey's:
// responder resources and initiator depth 1, and an RNR retry count of 7
// (retry forever: a peer slow to repost receives delays this side's
// writes instead of failing them). The transport retry count is 6, not
// libvalkey's 7: some devices (rxe) treat 7 as "forever", and then a dead
// peer is never noticed. Both sides' queue pairs use it.
func dialParam(private []byte) cm.ConnParam {
	return cm.ConnParam{PrivateData: private, ResponderResources: 1, InitiatorDepth: 1, RetryCount: transportRetries, RNRRetryCount: 7}
}

// acceptParam is an accept's parameters: dialParam's, whose retry counts
// are the dialer's to give.
func acceptParam(private []byte) cm.ConnParam {
	return cm.ConnParam{PrivateData: private, ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7}
}

// dialStarted, set by tests (export_test.go), is called with each
// connection a dial started, before the dial returns: its engine runs, and
// its link may already be lost.
var dialStarted func(*Conn)

// parseNetwork gives a network's address family ("ip", "ip4" or "ip6") and
// whether it names RDMA (and so never falls back).
func parseNetwork(network string) (family string, rdmaNetwork bool, err error) {
	switch network {
	case "rdma", "tcp":
		family = "ip"
	case "rdma4", "tcp4":
		family = "ip4"
	case "rdma6", "tcp6":
		family = "ip6"
	default:
		return "", false, net.UnknownNetworkError(network)
	}
	return family, strings.HasPrefix(network, "rdma"), nil
}

// resolveAddr turns "host:port" into one address of family ("ip", "ip4" or "ip6").
func resolveAddr(ctx context.Context, family, address string) (netip.AddrPort, error) {
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, err
	}
	port, err := net.DefaultResolver.LookupPort(ctx, "tcp", portStr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if host == "" {
		if family == "ip6" {
			return netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(port)), nil
		}
		return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(port)), nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if (family == "ip4" && !ip.Unmap().Is4()) || (family == "ip6" && ip.Is4()) {
			return netip.AddrPort{}, &net.AddrError{Err: "address of the wrong family for " + family, Addr: host}
		}
		return netip.AddrPortFrom(ip.Unmap(), uint16(port)), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, family, host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(ips) == 0 {
		return netip.AddrPort{}, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	return netip.AddrPortFrom(ips[0].Unmap(), uint16(port)), nil
}

// localIP is the IP of a Dialer's LocalAddr, or the zero Addr (let routing pick).
// A nil pointer in the interface means no address, as it does to net.Dialer.
func localIP(a net.Addr) (netip.Addr, error) {
	switch a := a.(type) {
	case nil:
		return netip.Addr{}, nil
	case *Addr:
		if a == nil {
			return netip.Addr{}, nil
		}
		return a.Addr(), nil
	case *net.TCPAddr:
		if a == nil {
			return netip.Addr{}, nil
		}
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), nil
	case *net.IPAddr:
		if a == nil {
			return netip.Addr{}, nil
		}
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), nil
	}
	return netip.Addr{}, fmt.Errorf("rdmanet: local address of type %T", a)
}

// ServerRefusedError is a connection an rdmanet server rejected, with the
// reason it gave (for example, it could not allocate the connection's
// resources). It matches cm.ErrRejected.
type ServerRefusedError struct {
	Reason string
	Err    error // the *cm.EventError
}

func (e *ServerRefusedError) Error() string { return "server refused: " + e.Reason }
func (e *ServerRefusedError) Unwrap() error { return e.Err }

// Is matches verbs.ErrNoImmediate when the server refused for it (its
// device, or this side's, has no immediate data, which the Valkey
// protocol that one side speaks needs): the refusal carries the error's
// text (rejectReason), so the dialer falls back for
// fallback.ReasonNoImmediate and remembers it, as when it finds that out
// itself.
//
// It matches fallback.ReasonResources when the server refused for want of
// resources (rejectReason), so the dialer falls back for that reason, which
// is not remembered, rather than for a rejection, which is.
func (e *ServerRefusedError) Is(target error) bool {
	switch target {
	case verbs.ErrNoImmediate:
		return strings.HasPrefix(e.Reason, verbs.ErrNoImmediate.Error())
	case fallback.ReasonResources:
		return strings.HasPrefix(e.Reason, refusedForResources)
	}
	return false
}

// withRejectReason turns a reject that carries an rdmanet server's reason
// into a *ServerRefusedError.
func withRejectReason(err error) error {
	var ee *cm.EventError
	if !errors.As(err, &ee) || !errors.Is(err, cm.ErrRejected) {
		return err
	}
	data := string(bytes.TrimRight(ee.PrivateData, "\x00"))
	if !strings.HasPrefix(data, rejectPrefix) {
		return err
	}
	return &ServerRefusedError{Reason: strings.TrimPrefix(data, rejectPrefix), Err: err}
}

// failoverAddrs resolves FailoverAddrs, with dst's port where they name none.
func (d *Dialer) failoverAddrs(dst netip.AddrPort) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, a := range d.FailoverAddrs {
		if ap, err := netip.ParseAddrPort(a); err == nil {
			out = append(out, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
			continue
		}
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, fmt.Errorf("rdmanet: failover address %q: want an IP address, with or without a port", a)
		}
		out = append(out, netip.AddrPortFrom(ip.Unmap(), dst.Port()))
	}
	return out, nil
}
