//go:build linux && !race

// Allocation counts mean nothing under the race detector, which allocates itself.

package pollfd

import (
	"context"
	"golang.org/x/sys/unix"
	"testing"
	"time"
)

func TestWaitDoesNotAllocate(t *testing.T) {
	fd, w := pipeFD(t, nil)
	defer fd.Close()
	go func() {
		for i := 0; i < 101; i++ {
			time.Sleep(time.Millisecond)
			unix.Write(w, []byte{1})
		}
	}()
	if allocs := testing.AllocsPerRun(100, func() {
		if err := fd.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("Wait allocates %v times, want 0", allocs)
	}
}
