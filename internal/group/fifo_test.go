package group

import (
	"slices"
	"testing"
)

// TestFifoDeleteFunc: deleteFunc keeps the others in order, wherever the
// queue's head is, and the queue goes on as before.
func TestFifoDeleteFunc(t *testing.T) {
	var f fifo[int]
	for i := range 8 {
		f.push(i)
	}
	f.pop()
	f.pop() // the head is not the array's start
	f.deleteFunc(func(v int) bool { return v%3 == 0 })
	f.push(8)
	var got []int
	for f.len() > 0 {
		got = append(got, *f.front())
		f.pop()
	}
	if want := []int{2, 4, 5, 7, 8}; !slices.Equal(got, want) {
		t.Fatalf("after deleting multiples of 3: %v, want %v", got, want)
	}
	f.push(1)
	f.deleteFunc(func(int) bool { return true })
	if f.len() != 0 || f.head != 0 || len(f.buf) != 0 {
		t.Fatalf("after deleting everything: len %d, head %d, buf %v", f.len(), f.head, f.buf)
	}
}
