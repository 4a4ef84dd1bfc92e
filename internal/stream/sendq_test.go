package stream

import "testing"

// The circle of signaled requests grows with what is in flight, keeping
// their order across its wrap, and stays small for a connection that has
// little in flight.
func TestSendQueueSignaledGrow(t *testing.T) {
	q := NewSendQueue(255, 1<<16)
	var inFlight []uint64
	complete := func(n int) {
		t.Helper()
		for range n {
			control, err := q.Complete(inFlight[0])
			if err != nil {
				t.Fatal(err)
			}
			if !control {
				t.Fatalf("request %d completed as data", inFlight[0])
			}
			inFlight = inFlight[1:]
		}
	}
	// Two at a time, many times: the circle wraps and stays at its first size.
	for range 100 {
		inFlight = append(inFlight, q.PostControl(), q.PostControl())
		complete(2)
	}
	if n := len(q.pending); n > 4 {
		t.Fatalf("%d places for 2 in flight", n)
	}
	// Then more and more in flight, its head mid-circle when it grows.
	for _, k := range []int{3, 7, 30, 200, 255} {
		inFlight = append(inFlight, q.PostControl())
		complete(1)
		for len(inFlight) < k {
			inFlight = append(inFlight, q.PostControl())
		}
		if q.SignaledOutstanding() != k || len(q.pending) < k || len(q.pending) > 255 {
			t.Fatalf("%d in flight: %d outstanding, %d places", k, q.SignaledOutstanding(), len(q.pending))
		}
		complete(k - 1)
	}
	complete(len(inFlight))
	if q.SignaledPending() {
		t.Fatal("signaled requests left")
	}
}
