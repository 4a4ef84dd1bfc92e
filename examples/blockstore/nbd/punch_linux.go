package nbd

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// errHolesUnsupported: the file system (or OS) cannot punch holes.
var errHolesUnsupported = errors.New("nbd: holes not supported here")

// punchHole deallocates a range of f, which then reads as zeroes, keeping
// f's size.
func punchHole(f *os.File, off, length int64) error {
	if length == 0 {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		ferr = unix.Fallocate(int(fd), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	}); err != nil {
		return err
	}
	if errors.Is(ferr, unix.EOPNOTSUPP) || errors.Is(ferr, unix.ENOSYS) || errors.Is(ferr, unix.ENODEV) {
		return errHolesUnsupported
	}
	if ferr != nil {
		return &os.PathError{Op: "fallocate", Path: f.Name(), Err: ferr}
	}
	return nil
}
