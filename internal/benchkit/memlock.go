package benchkit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
)

// What an ordinary container allows (issue 24): RLIMIT_MEMLOCK of 8 MiB
// and no CAP_IPC_LOCK. MemlockCommand runs a program so limited;
// MemlockPairsConfig, run in it, opens connection pairs until the limit, and
// ParseMemlock reads what it printed. rdmanet's lab test and make bench's
// connections section both use them.

// MemlockLimit is the limit MemlockCommand sets, in bytes.
const MemlockLimit = 8 << 20

// MemlockCommand is name with args, run under RLIMIT_MEMLOCK of
// MemlockLimit without CAP_IPC_LOCK (prlimit and setpriv, from util-linux).
func MemlockCommand(name string, args ...string) *exec.Cmd {
	return exec.Command("prlimit", append([]string{fmt.Sprintf("--memlock=%d:%d", MemlockLimit, MemlockLimit), "--",
		"setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--", name}, args...)...)
}

// MemlockResult is what MemlockPairsConfig reported.
type MemlockResult struct {
	Pairs       int    // pairs opened over RDMA, each with a round trip
	PairsPinned int    // bytes pinned (VmPin) with them open
	PairErr     string // why the next of the pairs asked for failed, if one did
	Beyond      int    // more pairs opened before a dial failed
	BeyondErr   string // that dial's error
	TCP         string // a dial on "tcp" then: "tcp resources" if it fell back for resources
	After       int    // bytes pinned after closing everything; -1 if not reported
}

// GroupsEndBound bounds how long a process's link groups take to end
// once their streams and listener closed, and so to give back what they
// pinned. A connection of its own goes within its linger (5 s). A group's
// link goes once the listener's group ended with its last stream, which
// disconnects it (under -race with the host loaded, 100 and 176 streams'
// closes took more than 10 and 15 s), and at the latest with the
// dialer's group, a minute after its last stream (docs/engine.md,
// "Lifetime"): that bound, and some slack.
const GroupsEndBound = 75 * time.Second

// MemlockPairsConfig opens pairs connection pairs from a to b with cfg
// on both sides (make bench gives every connection a queue pair of its
// own, NoLinkGroups; the test also runs the default Config), each with a
// round trip; then dials on "rdma" until a dial fails (at most 4 x pairs
// more); then, if tcp, dials once on "tcp" (a listener that serves both
// transports on one port cannot listen for iWARP); closes everything and
// waits up to GroupsEndBound for nothing to be pinned. It reports each
// step on a line of its own to out, for ParseMemlock.
func MemlockPairsConfig(a, b netip.Addr, pairs int, tcp bool, cfg rdmanet.Config, out io.Writer) error {
	listen := func(network string) (*rdmanet.Listener, error) {
		lc := rdmanet.ListenConfig{Config: cfg}
		ln, err := lc.Listen(context.Background(), network, netip.AddrPortFrom(b, 0).String())
		if err != nil {
			return nil, err
		}
		go EchoOneAndHold(ln)
		return ln, nil
	}
	ln, err := listen("rdma")
	if err != nil {
		return err
	}
	defer ln.Close()
	d := rdmanet.Dialer{LocalAddr: &net.TCPAddr{IP: a.AsSlice()}, Timeout: 30 * time.Second, Config: cfg}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	open := func() error {
		c, err := d.Dial("rdma", ln.Addr().String())
		if err != nil {
			return err
		}
		conns = append(conns, c)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		var b [1]byte
		if _, err := c.Write([]byte{7}); err != nil {
			return fmt.Errorf("round trip: %w", err)
		}
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return fmt.Errorf("round trip: %w", err)
		}
		return nil
	}
	opened := 0
	for ; opened < pairs; opened++ {
		if err := open(); err != nil {
			fmt.Fprintf(out, "pairerr: %v\n", oneLine(err))
			break
		}
	}
	fmt.Fprintf(out, "pairs: %d %d\n", opened, ProcStatus("VmPin"))
	if opened == pairs {
		more := 0
		for ; more < 4*pairs; more++ {
			if err := open(); err != nil {
				fmt.Fprintf(out, "beyond: %d %v\n", more, oneLine(err))
				break
			}
		}
		if more == 4*pairs {
			fmt.Fprintf(out, "beyond: %d no dial failed\n", more)
		}
	}
	if tcp {
		both, err := listen("tcp")
		if err != nil {
			fmt.Fprintf(out, "tcp: listen: %v\n", oneLine(err))
		} else {
			if c, err := d.Dial("tcp", both.Addr().String()); err != nil {
				fmt.Fprintf(out, "tcp: dial: %v\n", oneLine(err))
			} else {
				tr, why := rdmanet.TransportOf(c)
				var fe *fallback.Error
				if errors.As(why, &fe) {
					fmt.Fprintf(out, "tcp: %s %s\n", tr, string(fe.Reason))
				} else {
					fmt.Fprintf(out, "tcp: %s\n", tr)
				}
				c.Close()
			}
			both.Close()
		}
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	ln.Close()
	for end := time.Now().Add(GroupsEndBound); ProcStatus("VmPin") != 0 && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintf(out, "after: %d\n", ProcStatus("VmPin"))
	for _, g := range rdmanet.Groups() {
		// What holds memory still, if a group does.
		fmt.Fprintf(out, "group left: %+v\n", g)
	}
	return nil
}

// ParseMemlock reads MemlockPairsConfig's report.
func ParseMemlock(report string) MemlockResult {
	r := MemlockResult{After: -1}
	sc := bufio.NewScanner(strings.NewReader(report))
	for sc.Scan() {
		key, v, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		n, rest, _ := strings.Cut(v, " ")
		switch key {
		case "pairerr":
			r.PairErr = v
		case "pairs":
			r.Pairs, _ = strconv.Atoi(n)
			r.PairsPinned, _ = strconv.Atoi(rest)
		case "beyond":
			r.Beyond, _ = strconv.Atoi(n)
			r.BeyondErr = rest
		case "tcp":
			r.TCP = v
		case "after":
			r.After, _ = strconv.Atoi(n)
		}
	}
	return r
}

// EchoOneAndHold accepts until ln closes; each connection echoes its
// first byte, then is held until the peer closes it.
func EchoOneAndHold(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var b [1]byte
			if _, err := io.ReadFull(c, b[:]); err == nil {
				c.Write(b[:])
			}
			io.Copy(io.Discard, c)
		}()
	}
}

// ProcStatus is a field of /proc/self/status in bytes (its kB
// figures), or -1.
func ProcStatus(field string) int {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kib, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return kib << 10
		}
	}
	return -1
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " ") }
