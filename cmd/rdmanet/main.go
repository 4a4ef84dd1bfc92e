// Command rdmanet is the operator's tool for rdmanet: it lists this host's
// RDMA devices and the limits that bound how many connections it can hold,
// tells whether a dial to an address would use RDMA and, if not, why,
// checks that the network under RoCE is configured lossless (PFC, trust,
// ECN, pause and discard counters), shows the RDMA counters that signal
// trouble as live rates, and measures round trips and throughput between
// two hosts over the transport rdmanet picks.
//
// Usage:
//
//	rdmanet [--json] COMMAND [flags] [args]
//
// Commands:
//
//	devices   RDMA devices, their ports, netdevs and GIDs, lossless-network checks, and the limits
//	doctor    would a dial to ADDR use RDMA, and if not, why; and is the network lossless for RoCE
//	stat      live RDMA port and hardware counters as rates, with what the trouble ones mean
//	serve     an rdmanet server for ping and bench
//	ping      round trips against serve
//	bench     stream throughput to (or from) serve
//	conns     a program's live connections, from its rdmanet.ConnsHandler
//	help      help on a command
//
// With --json (before or after the command) a command writes one JSON
// document to stdout, with stable field names, instead of its human output;
// serve, which runs until stopped, writes one JSON object per line (an event
// each), and so does stat (an interval each). Diagnostics go to stderr.
//
// Exit codes:
//
//	0  success: RDMA is available (devices), a dial would use it (doctor), the run completed (serve, ping, bench)
//	1  runtime failure: a dial, listen or I/O failed (with -policy rdma that includes a dial that could not use RDMA)
//	2  usage error: unknown command, bad flag or argument, or a malformed RDMANET_TRANSPORT
//	3  works, but not over RDMA: devices found no usable RDMA (stat: no RDMA device to watch), doctor's checks or dial did not give RDMA, ping or bench with -require-rdma ran over TCP
//
// In every case that is not 0, the reason RDMA is not used (a fallback
// reason such as "no-device" or "route-without-rdma") and a hint on how to
// make it work are printed.
//
// The environment variable RDMANET_TRANSPORT (auto, rdma or tcp) overrides
// the policy of dials and listens on the "tcp" network, as in every program
// that uses rdmanet; -policy rdma uses the "rdma" network, which ignores it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// Exit codes; exitCodesHelp documents them (and the package comment, which
// a test keeps in step with it).
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	exitNoRDMA  = 3
)

const exitCodesHelp = `Exit codes:
  0  success: RDMA is available (devices), a dial would use it (doctor), the run completed (serve, ping, bench)
  1  runtime failure: a dial, listen or I/O failed (with -policy rdma that includes a dial that could not use RDMA)
  2  usage error: unknown command, bad flag or argument, or a malformed RDMANET_TRANSPORT
  3  works, but not over RDMA: devices found no usable RDMA (stat: no RDMA device to watch), doctor's checks or dial did not give RDMA, ping or bench with -require-rdma ran over TCP
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command: it parses args and returns the exit code. SIGINT and
// SIGTERM cancel the command's context (ping and bench then print their
// summary; serve stops).
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runContext(ctx, args, stdout, stderr)
}

// command is one subcommand.
type command struct {
	name    string
	args    string // the positional arguments, for the usage line
	summary string
	// run parses its flags with fs (which already has -json) and runs.
	run func(ctx context.Context, g *globals, fs *flag.FlagSet, args []string) int
}

// globals are the flags every command has, and where output goes.
type globals struct {
	json           bool
	stdout, stderr io.Writer
	cmd            *command // the command that runs
}

var commands []*command

func init() {
	commands = []*command{
		{name: "devices", summary: "RDMA devices, ports, netdevs, GIDs, lossless-network checks, and the limits on connections", run: runDevices},
		{name: "doctor", args: "ADDR", summary: "would a dial to ADDR (host:port) use RDMA, and if not, why; and is the network lossless for RoCE", run: runDoctor},
		{name: "stat", args: "[DEVICE]", summary: "live RDMA port and hardware counters as rates, with what the trouble ones mean", run: runStat},
		{name: "serve", summary: "serve ping and bench over RDMA and TCP", run: runServe},
		{name: "ping", args: "ADDR", summary: "round trips against rdmanet serve at ADDR", run: runPing},
		{name: "bench", args: "ADDR", summary: "stream throughput to (or from) rdmanet serve at ADDR", run: runBench},
		{name: "conns", args: "URL", summary: "a program's live rdmanet connections, from its rdmanet.ConnsHandler at URL (or HOST:PORT)", run: runConns},
		{name: "groups", args: "URL", summary: "a program's link groups (the RDMA connections its connections share), from the same handler", run: runGroups},
	}
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// runContext is run with a context the caller controls (tests stop serve
// with it).
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr}
	top := flag.NewFlagSet("rdmanet", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	top.BoolVar(&g.json, "json", false, "")
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return exitOK
		}
		fmt.Fprintf(stderr, "rdmanet: %v\n\n", err)
		usage(stderr)
		return exitUsage
	}
	args = top.Args()
	if len(args) == 0 {
		fmt.Fprint(stderr, "rdmanet: no command\n\n")
		usage(stderr)
		return exitUsage
	}
	name, args := args[0], args[1:]
	if name == "help" {
		return runHelp(args, stdout, stderr)
	}
	c := findCommand(name)
	if c == nil {
		fmt.Fprintf(stderr, "rdmanet: unknown command %q\n\n", name)
		usage(stderr)
		return exitUsage
	}
	g.cmd = c
	fs := flag.NewFlagSet("rdmanet "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by parse, help by commandUsage
	fs.BoolVar(&g.json, "json", g.json, "write one JSON document to stdout instead of the human output")
	return c.run(ctx, g, fs, args)
}

func runHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return exitOK
	}
	c := findCommand(args[0])
	if c == nil || len(args) > 1 {
		fmt.Fprintf(stderr, "rdmanet help: unknown command %q\n\n", strings.Join(args, " "))
		usage(stderr)
		return exitUsage
	}
	// The command prints its usage when asked for -h.
	g := globals{stdout: stdout, stderr: stderr, cmd: c}
	fs := flag.NewFlagSet("rdmanet "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&g.json, "json", false, "write one JSON document to stdout instead of the human output")
	return c.run(context.Background(), &g, fs, []string{"-h"})
}

func usage(w io.Writer) {
	fmt.Fprint(w, `rdmanet: RDMA devices, diagnosis and measurements for rdmanet

