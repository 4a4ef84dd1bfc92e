package verbs

import (
	"fmt"
	"github.com/rdmanet/sdk/internal/guard"
	"unsafe"

	"github.com/rdmanet/sdk/internal/rdmacore"
)

// PD is a protection domain (struct ibv_pd).
type PD struct {
	g   guard.Guard
	raw rdmacore.PD
	ctx *Context
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	if !c.g.Use() {
		return nil, ErrClosed
	}
	defer c.g.Done()
	raw, err := rdmacore.AllocPD(c.raw)
	if err != nil {
		return nil, err
	}
	live.pds.Add(1)
	return &PD{raw: raw, ctx: c}, nil
}

// Context is the device the domain belongs to.
func (pd *PD) Context() *Context { return pd.ctx }

// Raw is the rdma-core handle, for package cm.
func (pd *PD) Raw() rdmacore.PD { return pd.raw }

// Close deallocates the domain; its MRs and QPs must be closed first.
func (pd *PD) Close() error {
	return pd.g.Close(func() error {
		if err := rdmacore.DeallocPD(pd.raw); err != nil {
			return err
		}
		live.pds.Add(-1)
		return nil
	})
}

// Access says what a memory region allows (enum ibv_access_flags).
type Access int

const (
	AccessLocalWrite  Access = rdmacore.AccessLocalWrite
	AccessRemoteWrite Access = rdmacore.AccessRemoteWrite
	AccessRemoteRead  Access = rdmacore.AccessRemoteRead
)

// Buffer is page-aligned memory outside the Go heap (an anonymous mapping), so
// the device may keep using it while Go code runs: the GC never moves or frees
// it. Registered ranges must be whole pages for fork safety (MADV_DONTFORK), and
// a mapping always is.
type Buffer struct {
	g    guard.Guard
	mem  []byte
	regs int // live MRs over this buffer, guarded by g
}

// NewBuffer maps size bytes, rounded up to whole pages.
func NewBuffer(size int) (*Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("verbs: buffer size %d", size)
	}
	mem, err := mapMemory(size)
	if err != nil {
		return nil, err
	}
	live.buffers.Add(1)
	return &Buffer{mem: mem}, nil
}

// Bytes is the whole buffer. It stays valid until Close.
func (b *Buffer) Bytes() []byte { return b.mem }

// Len is the buffer's size in bytes.
func (b *Buffer) Len() int { return len(b.mem) }

// Close unmaps the buffer. It fails with ErrBusy while memory regions over it
// are registered.
func (b *Buffer) Close() error {
	return b.g.Close(func() error {
		if b.regs > 0 {
			return fmt.Errorf("verbs: close buffer with %d registered regions: %w", b.regs, ErrBusy)
		}
		if err := unmapMemory(b.mem); err != nil {
			return err
		}
		live.buffers.Add(-1)
		return nil
	})
}

// MR is a registered memory region (struct ibv_mr) over a Buffer, whole
// or a part of it (RegisterPart).
type MR struct {
	g          guard.Guard
	raw        rdmacore.MR
	buf        *Buffer
	mem        []byte // the registered part of buf
	lkey, rkey uint32
}

// Register registers buf with the given access rights.
func (pd *PD) Register(buf *Buffer, access Access) (*MR, error) {
	return pd.register(buf, nil, access)
}

// RegisterPart registers part, which is memory of buf (another domain's
// region of it, say), with the given access rights: the same memory on a
// second device. The part's MR counts as one of buf's, which stays mapped
// until it is closed.
func (pd *PD) RegisterPart(buf *Buffer, part []byte, access Access) (*MR, error) {
	if len(part) == 0 {
		return nil, fmt.Errorf("verbs: RegisterPart of no memory")
	}
	return pd.register(buf, part, access)
}

// register registers part of buf, or all of it if part is nil.
func (pd *PD) register(buf *Buffer, part []byte, access Access) (*MR, error) {
	if !pd.g.Use() {
		return nil, ErrClosed
	}
	defer pd.g.Done()
	buf.g.Lock()
	defer buf.g.Unlock()
	if buf.g.Closed() {
		return nil, ErrClosed
	}
	if part == nil {
		return pd.registerLocked(buf, buf.mem, access)
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(buf.mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(part)))
	if p < start || p+uintptr(len(part)) > start+uintptr(len(buf.mem)) {
		return nil, fmt.Errorf("verbs: RegisterPart of %d bytes outside the %d-byte buffer", len(part), len(buf.mem))
	}
	return pd.registerLocked(buf, part, access)
}

func (pd *PD) registerLocked(buf *Buffer, mem []byte, access Access) (*MR, error) {
	raw, lkey, rkey, err := rdmacore.RegMR(pd.raw, unsafe.Pointer(unsafe.SliceData(mem)), len(mem), int(access))
	if err != nil {
		return nil, err
	}
	buf.regs++
	live.mrs.Add(1)
	return &MR{raw: raw, buf: buf, mem: mem, lkey: lkey, rkey: rkey}, nil
}

// Buffer is the buffer the region is memory of.
func (mr *MR) Buffer() *Buffer { return mr.buf }

// LKey is the key local work requests name the region by.
func (mr *MR) LKey() uint32 { return mr.lkey }

// RKey is the key a peer names the region by in RDMA operations.
func (mr *MR) RKey() uint32 { return mr.rkey }

// Addr is the region's start address as the device sees it.
func (mr *MR) Addr() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mr.mem)))) }

// Bytes is the registered memory.
func (mr *MR) Bytes() []byte { return mr.mem }

// Slice returns the scatter/gather element for [off, off+n) of the region.
func (mr *MR) Slice(off, n int) SGE {
	if off < 0 || n < 0 || off+n > len(mr.mem) {
		panic(fmt.Sprintf("verbs: MR.Slice(%d, %d) outside a %d-byte region", off, n, len(mr.mem)))
	}
	return SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.lkey}
}

// Close deregisters the region; the buffer stays mapped.
func (mr *MR) Close() error {
	return mr.g.Close(func() error {
		if err := rdmacore.DeregMR(mr.raw); err != nil {
			return err
		}
		mr.buf.g.Lock()
		mr.buf.regs--
		mr.buf.g.Unlock()
		live.mrs.Add(-1)
		return nil
	})
}

// SGE is a scatter/gather element: Length bytes at Addr in the region LKey names.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}
