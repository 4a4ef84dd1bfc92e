package verbs

import (
	"sync"
	"unsafe"

	"github.com/rdmanet/sdk/internal/guard"
	"github.com/rdmanet/sdk/internal/rdmacore"
)

// SRQ is a shared receive queue (struct ibv_srq): receives that many
// queue pairs of one protection domain take from, as nvmet-rdma's queue
// pairs do. A completion of one names the queue pair that took it
// (WorkCompletion.QPNum), not the queue's.
type SRQ struct {
	g     guard.Guard
	raw   rdmacore.SRQ
	maxWR int
	mu    sync.Mutex // one poster at a time
}

// NewSRQ creates a shared receive queue in pd for maxWR receives of one
// scatter-gather entry each. With limit > 0 the device raises
// EventSRQLimitReached, once, when fewer than limit receives are posted
// (Arm sets it again).
func (pd *PD) NewSRQ(maxWR, limit int) (*SRQ, error) {
	if !pd.g.Use() {
		return nil, ErrClosed
	}
	defer pd.g.Done()
	raw, got, err := rdmacore.CreateSRQ(pd.raw, maxWR, limit)
	if err != nil {
		return nil, err
	}
	live.srqs.Add(1)
	return &SRQ{raw: raw, maxWR: got}, nil
}

// MaxWR is how many receives the queue holds, as the provider sized it
// (at least what was asked).
func (s *SRQ) MaxWR() int { return s.maxWR }

// Raw is the rdma-core handle: for package cm, and an identity
// (asynchronous events name it).
func (s *SRQ) Raw() rdmacore.SRQ { return s.raw }

// Arm sets the limit again: EventSRQLimitReached comes once fewer than
// limit receives are posted.
func (s *SRQ) Arm(limit int) error {
	if !s.g.Use() {
		return ErrClosed
	}
	defer s.g.Done()
	return rdmacore.ArmSRQ(s.raw, limit)
}

// PostRecv posts receives to the queue, as QP.PostRecv does.
func (s *SRQ) PostRecv(wrs []RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if !s.g.Use() {
		return ErrClosed
	}
	defer s.g.Done()
	s.mu.Lock()
	calls.postRecv.Add(1)
	n, err := rdmacore.PostSRQRecv(s.raw, unsafe.Slice((*rdmacore.RecvReq)(unsafe.Pointer(&wrs[0])), len(wrs)))
	s.mu.Unlock()
	if err != nil {
		return &PostError{Posted: n, Err: err}
	}
	return nil
}

// Close destroys the queue. Every queue pair on it must be gone first.
func (s *SRQ) Close() error {
	return s.g.Close(func() error {
		if err := rdmacore.DestroySRQ(s.raw); err != nil {
			return err
		}
		live.srqs.Add(-1)
		return nil
	})
}
