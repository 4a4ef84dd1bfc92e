//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/lossless"
	"github.com/rdmanet/sdk/internal/portstat"
)

// The lossless checks and stat on the lab's Soft-RoCE: rxe runs over a
// veth, which has no DCB support, so PFC must come out as "cannot tell".

func findLossless(t *testing.T, ls []losslessJSON, dev string) losslessJSON {
	t.Helper()
	for _, l := range ls {
		if l.Device == dev {
			return l
		}
	}
	t.Fatalf("no lossless check for %s in %+v", dev, ls)
	return losslessJSON{}
}

func finding(fs []lossless.Finding, check string) lossless.Finding {
	for _, f := range fs {
		if f.Check == check {
			return f
		}
	}
	return lossless.Finding{}
}

func TestLabLosslessCannotTell(t *testing.T) {
	env := labenv.RequireRDMA(t)
	var doc doctorJSON
	runJSON(t, &doc, "doctor", "--no-connect", netip.AddrPortFrom(env.AddrB, 1).String())
	l := findLossless(t, doc.Lossless, env.DevA)
	if l.Protocol != lossless.RoCE || l.Netdev != "lab-a" || l.Config == nil {
		t.Fatalf("doctor's check of %s: %+v", env.DevA, l)
	}
	pfc := finding(l.Findings, "pfc")
	if pfc.Status != lossless.CannotTell || !strings.Contains(pfc.Detail, "no DCB support") {
		t.Errorf("PFC on rxe over a veth: %+v, want cannot tell and why", pfc)
	}
	// The veth has driver statistics (ethtool -S), none of pause frames.
	if c := l.Config.Counters; c.Total == 0 || finding(l.Findings, "counters").Status != lossless.CannotTell {
		t.Errorf("counters of lab-a: %+v, %+v", c, finding(l.Findings, "counters"))
	}
	for _, f := range l.Findings {
		if f.Status == lossless.OK {
			t.Errorf("a check that cannot be made on a veth says ok: %+v", f)
		}
	}
	_, human, _ := runCmd(t, "doctor", "--no-connect", netip.AddrPortFrom(env.AddrB, 1).String())
	if !strings.Contains(human, "cannot tell  pfc") {
		t.Errorf("doctor does not show the PFC check:\n%s", human)
	}
	t.Logf("doctor:\n%s", human)

	var dev devicesJSON
	runJSON(t, &dev, "devices")
	if f := finding(findLossless(t, dev.Lossless, env.DevB).Findings, "pfc"); f.Status != lossless.CannotTell {
		t.Errorf("devices' PFC check of %s: %+v", env.DevB, f)
	}
	_, human, _ = runCmd(t, "devices")
	if !strings.Contains(human, "lossless network") || !strings.Contains(human, "cannot tell  pfc") {
		t.Errorf("devices does not show the lossless check:\n%s", human)
	}
}

// TestLabStat: stat on rxe0 while bench streams over RDMA from A to B
// shows packet counters moving, as rates. stat starts once the server has
// accepted bench's connection over RDMA, and bench streams until stat is
// done: a dial slowed by a busy host must not leave stat watching an idle
// device (CI saw that once, with nothing to tell why).
func TestLabStat(t *testing.T) {
	env := labenv.RequireRDMA(t)
	srv := startServe(t, "-addr", netip.AddrPortFrom(env.AddrB, 0).String())
	defer srv.stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var benchOut, benchErr bytes.Buffer
	benchDone := make(chan int, 1)
	go func() {
		benchDone <- runContext(ctx, append([]string{"--json", "bench", "-d", "2m", "-local", env.AddrA.String(), "-require-rdma"}, append(labAnswerWait, srv.addr)...), &benchOut, &benchErr)
	}()
	for accepted := false; !accepted; {
		select {
		case line := <-srv.out.each:
			var e serveEvent
			if json.Unmarshal([]byte(line), &e) == nil && e.Event == "accepted" {
				if e.Transport != fallback.RDMA {
					// bench's output says why it fell back.
					cancel()
					select {
					case code := <-benchDone:
						t.Fatalf("the server (%+v) accepted bench's connection over %s: %s\nbench: exit %d:\n%s\n%s", srv.listening, e.Transport, line, code, benchOut.String(), benchErr.String())
					case <-time.After(30 * time.Second):
						t.Fatalf("the server accepted bench's connection over %s: %s\nbench did not stop within 30 s of its interrupt", e.Transport, line)
					}
				}
				accepted = true
			}
		case code := <-benchDone:
			t.Fatalf("bench ended with exit %d before stat ran:\n%s\n%s", code, benchOut.String(), benchErr.String())
		case <-time.After(60 * time.Second):
			t.Fatal("the server accepted no connection from bench in 60 s")
		}
	}
	code, out, errOut := runCmd(t, "--json", "stat", "-i", "1s", "-n", "3", env.DevA)
	cancel() // bench, interrupted, half-closes and checks the server's count
	if code != exitOK {
		t.Fatalf("stat: exit %d: %s", code, errOut)
	}
	moved := false
	var busiest statJSON // the interval whose packets moved most, to show
	most := 0.0
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s statJSON
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil || len(s.Ports) != 1 || s.Ports[0].Error != "" {
			t.Fatalf("stat line %q: %v", sc.Text(), err)
		}
		for _, r := range s.Ports[0].Rates {
			if r.Source == portstat.SourceHW && strings.Contains(r.Name, "pkts") && r.Delta > 0 && r.PerSecond != nil && *r.PerSecond > 0 {
				moved = true
				if *r.PerSecond > most {
					most, busiest = *r.PerSecond, s
				}
			}
		}
		if p := s.Ports[0]; p.Netdev != "lab-a" || len(p.Lacks) == 0 {
			t.Errorf("stat of %s: netdev %q, lacks %v", env.DevA, p.Netdev, p.Lacks)
		}
	}
	if !moved {
		t.Errorf("no packet counter of %s moved while bench ran:\n%s", env.DevA, out)
	}
	if moved {
		// The human form of the same interval shows the rate.
		var b bytes.Buffer
		printStat(&b, &busiest, true)
		if !strings.Contains(b.String(), fmt.Sprintf("%.1f", most)) {
			t.Errorf("the human output does not show the rate %.1f:\n%s", most, b.String())
		}
		t.Logf("stat during bench:\n%s", b.String())
	}
	select {
	case code := <-benchDone:
		var b benchJSON
		if err := json.Unmarshal(benchOut.Bytes(), &b); code != exitOK || err != nil || !b.Interrupted || b.Transport != fallback.RDMA || b.Bytes == 0 {
			t.Errorf("bench, interrupted: exit %d (%v):\n%s\n%s", code, err, benchOut.String(), benchErr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("bench did not stop within 30 s of its interrupt")
	}
	code, human, _ := runCmd(t, "stat", "-i", "500ms", "-n", "1", env.DevA)
	if code != exitOK || !strings.Contains(human, "per second") || !strings.Contains(human, "has no counter for") {
		t.Errorf("stat: exit %d:\n%s", code, human)
	}
	t.Logf("stat:\n%s", human)
}
