package verbs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// AddrDevice says which network interface holds a local IP address and which
// RDMA device, if any, serves that interface.
type AddrDevice struct {
	Netdev string // e.g. "eth0"
	Device string // e.g. "mlx5_0", "rxe0"; empty when the netdev has no RDMA device
}

// DeviceForAddr maps a local IP address to its netdev and that netdev's RDMA
// device (through the kernel's RDMA netlink interface, as `rdma link`; a
// VLAN or bond netdev maps to the device under it). It returns an error wrapping
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
				dev, err := deviceForNetdev(ifi.Name)
				if outOfResources(err) {
					// The kernel could not be asked: that says nothing
					// of the netdev.
					return AddrDevice{Netdev: ifi.Name}, fmt.Errorf("verbs: the RDMA device of %s: %w", ifi.Name, err)
				}
				if err != nil {
					return AddrDevice{Netdev: ifi.Name}, fmt.Errorf("verbs: %v is on %s, which has no RDMA device: %w", a, ifi.Name, ErrNoDevice)
				}
				return AddrDevice{Netdev: ifi.Name, Device: dev}, nil
			}
		}
	}
	return AddrDevice{}, fmt.Errorf("verbs: %v is not an address of this host", a)
}

// outOfResources reports an error of a process out of descriptors or
// memory: a passing failure to find something out, not an answer.
func outOfResources(err error) bool {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOBUFS} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// Link is one RDMA port and the network interface it runs over (RoCE and
// iWARP ports have one; InfiniBand ports have none), as `rdma link` shows.
type Link struct {
	Device      string // e.g. "mlx5_0", "rxe0"
	Port        uint8
	State       PortState
	Netdev      string // "" when the port has no netdev
	NetdevIndex int
}

// Links lists every RDMA port with its netdev. It asks the kernel directly
// (no rdma-core, no cgo), so it answers even where RDMA cannot be used; a
// kernel without RDMA support gives an error wrapping ErrNoDevice.
func Links() ([]Link, error) {
	ls, err := links()
	if err != nil && !errors.Is(err, ErrNotSupported) {
		err = fmt.Errorf("%w: %w", ErrNoDevice, err)
	}
	return ls, err
}

// deviceForNetdev finds the RDMA device whose port runs over netdev or
// over a netdev under it.
func deviceForNetdev(netdev string) (string, error) {
	ls, err := links()
	if err != nil {
		return "", err
	}
	for _, name := range append([]string{netdev}, lowerNetdevs(netdev)...) {
		for _, l := range ls {
			if l.Netdev == name {
				return l.Device, nil
			}
		}
	}
	return "", fmt.Errorf("verbs: no RDMA port on %s", netdev)
}
