package rdmanet_test

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// memlockPairsEnv, when set to "A B N T O", makes the test binary a
// process that runs benchkit.MemlockPairsConfig from A to B with N pairs
// (and a dial on "tcp" if T is 1), as connections of their own if O is 1
// (NoLinkGroups); TestLabMemlockPairs reads its report.
const memlockPairsEnv = "RDMANET_TEST_MEMLOCK_PAIRS"

// memlockPairs is how many pairs an ordinary container's 8 MiB of
// RLIMIT_MEMLOCK must hold, all RDMA (issue 24).
const memlockPairs = 100

func runMemlockPairs(args string) int {
	f := strings.Fields(args)
	n, _ := strconv.Atoi(f[2])
	if err := benchkit.MemlockPairsConfig(netip.MustParseAddr(f[0]), netip.MustParseAddr(f[1]), n, f[3] == "1",
		rdmanet.Config{NoLinkGroups: f[4] == "1"}, os.Stdout); err != nil {
		fmt.Println("memlock pairs:", err)
		return 1
	}
	return 0
}

// vmPin is the process's pinned bytes (VmPin).
func vmPin() int { return benchkit.ProcStatus("VmPin") }

// TestLabMemlockPairs: in a process limited as an ordinary container is
// (RLIMIT_MEMLOCK 8 MiB, no CAP_IPC_LOCK), 100 connection pairs (200
// ends, both in the process) are all RDMA, each with a round trip; the
// dials beyond meet an error that names the limit (or the server's
// refusal for resources, when its end hit it first), a dial on "tcp"
// falls back to TCP for resources, and everything pinned is given back.
// With the default Config (a group's streams) on rxe and siw, and as
// connections of their own (NoLinkGroups) on rxe: what each costs.
func TestLabMemlockPairs(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, tc := range []struct {
		name string
		p    labenv.Pair
		own  bool
	}{
		{"rxe", env.RoCE(), false},
		{"siw", env.IWARP(), false},
		{"rxe_own", env.RoCE(), true},
	} {
		p := tc.p
		t.Run(tc.name, func(t *testing.T) {
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			cmd := benchkit.MemlockCommand(self)
			tcp := 0
			if p.Provider != labenv.ProviderSIW {
				tcp = 1
			}
			own := 0
			if tc.own {
				own = 1
			}
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%v %v %d %d %d", memlockPairsEnv, p.AddrA, p.AddrB, memlockPairs, tcp, own))
			out, err := cmd.CombinedOutput()
			t.Logf("limited process:\n%s", out)
			if err != nil {
				t.Fatalf("limited process: %v", err)
			}
			r := benchkit.ParseMemlock(string(out))
			if r.Pairs != memlockPairs {
				t.Fatalf("the limited process held %d pairs (%s), want %d", r.Pairs, r.PairErr, memlockPairs)
			}
			if !strings.Contains(r.BeyondErr, "RLIMIT_MEMLOCK") && !strings.Contains(r.BeyondErr, "refused") {
				t.Errorf("the dial beyond the limit failed with %q, want an error naming RLIMIT_MEMLOCK or the server's refusal for resources", r.BeyondErr)
			}
			if tcp == 1 && r.TCP != "tcp resources" {
				t.Errorf("a tcp dial beyond the limit: %q, want a fallback to TCP for resources", r.TCP)
			}
			if r.After != 0 {
				t.Errorf("after closing: %d bytes pinned, want none", r.After)
			}
		})
	}
}
