package verbs

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"unsafe"

	"github.com/rdmanet/sdk/internal/rdmacore"
)

// On any host: Devices either lists devices or says why it cannot, never panics,
// and a closed Buffer refuses use.
func TestDevicesReportsWhy(t *testing.T) {
	devs, err := Devices()
	var unavailable *UnavailableError
	if os.Getenv("RDMANET_EXPECT_NO_RDMA_CORE") != "" {
		// scripts/no-rdma-core-test hides rdma-core: the reason must say so.
		if !errors.As(err, &unavailable) {
			t.Fatalf("with rdma-core hidden, Devices() = %v, want *UnavailableError", err)
		}
		t.Logf("reported: %v", err)
		return
	}
	switch {
	case err == nil:
		t.Logf("%d RDMA devices: %v", len(devs), devs)
	case errors.Is(err, ErrNotSupported), errors.As(err, &unavailable):
		t.Logf("RDMA unavailable, as reported: %v", err)
	case errors.Is(err, ErrNoDevice):
		t.Logf("no RDMA device, as reported: %v", err)
	default:
		t.Fatalf("Devices error %v (%T) says neither ErrNoDevice nor why RDMA is unavailable", err, err)
	}
}

func TestOpenUnknownDevice(t *testing.T) {
	if Available() != nil {
		t.Skip("rdma-core not loadable here:", Available())
	}
	if _, err := Open("no-such-device"); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Open(no-such-device) = %v, want ErrNoDevice", err)
	}
}

// TestNoDeviceAtTheDescriptorLimit: libibverbs's "no device" errnos mean
// no device, unless the process was out of descriptors when they came.
func TestNoDeviceAtTheDescriptorLimit(t *testing.T) {
	if err := noDevice(&CallError{Func: "ibv_get_device_list", Errno: syscall.ENOSYS}); !errors.Is(err, ErrNoDevice) {
		t.Errorf("ENOSYS: %v, want ErrNoDevice", err)
	}
	atLimit := &CallError{Func: "ibv_get_device_list", Errno: syscall.ENOSYS, Descriptors: &DescriptorLimit{Open: 4095, Limit: 4095}}
	if err := noDevice(atLimit); errors.Is(err, ErrNoDevice) || !errors.Is(err, syscall.EMFILE) {
		t.Errorf("ENOSYS at the descriptor limit: %v, want EMFILE and not ErrNoDevice", err)
	}
}

// A CQ destroyed and one made after it at the same address (rdma-core's
// allocator reuses it): the old one's Close must not take the new one out
// of the channel's list, or Wait drops the new one's events without
// acknowledging them, and its destroy waits for them for ever.
func TestChannelForgetsOnlyItsOwnCQ(t *testing.T) {
	ch := &CompChannel{cqs: make(map[rdmacore.CQ]*CQ)}
	addr := rdmacore.CQ(unsafe.Pointer(new(byte)))
	old := &CQ{raw: addr, channel: ch}
	ch.add(old)
	reused := &CQ{raw: addr, channel: ch} // made before old's Close ended
	ch.add(reused)
	ch.forget(old)
	if got := ch.cqs[addr]; got != reused {
		t.Fatalf("after the old CQ's Close, the channel lists %p for the address, want the new CQ %p", got, reused)
	}
	ch.forget(reused)
	if got, ok := ch.cqs[addr]; ok {
		t.Fatalf("after the new CQ's Close, the channel still lists %p", got)
	}
}
