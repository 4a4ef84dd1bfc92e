//go:build !linux

package main

// platformLimits: RDMA, and so these limits, matter on Linux only.
func platformLimits(*limitsJSON) bool { return false }
