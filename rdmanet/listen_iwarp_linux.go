//go:build linux

package rdmanet

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/sdk/internal/nlmsg"
)

// tcpListening reports whether the kernel has a TCP socket listening on
// ap's port, at ap's address or a wildcard one of its family: the socket
// an iWARP provider (siw) listens with for an rdma_cm listener. It asks
// sock_diag (NETLINK_SOCK_DIAG) for the listening sockets alone, as `ss
// -ltn` does, so the answer stays small however many connections are open.
func tcpListening(ap netip.AddrPort) (bool, error) {
	fd, err := nlmsg.Socket(unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	family := byte(unix.AF_INET)
	if ap.Addr().Is6() {
		family = unix.AF_INET6
	}
	// struct inet_diag_req_v2: family, protocol, extensions, padding, the
	// states wanted (a bit per TCP state), then an inet_diag_sockid left
	// zero (no filter but the states).
	req := make([]byte, 56)
	req[0], req[1] = family, unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(req[4:], 1<<tcpListenState)
	answers, err := nlmsg.Exchange(fd, unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP, req)
	if err != nil {
		return false, err
	}
	for _, a := range answers {
		if listening, ok := diagListener(a, ap); ok && listening {
			return true, nil
		}
	}
	return false, nil
}

// tcpListenState is TCP_LISTEN in the kernel's numbering of TCP states.
const tcpListenState = 10

// diagListener reads one struct inet_diag_msg: family, state, timer,
// retransmits, then the socket's id (source port and destination port in
// network order, source and destination addresses in 16 bytes each). It
// reports whether the socket listens on ap's port at ap's address or at the
// wildcard (any address, for a wildcard ap: siw listens on each of its
// device's addresses then); ok is false for a message too short to be one.
func diagListener(msg []byte, ap netip.AddrPort) (listening, ok bool) {
	if len(msg) < 4+4+32 {
		return false, false
	}
	if msg[1] != tcpListenState || binary.BigEndian.Uint16(msg[4:]) != ap.Port() {
		return false, true
	}
	var src netip.Addr
	if msg[0] == unix.AF_INET6 {
		src = netip.AddrFrom16([16]byte(msg[8:24])).Unmap()
	} else {
		src = netip.AddrFrom4([4]byte(msg[8:12]))
	}
	return ap.Addr().IsUnspecified() || src == ap.Addr().Unmap() || src.IsUnspecified(), true
}
