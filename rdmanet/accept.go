package rdmanet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/wire"
)

// The RDMA side of a Listener. One goroutine takes connection requests from
// the listening cm ID; each request's handshake (its resources, the accept,
// the wait for the peer's confirmation) runs in a goroutine of its own, so a
// slow or stalled peer delays no other, and a finished connection waits in
// a queue for Accept. A listener that handshakes one request at a time makes
// the dialers queued behind it wait past their RDMATimeout and fall back to
// TCP because the server was busy, which they then take for a host without
// RDMA. Making the resources is CPU work, done a few at a time (setup.go);
// the waits for the network are all concurrent.
//
// Bounds: a slot is taken before a request is, and given back when the
// request's handshake fails or Accept takes its connection; there are
// Backlog slots. So at most Backlog requests are in hand (in handshake or
// queued), and when nobody calls Accept further requests wait in the
// listening ID's queue (package cm), as many as Backlog, and beyond it are
// refused for want of resources, never held in goroutines of ours.

// acceptTimeout bounds the handshake of one accepted connection, so a peer
// that requests and never completes holds its slot only this long. A
// variable for a test that needs a stalled handshake to outlast any dial
// on a loaded host; read when a handshake starts.
var acceptTimeout = defaultAcceptTimeout

const defaultAcceptTimeout = 10 * time.Second

// Pauses after an error taking requests or listening, as net/http's Serve
// makes after a temporary Accept error: from minBackoff, doubling up to
// maxBackoff.
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = time.Second
)

// nextBackoff is the pause after one of d (0: none yet).
func nextBackoff(d time.Duration) time.Duration {
	if d == 0 {
		return minBackoff
	}
	return min(2*d, maxBackoff)
}

// requestSource is what the RDMA side needs of its listening cm ID (a
// *cm.ID); tests give it fakes.
type requestSource interface {
	GetRequest(ctx context.Context) (*cm.Request, error)
	Close() error
}

// listenFunc makes a listening ID bound to ap and returns it with the
// address it got (port 0 picks one). On failure the ID is a nil interface;
// callers go by the error all the same.
type listenFunc func(ap netip.AddrPort, backlog int) (requestSource, netip.AddrPort, error)

// listenCM is the listenFunc of real listeners that serve RDMA only.
func listenCM(ap netip.AddrPort, backlog int) (requestSource, netip.AddrPort, error) {
	return asSource(listenOne(ap, backlog))
}

// asSource returns a listening ID as a requestSource: a failed listen's nil
// *cm.ID as a nil interface, not as a non-nil one holding nil.
func asSource(id *cm.ID, ap netip.AddrPort, err error) (requestSource, netip.AddrPort, error) {
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	return id, ap, nil
}

// listenCMBesideTCP is the listenFunc of listeners that serve TCP on the
// same port: on a wildcard address of a host with an iWARP device, it
// leaves the iWARP devices out (listen_each.go).
func listenCMBesideTCP(ap netip.AddrPort, backlog int) (requestSource, netip.AddrPort, error) {
	if listenBesideIWARP(ap) {
		return listenEach(ap, backlog)
	}
	return asSource(listenOne(ap, backlog))
}

// listenOne makes one listening ID on ap.
func listenOne(ap netip.AddrPort, backlog int) (*cm.ID, netip.AddrPort, error) {
	id, err := cm.NewID()
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	if err := id.Bind(ap); err != nil {
		id.Close()
		return nil, netip.AddrPort{}, err
	}
	if err := id.Listen(backlog); err != nil {
		id.Close()
		return nil, netip.AddrPort{}, err
	}
	id.SetRequestReject(rejectReason)
	return id, id.LocalAddr(), nil
}

