// Package labenv tells tests whether they run inside the rdmanet lab (a QEMU
// VM with Soft-RoCE and Soft-iWARP started by cmd/rdmanet-lab) and describes
// the lab's hosts.
//
// The lab's topology is defined once, in [Default] and the variable table
// below; rdmanet-lab builds the network from it and passes it to the command it
// runs as environment variables, which [RequireRDMA] reads back.
package labenv

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// VarLab is set to "1" in the environment of every command the lab runs.
const VarLab = "RDMANET_LAB"

// Env describes the lab's network as a test sees it.
//
// A and B are two hosts joined by two independent RDMA paths: path 1
// (AddrA, AddrB) and path 2 (AddrA2, AddrB2), each a veth pair of its own
// with an rxe device on each end, so that a fault on one path's netdevs or
// devices leaves the other path alone. All four addresses are in the VM's
// initial network namespace: TCP between any two of them goes through the
// loopback interface, not through the veths, so it keeps working whatever
// happens to an RDMA path.
//
// A and B are also joined by a Soft-iWARP (siw) pair (AddrIA, AddrIB): a
// veth pair of its own with an siw device on each end. siw carries iWARP
// over the kernel's TCP, which between these local addresses goes through
// the loopback interface too (docs/lab.md, "Soft-iWARP").
type Env struct {
	AddrA, AddrB       netip.Addr // path 1: two addresses on RDMA devices that reach each other
	DevA, DevB         string     // their RDMA device names
	NetdevA, NetdevB   string     // the network interfaces under DevA and DevB
	AddrA2, AddrB2     netip.Addr // path 2, independent of path 1: A's and B's second addresses
	DevA2, DevB2       string     // their RDMA device names
	NetdevA2, NetdevB2 string     // the network interfaces under DevA2 and DevB2
	AddrIA, AddrIB     netip.Addr // the iWARP pair: A's and B's addresses on siw devices
	DevIA, DevIB       string     // their siw device names
	NetdevIA, NetdevIB string     // the network interfaces under DevIA and DevIB
	NoRDMAHost         netip.Addr // a host without RDMA (TCP works, RDMA gets no answer)
	NoRDMANetns        string     // the network namespace holding NoRDMAHost
	PlainHost          netip.Addr // reached through a netdev that has no RDMA device
	PlainNetns         string     // the network namespace holding PlainHost
}

// Default is the lab's topology. Every address is in 198.18.0.0/15, the range
// RFC 2544 reserves for benchmarking, so nothing here can collide with a real
// network.
var Default = Env{
	AddrA:       netip.MustParseAddr("198.18.0.1"),
	AddrB:       netip.MustParseAddr("198.18.0.2"),
	DevA:        "rxe0",
	DevB:        "rxe1",
	NetdevA:     "lab-a",
	NetdevB:     "lab-b",
	AddrA2:      netip.MustParseAddr("198.18.3.1"),
	AddrB2:      netip.MustParseAddr("198.18.3.2"),
	DevA2:       "rxe3",
	DevB2:       "rxe4",
	NetdevA2:    "lab-c",
	NetdevB2:    "lab-d",
	AddrIA:      netip.MustParseAddr("198.18.4.1"),
	AddrIB:      netip.MustParseAddr("198.18.4.2"),
	DevIA:       "siw0",
	DevIB:       "siw1",
	NetdevIA:    "lab-i0",
	NetdevIB:    "lab-i1",
	NoRDMAHost:  netip.MustParseAddr("198.18.1.2"),
	NoRDMANetns: "nordma",
	PlainHost:   netip.MustParseAddr("198.18.2.2"),
	PlainNetns:  "plain",
}

// Path is one of the RDMA paths between A and B: an address on each host,
// the RDMA device it is on and that device's network interface.
type Path struct {
	A, B             netip.Addr
	DevA, DevB       string
	NetdevA, NetdevB string
}

// Paths returns path 1 and path 2.
func (e Env) Paths() [2]Path {
	return [2]Path{
		{e.AddrA, e.AddrB, e.DevA, e.DevB, e.NetdevA, e.NetdevB},
		{e.AddrA2, e.AddrB2, e.DevA2, e.DevB2, e.NetdevA2, e.NetdevB2},
	}
}

