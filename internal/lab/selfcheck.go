//go:build linux

package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
)

// Programs the self-check runs, from rdma-core's and perftest's packages.
var selfCheckTools = []tool{
	{"ibv_devices", "ibverbs-utils"},
	{"ibv_devinfo", "ibverbs-utils"},
	{"rping", "rdmacm-utils"},
	{"ib_write_bw", "perftest"},
	{"ib_send_lat", "perftest"},
}

// CheckSelfCheckTools reports the first program of the self-check that is not
// installed, so that rdmanet-lab -selfcheck fails before booting.
func CheckSelfCheckTools() error {
	for _, t := range selfCheckTools {
		if _, err := t.find(); err != nil {
			return err
		}
	}
	return nil
}

// stepTimeout bounds each self-check step: rdma_cm's own timeouts are long,
// and a step that hangs must fail rather than stall the lab.
const stepTimeout = 90 * time.Second

// SelfCheck checks the lab it runs in with the standard RDMA tools, printing
// each step and each tool's summary to w. It returns an error for the first
// step that fails.
func SelfCheck(ctx context.Context, w io.Writer) error {
	if err := CheckSelfCheckTools(); err != nil {
		return err
	}
	env, err := labenv.FromEnviron(os.LookupEnv)
	if err != nil {
		return fmt.Errorf("not in a working lab: %w", err)
	}
	a, b := env.AddrA.String(), env.AddrB.String()
	a2, b2 := env.AddrA2.String(), env.AddrB2.String()
	iw := env.IWARP()
	ia, ib := iw.AddrA.String(), iw.AddrB.String()
	serverClient := func(ctx context.Context, server, client []string) (string, error) {
		return labenv.ServerClient(ctx, server, client, func(format string, args ...any) {
			fmt.Fprintf(w, "selfcheck: "+format+"\n", args...)
		})
	}
	rping := func(a, b string) func(context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			out, err := serverClient(ctx,
				[]string{"rping", "-s", "-a", b, "-C", "3", "-v"},
				[]string{"rping", "-c", "-I", a, "-a", b, "-C", "3", "-v"})
			return grepLines(out, "ping data:"), err
		}
	}
	steps := []struct {
		title string
		run   func(context.Context) (string, error)
	}{
		{fmt.Sprintf("ibv_devices lists %s, %s, %s, %s, %s and %s", env.DevA, env.DevB, env.DevA2, env.DevB2, env.DevIA, env.DevIB), func(ctx context.Context) (string, error) {
			return devicesStep(ctx, env)
		}},
		{fmt.Sprintf("ibv_devinfo: %s and %s are iWARP, the rxe devices RoCE (transport InfiniBand)", env.DevIA, env.DevIB), func(ctx context.Context) (string, error) {
			return transportsStep(ctx, env)
		}},
		{fmt.Sprintf("rping %s -> %s (path 1), 3 round trips", a, b), rping(a, b)},
		{fmt.Sprintf("rping %s -> %s (path 2), 3 round trips", a2, b2), rping(a2, b2)},
		{fmt.Sprintf("rping %s -> %s (iWARP, %s -> %s), 3 round trips", ia, ib, iw.DevA, iw.DevB), rping(ia, ib)},
		{fmt.Sprintf("ib_write_bw %s -> %s, 64 KiB x 100", env.DevA, env.DevB), func(ctx context.Context) (string, error) {
			out, err := serverClient(ctx,
				[]string{"ib_write_bw", "-F", "-d", env.DevB, "-s", "65536", "-n", "100"},
				[]string{"ib_write_bw", "-F", "-d", env.DevA, "-s", "65536", "-n", "100", b})
			return perftestSummary(out), err
		}},
		// iWARP connects queue pairs through rdma_cm only (-R): perftest's
		// own exchange over TCP would skip the MPA handshake siw needs.
		// perftest 4.5's client ignores --source_ip and lets the kernel
		// pick the source, which for a local destination is the
		// destination itself: both ends are on siw1. The rping above is
		// what crosses from siw0 to siw1.
		{fmt.Sprintf("ib_write_bw -R to %s (iWARP over rdma_cm, both ends on %s), 64 KiB x 100", ib, iw.DevB), func(ctx context.Context) (string, error) {
			out, err := serverClient(ctx,
				[]string{"ib_write_bw", "-F", "-R", "-d", iw.DevB, "-s", "65536", "-n", "100"},
				[]string{"ib_write_bw", "-F", "-R", "-d", iw.DevB, "-s", "65536", "-n", "100", ib})
			return perftestSummary(out), err
		}},
		{fmt.Sprintf("ib_send_lat %s -> %s, 64 B x 200", env.DevA, env.DevB), func(ctx context.Context) (string, error) {
			out, err := serverClient(ctx,
				[]string{"ib_send_lat", "-F", "-d", env.DevB, "-s", "64", "-n", "200"},
				[]string{"ib_send_lat", "-F", "-d", env.DevA, "-s", "64", "-n", "200", b})
			return perftestSummary(out), err
		}},
	}
	for i, st := range steps {
		fmt.Fprintf(w, "selfcheck %d/%d: %s\n", i+1, len(steps), st.title)
		start := time.Now()
		sctx, cancel := context.WithTimeout(ctx, stepTimeout)
		summary, err := st.run(sctx)
		cancel()
		if summary != "" {
			fmt.Fprint(w, indent(summary))
		}
		if err != nil {
			fmt.Fprintf(w, "selfcheck %d/%d: FAILED after %.1fs\n", i+1, len(steps), time.Since(start).Seconds())
			return fmt.Errorf("selfcheck: %s: %w", st.title, err)
		}
		fmt.Fprintf(w, "selfcheck %d/%d: ok (%.1fs)\n", i+1, len(steps), time.Since(start).Seconds())
	}
	fmt.Fprintln(w, "selfcheck: all passed")
	return nil
}

