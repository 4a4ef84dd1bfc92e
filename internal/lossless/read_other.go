//go:build !linux

package lossless

// Read returns ErrNotSupported in every part off Linux.
func Read(netdev string) Config {
	return Config{Netdev: netdev, PFC: PFC{Err: ErrNotSupported}, Trust: Trust{Err: ErrNotSupported},
		ECN: ECN{Err: ErrNotSupported}, Counters: Counters{Err: ErrNotSupported}}
}

// ReadCounters returns ErrNotSupported off Linux.
func ReadCounters(netdev string) Counters { return Counters{Err: ErrNotSupported} }
