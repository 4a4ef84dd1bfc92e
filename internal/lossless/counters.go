package lossless

import "strings"

// pickCounters keeps the statistics whose names mean pause frames or
// discards. Drivers name them their own way: mlx5 rx_pause_ctrl_phy,
// tx_prio3_pause, rx_discards_phy, rx_out_of_buffer; bnxt rx_pause_frames,
// rx_pfc_ena_frames_pri3; ice link_xoff_rx, priority_xon_tx.
func pickCounters(stats []Stat) Counters {
	c := Counters{Pause: []Stat{}, Discards: []Stat{}, Total: len(stats)}
	for _, s := range stats {
		n := strings.ToLower(s.Name)
		switch {
		case strings.Contains(n, "pause") || strings.Contains(n, "xoff") || strings.Contains(n, "xon") || strings.Contains(n, "pfc"):
			c.Pause = append(c.Pause, s)
		case strings.Contains(n, "discard") || strings.Contains(n, "out_of_buffer"):
			c.Discards = append(c.Discards, s)
		}
	}
	return c
}
