//go:build linux

package lab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Exit statuses of rdmanet-lab when it cannot report the command's own.
const (
	ExitLabError = 125 // the lab itself failed
	ExitTimeout  = 124 // the -timeout expired (as timeout(1) reports it)
	ExitNotExec  = 126 // the command exists but cannot be executed (as a shell reports it)
	ExitNotFound = 127 // the command was not found (as a shell reports it)
)

// MissingError reports something the lab needs that is not installed.
type MissingError struct {
	What    string // what was looked for
	Package string // the Debian package that provides it
	Err     error
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("%s: %v (install the Debian package %s)", e.What, e.Err, e.Package)
}

func (e *MissingError) Unwrap() error { return e.Err }

// CommandError reports a command that cannot be run, found before booting.
type CommandError struct {
	Name string
	Err  error
}

func (e *CommandError) Error() string { return fmt.Sprintf("%s: %v", e.Name, e.Err) }

func (e *CommandError) Unwrap() error { return e.Err }

// TimeoutError reports that the run exceeded its time limit; the VM was killed.
type TimeoutError struct{ After time.Duration }

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("timed out after %v; killed the VM", e.After)
}

// SignalError reports that rdmanet-lab was interrupted; the VM was killed.
type SignalError struct{ Signal os.Signal }

func (e *SignalError) Error() string {
	name := e.Signal.String()
	if s, ok := e.Signal.(syscall.Signal); ok && unix.SignalName(s) != "" {
		name = unix.SignalName(s)
	}
	return fmt.Sprintf("interrupted by %s; killed the VM", name)
}

// QEMUError reports QEMU failing before the guest reported a status.
type QEMUError struct {
	Err    error  // from waiting for QEMU
	Stderr string // the end of QEMU's standard error
}

func (e *QEMUError) Error() string {
	return fmt.Sprintf("QEMU failed: %v\n%s", e.Err, e.Stderr)
}

func (e *QEMUError) Unwrap() error { return e.Err }

// BootError reports a VM whose guest did not start the command in time;
// the VM was killed.
type BootError struct {
	After   time.Duration
	Console string // the end of the guest's console output
}

func (e *BootError) Error() string {
	msg := fmt.Sprintf("the guest did not start the command within %v of the boot; killed the VM", e.After)
	if e.Console != "" {
		msg += "; end of the guest console:\n" + e.Console
	}
	return msg
}

// NoStatusError reports a VM that stopped without the guest reporting the
// command's exit status.
type NoStatusError struct {
	Console string // the end of the guest's console output
}

func (e *NoStatusError) Error() string {
	msg := "guest did not report an exit status"
	if e.Console != "" {
		msg += "; end of the guest console:\n" + e.Console
	}
	return msg
}

// ExitCode returns the exit status rdmanet-lab should exit with for err.
func ExitCode(err error) int {
	var (
		timeout *TimeoutError
		sig     *SignalError
		cmd     *CommandError
	)
	switch {
	case errors.As(err, &timeout):
		return ExitTimeout
	case errors.As(err, &sig):
		if s, ok := sig.Signal.(syscall.Signal); ok {
			return 128 + int(s)
		}
	case errors.As(err, &cmd):
		if errors.Is(cmd.Err, os.ErrNotExist) || errors.Is(cmd.Err, exec.ErrNotFound) {
			return ExitNotFound
		}
		return ExitNotExec
	}
	return ExitLabError
}
