package link

// LockPoster takes and gives back the lock a PostSend on p holds, for
// tests (package link_test) that check a notification never runs under it.
func LockPoster(p *Pipe) {
	p.pair.mu.Lock()
	p.pair.mu.Unlock()
}

// ErrInjected is FailNext's error when it is given none.
var ErrInjected = errInjected

// RingBase is where the fake addresses of the pipe's receive rings start.
const RingBase = ringBase
