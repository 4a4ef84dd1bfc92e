package rdmanet

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/session"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// Sessions over rdma_cm: the listener's table of its sessions, the
// server's side of a resume request, and the dialer's RDMA paths.

// sessionTable is a listener's sessions, by id, and by the TCP port each
// dialer keeps for resuming over TCP.
type sessionTable struct {
	mu     sync.Mutex
	m      map[wire.SessionID]*Conn
	byPort map[uint16][]*Conn
}

func newSessionTable() *sessionTable {
	return &sessionTable{m: make(map[wire.SessionID]*Conn), byPort: make(map[uint16][]*Conn)}
}

func (t *sessionTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// empty reports whether the listener has no session: its TCP connections
// are all plain.
func (t *sessionTable) empty() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m) == 0
}

// fromReservedPort reports whether a TCP connection from remote may be a
// session's resume: it comes from the port a session's dialer keeps, and
// from an address that dialer's links came from, or the session has lost
// its link (its dialer's address may have changed with it).
func (t *sessionTable) fromReservedPort(remote netip.AddrPort) bool {
	t.mu.Lock()
	conns := slices.Clone(t.byPort[remote.Port()])
	t.mu.Unlock()
	for _, c := range conns {
		if c.sess.MayResumeFrom(remote.Addr()) {
			return true
		}
	}
	return false
}

// reservePort indexes c by its dialer's TCP port.
func (t *sessionTable) reservePort(c *Conn, port uint16) {
	if port == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byPort[port] = append(t.byPort[port], c)
}

// add gives c a new session id, unguessable (128 bits from crypto/rand),
// with which start makes c a session before the table holds it.
func (t *sessionTable) add(c *Conn, start func(wire.SessionID)) wire.SessionID {
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		var id wire.SessionID
		rand.Read(id[:]) // never fails (crypto/rand's contract since Go 1.24)
		if _, taken := t.m[id]; !taken && !id.IsZero() {
			start(id)
			t.m[id] = c
			return id
		}
	}
}

func (t *sessionTable) lookup(id wire.SessionID) *Conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[id]
}

func (t *sessionTable) remove(id wire.SessionID, c *Conn, port uint16) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[id] == c {
		delete(t.m, id)
	}
	t.byPort[port] = slices.DeleteFunc(t.byPort[port], func(o *Conn) bool { return o == c })
	if len(t.byPort[port]) == 0 {
		delete(t.byPort, port)
	}
}

// resumeAnswerWait bounds the wait for the server's answer to a resume over
// RDMA: longer than a dial's (a busy or emulated server's accept of a
// resume may take over a second), shorter than a path's worth of tries.
const resumeAnswerWait = 3 * time.Second

// refusedPrefix starts the reject reason of a refused resume, so that the
// dialer tells a refusal (the session is gone: stop) from a path that
// failed (try another).
const refusedPrefix = "session refused: "

// acceptNewSession is accept's part for a request that agreed on
// sessions: the connection's rings are its own (every link of the session
// registers them), and it gets an id. It returns the Hello to accept with.
func (s *rdmaSide) acceptNewSession(c *Conn, agreed wire.Features, offer wire.Hello, from netip.Addr) wire.Hello {
	id := s.sessions.add(c, func(id wire.SessionID) {
		c.becomeSession(session.Config{ID: id, ClientIP: from,
			Closed: func() { s.sessions.remove(id, c, offer.TCPPort) }})
	})
	s.sessions.reservePort(c, offer.TCPPort)
	h := s.cfg.helloOf(agreed)
	h.Session = id
	return h
}

// beginResume starts to resume h's session for its dialer (RDMA or TCP):
// it returns the session's connection and the generation to give the
// dialer, or why not (errResumeBusy: try again; any other: a refusal,
// which it counts).
func (s *rdmaSide) beginResume(h wire.Hello) (*Conn, uint32, error) {
	c := s.sessions.lookup(h.Session)
	var next uint32
	err := fmt.Errorf("%w: unknown session %v", ErrSessionRefused, h.Session)
	if c != nil {
		next, err = c.sess.BeginResume(h.Generation)
	}
	if err != nil && err != errResumeBusy {
		s.refusedResumes.Add(1)
	}
	return c, next, err
}

// acceptResume serves a request to resume a session on a new RDMA link.
// It never returns a connection for Accept: the session's Conn, which the
// application has, goes on over the new link.
func (s *rdmaSide) acceptResume(ctx context.Context, req *cm.Request, h wire.Hello) error {
	reject := func(err error) error {
		req.ID.Reject([]byte(rejectPrefix + refusedPrefix + refusalReason(err)))
		req.ID.Close()
		return err
	}
	c, next, err := s.beginResume(h)
	if err == errResumeBusy {
		req.ID.Reject([]byte(rejectPrefix + err.Error()))
		req.ID.Close()
		return err
	} else if err != nil {
		return reject(err)
	}
	h.Generation = next
	abort := func(err error) error {
		c.sess.EndResume(nil, "")
		return err
	}
	lc := s.cfg.linkConfig()
	err = c.mem.lendTo(&lc)
	var l *rdmalink.Link
	if err == nil {
		l, err = rdmalink.New(req.ID, lc)
	}
	var linkFeatures wire.Features
	if err == nil {
		if linkFeatures, err = chooseLinkFeatures(h, true, l, s.cfg.extensions()); err != nil {
			req.ID.Reject(rejectReason(err))
			req.ID.Close()
			l.Discard() // after the ID, which owns the queue pair
			return abort(err)
		}
	}
	if err != nil {
		req.ID.Reject(rejectReason(err))
		req.ID.Close()
		return abort(err)
	}
	accept := s.cfg.helloOf(h.Features&s.cfg.extensions() | linkFeatures)
	accept.Session, accept.Generation = h.Session, h.Generation
	if err := req.ID.Accept(ctx, acceptParam(accept.Encode())); err != nil {
		req.ID.Close()
		l.Discard()
		return abort(err)
	}
	if err := l.Established(linkFeatures, true); err != nil {
		req.ID.Disconnect()
		req.ID.Close()
		l.Discard()
		return abort(err)
	}
	if err := c.sess.EndResume(l, rdmaPathName(l)); err != nil {
		return err // EndResume closed l
	}
	l.StartEvents()
	s.resumes.Add(1)
	return nil
}

