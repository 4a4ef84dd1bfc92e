package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/rdmacore"
	"github.com/rdmanet/sdk/rdmanet"
)

// printer serializes lines written from several goroutines (serve's
// connections, ping's interrupt).
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) printf(format string, a ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, a...)
}

// writeJSON writes v as one indented JSON document.
func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// fallbackJSON is why a connection or a dial did not use RDMA.
type fallbackJSON struct {
	Reason      string `json:"reason"`      // fallback.Reason's stable string, e.g. "no-device"
	Description string `json:"description"` // Reason.Describe()
	Remembered  bool   `json:"remembered"`  // from an earlier dial to the same address
	Error       string `json:"error,omitempty"`
	Hint        string `json:"hint,omitempty"`
}

// fallbackOf finds the *fallback.Error in err, or nil.
func fallbackOf(err error) *fallbackJSON {
	var fe *fallback.Error
	if !errors.As(err, &fe) {
		return nil
	}
	out := &fallbackJSON{Reason: string(fe.Reason), Description: fe.Reason.Describe(), Remembered: fe.Remembered, Hint: fe.Reason.Hint()}
	if fe.Err != nil {
		out.Error = fe.Err.Error()
	}
	return out
}

// reasonOnly is a fallbackJSON for a reason found without an error value.
func reasonOnly(r fallback.Reason, err error) *fallbackJSON {
	out := &fallbackJSON{Reason: string(r), Description: r.Describe(), Hint: r.Hint()}
	if err != nil {
		out.Error = err.Error()
	}
	return out
}

// printFallback writes a fallback reason on indented lines: the reason, the
// error, the hint.
func printFallback(w io.Writer, indent string, f *fallbackJSON) {
	if f == nil {
		return
	}
	s := fmt.Sprintf("%sreason: %s: %s", indent, f.Reason, f.Description)
	if f.Remembered {
		s += " (remembered from an earlier dial to this address)"
	}
	fmt.Fprintln(w, s)
	if f.Error != "" {
		fmt.Fprintf(w, "%serror:  %s\n", indent, f.Error)
	}
	if f.Hint != "" {
		fmt.Fprintf(w, "%shint:   %s\n", indent, f.Hint)
	}
}

// policyFlag is a -policy flag: auto, rdma or tcp.
type policyFlag struct {
	p   fallback.Policy
	set bool
}

func (f *policyFlag) String() string { return f.p.String() }
func (f *policyFlag) Set(s string) error {
	p, err := fallback.ParsePolicy(s)
	if err != nil {
		return err
	}
	f.p, f.set = p, true
	return nil
}

// policyInfo is the policy a command asked for and the one in effect.
type policyInfo struct {
	Flag      string `json:"flag"`      // -policy: auto, rdma or tcp
	Network   string `json:"network"`   // "tcp" (may fall back) or "rdma" (RDMA only)
	Env       string `json:"env"`       // RDMANET_TRANSPORT's value, "" when unset
	Effective string `json:"effective"` // the policy dials and listens use
}

// effectivePolicy is the policy a dial or listen with p uses: with rdma the
// command uses network "rdma", which RDMANET_TRANSPORT does not override;
// otherwise fallback.Effective decides. A malformed RDMANET_TRANSPORT is an
// error (a usage error: the operator's setting cannot be understood).
func effectivePolicy(p fallback.Policy) (policyInfo, error) {
	info := policyInfo{Flag: p.String(), Network: "tcp", Env: os.Getenv(fallback.EnvPolicy), Effective: p.String()}
	if p == fallback.RDMAOnly {
		info.Network = "rdma"
		return info, nil
	}
	e, err := fallback.Effective(p)
	if err != nil {
		return info, err
	}
	info.Effective = e.String()
	return info, nil
}

func (pi policyInfo) human() string {
	s := pi.Effective
	switch {
	case pi.Network == "rdma":
		s += " (network rdma: RDMA only, " + fallback.EnvPolicy + " does not apply)"
	case pi.Env == "":
		s += " (" + fallback.EnvPolicy + " is not set)"
	case pi.Effective != pi.Flag:
		s += fmt.Sprintf(" (%s=%s overrides %s)", fallback.EnvPolicy, pi.Env, pi.Flag)
	default:
		s += fmt.Sprintf(" (%s=%s)", fallback.EnvPolicy, pi.Env)
	}
	return s
}

// dialFlags are the flags of the commands that dial.
type dialFlags struct {
	policy      policyFlag
	local       string
	timeout     time.Duration
	rdmaTimeout time.Duration
	resume      time.Duration // a resumable session's bound (0: none)
	failover    string        // the server's other addresses, comma-separated
	failback    time.Duration
	keepAlive   time.Duration
}

