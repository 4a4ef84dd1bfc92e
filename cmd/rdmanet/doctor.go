package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
	"github.com/rdmanet/sdk/verbs"
)

// doctorJSON is `rdmanet doctor --json`.
type doctorJSON struct {
	Command  string     `json:"command"` // "doctor"
	Addr     string     `json:"addr"`    // as given
	Resolved string     `json:"resolved"`
	Local    string     `json:"local"` // --local, "" when routing picks
	Policy   policyInfo `json:"policy"`
	Steps    []stepJSON `json:"steps"` // fallback.Diagnose's, in order; the last fails if any does
	ChecksOK bool       `json:"checks_ok"`
	Dial     *dialJSON  `json:"dial"` // null with --no-connect
	// Lossless is the lossless-network check of every RDMA port of this
	// host; a warning there does not change the verdict or exit code.
	Lossless []losslessJSON `json:"lossless"`
	// Limits bound how many RDMA connections a process can hold.
	Limits limitsJSON `json:"limits"`
	// The verdict: whether a dial to Addr uses RDMA, and if not, why.
	RDMA     bool          `json:"rdma"`
	Fallback *fallbackJSON `json:"fallback"`
	Error    string        `json:"error,omitempty"` // a failure that is not about RDMA (resolution, TCP)
	ExitCode int           `json:"exit_code"`
}

type stepJSON struct {
	Name     string        `json:"name"` // "rdma-core", "devices", "source address", "route"
	Detail   string        `json:"detail"`
	OK       bool          `json:"ok"`
	Fallback *fallbackJSON `json:"fallback"` // why the step fails, or null
}

type dialJSON struct {
	OK        bool               `json:"ok"` // a connection was made, over either transport
	Transport fallback.Transport `json:"transport"`
	Fallback  *fallbackJSON      `json:"fallback"` // why not RDMA, or null
	Local     string             `json:"local,omitempty"`
	Remote    string             `json:"remote,omitempty"`
	TookMS    float64            `json:"took_ms"`
	Error     string             `json:"error,omitempty"` // the dial failed
}

func runDoctor(ctx context.Context, g *globals, fs *flag.FlagSet, args []string) int {
	local := fs.String("local", "", "local `IP` address to dial from (rdmanet.Dialer.LocalAddr)")
	noConnect := fs.Bool("no-connect", false, "only the checks that send nothing: do not dial")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on the dial")
	rdmaTimeout := fs.Duration("rdma-timeout", time.Second, "how long the dial waits for the peer's RDMA answer before it falls back")
	pos, code, ok := parse(g, fs, args, 1)
	if !ok {
		return code
	}
	addr := pos[0]
	out := doctorJSON{Command: "doctor", Addr: addr, Local: *local, Steps: []stepJSON{}, Lossless: []losslessJSON{}, Limits: readLimits()}
	var src netip.Addr
	if *local != "" {
		var err error
		if src, err = netip.ParseAddr(*local); err != nil {
			return usageError(g, fs, "-local %q: not an IP address", *local)
		}
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usageError(g, fs, "%q: want host:port (%v)", addr, err)
	}
	pol, err := effectivePolicy(fallback.Auto)
	if err != nil {
		fmt.Fprintf(g.stderr, "rdmanet doctor: %v\n", err)
		return exitUsage
	}
	out.Policy = pol

	finish := func(code int) int {
		out.ExitCode = code
		if g.json {
			writeJSON(g.stdout, out)
		} else {
			printDoctor(g.stdout, &out)
		}
		return code
	}

	dst, err := resolve(ctx, host, port)
	if err != nil {
		out.Error = err.Error()
		return finish(exitFailure)
	}
	out.Resolved = dst.String()

	steps := fallback.Diagnose(dst, src)
	out.ChecksOK = true
	for _, s := range steps {
		sj := stepJSON{Name: s.Name, Detail: s.Detail, OK: s.Err == nil}
		if s.Err != nil {
			sj.Fallback = fallbackOf(s.Err)
			out.ChecksOK = false
			out.Fallback = sj.Fallback
		}
		out.Steps = append(out.Steps, sj)
	}
	if pol.Effective == fallback.TCPOnly.String() {
		out.Fallback = reasonOnly(fallback.ReasonPolicy, nil)
	}
	out.RDMA = out.Fallback == nil
	links, _ := verbs.Links() // an error leaves no ports to check
	out.Lossless = checkLossless(links)

	if *noConnect {
		if out.RDMA {
			return finish(exitOK)
		}
		return finish(exitNoRDMA)
	}

	// A fresh attempt: forget what earlier dials of this process learned.
	rdmanet.ForgetFailures()
	d := rdmanet.Dialer{Timeout: *timeout, Policy: fallback.Auto, RDMATimeout: *rdmaTimeout}
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	start := time.Now()
	c, err := d.DialContext(ctx, "tcp", dst.String())
	dj := &dialJSON{TookMS: ms(time.Since(start))}
	out.Dial = dj
	if err != nil {
		dj.Error = err.Error()
		dj.Fallback = fallbackOf(err)
		out.RDMA = false
		if dj.Fallback != nil {
			// RDMA was required (RDMANET_TRANSPORT=rdma) and could not be used.
			out.Fallback = dj.Fallback
			return finish(exitNoRDMA)
		}
		out.Error = err.Error()
		return finish(exitFailure)
	}
	ci := connInfoOf(c)
	c.Close()
	dj.OK, dj.Transport, dj.Fallback, dj.Local, dj.Remote = true, ci.Transport, ci.Fallback, ci.Local, ci.Remote
	out.RDMA = ci.Transport == fallback.RDMA
	if out.RDMA {
		out.Fallback = nil
		return finish(exitOK)
	}
	if dj.Fallback != nil {
		out.Fallback = dj.Fallback
	}
	return finish(exitNoRDMA)
}

