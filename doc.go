// Module github.com/rdmanet/sdk gives Go programs RDMA connections as plain
// net.Conn and net.Listener values, with automatic, explained fallback to TCP.
//
// The module's packages, from the API inwards:
//
//   - rdmanet: Dial and Listen, drop-ins for net.Dial and net.Listen: RDMA
//     where it works (Valkey's RDMA wire protocol, extended between rdmanet
//     peers), TCP where it does not, and the reason visible on every
//     connection.
//   - fallback: the transport policy, the reasons for using TCP, and the
//     checks, memory and counters behind the choice.
//   - verbs: Go over libibverbs (devices, protection domains, registered
//     memory, completion queues and channels, queue pairs).
//   - cm: Go over librdmacm (address and route resolution, listen, connect,
//     accept, reject, disconnect, with events as Go values).
//   - internal/rdmacore: the only cgo code; opens rdma-core with dlopen at first
//     use, so programs build and run on hosts without it and learn why RDMA is
//     unavailable (verbs.Available).
//   - cmd/rdmanet-lab: boots a QEMU VM with Soft-RoCE (rdma_rxe) and runs any
//     command or `go test -exec` inside, so RDMA code is tested on real verbs
//     on machines without RDMA hardware.
//
// The examples (examples/echo, examples/kv: an echo server and client, and a
// Redis-protocol KV server, over RDMA and TCP) are a module of their own,
// github.com/rdmanet/sdk/examples, so that their dependencies (go-redis) are
// not this module's.
//
// Waits for completions and connection events park goroutines in Go's
// netpoller, never an OS thread in C.
package sdk
