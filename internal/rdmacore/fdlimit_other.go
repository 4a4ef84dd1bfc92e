//go:build !linux

package rdmacore

func descriptorUse() (open, limit int, ok bool) { return 0, 0, false }
