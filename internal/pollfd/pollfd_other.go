//go:build !linux

package pollfd

// New is not supported off Linux.
func New(fd int, name string, read func() (bool, error)) (*FD, error) {
	return nil, ErrNotSupported
}
