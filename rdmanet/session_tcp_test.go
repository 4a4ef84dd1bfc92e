package rdmanet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/session"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// Sessions whose links are TCP, on loopback: the dialer resumes over TCP
// to the listener's own port from the TCP port it reserved (session_tcp.go,
// docs/protocol.md "Resuming over TCP"), and the listener tells such a
// connection from a plain client's. The session is made as dial and the
// listener's accept make one: rings of its own on each side (ringMem), the
// server's side in the listener's session table (acceptNewSession), the
// dialer's reserved port and its paths, a first one and TCP last. The first
// link is a pipe, standing for the RDMA path; the listener's RDMA side is
// a fake (accept_test.go's rig), its TCP side real.

var loopback = netip.MustParseAddr("127.0.0.1")

// tcpSession is a session whose dialer may resume over TCP.
type tcpSession struct {
	*sessionPair
	rig    *rig
	broken atomic.Bool // the first path's dials fail, as a dead RDMA path's
	// failedTries counts the first path's dials that failed.
	failedTries atomic.Int32
	port        uint16 // the dialer's reserved TCP port
}

func newTCPSession(t *testing.T, cfg Config) *tcpSession {
	t.Helper()
	return newTCPSessionWith(t, cfg, tcpSessionOptions{})
}

// tcpSessionOptions change a tcpSession from the start.
type tcpSessionOptions struct {
	tcpFrom       netip.Addr    // the TCP path's source address (loopback if unset)
	staleBy       uint32        // the dialer asks for generations this far ahead
	serverTimeout time.Duration // the server's ResumeTimeout, if set
}

func newTCPSessionWith(t *testing.T, cfg Config, o tcpSessionOptions) *tcpSession {
	t.Helper()
	cfg = sessionTestConfig(t, cfg)
	r := newRigWith(t, cfg, true, 4, netip.MustParseAddrPort("198.18.0.2:7471"), nil)
	dst := r.l.Addr().(*net.TCPAddr).AddrPort()
	cmem, err := newRingMem(cfg)
	if err != nil {
		t.Fatal(err)
	}
	smem, err := newRingMem(cfg)
	if err != nil {
		t.Fatal(err)
	}
	port, err := reserveTCPPort(dst.Addr())
	if err != nil {
		t.Fatal(err)
	}
	a, b := sessionPipe(cfg, cmem.tx.Bytes(), cmem.rx.Bytes(), smem.tx.Bytes(), smem.rx.Bytes())
	ts := &tcpSession{sessionPair: &sessionPair{cfg: cfg, a: a, b: b}, rig: r, port: port.port}

	features := cfg.extensions()
	offer := cfg.helloOf(features)
	offer.TCPPort = port.port
	scfg := cfg
	if o.serverTimeout != 0 {
		scfg.ResumeTimeout = o.serverTimeout
	}
	server := &Conn{link: b, cfg: scfg, server: true, mem: smem}
	accept := r.l.rdma.acceptNewSession(server, features, offer, loopback)
	if err := server.begin(features, offer); err != nil {
		t.Fatal(err)
	}
	client := &Conn{link: a, cfg: cfg, mem: cmem}
	from := o.tcpFrom
	if !from.IsValid() {
		from = loopback
	}
	paths := []session.Path{
		{Name: "first", Dial: func(ctx context.Context, h wire.Hello) (link.Link, wire.Hello, error) {
			if ts.broken.Load() {
				ts.failedTries.Add(1)
				return nil, wire.Hello{}, errors.New("test: the first path is down")
			}
			return ts.dial(ctx, h)
		}},
		tcpResumePath(cmem, port.port, from, dst, cfg),
	}
	resume := cfg.helloOf(features &^ wire.LinkFeatures)
	resume.TCPPort = port.port
	client.becomeSession(session.Config{ID: accept.Session, Gen: accept.Generation + o.staleBy, Hello: resume, Paths: paths, Closed: port.close})
	if err := client.begin(features, accept); err != nil {
		t.Fatal(err)
	}
	ts.client, ts.server = client, server
	return ts
}

// cut breaks the first link while its path stays down: the dialer's only
// way back is TCP.
func (ts *tcpSession) cut() {
	ts.broken.Store(true)
	a, _ := ts.pipes()
	a.Cut(errors.New("test: port down"))
}

// waitSession waits until c's session is as ok wants it.
func waitSession(t *testing.T, c *Conn, what string, ok func(SessionState) bool) SessionState {
	t.Helper()
	for end := time.Now().Add(hangGuard); ; time.Sleep(time.Millisecond) {
		if st := c.Session(); ok(st) {
			return st
		}
		if time.Now().After(end) { // a hang guard, not a timing check
			t.Fatalf("no %s: %+v", what, c.Session())
		}
	}
}

