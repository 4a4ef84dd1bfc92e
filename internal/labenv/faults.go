package labenv

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Drop makes the path drop every packet, netem on both of its netdevs,
// until heal is called: the "RDMA path dead" fault that leaves rxe usable
// and TCP between the lab's hosts (which goes through lo) alive
// (docs/lab.md). heal removes what Drop added; calling it again does
// nothing. Drop refuses outside the lab, where the netdevs are not the
// lab's to change; if it cannot drop on both netdevs it undoes what it did.
//
// dead is when the path died, at the latest: when the first netdev's tc
// returned. One netdev dropping is enough, as every exchange on a path
// needs both directions, and under the lab's emulated CPU each tc run
// takes a few hundred milliseconds, so Drop returns well after that.
//
// It is the non-test form of DropAll, for programs run in the lab (labbench).
func (p Path) Drop() (heal func() error, dead time.Time, err error) {
	if !InLab() {
		return nil, time.Time{}, fmt.Errorf("labenv: no faults outside the lab (%s is not 1)", VarLab)
	}
	var dropping []string
	undo := func() error {
		var errs []error
		for _, dev := range dropping {
			errs = append(errs, clearQdisc(dev))
		}
		return errors.Join(errs...)
	}
	for _, dev := range []string{p.NetdevA, p.NetdevB} {
		if err := dropEverything(dev); err != nil {
			return nil, time.Time{}, errors.Join(err, undo())
		}
		if len(dropping) == 0 {
			dead = time.Now()
		}
		dropping = append(dropping, dev)
	}
	return sync.OnceValue(undo), dead, nil
}

// DropAll is Drop for a test: it fails t if the fault cannot be made, and
// undoes it at the end of t unless Heal did.
func (p Path) DropAll(t testing.TB) {
	t.Helper()
	heal, _, err := p.Drop()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { heal() })
}

// Heal ends DropAll.
func (p Path) Heal(t testing.TB) {
	t.Helper()
	for _, dev := range []string{p.NetdevA, p.NetdevB} {
		if err := clearQdisc(dev); err != nil {
			t.Fatal(err)
		}
	}
}

// DeleteAddrA deletes the path's address on A's netdev until the end of t:
// A's queue pairs on it fail at once (local QP operation error), the other
// side finds the path dead by keepalive, and TCP to or from the address
// fails too (docs/lab.md). The cleanup adds it back and puts B's route
// after A's again, as docs/lab.md says to. It fails t outside the lab.
func (p Path) DeleteAddrA(t testing.TB) {
	t.Helper()
	if !InLab() {
		t.Fatalf("labenv: DeleteAddrA outside the lab (%s is not 1)", VarLab)
	}
	prefix, err := addrPrefix(p.NetdevA, p.A)
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) error {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("addr", "del", prefix.String(), "dev", p.NetdevA); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		subnet := prefix.Masked().String()
		for _, args := range [][]string{
			{"addr", "add", prefix.String(), "dev", p.NetdevA},
			{"route", "del", subnet, "dev", p.NetdevB},
			{"route", "append", subnet, "dev", p.NetdevB, "proto", "kernel", "scope", "link", "src", p.B.String()},
		} {
			if err := run(args...); err != nil {
				t.Errorf("restoring %v: %v", p.A, err)
			}
		}
	})
}

// addrPrefix is a's prefix on the netdev.
func addrPrefix(netdev string, a netip.Addr) (netip.Prefix, error) {
	ifi, err := net.InterfaceByName(netdev)
	if err != nil {
		return netip.Prefix{}, err
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, x := range addrs {
		if ipn, ok := x.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && ip.Unmap() == a {
				ones, _ := ipn.Mask.Size()
				return netip.PrefixFrom(a, ones), nil
			}
		}
	}
	return netip.Prefix{}, fmt.Errorf("labenv: %v is not on %s", a, netdev)
}

// dropEverything puts a netem qdisc that loses every packet on dev.
func dropEverything(dev string) error {
	if out, err := exec.Command("tc", "qdisc", "add", "dev", dev, "root", "netem", "loss", "100%").CombinedOutput(); err != nil {
		return fmt.Errorf("labenv: tc netem on %s: %v: %s", dev, err, out)
	}
	return nil
}

// clearQdisc removes dev's root qdisc (the netem of dropEverything).
func clearQdisc(dev string) error {
	if out, err := exec.Command("tc", "qdisc", "del", "dev", dev, "root").CombinedOutput(); err != nil {
		return fmt.Errorf("labenv: healing %s: %v: %s", dev, err, out)
	}
	return nil
}
