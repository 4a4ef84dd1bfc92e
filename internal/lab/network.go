//go:build linux

package lab

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"golang.org/x/sys/unix"
)

// guestModules are loaded in the guest before the network is built.
// crc32_generic is what rxe computes RoCE checksums with: loaded here, it
// spares the kernel a module request per crc32 implementation (each a
// modprobe run, about 0.5 s in all) when the first rxe device is added.
// nbd is the kernel's NBD client, the block device of blockstore's lab
// tests (examples/blockstore). ib_core and libcrc32c are the dependencies
// of the lab's own siw.ko (siw.go), which is not under /lib/modules and so
// is loaded directly (loadSiw), with nothing to resolve them; libcrc32c
// pulls in the crc32c implementations siw computes MPA's CRC with.
var guestModules = []string{"ib_core", "rdma_rxe", "rdma_ucm", "ib_uverbs", "veth", "crc32_generic", "libcrc32c", "nbd"}

// prefixLen is the prefix length of every lab subnet.
const prefixLen = 24

// linkEnd is one end of a veth pair.
type linkEnd struct {
	dev   string     // interface name
	addr  netip.Addr // its address, with prefixLen
	netns string     // its network namespace, or "" for the initial one
	rdma  string     // the RDMA device on it, or "" for none
	// provider is the type of rdma: labenv.ProviderRXE (Soft-RoCE) or
	// labenv.ProviderSIW (Soft-iWARP).
	provider string
}

// where names the interface for messages.
func (e linkEnd) where() string {
	if e.netns == "" {
		return e.dev
	}
	return e.dev + " in network namespace " + e.netns
}

// topology returns the lab's veth pairs. What tests see of them comes from
// labenv.Default; the near ends of the non-RDMA hosts are the lab's own.
func topology() [][2]linkEnd {
	d := labenv.Default
	rxe, siw := labenv.ProviderRXE, labenv.ProviderSIW
	return [][2]linkEnd{
		// A and B: RDMA bound to A goes out on lab-a and comes in on lab-b.
		// Both ends stay in the initial namespace, the only one where
		// Debian 6.1's rxe receives.
		{{dev: d.NetdevA, addr: d.AddrA, rdma: d.DevA, provider: rxe}, {dev: d.NetdevB, addr: d.AddrB, rdma: d.DevB, provider: rxe}},
		// Path 2 between A and B, the same again on a veth pair and a
		// subnet of its own: a fault on one path leaves the other alone.
		// Each subnet's two routes (one per end) are distinct from the
		// other path's, and rdma_cm and rxe pick the route out of the
		// source address's own interface, so neither path's traffic
		// crosses the other's veths.
		{{dev: d.NetdevA2, addr: d.AddrA2, rdma: d.DevA2, provider: rxe}, {dev: d.NetdevB2, addr: d.AddrB2, rdma: d.DevB2, provider: rxe}},
		// A host without RDMA: the near end has rxe, so RDMA toward the far
		// end is sent and never answered.
		{{dev: "lab-n0", addr: netip.MustParseAddr("198.18.1.1"), rdma: "rxe2", provider: rxe},
			{dev: "lab-n1", addr: d.NoRDMAHost, netns: d.NoRDMANetns}},
		// A and B over Soft-iWARP, on a veth pair of its own. siw's TCP
		// between the two addresses goes through lo like any local TCP
		// (docs/lab.md, "Soft-iWARP"); rdma_cm still resolves the peer
		// through the source address's interface, with ARP over the veths.
		{{dev: d.NetdevIA, addr: d.AddrIA, rdma: d.DevIA, provider: siw}, {dev: d.NetdevIB, addr: d.AddrIB, rdma: d.DevIB, provider: siw}},
		// A route through a netdev without RDMA: address resolution fails.
		{{dev: "lab-p0", addr: netip.MustParseAddr("198.18.2.1")},
			{dev: "lab-p1", addr: d.PlainHost, netns: d.PlainNetns}},
	}
}

