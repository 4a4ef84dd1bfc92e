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
	"strings"
	"sync"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
)

// bridgeCommand is `blockstore bridge`: it listens on a local TCP port or
// unix socket and relays each connection to the NBD server over rdmanet, so
// that a client that speaks only TCP or unix sockets (the kernel's nbd
// driver, set up by nbd-client) reaches the server over RDMA. It relays
// bytes and does not take part in the protocol.
func bridgeCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("blockstore bridge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:10810", "local `address` for NBD clients: host:port, or unix:PATH for a unix socket")
	to := fs.String("to", "", "the blockstore server's `host:port`")
	policyFlag := fs.String("policy", "auto", "transports to the server: auto (RDMA, else TCP), rdma or tcp")
	localFlag := fs.String("local", "", "dial the server from this local `address` (which picks the RDMA device on a host with several)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	policy, err := fallback.ParsePolicy(*policyFlag)
	var local *net.TCPAddr
	if err == nil {
		local, err = localAddr(*localFlag)
	}
	if err != nil || fs.NArg() > 0 || *to == "" {
		if err == nil {
			err = errors.New("give the server's address, -to host:port")
		}
		fmt.Fprintf(stderr, "blockstore bridge: %v\n%s", err, usage)
		return 2
	}
	ln, err := listenLocal(*listen)
	if err != nil {
		fmt.Fprintln(stderr, "blockstore bridge:", err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	fmt.Fprintf(stdout, "blockstore bridge: relaying %s %v to %s\n", ln.Addr().Network(), ln.Addr(), *to)

	b := &bridge{to: *to, dialer: rdmanet.Dialer{Policy: policy, Timeout: 30 * time.Second, LocalAddr: local}, log: log, conns: make(map[net.Conn]struct{})}
	go func() {
		<-ctx.Done()
		ln.Close()
		b.closeAll()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			b.wg.Wait()
			if ctx.Err() != nil {
				return 0
			}
			fmt.Fprintln(stderr, "blockstore bridge:", err)
			return 1
		}
		if !b.track(c) {
			c.Close()
			continue
		}
		go b.serve(ctx, c)
	}
}

// listenLocal listens on host:port, or on a unix socket for unix:PATH,
// replacing a stale socket file of a bridge that did not clean up.
func listenLocal(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return net.Listen("tcp", addr)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another program listens there", path)
		}
		os.Remove(path)
	}
	return net.Listen("unix", path) // Close removes the file
}

// bridge relays local connections to the server.
type bridge struct {
	to     string
	dialer rdmanet.Dialer
	log    *slog.Logger

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func (b *bridge) track(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.conns[c] = struct{}{}
	b.wg.Add(1)
	return true
}

func (b *bridge) untrack(c net.Conn) {
	b.mu.Lock()
	delete(b.conns, c)
	b.mu.Unlock()
}

func (b *bridge) closeAll() {
	b.mu.Lock()
	b.closed = true
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
}

// serve dials the server for one local connection and relays between them.
func (b *bridge) serve(ctx context.Context, local net.Conn) {
	defer b.wg.Done()
	defer b.untrack(local)
	defer local.Close()
	remote, err := b.dialer.DialContext(ctx, "tcp", b.to)
	if err != nil {
		b.log.Error("blockstore bridge: dialing the server", "to", b.to, "err", err)
		return
	}
	if !b.track(remote) {
		remote.Close()
		return
	}
	defer b.wg.Done()
	defer b.untrack(remote)
	transport, why := rdmanet.TransportOf(remote)
	b.log.Info("blockstore bridge: relaying", "local", local.RemoteAddr(), "to", remote.RemoteAddr(), "transport", transport, "fell-back-because", why)
	if err := relay(local, remote); err != nil && ctx.Err() == nil {
		b.log.Info("blockstore bridge: relay ended", "local", local.RemoteAddr(), "err", err)
	}
}
