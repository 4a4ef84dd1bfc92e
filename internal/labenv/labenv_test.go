package labenv

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// lookupIn returns a lookup function over the KEY=VALUE entries env.
func lookupIn(env []string) func(string) (string, bool) {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func TestEnvironRoundTrip(t *testing.T) {
	env := Default.Environ()
	if env[0] != VarLab+"=1" {
		t.Errorf("Environ()[0] = %q, want %s=1", env[0], VarLab)
	}
	got, err := FromEnviron(lookupIn(env))
	if err != nil {
		t.Fatal(err)
	}
	if got != Default {
		t.Errorf("FromEnviron(Default.Environ()) = %+v, want %+v", got, Default)
	}
}

func TestDefaultIsInBenchmarkRange(t *testing.T) {
	for _, a := range []string{Default.AddrA.String(), Default.AddrB.String(), Default.AddrA2.String(), Default.AddrB2.String(), Default.AddrIA.String(), Default.AddrIB.String(), Default.NoRDMAHost.String(), Default.PlainHost.String()} {
		if !strings.HasPrefix(a, "198.18.") && !strings.HasPrefix(a, "198.19.") {
			t.Errorf("lab address %s is outside 198.18.0.0/15", a)
		}
	}
}

// TestPathsIndependent checks that the two RDMA paths share no address,
// device, interface or subnet.
func TestPathsIndependent(t *testing.T) {
	p := Default.Paths()
	if p[0].A != Default.AddrA || p[1].B != Default.AddrB2 || p[1].NetdevA != Default.NetdevA2 {
		t.Errorf("Paths() = %+v, does not match Default", p)
	}
	seen := map[string]int{}
	for i, path := range p {
		for _, s := range []string{path.A.String(), path.B.String(), path.DevA, path.DevB, path.NetdevA, path.NetdevB} {
			if j, ok := seen[s]; ok {
				t.Errorf("%q is in path %d and path %d", s, j+1, i+1)
			}
			seen[s] = i
		}
	}
	subnet := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, 24).Masked() }
	for _, path := range p {
		if subnet(path.A) != subnet(path.B) {
			t.Errorf("%v and %v are not in one /24", path.A, path.B)
		}
	}
	if subnet(p[0].A) == subnet(p[1].A) {
		t.Errorf("both paths are in %v", subnet(p[0].A))
	}
}

// TestPairs checks that the pairs describe Default's devices, Soft-RoCE
// first, and that the iWARP pair shares nothing with either RoCE path.
func TestPairs(t *testing.T) {
	pairs := Default.Pairs()
	if len(pairs) != 2 || pairs[0] != Default.RoCE() || pairs[1] != Default.IWARP() {
		t.Fatalf("Pairs() = %+v, want RoCE() then IWARP()", pairs)
	}
	roce := Pair{ProviderRXE, Default.AddrA, Default.AddrB, "rxe0", "rxe1", "lab-a", "lab-b"}
	if pairs[0] != roce {
		t.Errorf("RoCE() = %+v, want %+v", pairs[0], roce)
	}
	iwarp := Pair{ProviderSIW, netip.MustParseAddr("198.18.4.1"), netip.MustParseAddr("198.18.4.2"), "siw0", "siw1", "lab-i0", "lab-i1"}
	if pairs[1] != iwarp {
		t.Errorf("IWARP() = %+v, want %+v", pairs[1], iwarp)
	}
	subnet := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, 24).Masked() }
	if subnet(iwarp.AddrA) != subnet(iwarp.AddrB) {
		t.Errorf("the iWARP pair's %v and %v are not in one /24", iwarp.AddrA, iwarp.AddrB)
	}
	taken := map[string]bool{}
	for _, p := range Default.Paths() {
		for _, s := range []string{p.A.String(), p.B.String(), p.DevA, p.DevB, p.NetdevA, p.NetdevB, subnet(p.A).String()} {
			taken[s] = true
		}
	}
	for _, s := range []string{iwarp.AddrA.String(), iwarp.AddrB.String(), iwarp.DevA, iwarp.DevB, iwarp.NetdevA, iwarp.NetdevB, subnet(iwarp.AddrA).String()} {
		if taken[s] {
			t.Errorf("the iWARP pair's %s is also an RoCE path's", s)
		}
	}
}

func TestFromEnvironErrors(t *testing.T) {
	env := Default.Environ()
	for _, tc := range []struct {
		name    string
		drop    string // variable to remove
		set     string // KEY=VALUE to add
		wantErr bool   // an underlying parse error, not just a missing variable
	}{
		{name: "missing", drop: "RDMANET_LAB_DEV_B"},
		{name: "missing path 2", drop: "RDMANET_LAB_NETDEV_A2"},
		{name: "missing iWARP device", drop: "RDMANET_LAB_IWARP_DEV_B"},
		{name: "bad iWARP address", set: "RDMANET_LAB_IWARP_ADDR_A=198.18.4.300", wantErr: true},
		{name: "empty", set: "RDMANET_LAB_NORDMA_NETNS="},
		{name: "bad address", set: "RDMANET_LAB_ADDR_A=198.18.0", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e []string
			for _, kv := range env {
				if !strings.HasPrefix(kv, tc.drop+"=") || tc.drop == "" {
					e = append(e, kv)
				}
			}
			if tc.set != "" {
				e = append(e, tc.set)
			}
			_, err := FromEnviron(lookupIn(e))
			var ve *VarError
			if !errors.As(err, &ve) {
				t.Fatalf("FromEnviron: got %v, want a *VarError", err)
			}
			if (ve.Err != nil) != tc.wantErr {
				t.Errorf("VarError.Err = %v, want an error: %v", ve.Err, tc.wantErr)
			}
		})
	}
}

