//go:build linux

package rdmanet

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/wire"
)

// TestLabSessionHijack: requests to resume a live session that present a
// guessed id, or its id with a wrong generation (a replay, a guess), over
// RDMA and over TCP from the session's own reserved port, are refused and
// counted, and the session goes on untouched.
func TestLabSessionHijack(t *testing.T) {
	env := labenv.RequireRDMA(t)
	cfg := Config{KeepAlive: time.Second, ResumeTimeout: 30 * time.Second}
	lc := ListenConfig{Config: cfg}
	ln, err := lc.Listen(context.Background(), "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dst := netip.AddrPortFrom(env.AddrB, ln.Addr().(*net.TCPAddr).AddrPort().Port())
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	d := Dialer{LocalAddr: &Addr{AddrPort: netip.AddrPortFrom(env.AddrA, 0)}, Config: cfg}
	nc, err := d.Dial("rdma", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	client := nc.(*Conn)
	defer client.Close()
	server := <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	defer server.Close()
	full, _ := cfg.withDefaults()
	mem, err := newRingMem(full)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.close()

	forge := func(id wire.SessionID, gen uint32) wire.Hello {
		h := full.helloOf(client.eng.Features())
		h.Resume, h.Session, h.Generation, h.TCPPort = true, id, gen, client.sess.Hello().TCPPort
		return h
	}
	var guessed wire.SessionID
	rand.Read(guessed[:])
	real, gen := client.sess.ID(), client.sess.Snapshot().Generation
	tries := map[string]wire.Hello{
		"guessed id":       forge(guessed, 0),
		"stale generation": forge(real, gen+1),
		"replayed older":   forge(real, gen+0xffff),
	}
	refused := 0
	for name, h := range tries {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if l, _, err := dialResume(ctx, env.AddrA, dst, full, mem, h); !errors.Is(err, ErrSessionRefused) {
			if l != nil {
				l.Close()
			}
			t.Errorf("rdma, %s: %v; want refused", name, err)
		}
		refused++
		if l, _, err := dialTCPResume(ctx, mem, int(client.sess.Hello().TCPPort), env.AddrA, dst, full, h); !errors.Is(err, ErrSessionRefused) {
			if l != nil {
				l.Close()
			}
			t.Errorf("tcp, %s: %v; want refused", name, err)
		}
		refused++
		cancel()
	}
	if st := ln.Stats(); st.RefusedResumes != uint64(refused) || st.Resumes != 0 {
		t.Errorf("listener %+v; want %d refused resumes", st, refused)
	}
	// The session is untouched.
	for _, c := range [][2]net.Conn{{client, server}, {server, client}} {
		if _, err := c[0].Write([]byte("still here")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 10)
		c[1].SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(c[1], b); err != nil {
			t.Fatalf("after the tries: %v", err)
		}
	}
	if st := client.Session(); st.Failovers != 0 || st.Suspended || st.Generation != gen {
		t.Errorf("session %+v after refused hijacks", st)
	}
}
