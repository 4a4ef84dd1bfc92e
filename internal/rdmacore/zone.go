package rdmacore

import (
	"net"
	"strconv"
)

// interfaceIndex turns an IPv6 zone ("eth0" or "3") into an interface index.
func interfaceIndex(zone string) (int, error) {
	if n, err := strconv.Atoi(zone); err == nil {
		return n, nil
	}
	ifi, err := net.InterfaceByName(zone)
	if err != nil {
		return 0, err
	}
	return ifi.Index, nil
}
