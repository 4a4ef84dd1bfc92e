package lossless

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kernel's ethtool ioctl interface (include/uapi/linux/ethtool.h);
// dcb_linux_test.go checks these against the header.
const (
	ethtoolGSSetInfo = 0x37 // ETHTOOL_GSSET_INFO
	ethtoolGStrings  = 0x1b // ETHTOOL_GSTRINGS
	ethtoolGStats    = 0x1d // ETHTOOL_GSTATS
	ethSSStats       = 1    // ETH_SS_STATS
	ethGStringLen    = 32   // ETH_GSTRING_LEN
	// maxStats bounds what a driver may claim to have.
	maxStats = 1 << 16
)

// ifreqData is struct ifreq with ifr_data, the way SIOCETHTOOL takes its
// argument.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

// ethtool runs one SIOCETHTOOL command on netdev; buf starts with the
// command's number and is where the kernel answers.
func ethtool(fd int, netdev string, buf []byte) error {
	var ifr ifreqData
	if len(netdev) >= len(ifr.name) {
		return fmt.Errorf("netdev name %q too long", netdev)
	}
	copy(ifr.name[:], netdev)
	ifr.data = unsafe.Pointer(&buf[0])
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(buf)
	if errno != 0 {
		return errno
	}
	return nil
}

// readStats reads the driver's statistics (`ethtool -S`): their count, names
// and values.
func readStats(netdev string) ([]Stat, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)

	// struct ethtool_sset_info: cmd, reserved, sset_mask, data[].
	info := make([]byte, 20)
	binary.NativeEndian.PutUint32(info, ethtoolGSSetInfo)
	binary.NativeEndian.PutUint64(info[8:], 1<<ethSSStats)
	if err := ethtool(fd, netdev, info); err != nil {
		return nil, fmt.Errorf("ethtool ETHTOOL_GSSET_INFO: %w", err)
	}
	if binary.NativeEndian.Uint64(info[8:])&(1<<ethSSStats) == 0 {
		return nil, nil // the driver has no statistics
	}
	n := int(binary.NativeEndian.Uint32(info[16:]))
	if n == 0 {
		return nil, nil
	}
	if n > maxStats {
		return nil, fmt.Errorf("ethtool: the driver claims %d statistics", n)
	}

	// struct ethtool_gstrings: cmd, string_set, len, data[len*32].
	strs := make([]byte, 12+n*ethGStringLen)
	binary.NativeEndian.PutUint32(strs, ethtoolGStrings)
	binary.NativeEndian.PutUint32(strs[4:], ethSSStats)
	binary.NativeEndian.PutUint32(strs[8:], uint32(n))
	if err := ethtool(fd, netdev, strs); err != nil {
		return nil, fmt.Errorf("ethtool ETHTOOL_GSTRINGS: %w", err)
	}
	// struct ethtool_stats: cmd, n_stats, data[n] (u64).
	vals := make([]byte, 8+n*8)
	binary.NativeEndian.PutUint32(vals, ethtoolGStats)
	binary.NativeEndian.PutUint32(vals[4:], uint32(n))
	if err := ethtool(fd, netdev, vals); err != nil {
		return nil, fmt.Errorf("ethtool ETHTOOL_GSTATS: %w", err)
	}
	// The kernel writes back how many it filled in; a driver whose count
	// changed between the calls fills in fewer.
	n = min(n, int(binary.NativeEndian.Uint32(strs[8:])), int(binary.NativeEndian.Uint32(vals[4:])))
	out := make([]Stat, n)
	for i := range n {
		name := strs[12+i*ethGStringLen : 12+(i+1)*ethGStringLen]
		if j := bytes.IndexByte(name, 0); j >= 0 {
			name = name[:j]
		}
		out[i] = Stat{Name: strings.TrimSpace(string(name)), Value: binary.NativeEndian.Uint64(vals[8+i*8:])}
	}
	return out, nil
}

// ReadCounters reads the driver statistics of netdev that count pause
// frames and discards.
func ReadCounters(netdev string) Counters {
	stats, err := readStats(netdev)
	if err != nil {
		return Counters{Err: err}
	}
	return pickCounters(stats)
}
