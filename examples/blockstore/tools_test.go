package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/examples/blockstore/nbd"
	"github.com/rdmanet/sdk/internal/labenv"
)

// requireTool returns the path of a command-line tool from a Debian
// package, skipping the test if it is not installed, unless it runs in the
// lab or RDMANET_REQUIRE_TOOLS is set (as where the project's Debian
// packages are installed), which makes that a failure.
func requireTool(t *testing.T, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		// Found is not enough: Debian's fio links libibverbs, which
		// scripts/no-rdma-core-test hides, and then fio cannot start.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, verr := exec.CommandContext(ctx, path, cmp.Or(versionFlag[name], "--version")).CombinedOutput()
		if verr == nil {
			return path
		}
		err = fmt.Errorf("%s %s: %v: %s", path, cmp.Or(versionFlag[name], "--version"), verr, bytes.TrimSpace(out))
	}
	if os.Getenv("RDMANET_REQUIRE_TOOLS") != "" || labenv.InLab() {
		t.Fatalf("%s cannot run (Debian package %s): %v", name, pkg, err)
	}
	t.Skipf("%s cannot run (Debian package %s; set RDMANET_REQUIRE_TOOLS to make this a failure): %v", name, pkg, err)
	return ""
}

// versionFlag is how the tools that take no --version ask for their
// version.
var versionFlag = map[string]string{"mkfs.ext4": "-V", "e2fsck": "-V"}

// runTool runs a tool with a time limit and returns its standard output;
// it fails the test if the tool fails. The limit guards against a hang:
// what the tests ask of a tool takes far less, even under the race
// detector on a loaded host. It runs in a directory of the test's, where
// what a tool leaves (fio's verify state) goes away with it.
func runTool(t *testing.T, path string, args ...string) string {
	t.Helper()
	const limit = 2 * time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = t.TempDir()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("%s %q after %v: %v\nstdout:\n%s\nstderr:\n%s", filepath.Base(path), args, took.Round(time.Millisecond), err, out, stderr.String())
	}
	if took > limit/4 {
		// Near enough the guard to say: a run that comes closer on a
		// loaded host shows here first.
		t.Logf("%s %q took %v of its %v", filepath.Base(path), args, took.Round(time.Millisecond), limit)
	}
	return string(out)
}

func uri(addr string) string { return "nbd://" + addr }

// imageFile writes an image of size bytes: random, but for a zeroed
// stretch in the middle that clients may send as WRITE_ZEROES or TRIM
// rather than data. It returns its path and SHA-256.
func imageFile(t *testing.T, size int) (string, [32]byte) {
	t.Helper()
	b := make([]byte, size)
	rand.Read(b)
	clear(b[size/4 : size/2])
	path := filepath.Join(t.TempDir(), "image.raw")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, sha256.Sum256(b)
}

