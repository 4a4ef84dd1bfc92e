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

// pipeFD returns a pollable FD on a pipe's read end, the write end, and a read
// function that drains one byte the way rdma-core's get-event calls do.
func pipeFD(t *testing.T) (*FD, int, func() (bool, error)) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	fd, err := New(p[0], "test pipe")
	if err != nil {
		t.Fatal(err)
	}
	read := func() (bool, error) {
		var b [1]byte
		_, err := unix.Read(p[0], b[:])
		if err == unix.EAGAIN {
			return false, nil
		}
		return err == nil, err
	}
	return fd, p[1], read
}

func TestWaitWakesOnEvent(t *testing.T) {
	fd, w, read := pipeFD(t)
	defer fd.Close()
	go func() {
		time.Sleep(20 * time.Millisecond)
		unix.Write(w, []byte{1})
	}()
	if err := fd.Wait(context.Background(), read); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

func TestWaitHonoursContext(t *testing.T) {
	fd, w, read := pipeFD(t)
	defer fd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := fd.Wait(ctx, read); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait after deadline = %v, want context.DeadlineExceeded", err)
	}
	// The forced deadline must not leak into the next wait.
	unix.Write(w, []byte{1})
	if err := fd.Wait(context.Background(), read); err != nil {
		t.Fatalf("Wait after a cancelled wait: %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if err := fd.Wait(ctx, read); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel = %v, want context.Canceled", err)
	}
}

func TestCloseWakesWaiter(t *testing.T) {
	fd, _, read := pipeFD(t)
	errc := make(chan error, 1)
	go func() { errc <- fd.Wait(context.Background(), read) }()
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
	fd, _, _ := pipeFD(t)
	defer fd.Close()
	boom := errors.New("boom")
	if err := fd.Wait(context.Background(), func() (bool, error) { return false, boom }); err != boom {
		t.Fatalf("Wait = %v, want the read function's error", err)
	}
}
