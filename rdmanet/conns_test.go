package rdmanet

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/internal/wire"
)

// findConn returns the listed connection from local to remote.
func findConn(conns []ConnInfo, local, remote string) (ConnInfo, bool) {
	for _, c := range conns {
		if c.Local == local && c.Remote == remote {
			return c, true
		}
	}
	return ConnInfo{}, false
}

// TestConnectionsListsLiveConns: both ends of a pair are listed once
// established, with their protocol, side and the bytes each way; they
// leave the list when Close returns.
func TestConnectionsListsLiveConns(t *testing.T) {
	for _, m := range hostModes {
		t.Run(m.name, func(t *testing.T) {
			goroutineCheck(t)
			client, server, _, _ := memPair(t, Config{}, m.features)
			cl, sl := client.LocalAddr().String(), server.LocalAddr().String()
			msg := []byte(strings.Repeat("x", 1000))
			if _, err := client.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(server, make([]byte, len(msg))); err != nil {
				t.Fatal(err)
			}
			if _, err := server.Write(msg[:10]); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(client, make([]byte, 10)); err != nil {
				t.Fatal(err)
			}

			conns := Connections()
			ci, ok := findConn(conns, cl, sl)
			if !ok {
				t.Fatalf("client %s -> %s not listed in %+v", cl, sl, conns)
			}
			si, ok := findConn(conns, sl, cl)
			if !ok {
				t.Fatalf("server %s -> %s not listed in %+v", sl, cl, conns)
			}
			want := ProtocolValkey
			if m.features != 0 {
				want = ProtocolRdmanet
			}
			for _, c := range []ConnInfo{ci, si} {
				if c.Protocol != want || c.Transport != fallback.RDMA || c.Session || c.LastError != "" {
					t.Errorf("listed as %+v, want protocol %s over rdma, no session, no error", c, want)
				}
				if c.Window.SendSlots == 0 || c.Window.SendRing == 0 {
					t.Errorf("window %+v has no send queue or ring", c.Window)
				}
			}
			if ci.Side != sideDialed || si.Side != sideAccepted {
				t.Errorf("sides %q and %q, want %q and %q", ci.Side, si.Side, sideDialed, sideAccepted)
			}
			if ci.BytesSent != 1000 || ci.BytesReceived != 10 || si.BytesSent != 10 || si.BytesReceived != 1000 {
				t.Errorf("client sent/received %d/%d, server %d/%d; want 1000/10 and 10/1000",
					ci.BytesSent, ci.BytesReceived, si.BytesSent, si.BytesReceived)
			}

			closeAndWait(t, client)
			if _, ok := findConn(Connections(), cl, sl); ok {
				t.Error("the client is still listed after Close")
			}
			if _, ok := findConn(Connections(), sl, cl); !ok {
				t.Error("the server left the list before its Close")
			}
			closeAndWait(t, server)
			if _, ok := findConn(Connections(), sl, cl); ok {
				t.Error("the server is still listed after Close")
			}
		})
	}
}

// TestConnectionsShowsFailure: a connection whose link failed stays
// listed, with the error, until it is closed.
func TestConnectionsShowsFailure(t *testing.T) {
	goroutineCheck(t)
	client, server, a, _ := memPair(t, Config{}, hostModes[0].features)
	defer closeAndWait(t, server)
	defer closeAndWait(t, client)
	a.Cut(errors.New("cable pulled"))
	buf := make([]byte, 1000)
	for {
		if _, err := client.Write(buf); err != nil {
			break
		}
	}
	c, ok := findConn(Connections(), client.LocalAddr().String(), server.LocalAddr().String())
	if !ok {
		t.Fatal("the failed connection is not listed before Close")
	}
	if !strings.Contains(c.LastError, "cable pulled") {
		t.Errorf("the failed connection is listed without its error: %+v", c)
	}
}

