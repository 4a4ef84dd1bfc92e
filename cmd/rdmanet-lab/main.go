//go:build linux

// Command rdmanet-lab runs a command in a throwaway VM with real RDMA
// (Soft-RoCE and Soft-iWARP), for testing rdmanet on machines whose kernel
// has none.
//
// It boots the host's Debian kernel under QEMU (TCG), with the host's root
// file system as the guest's, read-only, and runs the command there as root
// in the same working directory and environment. See -h for details.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/internal/lab"
	"github.com/rdmanet/sdk/internal/labenv"
)

const usage = `usage: rdmanet-lab [flags] CMD [ARGS...]
       rdmanet-lab [flags] -selfcheck

Boots the host's kernel under QEMU/TCG with Soft-RoCE (rdma_rxe) and
Soft-iWARP (siw) and runs CMD inside: as root, with the host's root file
system read-only (its temporary directory writable), the same working
directory and environment, RLIMIT_MEMLOCK unlimited, TMPDIR on a tmpfs and
standard input empty. CMD's output streams to
rdmanet-lab's own, and rdmanet-lab exits with CMD's exit status (128+N if
signal N killed it).

Flags end at CMD, so it works as a go test runner:
    go build -o /tmp/rdmanet-lab ./cmd/rdmanet-lab
    go test -exec /tmp/rdmanet-lab ./...

The lab's network (all in 198.18.0.0/15), as CMD's environment describes it:
    RDMANET_LAB=1
    RDMANET_LAB_ADDR_A, _DEV_A, _NETDEV_A      path 1: %[1]v on %[3]s (%[5]s)
    RDMANET_LAB_ADDR_B, _DEV_B, _NETDEV_B              %[2]v on %[4]s (%[6]s)
    RDMANET_LAB_ADDR_A2, _DEV_A2, _NETDEV_A2   path 2: %[7]v on %[9]s (%[11]s)
    RDMANET_LAB_ADDR_B2, _DEV_B2, _NETDEV_B2           %[8]v on %[10]s (%[12]s)
                 A and B reach each other over RDMA on either path, each a
                 veth pair of its own; TCP between these addresses goes
                 through lo, untouched by faults on the veths
    RDMANET_LAB_IWARP_ADDR_A, _DEV_A, _NETDEV_A   iWARP: %[17]v on %[19]s (%[21]s)
    RDMANET_LAB_IWARP_ADDR_B, _DEV_B, _NETDEV_B          %[18]v on %[20]s (%[22]s)
                 A and B over Soft-iWARP, a veth pair of its own; siw's
                 TCP between them goes through lo too
    RDMANET_LAB_NORDMA_HOST, _NETNS     %[13]v in netns %[14]s: a host without
                                        RDMA (TCP works, RDMA gets no answer)
    RDMANET_LAB_PLAIN_HOST, _NETNS      %[15]v in netns %[16]s, behind a netdev
                                        without RDMA (address resolution fails)
Package internal/labenv reads them for tests.

-selfcheck boots the lab and checks it with ibv_devices, ibv_devinfo, rping
(on both RoCE paths and the iWARP pair), ib_write_bw (RoCE, and iWARP over
rdma_cm) and ib_send_lat, printing each tool's summary (inside the lab it
checks the lab it is in).

The kernel and initramfs it boots are built from the host's and cached in
~/.cache/rdmanet-lab (or $XDG_CACHE_HOME/rdmanet-lab), and so is siw.ko,
which Debian's kernels lack: it is built once per kernel and kernel source
from linux-source-6.1 against the kernel's linux-headers package (about 30 s).
Runs of one user wait for each other: one VM at a time.

Exit status: CMD's own; 124 if -timeout expired; 125 if the lab failed
(including a guest that reported no status); 126/127 if CMD cannot be
executed / was not found; 128+N if rdmanet-lab was stopped by signal N.

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rdmanet-lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		verbose   = fs.Bool("v", false, "show QEMU's command line, the kernel console and the lab's set-up steps on stderr")
		timeout   = fs.Duration("timeout", 30*time.Minute, "kill the VM after this `duration`, counted once no other lab VM runs (0: never)")
		kernel    = fs.String("kernel", "", "kernel image to boot (`bzImage`; default the newest /boot/vmlinuz-*)")
		memory    = fs.Int("m", lab.DefaultMemoryMiB, "guest memory in `MiB` (TMPDIR is a tmpfs in it)")
		cpus      = fs.Int("smp", lab.DefaultCPUs, "guest CPUs")
		selfcheck = fs.Bool("selfcheck", false, "check the lab with the standard RDMA tools instead of running CMD")
		guestSpec = fs.String("guest", "", "internal: run the guest stage from this spec file")
	)
	fs.Usage = func() {
		d := labenv.Default
		fmt.Fprintf(stderr, usage, d.AddrA, d.AddrB, d.DevA, d.DevB, d.NetdevA, d.NetdevB,
			d.AddrA2, d.AddrB2, d.DevA2, d.DevB2, d.NetdevA2, d.NetdevB2,
			d.NoRDMAHost, d.NoRDMANetns, d.PlainHost, d.PlainNetns,
			d.AddrIA, d.AddrIB, d.DevIA, d.DevIB, d.NetdevIA, d.NetdevIB)
		fs.VisitAll(func(f *flag.Flag) {
			if f.Name == "guest" { // for /init only
				return
			}
			name, use := flag.UnquoteUsage(f)
			if name != "" {
				name = " " + name
			}
			fmt.Fprintf(stderr, "  -%s%s\n    \t%s", f.Name, name, use)
			if f.DefValue != "" && f.DefValue != "false" {
				fmt.Fprintf(stderr, " (default %s)", f.DefValue)
			}
			fmt.Fprintln(stderr)
		})
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}

	if *guestSpec != "" {
		return lab.Guest(*guestSpec)
	}
	if *selfcheck && labenv.InLab() {
		if err := lab.SelfCheck(context.Background(), stdout); err != nil {
			fmt.Fprintf(stderr, "lab: %v\n", err)
			return 1
		}
		return 0
	}

	cmd := fs.Args()
	switch {
	case *selfcheck && len(cmd) > 0:
		fmt.Fprintln(stderr, "lab: -selfcheck takes no command")
		return 2
	case *selfcheck:
		if err := lab.CheckSelfCheckTools(); err != nil {
			fmt.Fprintf(stderr, "lab: %v\n", err)
			return lab.ExitLabError
		}
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(stderr, "lab: %v\n", err)
			return lab.ExitLabError
		}
		cmd = []string{exe, "-selfcheck"}
	case len(cmd) == 0:
		fs.Usage()
		return 2
	}

	// A signal kills the VM; Run then returns a SignalError.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigc)
	go func() {
		select {
		case s := <-sigc:
			cancel(&lab.SignalError{Signal: s})
		case <-ctx.Done():
		}
	}()

	status, err := lab.Run(ctx, lab.Config{
		Args:       cmd,
		Kernel:     *kernel,
		MemoryMiB:  *memory,
		CPUs:       *cpus,
		Timeout:    *timeout,
		Verbose:    *verbose,
		ReportBoot: *selfcheck,
		Stdout:     stdout,
		Stderr:     stderr,
	})
	if err != nil {
		fmt.Fprintf(stderr, "lab: %v\n", err)
		return lab.ExitCode(err)
	}
	return status
}
