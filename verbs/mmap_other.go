//go:build !linux

package verbs

func mapMemory(int) ([]byte, error) { return nil, ErrNotSupported }

func unmapMemory([]byte) error { return ErrNotSupported }
