package main

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestConns: `rdmanet conns` prints a program's list as a table, passes
// the JSON through with --json, finds the handler at rdmanet.ConnsPath
// when given host:port, and fails (1) on an answer that is not a list.
func TestConns(t *testing.T) {
	want := []rdmanet.ConnInfo{{
		Local: "198.18.0.1:40000", Remote: "198.18.0.2:7471", Transport: fallback.RDMA,
		Protocol: rdmanet.ProtocolRdmanet, Side: "dialed", Device: "rxe0", Port: 1, QP: 17,
		BytesSent: 1234, BytesReceived: 56, Idle: 1500 * time.Millisecond,
		Window: rdmanet.Window{SendSlots: 64, SendInFlight: 2, SendRing: 1 << 20, SendRingUsed: 4096, PeerRoom: 8192},
	}}
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path)
		if r.URL.Path == "/garbage" {
			w.Write([]byte("<html>not here</html>"))
			return
		}
		json.NewEncoder(w).Encode(want)
	}))
	defer srv.Close()
	hostPort := strings.TrimPrefix(srv.URL, "http://")

	code, out, errOut := runCmd(t, "conns", hostPort)
	if code != exitOK {
		t.Fatalf("conns %s: exit %d: %s", hostPort, code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "LOCAL") {
		t.Fatalf("want a header and one line, got:\n%s", out)
	}
	for _, field := range []string{"198.18.0.1:40000", "198.18.0.2:7471", "rdma/rdmanet", "rxe0/1", "17", "1234", "56", "2/64", "4096/1048576", "8192", "1.5s"} {
		if !strings.Contains(lines[1], field) {
			t.Errorf("line lacks %q: %s", field, lines[1])
		}
	}
	if len(paths) != 1 || paths[0] != rdmanet.ConnsPath {
		t.Errorf("asked %q, want %q", paths, rdmanet.ConnsPath)
	}

	var got []rdmanet.ConnInfo
	if code := runJSON(t, &got, "conns", srv.URL+"/elsewhere"); code != exitOK || len(got) != 1 || got[0] != want[0] {
		t.Errorf("--json: exit %d, %+v; want %+v", code, got, want)
	}
	if paths[len(paths)-1] != "/elsewhere" {
		t.Errorf("asked %q for a URL with a path", paths[len(paths)-1])
	}

	if code, _, errOut := runCmd(t, "conns", srv.URL+"/garbage"); code != exitFailure || !strings.Contains(errOut, "did not answer a list") {
		t.Errorf("an answer that is not a list: exit %d, %s", code, errOut)
	}
	for _, args := range [][]string{{"conns"}, {"conns", "ftp://x/y"}, {"conns", "a:1", "b:2"}} {
		if code, _, _ := runCmd(t, args...); code != exitUsage {
			t.Errorf("rdmanet %s: exit %d, want %d", strings.Join(args, " "), code, exitUsage)
		}
	}
}

// TestGroups: `rdmanet groups` asks the same handler for its groups view
// and prints it as a table, or passes the JSON through.
func TestGroups(t *testing.T) {
	want := []rdmanet.GroupInfo{{Side: "dialed", ID: "00000000000000aa", PeerProcess: "00000000000000bb", Streams: 50, Opened: 61, Moved: 7, LinksDown: 1,
		Links: []rdmanet.GroupLinkInfo{
			{Local: "198.18.0.1:40000", Remote: "198.18.0.2:7471", Device: "rxe0", Port: 1, QP: 17, Streams: 30, Pool: 2032, Granted: 400},
			{Local: "198.19.0.1:40001", Remote: "198.19.0.2:7471", Device: "rxe1", Port: 1, QP: 18, Streams: 20, Pool: 2032, Granted: 160},
		}}}
	var views []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		views = append(views, r.URL.Path+"?view="+r.URL.Query().Get("view"))
		json.NewEncoder(w).Encode(want)
	}))
	defer srv.Close()
	code, out, errOut := runCmd(t, "groups", strings.TrimPrefix(srv.URL, "http://"))
	if code != exitOK {
		t.Fatalf("groups: exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "LOCAL") {
		t.Fatalf("want a header and a line for each link, got:\n%s", out)
	}
	for i, fields := range [][]string{
		{"198.18.0.2:7471", "dialed", "rxe0/1", "17", "30/50", "61", "400/2032"},
		{"198.19.0.2:7471", "dialed", "rxe1/1", "18", "20/50", "61", "160/2032"},
	} {
		for _, field := range fields {
			if !strings.Contains(lines[1+i], field) {
				t.Errorf("line lacks %q: %s", field, lines[1+i])
			}
		}
	}
	if len(views) != 1 || views[0] != rdmanet.ConnsPath+"?view=groups" {
		t.Errorf("asked %q, want the groups view of %s", views, rdmanet.ConnsPath)
	}
	var got []rdmanet.GroupInfo
	if code := runJSON(t, &got, "groups", srv.URL); code != exitOK || !reflect.DeepEqual(got, want) {
		t.Errorf("--json: exit %d, %+v; want %+v", code, got, want)
	}
}

// TestServeDebug: serve -debug serves the connection list.
func TestServeDebug(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0") // a free port for -debug
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	startServe(t, "-policy", "tcp", "-addr", "127.0.0.1:0", "-debug", addr)
	var got []rdmanet.ConnInfo
	if code := runJSON(t, &got, "conns", addr); code != exitOK {
		t.Fatalf("conns against serve -debug %s: exit %d", addr, code)
	}
}
