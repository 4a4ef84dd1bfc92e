//go:build !linux

package rdmalink

func raiseMemlock() {}