// Providers of the lab's RDMA devices, as rdma link add and Pair name them.
const (
	ProviderRXE = "rxe" // Soft-RoCE: RoCE v2 over UDP, verbs transport IB
	ProviderSIW = "siw" // Soft-iWARP: iWARP over the kernel's TCP, verbs transport iWARP
)

// Pair is two RDMA devices that reach each other, one on host A and one on host B.
type Pair struct {
	Provider         string // ProviderRXE or ProviderSIW
	AddrA, AddrB     netip.Addr
	DevA, DevB       string
	NetdevA, NetdevB string
}

// RoCE returns path 1's Soft-RoCE pair.
func (e Env) RoCE() Pair {
	return Pair{ProviderRXE, e.AddrA, e.AddrB, e.DevA, e.DevB, e.NetdevA, e.NetdevB}
}

// IWARP returns the Soft-iWARP pair.
func (e Env) IWARP() Pair {
	return Pair{ProviderSIW, e.AddrIA, e.AddrIB, e.DevIA, e.DevIB, e.NetdevIA, e.NetdevIB}
}

// Pairs returns one pair of each provider, Soft-RoCE first: what a test
// that must pass on every kind of RDMA device ranges over.
func (e Env) Pairs() []Pair { return []Pair{e.RoCE(), e.IWARP()} }

// variables maps each field of Env to its environment variable. field returns
// a *netip.Addr or a *string pointing into the given Env.
var variables = []struct {
	name  string
	field func(*Env) any
}{
	{"RDMANET_LAB_ADDR_A", func(e *Env) any { return &e.AddrA }},
	{"RDMANET_LAB_ADDR_B", func(e *Env) any { return &e.AddrB }},
	{"RDMANET_LAB_DEV_A", func(e *Env) any { return &e.DevA }},
	{"RDMANET_LAB_DEV_B", func(e *Env) any { return &e.DevB }},
	{"RDMANET_LAB_NETDEV_A", func(e *Env) any { return &e.NetdevA }},
	{"RDMANET_LAB_NETDEV_B", func(e *Env) any { return &e.NetdevB }},
	{"RDMANET_LAB_ADDR_A2", func(e *Env) any { return &e.AddrA2 }},
	{"RDMANET_LAB_ADDR_B2", func(e *Env) any { return &e.AddrB2 }},
	{"RDMANET_LAB_DEV_A2", func(e *Env) any { return &e.DevA2 }},
	{"RDMANET_LAB_DEV_B2", func(e *Env) any { return &e.DevB2 }},
	{"RDMANET_LAB_NETDEV_A2", func(e *Env) any { return &e.NetdevA2 }},
	{"RDMANET_LAB_NETDEV_B2", func(e *Env) any { return &e.NetdevB2 }},
	{"RDMANET_LAB_IWARP_ADDR_A", func(e *Env) any { return &e.AddrIA }},
	{"RDMANET_LAB_IWARP_ADDR_B", func(e *Env) any { return &e.AddrIB }},
	{"RDMANET_LAB_IWARP_DEV_A", func(e *Env) any { return &e.DevIA }},
	{"RDMANET_LAB_IWARP_DEV_B", func(e *Env) any { return &e.DevIB }},
	{"RDMANET_LAB_IWARP_NETDEV_A", func(e *Env) any { return &e.NetdevIA }},
	{"RDMANET_LAB_IWARP_NETDEV_B", func(e *Env) any { return &e.NetdevIB }},
	{"RDMANET_LAB_NORDMA_HOST", func(e *Env) any { return &e.NoRDMAHost }},
	{"RDMANET_LAB_NORDMA_NETNS", func(e *Env) any { return &e.NoRDMANetns }},
	{"RDMANET_LAB_PLAIN_HOST", func(e *Env) any { return &e.PlainHost }},
	{"RDMANET_LAB_PLAIN_NETNS", func(e *Env) any { return &e.PlainNetns }},
}

