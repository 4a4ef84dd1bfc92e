package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeRXE lays out an rxe port's hw_counters under a temporary sysfs root
// and points stat at it.
func fakeRXE(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "rxe9", "ports", "1", "hw_counters")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"sent_pkts", "rcvd_pkts", "out_of_seq_request", "rcvd_seq_err", "completer_retry_err", "rcvd_rnr_err", "send_rnr_err"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("7\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := statSysfsRoot
	statSysfsRoot = root
	t.Cleanup(func() { statSysfsRoot = old })
}

func TestStatFakeSysfs(t *testing.T) {
	fakeRXE(t)
	code, out, errOut := runCmd(t, "--json", "stat", "-i", "10ms", "-n", "2", "rxe9")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	lines := 0
	for sc.Scan() {
		lines++
		var s statJSON
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("line %d is not JSON: %v\n%s", lines, err, sc.Text())
		}
		if s.Command != "stat" || len(s.Ports) != 1 || s.Ports[0].Device != "rxe9" || s.Ports[0].Error != "" {
			t.Fatalf("line %d: %+v", lines, s)
		}
		p := s.Ports[0]
		if len(p.Rates) != 7 || p.Seconds <= 0 {
			t.Errorf("line %d: %d counters over %v s", lines, len(p.Rates), p.Seconds)
		}
		for _, r := range p.Rates {
			if r.Value != 7 || r.Delta != 0 || r.PerSecond == nil || *r.PerSecond != 0 {
				t.Errorf("a counter that did not move: %+v", r)
			}
		}
		if !slices.Contains(p.Lacks, "local-ack-timeout") || !slices.Contains(p.Lacks, "pause") || slices.Contains(p.Lacks, "out-of-sequence") {
			t.Errorf("lacks %v", p.Lacks)
		}
	}
	if lines != 2 {
		t.Errorf("%d JSON lines for -n 2:\n%s", lines, out)
	}

	code, human, _ := runCmd(t, "stat", "-i", "10ms", "-n", "1")
	if code != exitOK || !strings.Contains(human, "rxe9 port 1") || !strings.Contains(human, "requests received out of sequence") ||
		!strings.Contains(human, "has no counter for: local-ack-timeout") {
		t.Errorf("human output (exit %d):\n%s", code, human)
	}
	if code, _, errOut := runCmd(t, "stat", "-n", "1", "mlx5_7"); code != exitNoRDMA || !strings.Contains(errOut, "mlx5_7") {
		t.Errorf("an unknown device: exit %d, %s", code, errOut)
	}
	for _, bad := range [][]string{{"stat", "-i", "0"}, {"stat", "-n", "-1"}, {"stat", "a", "b"}} {
		if code, _, _ := runCmd(t, bad...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", bad, code, exitUsage)
		}
	}
}
