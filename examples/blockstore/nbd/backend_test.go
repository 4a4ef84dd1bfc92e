package nbd

import (
	"bytes"
	"os"
	"testing"
)

// TestBackends: both backends read what was written, zero and trim, keep
// to their size, and refuse ranges outside it.
func TestBackends(t *testing.T) {
	const size = 4 << 20
	for _, name := range []string{"memory", "file"} {
		t.Run(name, func(t *testing.T) {
			var b Backend
			var path string
			if name == "file" {
				path = tempFile(t, make([]byte, size))
				f, err := OpenFile(path)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				b = f
			} else {
				b = NewMemory(size)
			}
			if b.Size() != size {
				t.Fatalf("Size %d", b.Size())
			}
			data := randomBytes(size)
			if n, err := b.WriteAt(data, 0); n != size || err != nil {
				t.Fatalf("WriteAt: %d, %v", n, err)
			}
			// More than one chunk of written zeroes.
			if err := b.Zero(4096, 3*zeroChunk/2, false); err != nil {
				t.Fatal(err)
			}
			clear(data[4096 : 4096+3*zeroChunk/2])
			if err := b.Zero(100, 200, false); err != nil {
				t.Fatal(err)
			}
			clear(data[100:300])
			if err := b.Zero(1<<21, 65536, true); err != nil {
				t.Fatal(err)
			}
			clear(data[1<<21 : 1<<21+65536])
			if err := b.Trim(3<<20, 1<<18); err != nil {
				t.Fatal(err)
			}
			if err := b.Sync(); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if n, err := b.ReadAt(got, 0); n != size || (err != nil && n != size) {
				t.Fatalf("ReadAt: %d, %v", n, err)
			}
			copy(got[3<<20:3<<20+1<<18], data[3<<20:]) // trimmed: anything
			if !bytes.Equal(got, data) {
				t.Fatal("contents differ")
			}
			for _, r := range [][2]int64{{size, 1}, {size - 1, 2}, {-1, 1}, {0, size + 1}} {
				if _, err := b.ReadAt(make([]byte, r[1]), r[0]); err == nil {
					t.Errorf("ReadAt [%d, +%d) outside: no error", r[0], r[1])
				}
				if _, err := b.WriteAt(make([]byte, r[1]), r[0]); err == nil {
					t.Errorf("WriteAt [%d, +%d) outside: no error", r[0], r[1])
				}
				if err := b.Zero(r[0], r[1], false); err == nil {
					t.Errorf("Zero [%d, +%d) outside: no error", r[0], r[1])
				}
				if err := b.Trim(r[0], r[1]); err == nil {
					t.Errorf("Trim [%d, +%d) outside: no error", r[0], r[1])
				}
			}
			if path != "" {
				if fi, err := os.Stat(path); err != nil || fi.Size() != size {
					t.Fatalf("the file: %v, %v", fi, err)
				}
			}
		})
	}
}

// TestBuffers: a buffer is big enough, and comes back from its pool.
func TestBuffers(t *testing.T) {
	for _, n := range []int{0, 1, 4095, 4096, 4097, 65536, 1 << 25, 1<<25 + 1} {
		b := getBuffer(n)
		if len(b) != n {
			t.Errorf("getBuffer(%d): len %d", n, len(b))
		}
		putBuffer(b)
	}
	if c := bufferClass(1<<25 + 1); c != -1 {
		t.Errorf("class of 32 MiB + 1: %d, want none", c)
	}
	if c := bufferClass(5000); c != 1 {
		t.Errorf("class of 5000 bytes: %d, want 1 (8 KiB)", c)
	}
}
