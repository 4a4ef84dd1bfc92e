//go:build unix

package main

import "syscall"

// nofileLimit is RLIMIT_NOFILE's soft limit (0: cannot be read).
func nofileLimit() uint64 {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return 0
	}
	return uint64(lim.Cur) // int64 on freebsd
}
