package rdmanet

import (
	"context"
	"runtime"
)

// Making a connection's resources (newConn: registering its buffers,
// creating its queues, posting its receives) is CPU and kernel work that
// goes no faster with more of it at once than there are CPUs. In a burst,
// doing all of it at once shares the CPUs among every connection, so all
// finish late together, while each dialer's RDMATimeout runs from its
// request until the server has made its side. Letting only as many through
// at once as there are CPUs makes them finish in order, the first ones
// early. Dials and accepts have a gate each, so that a burst of dials in a
// process cannot hold up the answers its listeners owe to waiting peers.
// Only this work is gated: no wait for the network ever holds a gate.

// setupGate lets a few connections' resources be made at once.
type setupGate chan struct{}

func newSetupGate() setupGate { return make(setupGate, max(2, runtime.GOMAXPROCS(0))) }

var dialSetups, acceptSetups = newSetupGate(), newSetupGate()

// enter waits for a turn, or for ctx to end (its error).
func (g setupGate) enter(ctx context.Context) error {
	select {
	case g <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g setupGate) leave() { <-g }
