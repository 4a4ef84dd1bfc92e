package nbd

// Backend is the storage behind an export. The server checks every request
// against Size before it calls a method, so a Backend is only asked for
// ranges within [0, Size()); it calls methods from several goroutines at
// once, for requests that may overlap.
type Backend interface {
	// Size is the export's size in bytes; it does not change while served.
	Size() int64
	// ReadAt and WriteAt are io.ReaderAt's and io.WriterAt's; a short read
	// or write is an error.
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Sync returns once every write that returned before Sync was called is
	// on stable storage (for a file, fsync).
	Sync() error
	// Trim tells the backend that a range is no longer needed: it may
	// discard it, or do nothing. Reads of it afterwards may return anything.
	Trim(off, length int64) error
	// Zero makes a range read as zeroes. If mayDeallocate, it may do so by
	// discarding the range's storage (a hole in a file).
	Zero(off, length int64, mayDeallocate bool) error
}

// Immediate is implemented by a Backend whose calls return at once: they
// never wait for a device, a lock held across I/O, or another request.
// Memory is one. The server runs a request that comes alone on a
// connection in the connection's reader when its Backend is Immediate and
// says so, with no hand-off to a worker (see transmission.go); any other
// Backend's requests all go to the workers, so that one slow call never
// holds up the reading of the requests behind it.
type Immediate interface {
	Immediate() bool
}

// zeroChunk is the most Zero writes at once where it writes zeroes.
const zeroChunk = 1 << 20

// writeZeroes zeroes a range of b with ordinary writes.
func writeZeroes(b interface {
	WriteAt([]byte, int64) (int, error)
}, off, length int64) error {
	zeroes := make([]byte, min(length, zeroChunk))
	for length > 0 {
		n := min(length, int64(len(zeroes)))
		if _, err := b.WriteAt(zeroes[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}
