package rdmanet

import (
	"errors"
	"net"
	"testing"

	"github.com/rdmanet/sdk/internal/tcplink"
	"github.com/rdmanet/sdk/verbs"
)

// TestRingMemOutlivesItsLinks: a session's rings stay mapped while any link
// made over them is open, even after the connection let go of them (a
// failback still dialing when it closed), and no link may be made over
// them after that.
func TestRingMemOutlivesItsLinks(t *testing.T) {
	before := verbs.Resources().Buffers
	m, err := newRingMem(Config{SendBuffer: 64 << 10, RecvBuffer: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var lc tcplink.Config
	if err := m.lendToTCP(&lc); err != nil {
		t.Fatal(err)
	}
	m.close() // the connection is done with the rings
	if n := verbs.Resources().Buffers - before; n != 2 {
		t.Fatalf("%d buffers mapped while a link holds the rings, want 2", n)
	}
	if err := m.lendToTCP(&tcplink.Config{}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a link over the rings of a closed connection: %v, want net.ErrClosed", err)
	}
	lc.SendRing[0] = 1 // still mapped
	lc.Release()
	if n := verbs.Resources().Buffers - before; n != 0 {
		t.Fatalf("%d buffers mapped after the last link released the rings, want 0", n)
	}
}