// ListenerStats counts what happened on a listener's RDMA side.
type ListenerStats struct {
	// Handshakes is how many RDMA connections were established (returned
	// by Accept, or waiting for it).
	Handshakes uint64
	// Handshaking is how many requests are in their handshake now.
	Handshaking int
	// HandshakeFailures is how many requests were rejected or did not
	// complete their handshake (the peer gave up, acceptTimeout passed).
	HandshakeFailures uint64
	// RequestErrors is how many passing errors taking requests (EMFILE,
	// ENOMEM, an interrupted wait) were retried after a pause.
	RequestErrors uint64
	// Stops is how often the listening ID failed (a device removed, an
	// address change, another error, an iWARP listener's socket lost);
	// Restarts how often it was made again on the same address and port.
	// Between the two the listener serves TCP alone. A lost iWARP socket
	// is never followed by a restart (RDMAError says why).
	Stops, Restarts uint64
	// Sessions is how many resumable sessions the listener keeps now.
	// Resumes counts sessions resumed on a new link (RDMA or TCP);
	// RefusedResumes, requests to resume that were refused (an unknown,
	// stale or ended session: a restarted server, a replay, a guess).
	Sessions                int
	Resumes, RefusedResumes uint64
	// TCPSniffs counts TCP connections the listener held back to look for
	// a resume Hello, because they came from a session's reserved port
	// (docs/protocol.md); every other TCP connection goes to Accept at
	// once.
	TCPSniffs uint64
}

// rdmaSide is a listener's RDMA side; see the comment at the top.
type rdmaSide struct {
	cfg  Config
	addr netip.AddrPort // where it listens, port included, for every restart
	// servesTCP: the listener takes TCP on the same port too, so a link
	// group's dialer may make its TCP link there (group_tcp.go).
	servesTCP bool

	// listen makes the listening ID again after a failure; handshake makes
	// a request a connection; pause waits d unless the listener closes
	// first. Tests replace them.
	listen       listenFunc
	tcpListening func(netip.AddrPort) (bool, error) // the iWARP listen watch's question; tests give fakes
	handshake    func(ctx context.Context, req *cm.Request) (net.Conn, error)
	pause        func(ctx context.Context, d time.Duration) bool

	slots chan struct{} // Backlog of them; see the comment at the top
	ready chan net.Conn // established, waiting for Accept; room for every slot

	ctx  context.Context // ends when the listener closes
	stop context.CancelFunc
	wg   sync.WaitGroup // the request loop and the handshakes

	mu  sync.Mutex
	why *fallback.Error // why RDMA is not served now; nil while listening

	handshakes, handshakeFailures, requestErrors, stops, restarts atomic.Uint64
	handshaking                                                   atomic.Int64

	sessions                           *sessionTable // the resumable sessions this side accepted
	resumes, refusedResumes, tcpSniffs atomic.Uint64

	// servingID is the listening ID run serves now, for the iWARP listen
	// watch (watchIWARPListen); lostID is the one the watch found without
	// its socket, which run keeps instead of closing. Both under mu.
	servingID, lostID requestSource
}

func newRDMASide(addr netip.AddrPort, cfg Config, backlog int) *rdmaSide {
	s := &rdmaSide{cfg: cfg, addr: addr, listen: listenCM, tcpListening: tcpListening, pause: pause,
		slots: make(chan struct{}, backlog), ready: make(chan net.Conn, backlog), sessions: newSessionTable()}
	s.handshake = s.accept
	s.ctx, s.stop = context.WithCancel(context.Background())
	return s
}

// start serves id's requests until close.
func (s *rdmaSide) start(id requestSource) {
	s.wg.Add(1)
	go s.run(id)
	if s.listensOnIWARP() {
		s.wg.Add(1)
		go s.watchIWARPListen(iwarpListenCheck)
	}
}

// close stops taking requests, ends every handshake, closes the listening
// ID and the connections nobody accepted, and returns once nothing of the
// side runs.
func (s *rdmaSide) close() {
	s.stop()
	s.wg.Wait()
	for {
		select {
		case c := <-s.ready:
			<-s.slots
			c.Close()
		default:
			return
		}
	}
}

