//go:build !unix || aix

package rdmanet

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// Resuming over TCP needs a reserved TCP port and MSG_PEEK: unix only
// (and not AIX, whose syscall package has no MSG_DONTWAIT).

type tcpPortReservation struct{ port uint16 }

// sessionPortFDs is Footprint.SessionFileDescriptors: no port is reserved.
const sessionPortFDs = 0

func reserveTCPPort(netip.Addr) (*tcpPortReservation, error) {
	return nil, errors.New("rdmanet: resuming over TCP is not supported on this system")
}

func (r *tcpPortReservation) close() {}

func reuseAddr(string, string, syscall.RawConn) error { return nil }

func peekResume(*net.TCPConn, time.Duration) bool { return false }
