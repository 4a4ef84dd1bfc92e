//go:build linux

package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
)

func TestVersionLess(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"vmlinuz-6.1.0-9-amd64", "vmlinuz-6.1.0-56-amd64", true},
		{"vmlinuz-6.1.0-56-amd64", "vmlinuz-6.1.0-9-amd64", false},
		{"vmlinuz-5.10.0-1-amd64", "vmlinuz-6.1.0-1-amd64", true},
		{"vmlinuz-6.1.0-1-amd64", "vmlinuz-6.1.0-1-amd64", false},
		{"vmlinuz-6.1", "vmlinuz-6.1.0", true},
		{"vmlinuz-6.01", "vmlinuz-6.1", false},
	} {
		if got := versionLess(tc.a, tc.b); got != tc.want {
			t.Errorf("versionLess(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestBzImageVersion(t *testing.T) {
	img := make([]byte, 0x400)
	copy(img[0x202:], "HdrS")
	img[0x20e] = 0x00 // the version string is at 0x100+0x200
	img[0x20f] = 0x01
	copy(img[0x300:], "6.1.0-99-test (builder@example) #1 SMP\x00")
	p := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(p, img, 0o644); err != nil {
		t.Fatal(err)
	}
	if v, err := bzImageVersion(p); err != nil || v != "6.1.0-99-test" {
		t.Errorf("bzImageVersion = %q, %v; want 6.1.0-99-test", v, err)
	}

	copy(img[0x202:], "nope")
	if err := os.WriteFile(p, img, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := bzImageVersion(p); err == nil {
		t.Error("bzImageVersion accepted a file without the HdrS magic")
	}
}

// TestHostKernel reads the version of the host's installed kernels, whose
// file names carry it too.
func TestHostKernel(t *testing.T) {
	imgs, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(imgs) == 0 {
		t.Skip("no /boot/vmlinuz-* (Debian package linux-image-amd64)")
	}
	for _, img := range imgs {
		v, err := bzImageVersion(img)
		if err != nil {
			t.Errorf("%s: %v", img, err)
		} else if want := strings.TrimPrefix(filepath.Base(img), "vmlinuz-"); v != want {
			t.Errorf("%s: version %q, want %q", img, v, want)
		}
	}
}

func TestParseShowDepends(t *testing.T) {
	out := []byte(`insmod /lib/modules/6.1/kernel/drivers/virtio/virtio_ring.ko 
insmod /lib/modules/6.1/kernel/drivers/virtio/virtio.ko 
builtin crc32c
insmod /lib/modules/6.1/kernel/drivers/virtio/virtio_ring.ko 
insmod /lib/modules/6.1/kernel/fs/9p/9p.ko opt=1
`)
	got := parseShowDepends(out)
	want := []string{
		"/lib/modules/6.1/kernel/drivers/virtio/virtio_ring.ko",
		"/lib/modules/6.1/kernel/drivers/virtio/virtio.ko",
		"/lib/modules/6.1/kernel/fs/9p/9p.ko",
	}
	if !slices.Equal(got, want) {
		t.Errorf("parseShowDepends = %q, want %q", got, want)
	}
}

// TestInitScript checks /init's shell syntax with the busybox it runs under.
func TestInitScript(t *testing.T) {
	script := initScript([]string{"virtio.ko", "9p.ko"})
	for _, want := range []string{"insmod /modules/virtio.ko", "insmod /modules/9p.ko", tagRoot, tagTmp, tagRun, guestRunDir, guestTmpDir} {
		if !strings.Contains(string(script), want) {
			t.Errorf("/init lacks %q", want)
		}
	}
	if _, err := os.Stat(busyboxPath); err != nil {
		t.Skip("no busybox to check the syntax with (Debian package busybox-static)")
	}
	cmd := exec.Command(busyboxPath, "sh", "-n")
	cmd.Stdin = strings.NewReader(string(script))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("busybox sh -n: %v: %s\n%s", err, out, script)
	}
}

func TestGuestEnviron(t *testing.T) {
	host := []string{"HOME=/root", "TMPDIR=/var/tmp", "RDMANET_LAB_ADDR_A=10.0.0.1", "PATH=/usr/bin"}
	env := guestEnviron(host)
	count := map[string]int{}
	values := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		count[k]++
		values[k] = v
	}
	for k, n := range count {
		if n != 1 {
			t.Errorf("%s appears %d times", k, n)
		}
	}
	for k, want := range map[string]string{
		"HOME":               "/root",
		"PATH":               "/usr/bin",
		"TMPDIR":             guestTmpDir,
		labenv.VarLab:        "1",
		"RDMANET_LAB_ADDR_A": labenv.Default.AddrA.String(),
	} {
		if values[k] != want {
			t.Errorf("%s=%q, want %q", k, values[k], want)
		}
	}
}

func TestMachineArgs(t *testing.T) {
	m := machine{
		qemu: "qemu-system-x86_64", kernel: "/k", initrd: "/i",
		memoryMiB: 2048, cpus: 2, hostTmp: "/tmp", runDir: "/tmp/run,1",
	}
	args := strings.Join(m.args(), " ")
	for _, want := range []string{
		"-nic none", "-no-reboot", "-accel tcg,thread=multi",
		"path=/,security_model=none,multidevs=remap,readonly=on",
		"mount_tag=" + tagTmp,
		"path=/tmp/run,,1/ctl.sock", // commas in paths are escaped
		"name=" + portCtl, "name=" + portStdout, "name=" + portStderr,
	} {
		if !strings.Contains(args, want) {
			t.Errorf("QEMU arguments lack %q:\n%s", want, args)
		}
	}
	for _, bad := range []string{"-netdev", "user,", "-enable-kvm"} {
		if strings.Contains(args, bad) {
			t.Errorf("QEMU arguments contain %q", bad)
		}
	}
	if !strings.Contains(m.kernelCmdline(), "quiet") {
		t.Error("the kernel is not quiet by default")
	}
	m.verbose = true
	if strings.Contains(m.kernelCmdline(), "quiet") {
		t.Error("the kernel is quiet with -v")
	}
}

// TestTopology checks that every lab address is in the benchmarking range
// and that the lab's view of the hosts tests use is labenv's.
func TestTopology(t *testing.T) {
	bench := netip.MustParsePrefix("198.18.0.0/15")
	addrs := map[netip.Addr]bool{}
	for _, pair := range topology() {
		for _, e := range pair {
			if !bench.Contains(e.addr) {
				t.Errorf("%s: address %v outside %v", e.dev, e.addr, bench)
			}
			addrs[e.addr] = true
		}
	}
	d := labenv.Default
	for _, a := range []netip.Addr{d.AddrA, d.AddrB, d.AddrA2, d.AddrB2, d.AddrIA, d.AddrIB, d.NoRDMAHost, d.PlainHost} {
		if !addrs[a] {
			t.Errorf("labenv address %v is not in the lab's topology", a)
		}
	}
	// Every interface, rxe device and subnet once; a pair's ends share one
	// subnet; no two pairs share one (a shared subnet would make each
	// path's routes the other's).
	names := map[string]bool{}
	subnets := map[netip.Prefix]int{}
	ends := map[string]linkEnd{}
	for i, pair := range topology() {
		for _, e := range pair {
			for _, n := range []string{e.dev, e.rdma} {
				if n != "" && names[n] {
					t.Errorf("%s appears twice in the topology", n)
				}
				names[n] = true
			}
			ends[e.dev] = e
		}
		p := netip.PrefixFrom(pair[0].addr, prefixLen).Masked()
		if q := netip.PrefixFrom(pair[1].addr, prefixLen).Masked(); q != p {
			t.Errorf("pair %s-%s spans %v and %v", pair[0].dev, pair[1].dev, p, q)
		}
		if j, ok := subnets[p]; ok {
			t.Errorf("pairs %d and %d share %v", j, i, p)
		}
		subnets[p] = i
	}
	path2 := labenv.Pair{Provider: labenv.ProviderRXE, AddrA: d.AddrA2, AddrB: d.AddrB2, DevA: d.DevA2, DevB: d.DevB2, NetdevA: d.NetdevA2, NetdevB: d.NetdevB2}
	for _, pair := range append(d.Pairs(), path2) {
		for _, want := range []linkEnd{{dev: pair.NetdevA, addr: pair.AddrA, rdma: pair.DevA, provider: pair.Provider}, {dev: pair.NetdevB, addr: pair.AddrB, rdma: pair.DevB, provider: pair.Provider}} {
			if got := ends[want.dev]; got != want {
				t.Errorf("labenv's pair end %+v is %+v in the topology", want, got)
			}
		}
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{&TimeoutError{After: time.Minute}, ExitTimeout},
		{&SignalError{Signal: syscall.SIGINT}, 130},
		{&SignalError{Signal: syscall.SIGTERM}, 143},
		{&CommandError{Name: "x", Err: exec.ErrNotFound}, ExitNotFound},
		{&CommandError{Name: "x", Err: os.ErrPermission}, ExitNotExec},
		{&NoStatusError{}, ExitLabError},
		{&MissingError{What: "qemu", Package: "qemu-system-x86", Err: exec.ErrNotFound}, ExitLabError},
		{fmt.Errorf("wrapped: %w", &TimeoutError{}), ExitTimeout},
		{errors.New("other"), ExitLabError},
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestMissingToolNamesPackage(t *testing.T) {
	_, err := tool{"rdmanet-no-such-program", "some-package"}.find()
	var me *MissingError
	if !errors.As(err, &me) || !strings.Contains(err.Error(), "install the Debian package some-package") {
		t.Errorf("find of a missing program: %v, want a MissingError naming the package", err)
	}
}

// TestRunUnknownCommand checks that a command that does not exist fails
// before any VM boots, with a shell's exit status.
func TestRunUnknownCommand(t *testing.T) {
	_, err := Run(context.Background(), Config{Args: []string{"rdmanet-no-such-command"}})
	var ce *CommandError
	if !errors.As(err, &ce) || ExitCode(err) != ExitNotFound {
		t.Errorf("Run: %v (exit code %d), want a CommandError with exit code %d", err, ExitCode(err), ExitNotFound)
	}
	if _, err := Run(context.Background(), Config{}); err == nil {
		t.Error("Run without a command succeeded")
	}
}

// TestBootTimeout: a VM whose guest never starts the command (here a
// "QEMU" that sleeps) is killed after the boot timeout, with a BootError;
// it does not wait for the run's own limit.
func TestBootTimeout(t *testing.T) {
	dir := t.TempDir()
	qemu := filepath.Join(dir, "qemu")
	script := "#!/bin/sh\nexec sleep 60\n"
	if err := os.WriteFile(qemu, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	b := &boot{
		cfg:         Config{Stdout: io.Discard, Stderr: io.Discard},
		machine:     machine{qemu: qemu, kernel: "/k", initrd: "/i", memoryMiB: 64, cpus: 1, runDir: dir, hostTmp: dir},
		bootTimeout: 300 * time.Millisecond,
		started:     make(chan struct{}),
	}
	begin := time.Now()
	_, err := b.run(context.Background())
	var be *BootError
	if !errors.As(err, &be) || be.After != b.bootTimeout {
		t.Fatalf("run: %v, want a BootError after %v", err, b.bootTimeout)
	}
	if took := time.Since(begin); took > 20*time.Second {
		t.Errorf("run returned after %v", took)
	}
	t.Logf("%v", err)
}

func TestRPSMask(t *testing.T) {
	for _, c := range []struct {
		cpus int
		want string
	}{{0, "1"}, {1, "1"}, {2, "3"}, {4, "f"}, {12, "fff"}, {32, "ffffffff"}, {64, "ffffffff"}} {
		if got := rpsMask(c.cpus); got != c.want {
			t.Errorf("rpsMask(%d) = %q, want %q", c.cpus, got, c.want)
		}
	}
}
