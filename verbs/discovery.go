package verbs

import (
	"fmt"
	"net"
	"net/netip"
)

// AddrDevice says which network interface holds a local IP address and which
// RDMA device, if any, serves that interface.
type AddrDevice struct {
	Netdev string // e.g. "eth0"
	Device string // e.g. "mlx5_0", "rxe0"; empty when the netdev has no RDMA device
}

// DeviceForAddr maps a local IP address to its netdev and that netdev's RDMA
// device (found through sysfs, by rdmamap). It returns an error wrapping
// ErrNoDevice when the netdev has no RDMA device, with the netdev filled in.
func DeviceForAddr(a netip.Addr) (AddrDevice, error) {
	a = a.Unmap()
	ifs, err := net.Interfaces()
	if err != nil {
		return AddrDevice{}, err
	}
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, ad := range addrs {
			ipn, ok := ad.(*net.IPNet)
			if !ok {
				continue
			}
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && ip.Unmap() == a {
				dev, err := rdmaDeviceForNetdev(ifi.Name)
				if err != nil {
					return AddrDevice{Netdev: ifi.Name}, fmt.Errorf("verbs: %v is on %s, which has no RDMA device: %w", a, ifi.Name, ErrNoDevice)
				}
				return AddrDevice{Netdev: ifi.Name, Device: dev}, nil
			}
		}
	}
	return AddrDevice{}, fmt.Errorf("verbs: %v is not an address of this host", a)
}
