package verbs_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/verbs"
)

func TestLabDeviceForAddr(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, c := range []struct {
		addr netip.Addr
		dev  string
	}{{env.AddrA, env.DevA}, {env.AddrB, env.DevB}} {
		got, err := verbs.DeviceForAddr(c.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got.Device != c.dev || got.Netdev == "" {
			t.Errorf("DeviceForAddr(%v) = %+v, want device %s", c.addr, got, c.dev)
		}
	}
	// The near end of the route to the plain host is a netdev without RDMA:
	// the address one below the plain host's is ours on that link.
	near := env.PlainHost.Prev()
	got, err := verbs.DeviceForAddr(near)
	if !errors.Is(err, verbs.ErrNoDevice) || got.Netdev == "" {
		t.Errorf("DeviceForAddr(%v) = %+v, %v; want its netdev and ErrNoDevice", near, got, err)
	}
}

func TestDeviceForAddrNotLocal(t *testing.T) {
	if _, err := verbs.DeviceForAddr(netip.MustParseAddr("192.0.2.77")); err == nil {
		t.Fatal("DeviceForAddr of a foreign address succeeded")
	}
}

func TestLabLinks(t *testing.T) {
	env := labenv.RequireRDMA(t)
	ls, err := verbs.Links()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("links: %+v", ls)
	for _, c := range []struct {
		addr netip.Addr
		dev  string
	}{{env.AddrA, env.DevA}, {env.AddrB, env.DevB}} {
		ad, err := verbs.DeviceForAddr(c.addr)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, l := range ls {
			if l.Device == c.dev {
				found = true
				if l.Netdev != ad.Netdev || l.NetdevIndex == 0 || l.Port != 1 || l.State != verbs.PortActive {
					t.Errorf("link %+v, want port 1 of %s on %s, active", l, c.dev, ad.Netdev)
				}
			}
		}
		if !found {
			t.Errorf("Links has no %s: %+v", c.dev, ls)
		}
	}
}
