package nbd

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// File is a Backend on a file (or a block device): the first Size bytes of
// it. Reads and writes are positioned (pread, pwrite), so requests run in
// parallel; Sync is fsync.
type File struct {
	f    *os.File
	size int64
}

// OpenFile opens path for reading and writing and exports all of it.
func OpenFile(path string) (*File, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	size, err := f.Seek(0, io.SeekEnd) // a block device's size too, where Stat says 0
	if err != nil {
		f.Close()
		return nil, err
	}
	return &File{f: f, size: size}, nil
}

// NewFile exports the first size bytes of f, which must be open for reading
// and writing; nothing beyond them is read or written. File does not close
// f before Close.
func NewFile(f *os.File, size int64) (*File, error) {
	if size < 0 {
		return nil, fmt.Errorf("nbd: negative size %d", size)
	}
	return &File{f: f, size: size}, nil
}

func (b *File) Size() int64 { return b.size }

func (b *File) ReadAt(p []byte, off int64) (int, error) {
	if err := b.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	return b.f.ReadAt(p, off)
}

func (b *File) WriteAt(p []byte, off int64) (int, error) {
	if err := b.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	return b.f.WriteAt(p, off)
}

func (b *File) Sync() error { return b.f.Sync() }

// Trim punches a hole where the file system can (Linux's fallocate), and
// otherwise does nothing: a trim is a hint.
func (b *File) Trim(off, length int64) error {
	if err := b.check(off, length); err != nil {
		return err
	}
	if err := punchHole(b.f, off, length); err != nil && !errors.Is(err, errHolesUnsupported) {
		return err
	}
	return nil
}

// Zero punches a hole if it may and can (a hole reads as zeroes), and
// otherwise writes zeroes.
func (b *File) Zero(off, length int64, mayDeallocate bool) error {
	if err := b.check(off, length); err != nil {
		return err
	}
	if mayDeallocate {
		err := punchHole(b.f, off, length)
		if err == nil || !errors.Is(err, errHolesUnsupported) {
			return err
		}
	}
	return writeZeroes(b.f, off, length)
}

// Close closes the file.
func (b *File) Close() error { return b.f.Close() }

// check refuses ranges outside the export; the server never asks for one,
// and a file must not grow because of a bug.
func (b *File) check(off, length int64) error {
	if off < 0 || length < 0 || off > b.size || length > b.size-off {
		return fmt.Errorf("nbd: range [%d, +%d) outside a file backend of %d bytes", off, length, b.size)
	}
	return nil
}
