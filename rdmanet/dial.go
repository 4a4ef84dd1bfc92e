package rdmanet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/internal/wire"
)

// Dialer connects to RDMA listeners; its zero value is ready to use. Its
// fields mirror net.Dialer's where they make sense for RDMA.
type Dialer struct {
	// Timeout bounds the whole dial: address and route resolution and the
	// connection handshake. Zero means no limit beyond the context's.
	Timeout time.Duration
	// LocalAddr, if set, picks the local address and so the RDMA device:
	// an *Addr, a *net.TCPAddr or a *net.IPAddr (only the IP is used).
	LocalAddr net.Addr
	// Config sizes the connection's buffers and queues.
	Config Config
}

// Dial connects to address ("host:port") on network "rdma", "rdma4" or "rdma6".
func Dial(network, address string) (net.Conn, error) {
	var d Dialer
	return d.DialContext(context.Background(), network, address)
}

// Dial connects to address; see DialContext.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DialContext connects to address on network "rdma", "rdma4" or "rdma6".
// The context bounds the whole dial; cancelling it abandons the handshake.
// Errors are *net.OpError; a peer with nothing listening gives one that
// matches cm.ErrRejected.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	opErr := func(addr net.Addr, err error) error {
		return &net.OpError{Op: "dial", Net: network, Source: d.LocalAddr, Addr: addr, Err: err}
	}
	cfg, err := d.Config.withDefaults()
	if err != nil {
		return nil, opErr(nil, err)
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	dst, err := resolveAddr(ctx, network, address)
	if err != nil {
		return nil, opErr(nil, err)
	}
	raddr := &Addr{dst}
	src, err := localIP(d.LocalAddr)
	if err != nil {
		return nil, opErr(raddr, err)
	}
	c, err := dial(ctx, src, dst, cfg)
	if err != nil {
		return nil, opErr(raddr, err)
	}
	return c, nil
}

func dial(ctx context.Context, src netip.Addr, dst netip.AddrPort, cfg Config) (*Conn, error) {
	if err := cm.Available(); err != nil {
		return nil, err
	}
	id, err := cm.NewID()
	if err != nil {
		return nil, err
	}
	if err := id.Resolve(ctx, src, dst); err != nil {
		id.Close()
		return nil, err
	}
	c, err := newConn(id, cfg, false)
	if err != nil {
		id.Close()
		return nil, err
	}
	if err := id.SetAckTimeout(ackTimeoutExp); err != nil {
		id.Close()
		c.res.close()
		return nil, err
	}
	// As libvalkey: responder resources and initiator depth 1, and an RNR
	// retry count of 7 (retry forever: a peer slow to repost receives delays
	// this side's writes instead of failing them). The transport retry count
	// is 6, not libvalkey's 7: some devices (rxe) treat 7 as "forever", and
	// then a dead peer is never noticed. Both sides' queue pairs use it.
	offer := cfg.extensions()
	peer, err := id.Connect(ctx, cm.ConnParam{PrivateData: cfg.hello(offer), ResponderResources: 1, InitiatorDepth: 1, RetryCount: transportRetries, RNRRetryCount: 7})
	if err != nil {
		id.Close()
		c.res.close()
		return nil, withRejectReason(err)
	}
	// A Valkey server accepts with no private data: Valkey's protocol.
	h, ok, err := wire.DecodeHello(peer.PrivateData)
	if err != nil {
		id.Close()
		c.res.close()
		return nil, err
	}
	var agreed wire.Features
	if ok {
		agreed = h.Features & offer
	}
	c.start(agreed)
	return c, nil
}

// resolveAddr turns "host:port" into one address of the network's family.
func resolveAddr(ctx context.Context, network, address string) (netip.AddrPort, error) {
	family := ""
	switch network {
	case "rdma":
		family = "ip"
	case "rdma4":
		family = "ip4"
	case "rdma6":
		family = "ip6"
	default:
		return netip.AddrPort{}, net.UnknownNetworkError(network)
	}
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, err
	}
	port, err := net.DefaultResolver.LookupPort(ctx, "tcp", portStr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if host == "" {
		if family == "ip6" {
			return netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(port)), nil
		}
		return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(port)), nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if (family == "ip4" && !ip.Unmap().Is4()) || (family == "ip6" && ip.Is4()) {
			return netip.AddrPort{}, &net.AddrError{Err: "address of the wrong family for " + network, Addr: host}
		}
		return netip.AddrPortFrom(ip.Unmap(), uint16(port)), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, family, host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(ips) == 0 {
		return netip.AddrPort{}, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	return netip.AddrPortFrom(ips[0].Unmap(), uint16(port)), nil
}

// localIP is the IP of a Dialer's LocalAddr, or the zero Addr (let routing pick).
func localIP(a net.Addr) (netip.Addr, error) {
	switch a := a.(type) {
	case nil:
		return netip.Addr{}, nil
	case *Addr:
		return a.Addr(), nil
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), nil
	case *net.IPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), nil
	}
	return netip.Addr{}, fmt.Errorf("rdmanet: local address of type %T", a)
}

// ServerRefusedError is a connection an rdmanet server rejected, with the
// reason it gave (for example, it could not allocate the connection's
// resources). It matches cm.ErrRejected.
type ServerRefusedError struct {
	Reason string
	Err    error // the *cm.EventError
}

func (e *ServerRefusedError) Error() string { return "server refused: " + e.Reason }
func (e *ServerRefusedError) Unwrap() error { return e.Err }

// withRejectReason turns a reject that carries an rdmanet server's reason
// into a *ServerRefusedError.
func withRejectReason(err error) error {
	var ee *cm.EventError
	if !errors.As(err, &ee) || !errors.Is(err, cm.ErrRejected) {
		return err
	}
	data := string(bytes.TrimRight(ee.PrivateData, "\x00"))
	if !strings.HasPrefix(data, rejectPrefix) {
		return err
	}
	return &ServerRefusedError{Reason: strings.TrimPrefix(data, rejectPrefix), Err: err}
}
