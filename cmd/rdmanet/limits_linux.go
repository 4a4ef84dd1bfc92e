package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"

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
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		l.NofileOpen = int64(len(ents) - 1) // less ReadDir's own
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
