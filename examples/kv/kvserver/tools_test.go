package kvserver

import (
	"context"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
)

// requireTool returns the path of a command-line tool from a Debian
// package, skipping the test if it is not installed, unless
// RDMANET_REQUIRE_TOOLS is set (as where the project's Debian packages are
// installed, and in the lab), which makes that a failure.
func requireTool(t *testing.T, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("RDMANET_REQUIRE_TOOLS") != "" || labenv.InLab() {
		t.Fatalf("%s not found (Debian package %s): %v", name, pkg, err)
	}
	t.Skipf("%s not found (Debian package %s; set RDMANET_REQUIRE_TOOLS to make this a failure): %v", name, pkg, err)
	return ""
}

// startRedis starts a real Redis server on a free loopback port, without
// persistence and with one database as kv has, for the test's duration, and
// returns its address.
func startRedis(t *testing.T) string {
	t.Helper()
	server := requireTool(t, "redis-server", "redis-server")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	ln.Close()
	cmd := exec.Command(server, "--bind", "127.0.0.1", "--port", strconv.Itoa(addr.Port),
		"--save", "", "--appendonly", "no", "--databases", "1", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.Dial("tcp", addr.String())
		if err == nil {
			c.Close()
			return addr.String()
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not start on %v: %v", addr, err)
		}
	}
}

// runTool runs a tool with a time limit and returns its standard output.
func runTool(t *testing.T, path string, args ...string) string {
	t.Helper()
	return runToolInput(t, "", path, args...)
}

// runToolInput runs a tool with input as its standard input.
func runToolInput(t *testing.T, input, path string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdin = strings.NewReader(input)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %q: %v\nstdout:\n%s\nstderr:\n%s", path, args, err, out, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("%s %q wrote to stderr:\n%s", path, args, stderr.String())
	}
	return string(out)
}

func port(t *testing.T, addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRedisBenchmark: redis-benchmark, pipelining 16 requests, runs every
// test to the end and reports a rate for each (it stops at the first error
// reply, with a non-zero exit).
func TestRedisBenchmark(t *testing.T) {
	bench := requireTool(t, "redis-benchmark", "redis-tools")
	ts := startServer(t, Options{})
	out := runTool(t, bench, "-h", "127.0.0.1", "-p", port(t, ts.addr),
		"-n", "2000", "-c", "10", "-P", "16", "-t", "ping,set,get,incr,mset", "-q")
	// With -q each test ends with "NAME: N requests per second, ...", after
	// progress lines that end in \r.
	rate := regexp.MustCompile(`(?m)^([A-Z_]+(?: \(10 keys\))?): ([0-9.]+) requests per second`)
	var tests []string
	for _, m := range rate.FindAllStringSubmatch(strings.ReplaceAll(out, "\r", "\n"), -1) {
		tests = append(tests, m[1])
	}
	want := []string{"PING_INLINE", "PING_MBULK", "SET", "GET", "INCR", "MSET (10 keys)"}
	if strings.Join(tests, ",") != strings.Join(want, ",") {
		t.Fatalf("redis-benchmark reported rates for %q, want %q; output:\n%s", tests, want, out)
	}
	if strings.Contains(out, "WARNING") || strings.Contains(out, "Error") {
		t.Errorf("redis-benchmark complained:\n%s", out)
	}
	// INCR ran on one key: 2000 times, from 0.
	if got := dialRaw(t, ts.addr).do("GET", "counter:__rand_int__"); got != "2000" {
		t.Errorf("after the INCR test the counter is %v, want 2000", got)
	}
}

// TestRedisCLI: redis-cli, in its one-command mode and reading commands from
// its standard input.
func TestRedisCLI(t *testing.T) {
	cli := requireTool(t, "redis-cli", "redis-tools")
	ts := startServer(t, Options{})
	p := port(t, ts.addr)
	if out := runTool(t, cli, "-h", "127.0.0.1", "-p", p, "SET", "a", "b"); out != "OK\n" {
		t.Errorf("redis-cli SET a b: %q", out)
	}
	if out := runTool(t, cli, "-h", "127.0.0.1", "-p", p, "GET", "a"); out != "b\n" {
		t.Errorf("redis-cli GET a: %q", out)
	}
	if out := runTool(t, cli, "-h", "127.0.0.1", "-p", p, "GET", "missing"); out != "\n" {
		t.Errorf("redis-cli GET missing: %q", out)
	}
	if out := runTool(t, cli, "-h", "127.0.0.1", "-p", p, "INCRBY", "n", "5"); out != "5\n" {
		t.Errorf("redis-cli INCRBY n 5: %q", out)
	}
	if out := runTool(t, cli, "-h", "127.0.0.1", "-p", p, "MGET", "a", "n", "missing"); out != "b\n5\n\n" {
		t.Errorf("redis-cli MGET: %q", out)
	}
	// PERSIST rather than TTL, whose answer depends on how much time passed
	// between the two commands (100 or, after half a second, 99).
	script := "SET x 1\nINCR x\nGET x\nEXPIRE x 100\nPERSIST x\nDBSIZE\nFOO bar\n"
	want := "OK\n2\n2\n1\n1\n3\nERR unknown command 'FOO', with args beginning with: 'bar' \n\n"
	if out := runToolInput(t, script, cli, "-h", "127.0.0.1", "-p", p); out != want {
		t.Errorf("redis-cli with commands on its standard input:\n%q\nwant\n%q", out, want)
	}
}
