package rdmanet

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/session"
	"github.com/rdmanet/sdk/internal/tcplink"
	"github.com/rdmanet/sdk/internal/wire"
)

// Resuming a session over TCP, to the listener's own port (docs/protocol.md,
// "Resuming over TCP"). The dialer keeps a TCP source port for the session
// (tcpPortReservation) and names it in its Hello; to resume, it connects
// from that port and sends its resume Hello first. The listener tells such
// a connection from a plain client's by its source port, before reading
// anything: only then does it wait (up to tcpResumeSniff) for the Hello's
// first bytes, which it peeks at without reading them. A plain TCP client
// is handed to Accept at once, with every byte it sent.

// tcpResumeSniff bounds the wait for a resume Hello on a connection from a
// session's reserved port (the dialer sends it right after connecting).
const tcpResumeSniff = 2 * time.Second

// tcpHandshakeTimeout bounds a TCP resume's exchange of Hellos.
const tcpHandshakeTimeout = 5 * time.Second

// The listener's answer to a resume Hello over TCP: a status byte, then the
// accept Hello (tcpResumed) or a length byte and the reason (tcpRefused).
const (
	tcpResumed = 0
	tcpRefused = 1
	tcpBusy    = 2 // another resume of the session is under way: try again
)

// tcpResumePath is the dialer's last resort: TCP to the server's port,
// from the session's reserved port, from the address the session was
// dialed from if it still can, else from where routing picks.
func tcpResumePath(mem *ringMem, port uint16, src netip.Addr, dst netip.AddrPort, cfg Config) session.Path {
	return session.Path{
		Name: "tcp -> " + dst.String(),
		TCP:  true,
		Dial: func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error) {
			return dialTCPResume(ctx, mem, int(port), src, dst, cfg, h)
		},
	}
}

