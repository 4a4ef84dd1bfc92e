package rdmanet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/verbs"
)

// TestMemCloseWrite: with the half-close extension the peer reads what was
// written, then EOF, and may still write back; in Valkey's protocol
// CloseWrite is refused and the connection stays usable.
func TestMemCloseWrite(t *testing.T) {
	goroutineCheck(t)
	a, b, _, _ := memPair(t, Config{}, hostModes[0].features)
	if a.Protocol() != ProtocolRdmanet {
		t.Fatalf("Protocol = %v", a.Protocol())
	}
	a.Write([]byte("request"))
	if err := a.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := a.CloseWrite(); err != nil {
		t.Fatalf("second CloseWrite = %v", err)
	}
	if got, err := io.ReadAll(b); string(got) != "request" || err != nil {
		t.Fatalf("peer read %q, %v; want the request, then EOF", got, err)
	}
	if _, err := a.Write([]byte("more")); !errors.Is(err, ErrHalfCloseUnsupported) && err == nil {
		t.Fatal("Write after CloseWrite succeeded")
	}
	b.Write([]byte("reply"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "reply" {
		t.Fatalf("reply %q, %v", buf, err)
	}
	closeAndWait(t, a)
	closeAndWait(t, b)
	if err := a.CloseWrite(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("CloseWrite after Close = %v", err)
	}

	v, w, _, _ := memPair(t, Config{}, 0)
	if v.Protocol() != ProtocolValkey {
		t.Fatalf("Protocol = %v", v.Protocol())
	}
	if err := v.CloseWrite(); !errors.Is(err, ErrHalfCloseUnsupported) {
		t.Fatalf("CloseWrite in Valkey's protocol = %v", err)
	}
	v.Write([]byte("still"))
	buf = make([]byte, 5)
	if _, err := io.ReadFull(w, buf); err != nil {
		t.Fatal(err)
	}
	closeAndWait(t, v)
	closeAndWait(t, w)
}

func TestConnDescribesItself(t *testing.T) {
	a, b, _, _ := memPair(t, Config{}, hostModes[0].features)
	defer closeAndWait(t, b)
	defer closeAndWait(t, a)
	if a.LocalAddr().Network() != "rdma" || a.LocalAddr().String() != b.RemoteAddr().String() || a.RemoteAddr().String() != b.LocalAddr().String() {
		t.Fatalf("addresses: %v->%v and %v->%v", a.LocalAddr(), a.RemoteAddr(), b.LocalAddr(), b.RemoteAddr())
	}
	if tr, why := TransportOf(a); tr != fallback.RDMA || why != nil {
		t.Fatalf("TransportOf = %v, %v", tr, why)
	}
	var nilAddr *Addr
	if nilAddr.String() != "<nil>" {
		t.Fatal("nil *Addr")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read after Close = %v", err)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close = %v", err)
	}
}

// TestRejectReason: an rdmanet server's reason in a reject's private data
// comes back as a *ServerRefusedError that still matches cm.ErrRejected; a
// reject from anyone else stays as it was.
func TestRejectReason(t *testing.T) {
	reason := errors.New("cannot allocate the connection's memory")
	ee := &cm.EventError{Op: "connect", Event: cm.EventRejected, Status: 28, PrivateData: append(rejectReason(reason), 0, 0, 0)}
	err := withRejectReason(ee)
	var sr *ServerRefusedError
	if !errors.As(err, &sr) || sr.Reason != reason.Error() || !errors.Is(err, cm.ErrRejected) {
		t.Fatalf("withRejectReason = %v", err)
	}
	if sr.Error() != "server refused: "+reason.Error() {
		t.Fatalf("Error() = %q", sr.Error())
	}
	long := errors.New(string(make([]byte, 500)))
	if n := len(rejectReason(long)); n != maxRejectData {
		t.Fatalf("a long reason takes %d bytes, at most %d fit", n, maxRejectData)
	}
	plain := &cm.EventError{Op: "connect", Event: cm.EventRejected, Status: 28, PrivateData: []byte("something else")}
	if got := withRejectReason(plain); got != error(plain) {
		t.Fatalf("a foreign reject became %v", got)
	}
	other := errors.New("not a reject")
	if withRejectReason(other) != other {
		t.Fatal("a non-reject error changed")
	}
	if errors.Is(err, verbs.ErrNoImmediate) || fallback.Classify(err) != fallback.ReasonRejected {
		t.Fatalf("a refusal for memory classifies as %s", fallback.Classify(err))
	}

	// A listener on a device without immediate data refusing a peer that
	// speaks Valkey's protocol (or one that is Valkey-compatible itself):
	// the dialer falls back for that reason, as if it had found it out.
	noImm := fmt.Errorf("%w: siw1: this listener speaks Valkey's protocol only (Config.ValkeyCompatible)", verbs.ErrNoImmediate)
	err = withRejectReason(&cm.EventError{Op: "connect", Event: cm.EventRejected, Status: 28, PrivateData: rejectReason(noImm)})
	if !errors.As(err, &sr) || !errors.Is(err, verbs.ErrNoImmediate) || !errors.Is(err, cm.ErrRejected) {
		t.Fatalf("a refusal for no immediate data: %v; want a *ServerRefusedError matching verbs.ErrNoImmediate and cm.ErrRejected", err)
	}
	if r := fallback.Classify(err); r != fallback.ReasonNoImmediate {
		t.Fatalf("a refusal for no immediate data classifies as %s, want %s", r, fallback.ReasonNoImmediate)
	}

	// A listener out of descriptors (or memory, or queue pairs): the dialer
	// falls back for resources, which it does not remember, not for a
	// rejection, which it does for a minute.
	emfile := &verbs.CallError{Func: "rdma_create_event_channel", Errno: syscall.ENOENT, Descriptors: &verbs.DescriptorLimit{Open: 4090, Limit: 4096}}
	err = withRejectReason(&cm.EventError{Op: "connect", Event: cm.EventRejected, Status: 28, PrivateData: rejectReason(emfile)})
	if !errors.As(err, &sr) || !strings.HasPrefix(sr.Reason, "resources: rdma_create_event_channel") || !errors.Is(err, cm.ErrRejected) {
		t.Fatalf("a refusal for descriptors: %v", err)
	}
	if r := fallback.Classify(err); r != fallback.ReasonResources || fallback.Remembers(r) {
		t.Fatalf("a refusal for descriptors classifies as %s (remembered: %v), want %s, not remembered", r, fallback.Remembers(r), fallback.ReasonResources)
	}
}

func TestAddressParsing(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		family, addr, want string
		ok                 bool
	}{
		{"ip", "198.18.0.2:7471", "198.18.0.2:7471", true},
		{"ip", "[::ffff:198.18.0.2]:80", "198.18.0.2:80", true},
		{"ip4", "[2001:db8::1]:80", "", false},
		{"ip6", "198.18.0.2:80", "", false},
		{"ip", ":http", "0.0.0.0:80", true},
		{"ip6", ":7471", "[::]:7471", true},
		{"ip", "localhost:7471", "", true}, // resolves, to either family
		{"ip", "no-port", "", false},
		{"ip", "198.18.0.2:no-such-service", "", false},
	} {
		got, err := resolveAddr(ctx, c.family, c.addr)
		if (err == nil) != c.ok || (c.want != "" && got.String() != c.want) {
			t.Errorf("resolveAddr(%s, %q) = %v, %v", c.family, c.addr, got, err)
		}
	}
	ip := netip.MustParseAddr("198.18.0.1")
	for _, a := range []net.Addr{&Addr{netip.AddrPortFrom(ip, 0)}, &net.TCPAddr{IP: ip.AsSlice()}, &net.IPAddr{IP: ip.AsSlice()}} {
		if got, err := localIP(a); err != nil || got != ip {
			t.Errorf("localIP(%T) = %v, %v", a, got, err)
		}
	}
	// nil, and a nil pointer of each type, are no address, as to net.Dialer.
	for _, a := range []net.Addr{nil, (*Addr)(nil), (*net.TCPAddr)(nil), (*net.IPAddr)(nil)} {
		if got, err := localIP(a); err != nil || got.IsValid() {
			t.Errorf("localIP(%#v) = %v, %v", a, got, err)
		}
	}
	if _, err := localIP(&net.UnixAddr{Name: "x"}); err == nil {
		t.Error("localIP of a Unix address accepted")
	}
	for _, n := range []string{"udp", "rdma7", ""} {
		if _, _, err := parseNetwork(n); err == nil {
			t.Errorf("network %q accepted", n)
		}
	}
}
