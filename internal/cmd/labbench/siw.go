package main

// The siw section (issue 13): rdmanet's stream and round trips on the lab's
// Soft-iWARP pair, with perftest on the same pair as their reference. It is
// kept apart from the rxe comparison so that the rxe tables and issue 3's
// targets stay what they were: siw runs iWARP over the kernel's TCP, a
// different machine from rxe's, and its figures answer a different question
// (what rdmanet's write-and-notice data path costs beside perftest's).

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/rdmanet/sdk/internal/benchkit"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/rdmalink"
	"github.com/rdmanet/sdk/rdmanet"
)

// siwID selects the whole siw section with -only; its implementations' IDs
// all start with siwID + "/".
const siwID = "siw"

// siwPrefix starts the IDs of the siw section's implementations.
const siwPrefix = siwID + "/"

// isSIW says whether an implementation belongs to the siw section.
func (im impl) isSIW() bool { return strings.HasPrefix(im.id, siwPrefix) }

// siwImpls are the siw section's rows: each rdmanet mode that runs on
// iWARP, and perftest with rdma_cm set-up (-R), which iWARP requires
// (docs/lab.md, "Soft-iWARP").
func (b *bench) siwImpls() []impl {
	var impls []impl
	for _, m := range siwModes() {
		impls = append(impls, impl{
			id: siwPrefix + "rdmanet/" + m.Name, label: "rdmanet (" + m.Name + ") on siw", role: roleBaseline,
			stream: func(ctx context.Context, size int, total int64) figure {
				return b.goStream(ctx, siwDial(b.env.IWARP(), m), size, total)
			},
			pingpong: func(ctx context.Context, size, n int) figure {
				return b.goPingPong(ctx, siwDial(b.env.IWARP(), m), size, n)
			},
		})
	}
	return append(impls, impl{
		id: siwPrefix + "perftest", label: "perftest -R on siw", role: roleBaseline,
		streamLabel: "perftest (ib_write_bw -R) on siw", pingpongLabel: "perftest (ib_send_lat -R) on siw",
		stream: b.siwWriteBW,
		pingpong: func(ctx context.Context, size, n int) figure {
			return b.siwSendLat(ctx, size, n)
		},
	})
}

// siwModes are the modes of benchkit.Modes that can run on iWARP, each a
// connection with a queue pair of its own (ownQueuePair): Valkey's
// protocol carries its data as writes with immediate data, which iWARP has
// not, so rdmanet refuses a Valkey-compatible connection on siw. Fixed
// rings, and the waits with no polling, are compared on rxe only: the
// section's time is the run's.
func siwModes() []benchkit.Mode {
	var modes []benchkit.Mode
	for _, m := range ownQueuePairModes() {
		if m.Protocol != rdmanet.ProtocolValkey && !m.Config.FixedRings && m.Config.BusyPoll >= 0 {
			modes = append(modes, m)
		}
	}
	return modes
}

// siwDial connects mode m's pair on p and checks that the connections went
// the iWARP way (write and notice): a pair that fell back to another path
// would measure something else under the siw label.
func siwDial(p labenv.Pair, m benchkit.Mode) dialer {
	return dialer{
		how: fmt.Sprintf("rdmanet mode %q (%s; protocol checked to be %q, data path %q, and each end a connection with a queue pair of its own) on siw, client on %s (%s), listener on %s (%s)",
			m.Name, describeConfig(m.Config), m.Protocol, rdmalink.DataPathNotice, p.AddrA, p.DevA, p.AddrB, p.DevB),
		pair: func(ctx context.Context) (net.Conn, net.Conn, error) {
			client, server, err := checkedPair(ctx, m, p.AddrA, p.AddrB, false)
			if err != nil {
				return nil, nil, err
			}
			for _, c := range []net.Conn{client, server} {
				if dp := c.(*rdmanet.Conn).Info().DataPath; dp != rdmalink.DataPathNotice {
					client.Close()
					server.Close()
					return nil, nil, fmt.Errorf("data path %q on siw, want %q", dp, rdmalink.DataPathNotice)
				}
			}
			return client, server, nil
		},
	}
}

// siwPerftestArgs are a perftest tool's arguments on the siw pair: rdma_cm
// set-up (-R), bound to each device's address.
func (b *bench) siwPerftestArgs(tool string, size, iters int) (server, client []string) {
	p := b.env.IWARP()
	common := []string{"-F", "-R", "-s", strconv.Itoa(size), "-n", strconv.Itoa(iters), "-p", b.port(18514)}
	server = append([]string{tool, "-d", p.DevB, "--source_ip", p.AddrB.String()}, common...)
	client = append(append([]string{tool, "-d", p.DevA, "--source_ip", p.AddrA.String()}, common...), p.AddrB.String())
	return server, client
}

func (b *bench) siwWriteBW(ctx context.Context, size int, total int64) figure {
	iters := int(max(5, total/int64(size)))
	server, client := b.siwPerftestArgs("ib_write_bw", size, iters)
	return b.toolFigure(ctx, server, client, parseWriteBWRun(size, iters))
}

func (b *bench) siwSendLat(ctx context.Context, size, n int) figure {
	server, client := b.siwPerftestArgs("ib_send_lat", size, max(5, n))
	return b.toolFigure(ctx, server, client, parseSendLatRun(size, n))
}