func dialTCPResume(ctx context.Context, mem *ringMem, port int, src netip.Addr, dst netip.AddrPort, cfg Config, h wire.Hello) (link.Link, wire.Hello, error) {
	d := net.Dialer{Control: reuseAddr, LocalAddr: &net.TCPAddr{IP: src.AsSlice(), Port: port}}
	conn, err := d.DialContext(ctx, "tcp", dst.String())
	if err != nil && src.IsValid() {
		// The address may be gone with its port; any address will do.
		d.LocalAddr = &net.TCPAddr{Port: port}
		conn, err = d.DialContext(ctx, "tcp", dst.String())
	}
	if err != nil {
		return nil, wire.Hello{}, err
	}
	tc := conn.(*net.TCPConn)
	deadline := time.Now().Add(tcpHandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	tc.SetDeadline(deadline)
	peer, err := tcpResumeExchange(tc, h)
	if err != nil {
		tc.Close()
		return nil, wire.Hello{}, err
	}
	l, err := newTCPLink(mem, cfg, tc)
	if err != nil {
		tc.Close()
		return nil, wire.Hello{}, err
	}
	return l, peer, nil
}

// tcpResumeExchange sends the resume Hello and reads the answer.
func tcpResumeExchange(tc *net.TCPConn, h wire.Hello) (wire.Hello, error) {
	peer, err := tcpHelloExchange(tc, h)
	if err == nil && (peer.Features&wire.FeatureResume == 0 || peer.Session != h.Session) {
		err = fmt.Errorf("%w: the server answered without the session", ErrSessionRefused)
	}
	var refused *tcpRefusedError
	if errors.As(err, &refused) {
		err = fmt.Errorf("%w: %s", ErrSessionRefused, refused.reason)
	}
	return peer, err
}

// tcpRefusedError is a listener's refusal of a TCP resume or join.
type tcpRefusedError struct{ reason string }

func (e *tcpRefusedError) Error() string { return "rdmanet: the server refused: " + e.reason }

// tcpHelloExchange sends h, a resume or a group's join over TCP, and reads
// the answer: the status byte, then the listener's Hello, as long as h's
// (tcpResumed), or a length byte and the reason (tcpRefused, a
// *tcpRefusedError; tcpBusy, a plain error: try again).
func tcpHelloExchange(tc *net.TCPConn, h wire.Hello) (wire.Hello, error) {
	if _, err := tc.Write(h.Encode()); err != nil {
		return wire.Hello{}, err
	}
	var status [1]byte
	if _, err := io.ReadFull(tc, status[:]); err != nil {
		return wire.Hello{}, fmt.Errorf("reading the answer: %w", err)
	}
	switch status[0] {
	case tcpResumed:
		b := make([]byte, wire.HelloSizeOf(h.Features))
		if _, err := io.ReadFull(tc, b); err != nil {
			return wire.Hello{}, fmt.Errorf("reading the answer: %w", err)
		}
		peer, ok, err := wire.DecodeHello(b)
		if err == nil && !ok {
			err = &wire.ProtocolError{Reason: "answer to a TCP hello without a hello"}
		}
		return peer, err
	case tcpRefused, tcpBusy:
		var n [1]byte
		if _, err := io.ReadFull(tc, n[:]); err != nil {
			return wire.Hello{}, fmt.Errorf("reading the answer: %w", err)
		}
		reason := make([]byte, n[0])
		io.ReadFull(tc, reason)
		if status[0] == tcpBusy {
			return wire.Hello{}, errors.New(string(reason))
		}
		return wire.Hello{}, &tcpRefusedError{string(reason)}
	}
	return wire.Hello{}, &wire.ProtocolError{Reason: fmt.Sprintf("answer to a TCP hello with status %d", status[0])}
}

// readTCPHello reads a Hello's bytes from a byte stream: its first
// HelloSize bytes say how long it is (at most SessionHelloSize).
func readTCPHello(r io.Reader) ([]byte, error) {
	b := make([]byte, wire.SessionHelloSize)
	if _, err := io.ReadFull(r, b[:wire.HelloSize]); err != nil {
		return nil, err
	}
	n := wire.HelloSizeOf(wire.Features(binary.BigEndian.Uint32(b[10:])))
	if _, err := io.ReadFull(r, b[wire.HelloSize:n]); err != nil {
		return nil, err
	}
	return b[:n], nil
}

// newTCPLink makes a session's TCP link over tc: over its rings, with the
// depths its RDMA links have, which the peer's Hello announced.
func newTCPLink(mem *ringMem, cfg Config, tc *net.TCPConn) (*tcplink.Link, error) {
	lc := tcplink.Config{
		SendDepth: cfg.sendDepth(), RecvDepth: cfg.RecvDepth, ControlDepth: controlSlots,
		Name: fmt.Sprintf("tcp %v -> %v", tc.LocalAddr(), tc.RemoteAddr()),
	}
	if err := mem.lendToTCP(&lc); err != nil {
		return nil, err
	}
	return tcplink.New(tc, lc)
}

// classifyTCP decides what a TCP connection the listener accepted is: a
// plain client's, handed to Accept at once (plain), or a session's resume,
// which the listener serves itself. A connection from a session's reserved
// port may be either until its first bytes come: it is decided in the
// background (and false is returned).
func (l *Listener) classifyTCP(tc *net.TCPConn) (plain bool) {
	if l.rdma == nil || l.rdma.sessions.empty() && !anyTCPJoins() {
		return true
	}
	remote := tc.RemoteAddr().(*net.TCPAddr).AddrPort()
	remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	if l.rdma.sessions.fromReservedPort(remote) || tcpJoinFrom(remote) {
		l.rdma.tcpSniffs.Add(1)
		l.pump.Add(1)
		go func() {
			defer l.pump.Done()
			if peekResume(tc, tcpResumeSniff) {
				l.serveTCPResume(tc)
				return
			}
			l.handOver(tc)
		}()
		return false
	}
	// Any other connection: if a resume Hello is already there (its
	// dialer's address changed), it is one; no wait.
	if peekResume(tc, 0) {
		l.pump.Add(1)
		go func() {
			defer l.pump.Done()
			l.serveTCPResume(tc)
		}()
		return false
	}
	return true
}

// handOver gives a plain TCP connection to Accept.
func (l *Listener) handOver(tc *net.TCPConn) {
	c := l.wrapTCP(tc)
	select {
	case l.tcpConns <- acceptResult{c, nil}:
	case <-l.done:
		c.Close()
	}
}

// serveTCPResume serves a resume Hello on tc: the session goes on over a
// TCP link on it, or the dialer is told why not.
func (l *Listener) serveTCPResume(tc *net.TCPConn) {
	s := l.rdma
	tc.SetDeadline(time.Now().Add(tcpHandshakeTimeout))
	refuse := func(err error) {
		status := byte(tcpBusy)
		if err != errResumeBusy {
			status = tcpRefused
		}
		msg := refusalReason(err)
		if len(msg) > 255 {
			msg = msg[:255]
		}
		tc.Write(append([]byte{status, byte(len(msg))}, msg...))
		tc.Close()
		slog.Debug("rdmanet: refused to resume a session over TCP", "from", tc.RemoteAddr(), "err", err)
	}
	b, err := readTCPHello(tc)
	if err != nil {
		tc.Close()
		return
	}
	h, ok, err := wire.DecodeHello(b)
	if err == nil && ok && h.Features&wire.FeatureGroup != 0 {
		l.serveTCPGroupJoin(tc, h, refuse)
		return
	}
	if err == nil && (!ok || !h.Resume) {
		err = errors.New("not a resume")
	}
	if err != nil {
		s.refusedResumes.Add(1)
		refuse(err)
		return
	}
	c, next, err := s.beginResume(h)
	if err != nil {
		refuse(err)
		return
	}
	accept := s.cfg.helloOf(h.Features & s.cfg.extensions())
	accept.Session, accept.Generation = h.Session, next
	if _, err := tc.Write(append([]byte{tcpResumed}, accept.Encode()...)); err != nil {
		tc.Close()
		c.sess.EndResume(nil, "")
		return
	}
	lk, err := newTCPLink(c.mem, s.cfg, tc)
	if err != nil {
		tc.Close()
		c.sess.EndResume(nil, "")
		return
	}
	if err := c.sess.EndResume(lk, lk.Caps().Name); err == nil {
		s.resumes.Add(1)
	}
}
