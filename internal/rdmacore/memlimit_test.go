//go:build linux

package rdmacore

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCallErrorNamesMemoryLimit: a registration stopped by RLIMIT_MEMLOCK
// says what it asked, what was pinned, the limit, what is left, and how
// to lift it; it still matches its errno.
func TestCallErrorNamesMemoryLimit(t *testing.T) {
	err := &CallError{Func: "ibv_reg_mr", Errno: syscall.ENOMEM,
		Memory: &MemoryLimit{Asked: 256 << 10, Pinned: 8<<20 - 96<<10, Limit: 8 << 20}}
	for _, want := range []string{"ibv_reg_mr: cannot allocate memory", "asked to pin 256 KiB", "7.9 MiB pinned of the 8 MiB RLIMIT_MEMLOCK allows", "96 KiB left", "CAP_IPC_LOCK", "ulimit -l"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	if !errors.Is(err, syscall.ENOMEM) {
		t.Errorf("%v does not match ENOMEM", err)
	}
	if s := (&CallError{Func: "ibv_reg_mr", Errno: syscall.ENOMEM}).Error(); strings.Contains(s, "RLIMIT_MEMLOCK") {
		t.Errorf("without the limit's part: %q", s)
	}
}

func TestParseStatus(t *testing.T) {
	const status = "Name:\tx\nVmLck:\t       4 kB\nVmPin:\t     524 kB\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n"
	pinned, capIPCLock, ok := parseStatus(status)
	if !ok || pinned != 524<<10 || !capIPCLock {
		t.Errorf("parseStatus: %d, %v, %v", pinned, capIPCLock, ok)
	}
	if _, capIPCLock, ok := parseStatus(strings.Replace(status, "000001ffffffffff", "0000000000000000", 1)); !ok || capIPCLock {
		t.Errorf("without CAP_IPC_LOCK: %v, %v", capIPCLock, ok)
	}
	if _, _, ok := parseStatus("Name:\tx\n"); ok {
		t.Errorf("a status without VmPin parsed")
	}
}

// TestMemoryLimitFor: a registration that would pass the process's limit
// is blamed on it unless the process has CAP_IPC_LOCK; one that fits, or
// an unlimited process, never is.
func TestMemoryLimitFor(t *testing.T) {
	pinned, _, capIPCLock, ok := PinnedMemory()
	if !ok {
		t.Fatal("cannot read this process's pinned memory")
	}
	var saved unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &saved); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &saved)
	lowered := saved
	lowered.Cur = uint64(pinned + 64<<10)
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lowered); err != nil {
		t.Fatal(err)
	}
	over, under := memoryLimitFor(1<<20), memoryLimitFor(4<<10)
	if under != nil {
		t.Errorf("4 KiB under a limit 64 KiB away blamed on it: %+v", under)
	}
	switch {
	case capIPCLock && over != nil:
		t.Errorf("with CAP_IPC_LOCK, blamed on the limit: %+v", over)
	case !capIPCLock && (over == nil || over.Asked != 1<<20 || over.Limit != int64(lowered.Cur) || over.Pinned != pinned):
		t.Errorf("1 MiB over the limit: %+v", over)
	}
	t.Logf("CAP_IPC_LOCK %v, %d bytes pinned", capIPCLock, pinned)
}
