package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var serving = regexp.MustCompile(`serving .* on (\S+) over \[`)

// startServe runs `blockstore serve` on a loopback port (through
// rdmanet.Listen, which serves TCP here) until the test ends, and returns
// its address.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, logs := new(syncBuffer), new(syncBuffer)
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"serve", "-addr", "127.0.0.1:0"}, args...), out, logs) }()
	t.Cleanup(func() {
		cancel()
		if rc := <-done; rc != 0 {
			t.Errorf("serve exited %d: %s%s", rc, out, logs)
		}
		switch {
		case strings.Contains(logs.String(), "level=ERROR") || strings.Contains(logs.String(), "level=WARN"):
			t.Errorf("the server logged:\n%s", logs)
		case t.Failed():
			t.Logf("the server's output:\n%s%s", out, logs) // what it saw of the failure
		}
	})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := serving.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case rc := <-done:
			done <- rc
			t.Fatalf("serve exited %d: %s%s", rc, out, logs)
		default:
		}
	}
	t.Fatalf("the server did not start: %s%s", out, logs)
	return ""
}

// runCommand runs a blockstore command to its end.
func runCommand(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	rc := run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), rc
}

var benchLine = regexp.MustCompile(`(?m)^(\S+) (.+), queue depth (\d+): (\d+) requests in \S+: ([0-9.]+) MiB/s, (\d+) IOPS; latency mean \S+, p50 \S+, p99 \S+, max \S+$`)

// TestBench: `blockstore bench` runs each kind of workload against
// `blockstore serve` and reports it.
func TestBench(t *testing.T) {
	addr := startServe(t, "-mem", "16M")
	for _, rw := range []string{"randwrite", "write", "read", "randread"} {
		out, errOut, rc := runCommand(t, "bench", "-addr", addr, "-rw", rw, "-bs", "64k", "-qd", "8", "-bytes", "8M", "-duration", "30s")
		if rc != 0 {
			t.Fatalf("bench -rw %s: exit %d\n%s%s", rw, rc, out, errOut)
		}
		m := benchLine.FindStringSubmatch(out)
		if m == nil || m[1] != rw || m[2] != "64 KiB" || m[3] != "8" || m[4] != "128" {
			t.Fatalf("bench -rw %s printed:\n%s", rw, out)
		}
		if !regexp.MustCompile(`export of 16 MiB at ` + regexp.QuoteMeta(addr) + ` over (tcp|rdma)`).MatchString(out) {
			t.Errorf("bench -rw %s does not say what it connected to:\n%s", rw, out)
		}
	}
}

// TestBenchJSON: `bench -json` prints one JSON object whose figures agree
// with each other and with the run asked for.
func TestBenchJSON(t *testing.T) {
	addr := startServe(t, "-mem", "16M")
	out, errOut, rc := runCommand(t, "bench", "-addr", addr, "-local", "127.0.0.1", "-rw", "write", "-bs", "64k", "-qd", "4", "-bytes", "8M", "-duration", "30s", "-json")
	if rc != 0 {
		t.Fatalf("bench -json: exit %d\n%s%s", rc, out, errOut)
	}
	var r benchResult
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("bench -json printed %q: %v", out, err)
	}
	if dec.More() {
		t.Errorf("bench -json printed more than one object: %q", out)
	}
	if r.Transport != "tcp" || r.FellBackBecause == "" || r.RW != "write" || r.BlockSize != 64<<10 || r.QueueDepth != 4 ||
		r.Requests != 128 || r.Bytes != 8<<20 || r.Error != "" {
		t.Errorf("bench -json: %+v", r)
	}
	if l := r.LatencyNS; !(r.Seconds > 0 && r.BytesPerSecond > 0 && 0 < l.P50 && l.P50 <= l.P99 && l.P99 <= l.Max && l.Mean <= l.Max) {
		t.Errorf("bench -json figures do not add up: %+v", r)
	}
	if got := float64(r.Bytes) / r.Seconds; got < r.BytesPerSecond*0.99 || got > r.BytesPerSecond*1.01 {
		t.Errorf("bytes_per_second %v, but %d bytes in %vs", r.BytesPerSecond, r.Bytes, r.Seconds)
	}
}

// TestServeFile: a file export's writes reach the file by the time the
// server stops, and -size creates the file.
func TestServeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk")
	ctx, cancel := context.WithCancel(context.Background())
	out, logs := new(syncBuffer), new(syncBuffer)
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "-addr", "127.0.0.1:0", "-file", path, "-size", "4M"}, out, logs)
	}()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := serving.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("the server did not start: %s%s", out, logs)
	}
	if !strings.Contains(out.String(), "serving "+path+" (4 MiB)") {
		t.Errorf("serve printed %q", out)
	}
	if o, e, rc := runCommand(t, "bench", "-addr", addr, "-rw", "write", "-bs", "1M", "-qd", "2", "-bytes", "4M"); rc != 0 {
		t.Fatalf("bench: exit %d\n%s%s", rc, o, e)
	}
	cancel()
	if rc := <-done; rc != 0 {
		t.Fatalf("serve exited %d: %s%s", rc, out, logs)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != 4<<20 || bytes.Equal(data[:1<<20], make([]byte, 1<<20)) {
		t.Fatalf("the file is %d bytes, its first MiB zero: %v", len(data), bytes.Equal(data[:1<<20], make([]byte, 1<<20)))
	}
	// The file exists now; a different -size is refused.
	if _, e, rc := runCommand(t, "serve", "-addr", "127.0.0.1:0", "-file", path, "-size", "8M"); rc != 1 || !strings.Contains(e, "exists with 4194304 bytes") {
		t.Errorf("serve with a different -size: exit %d, %s", rc, e)
	}
}

// TestUsage: wrong uses exit 2 and say why.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"nonsense"},
		{"serve"},
		{"serve", "-mem", "1M", "-file", "x"},
		{"serve", "-mem", "lots"},
		{"serve", "-mem", "1M", "-size", "1M"},
		{"bench", "-rw", "sideways"},
		{"bench", "-bs", "64M"},
		{"bench", "-duration", "0"},
		{"bench", "extra"},
		{"bench", "-local", "host"},
		{"bridge"},
		{"bridge", "-to", "127.0.0.1:1", "-local", "1.2.3.4:5"},
	} {
		if _, errOut, rc := runCommand(t, args...); rc != 2 || errOut == "" {
			t.Errorf("%q: exit %d, stderr %q", args, rc, errOut)
		}
	}
}

// TestSizes: parseSize and formatSize.
func TestSizes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "512": 512, "4k": 4096, "4K": 4096, "4KiB": 4096, "4kb": 4096,
		"64M": 64 << 20, "1G": 1 << 30, "2T": 2 << 40, " 8m ": 8 << 20,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "k", "-1", "1.5M", "4X", "9999999999T"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, no error", in, got)
		}
	}
	for in, want := range map[int64]string{
		0: "0 bytes", 1000: "1000 bytes", 4096: "4 KiB", 1536: "1.5 KiB", 64 << 20: "64 MiB", 1 << 40: "1 TiB",
	} {
		if got := formatSize(in); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", in, got, want)
		}
	}
}
