package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/verbs"
)

// These tests run the command in-process through run and runContext. They
// pass on a host without RDMA and in the lab alike: where the outcome
// depends on the host, they work out what it must be.

// runCmd runs the command and returns its exit code and output.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

// runJSON runs the command with --json and decodes stdout into v.
func runJSON(t *testing.T, v any, args ...string) int {
	t.Helper()
	code, out, errOut := runCmd(t, append([]string{"--json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("rdmanet %s: stdout is not one JSON document: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return code
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"nope"},
		{"-nope", "devices"},
		{"devices", "extra"},
		{"devices", "-nope"},
		{"doctor"},
		{"doctor", "a:1", "b:2"},
		{"doctor", "no-port"},
		{"doctor", "-local", "not-an-ip", "127.0.0.1:1"},
		{"ping"},
		{"ping", "-c", "-1", "127.0.0.1:1"},
		{"ping", "-s", "0", "127.0.0.1:1"},
		{"ping", "-policy", "fast", "127.0.0.1:1"},
		{"ping", "-local", "nowhere", "127.0.0.1:1"},
		{"bench", "-d", "0s", "127.0.0.1:1"},
		{"bench", "-s", "100000000", "127.0.0.1:1"},
		{"ping", "-failover", "10.0.0.2", "127.0.0.1:1"},
		{"ping", "-resume", "-1s", "127.0.0.1:1"},
		{"bench", "-failback", "1s", "127.0.0.1:1"},
		{"serve", "-policy", "fast"},
		{"serve", "-resume", "-1s"},
		{"serve", "extra"},
		{"help", "nope"},
	} {
		code, out, errOut := runCmd(t, args...)
		if code != exitUsage {
			t.Errorf("rdmanet %q: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, exitUsage, out, errOut)
		}
		if out != "" || !strings.Contains(errOut, "Usage") {
			t.Errorf("rdmanet %q: want usage on stderr and nothing on stdout, got stdout %q, stderr %q", args, out, errOut)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}, {"help", "ping"}, {"ping", "-h"}, {"bench", "--help"}, {"help", "devices"}} {
		code, out, _ := runCmd(t, args...)
		if code != exitOK || !strings.Contains(out, "Exit codes:") || !strings.Contains(out, "Usage") {
			t.Errorf("rdmanet %q: exit %d, stdout %q; want 0 and the usage with the exit codes", args, code, out)
		}
	}
	_, out, _ := runCmd(t, "help", "ping")
	for _, flag := range []string{"-c count", "-s bytes", "-i interval", "-policy auto|rdma|tcp", "-local IP", "-require-rdma", "-json"} {
		if !strings.Contains(out, flag) {
			t.Errorf("rdmanet help ping does not list %s:\n%s", flag, out)
		}
	}
}

// TestDocumentedExitCodes keeps the package comment's exit codes the same
// as those the help prints.
func TestDocumentedExitCodes(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := strings.Cut(string(src), "\npackage main")
	for _, line := range strings.Split(strings.TrimSpace(exitCodesHelp), "\n")[1:] {
		if !strings.Contains(doc, "//\t"+strings.TrimSpace(line)+"\n") {
			t.Errorf("the package comment does not document %q", strings.TrimSpace(line))
		}
	}
}

// hostRDMA is what the host offers: the reason RDMA cannot be used, or "".
func hostRDMA() (fallback.Reason, error) {
	devs, err := verbs.Devices()
	if err == nil && len(devs) == 0 {
		err = verbs.ErrNoDevice
	}
	if err != nil {
		return fallback.Classify(err), err
	}
	return "", nil
}

func TestDevices(t *testing.T) {
	why, _ := hostRDMA()
	var out devicesJSON
	code := runJSON(t, &out, "devices")
	if labenv.InLab() || why == "" {
		if code != exitOK || !out.Usable || len(out.Devices) == 0 || out.Fallback != nil {
			t.Errorf("devices with RDMA: exit %d, %+v", code, out)
		}
	} else {
		if code != exitNoRDMA || out.Usable || out.Fallback == nil || out.Fallback.Reason != string(why) || out.Fallback.Hint == "" {
			t.Errorf("devices without RDMA: exit %d, fallback %+v; want %d and reason %s with a hint", code, out.Fallback, exitNoRDMA, why)
		}
		_, human, _ := runCmd(t, "devices")
		if !strings.Contains(human, "reason: "+string(why)) || !strings.Contains(human, why.Hint()) {
			t.Errorf("devices does not give the reason and its hint:\n%s", human)
		}
	}
	if out.ExitCode != code || out.Command != "devices" {
		t.Errorf("JSON exit_code %d, command %q; exit %d", out.ExitCode, out.Command, code)
	}
	l := out.Limits
	if l.Known && (l.LockedPerConn == 0 || l.LockedPerConn > 32<<10 || l.StreamingPerConn < 512<<10 || l.FDsPerConn != 0 || l.ConnsByNofile != -1 || l.Connections == 0) {
		t.Errorf("limits: %+v", l)
	}
	if l.Known && !l.CapIPCLock && l.MemlockHard >= 0 {
		left := l.MemlockHard - l.PinnedNow
		if l.ConnsByMemlock != left/int64(l.LockedPerConn) || l.StreamingConnsByMemlock != left/int64(l.StreamingPerConn) {
			t.Errorf("limits: %+v: with %d bytes left, want %d idle and %d streaming ends", l, left, left/int64(l.LockedPerConn), left/int64(l.StreamingPerConn))
		}
	}
	_, human, _ := runCmd(t, "devices")
	if l.Known && (!strings.Contains(human, "RLIMIT_MEMLOCK") || !strings.Contains(human, "RLIMIT_NOFILE")) {
		t.Errorf("devices does not show the limits:\n%s", human)
	}
	t.Logf("devices took %.1f ms\n%s", out.TookMS, human)
}

// loopbackStep is the step of fallback.Diagnose that fails for a loopback
// destination on this host.
func loopbackStep(why fallback.Reason) (string, fallback.Reason) {
	switch why {
	case "":
		return "route", fallback.ReasonRouteNoRDMA
	case fallback.ReasonNoDevice:
		return "devices", why
	}
	return "rdma-core", why
}

func TestDoctorLoopback(t *testing.T) {
	why, _ := hostRDMA()
	step, reason := loopbackStep(why)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := ln.Addr().String()

	var out doctorJSON
	code := runJSON(t, &out, "doctor", addr)
	if code != exitNoRDMA || out.ExitCode != code || out.RDMA || out.ChecksOK {
		t.Fatalf("doctor %s: exit %d, %+v; want %d and no RDMA", addr, code, out, exitNoRDMA)
	}
	last := out.Steps[len(out.Steps)-1]
	if last.OK || last.Name != step || last.Fallback == nil || last.Fallback.Reason != string(reason) {
		t.Errorf("doctor %s: last step %+v; want %q failing with %s", addr, last, step, reason)
	}
	for _, s := range out.Steps[:len(out.Steps)-1] {
		if !s.OK {
			t.Errorf("step %q failed before the last", s.Name)
		}
	}
	if d := out.Dial; d == nil || !d.OK || d.Transport != fallback.TCP || d.Fallback == nil || d.Fallback.Reason != string(reason) {
		t.Errorf("doctor %s: dial %+v; want tcp for %s", addr, out.Dial, reason)
	}
	if out.Fallback == nil || out.Fallback.Reason != string(reason) || out.Policy.Effective != "auto" {
		t.Errorf("doctor %s: verdict %+v, policy %+v", addr, out.Fallback, out.Policy)
	}

	if l := out.Limits; runtime.GOOS == "linux" && (!l.Known || l.NofileSoft == 0 || l.NofileOpen <= 0) {
		t.Errorf("doctor %s: limits %+v; want RLIMIT_NOFILE and the descriptors open", addr, l)
	}

	code, human, _ := runCmd(t, "doctor", addr)
	if code != exitNoRDMA || !strings.Contains(human, "FAIL  "+step) || !strings.Contains(human, reason.Hint()) || !strings.Contains(human, "verdict: TCP") ||
		!strings.Contains(human, "RLIMIT_NOFILE") {
		t.Errorf("doctor %s: exit %d, human output:\n%s", addr, code, human)
	}
	t.Logf("doctor %s:\n%s", addr, human)

	out = doctorJSON{}
	if code := runJSON(t, &out, "doctor", "--no-connect", addr); code != exitNoRDMA || out.Dial != nil {
		t.Errorf("doctor --no-connect: exit %d, dial %+v", code, out.Dial)
	}

	// The policy of the environment is reported and followed.
	t.Setenv(fallback.EnvPolicy, "tcp")
	out = doctorJSON{}
	code = runJSON(t, &out, "doctor", addr)
	if code != exitNoRDMA || out.Policy.Env != "tcp" || out.Policy.Effective != "tcp" || out.Fallback == nil || out.Fallback.Reason != string(fallback.ReasonPolicy) {
		t.Errorf("doctor with %s=tcp: exit %d, policy %+v, verdict %+v", fallback.EnvPolicy, code, out.Policy, out.Fallback)
	}
	t.Setenv(fallback.EnvPolicy, "sometimes")
	if code, _, errOut := runCmd(t, "doctor", addr); code != exitUsage || !strings.Contains(errOut, fallback.EnvPolicy) {
		t.Errorf("doctor with a malformed %s: exit %d, stderr %q", fallback.EnvPolicy, code, errOut)
	}
}

func TestDoctorNoListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var out doctorJSON
	if code := runJSON(t, &out, "doctor", addr); code != exitFailure || out.Error == "" || out.Dial == nil || out.Dial.OK {
		t.Errorf("doctor of a closed port: exit %d, %+v; want %d and the dial's error", code, out, exitFailure)
	}
}

// lines collects a writer's output and hands over each line.
type lines struct {
	mu   sync.Mutex
	buf  []byte
	all  []string
	each chan string
}

func newLines() *lines { return &lines{each: make(chan string, 1000)} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		s := string(l.buf[:i])
		l.buf = l.buf[i+1:]
		l.all = append(l.all, s)
		select {
		case l.each <- s:
		default:
		}
	}
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.all, "\n")
}

