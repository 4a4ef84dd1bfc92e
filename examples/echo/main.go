// Command echo is rdmanet's first example: an echo server and a client that
// measures round trips. Over RDMA where both ends and the path support it,
// over TCP where not; both print which, and why.
//
//	cd examples   # a module of its own
//	go run ./echo server -addr :7471
//	go run ./echo client -addr 198.18.0.2:7471 -size 64 -count 10
//
// -policy auto|rdma|tcp chooses the transports (default auto; the
// RDMANET_TRANSPORT environment variable overrides it). The server serves
// RDMA and TCP on the same port number at once.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  echo server [-addr host:port] [-policy auto|rdma|tcp]
  echo client [-addr host:port] [-policy auto|rdma|tcp] [-local ip] [-size bytes] [-count n]
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("echo "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:7471", "`host:port` to listen on or dial")
	policyFlag := fs.String("policy", "auto", "transports: auto (RDMA, else TCP), rdma or tcp")
	local := fs.String("local", "", "client: the local `ip` to dial from (picks the RDMA device)")
	size := fs.Int("size", 64, "client: message size in `bytes`")
	count := fs.Int("count", 10, "client: round trips")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	policy, err := fallback.ParsePolicy(*policyFlag)
	if err != nil || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "echo: %v\n%s", cmpErr(err, "unexpected arguments"), usage)
		return 2
	}
	switch args[0] {
	case "server":
		err = serve(ctx, *addr, policy, stdout)
	case "client":
		if *size < 1 || *count < 1 {
			fmt.Fprintf(stderr, "echo: -size and -count must be positive\n")
			return 2
		}
		err = client(ctx, *addr, *local, policy, *size, *count, stdout)
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "echo:", err)
		return 1
	}
	return 0
}

func cmpErr(err error, otherwise string) any {
	if err != nil {
		return err
	}
	return otherwise
}

// describe says how a connection travels, and why not over RDMA if so.
func describe(c net.Conn) string {
	t, why := rdmanet.TransportOf(c)
	switch rc := c.(type) {
	case *rdmanet.Conn:
		return fmt.Sprintf("%s (protocol %s)", t, rc.Protocol())
	}
	if why != nil {
		return fmt.Sprintf("%s (fell back: %v)", t, why)
	}
	return string(t)
}

func serve(ctx context.Context, addr string, policy fallback.Policy, out io.Writer) error {
	lc := rdmanet.ListenConfig{Policy: policy}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	transports := ln.Transports()
	fmt.Fprintf(out, "echo server: listening on %v over %v", ln.Addr(), transports)
	if why := ln.RDMAError(); why != nil {
		fmt.Fprintf(out, " (no RDMA: %v)", why)
	}
	fmt.Fprintln(out)
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		fmt.Fprintf(out, "echo server: %v connected over %s\n", c.RemoteAddr(), describe(c))
		go func() {
			defer c.Close()
			n, err := io.Copy(c, c)
			if err != nil && !errors.Is(err, net.ErrClosed) {
				fmt.Fprintf(out, "echo server: %v: %v\n", c.RemoteAddr(), err)
			}
			fmt.Fprintf(out, "echo server: %v done, %d bytes echoed\n", c.RemoteAddr(), n)
		}()
	}
}

func client(ctx context.Context, addr, local string, policy fallback.Policy, size, count int, out io.Writer) error {
	d := rdmanet.Dialer{Policy: policy, Timeout: 30 * time.Second}
	if local != "" {
		ip := net.ParseIP(local)
		if ip == nil {
			return fmt.Errorf("-local %q is not an IP address", local)
		}
		d.LocalAddr = &net.TCPAddr{IP: ip}
	}
	start := time.Now()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(out, "echo client: connected to %v over %s in %v\n", c.RemoteAddr(), describe(c), time.Since(start).Round(time.Microsecond))

	msg, got := make([]byte, size), make([]byte, size)
	var rtts []time.Duration
	for i := range count {
		if ctx.Err() != nil {
			break
		}
		for j := range msg {
			msg[j] = byte(i + j)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		t0 := time.Now()
		if _, err := c.Write(msg); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		rtt := time.Since(t0)
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("round trip %d: the echo differs from what was sent", i+1)
		}
		rtts = append(rtts, rtt)
		fmt.Fprintf(out, "%d bytes: seq=%d time=%v\n", size, i+1, rtt.Round(time.Microsecond))
	}
	if len(rtts) == 0 {
		return ctx.Err()
	}
	slices.Sort(rtts)
	var sum time.Duration
	for _, r := range rtts {
		sum += r
	}
	transport, _ := rdmanet.TransportOf(c)
	fmt.Fprintf(out, "echo client: %d round trips of %d bytes over %s: min %v, median %v, avg %v, max %v\n",
		len(rtts), size, transport, rtts[0].Round(time.Microsecond), rtts[len(rtts)/2].Round(time.Microsecond),
		(sum / time.Duration(len(rtts))).Round(time.Microsecond), rtts[len(rtts)-1].Round(time.Microsecond))
	return nil
}
