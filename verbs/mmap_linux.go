package verbs

import "golang.org/x/sys/unix"

func mapMemory(size int) ([]byte, error) {
	page := unix.Getpagesize()
	size = (size + page - 1) / page * page
	return unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
}

func unmapMemory(b []byte) error { return unix.Munmap(b) }
