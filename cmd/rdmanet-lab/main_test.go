//go:build linux

package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestFlagsStopAtCommand checks the property go test -exec relies on: flags
// after the command belong to the command. A command that does not exist
// fails before any VM boots.
func TestFlagsStopAtCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"-timeout", "1m", "rdmanet-no-such-command", "-test.v=true", "-bogus"}, &stdout, &stderr)
	if code != 127 {
		t.Errorf("exit code %d, want 127 (command not found); stderr:\n%s", code, &stderr)
	}
	if !strings.Contains(stderr.String(), "rdmanet-no-such-command") {
		t.Errorf("stderr does not name the command:\n%s", &stderr)
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"-h"}, 0},
		{nil, 2},
		{[]string{"-bogus"}, 2},
		{[]string{"-selfcheck", "sh"}, 2},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != tc.code {
			t.Errorf("rdmanet-lab %q: exit code %d, want %d", tc.args, code, tc.code)
		}
	}
	var stderr bytes.Buffer
	run([]string{"-h"}, &bytes.Buffer{}, &stderr)
	for _, want := range []string{"go test -exec", "198.18.0.1", "198.18.3.2", "rxe4", "lab-d", "RDMANET_LAB_ADDR_A2", "RDMANET_LAB_PLAIN_HOST", "RDMANET_LAB_IWARP_ADDR_B", "198.18.4.2", "siw1", "lab-i1", "-selfcheck", "-timeout"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("usage lacks %q", want)
		}
	}
	if strings.Contains(stderr.String(), "%!") {
		t.Errorf("usage has a formatting error:\n%s", &stderr)
	}
	if strings.Contains(stderr.String(), "-guest") {
		t.Error("usage shows the internal -guest flag")
	}
}
