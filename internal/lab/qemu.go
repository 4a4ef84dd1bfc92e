//go:build linux

package lab

import (
	"fmt"
	"path/filepath"
	"strings"
)

// machine describes the VM to start.
type machine struct {
	qemu           string // qemu-system-x86_64 path
	kernel, initrd string
	memoryMiB      int
	cpus           int
	verbose        bool   // let the kernel log to the console
	hostTmp        string // host temporary directory, shared writable at the same path
	runDir         string // per-run directory: shared, and holds the sockets below
}

// Unix sockets in the run directory that QEMU connects its character devices
// to. The host listens on them before starting QEMU.
var sockets = struct{ console, ctl, stdout, stderr string }{
	"console.sock", "ctl.sock", "stdout.sock", "stderr.sock",
}

// kernelCmdline is the guest kernel's command line. panic=-1 with QEMU's
// -no-reboot turns a guest panic into QEMU exiting. The rest trims the boot
// under TCG: no speculative execution mitigations (they only slow an emulated
// CPU down), no clock calibration or hardware probing the lab does not need,
// and PCI interrupts routed without interpreting ACPI (about 1 s saved).
func (m machine) kernelCmdline() string {
	args := []string{
		"console=ttyS0", "panic=-1", "mitigations=off", "acpi=noirq",
		"tsc=reliable", "no_timer_check", "i8042.noaux", "i8042.nokbd", "8250.nr_uarts=1",
	}
	if !m.verbose {
		args = append(args, "quiet", "loglevel=1")
	}
	return strings.Join(args, " ")
}

// args returns QEMU's command line.
func (m machine) args() []string {
	sock := func(name string) string { return qemuEscape(filepath.Join(m.runDir, name)) }
	args := []string{
		"-nodefaults", "-no-user-config", "-display", "none",
		"-machine", "pc", "-accel", "tcg,thread=multi", "-cpu", "max",
		"-smp", fmt.Sprint(m.cpus), "-m", fmt.Sprint(m.memoryMiB),
		"-no-reboot",
		// The VM has no network to the outside; its networks are all inside.
		"-nic", "none",
		"-kernel", m.kernel, "-initrd", m.initrd, "-append", m.kernelCmdline(),

		// The kernel console goes to the emulated UART: slow, but there from
		// the first message. The command's data goes over virtio-serial.
		"-chardev", "socket,id=console,path=" + sock(sockets.console),
		"-serial", "chardev:console",
		"-device", "virtio-serial-pci,id=vser",
	}
	for _, p := range []struct{ id, sock, name string }{
		{"ctl", sockets.ctl, portCtl},
		{"out", sockets.stdout, portStdout},
		{"err", sockets.stderr, portStderr},
	} {
		args = append(args,
			"-chardev", "socket,id="+p.id+",path="+sock(p.sock),
			"-device", "virtserialport,bus=vser.0,chardev="+p.id+",name="+p.name)
	}
	for _, fs := range []struct {
		tag, path string
		readonly  bool
	}{
		{tagRoot, "/", true},
		{tagTmp, m.hostTmp, false},
		{tagRun, m.runDir, false},
	} {
		// multidevs=remap keeps inode numbers unique across the host file
		// systems that one export spans.
		opt := "local,id=" + fs.tag + ",path=" + qemuEscape(fs.path) + ",security_model=none,multidevs=remap"
		if fs.readonly {
			opt += ",readonly=on"
		}
		args = append(args,
			"-fsdev", opt,
			"-device", "virtio-9p-pci,fsdev="+fs.tag+",mount_tag="+fs.tag)
	}
	return args
}

// qemuEscape escapes a value inside a QEMU option list, where a comma
// separates options unless doubled.
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }
