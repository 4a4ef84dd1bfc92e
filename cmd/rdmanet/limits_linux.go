package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"

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
	l.CapIPCLock = hasCapability(unix.CAP_IPC_LOCK)
	return true
}

func rlim(v uint64) int64 {
	if v == unix.RLIM_INFINITY || v > 1<<62 {
		return -1
	}
	return int64(v)
}

// hasCapability reports whether capability c is in the process's effective
// set (/proc/self/status, CapEff).
func hasCapability(c int) bool {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "CapEff:"); ok {
			bits, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && bits&(1<<uint(c)) != 0
		}
	}
	return false
}
