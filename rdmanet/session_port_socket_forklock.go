//go:build darwin || ios

package rdmanet

import "syscall"

// streamSocket opens a TCP socket of the family, closed on exec. These
// systems have no SOCK_CLOEXEC: the flag is set after socket(2), under
// ForkLock so that no fork in between hands the socket to a child, as
// package net does.
func streamSocket(family int) (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM, 0)
	if err != nil {
		return -1, err
	}
	syscall.CloseOnExec(fd)
	return fd, nil
}
