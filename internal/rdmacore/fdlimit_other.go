//go:build !linux

package rdmacore

// DescriptorUse reports nothing off Linux.
func DescriptorUse() (open, limit int, ok bool) { return 0, 0, false }
