package labenv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServerClient runs ServerClient with sh and sleep in place of an
// RDMA tool: a client that fails while its server starts is tried again;
// one that hangs is killed, and the pair runs afresh, three times at most.
func TestServerClient(t *testing.T) {
	defer func(d time.Duration) { clientHang = d }(clientHang)
	ctx := context.Background()
	var logged []string
	logf := func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) }

	// The first client finds no server yet; the second one is served. The
	// server runs until a client was served, as rping's does (a server
	// that ends on a timer of its own is a race on a busy host).
	clientHang = time.Minute // a hang guard here: sh may start slowly on a busy host
	dir := t.TempDir()
	tried, served := filepath.Join(dir, "tried"), filepath.Join(dir, "served")
	out, err := ServerClient(ctx, []string{"sh", "-c", "until test -e " + served + "; do sleep 0.05; done"},
		[]string{"sh", "-c", "test -e " + tried + " || { touch " + tried + "; exit 1; }; touch " + served + "; echo served"}, logf)
	if err != nil || out != "served\n" || len(logged) != 0 {
		t.Fatalf("a client that failed once: %q, %v, logged %q", out, err, logged)
	}

	// A client that hangs every time: three runs, two reported, then the error.
	clientHang = 300 * time.Millisecond
	_, err = ServerClient(ctx, []string{"sleep", "5"}, []string{"sleep", "5"}, logf)
	var hung *hangError
	if !errors.As(err, &hung) || len(logged) != 2 || !strings.Contains(logged[0], "client hung") {
		t.Fatalf("a client that hangs: %v, logged %q; want a hang error after 2 reported hangs", err, logged)
	}

	// One that fails for good is not taken for a hang.
	clientHang = time.Minute
	logged = nil
	_, err = ServerClient(ctx, []string{"sleep", "5"}, []string{"false"}, logf)
	if err == nil || errors.As(err, &hung) || len(logged) != 0 || !strings.Contains(err.Error(), "client: exit status 1") {
		t.Fatalf("a client that fails: %v, logged %q", err, logged)
	}
}
