//go:build cgo

package rdmanet_test

const cgoEnabled = true
