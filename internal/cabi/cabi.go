// Package cabi lets tests check rdmanet's own declarations of rdma-core's ABI
// against rdma-core's real headers, where those headers are installed.
package cabi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// RequireEnv names the variable that `make test` (and so CI) sets where
// rdma-core's headers are installed: there, missing headers fail the test
// instead of skipping it.
const RequireEnv = "RDMANET_REQUIRE_RDMA_HEADERS"

// The kernel's headers (linux-libc-dev) are here too: the lossless checks
// speak DCB netlink and ethtool.
var headers = []string{"infiniband/verbs.h", "rdma/rdma_cma.h", "rdma/rdma_netlink.h", "linux/dcbnl.h", "linux/ethtool.h", "linux/sockios.h"}

// Compiler returns the C compiler to check with, after making sure rdma-core's
// headers are there. Without them the test skips, or fails under RequireEnv.
func Compiler(t testing.TB) string {
	t.Helper()
	missing := func(why string) {
		t.Helper()
		if os.Getenv(RequireEnv) != "" {
			t.Fatalf("%s, and %s is set", why, RequireEnv)
		}
		t.Skipf("%s: install libibverbs-dev and librdmacm-dev to check rdmanet's ABI declarations", why)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		missing("no C compiler " + cc)
	}
	for _, h := range headers {
		if _, err := os.Stat(filepath.Join("/usr/include", h)); err != nil {
			missing("no " + h)
		}
	}
	return cc
}

// Constants compiles and runs a program that prints each named C constant of
// rdma-core's headers, and returns their values.
func Constants(t testing.TB, names []string) map[string]int64 {
	t.Helper()
	cc := Compiler(t)
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n")
	for _, h := range headers {
		fmt.Fprintf(&src, "#include <%s>\n", h)
	}
	src.WriteString("int main(void) {\n")
	for _, n := range names {
		fmt.Fprintf(&src, "\tprintf(\"%%s\\t%%lld\\n\", %q, (long long)(%s));\n", n, n)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "c")
	if out, err := exec.Command(cc, "-o", exe, filepath.Join(dir, "c.c")).CombinedOutput(); err != nil {
		t.Fatalf("compile constants program: %v\n%s", err, out)
	}
	out, err := exec.Command(exe).Output()
	if err != nil {
		t.Fatalf("run constants program: %v", err)
	}
	vals := make(map[string]int64)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, v, _ := strings.Cut(line, "\t") // names may hold spaces: sizeof(struct x)
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("constants program printed %q", line)
		}
		vals[name] = n
	}
	return vals
}

// CheckConstants fails t for each constant of want whose value in the
// headers differs.
func CheckConstants(t testing.TB, want map[string]int64) {
	t.Helper()
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	got := Constants(t, names)
	for n, w := range want {
		if got[n] != w {
			t.Errorf("%s = %d in the headers, %d here", n, got[n], w)
		}
	}
}
