package rdmanet

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// Many connections on one in-memory device (link.Device): their
// completions share one completion queue, and idle connections are told
// of theirs from the device's one goroutine, as on an RDMA device
// (internal/rdmalink's shared queues and channel).

// devicePair is memPair with both ends on d.
func devicePair(t testing.TB, cfg Config, d *link.Device) (client, server *Conn) {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	pc := pipeConfig(cfg)
	pc.Device = d
	a, b := link.NewPipe(pc, pc)
	client, server, _, _ = memConns(t, cfg, wire.FeatureRing|wire.FeatureShutdown, a, b)
	return client, server
}

// deviceNeed is what one end may hold on its device's queue at worst: a
// completion for every signaled send and every receive, and its end.
func deviceNeed(cfg Config) int {
	cfg, _ = cfg.withDefaults()
	return cfg.sendDepth() + cfg.RecvDepth + 1
}

// endedByClose reports whether err is what a Read or Write may meet when
// its connection, or its peer, closes under it.
func endedByClose(err error) bool {
	return err == nil || errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, stream.ErrPeerClosed) || isPathDead(err)
}

// TestConnsShareADevice: 24 pairs on one device stream both ways at once
// (SHA-256 checked), their completions interleaved on its queue, while 8
// more pairs stay idle; then pairs close while their data is still being
// delivered. Every byte arrives, every call returns, and the device, the
// goroutines and the queue are back to nothing.
func TestConnsShareADevice(t *testing.T) {
	goroutineCheck(t)
	const streaming, idle = 24, 8
	cfg := Config{RecvBuffer: 32 << 10, SendBuffer: 32 << 10, RecvDepth: 16}
	d := link.NewDevice(2 * (streaming + idle) * deviceNeed(cfg))
	var pairs [][2]*Conn
	for range streaming + idle {
		a, b := devicePair(t, cfg, d)
		pairs = append(pairs, [2]*Conn{a, b})
	}
	var dones []<-chan struct{}
	for _, p := range pairs[:streaming] {
		dones = append(dones, streamBothWays(t, p[0], p[1], 256<<10))
	}
	for _, done := range dones {
		select {
		case <-done:
		case <-time.After(hangGuard):
			t.Fatal("a stream on the shared device did not finish")
		}
	}
	for _, p := range pairs[streaming:] {
		echoOnce(t, p[0], p[1]) // idle all along, and still working
	}
	// Close racing delivery: each pair writes, and one side closes at a
	// random moment while the other reads.
	var wg sync.WaitGroup
	for _, p := range pairs {
		wg.Add(2)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4<<10)
			for {
				if _, err := p[0].Write(buf); err != nil {
					if !endedByClose(err) {
						t.Errorf("Write: %v", err)
					}
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			buf := make([]byte, 4<<10)
			for {
				if _, err := p[1].Read(buf); err != nil {
					if !endedByClose(err) {
						t.Errorf("Read: %v", err)
					}
					return
				}
			}
		}()
	}
	for _, i := range rand.Perm(len(pairs)) {
		time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		pairs[i][rand.IntN(2)].Close()
	}
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(hangGuard):
		t.Fatal("a Read or Write did not return after its pair closed")
	}
	for _, p := range pairs {
		closeAndWait(t, p[0])
		closeAndWait(t, p[1])
	}
	if st := d.Stats(); st.Ends != 0 || st.Held != 0 || st.Overrun {
		t.Fatalf("the device after every connection closed: %+v", st)
	}
}

// TestConnsDeviceOverrun: a device whose completion queue overruns (the
// fault injected while pairs stream and others wait idle) fails every
// connection on it with an error that says so, and every blocked call
// returns.
func TestConnsDeviceOverrun(t *testing.T) {
	goroutineCheck(t)
	cfg := Config{RecvBuffer: 32 << 10, SendBuffer: 32 << 10, RecvDepth: 16}
	d := link.NewDevice(8 * deviceNeed(cfg))
	var pairs [][2]*Conn
	for range 4 {
		a, b := devicePair(t, cfg, d)
		pairs = append(pairs, [2]*Conn{a, b})
	}
	for _, p := range pairs {
		echoOnce(t, p[0], p[1]) // everything works, then the queue overruns
	}
	errs := make(chan error, 2*len(pairs))
	for i, p := range pairs {
		go func() {
			_, err := io.Copy(io.Discard, p[1])
			errs <- err
		}()
		if i%2 == 1 {
			// An idle connection: its blocked Read must end too.
			go func() {
				_, err := p[0].Read(make([]byte, 1))
				errs <- err
			}()
			continue
		}
		go func() {
			buf := make([]byte, 8<<10)
			for {
				if _, err := p[0].Write(buf); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	d.Overrun()
	for range 2 * len(pairs) {
		select {
		case err := <-errs:
			if !errors.Is(err, link.ErrOverrun) {
				t.Errorf("a call ended with %v, want the device's overrun", err)
			}
		case <-time.After(hangGuard):
			t.Fatalf("a call still blocked after the device overran (%+v)", d.Stats())
		}
	}
	for _, p := range pairs {
		closeAndWait(t, p[0])
		closeAndWait(t, p[1])
	}
}
