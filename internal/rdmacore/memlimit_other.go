//go:build !linux

package rdmacore

// PinnedMemory reports nothing off Linux.
func PinnedMemory() (pinned, limit int64, capIPCLock, ok bool) { return 0, 0, false, false }