func fileHash(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// backends are the two kinds of export the tool tests run against: the
// serve flags and, for a file, its path (whose contents are checked too).
func backends(t *testing.T, size string) map[string][]string {
	return map[string][]string{
		"memory": {"-mem", size},
		"file":   {"-file", filepath.Join(t.TempDir(), "export"), "-size", size},
	}
}

// TestNbdinfo: libnbd's nbdinfo sees the export's size and what it offers,
// by the default name and another.
func TestNbdinfo(t *testing.T) {
	nbdinfo := requireTool(t, "nbdinfo", "libnbd-bin")
	addr := startServe(t, "-mem", "64M")
	if out := runTool(t, nbdinfo, "--size", uri(addr)); out != "67108864\n" {
		t.Errorf("nbdinfo --size: %q, want 67108864", out)
	}
	out := runTool(t, nbdinfo, uri(addr))
	for _, want := range []string{"export-size: 67108864", "can_flush: true", "can_fua: true", "can_trim: true",
		"can_zero: true", "can_multi_conn: true", "is_read_only: false", "block_size_maximum: 33554432", "description: blockstore: memory"} {
		if !strings.Contains(out, want) {
			t.Errorf("nbdinfo does not say %q:\n%s", want, out)
		}
	}
	named := startServe(t, "-mem", "1M", "-name", "disk")
	if out := runTool(t, nbdinfo, "--size", uri(named)+"/disk"); out != "1048576\n" {
		t.Errorf("nbdinfo --size of export disk: %q", out)
	}
	if out := runTool(t, nbdinfo, "--list", uri(named)); !strings.Contains(out, `export="disk"`) {
		t.Errorf("nbdinfo --list:\n%s", out)
	}
}

// TestNbdcopy: nbdcopy copies an image onto the export and back (over
// several connections, as the server allows multi-conn), and the copy
// hashes as the image.
func TestNbdcopy(t *testing.T) {
	nbdcopy := requireTool(t, "nbdcopy", "libnbd-bin")
	const size = 32 << 20
	for name, args := range backends(t, "32M") {
		t.Run(name, func(t *testing.T) {
			src, sum := imageFile(t, size)
			addr := startServe(t, args...)
			runTool(t, nbdcopy, "--flush", src, uri(addr))
			back := filepath.Join(t.TempDir(), "back.raw")
			runTool(t, nbdcopy, uri(addr), back)
			if fileHash(t, back) != sum {
				t.Fatal("the image copied onto the export and back differs")
			}
			if name == "file" && fileHash(t, args[1]) != sum {
				t.Fatal("the export's file differs from the image")
			}
		})
	}
}

// TestQemuImg: qemu-img converts an image (qcow2, with a sparse stretch)
// onto the export and back to raw, and the result hashes as the raw image.
func TestQemuImg(t *testing.T) {
	qemuImg := requireTool(t, "qemu-img", "qemu-utils")
	const size = 32 << 20
	for name, args := range backends(t, "32M") {
		t.Run(name, func(t *testing.T) {
			raw, sum := imageFile(t, size)
			qcow2 := filepath.Join(t.TempDir(), "image.qcow2")
			runTool(t, qemuImg, "convert", "-f", "raw", "-O", "qcow2", raw, qcow2)
			addr := startServe(t, args...)
			runTool(t, qemuImg, "convert", "-n", "-f", "qcow2", "-O", "raw", qcow2, uri(addr))
			back := filepath.Join(t.TempDir(), "back.raw")
			runTool(t, qemuImg, "convert", "-f", "raw", "-O", "raw", uri(addr), back)
			if fileHash(t, back) != sum {
				t.Fatal("the image converted onto the export and back differs")
			}
			if name == "file" && fileHash(t, args[1]) != sum {
				t.Fatal("the export's file differs from the image")
			}
		})
	}
}

// TestFio: fio's nbd engine writes at random with a CRC32C in each block,
// two jobs (two connections) on halves of the export at queue depth 16,
// then reads every block back and verifies it.
func TestFio(t *testing.T) {
	fio := requireTool(t, "fio", "fio")
	const half = 8 << 20
	for name, args := range backends(t, "16M") {
		t.Run(name, func(t *testing.T) {
			addr := startServe(t, args...)
			out := runTool(t, fio, "--name=verify", "--ioengine=nbd", "--uri="+uri(addr),
				"--rw=randwrite", "--bs=4k", "--iodepth=16", "--numjobs=2",
				"--size="+strconv.Itoa(half), "--offset_increment="+strconv.Itoa(half),
				"--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--verify_state_save=0", "--output-format=json")
			// fio may print lines before its JSON.
			var report struct {
				Jobs []struct {
					Error       int `json:"error"`
					Read, Write struct {
						IOBytes int64 `json:"io_bytes"`
					}
				} `json:"jobs"`
			}
			if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &report); err != nil {
				t.Fatalf("fio's report: %v\n%s", err, out)
			}
			if len(report.Jobs) != 2 {
				t.Fatalf("fio reported %d jobs, want 2:\n%s", len(report.Jobs), out)
			}
			for i, j := range report.Jobs {
				if j.Error != 0 || j.Write.IOBytes != half || j.Read.IOBytes != half {
					t.Errorf("fio job %d: error %d, wrote %d and verified %d bytes, want %d", i, j.Error, j.Write.IOBytes, j.Read.IOBytes, half)
				}
			}
		})
	}
}

// TestClientAgainstQemuNbd: the Go client, at queue depth 32, against
// another server, qemu-nbd: what it writes and flushes is in qemu-nbd's
// file, and reads back the same.
func TestClientAgainstQemuNbd(t *testing.T) {
	qemuNbd := requireTool(t, "qemu-nbd", "qemu-utils")
	const size, block = 8 << 20, 16 << 10
	path := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	ln.Close()
	cmd := exec.Command(qemuNbd, "-f", "raw", "-b", "127.0.0.1", "-p", port, "--persistent", "--shared=4", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	var nc net.Conn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if nc, err = net.Dial("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("qemu-nbd did not start on %s: %v\n%s", addr, err, stderr.String())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := nbd.NewClient(ctx, nc, nbd.ClientOptions{})
	if err != nil {
		t.Fatalf("handshake with qemu-nbd: %v\n%s", err, stderr.String())
	}
	defer c.Close()
	if c.Size() != size {
		t.Fatalf("size %d, want %d", c.Size(), size)
	}
	src := make([]byte, size)
	rand.Read(src)
	errs := make(chan error, 32)
	for w := range 32 {
		go func() {
			var err error
			for i := w; i < size/block && err == nil; i += 32 {
				err = c.Write(src[i*block:(i+1)*block], int64(i*block), 0)
			}
			errs <- err
		}()
	}
	for range 32 {
		if err := <-errs; err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if fileHash(t, path) != sha256.Sum256(src) {
		t.Fatal("qemu-nbd's file differs from what was written and flushed")
	}
	got := make([]byte, size)
	for w := range 32 {
		go func() {
			var err error
			for i := w; i < size/block && err == nil; i += 32 {
				err = c.Read(got[i*block:(i+1)*block], int64(i*block))
			}
			errs <- err
		}()
	}
	for range 32 {
		if err := <-errs; err != nil {
			t.Fatalf("read: %v", err)
		}
	}
	if !bytes.Equal(got, src) {
		t.Fatal("what was read back differs")
	}
	if err := c.Read(make([]byte, 512), size); err == nil {
		t.Error("a read past qemu-nbd's end: no error")
	}
}
