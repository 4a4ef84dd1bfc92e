package rdmanet

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/internal/wire"
)

// ListenConfig configures a listener, as net.ListenConfig does.
type ListenConfig struct {
	// Backlog is how many connection requests may wait for Accept (default 128).
	Backlog int
	// Config sizes each accepted connection's buffers and queues.
	Config Config
}

// acceptTimeout bounds the handshake of one accepted connection, so a peer
// that requests and never completes cannot stall Accept.
const acceptTimeout = 10 * time.Second

// Listen listens on address ("host:port"; an empty host means every RDMA
// device) on network "rdma", "rdma4" or "rdma6".
func Listen(network, address string) (*Listener, error) {
	var lc ListenConfig
	return lc.Listen(context.Background(), network, address)
}

// Listen listens on address; the context bounds only the set-up.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (*Listener, error) {
	opErr := func(err error) error { return &net.OpError{Op: "listen", Net: network, Err: err} }
	cfg, err := lc.Config.withDefaults()
	if err != nil {
		return nil, opErr(err)
	}
	ap, err := resolveAddr(ctx, network, address)
	if err != nil {
		return nil, opErr(err)
	}
	if err := cm.Available(); err != nil {
		return nil, opErr(err)
	}
	id, err := cm.NewID()
	if err != nil {
		return nil, opErr(err)
	}
	backlog := lc.Backlog
	if backlog <= 0 {
		backlog = 128
	}
	if err := id.Bind(ap); err != nil {
		id.Close()
		return nil, opErr(err)
	}
	if err := id.Listen(backlog); err != nil {
		id.Close()
		return nil, opErr(err)
	}
	return &Listener{id: id, addr: &Addr{id.LocalAddr()}, cfg: cfg}, nil
}

// Listener accepts RDMA connections. It implements net.Listener.
type Listener struct {
	id   *cm.ID
	addr *Addr
	cfg  Config
}

// Accept waits for the next connection and returns it (a *Conn). Close
// unblocks it with net.ErrClosed. A request that cannot be served (its
// resources cannot be allocated, or its handshake does not finish) is
// rejected and Accept waits for the next.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		req, err := l.id.GetRequest(context.Background())
		if err != nil {
			if errors.Is(err, cm.ErrClosed) {
				err = net.ErrClosed
			}
			return nil, &net.OpError{Op: "accept", Net: Network, Addr: l.addr, Err: err}
		}
		// A Valkey client sends no private data: Valkey's protocol.
		h, ok, err := wire.DecodeHello(req.Param.PrivateData)
		if err != nil {
			req.ID.Reject(rejectReason(err))
			req.ID.Close()
			continue
		}
		var agreed wire.Features
		if ok {
			agreed = h.Features & l.cfg.extensions()
		}
		c, err := newConn(req.ID, l.cfg, true)
		if err != nil {
			req.ID.Reject(rejectReason(err))
			req.ID.Close()
			continue
		}
		if err := req.ID.SetAckTimeout(ackTimeoutExp); err != nil {
			req.ID.Reject(rejectReason(err))
			req.ID.Close()
			c.res.close()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), acceptTimeout)
		// Retry forever on RNR, as for dials: the peer's writes wait for a
		// reposted receive instead of failing.
		err = req.ID.Accept(ctx, cm.ConnParam{PrivateData: l.cfg.hello(agreed), ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7})
		cancel()
		if err != nil {
			req.ID.Close()
			c.res.close()
			continue
		}
		c.start(agreed)
		return c, nil
	}
}

// Close stops listening; pending Accepts return net.ErrClosed. Connections
// already accepted stay open.
func (l *Listener) Close() error { return l.id.Close() }

// Addr is the listening address (*Addr).
func (l *Listener) Addr() net.Addr { return l.addr }

// rejectPrefix starts the private data of a reject that says why, so the
// dialer can report the server's reason instead of a bare "rejected".
const rejectPrefix = "rdmanet: "

// maxRejectData is what a reject may carry on InfiniBand and RoCE.
const maxRejectData = 148

func rejectReason(err error) []byte {
	msg := rejectPrefix + err.Error()
	if len(msg) > maxRejectData {
		msg = msg[:maxRejectData]
	}
	return []byte(msg)
}
