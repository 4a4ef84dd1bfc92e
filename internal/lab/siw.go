//go:build linux

package lab

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// Soft-iWARP (siw) is not in Debian's kernels (CONFIG_RDMA_SIW is not set),
// so the lab builds siw.ko itself, on the host, out of tree: from the
// driver's sources in Debian's kernel source tarball, against the lab
// kernel's headers. The guest loads the cached module (network.go).

// Tools the siw build runs on the host. tar calls xz for the .tar.xz; the
// compiler (gcc-12 for Debian 12's kernels) comes with the headers package.
var (
	toolMake = tool{"make", "make"}
	toolTar  = tool{"tar", "tar"}
	toolXZ   = tool{"xz", "xz-utils"}
)

// siwRecipe names this file's way of building siw.ko. It is part of the
// cache key: change it when the build changes, so that cached modules built
// the old way are rebuilt.
const siwRecipe = "siw-recipe-1"

// siwBuild is what siw.ko is built from, for one kernel.
type siwBuild struct {
	version string // the kernel's release (uname -r): what the module must load into
	tarball string // Debian's kernel source: linux-source-<major.minor>.tar.xz
	srcPkg  string // the package that installs tarball
	headers string // the kernel's build directory: /lib/modules/<version>/build
}

// kernelSeries matches the major.minor at the start of a kernel release.
var kernelSeries = regexp.MustCompile(`^[0-9]+\.[0-9]+`)

// newSiwBuild returns where siw.ko for kernel version comes from on a
// Debian host.
func newSiwBuild(version string) (siwBuild, error) {
	series := kernelSeries.FindString(version)
	if series == "" {
		return siwBuild{}, fmt.Errorf("kernel release %q does not start with major.minor", version)
	}
	return siwBuild{
		version: version,
		tarball: "/usr/src/linux-source-" + series + ".tar.xz",
		srcPkg:  "linux-source-" + series,
		headers: filepath.Join("/lib/modules", version, "build"),
	}, nil
}

// Members of the source tarball the build takes, under its top directory
// (the tarball's name without .tar.xz).
const (
	siwSrcDir    = "drivers/infiniband/sw/siw"
	siwABIHeader = "include/uapi/rdma/siw-abi.h"
)

// check reports, as a *MissingError naming the package, a missing source
// tarball or kernel headers.
func (b siwBuild) check() error {
	if _, err := os.Stat(b.tarball); err != nil {
		return &MissingError{What: "kernel source " + b.tarball + " (to build Soft-iWARP, siw.ko)", Package: b.srcPkg, Err: err}
	}
	// Module.symvers is what an out-of-tree module is linked against; a
	// build directory without it is not a headers package's.
	if _, err := os.Stat(filepath.Join(b.headers, "Module.symvers")); err != nil {
		return &MissingError{What: "headers of kernel " + b.version + " (to build Soft-iWARP, siw.ko)", Package: "linux-headers-" + b.version, Err: err}
	}
	return nil
}

// key identifies the inputs of the build: the recipe, the kernel release,
// the source tarball (by size and modification time: hashing 130 MiB on
// every run would cost about a second) and the kernel's symbol versions and
// configuration, which change with a rebuilt kernel of the same release.
func (b siwBuild) key() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", siwRecipe, b.version)
	fi, err := os.Stat(b.tarball)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "%s %d %d\n", b.tarball, fi.Size(), fi.ModTime().UnixNano())
	for _, name := range []string{"Module.symvers", ".config"} {
		data, err := os.ReadFile(filepath.Join(b.headers, name))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", name, len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil)[:10]), nil
}

// siwModule returns the path of siw.ko for kernel k, building it into
// cacheDir/<version> if no module of the same inputs is there. The build
// (about 30 s: unpacking the two members takes half of it) runs in a
// temporary directory and the module is renamed into place, so an
// interrupted build leaves no partial file; older modules for the same
// kernel are removed. notify, if not nil, is told before a build starts.
func siwModule(k kernel, cacheDir string, notify func(string)) (string, error) {
	b, err := newSiwBuild(k.version)
	if err != nil {
		return "", err
	}
	if err := b.check(); err != nil {
		return "", err
	}
	key, err := b.key()
	if err != nil {
		return "", fmt.Errorf("siw.ko: %w", err)
	}
	name := "siw-" + key + ".ko"
	dir := filepath.Join(cacheDir, k.version)
	if _, err := os.Stat(filepath.Join(dir, name)); err != nil && notify != nil {
		notify(fmt.Sprintf("building Soft-iWARP (siw.ko) for kernel %s from %s, once (about 30 s)", k.version, b.tarball))
	}
	return cacheFile(dir, name, "siw-*.ko", func(f *os.File) error {
		return b.build(f)
	})
}

