package nbd

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"
)

// TestClientHashChecked: an export written block by block through the
// client, then read back, hashes as what was written; at queue depths 1
// and 32, in order and at random, on memory and on a file (whose contents
// are checked too).
func TestClientHashChecked(t *testing.T) {
	const (
		size  = 4 << 20
		block = 4096
	)
	for _, backend := range []string{"memory", "file"} {
		for _, depth := range []int{1, 32} {
			for _, random := range []bool{false, true} {
				order := "sequential"
				if random {
					order = "random"
				}
				t.Run(fmt.Sprintf("%s/qd%d/%s", backend, depth, order), func(t *testing.T) {
					var b Backend = NewMemory(size)
					var path string
					if backend == "file" {
						path = tempFile(t, make([]byte, size))
						f, err := OpenFile(path)
						if err != nil {
							t.Fatal(err)
						}
						t.Cleanup(func() { f.Close() })
						b = f
					}
					addr, _ := startServer(t, b, Options{})
					c := dialClient(t, addr)
					src := randomBytes(size)
					rng := rand.New(rand.NewPCG(uint64(depth), 1))
					blocks := func() []int {
						if random {
							return rng.Perm(size / block)
						}
						s := make([]int, size/block)
						for i := range s {
							s[i] = i
						}
						return s
					}
					err := forBlocks(depth, blocks(), func(i int) error {
						return c.Write(src[i*block:(i+1)*block], int64(i*block), 0)
					})
					if err != nil {
						t.Fatalf("write: %v", err)
					}
					dst := make([]byte, size)
					err = forBlocks(depth, blocks(), func(i int) error {
						return c.Read(dst[i*block:(i+1)*block], int64(i*block))
					})
					if err != nil {
						t.Fatalf("read: %v", err)
					}
					if sha256.Sum256(dst) != sha256.Sum256(src) {
						t.Fatal("what was read back differs from what was written")
					}
					if path != "" {
						onDisk, err := os.ReadFile(path)
						if err != nil {
							t.Fatal(err)
						}
						if sha256.Sum256(onDisk) != sha256.Sum256(src) {
							t.Fatal("the file differs from what was written")
						}
					}
				})
			}
		}
	}
}

// forBlocks calls f for each block from depth goroutines at once, and
// returns the first error.
func forBlocks(depth int, blocks []int, f func(int) error) error {
	next := make(chan int)
	errs := make(chan error, depth)
	var wg sync.WaitGroup
	for range depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					errs <- err
					for range next {
					}
					return
				}
			}
		}()
	}
	for _, i := range blocks {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	return <-errs
}

// TestClientErrors: a server's error reaches the caller as an Errno, and
// the client goes on.
func TestClientErrors(t *testing.T) {
	addr, _ := startServer(t, NewMemory(1<<20), Options{})
	c := dialClient(t, addr)
	buf := make([]byte, 4096)
	if err := c.Read(buf, 1<<20-1024); !errors.Is(err, EINVAL) {
		t.Errorf("read past the end: %v, want EINVAL", err)
	}
	if err := c.Write(buf, 1<<20-1024, 0); !errors.Is(err, ENOSPC) {
		t.Errorf("write past the end: %v, want ENOSPC", err)
	}
	if err := c.Read(buf, 0); err != nil {
		t.Errorf("read after the errors: %v", err)
	}
	if err := c.Read(buf, -1); !errors.Is(err, EINVAL) {
		t.Errorf("read at a negative offset: %v, want EINVAL", err)
	}
	if err := c.Trim(0, 1<<32, 0); !errors.Is(err, EINVAL) {
		t.Errorf("trim of 4 GiB, more than a request's 32 bits: %v, want EINVAL", err)
	}
}

// TestClientZeroesAndTrim: WRITE_ZEROES zeroes, with or without NO_HOLE and
// FUA; TRIM is accepted.
func TestClientZeroesAndTrim(t *testing.T) {
	for _, backend := range []string{"memory", "file"} {
		t.Run(backend, func(t *testing.T) {
			src := randomBytes(1 << 20)
			var b Backend
			if backend == "file" {
				f, err := OpenFile(tempFile(t, src))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				b = f
			} else {
				b = NewMemory(1 << 20)
				b.WriteAt(src, 0)
			}
			addr, _ := startServer(t, b, Options{})
			c := dialClient(t, addr)
			if err := c.WriteZeroes(8192, 65536, 0); err != nil {
				t.Fatal(err)
			}
			if err := c.WriteZeroes(200000, 1000, FlagNoHole|FlagFUA); err != nil {
				t.Fatal(err)
			}
			if err := c.Trim(1<<19, 1<<18, FlagFUA); err != nil {
				t.Fatal(err)
			}
			want := bytes.Clone(src)
			clear(want[8192 : 8192+65536])
			clear(want[200000:201000])
			got := make([]byte, 1<<20)
			if err := c.Read(got, 0); err != nil {
				t.Fatal(err)
			}
			// The trimmed range may read as anything.
			copy(got[1<<19:1<<19+1<<18], want[1<<19:])
			if !bytes.Equal(got, want) {
				t.Fatal("contents differ after WRITE_ZEROES")
			}
		})
	}
}

// TestClientClose: Close waits for the replies in flight; calls after it
// fail with ErrClientClosed.
func TestClientClose(t *testing.T) {
	addr, _ := startServer(t, NewMemory(1<<20), Options{})
	c := dialClient(t, addr)
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.Write(make([]byte, 65536), int64(i)*65536, 0)
		}()
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
	if err := c.Flush(); !errors.Is(err, ErrClientClosed) {
		t.Errorf("a call after Close: %v, want ErrClientClosed", err)
	}
}

// TestClientReadsInCaller: a Client has no goroutine of its own: the calls
// that wait read the replies (the reader's role), so a caller that waits
// for each answer reads its own with no hand-off, and an idle Client runs
// nothing.
func TestClientReadsInCaller(t *testing.T) {
	addr, _ := startServer(t, NewMemory(1<<20), Options{})
	c := dialClient(t, addr)
	buf := make([]byte, 4096)
	for i := range 10 {
		if err := c.Read(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	stacks := make([]byte, 1<<20)
	stacks = stacks[:runtime.Stack(stacks, true)]
	if bytes.Contains(stacks, []byte("nbd.(*Client)")) {
		t.Fatalf("an idle Client runs a goroutine:\n%s", stacks)
	}
}
