// Package tcplink is a link.Link over a byte stream: normally a TCP
// connection to the same server port a session's RDMA paths use, so that
// "fail over to TCP" is one more link and the stream engine above it does
// not change.
//
// The link behaves as an RDMA reliable connection does, and as link.Pipe
// models one: requests land at the peer in order; SendData and SendControl
// each consume one of the peer's posted receives; SendData and SendMarker
// are checked against the ring the peer announced (address, length, key);
// a signaled request completes once it has landed at the peer, and an
// unsignaled one silently with the next signaled one.
//
// # Goroutines
//
// New starts two goroutines. The writer takes the posted requests (PostSend
// only queues them: it never blocks on the network) and writes them in
// batches (up to 128 requests, with the Ack it owes), one writev per batch
// on a TCP socket (net.Buffers; other net.Conns get one Write per piece),
// reading each request's bytes from the send ring at that moment; payloads
// of 128 bytes or less are copied next to their header, larger ones are
// written straight from the ring. The reader takes frames from the socket through a fixed buffer and
// reads a data frame's payload straight into the receive ring at its place:
// the data lands when it arrives, as a NIC writes it.
//
// # Completions and acknowledgements
//
// A completion means that the peer's link took the request: its data is in
// the peer's receive ring and a receive was consumed for it (as an RC ACK
// comes after the responder placed the message). The reader counts the
// request frames it has taken (data, control, marker) and the writer sends
// that count back as a cumulative Ack frame. Acks are batched: the count is
// handed to the writer whenever the reader has used up what one read from
// the socket gave it (before it may block for more), and before it waits
// for a receive. So an ack never waits for the application to repost
// receives, but it never covers a message that found no receive either:
// that message waits unacknowledged (an RNR NAK's "try again", retried
// forever) until a receive is posted and it lands. The sender's completion
// therefore means delivery into the peer's ring, not a copy into a kernel
// socket buffer, which the engine's dead-path detection (no completion for
// 2 x KeepAlive) and its retention of sent bytes rely on.
//
// Receiver not ready: a data or control frame that arrives when no receive
// is posted stops the reader, which reads nothing more from the socket until
// PostRecv: memory stays bounded and the sender is held back by TCP's own
// flow control (its writer blocks, its PostSend keeps queueing up to
// SendDepth). While the reader waits so, it notices the peer's Disconnect
// frame or the end of the socket only once a receive is posted (or when
// this end's writer finds the peer gone); rdmanet's engine never sends more
// messages than the peer keeps receives posted, so it never waits so.
//
// # Ends
//
//   - Disconnect: requests not yet written are flushed (they never land
//     nor complete; those written may or may not land), this end reports
//     Disconnected at once after what it had already received, and an Ack
//     of everything that landed here, then a Disconnect frame, go behind
//     what was written; the peer reports Disconnected after the frames
//     before it (its requests that landed here complete first).
//   - The socket ending without a Disconnect frame (EOF, including in the
//     middle of a frame, ECONNRESET, EPIPE, io.ErrClosedPipe): the peer's
//     process closed or died and its kernel closed the socket. That is
//     Disconnected too, after what arrived before: the peer is gone, there
//     is nothing to resume on this path.
//   - Any other socket error (a timeout, EHOSTUNREACH, ENETUNREACH,
//     ETIMEDOUT...) is a path failure: Failed, with an Err matching
//     link.ErrDown (errors.Is).
//   - A request outside the peer's announced ring, or with the wrong key:
//     both ends report Failed matching link.ErrRemoteAccess, the sender
//     after the SendDones of the requests before it (an Abort frame tells
//     it).
//   - A malformed frame from the peer: Failed with a *wire.ProtocolError,
//     and an Abort frame tells the peer. Nothing the peer sends makes this
//     end allocate by what it says: frames have fixed headers, and a data
//     payload is read only into the range of the receive ring it was
//     checked against.
//
// Close closes the socket and waits for both goroutines to return: once it
// returns, nothing of the link touches SendRing or RecvRing again, and the
// caller may reuse them (for the session's next link). The net.Conn's Close
// must unblock its pending Read and Write, as every net.Conn's does.
//
// # Frames
//
// Both directions carry the same frames, back to back, with no padding.
// Every frame starts with a one-byte type; integers are big-endian.
//
//	Data (0x01), 17 bytes + N:
//	  [0]      0x01
//	  [1:5]    rkey: the key of the peer's receive ring
//	  [5:13]   address: where in the peer's ring the bytes go (ring address + offset)
//	  [13:17]  N: payload length
//	  [17:17+N] payload
//	Control (0x02), 33 bytes:
//	  [0]      0x02
//	  [1:33]   the 32-byte control message, as SendControl gave it
//	Marker (0x03), 13 bytes: a zero-length write, checked like Data
//	  [0]      0x03
//	  [1:5]    rkey
//	  [5:13]   address
//	Ack (0x04), 9 bytes:
//	  [0]      0x04
//	  [1:9]    how many request frames (Data, Control, Marker) the sender of
//	           the Ack has taken since the link began: cumulative, never
//	           decreasing, at most what was written to it
//	Disconnect (0x05), 1 byte: the orderly end; nothing follows it
//	  [0]      0x05
//	Abort (0x06), 10 bytes: the sender of the Abort failed; nothing follows it
//	  [0]      0x06
//	  [1:9]    how many request frames it had taken before the failure (as Ack)
//	  [9]      why: 1 remote access error (the next request frame after that
//	           count named a range outside the ring or the wrong key);
//	           2 protocol error (a malformed frame)
//
// Any other type byte is a protocol error. The connection's set-up (which
// side is which, the rings' sizes, the rdmanet Hello) is the caller's, done
// on the socket before New.
package tcplink