// devicesStep runs ibv_devices and checks that it lists env's six devices.
func devicesStep(ctx context.Context, env labenv.Env) (string, error) {
	out, err := exec.CommandContext(ctx, "ibv_devices").CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ibv_devices: %v", err)
	}
	for _, dev := range []string{env.DevA, env.DevB, env.DevA2, env.DevB2, env.DevIA, env.DevIB} {
		if !hasField(string(out), dev) {
			return string(out), fmt.Errorf("ibv_devices does not list %s", dev)
		}
	}
	return string(out), nil
}

// transportsStep runs ibv_devinfo and checks each lab device's transport:
// iWARP for siw's, InfiniBand (which RoCE is, to verbs) for rxe's.
func transportsStep(ctx context.Context, env labenv.Env) (string, error) {
	out, err := exec.CommandContext(ctx, "ibv_devinfo").CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ibv_devinfo: %v", err)
	}
	got := devinfoTransports(string(out))
	var summary strings.Builder
	want := map[string]string{env.DevA: "InfiniBand", env.DevB: "InfiniBand", env.DevA2: "InfiniBand", env.DevB2: "InfiniBand",
		env.DevIA: "iWARP", env.DevIB: "iWARP"}
	for _, dev := range []string{env.DevA, env.DevB, env.DevA2, env.DevB2, env.DevIA, env.DevIB} {
		fmt.Fprintf(&summary, "%s: transport %s\n", dev, got[dev])
	}
	for dev, w := range want {
		if got[dev] != w {
			return summary.String(), fmt.Errorf("ibv_devinfo: %s has transport %q, want %s", dev, got[dev], w)
		}
	}
	return summary.String(), nil
}

// devinfoTransports reads ibv_devinfo's output: each device's block starts
// with "hca_id:\tNAME" and has a line "transport:\t\t\tiWARP (1)".
func devinfoTransports(out string) map[string]string {
	m := map[string]string{}
	var dev string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 2 && f[0] == "hca_id:":
			dev = f[1]
		case len(f) >= 2 && f[0] == "transport:" && dev != "":
			m[dev] = f[1]
		}
	}
	return m
}

// grepLines returns the lines of out that contain substr.
func grepLines(out, substr string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, substr) {
			b.WriteString(strings.TrimSpace(l) + "\n")
		}
	}
	return b.String()
}

// perftestSummary returns perftest's result table: the "#bytes" header and
// the line after it.
func perftestSummary(out string) string {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if strings.Contains(l, "#bytes") && i+1 < len(lines) {
			return strings.TrimSpace(l) + "\n" + strings.TrimSpace(lines[i+1]) + "\n"
		}
	}
	return ""
}

func hasField(s, field string) bool {
	for _, f := range strings.Fields(s) {
		if f == field {
			return true
		}
	}
	return false
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if strings.TrimSpace(l) != "" {
			b.WriteString("    " + l)
		}
	}
	if !strings.HasSuffix(b.String(), "\n") && b.Len() > 0 {
		b.WriteString("\n")
	}
	return b.String()
}
