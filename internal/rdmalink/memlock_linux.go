package rdmalink

import (
	"sync"

	"golang.org/x/sys/unix"
)

// raiseMemlock raises RLIMIT_MEMLOCK's soft limit to its hard limit, once:
// registered memory counts against it, and the soft limit is often 8 MiB.
var raiseMemlock = sync.OnceFunc(func() {
	var l unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		unix.Setrlimit(unix.RLIMIT_MEMLOCK, &l)
	}
})
