//go:build unix && !aix

package rdmanet

import (
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/internal/wire"
)

// tcpPortReservation is a TCP port a session's dialer keeps for resuming
// over TCP: a socket bound to it (with SO_REUSEADDR, never listening), so
// that the kernel gives the port to no other connection, and the resume's
// connection can bind it too (also with SO_REUSEADDR).
type tcpPortReservation struct {
	fd   int
	port uint16
}

// sessionPortFDs is Footprint.SessionFileDescriptors: the reservation's socket.
const sessionPortFDs = 1

// reserveTCPPort binds a socket of dst's family to a free port.
func reserveTCPPort(dst netip.Addr) (*tcpPortReservation, error) {
	family, sa := syscall.AF_INET, syscall.Sockaddr(&syscall.SockaddrInet4{})
	if dst.Is6() {
		family, sa = syscall.AF_INET6, &syscall.SockaddrInet6{}
	}
	fd, err := streamSocket(family)
	if err != nil {
		return nil, err
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	got, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return nil, err
	}
	r := &tcpPortReservation{fd: fd}
	switch a := got.(type) {
	case *syscall.SockaddrInet4:
		r.port = uint16(a.Port)
	case *syscall.SockaddrInet6:
		r.port = uint16(a.Port)
	}
	return r, nil
}

func (r *tcpPortReservation) close() {
	if r != nil {
		syscall.Close(r.fd)
	}
}

// reuseAddr is a net.Dialer's Control that sets SO_REUSEADDR, so that the
// dial may bind the reserved port.
func reuseAddr(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// peekResume reports whether the first bytes waiting on tc are a Hello's
// magic, without reading them. It waits up to wait for them (0: not at
// all; whatever is there now decides).
func peekResume(tc *net.TCPConn, wait time.Duration) bool {
	raw, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	if wait > 0 {
		tc.SetReadDeadline(time.Now().Add(wait))
		defer tc.SetReadDeadline(time.Time{})
	}
	var buf [wire.HelloMagicSize]byte
	n := 0
	err = raw.Read(func(fd uintptr) bool {
		var rerr error
		n, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK:
			n = 0
			return wait == 0 // wait for bytes, if waiting
		case rerr != nil || n <= 0:
			return true
		case n < len(buf) && wire.StartsHelloMagic(buf[:n]) && wait > 0:
			return false // a magic's start: wait for the rest
		}
		return true
	})
	return err == nil && n == len(buf) && wire.HasHelloMagic(buf[:])
}