func TestInLab(t *testing.T) {
	t.Setenv(VarLab, "")
	if InLab() {
		t.Errorf("InLab() with %s empty = true", VarLab)
	}
	t.Setenv(VarLab, "1")
	if !InLab() {
		t.Errorf("InLab() with %s=1 = false", VarLab)
	}
}

// fakeTB records what requireRDMA does with its testing.TB. Skip and Fatalf
// end the goroutine, as the real ones do; the embedded nil TB makes any other
// method panic, so the test notices if requireRDMA starts using one.
type fakeTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Skip(args ...any) {
	f.skipped, f.msg = true, fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// callRequireRDMA runs requireRDMA on a fakeTB in its own goroutine.
func callRequireRDMA(env []string, root string) (*fakeTB, Env) {
	f := &fakeTB{}
	var got Env
	done := make(chan struct{})
	go func() {
		defer close(done)
		got = requireRDMA(f, lookupIn(env), root)
	}()
	<-done
	return f, got
}

// fakeLabRoot makes a directory tree with the lab's device files under it.
func fakeLabRoot(t *testing.T) string {
	root := t.TempDir()
	for _, d := range []string{"sys/class/infiniband/rxe0", "sys/class/infiniband/rxe1",
		"sys/class/infiniband/rxe3", "sys/class/infiniband/rxe4",
		"sys/class/infiniband/siw0", "sys/class/infiniband/siw1", "dev/infiniband"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"dev/infiniband/uverbs0", "dev/infiniband/rdma_cm"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestRequireRDMASkipsOutsideLab(t *testing.T) {
	f, _ := callRequireRDMA(nil, fakeLabRoot(t))
	if !f.skipped || f.failed {
		t.Fatalf("outside the lab: skipped=%v failed=%v, want a skip", f.skipped, f.failed)
	}
	if !strings.Contains(f.msg, "go test -exec") || !strings.Contains(f.msg, "make lab-test") {
		t.Errorf("skip reason %q does not say how to run the test in the lab", f.msg)
	}
}

func TestRequireRDMAFailsInBrokenLab(t *testing.T) {
	env := Default.Environ()
	for _, tc := range []struct {
		name   string
		env    []string
		remove string // file under the fake root to delete
	}{
		{name: "no variables", env: []string{VarLab + "=1"}},
		{name: "no device", env: env, remove: "sys/class/infiniband/rxe1"},
		{name: "no path 2 device", env: env, remove: "sys/class/infiniband/rxe4"},
		{name: "no siw device", env: env, remove: "sys/class/infiniband/siw0"},
		{name: "no uverbs", env: env, remove: "dev/infiniband/uverbs0"},
		{name: "no rdma_cm", env: env, remove: "dev/infiniband/rdma_cm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeLabRoot(t)
			if tc.remove != "" {
				if err := os.Remove(filepath.Join(root, tc.remove)); err != nil {
					t.Fatal(err)
				}
			}
			f, _ := callRequireRDMA(tc.env, root)
			if !f.failed || f.skipped {
				t.Fatalf("skipped=%v failed=%v, want a failure (an RDMA test must never skip in the lab)", f.skipped, f.failed)
			}
			t.Logf("message: %s", f.msg)
		})
	}
}

func TestRequireRDMAInLab(t *testing.T) {
	f, got := callRequireRDMA(Default.Environ(), fakeLabRoot(t))
	if f.skipped || f.failed {
		t.Fatalf("skipped=%v failed=%v: %s", f.skipped, f.failed, f.msg)
	}
	if got != Default {
		t.Errorf("got %+v, want %+v", got, Default)
	}
}

func TestInNetnsErrors(t *testing.T) {
	for _, name := range []string{"", "..", "a/b", "rdmanet-no-such-netns"} {
		called := false
		err := InNetns(name, func() error { called = true; return nil })
		if err == nil || called {
			t.Errorf("InNetns(%q): err=%v, fn called=%v; want an error before calling fn", name, err, called)
		}
	}
}

// Outside the lab Drop refuses before running anything: the netdevs it
// would change are the host's.
func TestDropOutsideLab(t *testing.T) {
	t.Setenv(VarLab, "")
	heal, _, err := Default.Paths()[0].Drop()
	if err == nil || heal != nil || !strings.Contains(err.Error(), "outside the lab") {
		t.Errorf("Drop outside the lab: heal %v, err %v", heal != nil, err)
	}
}
