//go:build linux

package lab

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// cpioEntry is one entry of a newc archive as read back by readCPIO.
type cpioEntry struct {
	name                 string
	mode                 uint32
	rdevMajor, rdevMinor uint32
	data                 string
}

// readCPIO parses a newc archive, checking its framing, up to the trailer.
func readCPIO(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var entries []cpioEntry
	off := 0
	for {
		if len(b)-off < 110 {
			t.Fatalf("truncated header at %d", off)
		}
		hdr := string(b[off : off+110])
		if hdr[:6] != "070701" {
			t.Fatalf("bad magic %q at %d", hdr[:6], off)
		}
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(hdr[6+8*i:14+8*i], 16, 32)
			if err != nil {
				t.Fatalf("header field %d at %d: %v", i, off, err)
			}
			return uint32(v)
		}
		mode, size, rmaj, rmin, namesize := field(1), field(6), field(9), field(10), field(11)
		nameStart := off + 110
		name := string(b[nameStart : nameStart+int(namesize)])
		if !strings.HasSuffix(name, "\x00") {
			t.Fatalf("name %q not NUL-terminated", name)
		}
		name = strings.TrimSuffix(name, "\x00")
		dataStart := (nameStart + int(namesize) + 3) &^ 3
		data := string(b[dataStart : dataStart+int(size)])
		off = (dataStart + int(size) + 3) &^ 3
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Errorf("%d bytes after the trailer", len(b)-off)
			}
			return entries
		}
		entries = append(entries, cpioEntry{name, mode, rmaj, rmin, data})
	}
}

func writeTestArchive(t *testing.T) []byte {
	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	w.Dir("bin", 0o755)
	w.File("bin/hello", 0o755, []byte("#!/bin/sh\necho hi\n")) // 18 bytes: needs padding
	w.Symlink("bin/sh", "busybox")
	w.Dir("dev", 0o755)
	w.CharDev("dev/console", 0o600, 5, 1)
	w.File("empty", 0o644, nil)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestCPIOWriter(t *testing.T) {
	b := writeTestArchive(t)
	if len(b)%4 != 0 {
		t.Errorf("archive length %d is not a multiple of 4", len(b))
	}
	got := readCPIO(t, b)
	want := []cpioEntry{
		{"bin", syscall.S_IFDIR | 0o755, 0, 0, ""},
		{"bin/hello", syscall.S_IFREG | 0o755, 0, 0, "#!/bin/sh\necho hi\n"},
		{"bin/sh", syscall.S_IFLNK | 0o777, 0, 0, "busybox"},
		{"dev", syscall.S_IFDIR | 0o755, 0, 0, ""},
		{"dev/console", syscall.S_IFCHR | 0o600, 5, 1, ""},
		{"empty", syscall.S_IFREG | 0o644, 0, 0, ""},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, want)
	}
	if !bytes.Equal(b, writeTestArchive(t)) {
		t.Error("the same entries gave different archives")
	}
}

// TestCPIOWithHostCpio extracts the archive with GNU cpio, where installed.
func TestCPIOWithHostCpio(t *testing.T) {
	cpio, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("no cpio on this host (Debian package cpio)")
	}
	dir := t.TempDir()
	cmd := exec.Command(cpio, "-i", "--make-directories", "--no-absolute-filenames", "--quiet", "--nonmatching", "dev/*")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(writeTestArchive(t))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio -i: %v: %s", err, out)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "bin/hello")); err != nil || string(data) != "#!/bin/sh\necho hi\n" {
		t.Errorf("bin/hello: %q, %v", data, err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || target != "busybox" {
		t.Errorf("bin/sh: link to %q, %v", target, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "empty")); err != nil || fi.Size() != 0 {
		t.Errorf("empty: %v, %v", fi, err)
	}
	list, err := exec.Command(cpio, "-t", "--quiet", "-F", writeTestArchiveFile(t)).Output()
	if err != nil {
		t.Fatalf("cpio -t: %v", err)
	}
	if got, want := strings.Fields(string(list)), []string{"bin", "bin/hello", "bin/sh", "dev", "dev/console", "empty"}; !reflect.DeepEqual(got, want) {
		t.Errorf("cpio -t lists %q, want %q", got, want)
	}
}

func writeTestArchiveFile(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "test.cpio")
	if err := os.WriteFile(p, writeTestArchive(t), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
