package rdmanet

import "github.com/rdmanet/sdk/internal/wire"

// EndLateWatches ends the watches of connection requests that dials gave
// up on, and waits until they released their cm IDs, so that a test can
// count what is left open.
var EndLateWatches = endLateWatches

// WithIWARPDataPath returns cfg with the link features of an iWARP device
// (write notices, receive credit) needed whatever the device: the lab runs
// iWARP's data path on Soft-RoCE with it.
func WithIWARPDataPath(cfg Config) Config {
	cfg.linkNeeds = wire.LinkFeatures
	return cfg
}
