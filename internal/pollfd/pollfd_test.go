//go:build linux

package pollfd

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pipeFD returns a pollable FD on a pipe's read end whose read function drains
// one byte the way rdma-core's get-event calls do, and the write end. A
// non-nil fail makes the read function return it.
func pipeFD(t *testing.T, fail error) (*FD, int) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	fd, err := New(p[0], "test pipe", func() (bool, error) {
		if fail != nil {
			return false, fail
		}
		var b [1]byte
		_, err := unix.Read(p[0], b[:])
		if err == unix.EAGAIN {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return fd, p[1]
}

func TestWaitWakesOnEvent(t *testing.T) {
	fd, w := pipeFD(t, nil)
	defer fd.Close()
	go func() {
		time.Sleep(20 * time.Millisecond)
		unix.Write(w, []byte{1})
	}()
	if err := fd.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

func TestWaitHonoursContext(t *testing.T) {
	fd, w := pipeFD(t, nil)
	defer fd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := fd.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait after deadline = %v, want context.DeadlineExceeded", err)
	}
	// The forced deadline must not leak into the next wait.
	unix.Write(w, []byte{1})
	if err := fd.Wait(context.Background()); err != nil {
		t.Fatalf("Wait after a cancelled wait: %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if err := fd.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel = %v, want context.Canceled", err)
	}
}

func TestCloseWakesWaiter(t *testing.T) {
	fd, _ := pipeFD(t, nil)
	errc := make(chan error, 1)
	go func() { errc <- fd.Wait(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	fd.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Wait after Close = %v, want os.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the waiter")
	}
}

func TestReadErrorIsReturned(t *testing.T) {
	boom := errors.New("boom")
	fd, _ := pipeFD(t, boom)
	defer fd.Close()
	if err := fd.Wait(context.Background()); err != boom {
		t.Fatalf("Wait = %v, want the read function's error", err)
	}
}
