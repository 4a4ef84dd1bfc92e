//go:build unix && !darwin && !ios && !aix

package rdmanet

import "syscall"

// streamSocket opens a TCP socket of the family, closed on exec.
func streamSocket(family int) (int, error) {
	return syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
}
