//go:build !unix

package main

// nofileLimit is RLIMIT_NOFILE's soft limit: none here.
func nofileLimit() uint64 { return 0 }
