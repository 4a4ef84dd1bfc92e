//go:build !linux

package pollfd

// New is not supported off Linux.
func New(fd int, name string) (*FD, error) { return nil, ErrNotSupported }
