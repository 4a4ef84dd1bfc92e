//go:build linux

package rdmalink

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/verbs"
)

// TestLabDeviceLimits: a connection asks a device for more than it allows
// and gets an error that names the limit, before anything is allocated.
// The device's limits are made small here (the cache New reads them from):
// no lab device is small enough for rdmanet's Config to exceed.
func TestLabDeviceLimits(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, p := range env.Pairs() {
		t.Run(p.Provider, func(t *testing.T) {
			id, err := cm.NewID()
			if err != nil {
				t.Fatal(err)
			}
			defer id.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := id.Resolve(ctx, p.AddrA, netip.AddrPortFrom(p.AddrB, 1)); err != nil {
				t.Fatal(err)
			}
			dev := id.Context().Name()
			real, err := id.Context().QueryDevice()
			if err != nil {
				t.Fatal(err)
			}
			defer deviceAttrs.Delete(dev)
			for _, c := range []struct {
				limit string
				set   func(*verbs.DeviceAttr)
			}{
				{"max_qp_wr", func(a *verbs.DeviceAttr) { a.MaxQPWR = 16 }},
				{"max_cqe", func(a *verbs.DeviceAttr) { a.MaxCQE = 100 }},
			} {
				attr := real
				c.set(&attr)
				deviceAttrs.Store(dev, attr)
				_, err := New(id, Config{SendBuffer: 4096, RecvBuffer: 4096, SendDepth: 64, RecvDepth: 64, ControlDepth: 4})
				var le *LimitError
				if !errors.As(err, &le) || le.Limit != c.limit || le.Device != dev {
					t.Fatalf("%s: New = %v, want a *LimitError naming %s of %s", c.limit, err, c.limit, dev)
				}
				t.Log(err)
			}
			// With the device's own limits the same connection is made.
			deviceAttrs.Store(dev, real)
			l, err := New(id, Config{SendBuffer: 4096, RecvBuffer: 4096, SendDepth: 64, RecvDepth: 64, ControlDepth: 4})
			if err != nil {
				t.Fatal(err)
			}
			id.Close()
			l.Discard()
		})
	}
}
