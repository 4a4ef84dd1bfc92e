package rdmanet_test

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/rdmanet/sdk/rdmanet"
)

func TestFootprint(t *testing.T) {
	fp, err := rdmanet.Config{}.Footprint()
	if err != nil {
		t.Fatal(err)
	}
	page := os.Getpagesize()
	// 256 KiB each way, and 256 receive plus 16 control slots of 32 bytes
	// rounded up to pages.
	want := 256<<10 + 256<<10 + (272*32+page-1)/page*page
	if fp.RegisteredBytes != want || fp.FileDescriptors != 0 || fp.Goroutines != 0 {
		t.Errorf("default Footprint = %+v, want %d bytes, no descriptor and no goroutine", fp, want)
	}
	// iWARP: a 32-byte notice slot per send queue entry (256) as well.
	if iw := 256<<10 + 256<<10 + (528*32+page-1)/page*page; fp.IWARPRegisteredBytes != iw || fp.SessionFileDescriptors != 0 {
		t.Errorf("default Footprint = %+v, want %d bytes on iWARP and no session descriptor", fp, iw)
	}
	// On Linux a dialed session reserves its TCP port with a socket.
	if s, _ := (rdmanet.Config{ResumeTimeout: time.Minute}).Footprint(); runtime.GOOS == "linux" && s.SessionFileDescriptors != 1 {
		t.Errorf("a session's Footprint = %+v, want 1 session descriptor", s)
	}
	big, _ := rdmanet.Config{RecvBuffer: 1 << 20}.Footprint()
	if big.RegisteredBytes != want+(1<<20-256<<10) {
		t.Errorf("a 1 MiB receive buffer: %d bytes", big.RegisteredBytes)
	}
	if _, err := (rdmanet.Config{RecvDepth: 1}).Footprint(); err == nil {
		t.Error("Footprint accepted a Config that Dial would refuse")
	}
}
