package kvserver

import (
	"bytes"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// command is an entry of the command table.
type command struct {
	name     string // lower case; "client|setname" for a subcommand
	arity    int    // as Redis counts it, with the name: n exactly n, -n at least n
	flags    string // for COMMAND's replies
	firstKey int    // for COMMAND's replies: where the keys are
	lastKey  int
	keyStep  int
	run      func(c *conn, args [][]byte)
	subs     map[string]*command // for a container (CLIENT, CONFIG, COMMAND)
}

// commands is the command table, by lower-case name.
var commands map[string]*command

// The table refers to COMMAND's handler, which reads the table: it is built
// in init to break that cycle.
func init() {
	commands = make(map[string]*command)
	add := func(table map[string]*command, prefix string, cmd *command) *command {
		key := cmd.name
		cmd.name = prefix + cmd.name
		table[key] = cmd
		return cmd
	}
	for _, cmd := range []*command{
		{name: "ping", arity: -1, flags: "fast", run: cmdPing},
		{name: "echo", arity: 2, flags: "fast", run: cmdEcho},
		{name: "quit", arity: -1, flags: "fast"},
		{name: "select", arity: 2, flags: "loading stale fast", run: cmdSelect},
		{name: "time", arity: 1, flags: "loading stale fast", run: cmdTime},
		{name: "get", arity: 2, flags: "readonly fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdGet},
		{name: "set", arity: -3, flags: "write denyoom", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdSet},
		{name: "setnx", arity: 3, flags: "write denyoom fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdSetNX},
		{name: "setex", arity: 4, flags: "write denyoom", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdSetEX},
		{name: "psetex", arity: 4, flags: "write denyoom", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdSetEX},
		{name: "getset", arity: 3, flags: "write denyoom fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdGetSet},
		{name: "getdel", arity: 2, flags: "write fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdGetDel},
		{name: "append", arity: 3, flags: "write denyoom fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdAppend},
		{name: "strlen", arity: 2, flags: "readonly fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdStrlen},
		{name: "incr", arity: 2, flags: "write denyoom fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdIncr},
		{name: "decr", arity: 2, flags: "write denyoom fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdIncr},
		{name: "incrby", arity: 3, flags: "write denyoom fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdIncrBy},
		{name: "decrby", arity: 3, flags: "write denyoom fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdIncrBy},
		{name: "mget", arity: -2, flags: "readonly fast", firstKey: 1, lastKey: -1, keyStep: 1, run: cmdMGet},
		{name: "mset", arity: -3, flags: "write denyoom", firstKey: 1, lastKey: -1, keyStep: 2, run: cmdMSet},
		{name: "msetnx", arity: -3, flags: "write denyoom", firstKey: 1, lastKey: -1, keyStep: 2, run: cmdMSet},
		{name: "del", arity: -2, flags: "write", firstKey: 1, lastKey: -1, keyStep: 1, run: cmdDel},
		{name: "unlink", arity: -2, flags: "write fast", firstKey: 1, lastKey: -1, keyStep: 1, run: cmdDel},
		{name: "exists", arity: -2, flags: "readonly fast", firstKey: 1, lastKey: -1, keyStep: 1, run: cmdExists},
		{name: "type", arity: 2, flags: "readonly fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdType},
		{name: "expire", arity: -3, flags: "write fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdExpire},
		{name: "pexpire", arity: -3, flags: "write fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdExpire},
		{name: "expireat", arity: -3, flags: "write fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdExpire},
		{name: "pexpireat", arity: -3, flags: "write fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdExpire},
		{name: "persist", arity: 2, flags: "write fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdPersist},
		{name: "ttl", arity: 2, flags: "readonly fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdTTL},
		{name: "pttl", arity: 2, flags: "readonly fast", firstKey: 1, lastKey: 1, keyStep: 1, run: cmdTTL},
		{name: "keys", arity: 2, flags: "readonly", run: cmdKeys},
		{name: "dbsize", arity: 1, flags: "readonly fast", run: cmdDBSize},
		{name: "flushall", arity: -1, flags: "write", run: cmdFlush},
		{name: "flushdb", arity: -1, flags: "write", run: cmdFlush},
		{name: "info", arity: -1, flags: "loading stale", run: cmdInfo},
	} {
		add(commands, "", cmd)
	}
	// There is no HELLO: go-redis and other RESP3-aware clients open with
	// HELLO 3 and fall back to RESP2 on an error reply, and this server
	// speaks RESP2 only, so it answers HELLO as an unknown command, as a
	// server from before HELLO (Redis 5) does.

	client := add(commands, "", &command{name: "client", arity: -2, flags: "loading stale", subs: map[string]*command{}})
	for _, sub := range []*command{
		{name: "id", arity: 2, flags: "loading stale", run: cmdClientID},
		{name: "getname", arity: 2, flags: "loading stale", run: cmdClientGetName},
		{name: "setname", arity: 3, flags: "loading stale", run: cmdClientSetName},
		{name: "setinfo", arity: 4, flags: "loading stale", run: cmdClientSetInfo},
	} {
		add(client.subs, "client|", sub)
	}
	config := add(commands, "", &command{name: "config", arity: -2, subs: map[string]*command{}})
	add(config.subs, "config|", &command{name: "get", arity: -3, flags: "loading stale", run: cmdConfigGet})
	cmdTable := add(commands, "", &command{name: "command", arity: -1, flags: "loading stale", run: cmdCommand, subs: map[string]*command{}})
	for _, sub := range []*command{
		{name: "count", arity: 2, flags: "loading stale", run: cmdCommandCount},
		{name: "docs", arity: -2, flags: "loading stale", run: cmdCommandDocs},
		{name: "info", arity: -2, flags: "loading stale", run: cmdCommandInfo},
		{name: "list", arity: -2, flags: "loading stale", run: cmdCommandList},
	} {
		add(cmdTable.subs, "command|", sub)
	}
}

// lookup finds a command by name, in any case, without allocating.
func lookup(table map[string]*command, name []byte) *command {
	var lower [24]byte
	if len(name) > len(lower) {
		return nil
	}
	for i, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	return table[string(lower[:len(name)])]
}

func arityOK(arity, n int) bool {
	if arity >= 0 {
		return n == arity
	}
	return n >= -arity
}

// exec runs one request; it returns false when the client is to be
// disconnected (QUIT).
func (c *conn) exec(args [][]byte) bool {
	cmd := lookup(commands, args[0])
	if cmd == nil {
		c.w.error(unknownCommand(args))
		return true
	}
	if !arityOK(cmd.arity, len(args)) {
		c.w.error(errWrongArgs(cmd.name))
		return true
	}
	if cmd.subs != nil && (len(args) > 1 || cmd.run == nil) {
		sub := lookup(cmd.subs, args[1])
		if sub == nil {
			c.w.error("ERR unknown subcommand '" + truncate(args[1], 128) + "'. Try " + strings.ToUpper(cmd.name) + " HELP.")
			return true
		}
		if !arityOK(sub.arity, len(args)) {
			c.w.error(errWrongArgs(sub.name))
			return true
		}
		cmd = sub
	}
	if cmd.name == "quit" {
		c.w.status("OK")
		return false
	}
	cmd.run(c, args)
	return true
}

// Error replies, worded as Redis words them.
const (
	errSyntax   = "ERR syntax error"
	errNotInt   = "ERR value is not an integer or out of range"
	errOverflow = "ERR increment or decrement would overflow"
)

func errWrongArgs(name string) string {
	return "ERR wrong number of arguments for '" + name + "' command"
}

func errExpireTime(name string) string {
	return "ERR invalid expire time in '" + name + "' command"
}

// unknownCommand is Redis 7's reply to an unknown command, which quotes the
// first 128 bytes or so of the arguments.
func unknownCommand(args [][]byte) string {
	var quoted []byte
	for _, a := range args[1:] {
		if len(quoted) >= 128 {
			break
		}
		room := 128 - len(quoted)
		quoted = append(quoted, '\'')
		quoted = append(quoted, truncate(a, room)...)
		quoted = append(quoted, '\'', ' ')
	}
	return "ERR unknown command '" + truncate(args[0], 128) + "', with args beginning with: " + string(quoted)
}

func truncate(b []byte, n int) string {
	return string(b[:min(len(b), n)])
}

// equalFold compares ASCII case-insensitively, as Redis's strcasecmp for
// options does (bytes.EqualFold would also fold Unicode).
func equalFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// locked runs f with the keyspace locked and the time of the command in
// Unix milliseconds. Replies are written after it returns, never under the
// lock: writing may block on a slow client.
func (s *Server) locked(f func(ks *keyspace, now int64)) {
	s.ks.mu.Lock()
	defer s.ks.mu.Unlock()
	f(s.ks, s.now())
}

func (c *conn) value(v []byte, ok bool) {
	if !ok {
		c.w.null()
		return
	}
	c.w.bulk(v)
}

func cmdPing(c *conn, args [][]byte) {
	switch len(args) {
	case 1:
		c.w.status("PONG")
	case 2:
		c.w.bulk(args[1])
	default:
		c.w.error(errWrongArgs("ping"))
	}
}

func cmdEcho(c *conn, args [][]byte) { c.w.bulk(args[1]) }

func cmdSelect(c *conn, args [][]byte) {
	db, ok := parseInt(args[1])
	switch {
	case !ok || db < math.MinInt32 || db > math.MaxInt32:
		c.w.error(errNotInt)
	case db != 0:
		c.w.error("ERR DB index is out of range")
	default:
		c.w.status("OK")
	}
}

func cmdTime(c *conn, _ [][]byte) {
	now := time.Now()
	c.w.array(2)
	c.w.bulkString(strconv.FormatInt(now.Unix(), 10))
	c.w.bulkString(strconv.Itoa(now.Nanosecond() / 1000))
}

func cmdGet(c *conn, args [][]byte) {
	var e entry
	var ok bool
	c.srv.locked(func(ks *keyspace, now int64) { e, ok = ks.get(args[1], now) })
	c.value(e.value, ok)
}

// expiry is how a time to live was given: SET's EX, PX, EXAT or PXAT.
type expiry int

const (
	noExpiry expiry = iota
	expireSeconds
	expireMillis
	expireAtSeconds
	expireAtMillis
)

// deadline turns SET's or SETEX's time to live argument into a Unix time in
// milliseconds, or returns an error reply. As in Redis it must be positive.
func deadline(kind expiry, arg []byte, now int64, cmd string) (int64, string) {
	v, ok := parseInt(arg)
	if !ok {
		return 0, errNotInt
	}
	seconds := kind == expireSeconds || kind == expireAtSeconds
	if v <= 0 || seconds && v > math.MaxInt64/1000 {
		return 0, errExpireTime(cmd)
	}
	if seconds {
		v *= 1000
	}
	if kind == expireSeconds || kind == expireMillis {
		if v > math.MaxInt64-now {
			return 0, errExpireTime(cmd)
		}
		v += now
	}
	return v, ""
}

// SET key value [NX | XX] [GET] [EX s | PX ms | EXAT unix-s | PXAT unix-ms | KEEPTTL]
func cmdSet(c *conn, args [][]byte) {
	var nx, xx, get, keepTTL bool
	kind, ttlArg := noExpiry, []byte(nil)
	for j := 3; j < len(args); j++ {
		opt := args[j]
		// As in Redis, a time to live may be given again (the last one
		// counts) but not in two different ways, nor with KEEPTTL.
		ttl := func(k expiry) bool {
			if keepTTL || kind != noExpiry && kind != k || j+1 == len(args) {
				return false
			}
			kind, ttlArg = k, args[j+1]
			j++
			return true
		}
		switch {
		case equalFold(opt, "nx") && !xx:
			nx = true
		case equalFold(opt, "xx") && !nx:
			xx = true
		case equalFold(opt, "get"):
			get = true
		case equalFold(opt, "keepttl") && kind == noExpiry:
			keepTTL = true
		case equalFold(opt, "ex") && ttl(expireSeconds),
			equalFold(opt, "px") && ttl(expireMillis),
			equalFold(opt, "exat") && ttl(expireAtSeconds),
			equalFold(opt, "pxat") && ttl(expireAtMillis):
		default:
			c.w.error(errSyntax)
			return
		}
	}
	value := bytes.Clone(args[2])
	var old entry
	var found, stored bool
	var errMsg string
	c.srv.locked(func(ks *keyspace, now int64) {
		var at int64
		if kind != noExpiry {
			if at, errMsg = deadline(kind, ttlArg, now, "set"); errMsg != "" {
				return
			}
		}
		old, found = ks.get(args[1], now)
		if nx && found || xx && !found {
			return
		}
		e := entry{value: value, expireAt: at}
		if keepTTL && found {
			e.expireAt = old.expireAt
		}
		ks.set(args[1], e)
		stored = true
	})
	switch {
	case errMsg != "":
		c.w.error(errMsg)
	case get:
		c.value(old.value, found)
	case stored:
		c.w.status("OK")
	default:
		c.w.null()
	}
}

// SETNX key value
func cmdSetNX(c *conn, args [][]byte) {
	value := bytes.Clone(args[2])
	var stored bool
	c.srv.locked(func(ks *keyspace, now int64) {
		if _, found := ks.get(args[1], now); !found {
			ks.set(args[1], entry{value: value})
			stored = true
		}
	})
	c.w.integer(b2i(stored))
}

// SETEX key seconds value, PSETEX key milliseconds value
func cmdSetEX(c *conn, args [][]byte) {
	name, kind := "setex", expireSeconds
	if equalFold(args[0], "psetex") {
		name, kind = "psetex", expireMillis
	}
	value := bytes.Clone(args[3])
	var errMsg string
	c.srv.locked(func(ks *keyspace, now int64) {
		var at int64
		if at, errMsg = deadline(kind, args[2], now, name); errMsg == "" {
			ks.set(args[1], entry{value: value, expireAt: at})
		}
	})
	if errMsg != "" {
		c.w.error(errMsg)
		return
	}
	c.w.status("OK")
}

// GETSET key value
func cmdGetSet(c *conn, args [][]byte) {
	value := bytes.Clone(args[2])
	var old entry
	var found bool
	c.srv.locked(func(ks *keyspace, now int64) {
		old, found = ks.get(args[1], now)
		ks.set(args[1], entry{value: value})
	})
	c.value(old.value, found)
}

// GETDEL key
func cmdGetDel(c *conn, args [][]byte) {
	var old entry
	var found bool
	c.srv.locked(func(ks *keyspace, now int64) {
		if old, found = ks.get(args[1], now); found {
			ks.delete(string(args[1]))
		}
	})
	c.value(old.value, found)
}

// APPEND key value
func cmdAppend(c *conn, args [][]byte) {
	var n int
	var errMsg string
	c.srv.locked(func(ks *keyspace, now int64) {
		e, _ := ks.get(args[1], now)
		if len(e.value)+len(args[2]) > c.srv.limits.maxBulk {
			errMsg = "ERR string exceeds maximum allowed size (proto-max-bulk-len)"
			return
		}
		// Appending in place writes only past the end of the stored value,
		// where no reader looks (see entry).
		e.value = append(e.value, args[2]...)
		if e.value == nil {
			e.value = []byte{}
		}
		ks.set(args[1], e)
		n = len(e.value)
	})
	if errMsg != "" {
		c.w.error(errMsg)
		return
	}
	c.w.integer(int64(n))
}

// STRLEN key
func cmdStrlen(c *conn, args [][]byte) {
	var e entry
	c.srv.locked(func(ks *keyspace, now int64) { e, _ = ks.get(args[1], now) })
	c.w.integer(int64(len(e.value)))
}

// INCR key, DECR key
func cmdIncr(c *conn, args [][]byte) {
	delta := int64(1)
	if equalFold(args[0], "decr") {
		delta = -1
	}
	c.incrBy(args[1], delta)
}

// INCRBY key increment, DECRBY key decrement
func cmdIncrBy(c *conn, args [][]byte) {
	delta, ok := parseInt(args[2])
	if !ok {
		c.w.error(errNotInt)
		return
	}
	if equalFold(args[0], "decrby") {
		if delta == math.MinInt64 {
			c.w.error("ERR decrement would overflow")
			return
		}
		delta = -delta
	}
	c.incrBy(args[1], delta)
}

// incrBy adds delta to the integer stored at key (0 if there is none),
// keeping its time to live.
func (c *conn) incrBy(key []byte, delta int64) {
	var result int64
	var errMsg string
	c.srv.locked(func(ks *keyspace, now int64) {
		e, found := ks.get(key, now)
		var n int64
		if found {
			var ok bool
			if n, ok = parseInt(e.value); !ok {
				errMsg = errNotInt
				return
			}
		}
		if delta > 0 && n > math.MaxInt64-delta || delta < 0 && n < math.MinInt64-delta {
			errMsg = errOverflow
			return
		}
		result = n + delta
		e.value = strconv.AppendInt(nil, result, 10)
		ks.set(key, e)
	})
	if errMsg != "" {
		c.w.error(errMsg)
		return
	}
	c.w.integer(result)
}

// MGET key [key ...]
func cmdMGet(c *conn, args [][]byte) {
	c.values = c.values[:0]
	c.srv.locked(func(ks *keyspace, now int64) {
		for _, key := range args[1:] {
			e, ok := ks.get(key, now)
			c.values = append(c.values, entryRef{e.value, ok})
		}
	})
	c.w.array(len(c.values))
	for _, v := range c.values {
		c.value(v.value, v.ok)
	}
	clear(c.values) // hold no values between requests
	if cap(c.values) > keepArgCount {
		c.values = nil
	}
}

// MSET key value [key value ...], MSETNX key value [key value ...]
func cmdMSet(c *conn, args [][]byte) {
	name := "mset"
	if equalFold(args[0], "msetnx") {
		name = "msetnx"
	}
	if len(args)%2 == 0 {
		c.w.error(errWrongArgs(name))
		return
	}
	values := make([][]byte, 0, len(args)/2)
	for i := 2; i < len(args); i += 2 {
		values = append(values, bytes.Clone(args[i]))
	}
	var stored bool
	c.srv.locked(func(ks *keyspace, now int64) {
		if name == "msetnx" {
			for i := 1; i < len(args); i += 2 {
				if _, found := ks.get(args[i], now); found {
					return
				}
			}
		}
		for i, v := range values {
			ks.set(args[1+2*i], entry{value: v})
		}
		stored = true
	})
	if name == "msetnx" {
		c.w.integer(b2i(stored))
		return
	}
	c.w.status("OK")
}

// DEL key [key ...], UNLINK key [key ...]
func cmdDel(c *conn, args [][]byte) {
	var n int64
	c.srv.locked(func(ks *keyspace, now int64) {
		for _, key := range args[1:] {
			if _, found := ks.get(key, now); found {
				ks.delete(string(key))
				n++
			}
		}
	})
	c.w.integer(n)
}

// EXISTS key [key ...]: a key named twice counts twice, as in Redis.
func cmdExists(c *conn, args [][]byte) {
	var n int64
	c.srv.locked(func(ks *keyspace, now int64) {
		for _, key := range args[1:] {
			if _, found := ks.get(key, now); found {
				n++
			}
		}
	})
	c.w.integer(n)
}

// TYPE key
func cmdType(c *conn, args [][]byte) {
	var found bool
	c.srv.locked(func(ks *keyspace, now int64) { _, found = ks.get(args[1], now) })
	if found {
		c.w.status("string")
		return
	}
	c.w.status("none")
}

// EXPIRE key seconds [NX | XX | GT | LT], and PEXPIRE, EXPIREAT, PEXPIREAT.
// A time in the past deletes the key.
func cmdExpire(c *conn, args [][]byte) {
	var name string
	var seconds, absolute bool
	switch {
	case equalFold(args[0], "expire"):
		name, seconds = "expire", true
	case equalFold(args[0], "pexpire"):
		name = "pexpire"
	case equalFold(args[0], "expireat"):
		name, seconds, absolute = "expireat", true, true
	default:
		name, absolute = "pexpireat", true
	}
	var nx, xx, gt, lt bool
	for _, opt := range args[3:] {
		switch {
		case equalFold(opt, "nx"):
			nx = true
		case equalFold(opt, "xx"):
			xx = true
		case equalFold(opt, "gt"):
			gt = true
		case equalFold(opt, "lt"):
			lt = true
		default:
			c.w.error("ERR Unsupported option " + string(opt))
			return
		}
	}
	if nx && (xx || gt || lt) {
		c.w.error("ERR NX and XX, GT or LT options at the same time are not compatible")
		return
	}
	if gt && lt {
		c.w.error("ERR GT and LT options at the same time are not compatible")
		return
	}
	when, ok := parseInt(args[2])
	if !ok {
		c.w.error(errNotInt)
		return
	}
	if seconds {
		if when > math.MaxInt64/1000 || when < math.MinInt64/1000 {
			c.w.error(errExpireTime(name))
			return
		}
		when *= 1000
	}
	var changed bool
	var errMsg string
	c.srv.locked(func(ks *keyspace, now int64) {
		if !absolute {
			if when > math.MaxInt64-now {
				errMsg = errExpireTime(name)
				return
			}
			when += now
		}
		e, found := ks.get(args[1], now)
		if !found {
			return
		}
		// A key without a time to live counts as expiring never: GT never
		// applies to it, LT always does.
		switch {
		case nx && e.expireAt != 0,
			xx && e.expireAt == 0,
			gt && (e.expireAt == 0 || when <= e.expireAt),
			lt && e.expireAt != 0 && when >= e.expireAt:
			return
		}
		changed = true
		if when <= now {
			ks.delete(string(args[1]))
			return
		}
		e.expireAt = when
		ks.set(args[1], e)
	})
	if errMsg != "" {
		c.w.error(errMsg)
		return
	}
	c.w.integer(b2i(changed))
}

// PERSIST key
func cmdPersist(c *conn, args [][]byte) {
	var changed bool
	c.srv.locked(func(ks *keyspace, now int64) {
		if e, found := ks.get(args[1], now); found && e.expireAt != 0 {
			e.expireAt = 0
			ks.set(args[1], e)
			changed = true
		}
	})
	c.w.integer(b2i(changed))
}

// TTL key, PTTL key: -2 for no key, -1 for a key without a time to live.
func cmdTTL(c *conn, args [][]byte) {
	var ttl int64
	c.srv.locked(func(ks *keyspace, now int64) {
		e, found := ks.get(args[1], now)
		switch {
		case !found:
			ttl = -2
		case e.expireAt == 0:
			ttl = -1
		default:
			ttl = max(e.expireAt-now, 0)
			if equalFold(args[0], "ttl") {
				ttl = (ttl + 500) / 1000
			}
		}
	})
	c.w.integer(ttl)
}

// KEYS pattern, with Redis's glob patterns (see globMatch).
func cmdKeys(c *conn, args [][]byte) {
	pattern := string(args[1])
	all := pattern == "*"
	var keys []string
	c.srv.locked(func(ks *keyspace, now int64) {
		for k, e := range ks.m {
			if (e.expireAt == 0 || e.expireAt >= now) && (all || globMatch(pattern, k)) {
				keys = append(keys, k)
			}
		}
	})
	c.w.array(len(keys))
	for _, k := range keys {
		c.w.bulkString(k)
	}
}

// DBSIZE: like Redis, it counts keys that expired and were not yet deleted.
func cmdDBSize(c *conn, _ [][]byte) {
	var n int
	c.srv.locked(func(ks *keyspace, _ int64) { n = len(ks.m) })
	c.w.integer(int64(n))
}

// FLUSHALL [ASYNC | SYNC], FLUSHDB [ASYNC | SYNC]
func cmdFlush(c *conn, args [][]byte) {
	if len(args) > 2 || len(args) == 2 && !equalFold(args[1], "sync") && !equalFold(args[1], "async") {
		c.w.error(errSyntax)
		return
	}
	c.srv.locked(func(ks *keyspace, _ int64) { ks.flush() })
	c.w.status("OK")
}

// Version is the Redis version INFO reports: the one whose commands and
// replies the server follows.
const Version = "7.0.0"

// INFO [section ...]: sections server, clients and keyspace.
func cmdInfo(c *conn, args [][]byte) {
	want := func(section string) bool {
		if len(args) == 1 {
			return true
		}
		for _, a := range args[1:] {
			if equalFold(a, section) || equalFold(a, "all") || equalFold(a, "everything") || equalFold(a, "default") {
				return true
			}
		}
		return false
	}
	var b strings.Builder
	section := func(title string) {
		if b.Len() > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString("# " + title + "\r\n")
	}
	field := func(name, value string) { b.WriteString(name + ":" + value + "\r\n") }
	s := c.srv
	if want("server") {
		uptime := time.Since(s.start)
		section("Server")
		field("redis_version", Version)
		field("redis_mode", "standalone")
		field("server_name", "rdmanet-kv")
		field("os", runtime.GOOS+" "+runtime.GOARCH)
		field("arch_bits", strconv.Itoa(strconv.IntSize))
		field("process_id", strconv.Itoa(os.Getpid()))
		field("uptime_in_seconds", strconv.FormatInt(int64(uptime/time.Second), 10))
		field("uptime_in_days", strconv.FormatInt(int64(uptime/(24*time.Hour)), 10))
	}
	if want("clients") {
		section("Clients")
		field("connected_clients", strconv.FormatInt(s.clients.Load(), 10))
	}
	if want("keyspace") {
		var keys, expires int
		s.locked(func(ks *keyspace, _ int64) { keys, expires = len(ks.m), len(ks.volatile) })
		section("Keyspace")
		if keys > 0 {
			field("db0", "keys="+strconv.Itoa(keys)+",expires="+strconv.Itoa(expires)+",avg_ttl=0")
		}
	}
	c.w.bulkString(b.String())
}

// CLIENT ID
func cmdClientID(c *conn, _ [][]byte) { c.w.integer(c.id) }

// CLIENT GETNAME
func cmdClientGetName(c *conn, _ [][]byte) {
	c.value([]byte(c.name), c.name != "")
}

// CLIENT SETNAME name; an empty name clears it.
func cmdClientSetName(c *conn, args [][]byte) {
	if !printable(args[2]) {
		c.w.error("ERR Client names cannot contain spaces, newlines or special characters.")
		return
	}
	c.name = string(args[2])
	c.w.status("OK")
}

// CLIENT SETINFO LIB-NAME name, CLIENT SETINFO LIB-VER version: clients
// (go-redis among them) send these on connecting.
func cmdClientSetInfo(c *conn, args [][]byte) {
	var field *string
	switch {
	case equalFold(args[2], "lib-name"):
		field = &c.lib
	case equalFold(args[2], "lib-ver"):
		field = &c.ver
	default:
		c.w.error("ERR Unrecognized option '" + truncate(args[2], 128) + "'")
		return
	}
	if !printable(args[3]) {
		c.w.error("ERR " + truncate(args[2], 128) + " cannot contain spaces, newlines or special characters.")
		return
	}
	*field = string(args[3])
	c.w.status("OK")
}

// printable reports whether b has only the characters Redis allows in client
// names: '!' to '~'.
func printable(b []byte) bool {
	for _, c := range b {
		if c < '!' || c > '~' {
			return false
		}
	}
	return true
}

// configParams are the parameters CONFIG GET knows: the ones benchmarks and
// clients ask for, with values that describe this server.
func (s *Server) configParams() [][2]string {
	return [][2]string{
		{"save", ""}, // redis-benchmark asks for these two
		{"appendonly", "no"},
		{"databases", "1"},
		{"maxmemory", "0"},
		{"timeout", "0"},
		{"proto-max-bulk-len", strconv.Itoa(s.limits.maxBulk)},
		{"client-query-buffer-limit", strconv.Itoa(s.limits.maxRequest)},
	}
}

// CONFIG GET pattern [pattern ...]: a flat array of name, value pairs; a
// pattern that matches nothing adds nothing.
func cmdConfigGet(c *conn, args [][]byte) {
	var reply []string
	for _, p := range c.srv.configParams() {
		for _, pattern := range args[2:] {
			if globMatch(strings.ToLower(string(pattern)), p[0]) {
				reply = append(reply, p[0], p[1])
				break
			}
		}
	}
	c.w.array(len(reply))
	for _, s := range reply {
		c.w.bulkString(s)
	}
}

// sortedCommands is the command table in name order.
func sortedCommands() []*command {
	var cmds []*command
	for _, cmd := range commands {
		cmds = append(cmds, cmd)
	}
	slices.SortFunc(cmds, func(a, b *command) int { return strings.Compare(a.name, b.name) })
	return cmds
}

// COMMAND: each command's name, arity, flags and key positions (the six
// fields of Redis 5's reply, which clients parse).
func cmdCommand(c *conn, _ [][]byte) {
	cmds := sortedCommands()
	c.w.array(len(cmds))
	for _, cmd := range cmds {
		c.commandInfo(cmd)
	}
}

func (c *conn) commandInfo(cmd *command) {
	c.w.array(6)
	c.w.bulkString(cmd.name)
	c.w.integer(int64(cmd.arity))
	flags := strings.Fields(cmd.flags)
	c.w.array(len(flags))
	for _, f := range flags {
		c.w.status(f)
	}
	c.w.integer(int64(cmd.firstKey))
	c.w.integer(int64(cmd.lastKey))
	c.w.integer(int64(cmd.keyStep))
}

// COMMAND COUNT
func cmdCommandCount(c *conn, _ [][]byte) { c.w.integer(int64(len(commands))) }

// COMMAND DOCS [name ...]: no documentation (redis-cli asks at start-up and
// does without).
func cmdCommandDocs(c *conn, _ [][]byte) { c.w.array(0) }

// COMMAND INFO [name ...]: nil for unknown commands; all commands if none is
// named.
func cmdCommandInfo(c *conn, args [][]byte) {
	if len(args) == 2 {
		cmdCommand(c, args)
		return
	}
	c.w.array(len(args) - 2)
	for _, name := range args[2:] {
		if cmd := lookup(commands, name); cmd != nil {
			c.commandInfo(cmd)
		} else {
			c.w.null()
		}
	}
}

// COMMAND LIST (filters are not supported)
func cmdCommandList(c *conn, args [][]byte) {
	if len(args) > 2 {
		c.w.error(errSyntax)
		return
	}
	cmds := sortedCommands()
	c.w.array(len(cmds))
	for _, cmd := range cmds {
		c.w.bulkString(cmd.name)
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
