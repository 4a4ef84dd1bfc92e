package rdmanet_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
	"github.com/rdmanet/sdk/verbs"
)

// TestLabSharedRecv: a listener whose connections take their receives from
// a shared receive queue per device and peer (with credit grants) serves
// 64 connections streaming 256 KiB each way at once, every byte intact
// (SHA-256 at both ends), with one shared queue for all where 64 would
// each keep receives of their own, and gives everything back at the close.
// On siw (iWARP), where a queue of its own is the rule, the same listener
// keeps receives of each connection's own.
func TestLabSharedRecv(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, p := range env.Pairs() {
		t.Run(p.Provider, func(t *testing.T) {
			checkLeaks(t)
			// siw only shows that it keeps receives of its own: a few pairs.
			pairs, size := 64, 256<<10
			if p.Provider == labenv.ProviderSIW {
				pairs = 8
			}
			srqsBefore := verbs.Resources().SRQs
			lc := rdmanet.ListenConfig{Config: rdmanet.WithSharedRecv(rdmanet.Config{})}
			ln, err := lc.Listen(context.Background(), "rdma", netip.AddrPortFrom(p.AddrB, 0).String())
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var mu sync.Mutex
			var served []*rdmanet.Conn
			// echoed is each server end's count at its peer's EOF, by the
			// client's address: a short echo says which way bytes were lost.
			echoed := map[string]string{}
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					served = append(served, c.(*rdmanet.Conn))
					mu.Unlock()
					go func() {
						defer c.Close()
						n, err := io.Copy(c, c)
						if err != nil {
							t.Errorf("server: %v", err)
						}
						mu.Lock()
						echoed[c.RemoteAddr().String()] = fmt.Sprintf("the server end echoed %d bytes (%v) before its peer's EOF; %+v", n, err, c.(*rdmanet.Conn).Info())
						mu.Unlock()
						c.(*rdmanet.Conn).CloseWrite()
					}()
				}
			}()
			d := rdmanet.Dialer{LocalAddr: &rdmanet.Addr{AddrPort: netip.AddrPortFrom(p.AddrA, 0)}, Timeout: time.Minute}
			conns := make([]net.Conn, pairs)
			for i := range conns {
				if conns[i], err = d.Dial("rdma", ln.Addr().String()); err != nil {
					t.Fatalf("dial %d: %v", i, err)
				}
				defer conns[i].Close()
			}
			// Every connection accepted, before any closes.
			for end := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
				mu.Lock()
				n := len(served)
				mu.Unlock()
				if n == pairs || time.Now().After(end) {
					break
				}
			}
			mu.Lock()
			shared := 0
			for _, c := range served {
				if rdmanet.SharedRecv(c) {
					shared++
				}
			}
			mu.Unlock()
			srqs := verbs.Resources().SRQs - srqsBefore
			t.Logf("%s: %d of %d accepted connections on shared receive queues, %d queues", p.Provider, shared, pairs, srqs)
			switch {
			case p.Provider == labenv.ProviderSIW && (shared != 0 || srqs != 0):
				t.Errorf("siw: %d connections on %d shared receive queues, want none", shared, srqs)
			case p.Provider == labenv.ProviderRXE && (shared != pairs || srqs != 3):
				t.Errorf("rxe: %d of %d connections on %d shared receive queues, want all on 3 (of 255, 511 and 1,023 receives: 15, 31 and 63 first grants of 16)", shared, pairs, srqs)
			}
			var wg sync.WaitGroup
			errs := make(chan error, pairs)
			for i, c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c.SetDeadline(time.Now().Add(5 * time.Minute))
					src := make([]byte, size)
					rand.NewChaCha8([32]byte{byte(i)}).Read(src)
					wrote := make(chan error, 1)
					go func() {
						_, err := c.Write(src)
						wrote <- errors.Join(err, c.(*rdmanet.Conn).CloseWrite())
					}()
					h := sha256.New()
					n, err := io.Copy(h, c)
					werr := <-wrote
					if err != nil || werr != nil || n != int64(size) || [32]byte(h.Sum(nil)) != sha256.Sum256(src) {
						mu.Lock()
						server := echoed[c.LocalAddr().String()]
						mu.Unlock()
						errs <- fmt.Errorf("connection %d: %d bytes back (%v), intact: %v; the Write and CloseWrite: %v; %+v; %s",
							i, n, err, n == int64(size) && [32]byte(h.Sum(nil)) == sha256.Sum256(src), werr, c.(*rdmanet.Conn).Info(), server)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}
