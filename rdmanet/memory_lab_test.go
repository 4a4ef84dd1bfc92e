//go:build linux

package rdmanet_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// memlockMemoryEnv, when set to "A B", makes the test binary a process
// that writes from registered memory over a connection from A to B, both
// ends its own: first from a Memory larger than RLIMIT_MEMLOCK, then
// from a small one; TestLabMemoryPastMemlock reads its report.
const memlockMemoryEnv = "RDMANET_TEST_MEMLOCK_MEMORY"

// runMemlockMemory reports, one line each: "big SENT COPIED" and "small
// SENT COPIED" (the Memories' Stats after a WriteFrom of 1 MiB each, read
// back whole by the peer), and "after PINNED" once both are closed with
// the connection.
func runMemlockMemory(args string) int {
	f := strings.Fields(args)
	if err := memlockMemory(f[0], f[1]); err != nil {
		fmt.Println("memlock memory:", err)
		return 1
	}
	return 0
}

func memlockMemory(a, b string) error {
	ln, err := rdmanet.Listen("rdma", net.JoinHostPort(b, "0"))
	if err != nil {
		return err
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	// A connection of its own: its domain, and the memory's registration
	// on it, go with it (a group's link outlives its streams a while).
	d := rdmanet.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(a)}, Config: rdmanet.Config{NoLinkGroups: true}}
	c, err := d.Dial("rdma", net.JoinHostPort(b, port))
	if err != nil {
		return err
	}
	s, ok := <-accepted
	if !ok {
		return fmt.Errorf("accept failed")
	}
	rc, ok := c.(*rdmanet.Conn)
	if !ok {
		return fmt.Errorf("dial got %T, not RDMA", c)
	}
	for _, tc := range []struct {
		name string
		size int
	}{{"big", 2 * benchkit.MemlockLimit}, {"small", 1 << 20}} {
		m, err := rdmanet.NewMemory(tc.size)
		if err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() {
			_, err := io.CopyN(io.Discard, s, 1<<20)
			done <- err
		}()
		if _, err := rc.WriteFrom(m, m.Bytes()[:1<<20]); err != nil {
			return fmt.Errorf("%s: WriteFrom: %w", tc.name, err)
		}
		if err := <-done; err != nil {
			return fmt.Errorf("%s: read: %w", tc.name, err)
		}
		st := m.Stats()
		fmt.Printf("%s %d %d\n", tc.name, st.Sent, st.Copied)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = m.Close(ctx)
		cancel()
		if err != nil {
			return err
		}
	}
	c.Close()
	s.Close()
	deadline := time.Now().Add(15 * time.Second)
	for vmPin() > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("after %d\n", vmPin())
	return nil
}

// TestLabMemoryPastMemlock: in a process limited as an ordinary
// container is (RLIMIT_MEMLOCK 8 MiB, no CAP_IPC_LOCK), a Memory larger
// than the limit cannot be registered, and WriteFrom copies it all; a
// small one is then registered (in the background, copied meanwhile) and
// sent from; nothing stays pinned.
func TestLabMemoryPastMemlock(t *testing.T) {
	env := labenv.RequireRDMA(t)
	p := env.RoCE()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := benchkit.MemlockCommand(self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%v %v", memlockMemoryEnv, p.AddrA, p.AddrB))
	out, err := cmd.CombinedOutput()
	t.Logf("limited process:\n%s", out)
	if err != nil {
		t.Fatalf("limited process: %v", err)
	}
	var bigSent, bigCopied, smallSent, smallCopied, after int
	for _, l := range strings.Split(string(out), "\n") {
		fmt.Sscanf(l, "big %d %d", &bigSent, &bigCopied)
		fmt.Sscanf(l, "small %d %d", &smallSent, &smallCopied)
		fmt.Sscanf(l, "after %d", &after)
	}
	if bigSent != 0 || bigCopied != 1<<20 {
		t.Errorf("past the limit: %d sent from memory, %d copied; want all copied", bigSent, bigCopied)
	}
	// The registration is made in the background, the first bytes copied
	// meanwhile: it takes under a millisecond, the MiB tens of them.
	if smallSent == 0 || smallSent+smallCopied != 1<<20 {
		t.Errorf("within the limit: %d sent from memory, %d copied; want the MiB sent from it once registered", smallSent, smallCopied)
	}
	if after != 0 {
		t.Errorf("after closing: %d bytes pinned, want none", after)
	}
}