// taken gives back the slot of a connection Accept took from ready.
func (s *rdmaSide) taken() {
	<-s.slots
	counters.Accepted(fallback.RDMA)
}

// serving reports whether the side listens now, and why not.
func (s *rdmaSide) serving() (bool, *fallback.Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.why == nil, s.why
}

func (s *rdmaSide) setWhy(why *fallback.Error) {
	s.mu.Lock()
	s.why = why
	s.mu.Unlock()
}

func (s *rdmaSide) stats() ListenerStats {
	return ListenerStats{
		Handshakes:        s.handshakes.Load(),
		Handshaking:       int(s.handshaking.Load()),
		HandshakeFailures: s.handshakeFailures.Load(),
		RequestErrors:     s.requestErrors.Load(),
		Stops:             s.stops.Load(),
		Restarts:          s.restarts.Load(),
		Sessions:          s.sessions.len(),
		Resumes:           s.resumes.Load(),
		RefusedResumes:    s.refusedResumes.Load(),
		TCPSniffs:         s.tcpSniffs.Load(),
	}
}

// pause waits d, or less if ctx ends first (it then reports false).
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// run serves id, and when id fails makes it again, until close.
func (s *rdmaSide) run(id requestSource) {
	defer s.wg.Done()
	// The pause before listening again grows while listening keeps failing
	// or the new ID fails before serving a request.
	var delay time.Duration
	for {
		s.mu.Lock()
		s.servingID = id
		s.mu.Unlock()
		served, err := s.serve(id)
		s.mu.Lock()
		s.servingID = nil
		lost := s.lostID == id
		s.mu.Unlock()
		if lost {
			// Neither destroyed nor made again: the ID holds the port
			// (listen_iwarp.go).
			keepLostListener(id)
			return
		}
		id.Close()
		if err == nil {
			return // closed
		}
		if served {
			delay = 0
		}
		s.stops.Add(1)
		s.setWhy(stopped(err))
		slog.Warn("rdmanet: the RDMA listener stopped; listening again", "addr", s.addr, "err", err)
		// The error, not the ID, says whether listening worked.
		for err != nil {
			delay = nextBackoff(delay)
			if !s.pause(s.ctx, delay) {
				return
			}
			if id, _, err = s.listen(s.addr, cap(s.slots)); err != nil {
				s.setWhy(stopped(err))
			}
		}
		s.restarts.Add(1)
		s.setWhy(nil)
		slog.Info("rdmanet: the RDMA listener listens again", "addr", s.addr)
	}
}

// stopped is why a listener whose RDMA side stopped on err serves TCP alone.
func stopped(err error) *fallback.Error {
	return &fallback.Error{Reason: fallback.Classify(err), Err: fmt.Errorf("the RDMA listener stopped and is being made again: %w", err)}
}

// serve takes id's requests and starts their handshakes until the listener
// closes (nil) or id fails (the error); served says whether it took any
// request.
func (s *rdmaSide) serve(id requestSource) (served bool, err error) {
	var delay time.Duration
	for {
		select {
		case s.slots <- struct{}{}:
		case <-s.ctx.Done():
			return served, nil
		}
		req, err := id.GetRequest(s.ctx)
		if err != nil {
			<-s.slots
			switch {
			case s.ctx.Err() != nil:
				return served, nil
			case passing(err):
				s.requestErrors.Add(1)
				delay = nextBackoff(delay)
				slog.Debug("rdmanet: taking an RDMA connection request failed; retrying", "addr", s.addr, "err", err, "pause", delay)
				if !s.pause(s.ctx, delay) {
					return served, nil
				}
				continue
			}
			return served, err
		}
		served, delay = true, 0
		s.handshaking.Add(1)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			c, err := s.handshake(s.ctx, req)
			s.handshaking.Add(-1)
			if err != nil {
				s.handshakeFailures.Add(1)
				<-s.slots
				slog.Debug("rdmanet: an RDMA connection request failed its handshake", "addr", s.addr, "err", err)
				return
			}
			if c == nil { // a session resumed: its Conn is the application's already
				<-s.slots
				return
			}
			s.handshakes.Add(1)
			s.ready <- c // never blocks: ready has room for every slot
		}()
	}
}