// rdmaPathName names an RDMA link for logs and errors.
func rdmaPathName(l link.Link) string {
	local, remote := l.Addrs()
	return fmt.Sprintf("rdma %s (%s) -> %s", local.Addr(), l.Caps().Name, remote)
}

// rdmaResumePaths are the dialer's RDMA paths to resume a session on: to
// each of the server's addresses, the one dialed first from the address it
// was dialed from (src, if the Dialer had a LocalAddr), the others from a
// local RDMA address on the same subnet (another port), else from where
// routing picks.
func rdmaResumePaths(mem *ringMem, src netip.Addr, dsts []netip.AddrPort, cfg Config) []session.Path {
	var paths []session.Path
	for i, dst := range dsts {
		from := src
		if i > 0 {
			from = sameSubnetRDMAAddr(dst.Addr())
		}
		name := "rdma -> " + dst.String()
		if from.IsValid() {
			name = "rdma " + from.String() + " -> " + dst.String()
		}
		paths = append(paths, session.Path{
			Name: name,
			Dial: func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error) {
				// A passing failure is not a reason to leave RDMA for
				// the next path (TCP, maybe), as in a dial.
				r, err := dialRetrying(ctx, dst, fallback.Auto, func() (resumedLink, error) {
					l, peer, err := dialResume(ctx, from, dst, cfg, mem, h)
					return resumedLink{l, peer}, err
				})
				return r.l, r.peer, err
			},
		})
	}
	return paths
}

// resumedLink is what dialResume makes, as one value for dialRetrying.
type resumedLink struct {
	l    link.Link
	peer wire.Hello
}

// sameSubnetRDMAAddr is a local address, other than dst itself, on an
// interface with an RDMA device whose subnet holds dst; the zero Addr if
// none. A host with a port on each of two networks reaches the server's
// address on the second through its second port.
func sameSubnetRDMAAddr(dst netip.Addr) netip.Addr {
	for _, p := range localPrefixes() {
		if ip := p.Addr(); ip != dst && p.Contains(dst) {
			if _, err := verbs.DeviceForAddr(ip); err == nil {
				return ip
			}
		}
	}
	return netip.Addr{}
}

// dialResume makes an RDMA link from src (zero: routing picks) to dst over
// mem that resumes h's session.
func dialResume(ctx context.Context, src netip.Addr, dst netip.AddrPort, cfg Config, mem *ringMem, h wire.Hello) (_ link.Link, _ wire.Hello, err error) {
	id, err := cm.NewID()
	if err != nil {
		return nil, wire.Hello{}, err
	}
	var l *rdmalink.Link
	defer func() {
		if err != nil {
			id.Close()
			if l != nil {
				l.Discard()
			}
		}
	}()
	// A resume has other paths to try: resolution that gets no neighbour
	// answer (cm retries it) stops after the answer wait, as the connect
	// does, rather than holding up the next path.
	rctx, cancelResolve := context.WithTimeout(ctx, resumeAnswerWait)
	err = id.Resolve(rctx, src, dst)
	cancelResolve()
	if err != nil {
		return nil, wire.Hello{}, err
	}
	lc := cfg.linkConfig()
	if err := mem.lendTo(&lc); err != nil {
		return nil, wire.Hello{}, err
	}
	if l, err = rdmalink.New(id, lc); err != nil {
		return nil, wire.Hello{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, resumeAnswerWait)
	defer cancel()
	h = linkHello(h, l)
	peer, err := id.Connect(cctx, dialParam(h.Encode()))
	if err != nil {
		err = withRejectReason(err)
		var refused *ServerRefusedError
		if errors.As(err, &refused) && strings.HasPrefix(refused.Reason, refusedPrefix) {
			err = fmt.Errorf("%w: %s", ErrSessionRefused, strings.TrimPrefix(refused.Reason, refusedPrefix))
		}
		return nil, wire.Hello{}, err
	}
	ph, ok, err := wire.DecodeHello(peer.PrivateData)
	switch {
	case err != nil:
	case !ok || ph.Features&wire.FeatureResume == 0 || ph.Session != h.Session:
		err = fmt.Errorf("%w: the server answered without the session", ErrSessionRefused)
	}
	if err == nil {
		agreed := ph.Features & wire.LinkFeatures
		if err = checkLinkAnswer(agreed, true, l); err == nil {
			err = l.Established(agreed, false)
		}
	}
	if err != nil {
		id.Disconnect()
		return nil, wire.Hello{}, err
	}
	l.StartEvents()
	return l, ph, nil
}
