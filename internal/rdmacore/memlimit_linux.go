package rdmacore

import (
	"os"

	"golang.org/x/sys/unix"
)

// PinnedMemory reports what bounds the memory this process may register:
// the bytes it has pinned (/proc/self/status VmPin, what registration
// counts against the limit), RLIMIT_MEMLOCK's soft limit (-1: unlimited),
// and whether it has CAP_IPC_LOCK, which lifts the limit.
func PinnedMemory() (pinned, limit int64, capIPCLock, ok bool) {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl) != nil {
		return 0, 0, false, false
	}
	limit = -1
	if rl.Cur != unix.RLIM_INFINITY && rl.Cur < 1<<62 {
		limit = int64(rl.Cur)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, limit, false, false
	}
	pinned, capIPCLock, ok = parseStatus(string(status))
	return pinned, limit, capIPCLock, ok
}
