//go:build !linux

package rdmanet

import (
	"errors"
	"net/netip"
)

// tcpListening cannot ask the kernel off Linux, where there is no RDMA
// either; the watch never starts there.
func tcpListening(netip.AddrPort) (bool, error) {
	return false, errors.New("rdmanet: no sock_diag off Linux")
}
