//go:build !linux

package labenv

import "errors"

// InNetns needs Linux network namespaces; the lab is Linux.
func InNetns(name string, fn func() error) error {
	return errors.New("network namespaces need Linux")
}
