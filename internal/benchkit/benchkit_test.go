package benchkit

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var samples []time.Duration
	for i := 200; i >= 1; i-- { // 1..200 us, given in reverse
		samples = append(samples, time.Duration(i)*time.Microsecond)
	}
	l := NewLatency(samples)
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{
		{50, 100 * time.Microsecond},
		{99, 198 * time.Microsecond},
		{100, 200 * time.Microsecond},
		{0.1, 1 * time.Microsecond},
	} {
		if got := l.Percentile(c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got, want := l.Mean(), 100500*time.Nanosecond; got != want {
		t.Errorf("mean = %v, want %v", got, want)
	}
	if l.N() != 200 {
		t.Errorf("N = %d", l.N())
	}
	if (Latency{}).Percentile(50) != 0 || (Latency{}).Mean() != 0 {
		t.Error("an empty Latency is not zero")
	}
}

func TestSizeName(t *testing.T) {
	for n, want := range map[int]string{64: "64 B", 4096: "4 KiB", 65536: "64 KiB", 1 << 20: "1 MiB", 1500: "1500 B"} {
		if got := SizeName(n); got != want {
			t.Errorf("SizeName(%d) = %q, want %q", n, got, want)
		}
	}
}

func loopbackPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	lo := netip.MustParseAddr("127.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, s, err := TCPPair(ctx, lo, lo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	s.SetDeadline(time.Now().Add(30 * time.Second))
	return c, s
}

func TestStream(t *testing.T) {
	c, s := loopbackPair(t)
	for _, c2 := range []struct {
		size  int
		total int64
	}{{64, 64 << 10}, {1 << 20, 3<<20 + 17}, {4096, 100}} {
		r, err := Stream(c, s, c2.size, c2.total)
		if err != nil {
			t.Fatalf("size %d: %v", c2.size, err)
		}
		if r.Bytes != c2.total || r.Elapsed <= 0 || r.MBps() <= 0 || r.Gbps() != r.MBps()*8/1000 {
			t.Errorf("size %d: %+v, %v MB/s", c2.size, r, r.MBps())
		}
	}
}

func TestStreamShort(t *testing.T) {
	c, s := loopbackPair(t)
	go func() {
		buf := make([]byte, 1000)
		c.Write(buf)
		c.Close()
	}()
	_, err := Stream(io.Discard, s, 100, 5000)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("stream from a peer that sent 1000 of 5000 bytes: %v", err)
	}
}

func TestPingPong(t *testing.T) {
	c, s := loopbackPair(t)
	l, err := PingPong(c, s, 4096, 100)
	if err != nil {
		t.Fatal(err)
	}
	if l.N() != 100 || l.Percentile(50) <= 0 || l.Percentile(99) < l.Percentile(50) {
		t.Errorf("N %d, p50 %v, p99 %v", l.N(), l.Percentile(50), l.Percentile(99))
	}
	// The connection is clean afterwards: another ping-pong works.
	if _, err := PingPong(s, c, 64, 10); err != nil {
		t.Fatal(err)
	}
}

// Each side of a ping-pong refuses a size or count below 1 before it
// touches the connection (an echo child's come from its command line).
func TestRoundTripsRefused(t *testing.T) {
	for _, sn := range [][2]int{{0, 10}, {-64, 10}, {64, 0}, {64, -1}} {
		if err := Echo(nil, sn[0], sn[1]); err == nil {
			t.Errorf("Echo of %d round trips of %d bytes: no error", sn[1], sn[0])
		}
		if _, err := Ping(nil, sn[0], sn[1]); err == nil {
			t.Errorf("Ping of %d round trips of %d bytes: no error", sn[1], sn[0])
		}
		if _, err := PingPong(nil, nil, sn[0], sn[1]); err == nil {
			t.Errorf("PingPong of %d round trips of %d bytes: no error", sn[1], sn[0])
		}
	}
}

func TestPairDialFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A dial from an address that is not local fails; the listener is closed.
	_, _, err := TCPPair(ctx, netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("127.0.0.1"))
	if err == nil {
		t.Fatal("dial from a foreign address succeeded")
	}
}

// NearestRank on few values, as labbench's failover figures have: the
// median of an even count is the lower middle one, and p99 is the largest.
func TestNearestRankFew(t *testing.T) {
	vs := []float64{1.5, 2.5, 3.5, 4.5, 5.5, 6.5}
	for p, want := range map[float64]float64{50: 3.5, 99: 6.5, 100: 6.5, 1: 1.5} {
		if got := NearestRank(vs, p); got != want {
			t.Errorf("p%v of %v = %v, want %v", p, vs, got, want)
		}
	}
	if got := NearestRank([]float64{7}, 99); got != 7 {
		t.Errorf("p99 of one value = %v", got)
	}
	if got := NearestRank([]float64(nil), 50); got != 0 {
		t.Errorf("p50 of nothing = %v", got)
	}
}

func TestParseMemlock(t *testing.T) {
	got := ParseMemlock("pairs: 100 7130000\nbeyond: 28 dial rdma 1.2.3.4:5: resources: rdmanet: RLIMIT_MEMLOCK of 8 MiB\ntcp: tcp resources\nafter: 0\n")
	want := MemlockResult{Pairs: 100, PairsPinned: 7130000, Beyond: 28, BeyondErr: "dial rdma 1.2.3.4:5: resources: rdmanet: RLIMIT_MEMLOCK of 8 MiB", TCP: "tcp resources"}
	if got != want {
		t.Errorf("ParseMemlock = %+v, want %+v", got, want)
	}
	short := ParseMemlock("pairerr: round trip: EOF\npairs: 12 40960\n")
	if short.Pairs != 12 || short.PairErr != "round trip: EOF" || short.After != -1 {
		t.Errorf("a short run: %+v", short)
	}
}