Usage:
  rdmanet [--json] COMMAND [flags] [args]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s  %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-8s  %s\n", "help", "help on a command: rdmanet help COMMAND")
	fmt.Fprint(w, `
A command's flags may come before or after its arguments. --json (before
or after the command) writes one JSON document to stdout
(serve and stat: one JSON object per line) instead of the human output.
RDMANET_TRANSPORT=auto|rdma|tcp overrides the policy of "tcp" dials and
listens, as in every program that uses rdmanet.

`+exitCodesHelp)
}

// parse parses a command's flags and returns exactly nargs positional
// arguments. Flags may come before or after them. ok is false when the
// command must return code: usage errors (2) and -h (0).
func parse(g *globals, fs *flag.FlagSet, args []string, nargs int) (pos []string, code int, ok bool) {
	return parseRange(g, fs, args, nargs, nargs)
}

// parseRange is parse for a command that takes from least to most
// positional arguments.
func parseRange(g *globals, fs *flag.FlagSet, args []string, least, most int) (pos []string, code int, ok bool) {
	c := g.cmd
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				commandUsage(g.stdout, fs, c)
				return nil, exitOK, false
			}
			return nil, usageError(g, fs, "%v", err), false
		}
		rest := fs.Args()
		consumed := args[:len(args)-len(rest)]
		if len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if len(pos) < least || len(pos) > most {
		switch {
		case most == 0:
			return nil, usageError(g, fs, "unexpected argument %q", pos[0]), false
		case least == most:
			return nil, usageError(g, fs, "want %d argument (%s), got %d", least, c.args, len(pos)), false
		}
		return nil, usageError(g, fs, "want %d to %d arguments (%s), got %d", least, most, c.args, len(pos)), false
	}
	return pos, exitOK, true
}

func usageError(g *globals, fs *flag.FlagSet, format string, a ...any) int {
	c := g.cmd
	fmt.Fprintf(g.stderr, "rdmanet %s: %s\n\n", c.name, fmt.Sprintf(format, a...))
	commandUsage(g.stderr, fs, c)
	return exitUsage
}

func commandUsage(w io.Writer, fs *flag.FlagSet, c *command) {
	line := "rdmanet " + c.name + " [flags]"
	if c.args != "" {
		line += " " + c.args
	}
	fmt.Fprintf(w, "Usage: %s\n\n%s.\n\nFlags:\n", line, upperFirst(c.summary))
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	sort.Strings(names)
	for _, n := range names {
		f := fs.Lookup(n)
		kind, help := flag.UnquoteUsage(f)
		head := "  -" + f.Name
		if kind != "" {
			head += " " + kind
		}
		def := ""
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			def = fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "%s\n    \t%s%s\n", head, help, def)
	}
	fmt.Fprint(w, "\n"+exitCodesHelp)
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
