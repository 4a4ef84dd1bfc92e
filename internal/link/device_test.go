package link_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/rdmanet/sdk/internal/link"
)

// onDevice is testConfig on d.
func onDevice(d *Device) PipeConfig {
	c := testConfig()
	c.Device = d
	return c
}

// TestDeviceNotifies: an idle end's notify function is called from the
// device's goroutine, not the poster's: the poster still holds the pair's
// lock then, and a notify function that took it would deadlock there. The
// goroutine runs only while it has calls to make.
func TestDeviceNotifies(t *testing.T) {
	checkGoroutines(t)
	d := NewDevice(64)
	var pipes [][2]*Pipe
	var told [4]atomic.Int32
	for i := range 4 {
		a, b := NewPipe(onDevice(d), onDevice(d))
		t.Cleanup(func() { a.Close(); b.Close() })
		pipes = append(pipes, [2]*Pipe{a, b})
		b.SetNotify(func() {
			LockPoster(b) // the poster's lock: free, or this hangs
			told[i].Add(1)
		})
		if err := b.Arm(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pipes {
		if err := p[0].PostSend([]SendWR{{Kind: SendControl, Signaled: true, ID: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	for end := time.Now().Add(hangGuard); ; time.Sleep(time.Millisecond) {
		n := 0
		for i := range told {
			n += int(told[i].Load())
		}
		if n == len(told) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d idle ends told", n, len(told))
		}
	}
	if st := d.Stats(); st.Notifies != len(told) || st.Ends != 8 || st.Held == 0 {
		t.Fatalf("device %+v: want %d notifies, 8 ends, completions held", st, len(told))
	}
	for _, p := range pipes {
		pollAll(t, p[0])
		pollAll(t, p[1])
	}
	if st := d.Stats(); st.Held != 0 {
		t.Fatalf("%d completions held after every end polled", st.Held)
	}
}

// TestDeviceOverrun: a completion beyond the device's queue fails every
// link on it, idle ones too, with an error matching ErrOverrun and ErrDown,
// after what each had; closing them gives everything back.
func TestDeviceOverrun(t *testing.T) {
	checkGoroutines(t)
	d := NewDevice(6)
	cfg := onDevice(d)
	cfg.ControlDepth = 4
	a, b := NewPipe(cfg, cfg)
	c, e := NewPipe(onDevice(d), onDevice(d)) // idle
	defer func() {
		for _, x := range []*Pipe{a, b, c, e} {
			x.Close()
		}
		if st := d.Stats(); st.Ends != 0 || st.Held != 0 || !st.Overrun {
			t.Errorf("after Close: %+v", st)
		}
	}()
	// Four messages, each a SendDone at a and a ControlArrived at b, and
	// nobody polls: the seventh completion does not fit.
	for i := range 4 {
		if err := a.PostSend([]SendWR{{Kind: SendControl, Signaled: true, ID: uint64(i + 1)}}); err != nil {
			t.Fatal(err)
		}
	}
	// An end made on the device now fails at once.
	f, g := NewPipe(cfg, cfg)
	defer f.Close()
	defer g.Close()
	for _, x := range []*Pipe{a, b, c, e, f, g} {
		var last Completion
		for end := time.Now().Add(hangGuard); last.Kind != Failed; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("no failure after the overrun: %v", kinds(pollAll(t, x)))
			}
			if cs := pollAll(t, x); len(cs) > 0 {
				last = cs[len(cs)-1]
			}
		}
		if !errors.Is(last.Err, ErrOverrun) && !errors.Is(last.Err, ErrDown) {
			t.Fatalf("the failure %v matches neither ErrOverrun nor ErrDown", last.Err)
		}
	}
}

// TestDeviceManyLinks: many links at once on one device (run with -race),
// each end polling and waiting as the engine does, completions of all of
// them interleaved on the device: each gets all of its own, and nothing is
// held at the end.
func TestDeviceManyLinks(t *testing.T) {
	checkGoroutines(t)
	const links, msgs = 16, 200
	d := NewDevice(links * 2 * (testConfig().SendDepth + testConfig().RecvDepth))
	var wg sync.WaitGroup
	for range links {
		a, b := NewPipe(onDevice(d), onDevice(d))
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range msgs {
				if err := a.PostSend([]SendWR{{Kind: SendControl, Signaled: true, ID: uint64(i + 1)}}); err != nil {
					t.Error(err)
					return
				}
				if cs := waitFor(t, a, 1); cs[0].Kind != SendDone || cs[0].ID != uint64(i+1) {
					t.Errorf("sender: %v", kinds(cs))
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range msgs {
				if cs := waitFor(t, b, 1); cs[0].Kind != ControlArrived {
					t.Errorf("receiver: %v", kinds(cs))
					return
				}
				if err := b.PostRecv(1); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		t.Cleanup(func() { a.Close(); b.Close() })
	}
	wg.Wait()
	if st := d.Stats(); st.Held != 0 || st.Overrun {
		t.Fatalf("device after the run: %+v", st)
	}
}
