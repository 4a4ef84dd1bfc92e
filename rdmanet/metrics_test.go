package rdmanet

import (
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"io"
	"os"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
	"github.com/rdmanet/sdk/verbs"
)

// TestMetricsCountTraffic: bytes, requests and messages move with traffic,
// stay counted after the connections close, and Open follows them.
func TestMetricsCountTraffic(t *testing.T) {
	goroutineCheck(t)
	before := ReadMetrics()
	client, server, _, _ := memPair(t, Config{}, hostModes[0].features)
	if _, err := client.Write(make([]byte, 5000)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(server, make([]byte, 5000)); err != nil {
		t.Fatal(err)
	}
	during := ReadMetrics()
	if during.Open != before.Open+2 {
		t.Errorf("Open %d with a pair open, %d before", during.Open, before.Open)
	}
	if during.BytesSent-before.BytesSent != 5000 || during.BytesReceived-before.BytesReceived != 5000 {
		t.Errorf("bytes sent/received moved by %d/%d, want 5000/5000",
			during.BytesSent-before.BytesSent, during.BytesReceived-before.BytesReceived)
	}
	if during.RequestsPosted <= before.RequestsPosted || during.MessagesArrived <= before.MessagesArrived {
		t.Errorf("requests posted %d -> %d, messages arrived %d -> %d: want both to grow",
			before.RequestsPosted, during.RequestsPosted, before.MessagesArrived, during.MessagesArrived)
	}
	closeAndWait(t, client)
	closeAndWait(t, server)
	after := ReadMetrics()
	if after.Open != before.Open || after.BytesSent < during.BytesSent || after.BytesReceived < during.BytesReceived {
		t.Errorf("after Close: open %d, bytes %d/%d; want open %d and bytes at least %d/%d",
			after.Open, after.BytesSent, after.BytesReceived, before.Open, during.BytesSent, during.BytesReceived)
	}
}

// TestMetricsCountConnError: a link that fails under a connection counts
// one error of its kind at each end. (The in-memory link's Cut fails both
// ends, as a queue pair's error ends the reliable connection for both.)
func TestMetricsCountConnError(t *testing.T) {
	goroutineCheck(t)
	before := ReadMetrics()
	client, server, a, _ := memPair(t, Config{}, hostModes[0].features)
	defer closeAndWait(t, server)
	defer closeAndWait(t, client)
	a.Cut(&verbs.WCError{Status: verbs.WCRetryExcErr})
	for {
		if _, err := client.Write(make([]byte, 1000)); err != nil {
			break
		}
	}
	// The server finds out on its own goroutine: wait until it has, so
	// that both ends have counted, however the two are scheduled.
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, err := server.Read(make([]byte, 1000)); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the server's end did not fail after the cut")
			}
			break
		}
	}
	after := ReadMetrics()
	if n := after.ConnErrors[ErrorRetryExceeded] - before.ConnErrors[ErrorRetryExceeded]; n != 2 {
		t.Errorf("retry-exceeded errors moved by %d, want 2, one at each end (all: %v)", n, after.ConnErrors)
	}
}

func TestClassifyConnError(t *testing.T) {
	for _, c := range []struct {
		err  error
		want ConnErrorKind
	}{
		{fmt.Errorf("x: %w (%w)", &verbs.WCError{Status: verbs.WCRNRRetryExcErr}, link.ErrDown), ErrorRetryExceeded},
		{&verbs.WCError{Status: verbs.WCRemAccessErr}, ErrorWorkCompletion},
		{&stream.PathDeadError{}, ErrorDeadPath},
		{&wire.ProtocolError{Reason: "bad"}, ErrorProtocol},
		{stream.ErrPeerClosed, ErrorPeerClosed},
		{fmt.Errorf("device removed: %w", link.ErrDown), ErrorLinkDown},
		{errors.New("odd"), ErrorOther},
	} {
		if got := ConnErrorKindOf(c.err); got != c.want {
			t.Errorf("%v: %s, want %s", c.err, got, c.want)
		}
	}
}

var expvarRuns atomic.Int64

// TestPublishExpvar: the published variable is JSON with every counter,
// each kind and reason present.
func TestPublishExpvar(t *testing.T) {
	// expvar names are for the life of the process: a name of its own for
	// each run of the test (go test -count).
	name := fmt.Sprintf("rdmanet_test_%d", expvarRuns.Add(1))
	PublishExpvar(name)
	v := expvar.Get(name)
	if v == nil {
		t.Fatal("not published")
	}
	var got struct {
		Dialed          map[string]uint64 `json:"dialed"`
		Fallbacks       map[string]uint64 `json:"fallbacks"`
		ConnectFailures map[string]uint64 `json:"connect_failures"`
		ConnErrors      map[string]uint64 `json:"conn_errors"`
		Open            *int              `json:"open"`
		BytesSent       *uint64           `json:"bytes_sent"`
		SessionMoves    []sessionMoveJSON `json:"session_moves"`
	}
	if err := json.Unmarshal([]byte(v.String()), &got); err != nil {
		t.Fatalf("expvar value does not parse: %v\n%s", err, v.String())
	}
	if len(got.Dialed) != 2 || len(got.Fallbacks) != len(reasons) || len(got.ConnectFailures) != len(reasons) ||
		len(got.ConnErrors) != len(connErrorKinds) || got.Open == nil || got.BytesSent == nil || got.SessionMoves == nil {
		t.Errorf("expvar value lacks counters: %s", v.String())
	}
}

// TestDeprecatedReadersAreSubsets: Stats and SessionStats return what
// ReadMetrics does, the one reader of the package's counters.
func TestDeprecatedReadersAreSubsets(t *testing.T) {
	countMove(SessionMove{Reason: "failback", From: fallback.RDMA, To: fallback.RDMA})
	counters.Dialed(fallback.TCP)
	m := ReadMetrics()
	if got := Stats(); !reflect.DeepEqual(got, m.Snapshot) {
		t.Errorf("Stats() = %+v, ReadMetrics().Snapshot = %+v", got, m.Snapshot)
	}
	if got := SessionStats(); !reflect.DeepEqual(got, m.Sessions) || len(got) == 0 {
		t.Errorf("SessionStats() = %v, ReadMetrics().Sessions = %v", got, m.Sessions)
	}
}
