//go:build !linux

package verbs

func rdmaDeviceForNetdev(string) (string, error) { return "", ErrNotSupported }
