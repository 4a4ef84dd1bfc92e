package main

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// The connections section's rows under an ordinary container's limit
// (issue 24): a child process of labbench's, limited to 8 MiB of
// RLIMIT_MEMLOCK without CAP_IPC_LOCK, runs benchkit.MemlockPairsConfig on each
// provider's pair (-memlock-child).

// memlockPairs is how many pairs the child opens before it dials on until
// a dial fails.
const memlockPairs = 100

// memlockConfig is the child's Config: the default but for NoLinkGroups,
// so that each pair is a connection with a queue pair of its own at each
// end, as before link groups became the default (issue 25; one listener's
// connections would be streams of one group).
var memlockConfig = rdmanet.Config{NoLinkGroups: true}

// memlockLabel is the rows' label, before the provider.
const memlockLabel = "rdmanet, default Config but NoLinkGroups"

// memlockRow is one provider's run.
type memlockRow struct {
	provider string
	res      benchkit.MemlockResult
	err      string // the child failed: its error and output
	took     time.Duration
}

// runMemlock runs the child on rxe and on siw (a dial on "tcp" only on
// rxe: a listener that serves both transports on one port cannot listen
// for iWARP).
func (b *bench) runMemlock(run *connsRun) {
	self, err := os.Executable()
	for _, p := range []labenv.Pair{b.env.RoCE(), b.env.IWARP()} {
		row := memlockRow{provider: string(p.Provider)}
		start := time.Now()
		if err != nil {
			row.err = err.Error()
		} else {
			tcp := p.Provider != labenv.ProviderSIW
			cmd := benchkit.MemlockCommand(self, "-memlock-child", fmt.Sprintf("%v %v %d %v", p.AddrA, p.AddrB, memlockPairs, tcp))
			out, err := cmd.CombinedOutput()
			row.res = benchkit.ParseMemlock(string(out))
			if err != nil {
				row.err = fmt.Sprintf("%v: %s", err, oneLine(string(out)))
			}
		}
		row.took = time.Since(start)
		run.memlock = append(run.memlock, row)
		fmt.Fprintf(b.log, "labbench: connections under 8 MiB of RLIMIT_MEMLOCK on %s: %d pairs, %d more, then %q (%.1fs)\n",
			row.provider, row.res.Pairs, row.res.Beyond, row.res.BeyondErr, row.took.Seconds())
	}
}

// memlockChild is labbench run with -memlock-child "A B N TCP".
func memlockChild(args string) int {
	f := strings.Fields(args)
	if len(f) != 4 {
		fmt.Fprintln(os.Stderr, "labbench: -memlock-child wants \"A B N TCP\"")
		return 2
	}
	a, errA := netip.ParseAddr(f[0])
	b, errB := netip.ParseAddr(f[1])
	n, errN := strconv.Atoi(f[2])
	tcp, errT := strconv.ParseBool(f[3])
	if errA != nil || errB != nil || errN != nil || errT != nil {
		fmt.Fprintln(os.Stderr, "labbench: -memlock-child wants \"A B N TCP\"")
		return 2
	}
	if err := benchkit.MemlockPairsConfig(a, b, n, tcp, memlockConfig, os.Stdout); err != nil {
		fmt.Println("memlock pairs:", err)
		return 1
	}
	return 0
}

// memlockSection reports the rows.
func (run *connsRun) memlockSection(w *strings.Builder) {
	if len(run.memlock) == 0 {
		return
	}
	fmt.Fprintf(w, "**Under an ordinary container's limit.** A child process limited to %s of `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK` "+
		"(`prlimit`, `setpriv`) opens %d pairs with the default Config but `NoLinkGroups: true` (a queue pair each end, as before link groups became the default), both ends its own, each with a round trip; "+
		"then dials on until a dial fails, then once on \"tcp\" (rxe only); then closes everything.\n\n",
		"8 MiB", memlockPairs)
	header := []string{"", "pairs over RDMA", "pinned KiB a pair", "more pairs before a dial failed", "that dial's error", "a dial on \"tcp\"", "pinned after the close"}
	var rows [][]string
	for _, m := range run.memlock {
		r := m.res
		pinned := "–"
		if r.Pairs > 0 {
			pinned = sig2(float64(r.PairsPinned) / 1024 / float64(r.Pairs))
		}
		beyond, why := thousands(r.Beyond), r.BeyondErr
		if r.Pairs < memlockPairs {
			beyond, why = "–", "(of the 100) "+r.PairErr
		}
		after := "–"
		if r.After >= 0 {
			after = thousands(r.After) + " bytes"
		}
		if m.err != "" {
			why = "**the child failed**: " + m.err
		}
		rows = append(rows, []string{memlockLabel + ", " + m.provider, thousands(r.Pairs), pinned, beyond, "`" + why + "`", cmpTCP(r.TCP), after})
	}
	table(w, header, rows)
}

// cmpTCP is the "tcp" dial's cell.
func cmpTCP(s string) string {
	switch s {
	case "":
		return "not tried"
	case "tcp resources":
		return "fell back to TCP (resources)"
	}
	return s
}
