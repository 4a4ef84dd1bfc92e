//go:build !linux

package lossless

// Read returns ErrNotSupported in every part off Linux.
func Read(netdev string) Config {
	return Config{Netdev: netdev, PFC: PFC{Err: ErrNotSupported}, Trust: Trust{Err: ErrNotSupported},
		ECN: ECN{Err: ErrNotSupported}, Counters: Counters{Err: ErrNotSupported}}
}
