package main

import (
	"fmt"
	"strings"

	"github.com/rdmanet/sdk/internal/benchkit"
)

// rxeImpls are the implementations of the rxe comparison: all but the siw
// section's.
func (r report) rxeImpls() []impl {
	var impls []impl
	for _, im := range r.impls {
		if !im.isSIW() {
			impls = append(impls, im)
		}
	}
	return impls
}

func (r report) hasRXE() bool { return len(r.rxeImpls()) > 0 }

// siwImpls are the siw section's implementations in this run.
func (r report) siwImpls() []impl {
	var impls []impl
	for _, im := range r.impls {
		if im.isSIW() {
			impls = append(impls, im)
		}
	}
	return impls
}

// siwReference is the siw section's perftest, if it ran.
func (r report) siwReference() (impl, bool) {
	for _, im := range r.siwImpls() {
		if im.id == siwPrefix+"perftest" {
			return im, true
		}
	}
	return impl{}, false
}

// siwSection writes the siw figures: stream and round trips, and rdmanet's
// ratios to perftest on the same pair.
func (r report) siwSection(w *strings.Builder) {
	impls := r.siwImpls()
	if len(impls) == 0 {
		return
	}
	p := r.set.env.IWARP()
	fmt.Fprintf(w, "## On Soft-iWARP (siw)\n\n")
	fmt.Fprintf(w, "The same measurements on the lab's iWARP pair (issue 13), in the same rounds as the rest: "+
		"every client on %s (%s), every server on %s (%s). siw carries iWARP over the kernel's TCP, "+
		"here through the loopback, on the same emulated CPU, so these figures include the kernel's TCP "+
		"and are not comparable with the rxe tables' except as ratios within this run. iWARP has no "+
		"immediate data: rdmanet's data goes as an RDMA write followed by a small \"Written\" notice "+
		"(data path `write-and-notice`, checked on every connection; docs/protocol.md, \"iWARP\"); "+
		"each rdmanet row is a connection with a queue pair of its own (`NoLinkGroups: true`, checked), as on rxe; "+
		"the valkey mode is not here, as Valkey's protocol needs immediate data and rdmanet refuses it on iWARP. "+
		"The reference is perftest on the same pair with rdma_cm set-up (-R), which iWARP requires: "+
		"ib_write_bw -R (RDMA writes, no copy, no receiver involvement) and ib_send_lat -R (busy-polling "+
		"sends, half round trips shown doubled). ib_send_lat -R works on siw, but now and then a run of it fails "+
		"(`Bad wc status -- 5` on both ends; such a round is listed under the problems). "+
		"Bytes per measurement and round trips as in the rxe tables.\n\n",
		p.AddrA, p.DevA, p.AddrB, p.DevB)

	fmt.Fprintf(w, "Stream throughput on siw:\n\n")
	header, rows := r.streamTable(impls)
	table(w, header, rows)
	fmt.Fprintf(w, "Round trips on siw:\n\n")
	header, rows = r.roundTripTable(impls)
	table(w, header, rows)

	r.siwRatios(w, impls)
}

// siwRatios writes each rdmanet mode's figures on siw divided by perftest's
// on siw: above 1 is better for throughput, below 1 for round trips.
func (r report) siwRatios(w *strings.Builder, impls []impl) {
	ref, haveRef := r.siwReference()
	header := []string{"rdmanet mode"}
	for _, size := range benchkit.StreamSizes {
		header = append(header, "stream "+benchkit.SizeName(size))
	}
	for _, size := range benchkit.PingPongSizes {
		header = append(header, "round trip "+benchkit.SizeName(size)+" p50")
	}
	var rows [][]string
	for _, im := range impls {
		if im.id == ref.id {
			continue
		}
		rw := []string{strings.TrimPrefix(im.id, siwPrefix+"rdmanet/")}
		add := func(k kind, size int, get func(figure) float64) {
			v, ok, _ := ratio(r.res[key{im.id, k, size}], r.res[key{ref.id, k, size}], haveRef, get)
			if !ok {
				rw = append(rw, "–")
				return
			}
			rw = append(rw, fmt.Sprintf("%.2f", v))
		}
		for _, size := range benchkit.StreamSizes {
			add(stream, size, func(f figure) float64 { return f.mbps })
		}
		for _, size := range benchkit.PingPongSizes {
			add(pingpong, size, func(f figure) float64 { return f.p50 })
		}
		rows = append(rows, rw)
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "rdmanet on siw ÷ perftest -R on siw, same run (above 1 is better for throughput, "+
		"below 1 for round trips; – where either figure is missing or perftest was not run). "+
		"No target applies on siw yet; these ratios are for comparing runs of rdmanet's iWARP path "+
		"against the same reference.\n\n")
	table(w, header, rows)
}
