package conntrack

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// listen returns a TCP listener on the loopback interface.
func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// failingListener is a listener whose Close fails with err.
type failingListener struct {
	net.Listener
	err error
}

func (l failingListener) Close() error {
	l.Listener.Close()
	return l.err
}

func TestRefusedAfterClose(t *testing.T) {
	var tr Tracker
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !tr.Closed() {
		t.Error("Closed is false after Close")
	}
	if tr.AddListener(listen(t)) {
		t.Error("AddListener after Close registered the listener")
	}
	c, p := net.Pipe()
	defer c.Close()
	defer p.Close()
	if tr.Track(c) {
		t.Error("Track after Close registered the connection")
	}
	if n := tr.NumConns(); n != 0 {
		t.Errorf("NumConns = %d, want 0", n)
	}
	if tr.Go(func() { t.Error("Go after Close ran f") }) {
		t.Error("Go after Close reported f started")
	}
	select {
	case <-tr.Done():
	default:
		t.Error("Done is not closed after Close")
	}
}

// TestClose checks that Close closes Done, the listeners and the
// connections, and returns only once the goroutines have finished.
func TestClose(t *testing.T) {
	var tr Tracker
	if tr.Closed() {
		t.Fatal("a new Tracker is closed")
	}
	l := listen(t)
	if !tr.AddListener(l) {
		t.Fatal("AddListener refused")
	}
	acceptErr := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		acceptErr <- err
	}()

	const n = 3
	var finished atomic.Int32
	for range n {
		c, p := net.Pipe()
		defer p.Close()
		if !tr.Track(c) {
			t.Fatal("Track refused")
		}
		go func() {
			defer tr.Untrack(c)
			// A read fails only once Close closes c.
			c.Read(make([]byte, 1))
			time.Sleep(10 * time.Millisecond)
			finished.Add(1)
		}()
	}
	if got := tr.NumConns(); got != n {
		t.Fatalf("NumConns = %d, want %d", got, n)
	}
	var stopped atomic.Bool
	if !tr.Go(func() {
		<-tr.Done()
		time.Sleep(10 * time.Millisecond)
		stopped.Store(true)
	}) {
		t.Fatal("Go refused")
	}

	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := finished.Load(); got != n {
		t.Errorf("Close returned with %d of %d connection goroutines finished", got, n)
	}
	if !stopped.Load() {
		t.Error("Close returned before the goroutine of Go finished")
	}
	if got := tr.NumConns(); got != 0 {
		t.Errorf("NumConns after Close = %d, want 0", got)
	}
	select {
	case err := <-acceptErr:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept on a listener Close closed: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Close did not close the listener")
	}
}

// TestCloseTwice checks that a second Close returns nil and, like the
// first, waits for the goroutines.
func TestCloseTwice(t *testing.T) {
	var tr Tracker
	release := make(chan struct{})
	var stopped atomic.Bool
	tr.Go(func() {
		<-release
		stopped.Store(true)
	})
	first := make(chan error, 1)
	go func() { first <- tr.Close() }()
	for !tr.Closed() {
		time.Sleep(time.Millisecond)
	}
	second := make(chan error, 1)
	go func() { second <- tr.Close() }()
	select {
	case <-first:
		t.Fatal("the first Close returned before the goroutine finished")
	case <-second:
		t.Fatal("the second Close returned before the goroutine finished")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	for _, ch := range []chan error{first, second} {
		if err := <-ch; err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if !stopped.Load() {
		t.Error("Close returned before the goroutine finished")
	}
	if err := tr.Close(); err != nil {
		t.Errorf("a third Close: %v", err)
	}
}

// TestCloseListenerError checks that Close returns a listener's error of
// closing, but not net.ErrClosed: Serve may have closed its listener first.
func TestCloseListenerError(t *testing.T) {
	var tr Tracker
	already := listen(t)
	already.Close()
	tr.AddListener(already)
	if err := tr.Close(); err != nil {
		t.Errorf("Close with a listener closed already: %v, want nil", err)
	}

	var tr2 Tracker
	bad := errors.New("close failed")
	tr2.AddListener(failingListener{listen(t), bad})
	tr2.AddListener(listen(t))
	if err := tr2.Close(); err != bad {
		t.Errorf("Close: %v, want %v", err, bad)
	}
}

// TestRemoveListener checks that Close leaves a removed listener open.
func TestRemoveListener(t *testing.T) {
	var tr Tracker
	l := listen(t)
	tr.AddListener(l)
	tr.RemoveListener(l)
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("dialing a listener removed before Close: %v", err)
	}
	c.Close()
}

// TestUntrack checks that Untrack closes and forgets the connection and
// ends its count, so that Close does not wait for it.
func TestUntrack(t *testing.T) {
	var tr Tracker
	c, p := net.Pipe()
	defer p.Close()
	if !tr.Track(c) {
		t.Fatal("Track refused")
	}
	tr.Untrack(c)
	if got := tr.NumConns(); got != 0 {
		t.Errorf("NumConns after Untrack = %d, want 0", got)
	}
	if _, err := c.Write([]byte{0}); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("writing to an untracked connection: %v, want it closed", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- tr.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close waits for an untracked connection")
	}
}