// serveProc is an in-process `rdmanet serve --json`.
type serveProc struct {
	addr      string
	listening serveEvent
	out       *lines
	stop      func() (code int, events []serveEvent)
}

func startServe(t *testing.T, args ...string) *serveProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := newLines()
	var errOut bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- runContext(ctx, append([]string{"--json", "serve"}, args...), out, &errOut) }()
	s := &serveProc{out: out}
	select {
	case line := <-out.each:
		if err := json.Unmarshal([]byte(line), &s.listening); err != nil || s.listening.Event != "listening" {
			cancel()
			t.Fatalf("serve's first line %q (%v), want the listening event", line, err)
		}
	case code := <-done:
		cancel()
		t.Fatalf("serve %q exited with %d: %s", args, code, errOut.String())
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("serve did not start listening")
	}
	s.addr = s.listening.Addr
	stopped := false
	s.stop = func() (int, []serveEvent) {
		cancel()
		code := <-done
		stopped = true
		var events []serveEvent
		for _, line := range strings.Split(out.String(), "\n") {
			var e serveEvent
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Errorf("serve wrote %q, not a JSON object: %v", line, err)
			}
			events = append(events, e)
		}
		return code, events
	}
	t.Cleanup(func() {
		if !stopped {
			s.stop()
		}
	})
	return s
}