// onTCP reports whether a session runs over TCP now.
func onTCP(s SessionState) bool { return strings.HasPrefix(s.Path, "tcp ") }

// waitReceived waits until both sides have read n bytes: the streams are
// under way.
func (ts *tcpSession) waitReceived(t *testing.T, n uint64) {
	t.Helper()
	for end := time.Now().Add(hangGuard); ts.client.Info().BytesReceived < n || ts.server.Info().BytesReceived < n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the streams did not start: %+v, %+v", ts.client.Info(), ts.server.Info())
		}
	}
}

// dialFromReservedPort connects to the listener from the dialer's
// reserved port, as a resume over TCP does.
func (ts *tcpSession) dialFromReservedPort(t *testing.T) *net.TCPConn {
	t.Helper()
	d := net.Dialer{Control: reuseAddr, LocalAddr: &net.TCPAddr{IP: loopback.AsSlice(), Port: int(ts.port)}}
	c, err := d.Dial("tcp", ts.rig.l.Addr().String())
	// The last connection between the same two ports, which the listener
	// closed first, holds them until our end has the ACK of its FIN: on a
	// busy machine the kernel's softirq may take a while to send it.
	for end := time.Now().Add(hangGuard); errors.Is(err, syscall.EADDRNOTAVAIL) && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
		c, err = d.Dial("tcp", ts.rig.l.Addr().String())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(hangGuard))
	return c.(*net.TCPConn)
}

// resumeHello is the dialer's resume request now.
func (ts *tcpSession) resumeHello() wire.Hello { return ts.client.sess.Hello() }

// closeAll closes both sides and checks that the session left the
// listener's table and that the rings were unmapped, once every link
// made over them (the TCP ones too) was closed.
func (ts *tcpSession) closeAll(t *testing.T, buffersBefore int64) {
	t.Helper()
	closeAndWait(t, ts.client)
	closeAndWait(t, ts.server)
	if st := ts.rig.l.Stats(); st.Sessions != 0 {
		t.Errorf("the listener keeps %d sessions after both sides closed", st.Sessions)
	}
	// Other tests' connections may still release theirs: this can only
	// pass too easily, never fail wrongly.
	if n := verbs.Resources().Buffers - buffersBefore; n > 0 {
		t.Errorf("%d ring buffers still mapped after the session closed", n)
	}
}

// TestSessionResumesOverTCP: a session whose first path breaks in
// mid-stream, with both directions streaming, goes on over TCP to the
// listener's port from the dialer's reserved port; every byte arrives once,
// in order. The listener counts the resume and the connection it sniffed,
// and the session's move and its TCP transport show in SessionStats,
// Connections and ConnsHandler.
func TestSessionResumesOverTCP(t *testing.T) {
	goroutineCheck(t)
	buffers := verbs.Resources().Buffers
	ts := newTCPSession(t, Config{RecvBuffer: 32 << 10, SendBuffer: 16 << 10, KeepAlive: time.Second, FailbackInterval: -1})
	movesBefore := ReadMetrics().Sessions
	const size = 8 << 20
	done := streamBothWays(t, ts.client, ts.server, size)
	ts.waitReceived(t, 256<<10)
	ts.cut()

	cs := waitSession(t, ts.client, "resume over TCP", onTCP)
	reserved := netip.AddrPortFrom(loopback, ts.port).String()
	if !strings.HasPrefix(cs.Path, "tcp "+reserved+" -> ") {
		t.Errorf("the client resumed on %q, not from its reserved port %s", cs.Path, reserved)
	}
	if m := cs.LastMove; m.From != "memory" || m.To != fallback.TCP || m.Reason != "link-down" || m.ToPath != cs.Path {
		t.Errorf("the client's move: %+v", m)
	}
	ss := waitSession(t, ts.server, "server on TCP", onTCP)
	if !strings.Contains(ss.Path, "-> "+reserved) {
		t.Errorf("the server's link %q does not come from the reserved port %s", ss.Path, reserved)
	}
	if ci := ts.client.Info(); ci.Transport != fallback.TCP || !ci.Session {
		t.Errorf("the client's Info on TCP: %+v", ci)
	}
	if tr, why := TransportOf(ts.client); tr != fallback.TCP || why == nil || !strings.Contains(why.Error(), "test: port down") {
		t.Errorf("TransportOf the client on TCP: %v, %v; want tcp and the link's failure", tr, why)
	}
	checkConnsHandlerShowsTCP(t, ts.client, ts.server)

	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatal("the streams did not finish over TCP")
	}
	// The server adopts the new generation at the dialer's first message.
	waitSession(t, ts.server, "generation 1", func(s SessionState) bool { return s.Generation == 1 })
	if cs := ts.client.Session(); cs.Failovers != 1 || cs.Generation != 1 || !onTCP(cs) {
		t.Errorf("the client's session after the streams: %+v", cs)
	}
	if st := ts.rig.l.Stats(); st.Resumes != 1 || st.TCPSniffs != 1 || st.RefusedResumes != 0 || st.Sessions != 1 {
		t.Errorf("listener stats %+v; want 1 resume, 1 sniffed connection, no refusal, 1 session", st)
	}
	moved := SessionMove{Reason: "link-down", From: "memory", To: fallback.TCP}
	if n := ReadMetrics().Sessions[moved] - movesBefore[moved]; n < 1 {
		t.Errorf("SessionStats counted %d moves %+v", n, moved)
	}
	checkExpvarCountsMove(t, moved)
	ts.closeAll(t, buffers)
}

