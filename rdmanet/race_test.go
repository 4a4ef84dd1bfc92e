//go:build race

package rdmanet_test

// raceEnabled: the race detector is on (the engine costs several times
// the CPU).
const raceEnabled = true
