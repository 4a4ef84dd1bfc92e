package main

import (
	"encoding/binary"
	"fmt"
	"io"
)

// The protocol between ping or bench and serve. A client opens a
// connection and sends a 5-byte header: a mode byte and a size (uint32,
// big-endian, 1 to maxSize). Then:
//
//	'P' (ping, echo): the server sends back every byte it receives, until
//	    the client closes. size is the client's message size.
//	'S' (sink): the server reads and discards until the client half-closes
//	    (CloseWrite) or closes, then sends the number of bytes it received
//	    (uint64, big-endian) and closes. size is the client's write size.
//	'R' (source): the server writes size-byte chunks until the client
//	    closes.
//
// An unknown mode or a size out of range makes the server close the
// connection without a reply.
const (
	modePing   = 'P'
	modeSink   = 'S'
	modeSource = 'R'

	headerLen = 5
	maxSize   = 16 << 20
)

func modeName(m byte) string {
	switch m {
	case modePing:
		return "ping"
	case modeSink:
		return "sink"
	case modeSource:
		return "source"
	}
	return fmt.Sprintf("mode %q", m)
}

func encodeHeader(mode byte, size int) []byte {
	h := make([]byte, headerLen)
	h[0] = mode
	binary.BigEndian.PutUint32(h[1:], uint32(size))
	return h
}

func readHeader(r io.Reader) (mode byte, size int, err error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, err
	}
	mode, size = h[0], int(binary.BigEndian.Uint32(h[1:]))
	switch mode {
	case modePing, modeSink, modeSource:
	default:
		return mode, size, fmt.Errorf("unknown mode byte %#x: not an rdmanet ping or bench client", mode)
	}
	if size < 1 || size > maxSize {
		return mode, size, fmt.Errorf("size %d outside 1 to %d", size, maxSize)
	}
	return mode, size, nil
}
