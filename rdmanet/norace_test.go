//go:build !race

package rdmanet_test

const raceEnabled = false
