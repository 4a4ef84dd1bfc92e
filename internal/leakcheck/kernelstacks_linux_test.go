package leakcheck

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A thread blocked in a read of a pipe (not an idle wait of Go's) is
// reported with its kernel stack; none is once it returned.
func TestKernelStacksShowABlockedThread(t *testing.T) {
	if _, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(syscall.Gettid()) + "/stack"); err != nil {
		t.Skipf("kernel stacks cannot be read here (root only): %v", err)
	}
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil { // blocking: no netpoller
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	read := make(chan error, 1)
	go func() {
		_, err := syscall.Read(p[0], make([]byte, 1))
		read <- err
	}()
	var seen bool
	for end := time.Now().Add(10 * time.Second); !seen && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		seen = strings.Contains(KernelStacks(), "pipe_read")
	}
	if !seen {
		t.Errorf("no thread in pipe_read among:\n%s", KernelStacks())
	}
	syscall.Write(p[1], []byte{1})
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if s := KernelStacks(); strings.Contains(s, "pipe_read") {
		t.Errorf("a thread still in pipe_read after its read returned:\n%s", s)
	}
}
