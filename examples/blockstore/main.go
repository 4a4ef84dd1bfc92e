// Command blockstore is a Network Block Device server and benchmark over
// rdmanet: `blockstore serve` exports a file or memory over NBD on a port
// that takes RDMA and TCP clients at once, and `blockstore bench` measures
// an export, over RDMA where it can and TCP where not; `blockstore bridge`
// relays a local TCP port or unix socket to the server over rdmanet, for
// NBD clients that speak only those (the kernel's nbd driver).
//
//	cd examples   # a module of its own
//	go run ./blockstore serve -addr :10809 -mem 1G
//	go run ./blockstore bench -addr 127.0.0.1:10809 -rw randread -bs 4k -qd 32 -duration 10s
//
// NBD clients (the kernel's nbd driver, qemu, nbdinfo, nbdcopy, fio) reach
// the server over TCP. See README.md beside this file.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  blockstore serve [-addr host:port] (-file PATH [-size SIZE] | -mem SIZE) [-name EXPORT] [-workers N] [-policy auto|rdma|tcp] [-no-in-place]
  blockstore bench [-addr host:port] [-name EXPORT] [-rw read|write|randread|randwrite] [-bs SIZE] [-qd N]
                   [-duration D] [-bytes SIZE] [-policy auto|rdma|tcp] [-local ADDR] [-json] [-no-in-place]
  blockstore bridge -to host:port [-listen host:port | -listen unix:PATH] [-policy auto|rdma|tcp] [-local ADDR]

SIZE is a number of bytes with an optional K, M, G or T (powers of 1024).
`

// run runs a subcommand and returns the exit code: 0, 1 when it failed,
// 2 when it was used wrongly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serveCommand(ctx, args[1:], stdout, stderr)
	case "bench":
		return benchCommand(ctx, args[1:], stdout, stderr)
	case "bridge":
		return bridgeCommand(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, usage)
	return 2
}
