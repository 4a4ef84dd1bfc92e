package kvserver

import (
	"sync"
	"time"
)

// entry is a key's value and when it expires.
//
// A value is never changed once stored, only replaced, so a command may take
// it under the lock and write it to its client after unlocking (a slow
// client then holds up no one else). APPEND is the one exception, and it
// only writes past the end of the old value, which no one holding the old
// slice reads.
type entry struct {
	value    []byte
	expireAt int64 // Unix milliseconds; 0 for a key without a time to live
}

// keyspace is the server's one database: a map under one mutex, with keys
// that have a time to live expired lazily (a read of an expired key deletes
// it) and periodically (expireSome, so keys never read again go too).
type keyspace struct {
	mu       sync.Mutex
	m        map[string]entry
	volatile map[string]struct{} // the keys of m with an expireAt
}

func newKeyspace() *keyspace {
	return &keyspace{m: make(map[string]entry), volatile: make(map[string]struct{})}
}

// get returns key's entry if it exists and has not expired at now (Unix
// milliseconds), deleting it if it has. Callers hold mu.
func (ks *keyspace) get(key []byte, now int64) (entry, bool) {
	e, ok := ks.m[string(key)]
	if !ok {
		return entry{}, false
	}
	// As in Redis, a key is still there in the millisecond it expires.
	if e.expireAt != 0 && e.expireAt < now {
		ks.delete(string(key))
		return entry{}, false
	}
	return e, true
}

// set stores e under key. Callers hold mu.
func (ks *keyspace) set(key []byte, e entry) {
	k := string(key)
	ks.m[k] = e
	if e.expireAt != 0 {
		ks.volatile[k] = struct{}{}
	} else if len(ks.volatile) > 0 {
		delete(ks.volatile, k)
	}
}

// delete removes key. Callers hold mu.
func (ks *keyspace) delete(key string) {
	delete(ks.m, key)
	delete(ks.volatile, key)
}

// flush removes every key. Callers hold mu.
func (ks *keyspace) flush() {
	ks.m = make(map[string]entry)
	ks.volatile = make(map[string]struct{})
}

// expireSome deletes the expired keys among up to limit keys that have a
// time to live, taken in the map's (random) iteration order, and returns how
// many it looked at and how many it deleted. Callers hold mu.
func (ks *keyspace) expireSome(now int64, limit int) (checked, expired int) {
	for k := range ks.volatile {
		if checked == limit {
			break
		}
		checked++
		if ks.m[k].expireAt < now {
			ks.delete(k)
			expired++
		}
	}
	return checked, expired
}

// Periodic expiry, as Redis's active expire cycle: every expireInterval,
// sample expireSample keys with a time to live and delete the expired ones,
// and sample again while more than a quarter of a sample had expired, for at
// most expireBudget. The lock is taken per sample, so commands run between.
const (
	expireInterval = 100 * time.Millisecond
	expireSample   = 20
	expireBudget   = 10 * time.Millisecond
)

// expireCycle runs one round of periodic expiry.
func (ks *keyspace) expireCycle(clock func() int64) {
	start := time.Now()
	for time.Since(start) < expireBudget {
		ks.mu.Lock()
		checked, expired := ks.expireSome(clock(), expireSample)
		ks.mu.Unlock()
		if checked == 0 || expired*4 <= checked {
			return
		}
	}
}
