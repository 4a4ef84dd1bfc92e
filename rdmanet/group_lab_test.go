package rdmanet_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
	"github.com/rdmanet/sdk/verbs"
)

// hangGuard bounds the waits of TestLabGroups: it only turns a hang into
// a failure.
const hangGuard = 2 * time.Minute

// listenAndDialer listens on "rdma" at b with cfg, and returns the
// listener and a dialer from a with cfg whose dials take up to timeout.
func listenAndDialer(a, b netip.Addr, cfg rdmanet.Config, timeout time.Duration) (*rdmanet.Listener, rdmanet.Dialer, error) {
	lc := rdmanet.ListenConfig{Config: cfg}
	ln, err := lc.Listen(context.Background(), "rdma", netip.AddrPortFrom(b, 0).String())
	d := rdmanet.Dialer{LocalAddr: &rdmanet.Addr{AddrPort: netip.AddrPortFrom(a, 0)}, Timeout: timeout, Config: cfg}
	return ln, d, err
}

// listenerPair dials ln with d and returns the two ends, ln's Accept's
// second: connections one listener makes one after another, as a server
// takes them (with rdmanet's default Config, streams of one link group).
func listenerPair(ln *rdmanet.Listener, d rdmanet.Dialer) (client, server net.Conn, err error) {
	type result struct {
		c   net.Conn
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		accepted <- result{c, err}
	}()
	client, err = d.Dial("rdma", ln.Addr().String())
	if err != nil {
		// The connection may still be accepted (the answer came after
		// the dial gave up): close it then, or it holds its group, and
		// every later leak check fails.
		go func() {
			if r := <-accepted; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, nil, fmt.Errorf("dial %v: %w", ln.Addr(), err)
	}
	r := <-accepted
	if r.err != nil {
		client.Close()
		return nil, nil, r.err
	}
	return client, r.c, nil
}

// TestLabGroups: with link groups at both ends, on rxe and on siw, every
// connection after the first is a stream of one RDMA connection: 50
// connections open at once still hold the group's two queue pairs (one at
// each end) and no more (nettest passes on a group's streams on every data
// path in TestLabDataPaths). Once the
// listener and the connections close, the group goes too.
func TestLabGroups(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, p := range env.Pairs() {
		t.Run(p.Provider, func(t *testing.T) {
			checkLeaks(t)
			ln, d, err := listenAndDialer(p.AddrA, p.AddrB, rdmanet.Config{}, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			// The group, made by a first connection: the 50 below use it.
			c1, c2, err := listenerPair(ln, d)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []net.Conn{c1, c2} {
				if !rdmanet.GroupStream(c.(*rdmanet.Conn)) {
					t.Errorf("%v to %v is not a group's stream", c.LocalAddr(), c.RemoteAddr())
				}
			}
			c1.Close()
			c2.Close()

			before := rdmanet.ReadMetrics()
			// 50 dials at once; each server end echoes what it reads, and
			// each client reads back what it wrote: every pair is joined.
			const conns = 50
			var wg sync.WaitGroup
			clients := make([]net.Conn, conns)
			for i := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := d.Dial("rdma", ln.Addr().String())
					if err != nil {
						t.Error(err)
						return
					}
					clients[i] = c
					c.SetDeadline(time.Now().Add(hangGuard))
					msg := []byte{byte(i), 1, 2, 3}
					got := make([]byte, len(msg))
					if _, err := c.Write(msg); err != nil {
						t.Error(err)
					} else if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
						t.Errorf("connection %d: read back %x, %v (%+v)", i, got, err, c.(*rdmanet.Conn).Info())
					}
				}()
			}
			// A hang guard: a listener closed ends the Accepts below.
			guard := time.AfterFunc(hangGuard, func() { ln.Close() })
			defer guard.Stop()
			var servers []net.Conn
			for range conns {
				c, err := ln.Accept()
				if err != nil {
					t.Fatal(err)
				}
				servers = append(servers, c)
				if !rdmanet.GroupStream(c.(*rdmanet.Conn)) {
					t.Errorf("accepted %v is not a group's stream", c.RemoteAddr())
				}
				go io.CopyN(c, c, 4)
			}
			wg.Wait()
			if t.Failed() {
				t.Logf("groups: %+v", rdmanet.Groups())
			}
			if qps := verbs.Resources().QPs; qps != 2 {
				t.Errorf("%d queue pairs with %d connections open, want the group's 2", qps, conns)
			}
			// Both ends of the one group are this process's; the first
			// pair's streams go as their connections finish closing.
			var groups []rdmanet.GroupInfo
			sides := map[string]int{}
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				groups, sides = rdmanet.Groups(), map[string]int{}
				for _, g := range groups {
					sides[g.Side] += g.Streams
				}
				if len(groups) == 2 && sides["dialed"] == conns && sides["accepted"] == conns || time.Now().After(deadline) {
					break
				}
			}
			if len(groups) != 2 || sides["dialed"] != conns || sides["accepted"] != conns {
				t.Errorf("groups %+v: want one at each end, each with the %d streams", groups, conns)
			}
			for _, g := range groups {
				if len(g.Links) != 1 || g.Links[0].Device == "" || g.Links[0].QP == 0 || g.ID == "" || g.PeerProcess == "" {
					t.Errorf("group without its one link's device, or unnamed: %+v", g)
				}
			}
			m := rdmanet.ReadMetrics()
			for _, side := range []string{"dialed", "accepted"} {
				if got := m.GroupStreams[side] - before.GroupStreams[side]; got != conns {
					t.Errorf("%d streams %s counted, want %d", got, side, conns)
				}
				if m.Groups[side] != before.Groups[side] {
					t.Errorf("%d more groups %s: the 50 connections should use the one there was", m.Groups[side]-before.Groups[side], side)
				}
			}
			for _, c := range append(clients, servers...) {
				if c != nil {
					c.Close()
				}
			}
		})
	}
}