// build builds siw.ko in a temporary directory and copies it to dst.
func (b siwBuild) build(dst *os.File) error {
	var paths [3]string
	for i, t := range []tool{toolMake, toolTar, toolXZ} {
		p, err := t.find()
		if err != nil {
			return err
		}
		paths[i] = p
	}
	makePath, tarPath := paths[0], paths[1]

	work, err := os.MkdirTemp("", "rdmanet-lab-siw-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	top := strings.TrimSuffix(filepath.Base(b.tarball), ".tar.xz")
	// One pass over the tarball for both members: xz decompresses it all
	// whatever is taken from it.
	if err := runTool(exec.Command(tarPath, "-xJf", b.tarball, "-C", work,
		top+"/"+siwSrcDir, top+"/"+siwABIHeader)); err != nil {
		return fmt.Errorf("unpacking siw's sources from %s: %w", b.tarball, err)
	}
	src := filepath.Join(work, "siw")
	if err := os.Rename(filepath.Join(work, top, siwSrcDir), src); err != nil {
		return err
	}
	// siw.h includes <rdma/siw-abi.h>, the interface its user-space provider
	// (rdma-core's) speaks. The build finds the headers package's copy
	// first; the source's goes beside the sources, as the driver's own, and
	// must be the same: a difference means the source and the headers are
	// of different kernels, and the driver would be compiled against an
	// interface it was not written for.
	abi, err := os.ReadFile(filepath.Join(work, top, siwABIHeader))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, filepath.Base(siwABIHeader)), abi, 0o644); err != nil {
		return err
	}
	if hdr, err := os.ReadFile(filepath.Join(b.headers, siwABIHeader)); err == nil && !bytes.Equal(hdr, abi) {
		return &SiwSourceMismatchError{Tarball: b.tarball, Headers: b.headers}
	}

	if err := runTool(exec.Command(makePath, "-C", b.headers, "M="+src, "CONFIG_RDMA_SIW=m", "modules")); err != nil {
		return fmt.Errorf("building siw.ko against %s: %w", b.headers, err)
	}
	ko := filepath.Join(src, "siw.ko")
	magic, err := moduleVermagic(ko)
	if err != nil {
		return fmt.Errorf("built siw.ko: %w", err)
	}
	if release, _, _ := strings.Cut(magic, " "); release != b.version {
		return fmt.Errorf("built siw.ko is for kernel %q (vermagic %q), not %s", release, magic, b.version)
	}
	in, err := os.Open(ko)
	if err != nil {
		return err
	}
	defer in.Close()
	_, err = io.Copy(dst, in)
	return err
}

// SiwSourceMismatchError reports a kernel source tarball whose siw
// interface header differs from the lab kernel's headers.
type SiwSourceMismatchError struct {
	Tarball, Headers string
}

func (e *SiwSourceMismatchError) Error() string {
	return fmt.Sprintf("%s in %s differs from the one in %s: the kernel source and the lab kernel's headers are of different kernels (upgrade both packages together)",
		siwABIHeader, e.Tarball, e.Headers)
}

// runTool runs cmd; an error quotes the end of its output.
func runTool(cmd *exec.Cmd) error {
	out := newTailBuffer(4 << 10)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v:\n%s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// moduleVermagic returns a kernel module's vermagic ("6.1.0-56-amd64 SMP
// preempt mod_unload modversions"), from its .modinfo section of
// NUL-separated key=value strings. The kernel refuses a module whose
// release differs from its own.
func moduleVermagic(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return "", errors.New("no .modinfo section: not a kernel module")
	}
	data, err := sec.Data()
	if err != nil {
		return "", err
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("vermagic=")); ok {
			return strings.TrimSpace(string(v)), nil
		}
	}
	return "", errors.New("no vermagic in .modinfo")
}
