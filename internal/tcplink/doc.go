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
// # Carrier mode
//
// With Config.Carrier the link is a link.Carrier: it carries a link
// group's streams (internal/group) when the group's RDMA links are down,
// so that TCP is the group's last path. Both ends must set it the same;
// the caller agrees on it with the peer before New, as on the rest of the
// set-up. In carrier mode:
//
//   - SendRing and RecvRing may be empty (a group's base link carries
//     only control messages and stream data). RecvRingKey still names
//     RecvRing; a data request into an empty ring is a remote access
//     error, as one past any ring is.
//   - The link makes no memory: NewRecvRing and NewSendRing fail with an
//     error wrapping ErrNoRings (not link.ErrMisuse; they do so in either
//     mode). The streams on the link keep the rings an RDMA link of the
//     group made, which ShareRecvRing and ShareSendRing register here (the
//     maker is not used). A receive ring gets a fresh rkey, unique among
//     the link's live ones, and a fake address of its own, 4 GiB of
//     address space apart from any other ring's, so that an address of one
//     ring is in no other's range (a ring is at most 4 GiB); a transmit
//     ring gets a fresh key, never 0. Sharing no memory (zero length), or a
//     receive ring already registered, is misuse.
//   - ReleaseRecvRing (a ring ShareRecvRing registered, or the first one)
//     and ReleaseSendRing drop the registration; the memory stays its
//     maker's. Releasing what is not registered is misuse. After it, a
//     peer's data or marker naming the ring is a remote access error (as a
//     wrong key is), and a SendData naming the transmit ring's key is
//     misuse at PostSend.
//   - A SendData with Ring 0 sends from SendRing; with another Ring, from
//     the transmit ring registered under that key. PostSend checks that
//     the key is registered and the range inside that ring (else misuse).
//     The writer reads the bytes when it writes the request, as from
//     SendRing: the caller releases a transmit ring only once no request
//     sends from it (the engine does so after the request's completion,
//     which comes after the peer acknowledged it). ReleaseSendRing of a
//     ring an unacknowledged request sends from is misuse while the link
//     is up; once the link is down, requests not yet written never will
//     be, and if the writer is writing some from that ring, ReleaseSendRing
//     cuts the write short (a write deadline in the past; closing the
//     socket if deadlines fail) and waits for the writer to let go of the
//     ring. The peer then misses what the writer still owed it (an Abort or
//     a Disconnect frame) and sees the socket end at Close.
//   - Every data request is written as a Tagged data frame (0x07), which
//     carries SendWR.Tag; the peer's DataArrived reports it as
//     Completion.Tag. A Tagged data frame on a link not in carrier mode,
//     and a Data frame (0x01) on a link in carrier mode, are protocol
//     errors: the ends disagree on the mode.
//   - The reader does not read a tagged payload straight into the ring:
//     it reads it through its fixed buffer, and copies each piece into the
//     ring under the link's lock once it found the ring still registered.
//     So nothing lands in a ring once ReleaseRecvRing returned, even while
//     the rest of a payload is on its way from a slow peer (the ring may be
//     another link's pinned memory, given back to a pool or unmapped right
//     after). A ring released while a payload lands in it fails the link
//     with a remote access error: an honest peer writes into a ring only
//     while the engine holds it (the engine releases a ring once the peer
//     moved off it and every byte it wrote was read). Memory stays bounded
//     and nothing is allocated per frame.
//   - Close and Config.Release keep their meaning for every ring, shared
//     or not: once Close returns, the link touches none of them again.
//
// Not in carrier mode, ShareRecvRing and ShareSendRing are misuse, so no
// transmit ring has a key and a SendData with Ring set is misuse too.
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
// the data lands when it arrives, as a NIC writes it (in carrier mode,
// through its buffer: see above).
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
//	Data (0x01), not in carrier mode, 17 bytes + N:
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
//	  [1:9]    how many request frames (Data or Tagged data, Control,
//	           Marker) the sender of the Ack has taken since the link
//	           began: cumulative, never decreasing, at most what was
//	           written to it
//	Disconnect (0x05), 1 byte: the orderly end; nothing follows it
//	  [0]      0x05
//	Abort (0x06), 10 bytes: the sender of the Abort failed; nothing follows it
//	  [0]      0x06
//	  [1:9]    how many request frames it had taken before the failure (as Ack)
//	  [9]      why: 1 remote access error (the next request frame after that
//	           count named a range outside the ring or the wrong key, or,
//	           in carrier mode, a ring released before its payload landed);
//	           2 protocol error (a malformed frame, or a data frame of the
//	           other mode)
//	Tagged data (0x07), carrier mode only, 21 bytes + N:
//	  [0]      0x07
//	  [1:5]    rkey: the key of one of the peer's receive rings
//	  [5:13]   address: where the bytes go (that ring's address + offset)
//	  [13:17]  tag: SendWR.Tag, which the peer's DataArrived reports
//	  [17:21]  N: payload length
//	  [21:21+N] payload
//
// Any other type byte is a protocol error. The connection's set-up (which
// side is which, the rings' sizes, the rdmanet Hello) is the caller's, done
// on the socket before New.
package tcplink