// TestConnsHandler: the handler's JSON decodes to the listed connections,
// and ?format=text gives the table with a line per connection.
func TestConnsHandler(t *testing.T) {
	goroutineCheck(t)
	client, server, _, _ := memPair(t, Config{}, hostModes[0].features)
	defer closeAndWait(t, server)
	defer closeAndWait(t, client)
	srv := httptest.NewServer(ConnsHandler())
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var conns []ConnInfo
	err = json.NewDecoder(resp.Body).Decode(&conns)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("decoding the handler's JSON: %v", err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	cl, sl := client.LocalAddr().String(), server.LocalAddr().String()
	if _, ok := findConn(conns, cl, sl); !ok {
		t.Errorf("JSON lacks the client: %+v", conns)
	}

	resp, err = http.Get(srv.URL + "?format=text")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	if !strings.HasPrefix(lines[0], "LOCAL") {
		t.Errorf("table without header:\n%s", body)
	}
	found := 0
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) > 2 && (f[0] == cl && f[1] == sl || f[0] == sl && f[1] == cl) {
			found++
		}
	}
	if found != 2 {
		t.Errorf("table has %d lines for the pair, want 2:\n%s", found, body)
	}
	if s := client.Session(); s.Resumable || s != (SessionState{}) {
		t.Errorf("a plain connection's Session: %+v", s)
	}
}

// TestWriteConnTableColumns: a session over an iWARP device shows its
// transport with both marks, its device and port, and its queue pair.
func TestWriteConnTableColumns(t *testing.T) {
	var b strings.Builder
	err := WriteConnTable(&b, []ConnInfo{{Local: "a", Remote: "b", Transport: fallback.RDMA, Protocol: ProtocolRdmanet, Side: sideDialed,
		Session: true, DataPath: rdmalink.DataPathNotice, Device: "siw0", Port: 1, QP: 17}})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("table:\n%s", b.String())
	}
	f := strings.Fields(lines[1])
	if len(f) < 6 || f[3] != "rdma/rdmanet+session+notices" || f[4] != "siw0/1" || f[5] != "17" {
		t.Errorf("row %q", lines[1])
	}
	// A group's stream: its queue pair is the group's, and the stream's
	// tag follows it.
	b.Reset()
	if err := WriteConnTable(&b, []ConnInfo{{Local: "a", Remote: "b", Transport: fallback.RDMA, Protocol: ProtocolRdmanet, Side: sideAccepted,
		Device: "rxe0", Port: 1, QP: 17, Stream: 0x301}}); err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(b.String()), "\n")
	if f := strings.Fields(lines[len(lines)-1]); len(f) < 6 || f[5] != "17/0x301" {
		t.Errorf("stream's row %q", lines[len(lines)-1])
	}
}

// TestConnectionsIdleNotNegative: Idle is measured from when the snapshot
// is taken under the connection's lock, so a connection that posts while
// Connections walks the list never shows activity in the future.
func TestConnectionsIdleNotNegative(t *testing.T) {
	goroutineCheck(t)
	client, server, _, _ := memPair(t, Config{}, hostModes[0].features)
	done := streamBothWays(t, client, server, 8<<20)
	for snapshots := 0; ; snapshots++ {
		select {
		case <-done:
			closeAndWait(t, client)
			closeAndWait(t, server)
			t.Logf("%d snapshots", snapshots)
			return
		default:
		}
		for _, c := range Connections() {
			if c.Idle < 0 {
				t.Fatalf("%s -> %s idle for %v", c.Local, c.Remote, c.Idle)
			}
		}
	}
}

// endpointLink is a pipe that says where it runs, as an RDMA link does.
type endpointLink struct{ *link.Pipe }

func (endpointLink) Endpoint() (string, uint8, uint32) { return "rxe7", 2, 0x1234 }
func (endpointLink) DataPath() string                  { return "write-and-notice" }

// TestConnInfoNamesTheDevice: a connection over a link on a device reports
// the device, its port, the queue pair and the data path, and one over a
// link that has none reports none.
func TestConnInfoNamesTheDevice(t *testing.T) {
	cfg, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	pa, pb := link.NewPipe(pipeConfig(cfg), pipeConfig(cfg))
	a, b, _, _ := memConns(t, cfg, wire.FeatureRing|wire.FeatureShutdown, endpointLink{pa}, pb)
	defer closeAndWait(t, b)
	defer closeAndWait(t, a)
	if i := a.Info(); i.Device != "rxe7" || i.Port != 2 || i.QP != 0x1234 || i.DataPath != "write-and-notice" {
		t.Errorf("over a device: %+v", i)
	}
	if i := b.Info(); i.Device != "" || i.Port != 0 || i.QP != 0 || i.DataPath != "" {
		t.Errorf("over a link with no device: %+v", i)
	}
}