func TestServePingBenchTCP(t *testing.T) {
	srv := startServe(t, "-addr", "127.0.0.1:0")
	if len(srv.listening.Transports) != 1 || srv.listening.Transports[0] != fallback.TCP || srv.listening.NoRDMA == nil {
		t.Errorf("serve on loopback: %+v; want tcp alone, with the reason", srv.listening)
	}

	var p pingJSON
	if code := runJSON(t, &p, "ping", "-c", "3", "-i", "10ms", "-s", "100", srv.addr); code != exitOK {
		t.Fatalf("ping: exit %d: %+v", code, p)
	}
	if p.Sent != 3 || p.Received != 3 || len(p.Samples) != 3 || p.Size != 100 || p.Transport != fallback.TCP || p.Fallback == nil || p.RTT == nil || p.Error != "" {
		t.Errorf("ping: %+v", p)
	}
	for i, s := range p.Samples {
		if s.Seq != i+1 || s.Bytes != 100 || s.TimeMS <= 0 {
			t.Errorf("sample %d: %+v", i, s)
		}
	}
	if r := p.RTT; r.Min > r.P50 || r.P50 > r.P99 || r.P99 > r.Max || r.Avg < r.Min || r.Avg > r.Max {
		t.Errorf("rtt: %+v", r)
	}

	code, human, _ := runCmd(t, "ping", "-c", "2", "-i", "0", srv.addr)
	if code != exitOK || !strings.Contains(human, "56 bytes from "+srv.addr+": seq=2 time=") || !strings.Contains(human, "rtt min/avg/p50/p99/max = ") || !strings.Contains(human, "transport: tcp") {
		t.Errorf("ping: exit %d:\n%s", code, human)
	}
	t.Logf("ping:\n%s", human)

	p = pingJSON{}
	if code := runJSON(t, &p, "ping", "-c", "1", "-require-rdma", srv.addr); code != exitNoRDMA || p.Received != 1 {
		t.Errorf("ping -require-rdma over TCP: exit %d, %+v", code, p)
	}
	p = pingJSON{}
	if code := runJSON(t, &p, "ping", "-c", "1", "-policy", "rdma", srv.addr); code != exitFailure || p.Fallback == nil || p.Sent != 0 {
		t.Errorf("ping -policy rdma without RDMA: exit %d, %+v; want %d and the reason", code, p, exitFailure)
	}

	var b benchJSON
	if code := runJSON(t, &b, "bench", "-d", "1500ms", "-s", "8192", srv.addr); code != exitOK {
		t.Fatalf("bench: exit %d: %+v", code, b)
	}
	if b.Transport != fallback.TCP || b.Bytes == 0 || b.ServerBytes == nil || *b.ServerBytes != b.Bytes || b.OpSize != 8192 ||
		b.Ops != b.Bytes/8192 || !progressEachSecond(b) || b.MBPerS <= 0 || b.Direction != "send" || b.Error != "" {
		t.Errorf("bench: %+v", b)
	}
	var sum uint64
	for _, iv := range b.Intervals {
		sum += iv.Bytes
	}
	if sum != b.Bytes {
		t.Errorf("bench: the intervals sum to %d bytes, the total is %d", sum, b.Bytes)
	}

	b = benchJSON{}
	if code := runJSON(t, &b, "bench", "-reverse", "-d", "1s", "-s", "4096", srv.addr); code != exitOK || b.Direction != "receive" || b.Bytes == 0 || b.Transport != fallback.TCP {
		t.Errorf("bench -reverse: exit %d, %+v", code, b)
	}
	code, human, _ = runCmd(t, "bench", "-d", "1s", srv.addr)
	if code != exitOK || !strings.Contains(human, "total") || !strings.Contains(human, "writes/s") || !strings.Contains(human, "transport: tcp") {
		t.Errorf("bench: exit %d:\n%s", code, human)
	}
	t.Logf("bench:\n%s", human)

	code, events := srv.stop()
	if code != exitOK {
		t.Errorf("serve stopped with %d", code)
	}
	accepted, closed := 0, 0
	for _, e := range events {
		switch e.Event {
		case "accepted":
			accepted++
			if e.Transport != fallback.TCP {
				t.Errorf("serve: %+v", e)
			}
		case "closed":
			closed++
			if e.Error != "" {
				t.Errorf("serve: connection ended with an error: %+v", e)
			}
		}
	}
	last := events[len(events)-1]
	// ping x3 (one with -policy rdma never connected), bench x3.
	if accepted != 6 || closed != 6 || last.Event != "stopped" || last.Connections[fallback.TCP] != 6 {
		t.Errorf("serve: %d accepted, %d closed, last %+v; want 6", accepted, closed, last)
	}
}

