//go:build !linux

package rdmanet

func raiseMemlock() {}
