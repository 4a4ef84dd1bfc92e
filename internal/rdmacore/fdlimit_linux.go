package rdmacore

import (
	"errors"
	"os"
	"syscall"
)

// DescriptorUse reports how many file descriptors the process has open and
// how many its soft RLIMIT_NOFILE allows. Reading /proc/self/fd takes a
// descriptor itself: EMFILE there means every one is in use.
func DescriptorUse() (open, limit int, ok bool) {
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) != nil || rl.Cur > 1<<31 {
		return 0, 0, false
	}
	limit = int(rl.Cur)
	ents, err := os.ReadDir("/proc/self/fd")
	switch {
	case errors.Is(err, syscall.EMFILE):
		return limit, limit, true
	case err != nil:
		return 0, 0, false
	}
	return len(ents) - 1, limit, true // less the one ReadDir had open
}
