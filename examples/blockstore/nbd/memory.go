package nbd

import (
	"fmt"
	"io"
	"sync"
)

// Memory is a Backend in memory: a volatile disk for tests and benchmarks,
// whose Sync has nothing to do.
type Memory struct {
	// mu makes overlapping requests, which the protocol leaves undefined,
	// at least not a data race: reads share it, writes take it alone. A
	// write holds it only for a copy in memory.
	mu   sync.RWMutex
	data []byte
}

// NewMemory returns a Memory of size bytes, all zero.
func NewMemory(size int64) *Memory {
	return &Memory{data: make([]byte, size)}
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
