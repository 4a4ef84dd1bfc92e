// Command kv is a key-value server that speaks the Redis protocol (RESP2)
// over rdmanet: redis-cli, redis-benchmark and Redis client libraries work
// with it unchanged.
//
//	cd examples   # a module of its own
//	go run ./kv -addr :6379
//
// It listens with rdmanet.Listen on network "tcp", which serves RDMA and TCP
// clients on the same port. See README.md beside this file.
package main

import (
	"context"
	"flag"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/rdmanet/sdk/examples/kv/kvserver"
	"github.com/rdmanet/sdk/rdmanet"
)

func main() {
	addr := flag.String("addr", ":6379", "`host:port` to listen on (an empty host: every address)")
	maxBulk := flag.Int("max-bulk", 64<<20, "largest value or argument a client may send, in `bytes`")
	maxRequest := flag.Int("max-request", 128<<20, "largest request (all its arguments) a client may send, in `bytes`")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log) // rdmanet's own messages too

	ln, err := rdmanet.Listen("tcp", *addr)
	if err != nil {
		log.Error("kv: listen", "err", err)
		os.Exit(1)
	}
	srv := kvserver.New(kvserver.Options{
		MaxBulk:    *maxBulk,
		MaxRequest: *maxRequest,
		Logger:     log,
		OnConn: func(c net.Conn) {
			transport, _ := rdmanet.TransportOf(c)
			log.Info("kv: client connected", "remote", c.RemoteAddr(), "transport", transport)
		},
	})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		log.Info("kv: shutting down")
		srv.Close()
	}()

	log.Info("kv: serving the Redis protocol", "addr", ln.Addr(), "transports", ln.Transports(), "no-rdma-because", ln.RDMAError())
	if err := srv.Serve(ln); err != nil {
		log.Error("kv: serve", "err", err)
		os.Exit(1)
	}
}
