package rdmanet_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"time"

	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/rdmanet"
)

// An echo server and a client, as with package net. On "tcp" networks
// the connection is RDMA where both hosts can use it and TCP otherwise;
// here, on the loopback interface, which has no RDMA device, it is TCP.
func Example() {
	ln, err := rdmanet.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()

	c, err := rdmanet.Dial("tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintln(c, "hello")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(line)
	// Output: hello
}

// TransportOf says what carries a connection and, for TCP, why RDMA was
// not used.
func ExampleTransportOf() {
	ln, err := rdmanet.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	c, err := rdmanet.Dial("tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	transport, why := rdmanet.TransportOf(c)
	fmt.Println(transport)
	// Which reason depends on the host (no device at all, or none on the
	// route to 127.0.0.1); every reason matches fallback.Error.
	var fe *fallback.Error
	fmt.Println(errors.As(why, &fe))
	// Output:
	// tcp
	// true
}

// On an "rdma" network a dial never falls back: where RDMA cannot be used,
// it fails, and the error says why.
func ExampleDialer_rdmaOnly() {
	d := rdmanet.Dialer{Timeout: 5 * time.Second}
	_, err := d.DialContext(context.Background(), "rdma", "127.0.0.1:1")
	var fe *fallback.Error
	fmt.Println(errors.As(err, &fe))
	var op *net.OpError
	fmt.Println(errors.As(err, &op), op.Op)
	// Output:
	// true
	// true dial
}

// Between two rdmanet processes, connections are streams of a link group
// by default: the first dial to a listener makes the group's RDMA links,
// and later dials open a stream in it in one round trip. A connection
// that should keep a queue pair of its own (to measure one, or to isolate
// it from the group's other streams) sets NoLinkGroups; ConnInfo.Stream
// tells which a connection is. (Not run: it needs an RDMA peer.)
func ExampleConfig_noLinkGroups() {
	d := rdmanet.Dialer{Config: rdmanet.Config{NoLinkGroups: true}}
	c, err := d.Dial("rdma", "192.0.2.10:7000")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	info := c.(*rdmanet.Conn).Info()
	if info.Stream == 0 {
		fmt.Printf("queue pair %d of its own on %s\n", info.QP, info.Device)
	}
}

// Reading and writing in place: a view into the receive ring, released
// once used, and a write buffer in the transmit ring, filled and
// committed. ZeroCopyOf gives the same calls over a TCP fallback, where
// they copy (as on this host, which has no RDMA).
func ExampleZeroCopyOf() {
	ln, err := rdmanet.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		zc := rdmanet.ZeroCopyOf(c)
		// A 4-byte length, then that many bytes: both read in place.
		hdr, err := zc.ReadView(4)
		if err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr))
		zc.ReleaseView(hdr)
		body, err := zc.ReadView(n)
		if err != nil {
			return
		}
		fmt.Printf("server: %s\n", body)
		zc.ReleaseView(body) // the ring's space goes back to the peer
	}()

	c, err := rdmanet.Dial("tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	zc := rdmanet.ZeroCopyOf(c)
	msg := "hello, in place"
	b, err := zc.WriteBuffer(4 + len(msg))
	if err != nil {
		log.Fatal(err)
	}
	binary.BigEndian.PutUint32(b, uint32(len(msg)))
	copy(b[4:], msg) // where a storage server would read its block into
	if _, err := zc.Commit(len(b)); err != nil {
		log.Fatal(err)
	}
	io.Copy(io.Discard, c) // until the server closes
	// Output: server: hello, in place
}

// WriteFrom sends bytes of memory registered once (a block cache, a file's
// pages read into it) from where they are. It returns once the memory may
// be reused; over a TCP fallback (ZeroCopyOf) it copies, as Write does.
func ExampleConn_WriteFrom() {
	mem, err := rdmanet.NewMemory(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer mem.Close(context.Background())

	ln, err := rdmanet.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := mem.Bytes()[:64<<10]
		for i := range b {
			b[i] = byte(i)
		}
		rdmanet.ZeroCopyOf(c).WriteFrom(mem, b) // b may change again now
	}()

	c, err := rdmanet.Dial("tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	n, _ := io.Copy(io.Discard, c)
	fmt.Println("received", n, "bytes")
	// Output: received 65536 bytes
}