// resolve turns host and port into one address, as rdmanet's dial does
// (the first address of the name).
func resolve(ctx context.Context, host, port string) (netip.AddrPort, error) {
	p, err := net.DefaultResolver.LookupPort(ctx, "tcp", port)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if host == "" {
		return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(p)), nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return netip.AddrPortFrom(ip.Unmap(), uint16(p)), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(ips) == 0 {
		return netip.AddrPort{}, errors.New("no address for " + host)
	}
	return netip.AddrPortFrom(ips[0].Unmap(), uint16(p)), nil
}

func printDoctor(w io.Writer, out *doctorJSON) {
	fmt.Fprintf(w, "rdmanet doctor %s", out.Addr)
	if out.Resolved != "" && out.Resolved != out.Addr {
		fmt.Fprintf(w, " (%s)", out.Resolved)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "policy: %s\n", out.Policy.human())
	if len(out.Steps) > 0 {
		fmt.Fprintln(w, "checks:")
	}
	var failed *fallbackJSON
	for _, s := range out.Steps {
		if s.Fallback != nil {
			failed = s.Fallback
		}
		mark := "ok  "
		if !s.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s  %-15s %s\n", mark, s.Name, orDash(s.Detail))
		printFallback(w, "        ", s.Fallback)
	}
	printLossless(w, out.Lossless)
	printLimits(w, out.Limits)
	if dj := out.Dial; dj != nil {
		fmt.Fprintln(w, "dial (network tcp, auto policy):")
		switch {
		case !dj.OK:
			fmt.Fprintf(w, "  FAIL  after %.1f ms: %s\n", dj.TookMS, dj.Error)
			printFallback(w, "        ", dj.Fallback)
		default:
			mark := "ok  "
			if dj.Transport != fallback.RDMA {
				mark = "tcp "
			}
			fmt.Fprintf(w, "  %s  connected over %s in %.1f ms, %s -> %s\n", mark, dj.Transport, dj.TookMS, dj.Local, dj.Remote)
			if f := dj.Fallback; f != nil && failed != nil && f.Reason == failed.Reason && !f.Remembered {
				fmt.Fprintf(w, "        reason: %s, as the checks found\n", f.Reason)
			} else {
				printFallback(w, "        ", f)
			}
		}
	}
	switch {
	case out.Error != "" && out.Dial == nil:
		fmt.Fprintf(w, "verdict: cannot tell: %s\n", out.Error)
	case out.Error != "" && out.Fallback != nil:
		fmt.Fprintf(w, "verdict: no connection to %s (and RDMA would not be used: %s): %s\n", out.Addr, out.Fallback.Reason, out.Error)
	case out.Error != "":
		fmt.Fprintf(w, "verdict: no connection to %s: %s\n", out.Addr, out.Error)
	case out.RDMA && out.Dial == nil:
		fmt.Fprintf(w, "verdict: RDMA: every check passed; a dial to %s would try RDMA (--no-connect: not tried)\n", out.Addr)
	case out.RDMA:
		fmt.Fprintf(w, "verdict: RDMA: a dial to %s uses RDMA\n", out.Addr)
	case out.Dial != nil && out.Dial.OK:
		fmt.Fprintf(w, "verdict: TCP: a dial to %s falls back to TCP (%s)\n", out.Addr, reasonName(out.Fallback))
	case out.Dial != nil:
		fmt.Fprintf(w, "verdict: no RDMA: a dial to %s cannot use RDMA (%s) and may not fall back\n", out.Addr, reasonName(out.Fallback))
	default:
		fmt.Fprintf(w, "verdict: TCP: a dial to %s would fall back to TCP (%s)\n", out.Addr, reasonName(out.Fallback))
	}
}

func reasonName(f *fallbackJSON) string {
	if f == nil {
		return "no reason given"
	}
	return f.Reason
}
