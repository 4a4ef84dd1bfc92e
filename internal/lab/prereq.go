//go:build linux

package lab

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// tool is a program the lab runs, with the Debian package that provides it.
type tool struct{ name, pkg string }

// Programs the lab needs on the host (for QEMU and the initramfs) and in the
// guest, which runs the host's own programs.
var (
	toolQEMU     = tool{"qemu-system-x86_64", "qemu-system-x86"}
	toolModprobe = tool{"modprobe", "kmod"}
	toolIP       = tool{"ip", "iproute2"}
	toolRDMA     = tool{"rdma", "iproute2"}
)

// sbinDirs are searched after $PATH, because an ordinary user's PATH often
// lacks the sbin directories where modprobe and ip live.
var sbinDirs = []string{"/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// find returns the absolute path of t.
func (t tool) find() (string, error) {
	if p, err := exec.LookPath(t.name); err == nil {
		return filepath.Abs(p)
	}
	for _, dir := range sbinDirs {
		p := filepath.Join(dir, t.name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &MissingError{What: t.name, Package: t.pkg, Err: exec.ErrNotFound}
}

// busyboxPath is where Debian's busybox-static installs busybox.
const busyboxPath = "/bin/busybox"

// findBusybox returns the path of a statically linked busybox: the
// initramfs has no libraries, and Debian's plain busybox package is dynamic.
func findBusybox() (string, error) {
	missing := func(err error) error {
		return &MissingError{What: "static busybox " + busyboxPath, Package: "busybox-static", Err: err}
	}
	f, err := elf.Open(busyboxPath)
	if err != nil {
		return "", missing(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", missing(errors.New("it is dynamically linked"))
		}
	}
	return busyboxPath, nil
}

// checkModules verifies that kernel k has the modules the guest loads, so a
// kernel without Soft-RoCE fails before booting.
func checkModules(modprobe string, k kernel) error {
	args := append([]string{"-S", k.version, "-a", "--show-depends"}, guestModules...)
	if out, err := exec.Command(modprobe, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("kernel %s lacks modules the lab needs: %v: %s", k.version, err, bytes.TrimSpace(out))
	}
	return nil
}
