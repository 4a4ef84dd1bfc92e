package main

import (
	"github.com/rdmanet/sdk/internal/rdmacore"
	"golang.org/x/sys/unix"
)

// platformLimits reads RLIMIT_MEMLOCK, RLIMIT_NOFILE and CAP_IPC_LOCK.
func platformLimits(l *limitsJSON) bool {
	var m, n unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &m) != nil || unix.Getrlimit(unix.RLIMIT_NOFILE, &n) != nil {
		return false
	}
	l.MemlockSoft, l.MemlockHard = rlim(m.Cur), rlim(m.Max)
	l.NofileSoft, l.NofileHard = rlim(n.Cur), rlim(n.Max)
	l.NofileOpen = -1
	if open, _, ok := rdmacore.DescriptorUse(); ok {
		l.NofileOpen = int64(open)
	}
	l.PinnedNow = -1
	if pinned, _, capIPCLock, ok := rdmacore.PinnedMemory(); ok {
		l.PinnedNow, l.CapIPCLock = pinned, capIPCLock
	}
	return true
}

func rlim(v uint64) int64 {
	if v == unix.RLIM_INFINITY || v > 1<<62 {
		return -1
	}
	return int64(v)
}
