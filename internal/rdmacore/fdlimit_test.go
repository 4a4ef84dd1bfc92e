//go:build linux

package rdmacore

import (
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestCallErrorNamesDescriptorLimit: a call that opens descriptors and
// fails at the process's RLIMIT_NOFILE says so, and matches EMFILE, even
// when rdma-core gave another errno; away from the limit it does neither,
// and a call that opens none is never blamed on the limit.
func TestCallErrorNamesDescriptorLimit(t *testing.T) {
	far := callError("rdma_create_event_channel", syscall.ENOENT)
	if errors.Is(far, syscall.EMFILE) || strings.Contains(far.Error(), "RLIMIT_NOFILE") {
		t.Errorf("away from the limit: %v, matches EMFILE: %v", far, errors.Is(far, syscall.EMFILE))
	}

	open, _, ok := DescriptorUse()
	if !ok {
		t.Fatal("cannot read this process's descriptors")
	}
	var saved syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	lowered := saved
	lowered.Cur = uint64(open + 2)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered); err != nil {
		t.Fatal(err)
	}
	near := callError("rdma_create_event_channel", syscall.ENOENT)
	other := callError("ibv_reg_mr", syscall.ENOMEM)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(near, syscall.EMFILE) || !errors.Is(near, syscall.ENOENT) {
		t.Errorf("%v: matches EMFILE %v and ENOENT %v, want both", near, errors.Is(near, syscall.EMFILE), errors.Is(near, syscall.ENOENT))
	}
	if want := "of the " + strconv.Itoa(open+2) + " file descriptors its RLIMIT_NOFILE allows open"; !strings.Contains(near.Error(), want) {
		t.Errorf("%q does not say %q", near, want)
	}
	if errors.Is(other, syscall.EMFILE) {
		t.Errorf("%v matches EMFILE: ibv_reg_mr opens no descriptor", other)
	}
}
