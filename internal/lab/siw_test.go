//go:build linux

package lab

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
)

func TestNewSiwBuild(t *testing.T) {
	b, err := newSiwBuild("6.1.0-56-amd64")
	if err != nil {
		t.Fatal(err)
	}
	want := siwBuild{
		version: "6.1.0-56-amd64",
		tarball: "/usr/src/linux-source-6.1.tar.xz",
		srcPkg:  "linux-source-6.1",
		headers: "/lib/modules/6.1.0-56-amd64/build",
	}
	if b != want {
		t.Errorf("newSiwBuild = %+v, want %+v", b, want)
	}
	if b, err := newSiwBuild("6.12.9+bpo-amd64"); err != nil || b.srcPkg != "linux-source-6.12" {
		t.Errorf("newSiwBuild(6.12.9+bpo-amd64) = %+v, %v; want linux-source-6.12", b, err)
	}
	if _, err := newSiwBuild("amd64"); err == nil {
		t.Error("newSiwBuild accepted a release without major.minor")
	}
}

// fakeSiwBuild makes a tarball and a headers directory with the files the
// key reads, under a temporary directory.
func fakeSiwBuild(t *testing.T) siwBuild {
	dir := t.TempDir()
	b := siwBuild{
		version: "6.1.0-99-test",
		tarball: filepath.Join(dir, "linux-source-6.1.tar.xz"),
		srcPkg:  "linux-source-6.1",
		headers: filepath.Join(dir, "build"),
	}
	if err := os.MkdirAll(b.headers, 0o755); err != nil {
		t.Fatal(err)
	}
	for p, data := range map[string]string{
		b.tarball: "source",
		filepath.Join(b.headers, "Module.symvers"): "0x12345678\tib_register_device\n",
		filepath.Join(b.headers, ".config"):        "CONFIG_INFINIBAND=m\n",
	} {
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// TestSiwBuildMissing checks that a missing source or headers is reported
// with the package that provides it, for the exact kernel release.
func TestSiwBuildMissing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		remove  func(b siwBuild) string
		wantPkg string
	}{
		{"no source", func(b siwBuild) string { return b.tarball }, "linux-source-6.1"},
		{"no headers", func(b siwBuild) string { return filepath.Join(b.headers, "Module.symvers") }, "linux-headers-6.1.0-99-test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := fakeSiwBuild(t)
			if err := b.check(); err != nil {
				t.Fatalf("check with everything there: %v", err)
			}
			if err := os.Remove(tc.remove(b)); err != nil {
				t.Fatal(err)
			}
			err := b.check()
			var me *MissingError
			if !errors.As(err, &me) || me.Package != tc.wantPkg || !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("check: %v, want a MissingError naming %s", err, tc.wantPkg)
			}
			if !strings.Contains(err.Error(), "install the Debian package "+tc.wantPkg) {
				t.Errorf("message %q does not say what to install", err)
			}
		})
	}
}

// TestSiwKey checks that the cache key changes with each input: a new source
// package, a rebuilt kernel (symbol versions, configuration) or another
// release must each rebuild the module.
func TestSiwKey(t *testing.T) {
	b := fakeSiwBuild(t)
	base, err := b.key()
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := b.key(); again != base {
		t.Fatalf("key is not stable: %s then %s", base, again)
	}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, b *siwBuild)
	}{
		{"new source", func(t *testing.T, b *siwBuild) {
			later := time.Now().Add(time.Hour)
			if err := os.Chtimes(b.tarball, later, later); err != nil {
				t.Fatal(err)
			}
		}},
		{"new symbol versions", func(t *testing.T, b *siwBuild) {
			if err := os.WriteFile(filepath.Join(b.headers, "Module.symvers"), []byte("0x87654321\tib_register_device\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"new configuration", func(t *testing.T, b *siwBuild) {
			if err := os.WriteFile(filepath.Join(b.headers, ".config"), []byte("CONFIG_INFINIBAND=y\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"other release", func(t *testing.T, b *siwBuild) { b.version = "6.1.0-100-test" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := fakeSiwBuild(t)
			before, err := b.key()
			if err != nil {
				t.Fatal(err)
			}
			tc.change(t, &b)
			after, err := b.key()
			if err != nil {
				t.Fatal(err)
			}
			if after == before {
				t.Errorf("key %s unchanged", after)
			}
		})
	}
}

// TestModuleVermagic reads the vermagic of one of the host kernel's own
// modules, which must name that kernel's release.
func TestModuleVermagic(t *testing.T) {
	k, err := findKernel("")
	if err != nil {
		t.Skipf("no lab kernel on this host: %v", err)
	}
	ko := filepath.Join("/lib/modules", k.version, "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko")
	if _, err := os.Stat(ko); err != nil {
		t.Skipf("no uncompressed rdma_rxe.ko: %v", err)
	}
	magic, err := moduleVermagic(ko)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(magic, k.version+" ") {
		t.Errorf("vermagic of %s = %q, want it to start with %s", ko, magic, k.version)
	}
	if _, err := moduleVermagic("/proc/self/exe"); err == nil {
		t.Error("moduleVermagic accepted a program that is not a kernel module")
	}
}

// TestLabSiwModuleBuilds builds siw.ko for the lab kernel into a temporary
// cache (about 30 s), then finds it there without building. Inside the lab
// it checks the host's cache instead, which the host filled before booting
// the VM and the guest sees read-only: the module must be found there by
// the same key, without a build.
func TestLabSiwModuleBuilds(t *testing.T) {
	if testing.Short() && !labenv.InLab() {
		t.Skip("builds a kernel module (about 30 s); -short skips it")
	}
	k, err := findKernel("")
	if err != nil && !labenv.InLab() {
		t.Skipf("no lab kernel on this host: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := newSiwBuild(k.version)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.check(); err != nil {
		if os.Getenv("RDMANET_REQUIRE_TOOLS") != "" || labenv.InLab() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	cache := t.TempDir()
	if labenv.InLab() {
		user, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(user, "rdmanet-lab")
	}
	builds := 0
	notify := func(string) { builds++ }
	ko, err := siwModule(k, cache, notify)
	if err != nil {
		t.Fatal(err)
	}
	wantBuilds := 1
	if labenv.InLab() {
		wantBuilds = 0
	}
	if builds != wantBuilds {
		t.Errorf("%d builds announced, want %d", builds, wantBuilds)
	}
	magic, err := moduleVermagic(ko)
	if err != nil || !strings.HasPrefix(magic, k.version+" ") {
		t.Errorf("vermagic %q, %v; want kernel %s", magic, err, k.version)
	}
	// Found in the cache: no build announced (a rebuild took minutes; how
	// long the lookup takes is the machine's, 7.5 s once with two busy
	// loops beside make test, so it is logged, not bounded).
	start := time.Now()
	again, err := siwModule(k, cache, notify)
	if err != nil || again != ko || builds != wantBuilds {
		t.Errorf("second call: %s, %v, %d builds announced; want %s from the cache", again, err, builds, ko)
	}
	t.Logf("finding the cached module took %v", time.Since(start).Round(time.Millisecond))
	if labenv.InLab() {
		return
	}
	// Only the module: no temporary file of the build is left behind.
	files, _ := os.ReadDir(filepath.Dir(ko))
	if len(files) != 1 {
		var names []string
		for _, f := range files {
			names = append(names, f.Name())
		}
		t.Errorf("cache directory holds %q, want only %s", names, filepath.Base(ko))
	}
}
