package rdmanet_test

import (
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/rdmanet/sdk/rdmanet"
)

func TestFootprint(t *testing.T) {
	fp, err := rdmanet.Config{}.Footprint()
	if err != nil {
		t.Fatal(err)
	}
	// Idle: chunks of the peer's pools, each a power of two from 4 KiB:
	// a 16 KiB receive ring, a 4 KiB transmit ring, 255 receive slots
	// of 32 bytes (8 KiB) and 16 control slots (4 KiB).
	if want := 16<<10 + 4<<10 + 8<<10 + 4<<10; fp.RegisteredBytes != want || fp.FileDescriptors != 0 || fp.Goroutines != 0 {
		t.Errorf("default Footprint = %+v, want %d bytes idle, no descriptor and no goroutine", fp, want)
	}
	// Streaming: the rings at their full 256 KiB.
	if want := 256<<10 + 256<<10 + 8<<10 + 4<<10; fp.StreamingRegisteredBytes != want {
		t.Errorf("default Footprint = %+v, want %d bytes streaming", fp, want)
	}
	// iWARP without inline sends: a 32-byte notice slot per send queue
	// entry (255) too, an 8 KiB chunk.
	if iw := 16<<10 + 4<<10 + 8<<10 + 4<<10 + 8<<10; fp.IWARPRegisteredBytes != iw || fp.SessionFileDescriptors != 0 {
		t.Errorf("default Footprint = %+v, want %d bytes on iWARP and no session descriptor", fp, iw)
	}
	// The queues, on 4 KiB pages. rxe: 256 slots for 255 entries, of
	// 256 bytes (208 and 32 inline, rounded up) and 64 (40 and an SGE),
	// behind 384 bytes of indices; 510 completion entries of 128 bytes
	// (the kernel's 72-byte ib_wc, rounded up). siw with write notices:
	// 512 send entries of 120 bytes, 256 receive entries of 112, 765
	// completion entries of 32.
	if os.Getpagesize() == 4096 {
		want := []rdmanet.QueueFootprint{
			{Provider: "rxe", SendQueue: 17 << 12, RecvQueue: 5 << 12, CompletionShare: 510 * 128},
			{Provider: "siw", SendQueue: 15 << 12, RecvQueue: 7 << 12, CompletionShare: 765 * 32},
		}
		if !slices.Equal(fp.Queues, want) {
			t.Errorf("default Footprint.Queues = %+v, want %+v", fp.Queues, want)
		}
	}
	// On Linux a dialed session reserves its TCP port with a socket; its
	// rings are registered whole, pages each.
	page := os.Getpagesize()
	s, _ := rdmanet.Config{ResumeTimeout: time.Minute, RecvBuffer: 100 << 10}.Footprint()
	if runtime.GOOS == "linux" && s.SessionFileDescriptors != 1 {
		t.Errorf("a session's Footprint = %+v, want 1 session descriptor", s)
	}
	if want := (100<<10+page-1)/page*page + 256<<10 + 8<<10 + 4<<10; s.RegisteredBytes != want || s.StreamingRegisteredBytes != want {
		t.Errorf("a session's Footprint = %+v, want %d bytes idle and streaming", s, want)
	}
	// A ring larger than the pools' chunks is registered on its own.
	big, _ := rdmanet.Config{RecvBuffer: 1 << 20}.Footprint()
	if want := 1<<20 + 256<<10 + 8<<10 + 4<<10; big.StreamingRegisteredBytes != want {
		t.Errorf("a 1 MiB receive buffer: %d bytes streaming, want %d", big.StreamingRegisteredBytes, want)
	}
	// Fixed rings are full from the start.
	fixed, _ := rdmanet.Config{FixedRings: true}.Footprint()
	if fixed.RegisteredBytes != fp.StreamingRegisteredBytes || fixed.StreamingRegisteredBytes != fp.StreamingRegisteredBytes {
		t.Errorf("fixed rings' Footprint = %+v, want %d bytes idle and streaming", fixed, fp.StreamingRegisteredBytes)
	}
	if _, err := (rdmanet.Config{RecvDepth: 1}).Footprint(); err == nil {
		t.Error("Footprint accepted a Config that Dial would refuse")
	}
}