// checkConnsHandlerShowsTCP: the conns handler's JSON and table list both
// ends of a session that runs over TCP, as TCP sessions.
func checkConnsHandlerShowsTCP(t *testing.T, client, server *Conn) {
	t.Helper()
	srv := httptest.NewServer(ConnsHandler())
	defer srv.Close()
	get := func(accept string) (*http.Response, []byte) {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("Accept", accept)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}
	resp, body := get("application/json")
	var conns []ConnInfo
	if err := json.Unmarshal(body, &conns); err != nil {
		t.Fatalf("the handler's JSON: %v\n%s", err, body)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q", cc)
	}
	cl, sl := client.LocalAddr().String(), server.LocalAddr().String()
	for _, end := range [][2]string{{cl, sl}, {sl, cl}} {
		ci, ok := findConn(conns, end[0], end[1])
		if !ok {
			t.Errorf("%s -> %s not listed: %+v", end[0], end[1], conns)
		} else if ci.Transport != fallback.TCP || !ci.Session || ci.Protocol != ProtocolRdmanet {
			t.Errorf("%s -> %s listed as %+v, want a TCP session", end[0], end[1], ci)
		}
	}
	// ?format=json wins over the Accept header.
	req, _ := http.NewRequest("GET", srv.URL+"?format=json", nil)
	req.Header.Set("Accept", "text/plain")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("?format=json answered %q", resp.Header.Get("Content-Type"))
	}
	// A client that accepts text and not JSON gets the table.
	resp, body = get("text/plain")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q for Accept: text/plain", ct)
	}
	found := 0
	for _, line := range strings.Split(string(body), "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && (f[0] == cl && f[1] == sl || f[0] == sl && f[1] == cl) {
			found++
			if f[3] != "tcp/rdmanet+session" {
				t.Errorf("the table's transport %q, want tcp/rdmanet+session:\n%s", f[3], line)
			}
		}
	}
	if found != 2 {
		t.Errorf("the table has %d lines for the session, want 2:\n%s", found, body)
	}
}

