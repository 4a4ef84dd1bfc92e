// Package nbd speaks the Network Block Device protocol over any net.Conn:
// rdmanet's (RDMA or TCP), plain TCP, a unix socket. It has a server, which
// exports a Backend (a file, or memory) to the Linux kernel's nbd driver,
// qemu, libnbd's tools (nbdinfo, nbdcopy), fio's nbd engine or this
// package's Client; and a Client, which pipelines requests from many
// goroutines over one connection.
//
// What it speaks: the fixed newstyle handshake with NBD_OPT_GO, NBD_OPT_INFO,
// NBD_OPT_EXPORT_NAME, NBD_OPT_LIST and NBD_OPT_ABORT (other options are
// answered NBD_REP_ERR_UNSUP); simple replies; the commands READ, WRITE,
// FLUSH, TRIM, WRITE_ZEROES and DISC, with the FUA and NO_HOLE flags. Not
// structured replies, block status, TLS or extended headers. The protocol is
// doc/proto.md in github.com/NetworkBlockDevice/nbd.
//
// The wire encoding is in wire.go; the server's handshake in handshake.go
// and its transmission phase in transmission.go.
package nbd