// netSetup builds the lab's network with the host's modprobe, ip and rdma.
type netSetup struct {
	modprobe, ip, rdma string
	siwModule          string                           // the lab's siw.ko (siw.go)
	log                func(format string, args ...any) // set-up steps
}

func newNetSetup(siwModule string, log func(string, ...any)) (*netSetup, error) {
	modprobe, err := toolModprobe.find()
	if err != nil {
		return nil, err
	}
	ip, err := toolIP.find()
	if err != nil {
		return nil, err
	}
	rdma, err := toolRDMA.find()
	if err != nil {
		return nil, err
	}
	if siwModule == "" {
		return nil, errors.New("no siw.ko: the host did not build Soft-iWARP")
	}
	return &netSetup{modprobe: modprobe, ip: ip, rdma: rdma, siwModule: siwModule, log: log}, nil
}

// batch is one run of a set-up program: argv, then lines on its standard
// input (ip and rdma read one command per line in batch mode).
type batch struct {
	argv  []string
	lines []string
}

// build loads the modules (siw.ko among them) and creates the namespaces,
// links, addresses and RDMA devices of topology(). Commands are grouped into
// one batch per program and namespace, because each program start costs
// about 0.1 s under TCG.
func (s *netSetup) build() error {
	namespaces := []string{""} // "" is the initial one
	ipCmds := map[string][]string{"": {"link set lo up"}}
	var rdmaCmds, acceptLocal, inOrder []string
	for _, pair := range topology() {
		near, far := pair[0], pair[1]
		add := "link add " + near.dev + " type veth peer name " + far.dev
		if far.netns != "" {
			namespaces = append(namespaces, far.netns)
			ipCmds[far.netns] = []string{"link set lo up"}
			add += " netns " + far.netns
		} else {
			// Both ends are this host's: packets between them arrive with
			// a local source address, which Linux drops as martian unless
			// accept_local is set. Without it, RDMA bound to one end never
			// resolves the other: ARP is dropped, and so would RoCE be.
			acceptLocal = append(acceptLocal, near.dev, far.dev)
		}
		ipCmds[""] = append(ipCmds[""], add)
		for _, e := range pair {
			ipCmds[e.netns] = append(ipCmds[e.netns],
				fmt.Sprintf("addr add %s/%d dev %s", e.addr, prefixLen, e.dev),
				"link set "+e.dev+" up")
			if e.rdma != "" {
				rdmaCmds = append(rdmaCmds, "link add "+e.rdma+" type "+e.provider+" netdev "+e.dev)
			}
			if e.provider == labenv.ProviderRXE && e.netns == "" {
				inOrder = append(inOrder, e.dev)
			}
		}
	}

	batches := []batch{{argv: append([]string{s.modprobe, "-a"}, guestModules...)}}
	for _, ns := range namespaces[1:] {
		batches = append(batches, batch{argv: []string{s.ip, "netns", "add", ns}})
	}
	for _, ns := range namespaces {
		argv := []string{s.ip}
		if ns != "" {
			argv = append(argv, "-n", ns)
		}
		batches = append(batches, batch{append(argv, "-batch", "-"), ipCmds[ns]})
	}
	// rdma spells the option -b: it would read -batch as -b atch.
	batches = append(batches, batch{[]string{s.rdma, "-b", "-"}, rdmaCmds})

	for i, b := range batches {
		if err := s.run(b); err != nil {
			return err
		}
		if i == 0 { // the modules siw.ko needs are loaded
			if err := s.loadSiw(); err != nil {
				return err
			}
		}
	}
	for _, dev := range acceptLocal {
		p := filepath.Join("/proc/sys/net/ipv4/conf", dev, "accept_local")
		s.log("echo 1 > %s", p)
		if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
			return err
		}
	}
	// A veth hands each packet to the backlog of the CPU that sent it,
	// and rxe sends a queue pair's packets from the poster's CPU or from
	// its task's, so they arrived out of order, and rxe answered with
	// NAKs and 134 ms retransmission waits (hundreds a run with 100 group
	// streams; docs/lab.md). A NIC keeps a flow on one receive queue
	// (RSS); RPS does so here, by the packets' hash.
	mask := rpsMask(runtime.NumCPU())
	for _, dev := range inOrder {
		p := filepath.Join("/sys/class/net", dev, "queues/rx-0/rps_cpus")
		s.log("echo %s > %s", mask, p)
		if err := os.WriteFile(p, []byte(mask+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// rpsMask is an rps_cpus mask of the first n CPUs (at most 32): RPS then
// spreads flows over all of them, each flow on one.
func rpsMask(n int) string {
	n = min(max(n, 1), 32)
	return strconv.FormatUint(1<<n-1, 16)
}

// loadSiw loads the lab's siw.ko. The syscall, rather than insmod: one
// program start fewer (about 0.1 s under TCG), and the same error.
func (s *netSetup) loadSiw() error {
	s.log("insmod %s", s.siwModule)
	f, err := os.Open(s.siwModule)
	if err != nil {
		return fmt.Errorf("Soft-iWARP module: %w", err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil {
		return fmt.Errorf("loading Soft-iWARP module %s: %w (dmesg says why)", s.siwModule, err)
	}
	return nil
}

// run runs one batch, logging its commands.
func (s *netSetup) run(b batch) error {
	prog := filepath.Base(b.argv[0])
	if len(b.lines) == 0 {
		s.log("%s %s", prog, strings.Join(b.argv[1:], " "))
	}
	for _, l := range b.lines {
		s.log("%s %s: %s", prog, strings.Join(b.argv[1:], " "), l)
	}
	cmd := exec.Command(b.argv[0], b.argv[1:]...)
	cmd.Stdin = strings.NewReader(strings.Join(b.lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", prog, strings.Join(b.argv[1:], " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// verifyNetwork checks that the network is usable: every RDMA device has an
// active port, and every interface is up and running with its address.
// Links come up asynchronously, so it retries for a while.
func verifyNetwork() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := checkNetwork()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkNetwork checks the network once; see verifyNetwork.
func checkNetwork() error {
	for _, pair := range topology() {
		for _, e := range pair {
			if e.rdma != "" {
				state, err := os.ReadFile(filepath.Join("/sys/class/infiniband", e.rdma, "ports/1/state"))
				if err != nil {
					return fmt.Errorf("RDMA device %s: %w", e.rdma, err)
				}
				if !bytes.Contains(state, []byte("ACTIVE")) {
					return fmt.Errorf("RDMA device %s: port state %s", e.rdma, bytes.TrimSpace(state))
				}
			}
			check := func() error { return checkInterface(e) }
			var err error
			if e.netns == "" {
				err = check()
			} else {
				err = labenv.InNetns(e.netns, check)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// checkInterface checks, in the current network namespace, that e's
// interface is up, has carrier and has its address.
func checkInterface(e linkEnd) error {
	ifi, err := net.InterfaceByName(e.dev)
	if err != nil {
		return fmt.Errorf("interface %s: %w", e.where(), err)
	}
	if ifi.Flags&net.FlagRunning == 0 {
		return fmt.Errorf("interface %s is not running (flags %v)", e.where(), ifi.Flags)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return fmt.Errorf("interface %s: %w", e.where(), err)
	}
	want := netip.PrefixFrom(e.addr, prefixLen)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ones, _ := n.Mask.Size()
			if ip, ok := netip.AddrFromSlice(n.IP); ok && netip.PrefixFrom(ip.Unmap(), ones) == want {
				return nil
			}
		}
	}
	return fmt.Errorf("interface %s lacks address %v", e.where(), want)
}