// checkExpvarCountsMove: the metrics' JSON, as expvar serves it, counts
// move, in a list sorted by reason, then transports.
func checkExpvarCountsMove(t *testing.T, move SessionMove) {
	t.Helper()
	b, err := json.Marshal(ReadMetrics().jsonValue())
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Moves []sessionMoveJSON `json:"session_moves"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("the metrics' JSON: %v\n%s", err, b)
	}
	found := false
	for i, m := range got.Moves {
		if m.Reason == move.Reason && m.From == string(move.From) && m.To == string(move.To) && m.Count >= 1 {
			found = true
		}
		if i > 0 {
			p := got.Moves[i-1]
			if p.Reason > m.Reason || p.Reason == m.Reason && (p.From > m.From || p.From == m.From && p.To >= m.To) {
				t.Errorf("session_moves out of order at %d: %+v", i, got.Moves)
			}
		}
	}
	if !found {
		t.Errorf("session_moves lacks %+v: %s", move, b)
	}
}

// TestSessionFailsBackFromTCP: a session on TCP moves back to its first
// path once it works again, while both directions stream; the server sees
// its TCP link replaced (peer-resumed), and nothing is lost.
func TestSessionFailsBackFromTCP(t *testing.T) {
	goroutineCheck(t)
	buffers := verbs.Resources().Buffers
	// The address the session was dialed from is gone: the TCP resume
	// comes from another, with the same reserved port.
	ts := newTCPSessionWith(t, Config{RecvBuffer: 32 << 10, SendBuffer: 16 << 10, KeepAlive: time.Second, FailbackInterval: 20 * time.Millisecond},
		tcpSessionOptions{tcpFrom: netip.MustParseAddr("192.0.2.1")})
	done := streamBothWays(t, ts.client, ts.server, 4<<20)
	ts.waitReceived(t, 128<<10)
	ts.cut()
	if cs := waitSession(t, ts.client, "resume over TCP", onTCP); !strings.HasPrefix(cs.Path, "tcp "+netip.AddrPortFrom(loopback, ts.port).String()) {
		t.Errorf("resumed on %q, not from the reserved port %d", cs.Path, ts.port)
	}
	// Failbacks to the first path, still down, fail and change nothing.
	ts.mu.Lock()
	tries := ts.dials
	ts.mu.Unlock()
	for end := time.Now().Add(hangGuard); ts.failedTries.Load() < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d tries to move back to the first path in %v", ts.failedTries.Load(), hangGuard)
		}
	}
	if cs := ts.client.Session(); !onTCP(cs) || cs.Failbacks != 0 || cs.Failovers != 1 {
		t.Errorf("after failbacks that failed: %+v, want the session on TCP still", cs)
	}
	ts.mu.Lock()
	if ts.dials != tries {
		t.Errorf("%d resumes on the first path while it was down", ts.dials-tries)
	}
	ts.mu.Unlock()
	ts.broken.Store(false)
	cs := waitSession(t, ts.client, "failback", func(s SessionState) bool { return s.Path == "first" && s.Failbacks == 1 })
	if m := cs.LastMove; m.Reason != "failback" || m.From != fallback.TCP || !strings.HasPrefix(m.FromPath, "tcp ") {
		t.Errorf("the client's failback: %+v", m)
	}
	ss := waitSession(t, ts.server, "server off TCP", func(s SessionState) bool { return s.Path != "" && !onTCP(s) && s.Failovers == 2 })
	if m := ss.LastMove; m.Reason != "peer-resumed" || m.From != fallback.TCP || m.To != "memory" {
		t.Errorf("the server's move off TCP: %+v", m)
	}
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatal("the streams did not finish after the failback")
	}
	if st := ts.rig.l.Stats(); st.Resumes != 1 {
		t.Errorf("listener stats %+v; want the one resume over TCP", st)
	}
	ts.closeAll(t, buffers)
}

// TestTCPResumeOfStaleGenerationRefused: a dialer that asks over TCP for a
// generation the server does not have (a replay) is refused, and ends the
// session at once with a refused *ResumeError naming the TCP path, not
// after trying until its timeout. The server's side, which waits, ends
// after its own (shorter) timeout.
func TestTCPResumeOfStaleGenerationRefused(t *testing.T) {
	goroutineCheck(t)
	buffers := verbs.Resources().Buffers
	ts := newTCPSessionWith(t, Config{KeepAlive: time.Second, ResumeTimeout: time.Minute},
		tcpSessionOptions{staleBy: 5, serverTimeout: 500 * time.Millisecond})
	roundTrip(t, ts.client, ts.server)
	ts.cut()
	var b [1]byte
	ts.client.SetReadDeadline(time.Now().Add(hangGuard))
	_, err := ts.client.Read(b[:])
	var re *ResumeError
	if !errors.As(err, &re) || !re.Refused {
		t.Fatalf("Read: %v, want a refused *ResumeError", err)
	}
	last := re.Attempts[len(re.Attempts)-1]
	if !strings.HasPrefix(last.Path, "tcp -> ") || !errors.Is(last.Err, ErrSessionRefused) || !strings.Contains(last.Err.Error(), "generation") {
		t.Errorf("the last attempt %+v, want the TCP path refused for its generation", last)
	}
	if n := strings.Count(last.Err.Error(), ErrSessionRefused.Error()); n != 1 {
		t.Errorf("the refusal %q says %q %d times, want once", last.Err, ErrSessionRefused, n)
	}
	if st := ts.rig.l.Stats(); st.RefusedResumes != 1 || st.Resumes != 0 || st.TCPSniffs != 1 {
		t.Errorf("listener stats %+v; want 1 refused resume, 1 sniffed connection", st)
	}
	ts.server.SetReadDeadline(time.Now().Add(hangGuard))
	if _, err := ts.server.Read(b[:]); !errors.As(err, &re) || re.Refused || !re.Timeout() {
		t.Errorf("the server's Read: %v, want a *ResumeError that timed out", err)
	}
	ts.closeAll(t, buffers)
}

// TestTCPResumeHostileHellos: what a connection from a session's reserved
// port may send instead of its dialer's resume. Each is refused with the
// reason (or, cut short, closed unanswered), counted, and leaves the
// session on its link, at its generation.
func TestTCPResumeHostileHellos(t *testing.T) {
	goroutineCheck(t)
	buffers := verbs.Resources().Buffers
	ts := newTCPSession(t, Config{KeepAlive: time.Second})
	good := ts.resumeHello()
	for _, tc := range []struct {
		name    string
		request func() []byte
		status  int // -1: closed without an answer
		reason  string
		refused bool // counted in RefusedResumes
		setup   func(bool)
	}{
		{"unknown session", func() []byte { h := good; h.Session[0] ^= 0xff; return h.Encode() }, tcpRefused, "unknown session", true, nil},
		{"stale generation", func() []byte { h := good; h.Generation += 3; return h.Encode() }, tcpRefused, "generation 3", true, nil},
		{"not a resume", func() []byte { h := good; h.Resume = false; return h.Encode() }, tcpRefused, "not a resume", true, nil},
		{"version 0", func() []byte { b := good.Encode(); b[8] = 0; return b }, tcpRefused, "version 0", true, nil},
		{"no receives", func() []byte { h := good; h.RecvDepth = 0; return h.Encode() }, tcpRefused, "no receives", true, nil},
		{"resume under way", good.Encode, tcpBusy, "under way", false, func(on bool) {
			if !on {
				ts.server.sess.EndResume(nil, "")
			} else if _, err := ts.server.sess.BeginResume(good.Generation); err != nil {
				t.Fatal(err)
			}
		}},
		// Last: the client closes first, and its end of the connection
		// stays in TIME_WAIT.
		{"cut short", func() []byte { return good.Encode()[:30] }, -1, "", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := ts.rig.l.Stats()
			if tc.setup != nil {
				tc.setup(true)
				defer tc.setup(false)
			}
			c := ts.dialFromReservedPort(t)
			if _, err := c.Write(tc.request()); err != nil {
				t.Fatal(err)
			}
			if tc.status < 0 {
				c.CloseWrite()
			}
			answer, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("reading the answer: %v (%q)", err, answer)
			}
			switch {
			case tc.status < 0:
				if len(answer) != 0 {
					t.Errorf("answered %q, want the connection closed", answer)
				}
			case len(answer) < 2 || int(answer[0]) != tc.status || int(answer[1]) != len(answer)-2:
				t.Errorf("answer %q, want status %d, a length and the reason", answer, tc.status)
			case !strings.Contains(string(answer[2:]), tc.reason):
				t.Errorf("reason %q, want it to say %q", answer[2:], tc.reason)
			}
			after := ts.rig.l.Stats()
			if got := after.RefusedResumes - before.RefusedResumes; got != map[bool]uint64{false: 0, true: 1}[tc.refused] {
				t.Errorf("%d refusals counted (refused: %v)", got, tc.refused)
			}
			if after.TCPSniffs != before.TCPSniffs+1 || after.Resumes != 0 {
				t.Errorf("listener stats %+v before, %+v after; want one more sniffed connection and no resume", before, after)
			}
		})
		roundTrip(t, ts.client, ts.server)
		if cs := ts.client.Session(); cs.Failovers != 0 || cs.Generation != 0 || cs.Path != "memory" {
			t.Errorf("after %s: the session %+v moved", tc.name, cs)
		}
	}
	ts.closeAll(t, buffers)
}

// TestListenerSniffsReservedPort: a TCP connection the listener holds back
// because it comes from a session's reserved port, and that is not a
// resume, goes to Accept with every byte it sent, even if its first bytes
// start like a Hello's magic, and even if it sends nothing (a protocol
// where the server speaks first); other connections go to Accept without
// being sniffed.
func TestListenerSniffsReservedPort(t *testing.T) {
	goroutineCheck(t)
	buffers := verbs.Resources().Buffers
	ts := newTCPSession(t, Config{KeepAlive: time.Second})
	magic := ts.resumeHello().Encode()[:wire.HelloMagicSize]
	for _, tc := range []struct {
		name     string
		reserved bool
		first    []byte // written at once
		then     []byte // written after a moment, if any
	}{
		{"plain bytes", true, []byte("GET / HTTP/1.0\r\n\r\n"), nil},
		{"a magic's start", true, magic[:3], []byte("not the rest of it")},
		{"silent", true, nil, nil},
		{"another port", false, []byte("PING\r\n"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := ts.rig.l.Stats()
			accepted := ts.rig.accept()
			var c *net.TCPConn
			if tc.reserved {
				c = ts.dialFromReservedPort(t)
			} else {
				nc, err := net.Dial("tcp", ts.rig.l.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer nc.Close()
				c = nc.(*net.TCPConn)
			}
			c.SetDeadline(time.Now().Add(hangGuard))
			c.Write(tc.first)
			if tc.then != nil {
				time.Sleep(20 * time.Millisecond) // the listener may peek meanwhile
				c.Write(tc.then)
			}
			res := ts.rig.result(accepted)
			if res.err != nil {
				t.Fatal(res.err)
			}
			sc := res.c.(*TCPConn)
			defer sc.Close()
			if !sc.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().IsLoopback() || sc.RemoteAddr().String() != c.LocalAddr().String() {
				t.Fatalf("accepted %v, want the test's connection from %v", sc.RemoteAddr(), c.LocalAddr())
			}
			if tr, _ := TransportOf(sc); tr != fallback.TCP {
				t.Errorf("TransportOf the accepted connection: %v", tr)
			}
			sc.SetDeadline(time.Now().Add(hangGuard))
			want := append(append([]byte(nil), tc.first...), tc.then...)
			got := make([]byte, len(want))
			if _, err := io.ReadFull(sc, got); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("Accept's connection read %q, %v; want %q", got, err, want)
			}
			// Both ways, the server first.
			if _, err := sc.Write([]byte("220 ready\r\n")); err != nil {
				t.Fatal(err)
			}
			line := make([]byte, len("220 ready\r\n"))
			if _, err := io.ReadFull(c, line); err != nil || string(line) != "220 ready\r\n" {
				t.Fatalf("the client read %q, %v", line, err)
			}
			sc.Close() // first, so that the reserved port's next connection may be made at once
			if n, err := c.Read(line); n != 0 || err != io.EOF {
				t.Errorf("the client's read after the server closed: %d, %v", n, err)
			}
			after := ts.rig.l.Stats()
			sniffed := map[bool]uint64{false: 0, true: 1}[tc.reserved]
			if after.TCPSniffs-before.TCPSniffs != sniffed || after.RefusedResumes != before.RefusedResumes {
				t.Errorf("stats %+v before, %+v after; want %d sniffed connections, no refusal", before, after, sniffed)
			}
		})
	}
	ts.closeAll(t, buffers)
}

// TestListenerServesResumeFromAnotherPort: a connection from no reserved
// port (its dialer's address and port changed) whose first bytes, there
// already, are a resume Hello is served as a resume, not handed to Accept.
func TestListenerServesResumeFromAnotherPort(t *testing.T) {
	goroutineCheck(t)
	buffers := verbs.Resources().Buffers
	ts := newTCPSession(t, Config{KeepAlive: time.Second})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	client.SetDeadline(time.Now().Add(hangGuard))
	h := ts.resumeHello()
	h.Generation += 9 // refused: the session goes on
	if _, err := client.Write(h.Encode()); err != nil {
		t.Fatal(err)
	}
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	tc := nc.(*net.TCPConn)
	if !peekResume(tc, hangGuard) { // waits until the Hello is there
		tc.Close()
		t.Fatal("the resume Hello did not arrive")
	}
	if ts.rig.l.classifyTCP(tc) {
		tc.Close()
		t.Fatal("a connection whose first bytes are a resume Hello was taken for a plain client's")
	}
	answer, err := io.ReadAll(client)
	if err != nil || len(answer) < 2 || answer[0] != tcpRefused || !strings.Contains(string(answer[2:]), "generation") {
		t.Fatalf("answer %q, %v; want a refusal for the generation", answer, err)
	}
	if st := ts.rig.l.Stats(); st.TCPSniffs != 0 || st.RefusedResumes != 1 {
		t.Errorf("listener stats %+v; want no sniffed connection, 1 refused resume", st)
	}
	roundTrip(t, ts.client, ts.server)
	ts.closeAll(t, buffers)
}

// TestTCPResumeExchangeAnswers: the dialer's reading of the listener's
// answer to its resume Hello, from a listener on loopback that answers as
// told: a resume, a refusal (the session ends), a busy session (try
// again), and answers it must not take.
func TestTCPResumeExchangeAnswers(t *testing.T) {
	cfg, _ := Config{ResumeTimeout: time.Second}.withDefaults()
	h := cfg.helloOf(cfg.extensions())
	h.Resume, h.Generation = true, 4
	h.Session[0] = 1
	accept := cfg.helloOf(cfg.extensions())
	accept.Session, accept.Generation = h.Session, 5
	other := accept
	other.Session[1] = 1
	plain := cfg.helloOf(wire.FeatureRing | wire.FeatureShutdown)
	for _, tc := range []struct {
		name    string
		answer  []byte
		gen     uint32 // the accept's, when it resumed
		refused bool   // the error matches ErrSessionRefused
		says    string // what the error says
	}{
		{"resumed", append([]byte{tcpResumed}, accept.Encode()...), 5, false, ""},
		{"resumed, another session", append([]byte{tcpResumed}, other.Encode()...), 0, true, "without the session"},
		{"resumed, without sessions", append([]byte{tcpResumed}, append(plain.Encode(), make([]byte, 28)...)...), 0, true, "without the session"},
		{"resumed, a malformed Hello", append([]byte{tcpResumed}, func() []byte { b := accept.Encode(); b[8] = 0; return b }()...), 0, false, "version 0"},
		{"resumed, cut short", append([]byte{tcpResumed}, accept.Encode()[:20]...), 0, false, "reading the answer"},
		{"refused", append([]byte{tcpRefused, 15}, "unknown session"...), 0, true, "unknown session"},
		{"busy", append([]byte{tcpBusy, 8}, "under way"[:8]...), 0, false, "under wa"},
		{"refused, cut short", []byte{tcpRefused}, 0, false, "reading the answer"},
		{"unknown status", []byte{7, 0}, 0, false, "status 7"},
		{"no answer", nil, 0, false, "reading the answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			served := make(chan []byte, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					served <- nil
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(hangGuard))
				got := make([]byte, wire.SessionHelloSize)
				io.ReadFull(c, got)
				c.Write(tc.answer)
				served <- got
			}()
			nc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(hangGuard))
			peer, err := tcpResumeExchange(nc.(*net.TCPConn), h)
			if sent := <-served; !bytes.Equal(sent, h.Encode()) {
				t.Errorf("the listener got %x, want the resume Hello %x", sent, h.Encode())
			}
			if tc.says == "" {
				if err != nil || peer.Generation != tc.gen || peer.Session != h.Session {
					t.Fatalf("%+v, %v; want the accept with generation %d", peer, err, tc.gen)
				}
				return
			}
			if err == nil {
				t.Fatalf("took the answer %q: %+v", tc.answer, peer)
			}
			if errors.Is(err, ErrSessionRefused) != tc.refused || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %v; want it to say %q, refused %v", err, tc.says, tc.refused)
			}
		})
	}
}

// TestListenerCloseRacesAccept: Close while Accepts wait, plain clients
// connect and a connection from a reserved port is held back to be
// sniffed: every Accept returns (a connection or net.ErrClosed), the held
// connection is closed, not leaked, a later Accept and a second Close say
// the listener is closed, and the session already accepted goes on.
func TestListenerCloseRacesAccept(t *testing.T) {
	goroutineCheck(t)
	buffers := verbs.Resources().Buffers
	ts := newTCPSession(t, Config{KeepAlive: time.Second})
	held := ts.dialFromReservedPort(t)
	for end := time.Now().Add(hangGuard); ts.rig.l.Stats().TCPSniffs == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the connection from the reserved port was not held back")
		}
	}
	var accepts []<-chan acceptResult
	for range 4 {
		accepts = append(accepts, ts.rig.accept())
	}
	stop := make(chan struct{})
	var dialed atomic.Int32
	dialing := make(chan struct{})
	go func() {
		defer close(dialing)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c, err := net.Dial("tcp", ts.rig.l.Addr().String())
			if err != nil {
				return // the listener closed
			}
			dialed.Add(1)
			c.Close()
		}
	}()
	for end := time.Now().Add(hangGuard); dialed.Load() < 3 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- ts.rig.l.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("Close did not return")
	}
	close(stop)
	<-dialing
	t.Logf("%d plain clients connected meanwhile", dialed.Load())
	conns, heldAccepted := 0, false
	for _, a := range accepts {
		res := ts.rig.result(a)
		switch {
		case res.err == nil && res.c != nil:
			conns++
			heldAccepted = heldAccepted || res.c.RemoteAddr().String() == held.LocalAddr().String()
			res.c.Close()
		case !errors.Is(res.err, net.ErrClosed):
			t.Errorf("Accept during Close: %v, %v; want a connection or net.ErrClosed", res.c, res.err)
		}
	}
	t.Logf("%d Accepts got a connection (the held one: %v)", conns, heldAccepted)
	if n, err := held.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the held connection after Close: %d, %v; want it closed", n, err)
	}
	if _, err := ts.rig.l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
	if err := ts.rig.l.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a second Close: %v, want net.ErrClosed", err)
	}
	roundTrip(t, ts.client, ts.server)
	ts.closeAll(t, buffers)
}

// TestResumePathsFail: a resume's dial ends with the error that says what
// happened: nothing listens at the server's port any more (which tells
// the dialer its server is gone), a server that never answers (bounded by
// the dial's context), or, on a host without RDMA, an RDMA path at once.
func TestResumePathsFail(t *testing.T) {
	cfg := sessionTestConfig(t, Config{})
	mem, err := newRingMem(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.close()
	h := cfg.helloOf(cfg.extensions())
	h.Resume = true

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := closed.Addr().(*net.TCPAddr).AddrPort()
	closed.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if l, _, err := dialTCPResume(ctx, mem, 0, loopback, gone, cfg, h); l != nil || !nothingListens(err) {
		t.Errorf("a resume to a closed port: %v, want nothing listening", err)
	}

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		if c, err := silent.Accept(); err == nil {
			defer c.Close()
			io.Copy(io.Discard, c)
		}
	}()
	sctx, scancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer scancel()
	start := time.Now()
	_, _, err = dialTCPResume(sctx, mem, 0, loopback, silent.Addr().(*net.TCPAddr).AddrPort(), cfg, h)
	if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > tcpHandshakeTimeout {
		t.Errorf("a resume to a silent server: %v after %v, want its context's deadline", err, time.Since(start))
	}

	// A server that takes the resume, for a session whose rings were
	// freed meanwhile (it closed): the link is not made, and the
	// connection is closed.
	answering, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer answering.Close()
	peerClosed := make(chan bool, 1)
	go func() {
		c, err := answering.Accept()
		if err != nil {
			peerClosed <- false
			return
		}
		defer c.Close()
		b := make([]byte, wire.SessionHelloSize)
		if _, err := io.ReadFull(c, b); err != nil {
			peerClosed <- false
			return
		}
		accept := h
		accept.Resume = false
		c.Write(append([]byte{tcpResumed}, accept.Encode()...))
		n, _ := c.Read(b)
		peerClosed <- n == 0
	}()
	freed, err := newRingMem(cfg)
	if err != nil {
		t.Fatal(err)
	}
	freed.close()
	if l, _, err := dialTCPResume(ctx, freed, 0, loopback, answering.Addr().(*net.TCPAddr).AddrPort(), cfg, h); l != nil || !errors.Is(err, net.ErrClosed) {
		t.Errorf("a resume over freed rings: %v", err)
	}
	if !<-peerClosed {
		t.Errorf("the resume's connection was not closed")
	}

	if cm.Available() == nil {
		return // this host has RDMA: the lab tests its paths
	}
	if l, _, err := dialResume(ctx, netip.Addr{}, gone, cfg, mem, h); l != nil || err == nil {
		t.Errorf("an RDMA resume without RDMA: %v", err)
	}
}

// rdmaNamed is a link that says it is RDMA, on a named device.
type rdmaNamed struct{ *link.Pipe }

func (r rdmaNamed) Caps() link.Caps {
	c := r.Pipe.Caps()
	c.Transport, c.Name = string(fallback.RDMA), "rxe0 port 1"
	return c
}

// TestLinkPathName: RDMA paths are named by their addresses and device,
// TCP ones by the name their link has, others by the name given.
func TestLinkPathName(t *testing.T) {
	a, b := link.NewPipe(link.PipeConfig{SendRing: 64, RecvRing: 64, SendDepth: 1, RecvDepth: 1, ControlDepth: 1}, link.PipeConfig{SendRing: 64, RecvRing: 64, SendDepth: 1, RecvDepth: 1, ControlDepth: 1})
	defer a.Close()
	defer b.Close()
	local, remote := a.Addrs()
	if got, want := linkPathName(rdmaNamed{a}, "first"), fmt.Sprintf("rdma %s (rxe0 port 1) -> %s", local.Addr(), remote); got != want {
		t.Errorf("an RDMA path: %q, want %q", got, want)
	}
	if got := linkPathName(a, "first"); got != "first" {
		t.Errorf("a pipe: %q", got)
	}
}
