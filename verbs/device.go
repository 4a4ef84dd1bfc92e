package verbs

import (
	"errors"
	"fmt"
	"github.com/rdmanet/sdk/internal/guard"
	"net/netip"
	"syscall"

	"github.com/rdmanet/sdk/internal/rdmacore"
)

// Transport is an RDMA device's transport (enum ibv_transport_type).
type Transport int

const (
	TransportIB Transport = iota // InfiniBand, and RoCE, which runs IB transport over Ethernet
	TransportIWARP
	TransportUSNIC
	TransportUSNICUDP
	TransportUnspecified
)

func (t Transport) String() string {
	switch t {
	case TransportIB:
		return "IB"
	case TransportIWARP:
		return "iWARP"
	case TransportUSNIC:
		return "usNIC"
	case TransportUSNICUDP:
		return "usNIC-UDP"
	}
	return fmt.Sprintf("transport(%d)", int(t))
}

// Device is one RDMA device as libibverbs lists it.
type Device struct {
	Name      string // e.g. "mlx5_0", "rxe0"
	GUID      uint64
	Transport Transport
}

// Devices lists the RDMA devices. With rdma-core present and no device it
// returns an empty list and no error.
func Devices() ([]Device, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	infos, err := rdmacore.ListDevices()
	if err != nil {
		return nil, noDevice(err)
	}
	devs := make([]Device, len(infos))
	for i, d := range infos {
		devs[i] = Device{Name: d.Name, GUID: d.GUID, Transport: Transport(d.TransportType)}
	}
	return devs, nil
}

// noDevice marks the errnos with which libibverbs says there is no device
// (ENOSYS: the kernel has no ib_uverbs at all) so callers can match
// ErrNoDevice, unless the process was out of file descriptors, which makes
// libibverbs say the same (CallError.Descriptors).
func noDevice(err error) error {
	switch {
	case errors.Is(err, syscall.EMFILE):
		return err
	case errors.Is(err, syscall.ENOSYS):
		return fmt.Errorf("%w: the kernel offers no RDMA (ib_uverbs not loaded): %w", ErrNoDevice, err)
	case errors.Is(err, syscall.ENODEV):
		return fmt.Errorf("%w: %w", ErrNoDevice, err)
	}
	return err
}

// Context is an open device (struct ibv_context).
type Context struct {
	g     guard.Guard
	raw   rdmacore.Context
	name  string
	owned bool
}

// Open opens the device called name. It returns an error wrapping ErrNoDevice
// when there is no such device.
func Open(name string) (*Context, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	raw, err := rdmacore.OpenDevice(name)
	if err != nil {
		return nil, fmt.Errorf("verbs: open %q: %w", name, noDevice(err))
	}
	live.contexts.Add(1)
	return &Context{raw: raw, name: name, owned: true}, nil
}

// AdoptContext wraps a context that librdmacm opened and owns (package cm uses
// it); Close on the result does not close the device.
func AdoptContext(raw rdmacore.Context) *Context {
	return &Context{raw: raw, name: rdmacore.ContextDeviceName(raw)}
}

// Name is the device's name.
func (c *Context) Name() string { return c.name }

// Transport is the device's transport.
func (c *Context) Transport() Transport {
	if !c.g.Use() {
		return TransportUnspecified
	}
	defer c.g.Done()
	return Transport(rdmacore.ContextTransport(c.raw))
}

// NumCompVectors is how many completion vectors (interrupt queues) the device has.
func (c *Context) NumCompVectors() int {
	if !c.g.Use() {
		return 0
	}
	defer c.g.Done()
	return rdmacore.NumCompVectors(c.raw)
}

// Close closes the device (a no-op for contexts librdmacm owns). Objects created
// from it must be closed first.
func (c *Context) Close() error {
	return c.g.Close(func() error {
		if !c.owned {
			return nil
		}
		if err := rdmacore.CloseDevice(c.raw); err != nil {
			return err
		}
		live.contexts.Add(-1)
		return nil
	})
}

// DeviceAttr describes a device's limits (struct ibv_device_attr, in part).
type DeviceAttr = rdmacore.DeviceAttr

// QueryDevice returns the device's attributes.
func (c *Context) QueryDevice() (DeviceAttr, error) {
	if !c.g.Use() {
		return DeviceAttr{}, ErrClosed
	}
	defer c.g.Done()
	return rdmacore.QueryDevice(c.raw)
}

// PortState is enum ibv_port_state.
type PortState int

const (
	PortNop PortState = iota
	PortDown
	PortInit
	PortArmed
	PortActive
	PortActiveDefer
)

func (s PortState) String() string {
	names := [...]string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}
	if int(s) >= 0 && int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// LinkLayer is a port's link layer.
type LinkLayer int

const (
	LinkLayerUnspecified LinkLayer = iota
	LinkLayerInfiniBand
	LinkLayerEthernet
)

func (l LinkLayer) String() string {
	switch l {
	case LinkLayerInfiniBand:
		return "InfiniBand"
	case LinkLayerEthernet:
		return "Ethernet"
	}
	return "unspecified"
}

// PortAttr describes one port.
type PortAttr struct {
	State       PortState
	MaxMTU      int // bytes
	ActiveMTU   int // bytes
	GIDTableLen int
	MaxMsgSize  uint32
	LinkLayer   LinkLayer
}

// mtuBytes turns enum ibv_mtu (1 = 256 ... 5 = 4096) into bytes.
func mtuBytes(m int) int {
	if m < 1 || m > 5 {
		return 0
	}
	return 128 << m
}

// QueryPort returns the attributes of port (ports count from 1).
func (c *Context) QueryPort(port uint8) (PortAttr, error) {
	if !c.g.Use() {
		return PortAttr{}, ErrClosed
	}
	defer c.g.Done()
	a, err := rdmacore.QueryPort(c.raw, port)
	if err != nil {
		return PortAttr{}, err
	}
	return PortAttr{
		State:       PortState(a.State),
		MaxMTU:      mtuBytes(a.MaxMTU),
		ActiveMTU:   mtuBytes(a.ActiveMTU),
		GIDTableLen: a.GIDTableLen,
		MaxMsgSize:  a.MaxMsgSize,
		LinkLayer:   LinkLayer(a.LinkLayer),
	}, nil
}

// GID is a 16-byte global identifier. For RoCE it holds an IP address.
type GID [16]byte

// IsZero reports whether the entry is unused.
func (g GID) IsZero() bool { return g == GID{} }

// Addr is the GID as an IP address (IPv4-mapped addresses unmapped).
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

func (g GID) String() string { return netip.AddrFrom16(g).String() }

// QueryGID returns entry index of port's GID table.
func (c *Context) QueryGID(port uint8, index int) (GID, error) {
	if !c.g.Use() {
		return GID{}, ErrClosed
	}
	defer c.g.Done()
	g, err := rdmacore.QueryGID(c.raw, port, index)
	return GID(g), err
}
