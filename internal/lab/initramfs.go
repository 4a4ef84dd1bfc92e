//go:build linux

package lab

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/template"
)

// initModules are what /init loads before it can mount the host's root and
// open the ports; insmod is given them with all their dependencies.
var initModules = []string{"virtio_pci", "9pnet_virtio", "9p", "virtio_console"}

// initTemplate is the initramfs /init. It runs as PID 1 under busybox sh,
// with only busybox and the modules in the archive. Whatever goes wrong, it
// powers off; the host then sees no exit status and shows the console.
var initTemplate = template.Must(template.New("init").Parse(`#!/bin/busybox sh
# rdmanet-lab initramfs /init: mount the host's root over 9p and run the lab
# binary's guest stage in it.
/bin/busybox --install -s /bin
export PATH=/bin
die() { echo "rdmanet-lab /init: $*"; poweroff -f; }
{{range .Modules}}insmod /modules/{{.}} || die "insmod {{.}} failed"
{{end}}
o=trans=virtio,version=9p2000.L,msize=512000
# The host's root is read-only and the guest's only copy, so the page cache may
# keep it (cache=loose): binaries and libraries load much faster.
mount -t 9p -o $o,ro,cache=loose {{.TagRoot}} /host || die "mounting the host root failed"
cd /host || die "no /host"
mount -t proc proc proc &&
	mount -t sysfs sysfs sys &&
	mount -t devtmpfs devtmpfs dev &&
	mkdir -p dev/pts dev/shm &&
	mount -t devpts -o mode=0620,ptmxmode=0666 devpts dev/pts &&
	mount -t tmpfs -o mode=1777 tmpfs dev/shm &&
	mount -t tmpfs -o mode=0755 tmpfs run &&
	mkdir -p .{{.RunDir}} &&
	mkdir -m 1777 .{{.TmpDir}} || die "mounting the guest file systems failed"
# The kernel loads modules on demand (rxe needs crc32, for one) by running
# its modprobe helper from this root, not the chroot: point it at the host's.
echo /bin/lab-modprobe >proc/sys/kernel/modprobe || die "setting the modprobe helper failed"
mount -t 9p -o $o {{.TagRun}} .{{.RunDir}} || die "mounting the run directory failed"
tmp=$(cat .{{.RunDir}}/{{.TmpdirFile}}) && exe=$(cat .{{.RunDir}}/{{.ExeFile}}) ||
	die "reading the run directory failed"
# The host's temporary directory holds the command (go test builds there): it
# loads as fast with cache=loose, and the sync below writes back what the
# command wrote there.
mount -t 9p -o $o,cache=loose {{.TagTmp}} ".$tmp" || die "mounting the host $tmp failed"
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin chroot /host "$exe" -guest {{.RunDir}}/{{.SpecFile}}
sync
poweroff -f
`))

// modprobeHelper is the kernel's modprobe helper in the guest: the kernel
// runs it in the initramfs root, where the host's root is at /host.
const modprobeHelper = `#!/bin/busybox sh
exec /bin/busybox chroot /host modprobe "$@"
`

// initScript renders /init for the given module files (base names, in
// loading order).
func initScript(modules []string) []byte {
	var b bytes.Buffer
	err := initTemplate.Execute(&b, map[string]any{
		"Modules": modules,
		"TagRoot": tagRoot, "TagTmp": tagTmp, "TagRun": tagRun,
		"RunDir": guestRunDir, "TmpDir": guestTmpDir,
		"SpecFile": specName, "ExeFile": exeName, "TmpdirFile": tmpdirName,
	})
	if err != nil {
		panic(err) // the template and its data are fixed
	}
	return b.Bytes()
}

// initramfs returns the path of the lab's initramfs for k, in cacheDir.
// The archive is cheap to build in memory and deterministic, so its own hash
// names it: a later boot with the same inputs finds it and skips the write.
func initramfs(k kernel, modprobe, busybox, cacheDir string) (string, error) {
	mods, err := moduleFiles(modprobe, k.version, initModules)
	if err != nil {
		return "", err
	}
	names := make([]string, len(mods))
	for i, m := range mods {
		names[i] = filepath.Base(m)
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return "", err
	}

	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	for _, d := range []string{"bin", "dev", "host", "modules"} {
		w.Dir(d, 0o755)
	}
	// The kernel opens /dev/console for /init's standard streams before
	// anything can mount devtmpfs.
	w.CharDev("dev/console", 0o600, 5, 1)
	w.File("bin/busybox", 0o755, bb)
	w.File("bin/lab-modprobe", 0o755, []byte(modprobeHelper))
	w.File("init", 0o755, initScript(names))
	for i, m := range mods {
		data, err := os.ReadFile(m)
		if err != nil {
			return "", err
		}
		w.File("modules/"+names[i], 0o644, data)
	}
	if err := w.Close(); err != nil {
		return "", err
	}

	sum := sha256.Sum256(buf.Bytes())
	name := "initramfs-" + hex.EncodeToString(sum[:10]) + ".cpio"
	return cacheFile(filepath.Join(cacheDir, k.version), name, "initramfs-*.cpio", func(f *os.File) error {
		_, err := f.Write(buf.Bytes())
		return err
	})
}

// cacheFile returns dir/name, first creating it if it does not exist: fill
// writes (and may check) a temporary file that is then renamed into place,
// so that concurrent runs never see a partial file. Files matching stale,
// cache entries for inputs that have since changed, are removed.
func cacheFile(dir, name, stale string, fill func(*os.File) error) (string, error) {
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	err = fill(tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return "", err
	}
	old, _ := filepath.Glob(filepath.Join(dir, stale))
	for _, p := range old {
		if p != path {
			os.Remove(p)
		}
	}
	return path, nil
}

// moduleFiles returns the .ko files that load mods into kernel version, with
// their dependencies, in loading order and without repeats.
func moduleFiles(modprobe, version string, mods []string) ([]string, error) {
	args := append([]string{"-S", version, "-a", "--show-depends"}, mods...)
	out, err := exec.Command(modprobe, args...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%v: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return nil, fmt.Errorf("modprobe --show-depends %s: %w", strings.Join(mods, " "), err)
	}
	files := parseShowDepends(out)
	if len(files) == 0 {
		return nil, fmt.Errorf("modprobe found no module files for %s in kernel %s", strings.Join(mods, " "), version)
	}
	return files, nil
}

// parseShowDepends returns the module files in modprobe --show-depends
// output, whose lines are "insmod /lib/modules/.../x.ko [options]" or
// "builtin x", in order and without repeats.
func parseShowDepends(out []byte) []string {
	var files []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "insmod" || seen[f[1]] {
			continue
		}
		seen[f[1]] = true
		files = append(files, f[1])
	}
	return files
}