func (d *dialFlags) register(fs *flag.FlagSet, timeoutUse string) {
	fs.Var(&d.policy, "policy", "transport policy: `auto|rdma|tcp` (auto: RDMA, else TCP; rdma: RDMA only, on network rdma)")
	fs.StringVar(&d.local, "local", "", "local `IP` address to dial from (picks the RDMA device)")
	fs.DurationVar(&d.timeout, "timeout", 10*time.Second, "bound on the dial, and "+timeoutUse)
	fs.DurationVar(&d.rdmaTimeout, "rdma-timeout", time.Second, "how long a dial that may fall back waits for the peer's RDMA answer")
	fs.DurationVar(&d.resume, "resume", 0, "make the connection a resumable session that survives a failed path by resuming on another within `bound` (0: not a session; the server needs -resume too)")
	fs.StringVar(&d.failover, "failover", "", "the server's other `addresses`, comma-separated, for a session to resume on over RDMA (with -resume)")
	fs.DurationVar(&d.keepAlive, "keepalive", 0, "how often an idle connection checks its path (0: rdmanet's default, 3s); a dead path is found within 3 times this")
	fs.DurationVar(&d.failback, "failback", 0, "how often at most a session that moved off its first path tries to move back (0: rdmanet's default, 30s)")
}

// dialer builds the Dialer and the network to dial on. A bad -local is a
// usage error.
func (d *dialFlags) dialer() (rdmanet.Dialer, string, error) {
	dl := rdmanet.Dialer{Timeout: d.timeout, Policy: d.policy.p, RDMATimeout: d.rdmaTimeout}
	if d.resume < 0 || d.failback < 0 || d.keepAlive < 0 {
		return dl, "", fmt.Errorf("-resume, -failback and -keepalive: want 0 or more")
	}
	if (d.failover != "" || d.failback != 0) && d.resume == 0 {
		return dl, "", fmt.Errorf("-failover and -failback need -resume")
	}
	dl.Config.ResumeTimeout, dl.Config.FailbackInterval, dl.Config.KeepAlive = d.resume, d.failback, d.keepAlive
	if d.failover != "" {
		dl.FailoverAddrs = strings.Split(d.failover, ",")
	}
	if d.local != "" {
		ip, err := netip.ParseAddr(d.local)
		if err != nil {
			return dl, "", fmt.Errorf("-local %q: not an IP address", d.local)
		}
		dl.LocalAddr = &net.TCPAddr{IP: ip.AsSlice()}
	}
	network := "tcp"
	if d.policy.p == fallback.RDMAOnly {
		network = "rdma"
	}
	return dl, network, nil
}

// connInfo is the transport of a connection, and why not RDMA.
type connInfo struct {
	Transport fallback.Transport `json:"transport"` // "rdma" or "tcp"
	Fallback  *fallbackJSON      `json:"fallback"`  // null when RDMA is used
	Local     string             `json:"local"`
	Remote    string             `json:"remote"`
}

func connInfoOf(c net.Conn) connInfo {
	t, why := rdmanet.TransportOf(c)
	return connInfo{Transport: t, Fallback: fallbackOf(why), Local: c.LocalAddr().String(), Remote: c.RemoteAddr().String()}
}

// human is the transport on one line.
func (ci connInfo) human() string {
	if ci.Fallback == nil {
		return string(ci.Transport)
	}
	return fmt.Sprintf("%s (RDMA not used: %s)", ci.Transport, ci.Fallback.Reason)
}

// cancelOnDone unblocks c's I/O when ctx ends, by setting a deadline in the
// past. The returned function stops it, and returns only once a deadline
// being set has been set: a deadline the caller sets after it stays. It
// may be called more than once.
func cancelOnDone(ctx context.Context, c net.Conn) (stop func()) {
	set := make(chan struct{})
	stopFunc := context.AfterFunc(ctx, func() {
		defer close(set)
		c.SetDeadline(time.Unix(1, 0))
	})
	return sync.OnceFunc(func() {
		if !stopFunc() {
			<-set
		}
	})
}

// dialFailed reports a failed dial and returns its exit code (1).
func dialFailed(g *globals, err error) (*fallbackJSON, int) {
	f := fallbackOf(err)
	if !g.json {
		fmt.Fprintf(g.stderr, "rdmanet %s: %v\n", g.cmd.name, err)
		printFallback(g.stderr, "  ", f)
	}
	return f, exitFailure
}

// ms is a duration in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// iec formats a byte count with a binary unit.
func iec(n uint64) string { return rdmacore.IEC(int64(n)) }

// joinTransports lists transports as "rdma+tcp".
func joinTransports(ts []fallback.Transport) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, "+")
}
