//go:build !linux

package nbd

import (
	"errors"
	"os"
)

// errHolesUnsupported: the file system (or OS) cannot punch holes.
var errHolesUnsupported = errors.New("nbd: holes not supported here")

// punchHole is Linux's alone here.
func punchHole(*os.File, int64, int64) error { return errHolesUnsupported }
