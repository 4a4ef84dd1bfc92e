package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The storage section's anchor (issue 26): the kernel's own NVMe-oF on the
// same rxe pair, which is what a storage user would run instead of an NBD
// server on rdmanet. The target (nvmet, with nvmet-rdma and nvmet-tcp)
// exports a brd ramdisk of the blockstore export's size on B; the kernel's
// initiator (nvme-rdma, nvme-tcp) connects to it from A with nvme-cli, and
// fio runs on the namespace's block device with the same jobs as on
// /dev/nbd0.

// The anchor's columns.
var (
	nvmeRDMA = storageClient{"nvmeof-rdma", "kernel NVMe-oF, RDMA", "rdma"}
	nvmeTCP  = storageClient{"nvmeof-tcp", "kernel NVMe/TCP", "tcp"}
)

const (
	anchorNQN     = "nqn.2026-11.net.rdmanet:labbench-anchor"
	anchorHostNQN = "nqn.2014-08.org.nvmexpress:uuid:7a6c1d8e-2b51-4c3e-9f3a-0d1e5c7b9a41"
	anchorHostID  = "7a6c1d8e-2b51-4c3e-9f3a-0d1e5c7b9a41"
	anchorPort    = 4420 // NVMe-oF's
	nvmetConfig   = "/sys/kernel/config/nvmet"
)

// anchorModules are the kernel modules the anchor needs; Debian's kernel
// ships them all.
var anchorModules = []string{"nvmet", "nvmet-rdma", "nvmet-tcp", "nvme-rdma", "nvme-tcp"}

// anchorTarget is the kernel target while it is set up: what to undo.
type anchorTarget struct {
	ramdisk string   // the brd device it exports
	undo    []string // configfs paths to remove, last made first
}

// startAnchorTarget loads the modules, makes a brd ramdisk of the export's
// size, writes it once (as blockstore's export is written before the first
// figure: brd reads pages never written as zeros without touching memory)
// and exports it on B over RDMA and TCP.
func (b *bench) startAnchorTarget(ctx context.Context) (*anchorTarget, error) {
	if _, err := exec.LookPath("nvme"); err != nil {
		return nil, fmt.Errorf("nvme-cli cannot be run: %w", err)
	}
	args := append([]string{"-a"}, anchorModules...)
	if out, err := exec.CommandContext(ctx, "modprobe", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("modprobe %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	ramdisk, err := newRamdisk(ctx, storageExportSize)
	if err != nil {
		return nil, err
	}
	fill := exec.CommandContext(ctx, "dd", "if=/dev/zero", "of="+ramdisk, "bs=1M", "count="+strconv.Itoa(storageExportSize>>20), "oflag=direct")
	if out, err := fill.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("filling %s: %v: %s", ramdisk, err, strings.TrimSpace(string(out)))
	}
	if err := mountConfigfs(); err != nil {
		return nil, err
	}
	t := &anchorTarget{ramdisk: ramdisk}
	sub := filepath.Join(nvmetConfig, "subsystems", anchorNQN)
	ns := filepath.Join(sub, "namespaces", "1")
	steps := []struct {
		mkdir, file, value string
	}{
		{mkdir: sub},
		{file: filepath.Join(sub, "attr_allow_any_host"), value: "1"},
		{mkdir: ns},
		{file: filepath.Join(ns, "device_path"), value: ramdisk},
		{file: filepath.Join(ns, "enable"), value: "1"},
	}
	for _, s := range steps {
		if err := t.step(s.mkdir, s.file, s.value); err != nil {
			t.stop()
			return nil, err
		}
	}
	for i, transport := range []string{"rdma", "tcp"} {
		port := filepath.Join(nvmetConfig, "ports", strconv.Itoa(i+1))
		if err := t.step(port, "", ""); err != nil {
			t.stop()
			return nil, err
		}
		for _, kv := range [][2]string{{"addr_trtype", transport}, {"addr_adrfam", "ipv4"},
			{"addr_traddr", b.env.AddrB.String()}, {"addr_trsvcid", strconv.Itoa(anchorPort)}} {
			if err := t.step("", filepath.Join(port, kv[0]), kv[1]); err != nil {
				t.stop()
				return nil, err
			}
		}
		link := filepath.Join(port, "subsystems", anchorNQN)
		if err := os.Symlink(sub, link); err != nil {
			t.stop()
			return nil, fmt.Errorf("exporting on %s: %w", transport, err)
		}
		t.undo = append(t.undo, link)
	}
	return t, nil
}

// step makes a configfs directory (undone by stop) or writes a value.
func (t *anchorTarget) step(dir, file, value string) error {
	if dir != "" {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("nvmet: %w", err)
		}
		t.undo = append(t.undo, dir)
		return nil
	}
	if err := os.WriteFile(file, []byte(value), 0o644); err != nil {
		return fmt.Errorf("nvmet: %s = %q: %w", file, value, err)
	}
	return nil
}