// passing reports an error taking a request that a pause may cure: the
// listening ID is fine, this process or host lacks something for a moment.
func passing(err error) bool {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOBUFS,
		syscall.EAGAIN, syscall.EINTR, syscall.ECONNABORTED} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// accept makes a request an established connection, or rejects it: newConn
// (every receive posted before the peer can send), Accept, start.
func (s *rdmaSide) accept(ctx context.Context, req *cm.Request) (net.Conn, error) {
	// A Valkey client sends no private data: Valkey's protocol.
	h, ok, err := wire.DecodeHello(req.Param.PrivateData)
	if err != nil {
		req.ID.Reject(rejectReason(err))
		req.ID.Close()
		return nil, err
	}
	var agreed wire.Features
	if ok {
		agreed = h.Features & s.cfg.extensions()
	}
	ctx, cancel := context.WithTimeout(ctx, acceptTimeout)
	defer cancel()
	if ok && h.Resume {
		if agreed&wire.FeatureResume == 0 {
			req.ID.Reject([]byte(rejectPrefix + refusedPrefix + "this listener keeps no sessions"))
			req.ID.Close()
			return nil, fmt.Errorf("%w: this listener keeps no sessions", ErrSessionRefused)
		}
		return nil, s.acceptResume(ctx, req, h)
	}
	if ok && h.Features&wire.FeatureGroup != 0 {
		if !s.cfg.groups() {
			// Refused in words the dialer knows, so that it makes a
			// connection of its own at once.
			req.ID.Reject([]byte(rejectPrefix + noGroupsReason))
			req.ID.Close()
			return nil, errNoGroup
		}
		return nil, s.acceptGroup(ctx, req, h)
	}
	if err := acceptSetups.enter(ctx); err != nil {
		req.ID.Reject(rejectReason(err))
		req.ID.Close()
		return nil, err
	}
	var mem *ringMem
	if agreed&wire.FeatureResume != 0 {
		mem, err = newRingMem(s.cfg)
	}
	// A shared receive queue toward a dialer that takes credit grants; a
	// session's links keep receives of their own for now.
	grants := wire.FeatureRecvCredit | wire.FeatureRecvGrant
	shared := s.cfg.sharedRecv && ok && h.Features&grants == grants && mem == nil
	var c *Conn
	if err == nil {
		c, err = newConn(req.ID, s.cfg, true, mem, shared)
	}
	acceptSetups.leave()
	var linkFeatures wire.Features
	if err == nil {
		if linkFeatures, err = chooseLinkFeatures(h, ok, c.rdma, s.cfg.extensions()); err != nil {
			req.ID.Reject(rejectReason(err))
			req.ID.Close()
			c.discard() // after the ID, which owns the queue pair
			return nil, err
		}
	}
	if err != nil {
		mem.close()
		req.ID.Reject(rejectReason(err))
		req.ID.Close()
		return nil, err
	}
	agreed |= linkFeatures
	accept := s.cfg.helloOf(agreed)
	// A link on a shared receive queue starts its peer at its first grant.
	accept.RecvDepth = uint16(c.rdma.Caps().RecvDepth)
	if mem != nil {
		accept = s.acceptNewSession(c, agreed, h, req.ID.RemoteAddr().Addr())
	}
	var private []byte
	if agreed != 0 {
		private = accept.Encode()
	}
	// Retry forever on RNR, as for dials: the peer's writes wait for a
	// reposted receive instead of failing.
	err = req.ID.Accept(ctx, acceptParam(private))
	if err != nil {
		req.ID.Close()
		c.discardSession()
		return nil, err
	}
	if err := c.start(agreed, h); err != nil {
		req.ID.Disconnect()
		req.ID.Close()
		c.discardSession()
		return nil, err
	}
	return c, nil
}
