// Package nlmsg is the small part of netlink that rdmanet speaks: encoding a
// request, splitting the kernel's answers into messages and attributes. The
// RDMA netlink family (verbs' `rdma link` view) and rtnetlink's DCB
// messages (internal/lossless's `dcb pfc show` view) share it.
package nlmsg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"

	"golang.org/x/sys/unix"
)

// ErrMalformed is returned for an answer whose lengths do not fit.
var ErrMalformed = errors.New("netlink: malformed message")

// Attr encodes one attribute, padded.
func Attr(typ uint16, v []byte) []byte {
	b := make([]byte, Align(unix.SizeofNlAttr+len(v)))
	binary.NativeEndian.PutUint16(b, uint16(unix.SizeofNlAttr+len(v)))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofNlAttr:], v)
	return b
}

// Attribute is one decoded attribute; Type has the nested and byte-order
// flags cleared.
type Attribute struct {
	Type  uint16
	Value []byte
}

// Attrs iterates over a message's attributes; a length that does not fit
// ends the iteration.
func Attrs(b []byte) iter.Seq[Attribute] {
	return func(yield func(Attribute) bool) {
		for len(b) >= unix.SizeofNlAttr {
			n := int(binary.NativeEndian.Uint16(b))
			if n < unix.SizeofNlAttr || n > len(b) {
				return
			}
			typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
			if !yield(Attribute{typ, b[unix.SizeofNlAttr:n]}) {
				return
			}
			b = b[min(Align(n), len(b)):]
		}
	}
}

// Message is one netlink message: its type and its payload after the
// header.
type Message struct {
	Type uint16
	Data []byte
}

// Parse splits a datagram into netlink messages, refusing lengths that do
// not fit.
func Parse(b []byte) ([]Message, error) {
	var msgs []Message
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return nil, ErrMalformed
		}
		msgs = append(msgs, Message{Type: binary.NativeEndian.Uint16(b[4:]), Data: b[unix.NLMSG_HDRLEN:l]})
		b = b[min(Align(l), len(b)):]
	}
	return msgs, nil
}

// Align rounds n up to netlink's alignment.
func Align(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// Exchange sends one request of type typ with the given flags and body (a
// family header, if any, then attributes) on the bound netlink socket fd,
// and returns the payload of every answer of type typ. It reads until
// NLMSG_DONE or NLMSG_ERROR: a dump ends with the first, and a request
// that is not a dump should carry NLM_F_ACK so that the kernel ends its
// answer with the second. A negative errno in either comes back as a
// unix.Errno.
func Exchange(fd int, typ, flags uint16, body []byte) ([][]byte, error) {
	req := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	req = append(req, body...)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], typ)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|flags)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink request: %w", err)
	}
	var out [][]byte
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("netlink reply: %w", err)
		}
		msgs, err := Parse(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			switch m.Type {
			case unix.NLMSG_DONE, unix.NLMSG_ERROR:
				// Both carry an int: 0, or a negative errno.
				if len(m.Data) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno < 0 {
						return nil, unix.Errno(-errno)
					}
				}
				return out, nil
			case typ:
				out = append(out, append([]byte(nil), m.Data...))
			}
		}
	}
}

// Socket opens and binds a netlink socket of the given protocol
// (unix.NETLINK_RDMA, unix.NETLINK_ROUTE); the caller closes it.
func Socket(proto int) (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return -1, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("netlink bind: %w", err)
	}
	return fd, nil
}