// stop removes the export (a namespace is disabled before its directory
// goes); the modules and the ramdisk stay, for the VM's life.
func (t *anchorTarget) stop() error {
	var errs []error
	for _, p := range slices.Backward(t.undo) {
		if strings.HasSuffix(filepath.Dir(p), "namespaces") {
			os.WriteFile(filepath.Join(p, "enable"), []byte("0"), 0o644)
		}
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
		}
	}
	t.undo = nil
	return errors.Join(errs...)
}

// newRamdisk loads brd with one ramdisk of size bytes and returns it. A
// brd loaded before with another size is unloaded first (nothing else in
// the lab uses it).
func newRamdisk(ctx context.Context, size int64) (string, error) {
	const dev = "/dev/ram0"
	if got, err := blockSize("ram0"); err == nil && got == size {
		return dev, nil
	} else if err == nil {
		if out, err := exec.CommandContext(ctx, "rmmod", "brd").CombinedOutput(); err != nil {
			return "", fmt.Errorf("brd has a %d-byte ram0 and does not unload: %v: %s", got, err, strings.TrimSpace(string(out)))
		}
	}
	out, err := exec.CommandContext(ctx, "modprobe", "brd", "rd_nr=1", "rd_size="+strconv.FormatInt(size>>10, 10)).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("modprobe brd: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if got, err := blockSize("ram0"); err != nil || got != size {
		return "", fmt.Errorf("brd's ram0 is %d bytes (%v), want %d", got, err, size)
	}
	return dev, nil
}

// blockSize is a block device's size in bytes, from sysfs.
func blockSize(name string) (int64, error) {
	b, err := os.ReadFile("/sys/block/" + name + "/size")
	if err != nil {
		return 0, err
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return sectors * 512, err
}

// mountConfigfs mounts configfs where nvmet expects it, unless it is.
func mountConfigfs() error {
	if _, err := os.Stat(nvmetConfig); err == nil {
		return nil
	}
	if out, err := exec.Command("mount", "-t", "configfs", "none", "/sys/kernel/config").CombinedOutput(); err != nil {
		return fmt.Errorf("mounting configfs: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if _, err := os.Stat(nvmetConfig); err != nil {
		return fmt.Errorf("nvmet's configfs: %w", err)
	}
	return nil
}

// nvmeNamespace matches a namespace's block device (nvme0n1), not its
// paths (nvme0c0n1) or partitions.
var nvmeNamespace = regexp.MustCompile(`^nvme[0-9]+n[0-9]+$`)

// nvmeNamespaces lists the NVMe namespaces' block devices.
func nvmeNamespaces() map[string]bool {
	ns := map[string]bool{}
	entries, _ := os.ReadDir("/sys/block")
	for _, e := range entries {
		if nvmeNamespace.MatchString(e.Name()) {
			ns[e.Name()] = true
		}
	}
	return ns
}

// connectAnchor connects the kernel's initiator from A to the anchor over
// c's transport with nvme-cli and returns the namespace's block device and
// how to disconnect.
func (b *bench) connectAnchor(ctx context.Context, c storageClient) (dev string, disconnect func(), err error) {
	before := nvmeNamespaces()
	args := []string{"nvme", "connect", "-t", c.transport, "-a", b.env.AddrB.String(), "-s", strconv.Itoa(anchorPort),
		"-w", b.env.AddrA.String(), "-n", anchorNQN, "--hostnqn=" + anchorHostNQN, "--hostid=" + anchorHostID}
	if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	disconnect = func() { exec.Command("nvme", "disconnect", "-n", anchorNQN).Run() }
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for name := range nvmeNamespaces() {
			if !before[name] {
				if got, err := blockSize(name); err != nil || got != storageExportSize {
					disconnect()
					return "", nil, fmt.Errorf("%s is %d bytes (%v), want the export's %d", name, got, err, storageExportSize)
				}
				return "/dev/" + name, disconnect, nil
			}
		}
	}
	disconnect()
	return "", nil, errors.New("nvme connect returned, and no namespace appeared in 10 s")
}
