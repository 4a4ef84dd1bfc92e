package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/rdmanet/sdk/examples/blockstore/nbd"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
)

// serveCommand is `blockstore serve`: it exports a file or memory until ctx
// is done.
func serveCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("blockstore serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", ":10809", "`host:port` to listen on (an empty host: every address); 10809 is NBD's port")
	file := fs.String("file", "", "export the file (or block device) at `path`")
	sizeFlag := fs.String("size", "", "with -file: create the file with this `size` if it does not exist")
	mem := fs.String("mem", "", "export `size` bytes of memory, zeroed, gone when the server stops")
	name := fs.String("name", "", "the export's `name` (default empty: the default export, nbd://host:port)")
	workers := fs.Int("workers", 0, "requests served at once per connection (default 8)")
	noInPlace := fs.Bool("no-in-place", false, "read requests and write replies through buffers of the server's own, not in place in the connection's rings, and keep -mem's memory unregistered")
	policyFlag := fs.String("policy", "auto", "transports: auto (RDMA and TCP), rdma or tcp")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	policy, err := fallback.ParsePolicy(*policyFlag)
	if err != nil || fs.NArg() > 0 || (*file == "") == (*mem == "") || (*sizeFlag != "" && *file == "") {
		if err == nil {
			err = errors.New("give -file or -mem (and -size only with -file)")
		}
		fmt.Fprintf(stderr, "blockstore serve: %v\n%s", err, usage)
		return 2
	}

	var backend nbd.Backend
	var what string
	if *mem != "" {
		size, err := parseSize(*mem)
		if err != nil {
			fmt.Fprintln(stderr, "blockstore serve: -mem:", err)
			return 2
		}
		m := nbd.NewMemory(size)
		if !*noInPlace {
			// Registered once: large reads are sent from it. Where it cannot
			// be pinned (RLIMIT_MEMLOCK), replies copy, as in place does.
			if m, err = nbd.NewRegisteredMemory(size); err != nil {
				fmt.Fprintln(stderr, "blockstore serve: -mem:", err)
				return 1
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				m.Close(ctx)
			}()
		}
		backend, what = m, "memory"
	} else {
		f, err := openExportFile(*file, *sizeFlag)
		if err != nil {
			fmt.Fprintln(stderr, "blockstore serve:", err)
			return 1
		}
		defer f.Close()
		backend, what = f, *file
	}

	log := slog.New(slog.NewTextHandler(stderr, nil))
	lc := rdmanet.ListenConfig{Policy: policy}
	ln, err := lc.Listen(ctx, "tcp", *addr)
	if err != nil {
		fmt.Fprintln(stderr, "blockstore serve:", err)
		return 1
	}
	srv := nbd.NewServer(backend, nbd.Options{
		ExportName:  *name,
		Description: "blockstore: " + what,
		Workers:     *workers,
		NoInPlace:   *noInPlace,
		Logger:      log,
		OnConn: func(c net.Conn) {
			transport, _ := rdmanet.TransportOf(c)
			log.Info("blockstore: client connected", "remote", c.RemoteAddr(), "transport", transport)
		},
	})
	fmt.Fprintf(stdout, "blockstore: serving %s (%s) on %v over %v", what, formatSize(backend.Size()), ln.Addr(), ln.Transports())
	if why := ln.RDMAError(); why != nil {
		fmt.Fprintf(stdout, " (no RDMA: %v)", why)
	}
	fmt.Fprintln(stdout)
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(stderr, "blockstore serve:", err)
		return 1
	}
	// Writes answered but not flushed reach the file now at the latest.
	if err := backend.Sync(); err != nil {
		fmt.Fprintln(stderr, "blockstore serve:", err)
		return 1
	}
	return 0
}

// openExportFile opens the file to export, first creating it (sparse) with
// the given size if a size is given and it does not exist.
func openExportFile(path, sizeFlag string) (*nbd.File, error) {
	if sizeFlag != "" {
		size, err := parseSize(sizeFlag)
		if err != nil {
			return nil, fmt.Errorf("-size: %w", err)
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		switch {
		case err == nil:
			if err := f.Truncate(size); err != nil {
				f.Close()
				return nil, err
			}
			f.Close()
		case !errors.Is(err, os.ErrExist):
			return nil, err
		}
	}
	f, err := nbd.OpenFile(path)
	if err != nil {
		return nil, err
	}
	if sizeFlag != "" {
		if size, _ := parseSize(sizeFlag); f.Size() != size {
			f.Close()
			return nil, fmt.Errorf("%s exists with %d bytes, not -size %s", path, f.Size(), sizeFlag)
		}
	}
	return f, nil
}