// progressEachSecond reports whether bench's progress lines are one per
// second and one for the last part of one: they follow each other from
// the start, the n-th ends at or after n seconds (except the last, which
// ends the run), and there is at least one. How many there are depends on
// how long single writes took, which a loaded machine stretches, so that
// is not counted.
func progressEachSecond(b benchJSON) bool {
	end := 0.0
	for i, iv := range b.Intervals {
		last := i == len(b.Intervals)-1
		if iv.StartS != end || iv.EndS < iv.StartS || (!last && iv.EndS < float64(i+1)) || (last && iv.EndS > b.Seconds) {
			return false
		}
		end = iv.EndS
	}
	return len(b.Intervals) > 0
}

// TestPingInterrupted: the context's end (SIGINT) stops ping, which prints
// its summary and succeeds.
func TestPingInterrupted(t *testing.T) {
	srv := startServe(t, "-addr", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	out := newLines()
	done := make(chan int, 1)
	go func() { done <- runContext(ctx, []string{"ping", "-i", "20ms", srv.addr}, out, &bytes.Buffer{}) }()
	waitReplies(t, out, 3, 10*time.Second)
	cancel()
	select {
	case code := <-done:
		if code != exitOK || !strings.Contains(out.String(), "interrupted") || !strings.Contains(out.String(), "rtt min/avg/p50/p99/max") {
			t.Errorf("interrupted ping: exit %d:\n%s", code, out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ping did not stop")
	}
}

// waitReplies waits until ping has printed n replies to out.
func waitReplies(t *testing.T, out *lines, n int, limit time.Duration) {
	t.Helper()
	for got := 0; got < n; {
		select {
		case line := <-out.each:
			if strings.Contains(line, "seq=") {
				got++
			}
		case <-time.After(limit):
			t.Fatalf("no replies:\n%s", out)
		}
	}
}

func TestPingNoServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var p pingJSON
	if code := runJSON(t, &p, "ping", "-c", "1", addr); code != exitFailure || p.Error == "" || p.ExitCode != exitFailure {
		t.Errorf("ping of a closed port: exit %d, %+v", code, p)
	}
	var b benchJSON
	if code := runJSON(t, &b, "bench", "-d", "1s", addr); code != exitFailure || b.Error == "" {
		t.Errorf("bench of a closed port: exit %d, %+v", code, b)
	}
}

func TestPercentile(t *testing.T) {
	v := make([]float64, 100)
	for i := range v {
		v[i] = float64(i + 1)
	}
	for p, want := range map[float64]float64{50: 50, 99: 99, 100: 100, 0: 1} {
		if got := percentile(v, p); got != want {
			t.Errorf("percentile(1..100, %v) = %v, want %v", p, got, want)
		}
	}
	if got := percentile([]float64{7}, 99); got != 7 {
		t.Errorf("percentile of one value = %v", got)
	}
}

func TestProtocolHeader(t *testing.T) {
	for _, m := range []byte{modePing, modeSink, modeSource} {
		mode, size, err := readHeader(bytes.NewReader(encodeHeader(m, 1234)))
		if err != nil || mode != m || size != 1234 {
			t.Errorf("header %c: %c %d %v", m, mode, size, err)
		}
	}
	if _, _, err := readHeader(bytes.NewReader(encodeHeader('X', 1))); err == nil {
		t.Error("an unknown mode was accepted")
	}
	if _, _, err := readHeader(bytes.NewReader(encodeHeader(modePing, 0))); err == nil {
		t.Error("size 0 was accepted")
	}
	if _, _, err := readHeader(bytes.NewReader([]byte{modePing})); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a short header: %v", err)
	}
}

// TestBenchInterrupted: an interrupted bench still half-closes and checks
// the server's count, within its short wait, however the interrupt's
// deadline and the count's fresh one meet.
func TestBenchInterrupted(t *testing.T) {
	srv := startServe(t, "-addr", "127.0.0.1:0")
	defer srv.stop()
	for i := range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		var out bytes.Buffer
		done := make(chan int, 1)
		go func() {
			done <- runContext(ctx, []string{"--json", "bench", "-d", "1m", "-s", "4096", srv.addr}, &out, io.Discard)
		}()
		time.Sleep(time.Duration(50+20*i) * time.Millisecond)
		cancel()
		select {
		case code := <-done:
			var b benchJSON
			if err := json.Unmarshal(out.Bytes(), &b); code != exitOK || err != nil || !b.Interrupted || b.ServerBytes == nil || *b.ServerBytes != b.Bytes {
				t.Fatalf("interrupted bench %d: exit %d (%v):\n%s", i, code, err, out.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("bench did not stop within 10 s of its interrupt")
		}
	}
}
