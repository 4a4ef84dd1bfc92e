package nbd

import "sync"

// budget is a count of bytes that a connection's requests take before they
// are read into memory and give back once answered, so that a client cannot
// make the server hold more than that for it, however many large requests
// it queues.
type budget struct {
	mu    sync.Mutex
	freed sync.Cond
	avail int64
}

func newBudget(n int64) *budget {
	b := &budget{avail: n}
	b.freed.L = &b.mu
	return b
}

// acquire waits until n bytes are available and takes them; n must not be
// more than the budget's total.
func (b *budget) acquire(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	for b.avail < n {
		b.freed.Wait()
	}
	b.avail -= n
	b.mu.Unlock()
}

func (b *budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.avail += n
	b.mu.Unlock()
	b.freed.Broadcast()
}
