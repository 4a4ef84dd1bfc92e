package rdmacore

import (
	"debug/elf"
	"github.com/rdmanet/sdk/internal/cabi"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestABIMatchesRDMACoreHeaders compiles testdata/abi_check.c, which asserts at
// compile time that every size, offset and constant in abi.h equals rdma-core's.
func TestABIMatchesRDMACoreHeaders(t *testing.T) {
	cc := cabi.Compiler(t)
	out, err := exec.Command(cc, "-fsyntax-only", "-Wall", "-Werror", filepath.Join("testdata", "abi_check.c")).CombinedOutput()
	if err != nil {
		t.Fatalf("abi.h disagrees with rdma-core's headers:\n%s", out)
	}
}

// TestNoLinkTimeDependency checks that this test binary, which contains
// rdmacore, does not name libibverbs or librdmacm as needed libraries: they are
// opened with dlopen, so programs run on hosts without rdma-core.
func TestNoLinkTimeDependency(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("ELF check is for Linux")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range libs {
		if strings.HasPrefix(l, "libibverbs") || strings.HasPrefix(l, "librdmacm") {
			t.Errorf("binary links %s at build time; it must be opened with dlopen", l)
		}
	}
}
