package rdmanet

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/verbs"
)

// On a host with an iWARP device, an RDMA listener on the wildcard address
// would take TCP port numbers on the iWARP devices' addresses (iWARP
// shares TCP's ports: listen_iwarp.go), which the TCP side of a listener
// for both transports holds. listenEach listens on each local address of a
// RoCE or InfiniBand device instead, and merges their requests; the iWARP
// addresses get TCP only. Addresses that appear later are not listened on
// until the listener is made again (a failed ID makes the side listen
// again, rdmaSide.run).

// listenBesideIWARP reports whether a wildcard RDMA listener must leave
// out iWARP devices: the host has one.
func listenBesideIWARP(ap netip.AddrPort) bool {
	return ap.Addr().IsUnspecified() && hostHasIWARP()
}

// rdmaAddrs are the local addresses of the family of wildcard on devices
// that are not iWARP.
func rdmaAddrs(wildcard netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, p := range localPrefixes() {
		ip := p.Addr()
		if ip.Is4() != wildcard.Unmap().Is4() || ip.IsLinkLocalUnicast() {
			continue
		}
		if d, err := verbs.DeviceForAddr(ip); err == nil && deviceTransport(d.Device) != verbs.TransportIWARP {
			out = append(out, ip)
		}
	}
	return out
}

// localPrefixes are this host's interface addresses with their subnets
// (unmapped).
func localPrefixes() []netip.Prefix {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			ones, _ := ipn.Mask.Size()
			if p, err := ip.Unmap().Prefix(ones); ok && err == nil {
				out = append(out, netip.PrefixFrom(ip.Unmap(), p.Bits()))
			}
		}
	}
	return out
}

// listenEach listens on port (0: the first address picks one) of every
// address rdmaAddrs gives.
func listenEach(ap netip.AddrPort, backlog int) (requestSource, netip.AddrPort, error) {
	addrs := rdmaAddrs(ap.Addr())
	if len(addrs) == 0 {
		return nil, netip.AddrPort{}, errors.Join(verbs.ErrNoDevice, errors.New("rdmanet: no address of a RoCE or InfiniBand device to listen on"))
	}
	m := &multiSource{requests: make(chan requestResult, len(addrs))}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	port := ap.Port()
	for _, a := range addrs {
		id, bound, err := listenOne(netip.AddrPortFrom(a, port), backlog)
		if err != nil {
			m.Close()
			return nil, netip.AddrPort{}, err
		}
		port = bound.Port()
		m.ids = append(m.ids, id)
	}
	for _, id := range m.ids {
		m.wg.Add(1)
		go m.take(id)
	}
	return m, netip.AddrPortFrom(ap.Addr(), port), nil
}

// multiSource merges the requests of several listening IDs.
type multiSource struct {
	ids      []*cm.ID
	requests chan requestResult
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
}

type requestResult struct {
	req *cm.Request
	err error
}

// take passes id's requests on until it fails or the source closes.
func (m *multiSource) take(id *cm.ID) {
	defer m.wg.Done()
	for {
		req, err := id.GetRequest(m.ctx)
		if m.ctx.Err() != nil {
			if req != nil {
				req.ID.Reject(nil)
				req.ID.Close()
			}
			return
		}
		select {
		case m.requests <- requestResult{req, err}:
		case <-m.ctx.Done():
			if req != nil {
				req.ID.Reject(nil)
				req.ID.Close()
			}
			return
		}
		if err != nil {
			return // the side closes the source and listens again
		}
	}
}

// GetRequest returns the next request of any of the IDs, or the first
// error one of them had.
func (m *multiSource) GetRequest(ctx context.Context) (*cm.Request, error) {
	select {
	case r := <-m.requests:
		return r.req, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-m.ctx.Done():
		return nil, cm.ErrClosed
	}
}

// Close stops the IDs, rejects what arrived and nobody took, and waits for
// the goroutines.
func (m *multiSource) Close() error {
	m.once.Do(func() {
		m.cancel()
		m.wg.Wait()
		for _, id := range m.ids {
			id.Close()
		}
		for {
			select {
			case r := <-m.requests:
				if r.req != nil {
					r.req.ID.Reject(nil)
					r.req.ID.Close()
				}
			default:
				return
			}
		}
	})
	return nil
}
