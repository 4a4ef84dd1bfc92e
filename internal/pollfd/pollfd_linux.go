package pollfd

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// New makes fd non-blocking (rdma-core's calls on it then return EAGAIN instead
// of blocking) and registers a duplicate with the netpoller. read is the
// owner's non-blocking read: done reports that it took what Wait waits for.
func New(fd int, name string, read func() (done bool, err error)) (*FD, error) {
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
	p := &FD{file: f, raw: raw}
	p.bind(read)
	return p, nil
}
