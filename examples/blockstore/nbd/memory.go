package nbd

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/rdmanet/sdk/rdmanet"
)

// Memory is a Backend in memory: a volatile disk for tests and benchmarks,
// whose Sync has nothing to do.
type Memory struct {
	// mu makes overlapping requests, which the protocol leaves undefined,
	// at least not a data race: reads share it, writes take it alone. A
	// write holds it only for a copy in memory.
	mu   sync.RWMutex
	data []byte
	// reg is the memory data is, registered for RDMA sends
	// (NewRegisteredMemory), or nil.
	reg *rdmanet.Memory
}

// NewMemory returns a Memory of size bytes, all zero.
func NewMemory(size int64) *Memory {
	return &Memory{data: make([]byte, size)}
}

// NewRegisteredMemory returns a Memory of size bytes, all zero, in memory
// registered once for RDMA sends (rdmanet.Memory): over an rdmanet
// connection the server sends a large read's data from it, where it is,
// into the client's ring (Conn.PostFrom), with no copy. Close gives it
// back.
func NewRegisteredMemory(size int64) (*Memory, error) {
	if size > rdmanet.MaxMemory {
		return nil, fmt.Errorf("nbd: a registered memory backend of %d bytes (at most %d)", size, int64(rdmanet.MaxMemory))
	}
	reg, err := rdmanet.NewMemory(int(size))
	if err != nil {
		return nil, err
	}
	return &Memory{data: reg.Bytes()[:size], reg: reg}, nil
}

// Close gives back a registered Memory's memory once no reply is sent
// from it any more (or ctx is done); the Memory is unusable after.
func (m *Memory) Close(ctx context.Context) error {
	if m.reg == nil {
		return nil
	}
	return m.reg.Close(ctx)
}

// sendable returns the registered memory and the bytes of [off, +n) in
// it, or nil where m is not registered or the range is not in it.
func (m *Memory) sendable(off, n int64) (*rdmanet.Memory, []byte) {
	if m.reg == nil || m.check(off, n) != nil {
		return nil, nil
	}
	return m.reg, m.data[off : off+n]
}

func (m *Memory) Size() int64 { return int64(len(m.data)) }

func (m *Memory) ReadAt(p []byte, off int64) (int, error) {
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return copy(p, m.data[off:]), nil
}

func (m *Memory) WriteAt(p []byte, off int64) (int, error) {
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return copy(m.data[off:], p), nil
}

func (m *Memory) Sync() error { return nil }

// Immediate says that Memory's calls return at once (Immediate).
func (m *Memory) Immediate() bool { return true }

// Trim zeroes the range: there is no storage to give back, and zeroes are
// as good as anything.
func (m *Memory) Trim(off, length int64) error { return m.Zero(off, length, true) }

func (m *Memory) Zero(off, length int64, _ bool) error {
	if err := m.check(off, length); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.data[off : off+length])
	return nil
}

// check refuses ranges outside the memory; the server never asks for one.
func (m *Memory) check(off, length int64) error {
	if off < 0 || length < 0 || off > int64(len(m.data)) || length > int64(len(m.data))-off {
		return fmt.Errorf("nbd: range [%d, +%d) outside a memory backend of %d bytes: %w", off, length, len(m.data), io.ErrUnexpectedEOF)
	}
	return nil
}
