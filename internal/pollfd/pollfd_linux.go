package pollfd

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// New makes fd non-blocking (rdma-core's calls on it then return EAGAIN instead
// of blocking) and registers a duplicate with the netpoller.
func New(fd int, name string) (*FD, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("pollfd: set %s non-blocking: %w", name, err)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("pollfd: dup %s: %w", name, err)
	}
	f := os.NewFile(uintptr(dup), name)
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("pollfd: %s: %w", name, err)
	}
	return &FD{file: f, raw: raw}, nil
}
