//go:build linux

// Package lab implements rdmanet-lab: it boots the host's Debian kernel under
// QEMU/TCG with Soft-RoCE and runs a command inside, with the host's root file
// system as the guest's (read-only, over 9p).
//
// A run has three stages:
//
//  1. The host stage ([Run]) checks prerequisites, builds (or finds in its
//     cache) a tiny initramfs and an uncompressed kernel, writes a per-run
//     spec, starts QEMU, relays the command's output and waits for its exit
//     status.
//  2. The initramfs /init (busybox sh) loads the virtio and 9p modules, mounts
//     the host's root and the shares, and chroots into the host's root to run
//     the lab binary again in its hidden guest mode.
//  3. The guest stage ([Guest]) sets up the RDMA network, runs the command
//     with its output on virtio-serial ports, reports the exit status over the
//     control port and returns; /init then powers the VM off.
package lab

import "time"

// 9p mount tags, shared by the QEMU command line and /init.
const (
	tagRoot = "hostroot" // the host's /, read-only
	tagTmp  = "hosttmp"  // the host's temporary directory, writable, at the same path
	tagRun  = "labrun"   // the per-run directory, writable
)

// Paths inside the guest, shared by /init and the guest stage.
const (
	guestRunDir = "/run/rdmanet-lab" // where the per-run directory is mounted
	guestTmpDir = "/run/rdmanet-tmp" // TMPDIR for the command: tmpfs, so unix sockets work
)

// Files in the per-run directory, written by the host before boot.
const (
	specName   = "spec.json" // the command to run, see spec
	exeName    = "exe"       // host path of the lab binary, for /init
	tmpdirName = "tmpdir"    // host temporary directory, for /init to mount tagTmp on
)

// Names of the virtio-serial ports. The guest finds their device files by
// these names in /sys/class/virtio-ports.
const (
	portCtl    = "rdmanet.ctl"
	portStdout = "rdmanet.stdout"
	portStderr = "rdmanet.stderr"
)

// spec is what the host asks the guest stage to run, as JSON in specName.
type spec struct {
	Path    string   // executable, absolute (resolved on the host)
	Args    []string // argv, Args[0] included
	Env     []string // complete environment of the command
	Dir     string   // working directory
	Verbose bool     // log the set-up steps on stderr
	// SiwModule is the host path of the siw.ko built for the lab kernel
	// (siw.go), the same path in the guest, whose root is the host's.
	SiwModule string
}

// Control messages on portCtl, one per line. The guest sends msgStart just
// before it starts the command and "exit STATUS OUTBYTES ERRBYTES" after it;
// the host answers msgAck once it has received that much output, so that no
// output is still in flight inside QEMU when the guest powers off.
const (
	msgStart = "start"
	msgExit  = "exit"
	msgAck   = "ack"
)

// outputDrainTimeout bounds how long the host waits without progress for
// output the guest says it sent, and how long the guest waits for the
// command's pipes to close after the command exits (a daemon it left behind
// may hold them open).
const outputDrainTimeout = 10 * time.Second
