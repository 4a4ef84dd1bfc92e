//go:build linux

package lab

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"unicode"
)

// kernel is a bootable kernel image with its modules.
type kernel struct {
	image   string // bzImage path
	version string // uname -r of the image, names /lib/modules/<version>
}

// findKernel returns the kernel at path, or the newest /boot/vmlinuz-* if
// path is empty, after checking that its modules are installed.
func findKernel(path string) (kernel, error) {
	if path == "" {
		imgs, _ := filepath.Glob("/boot/vmlinuz-*")
		if len(imgs) == 0 {
			return kernel{}, &MissingError{What: "a kernel /boot/vmlinuz-*", Package: "linux-image-amd64", Err: os.ErrNotExist}
		}
		path = imgs[0]
		for _, p := range imgs[1:] {
			if versionLess(path, p) {
				path = p
			}
		}
	}
	v, err := bzImageVersion(path)
	if err != nil {
		return kernel{}, fmt.Errorf("kernel %s: %w", path, err)
	}
	if _, err := os.Stat(filepath.Join("/lib/modules", v, "modules.dep")); err != nil {
		return kernel{}, &MissingError{What: "modules of kernel " + v, Package: "linux-image-" + v, Err: err}
	}
	return kernel{image: path, version: v}, nil
}

// bzImageVersion reads the kernel release from an x86 bzImage: the boot
// protocol's setup header (magic "HdrS" at 0x202) points at 0x20e to a string
// beginning with the release, 0x200 bytes further on.
func bzImageVersion(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	hdr := make([]byte, 0x210)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return "", fmt.Errorf("reading boot header: %w", err)
	}
	if string(hdr[0x202:0x206]) != "HdrS" {
		return "", errors.New("not an x86 bzImage")
	}
	off := int64(binary.LittleEndian.Uint16(hdr[0x20e:])) + 0x200
	buf := make([]byte, 256)
	n, err := f.ReadAt(buf, off)
	if n == 0 {
		return "", fmt.Errorf("reading version string: %w", err)
	}
	v, _, _ := bytes.Cut(buf[:n], []byte(" "))
	v, _, _ = bytes.Cut(v, []byte{0})
	if len(v) == 0 {
		return "", errors.New("empty version string")
	}
	return string(v), nil
}

// versionLess orders strings like "vmlinuz-6.1.0-9" < "vmlinuz-6.1.0-56",
// comparing runs of digits as numbers.
func versionLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := unicode.IsDigit(rune(a[0])), unicode.IsDigit(rune(b[0]))
		if da && db {
			na, ra := splitDigits(a)
			nb, rb := splitDigits(b)
			na, nb = strings.TrimLeft(na, "0"), strings.TrimLeft(nb, "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = ra, rb
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func splitDigits(s string) (digits, rest string) {
	i := strings.IndexFunc(s, func(r rune) bool { return !unicode.IsDigit(r) })
	if i < 0 {
		return s, ""
	}
	return s[:i], s[i:]
}

// Compressions of a bzImage payload, by magic number, with the program that
// undoes them. sizeAppended tells whether the kernel build appended the
// uncompressed size after the compressed stream (gzip's trailer holds it).
var payloadCompressions = []struct {
	magic        string
	tool         tool
	sizeAppended bool
}{
	{"\xfd7zXZ\x00", tool{"xz", "xz-utils"}, true},
	{"\x1f\x8b", tool{"gzip", "gzip"}, false},
	{"\x28\xb5\x2f\xfd", tool{"zstd", "zstd"}, true},
}

// pvhKernel returns the uncompressed kernel (vmlinux) inside k's bzImage,
// cached in cacheDir, if QEMU can boot it through its PVH entry point.
// Booting it skips decompressing the kernel in the emulated CPU, which takes
// about 4 s under TCG. An error means: boot the bzImage instead.
func pvhKernel(k kernel, cacheDir string) (string, error) {
	img, err := os.ReadFile(k.image)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(img)
	name := "vmlinux-" + hex.EncodeToString(sum[:10]) + ".elf"
	dir := filepath.Join(cacheDir, k.version)

	// The setup header (boot protocol 2.08 and later) locates the payload:
	// it starts payload_offset (0x248) bytes into the protected-mode code,
	// which follows the setup sectors (count at 0x1f1, 0 meaning 4).
	if len(img) < 0x250 || binary.LittleEndian.Uint16(img[0x206:]) < 0x208 {
		return "", errors.New("boot protocol too old to locate the payload")
	}
	setupSects := int(img[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	start := (setupSects+1)*512 + int(binary.LittleEndian.Uint32(img[0x248:]))
	end := start + int(binary.LittleEndian.Uint32(img[0x24c:]))
	if end > len(img) || end-start < 8 {
		return "", errors.New("payload outside the image")
	}
	payload := img[start:end]
	size := int64(binary.LittleEndian.Uint32(payload[len(payload)-4:]))

	var (
		decompress string
		stream     []byte
	)
	for _, c := range payloadCompressions {
		if !bytes.HasPrefix(payload, []byte(c.magic)) {
			continue
		}
		if decompress, err = c.tool.find(); err != nil {
			return "", err
		}
		stream = payload
		if c.sizeAppended {
			stream = payload[:len(payload)-4]
		}
		break
	}
	if decompress == "" {
		return "", fmt.Errorf("unknown payload compression % x", payload[:4])
	}

	return cacheFile(dir, name, "vmlinux-*.elf", func(f *os.File) error {
		cmd := exec.Command(decompress, "-dc")
		var stderr bytes.Buffer
		cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stream), f, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s -dc: %v: %s", decompress, err, bytes.TrimSpace(stderr.Bytes()))
		}
		if fi, err := f.Stat(); err != nil || fi.Size() != size {
			return fmt.Errorf("decompressed payload is not %d bytes", size)
		}
		return checkPVH(f.Name())
	})
}

// checkPVH verifies that the ELF file at path has a PVH entry point: a Xen
// note of type XEN_ELFNOTE_PHYS32_ENTRY (18), which QEMU looks for.
func checkPVH(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes, err := io.ReadAll(p.Open())
		if err != nil {
			return err
		}
		// Each note: namesz, descsz, type, then name and desc, each
		// padded to 4 bytes.
		for len(notes) >= 12 {
			namesz := int(binary.LittleEndian.Uint32(notes[0:]))
			descsz := int(binary.LittleEndian.Uint32(notes[4:]))
			typ := binary.LittleEndian.Uint32(notes[8:])
			next := 12 + (namesz+3)&^3 + (descsz+3)&^3
			if next > len(notes) {
				break
			}
			if string(notes[12:12+namesz]) == "Xen\x00" && typ == 18 {
				return nil
			}
			notes = notes[next:]
		}
	}
	return errors.New("kernel has no PVH entry point")
}
