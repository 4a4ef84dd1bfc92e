package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// parseSize reads a byte count: a number with an optional suffix K, M, G or
// T, each 1024 times the one before (KiB, MiB, ... and KB, MB, ... mean the
// same here, as in fio and qemu-img).
func parseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	shift := 0
	if n := len(t); n > 0 {
		if i := strings.IndexByte("KMGT", t[n-1]); i >= 0 {
			shift = 10 * (i + 1)
			t = t[:n-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a number of bytes, with K, M, G or T", s)
	}
	if n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return n << shift, nil
}

// formatSize writes a byte count in the largest binary unit that divides it
// evenly, or with one decimal.
func formatSize(n int64) string {
	units := []string{"bytes", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for i < len(units)-1 && n >= 1<<(10*(i+1)) {
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d bytes", n)
	}
	v := float64(n) / float64(int64(1)<<(10*i))
	if n%(1<<(10*i)) == 0 {
		return fmt.Sprintf("%d %s", n>>(10*i), units[i])
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}
