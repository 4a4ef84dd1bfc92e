package main

import (
	"fmt"
	"io"

	"github.com/rdmanet/sdk/rdmanet"
)

// defaultFootprint is what one connection with the default rdmanet.Config holds.
func defaultFootprint() rdmanet.Footprint {
	fp, _ := rdmanet.Config{}.Footprint() // the zero Config is valid (rdmanet's TestFootprint)
	return fp
}

// limitsJSON is what bounds the number of RDMA connections of a process.
// -1 means unlimited.
type limitsJSON struct {
	Known       bool  `json:"known"` // false where the limits cannot be read (not Linux)
	MemlockSoft int64 `json:"memlock_soft"`
	MemlockHard int64 `json:"memlock_hard"`
	// CapIPCLock: the process may lock memory beyond RLIMIT_MEMLOCK.
	CapIPCLock bool `json:"cap_ipc_lock"`
	// PinnedNow is what this process has pinned now (-1: unknown).
	PinnedNow  int64 `json:"pinned_bytes"`
	NofileSoft int64 `json:"nofile_soft"`
	NofileHard int64 `json:"nofile_hard"`
	// NofileOpen is how many descriptors this process has open (-1: unknown).
	NofileOpen int64 `json:"nofile_open"`

	// With the default rdmanet.Config: what an idle connection end uses
	// of registered memory, and a streaming one (its rings grown).
	LockedPerConn    uint64 `json:"locked_bytes_per_connection"`
	StreamingPerConn uint64 `json:"locked_bytes_per_streaming_connection"`
	FDsPerConn       int    `json:"fds_per_connection"`
	// About how many default connection ends each limit allows beyond
	// what is pinned now, idle (and streaming, for RLIMIT_MEMLOCK; rdmanet
	// raises its soft limit to the hard one; Go raises RLIMIT_NOFILE's
	// likewise), and the smaller of the idle counts.
	ConnsByMemlock          int64 `json:"connections_by_memlock"`
	StreamingConnsByMemlock int64 `json:"streaming_connections_by_memlock"`
	ConnsByNofile           int64 `json:"connections_by_nofile"`
	Connections             int64 `json:"connections"`
}

func readLimits() limitsJSON {
	fp := defaultFootprint()
	l := limitsJSON{LockedPerConn: uint64(fp.RegisteredBytes), StreamingPerConn: uint64(fp.StreamingRegisteredBytes), FDsPerConn: fp.FileDescriptors}
	if !platformLimits(&l) {
		l.MemlockSoft, l.MemlockHard, l.NofileSoft, l.NofileHard, l.NofileOpen, l.PinnedNow = -1, -1, -1, -1, -1, -1
		l.ConnsByMemlock, l.StreamingConnsByMemlock, l.ConnsByNofile, l.Connections = -1, -1, -1, -1
		return l
	}
	l.Known = true
	switch {
	case l.CapIPCLock || l.MemlockHard < 0:
		l.ConnsByMemlock, l.StreamingConnsByMemlock = -1, -1
	default:
		left := l.MemlockHard - max(l.PinnedNow, 0)
		l.ConnsByMemlock = max(left, 0) / int64(l.LockedPerConn)
		l.StreamingConnsByMemlock = max(left, 0) / int64(l.StreamingPerConn)
	}
	l.ConnsByNofile = -1 // a connection holds no descriptor of its own
	if l.NofileSoft >= 0 && fp.FileDescriptors > 0 {
		l.ConnsByNofile = l.NofileSoft / int64(fp.FileDescriptors)
	}
	l.Connections = l.ConnsByNofile
	if l.ConnsByMemlock >= 0 && (l.Connections < 0 || l.ConnsByMemlock < l.Connections) {
		l.Connections = l.ConnsByMemlock
	}
	return l
}

func printLimits(w io.Writer, l limitsJSON) {
	if !l.Known {
		fmt.Fprintln(w, "limits: cannot be read on this system")
		return
	}
	capText := "no"
	if l.CapIPCLock {
		capText = "yes (registration is not bounded by RLIMIT_MEMLOCK)"
	}
	fmt.Fprintln(w, "limits of this process:")
	fmt.Fprintf(w, "  RLIMIT_MEMLOCK  soft %s, hard %s, %s pinned now (rdmanet raises the soft limit to the hard\n", limitBytes(l.MemlockSoft), limitBytes(l.MemlockHard), pinnedText(l.PinnedNow))
	fmt.Fprintln(w, "                  one; a registration the limit stops fails with an error that names it)")
	fmt.Fprintf(w, "  CAP_IPC_LOCK    %s\n", capText)
	fmt.Fprintf(w, "  RLIMIT_NOFILE   soft %s, hard %s, %s open now (a process at its limit gets errors\n", limitCount(l.NofileSoft), limitCount(l.NofileHard), limitCount(l.NofileOpen))
	fmt.Fprintln(w, "                  from rdma-core, some as ENOENT; rdmanet's errors then name this limit)")
	fmt.Fprintf(w, "  per connection  %s registered idle, %s streaming (its rings grown), %d file descriptors\n",
		iec(l.LockedPerConn), iec(l.StreamingPerConn), l.FDsPerConn)
	fmt.Fprintln(w, "                  (an end, default rdmanet.Config; from pools registered per device and peer)")
	fmt.Fprintf(w, "  connections     about %s more ends (locked memory allows %s idle or %s streaming, file descriptors %s)\n",
		limitCount(l.Connections), limitCount(l.ConnsByMemlock), limitCount(l.StreamingConnsByMemlock), limitCount(l.ConnsByNofile))
}

func limitBytes(n int64) string {
	if n < 0 {
		return "unlimited"
	}
	return iec(uint64(n))
}

func pinnedText(n int64) string {
	if n < 0 {
		return "unknown"
	}
	return iec(uint64(n))
}

func limitCount(n int64) string {
	if n < 0 {
		return "unlimited"
	}
	return fmt.Sprint(n)
}