// Environ returns e as environment entries ("KEY=VALUE"), VarLab=1 first.
func (e Env) Environ() []string {
	out := []string{VarLab + "=1"}
	for _, v := range variables {
		var s string
		switch p := v.field(&e).(type) {
		case *netip.Addr:
			s = p.String()
		case *string:
			s = *p
		}
		out = append(out, v.name+"="+s)
	}
	return out
}

// VarError reports a lab variable that is missing or malformed.
type VarError struct {
	Name  string
	Value string
	Err   error // nil if the variable is unset
}

func (e *VarError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("environment variable %s is not set", e.Name)
	}
	return fmt.Sprintf("environment variable %s=%q: %v", e.Name, e.Value, e.Err)
}

func (e *VarError) Unwrap() error { return e.Err }

// FromEnviron reads an Env from the lab's variables through lookup
// (os.LookupEnv in practice). It does not look at VarLab.
func FromEnviron(lookup func(string) (string, bool)) (Env, error) {
	var e Env
	for _, v := range variables {
		s, ok := lookup(v.name)
		if !ok || s == "" {
			return Env{}, &VarError{Name: v.name}
		}
		switch p := v.field(&e).(type) {
		case *netip.Addr:
			a, err := netip.ParseAddr(s)
			if err != nil {
				return Env{}, &VarError{Name: v.name, Value: s, Err: err}
			}
			*p = a
		case *string:
			*p = s
		}
	}
	return e, nil
}

// ListenTCP listens on TCP on host, on a port the kernel picks, inside the
// network namespace netns ("" for the caller's): a plain TCP server on one
// of the lab's hosts.
func ListenTCP(netns string, host netip.Addr) (net.Listener, error) {
	var ln net.Listener
	listen := func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(host, 0).String())
		return err
	}
	if netns == "" {
		return ln, listen()
	}
	return ln, InNetns(netns, listen)
}

// InLab reports whether the process runs inside the rdmanet lab (RDMANET_LAB=1).
func InLab() bool { return os.Getenv(VarLab) == "1" }

// skipReason tells someone who ran an RDMA test outside the lab how to run it.
const skipReason = "needs RDMA: not in the rdmanet lab (" + VarLab + " is not 1); " +
	"run it with `make lab-test`, or `go build -o /tmp/rdmanet-lab ./cmd/rdmanet-lab && " +
	"go test -exec /tmp/rdmanet-lab ./...`"

// RequireRDMA returns the lab's environment. Outside the lab it calls t.Skip
// with a reason saying how to run the test in the lab. Inside the lab, if
// anything is missing (variables, /sys/class/infiniband devices of either
// provider, /dev/infiniband/uverbs*), it calls t.Fatal: an RDMA test must
// never skip in the lab.
func RequireRDMA(t testing.TB) Env {
	t.Helper()
	return requireRDMA(t, os.LookupEnv, "/")
}

// requireRDMA is RequireRDMA with the environment and the file system root
// (where sys/ and dev/ are looked up) as parameters, so it can be tested.
func requireRDMA(t testing.TB, lookup func(string) (string, bool), root string) Env {
	t.Helper()
	if v, _ := lookup(VarLab); v != "1" {
		t.Skip(skipReason)
	}
	e, err := FromEnviron(lookup)
	if err != nil {
		t.Fatalf("rdmanet lab is broken: %v", err)
	}
	if err := checkDevices(root, e); err != nil {
		t.Fatalf("rdmanet lab is broken: %v", err)
	}
	return e
}

// checkDevices verifies that the kernel knows e's RDMA devices and that the
// device files user space opens exist.
func checkDevices(root string, e Env) error {
	for _, dev := range []string{e.DevA, e.DevB, e.DevA2, e.DevB2, e.DevIA, e.DevIB} {
		p := filepath.Join(root, "sys/class/infiniband", dev)
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("RDMA device %s: %w", dev, err)
		}
	}
	uverbs, err := filepath.Glob(filepath.Join(root, "dev/infiniband/uverbs*"))
	if err != nil {
		return err
	}
	if len(uverbs) == 0 {
		return errors.New("no /dev/infiniband/uverbs* device files")
	}
	if _, err := os.Stat(filepath.Join(root, "dev/infiniband/rdma_cm")); err != nil {
		return fmt.Errorf("RDMA connection manager: %w", err)
	}
	return nil
}
