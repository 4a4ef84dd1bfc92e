// Package fallback decides which transport a connection uses, RDMA or TCP,
// and says why when it is not RDMA.
//
// rdmanet.Dial("tcp", addr) tries RDMA first and falls back to TCP when RDMA
// cannot work; this package holds the parts of that choice that do not need
// RDMA to be understood or tested: the [Policy] (and the [EnvPolicy]
// environment variable that overrides it for a whole process), the
// [Reason]s for falling back and the [Error] that carries one, [Check] (the
// checks that can be made before any packet is sent), the per-destination
// [Memory] of failures, and the [Counters] of connections and fallbacks.
//
// Every reason is an error value, so a connection's reason, or the error of
// a dial whose policy forbids TCP, can be tested with errors.Is:
//
//	if t, why := rdmanet.TransportOf(c); t == fallback.TCP && errors.Is(why, fallback.ReasonNoDevice) { ... }
package fallback
