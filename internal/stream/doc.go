// Package stream is rdmanet's byte-stream protocol over a link, in pure Go:
// the receive window or ring (where the peer's writes land and what Read may
// consume), the send window or ring (the peer's buffer this side writes
// into), the accounting of the send queue and the transmit ring (which
// requests are signaled and what their completions free), coalescing of
// small writes, the control messages and their bounded queue, the peer's
// limits, keepalive and dead-path detection, half-close and the orderly
// drain, and every protocol error.
//
// The Engine takes events in (a Write or Read by the application, a
// completion from the link, a clock tick) and puts actions out (requests to
// post, receives to post again, which waiters may make progress). It does no
// I/O, starts no goroutine and takes no lock: rdmanet.Conn owns it under its
// lock and carries its actions out on a link.Link. So all of it is tested,
// property-checked and fuzzed without RDMA, over link.Pipe or no link at all.
package stream
