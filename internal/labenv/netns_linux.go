package labenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// InNetns runs fn on a locked OS thread switched into the named network
// namespace (/run/netns/NAME or /var/run/netns/NAME), switching back
// afterwards; sockets created in fn stay in that namespace. Used to start a TCP
// server on the lab's non-RDMA hosts.
//
// Only fn's own goroutine is in the namespace: goroutines it starts run on
// other threads, in the caller's namespace.
func InNetns(name string, fn func() error) error {
	if name == "" || name == "." || name == ".." || filepath.Base(name) != name {
		return fmt.Errorf("network namespace %q: invalid name", name)
	}
	target, err := os.Open(filepath.Join("/run/netns", name))
	if errors.Is(err, os.ErrNotExist) {
		target, err = os.Open(filepath.Join("/var/run/netns", name))
	}
	if err != nil {
		return fmt.Errorf("network namespace %q: %w", name, err)
	}
	defer target.Close()

	// A fresh goroutine, so that if switching back fails it can end with its
	// thread still locked: the runtime then throws the thread away instead of
	// reusing one that sits in the wrong namespace.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering network namespace %q: %w", name, err)
			return
		}
		fnErr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(fnErr, fmt.Errorf("leaving network namespace %q: %w", name, err))
			return // thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}
