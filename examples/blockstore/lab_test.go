//go:build linux

package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/examples/blockstore/nbd"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// The lab's tests of blockstore: the server on host B's RDMA address,
// clients on host A's, every connection RDMA only (-policy rdma), so that
// a test cannot pass over TCP.

// TestLabGoClientOverRDMA: the Go client writes a whole export over RDMA,
// 4 KiB blocks in random order at queue depth 32 and 1 MiB blocks in order
// at queue depth 4, flushes, reads it back the same way, and what it reads
// hashes as what it wrote. 16 MiB: under the race detector each case took
// over a minute with 32 under load.
func TestLabGoClientOverRDMA(t *testing.T) {
	env := labenv.RequireRDMA(t)
	const size = 16 << 20
	addr := startServe(t, "-mem", "16M", "-policy", "rdma", "-addr", netip.AddrPortFrom(env.AddrB, 0).String())
	for _, c := range []struct {
		block, depth int
		random       bool
	}{{4 << 10, 32, true}, {1 << 20, 4, false}} {
		t.Run(fmt.Sprintf("bs%dk_qd%d", c.block>>10, c.depth), func(t *testing.T) {
			d := rdmanet.Dialer{Policy: fallback.RDMAOnly, LocalAddr: &net.TCPAddr{IP: env.AddrA.AsSlice()}}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			nc, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			if tr, why := rdmanet.TransportOf(nc); tr != fallback.RDMA {
				t.Fatalf("the client's connection is %v (%v), not RDMA", tr, why)
			}
			cl, err := nbd.NewClient(ctx, nc, nbd.ClientOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if cl.Size() != size {
				t.Fatalf("export of %d bytes, want %d", cl.Size(), size)
			}
			blocks := make([]int, size/c.block)
			for i := range blocks {
				blocks[i] = i
			}
			if c.random {
				mathrand.Shuffle(len(blocks), func(i, j int) { blocks[i], blocks[j] = blocks[j], blocks[i] })
			}
			src := make([]byte, size)
			rand.Read(src)
			part := func(i int) []byte { return src[i*c.block : (i+1)*c.block] }
			if err := inParallel(c.depth, blocks, func(i int) error { return cl.Write(part(i), int64(i*c.block), 0) }); err != nil {
				t.Fatalf("write: %v", err)
			}
			if err := cl.Flush(); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if err := inParallel(c.depth, blocks, func(i int) error {
				return cl.Read(got[i*c.block:(i+1)*c.block], int64(i*c.block))
			}); err != nil {
				t.Fatalf("read: %v", err)
			}
			if sha256.Sum256(got) != sha256.Sum256(src) {
				t.Fatal("what was read back over RDMA differs from what was written")
			}
		})
	}
}

// inParallel calls f for each of items from depth goroutines at once and
// returns the first error; the others stop taking items after it.
func inParallel(depth int, items []int, f func(int) error) error {
	var (
		mu       sync.Mutex
		next     int
		firstErr error
		wg       sync.WaitGroup
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr != nil || next == len(items) {
			return 0, false
		}
		next++
		return items[next-1], true
	}
	for range depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, ok := take(); ok; i, ok = take() {
				if err := f(i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// TestLabKernelBlockDevice: the kernel's nbd driver, set up by nbd-client,
// on a unix socket of `blockstore bridge`, which relays to the server over
// RDMA. On that /dev/nbdN, unchanged tools: fio writes and verifies
// (CRC32C) 4 KiB random and 128 KiB sequential writes through the page
// cache's back (O_DIRECT); then mkfs.ext4, mount, a tree of files copied
// in, unmount, mount again, every file read back equal, unmount, and
// fsck finds the file system clean.
func TestLabKernelBlockDevice(t *testing.T) {
	env := labenv.RequireRDMA(t)
	nbdClient := requireTool(t, "nbd-client", "nbd-client")
	fio := requireTool(t, "fio", "fio")
	mkfs := requireTool(t, "mkfs.ext4", "e2fsprogs")
	fsck := requireTool(t, "e2fsck", "e2fsprogs")
	mount := requireTool(t, "mount", "mount")
	umount := requireTool(t, "umount", "mount")
	cp := requireTool(t, "cp", "coreutils")

	const size = 256 << 20
	addr := startServe(t, "-mem", "256M", "-policy", "rdma", "-addr", netip.AddrPortFrom(env.AddrB, 0).String())
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	_, bridgeLog := startBridge(t, "-listen", "unix:"+sock, "-to", addr, "-policy", "rdma", "-local", env.AddrA.String())
	dev := connectNBD(t, nbdClient, sock)
	if got := deviceSize(t, dev); got != size {
		t.Fatalf("%s has %d bytes, want the export's %d", dev, got, size)
	}
	if !strings.Contains(bridgeLog.String(), "transport=rdma") {
		t.Fatalf("the bridge did not relay over RDMA:\n%s", bridgeLog)
	}

	// fio, verifying what it wrote: random 4 KiB writes at queue depth 16,
	// and sequential 128 KiB writes at queue depth 4 further on. 16 MiB
	// each: this checks what arrives, not how fast (BENCHMARKS.md does),
	// and under the race detector on a loaded host 64 MiB at 128 KiB went
	// past runTool's bound.
	for _, job := range [][]string{
		{"--name=rand4k", "--rw=randwrite", "--bs=4k", "--iodepth=16", "--offset=0", "--size=16m"},
		{"--name=seq128k", "--rw=write", "--bs=128k", "--iodepth=4", "--offset=64m", "--size=16m"},
	} {
		out := runTool(t, fio, append(job, "--filename="+dev, "--ioengine=libaio", "--direct=1",
			"--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--output-format=json")...)
		checkFio(t, out, job[0])
	}

	// A file system on the device.
	runTool(t, mkfs, "-q", "-F", dev)
	mnt := t.TempDir()
	runTool(t, mount, "-t", "ext4", dev, mnt)
	mounted := true
	t.Cleanup(func() {
		if mounted {
			exec.Command(umount, "-l", mnt).Run()
		}
	})
	src := t.TempDir()
	files := writeTree(t, src)
	runTool(t, cp, "-a", src+"/.", mnt)
	runTool(t, umount, mnt) // writes back everything
	// Mounted again, the files come from the device, not the page cache
	// of the first mount.
	runTool(t, mount, "-t", "ext4", dev, mnt)
	for rel, want := range files {
		b, err := os.ReadFile(filepath.Join(mnt, rel))
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(b) != want {
			t.Fatalf("%s read back from the file system differs from what was copied", rel)
		}
	}
	runTool(t, umount, mnt)
	mounted = false
	if out, err := exec.Command(fsck, "-f", "-n", dev).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck -f -n %s: %v\n%s", dev, err, out)
	}
	t.Logf("%s, through the bridge over RDMA: fio verified, ext4 made, %d files copied and read back, fsck clean", dev, len(files))
}

// connectNBD connects a free /dev/nbdN to the NBD server at the unix
// socket with nbd-client, and disconnects it when the test ends.
func connectNBD(t *testing.T, nbdClient, sock string) string {
	t.Helper()
	dev := freeNBD(t)
	runTool(t, nbdClient, "-unix", sock, dev, "-block-size", "4096", "-timeout", "60")
	t.Cleanup(func() {
		if t.Failed() {
			logKernel(t, filepath.Base(dev))
		}
		if out, err := exec.Command(nbdClient, "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("nbd-client -d %s: %v\n%s", dev, err, out)
		}
	})
	return dev
}

// logKernel logs the kernel's messages about name (nbd's say why a
// device failed its requests: a timeout, a dead connection).
func logKernel(t *testing.T, name string) {
	out, err := exec.Command("dmesg").CombinedOutput()
	if err != nil {
		t.Logf("dmesg: %v\n%s", err, out)
		return
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, name) {
			lines = append(lines, l)
		}
	}
	t.Logf("the kernel on %s:\n%s", name, strings.Join(lines[max(len(lines)-30, 0):], "\n"))
}

// freeNBD returns the first nbd device not connected (the nbd module
// is loaded in the lab: internal/lab's guestModules).
func freeNBD(t *testing.T) string {
	t.Helper()
	for n := range 16 {
		name := "nbd" + strconv.Itoa(n)
		if _, err := os.Stat("/sys/block/" + name); err != nil {
			break
		}
		if _, err := os.Stat("/sys/block/" + name + "/pid"); os.IsNotExist(err) {
			return "/dev/" + name
		}
	}
	t.Fatal("no free /dev/nbdN (is the nbd module loaded?)")
	return ""
}

// deviceSize is a block device's size in bytes, from sysfs.
func deviceSize(t *testing.T, dev string) int64 {
	t.Helper()
	b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/size")
	if err != nil {
		t.Fatal(err)
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return sectors * 512
}

// checkFio fails the test unless fio's JSON report has the job, with no
// error and something written and verified (read back).
func checkFio(t *testing.T, out, name string) {
	t.Helper()
	var rep struct {
		Jobs []struct {
			Name  string `json:"jobname"`
			Error int    `json:"error"`
			Write struct {
				Bytes int64 `json:"io_bytes"`
			} `json:"write"`
			Read struct {
				Bytes int64 `json:"io_bytes"`
			} `json:"read"`
		} `json:"jobs"`
	}
	// fio may print notes before the JSON.
	if i := strings.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("fio's report: %v\n%s", err, out)
	}
	for _, j := range rep.Jobs {
		if "--name="+j.Name == name {
			if j.Error != 0 || j.Write.Bytes == 0 || j.Read.Bytes != j.Write.Bytes {
				t.Fatalf("fio %s: error %d, wrote %d bytes, verified %d", j.Name, j.Error, j.Write.Bytes, j.Read.Bytes)
			}
			return
		}
	}
	t.Fatalf("fio's report has no job %s:\n%s", name, out)
}

// writeTree writes a tree of files of random sizes (empty to 256 KiB,
// about 14 MiB in all) under dir and returns their SHA-256s by relative
// path. With files up to 1 MiB (55 MiB), the umount that writes them back
// took 94 s of runTool's 2-minute guard under -race on a loaded host.
func writeTree(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	files := make(map[string][32]byte)
	for i := range 120 {
		rel := filepath.Join(fmt.Sprintf("d%d", i%6), fmt.Sprintf("e%d", i%4), fmt.Sprintf("f%03d", i))
		n := mathrand.IntN(256 << 10)
		if i%10 == 0 {
			n = 0
		}
		b := make([]byte, n)
		rand.Read(b)
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		files[rel] = sha256.Sum256(b)
	}
	return files
}
