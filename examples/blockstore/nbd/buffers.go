package nbd

import (
	"math/bits"
	"sync"
)

// Request data buffers are reused, in pools by power-of-two size from 4 KiB
// to 32 MiB, so that a stream of requests does not make a stream of garbage.
// Larger buffers (a MaxPayload above 32 MiB) are allocated each time.
const (
	minBufferShift = 12
	maxBufferShift = 25
)

var bufferPools [maxBufferShift - minBufferShift + 1]sync.Pool

// bufferClass returns the pool for buffers of at least n bytes, or -1.
func bufferClass(n int) int {
	if n <= 1<<minBufferShift {
		return 0
	}
	shift := bits.Len(uint(n - 1))
	if shift > maxBufferShift {
		return -1
	}
	return shift - minBufferShift
}

// getBuffer returns a buffer of n bytes, whose contents are not zeroed.
func getBuffer(n int) []byte {
	class := bufferClass(n)
	if class < 0 {
		return make([]byte, n)
	}
	if p, ok := bufferPools[class].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return make([]byte, n, 1<<(class+minBufferShift))
}

// putBuffer gives a buffer from getBuffer back; b must not be used after.
func putBuffer(b []byte) {
	class := bufferClass(cap(b))
	if class < 0 || cap(b) != 1<<(class+minBufferShift) {
		return
	}
	bufferPools[class].Put(&b)
}
