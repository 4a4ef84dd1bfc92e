package rdmanet_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// memlockPairsEnv, when set to "A B N T", makes the test binary a process
// that opens N connection pairs from A to B, both ends its own, with a
// round trip on each; then dials on "rdma" until a dial fails, dials once
// on "tcp" (if T is 1: a listener that serves both transports on one port
// cannot listen for iWARP), closes everything and reports each step on a
// line of its own (TestLabMemlockPairs reads them).
const memlockPairsEnv = "RDMANET_TEST_MEMLOCK_PAIRS"

// memlockPairs is how many pairs an ordinary container's 8 MiB of
// RLIMIT_MEMLOCK must hold, all RDMA (issue 24).
const memlockPairs = 100

func runMemlockPairs(args string) int {
	f := strings.Fields(args)
	n, _ := strconv.Atoi(f[2])
	listen := func(network string) *rdmanet.Listener {
		ln, err := rdmanet.Listen(network, netip.AddrPortFrom(netip.MustParseAddr(f[1]), 0).String())
		if err != nil {
			fmt.Println("listen:", err)
			os.Exit(1)
		}
		go echoOneAndHold(ln)
		return ln
	}
	ln := listen("rdma")
	defer ln.Close()
	d := rdmanet.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(f[0])}, Timeout: 30 * time.Second}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	roundTrip := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		var b [1]byte
		if _, err := c.Write([]byte{7}); err != nil {
			return err
		}
		_, err := io.ReadFull(c, b[:])
		return err
	}
	for i := range n {
		c, err := d.Dial("rdma", ln.Addr().String())
		if err != nil {
			fmt.Printf("pair %d: %v\n", i, err)
			return 1
		}
		conns = append(conns, c)
		if err := roundTrip(c); err != nil {
			fmt.Printf("pair %d round trip: %v\n", i, err)
			return 1
		}
	}
	fmt.Printf("pairs %d pinned %d\n", n, vmPin())
	// Beyond: the limit is met with an error that says so.
	var beyond error
	for i := 0; i < 4*n && beyond == nil; i++ {
		c, err := d.Dial("rdma", ln.Addr().String())
		if err != nil {
			beyond = err
			fmt.Printf("beyond after %d more: %v\n", i, err)
			break
		}
		conns = append(conns, c)
		if err := roundTrip(c); err != nil {
			beyond = err
			fmt.Printf("beyond after %d more (round trip): %v\n", i, err)
		}
	}
	if beyond == nil {
		fmt.Println("beyond: no dial failed")
	}
	// A dial on "tcp" falls back, for resources.
	if f[3] == "1" {
		both := listen("tcp")
		defer both.Close()
		if c, err := d.Dial("tcp", both.Addr().String()); err != nil {
			fmt.Println("tcp dial:", err)
		} else {
			tr, why := rdmanet.TransportOf(c)
			var fe *fallback.Error
			if errors.As(why, &fe) {
				fmt.Printf("tcp dial: %s %s\n", tr, string(fe.Reason))
			} else {
				fmt.Printf("tcp dial: %s\n", tr)
			}
			conns = append(conns, c)
		}
		both.Close()
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	ln.Close()
	for end := time.Now().Add(10 * time.Second); vmPin() != 0 && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Printf("after pinned %d\n", vmPin())
	return 0
}

// echoOneAndHold accepts until ln closes; each connection echoes its
// first byte, then is held until the peer closes it.
func echoOneAndHold(ln net.Listener) {
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

// vmPin is the process's pinned bytes (VmPin).
func vmPin() int { return procStatus("VmPin") }

// procStatus is a field of /proc/self/status in bytes (its kB figures), or
// -1.
func procStatus(field string) int {
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

// TestLabMemlockPairs: in a process limited as an ordinary container is
// (RLIMIT_MEMLOCK 8 MiB, no CAP_IPC_LOCK), 100 connection pairs (200
// ends, both in the process) are all RDMA, each with a round trip; the
// dials beyond meet an error that names the limit (or the server's
// refusal for resources, when its end hit it first), a dial on "tcp"
// falls back to TCP for resources, and everything pinned is given back.
func TestLabMemlockPairs(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, p := range []labenv.Pair{env.RoCE(), env.IWARP()} {
		t.Run(string(p.Provider), func(t *testing.T) {
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("prlimit", "--memlock=8388608:8388608", "--",
				"setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--", self)
			tcp := 0
			if p.Provider != labenv.ProviderSIW {
				tcp = 1
			}
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%v %v %d %d", memlockPairsEnv, p.AddrA, p.AddrB, memlockPairs, tcp))
			out, err := cmd.CombinedOutput()
			t.Logf("limited process:\n%s", out)
			if err != nil {
				t.Fatalf("limited process: %v", err)
			}
			lines := map[string]string{}
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				if k, v, ok := strings.Cut(sc.Text(), " "); ok && strings.Trim(k, ":") != "" {
					lines[strings.TrimSuffix(k, ":")] = v
				}
			}
			if !strings.HasPrefix(lines["pairs"], fmt.Sprint(memlockPairs)+" ") {
				t.Fatalf("the limited process did not hold %d pairs", memlockPairs)
			}
			beyond := lines["beyond"]
			if !strings.Contains(beyond, "RLIMIT_MEMLOCK") && !strings.Contains(beyond, "refused") {
				t.Errorf("the dial beyond the limit failed with %q, want an error naming RLIMIT_MEMLOCK or the server's refusal for resources", beyond)
			}
			if got := lines["tcp"]; tcp == 1 && got != "dial: tcp resources" {
				t.Errorf("a tcp dial beyond the limit: %q, want a fallback to TCP for resources", got)
			}
			if after := lines["after"]; after != "pinned 0" {
				t.Errorf("after closing: %q, want nothing pinned", after)
			}
		})
	}
}
