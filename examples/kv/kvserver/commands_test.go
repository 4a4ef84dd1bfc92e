package kvserver

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// step is one request and its exact reply, or a move of the fake clock.
type step struct {
	args  []string // sent as a multibulk request
	reply string
	ours  bool          // the reply is this server's own, not Redis 7.0's
	wait  time.Duration // if set: advance the clock instead
}

// req is a request and Redis 7.0's reply to it.
func req(reply string, args ...string) step { return step{args: args, reply: reply} }

// ours is a request this server answers differently from Redis 7.0, on
// purpose: a command Redis 7.0 lacks (CLIENT SETINFO is 7.2's), or a reply
// cut short (COMMAND's six fields of Redis 5, no COMMAND DOCS, no HELLO).
func ours(reply string, args ...string) step { return step{args: args, reply: reply, ours: true} }

func advance(d time.Duration) step { return step{wait: d} }

func bulk(s string) string { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }
func integer(n int64) string {
	return ":" + strconv.FormatInt(n, 10) + "\r\n"
}

const (
	ok       = "+OK\r\n"
	null     = "$-1\r\n"
	syntax   = "-ERR syntax error\r\n"
	notInt   = "-ERR value is not an integer or out of range\r\n"
	overflow = "-ERR increment or decrement would overflow\r\n"
)

func wrongArgs(cmd string) string {
	return "-ERR wrong number of arguments for '" + cmd + "' command\r\n"
}
func badExpire(cmd string) string { return "-ERR invalid expire time in '" + cmd + "' command\r\n" }

// commandGroups are groups of requests and Redis's replies to them. epoch
// is the time the group starts at, in Unix milliseconds, a whole second.
func commandGroups(epoch int64) map[string][]step {
	// Absolute Unix times from the start, for EXAT, PXAT, EXPIREAT, PEXPIREAT.
	secondsFromNow := func(s int64) string { return strconv.FormatInt(epoch/1000+s, 10) }
	millisFromNow := func(ms int64) string { return strconv.FormatInt(epoch+ms, 10) }
	return map[string][]step{
		"connection": {
			req("+PONG\r\n", "PING"),
			req(bulk("hello"), "PING", "hello"),
			req(wrongArgs("ping"), "PING", "a", "b"),
			req(bulk(""), "ECHO", ""),
			req(bulk("a\r\nb"), "ECHO", "a\r\nb"),
			req(wrongArgs("echo"), "ECHO"),
			req(wrongArgs("echo"), "echo", "a", "b"),
			req("+PONG\r\n", "pInG"),
			req(ok, "SELECT", "0"),
			req("-ERR DB index is out of range\r\n", "SELECT", "1"),
			req(notInt, "SELECT", "x"),
			req(wrongArgs("select"), "SELECT"),
		},
		"unknown commands": {
			ours("-ERR unknown command 'HELLO', with args beginning with: '3' \r\n", "HELLO", "3"),
			req("-ERR unknown command 'FOO', with args beginning with: \r\n", "FOO"),
			req("-ERR unknown command 'foo', with args beginning with: 'a' 'b' \r\n", "foo", "a", "b"),
			req("-ERR unknown command 'foo', with args beginning with: 'a  b' \r\n", "foo", "a\r\nb"),
			req("-ERR unknown command 'x', with args beginning with: '"+strings.Repeat("a", 128)+"' \r\n", "x", strings.Repeat("a", 200), "b"),
			req("-ERR unknown command '"+strings.Repeat("c", 128)+"', with args beginning with: \r\n", strings.Repeat("c", 200)),
		},
		"get and set": {
			req(null, "GET", "k"),
			req(ok, "SET", "k", "v"),
			req(bulk("v"), "GET", "k"),
			req(null, "SET", "k", "v2", "NX"),
			req(ok, "SET", "k", "v2", "xx"),
			req(null, "SET", "new", "v", "XX"),
			req(null, "GET", "new"),
			req(bulk("v2"), "SET", "k", "v3", "GET"),
			req(bulk("v3"), "SET", "k", "v4", "NX", "GET"), // not set, old value returned
			req(bulk("v3"), "GET", "k"),
			req(null, "SET", "k2", "v", "GET"),
			req(ok, "SET", "empty", ""),
			req(bulk(""), "GET", "empty"),
			req(null, "SET", "bin", "\x00\xff\r\n", "GET"),
			req(bulk("\x00\xff\r\n"), "GET", "bin"),
			req(syntax, "SET", "k", "v", "NX", "XX"),
			req(syntax, "SET", "k", "v", "EX", "10", "PX", "100"),
			req(syntax, "SET", "k", "v", "KEEPTTL", "EX", "10"),
			req(syntax, "SET", "k", "v", "EX"),
			req(syntax, "SET", "k", "v", "FOO"),
			req(badExpire("set"), "SET", "k", "v", "EX", "0"),
			req(badExpire("set"), "SET", "k", "v", "PX", "-5"),
			req(badExpire("set"), "SET", "k", "v", "EX", "9223372036854775807"),
			req(notInt, "SET", "k", "v", "EX", "1.5"),
			req(wrongArgs("set"), "SET", "k"),
			req(wrongArgs("get"), "GET"),
			req(wrongArgs("get"), "GET", "a", "b"),
			req(integer(1), "SETNX", "nx", "1"),
			req(integer(0), "SETNX", "nx", "2"),
			req(bulk("1"), "GETSET", "nx", "3"),
			req(bulk("3"), "GETDEL", "nx"),
			req(null, "GETDEL", "nx"),
			req(integer(2), "APPEND", "ap", "ab"),
			req(integer(5), "APPEND", "ap", "cde"),
			req(bulk("abcde"), "GET", "ap"),
			req(integer(5), "STRLEN", "ap"),
			req(integer(0), "STRLEN", "nope"),
			req("+string\r\n", "TYPE", "ap"),
			req("+none\r\n", "TYPE", "nope"),
		},
		"time to live": {
			req(ok, "SET", "k", "v", "EX", "100"),
			req(integer(100), "TTL", "k"),
			req(integer(100000), "PTTL", "k"),
			advance(40 * time.Second),
			req(integer(60), "TTL", "k"),
			req(ok, "SET", "k", "w", "KEEPTTL"),
			req(integer(60), "TTL", "k"),
			req(ok, "SET", "k", "w"),
			req(integer(-1), "TTL", "k"),
			req(integer(-2), "TTL", "nope"),
			req(integer(-2), "PTTL", "nope"),
			req(ok, "SET", "k", "v", "PX", "1500"),
			req(integer(2), "TTL", "k"), // rounded, as Redis
			req(integer(1500), "PTTL", "k"),
			req(ok, "SET", "k", "v", "EXAT", secondsFromNow(40+100)),
			req(integer(100), "TTL", "k"),
			req(ok, "SET", "k", "v", "PXAT", millisFromNow(40000+250)),
			req(integer(250), "PTTL", "k"),
			req(ok, "SETEX", "se", "10", "v"),
			req(integer(10), "TTL", "se"),
			req(ok, "PSETEX", "se", "10", "v"),
			req(integer(10), "PTTL", "se"),
			req(badExpire("setex"), "SETEX", "se", "0", "v"),
			req(badExpire("psetex"), "PSETEX", "se", "-1", "v"),
			// A key lives through the millisecond it expires in.
			req(ok, "SET", "t", "v", "PX", "100"),
			advance(100 * time.Millisecond),
			req(bulk("v"), "GET", "t"),
			req(integer(0), "PTTL", "t"),
			advance(time.Millisecond),
			req(null, "GET", "t"),
			req(integer(0), "EXISTS", "t"),
			req(integer(-2), "TTL", "t"),
		},
		"expire": {
			req(ok, "SET", "c", "v"),
			req(integer(1), "EXPIRE", "c", "100"),
			req(integer(100), "TTL", "c"),
			req(integer(0), "EXPIRE", "nope", "100"),
			req(integer(0), "EXPIRE", "c", "50", "NX"),
			req(integer(1), "EXPIRE", "c", "50", "XX"),
			req(integer(1), "EXPIRE", "c", "60", "GT"),
			req(integer(0), "EXPIRE", "c", "55", "GT"),
			req(integer(1), "EXPIRE", "c", "10", "lt"),
			req(integer(10), "TTL", "c"),
			req("-ERR NX and XX, GT or LT options at the same time are not compatible\r\n", "EXPIRE", "c", "10", "NX", "XX"),
			req("-ERR GT and LT options at the same time are not compatible\r\n", "EXPIRE", "c", "10", "GT", "LT"),
			req("-ERR Unsupported option FOO\r\n", "EXPIRE", "c", "10", "FOO"),
			req(notInt, "EXPIRE", "c", "ten"),
			req(badExpire("expire"), "EXPIRE", "c", "9223372036854775807"),
			req(wrongArgs("expire"), "EXPIRE", "c"),
			req(integer(1), "PEXPIRE", "c", "1500"),
			req(integer(1500), "PTTL", "c"),
			req(integer(1), "PERSIST", "c"),
			req(integer(-1), "TTL", "c"),
			req(integer(0), "PERSIST", "c"),
			req(integer(0), "PERSIST", "nope"),
			req(integer(0), "EXPIRE", "c", "10", "XX"),
			req(integer(1), "EXPIRE", "c", "10", "LT"), // no time to live counts as infinite
			req(integer(1), "PERSIST", "c"),
			req(integer(0), "EXPIRE", "c", "10", "GT"),
			req(integer(1), "EXPIRE", "c", "0"), // a time in the past deletes
			req(integer(0), "EXISTS", "c"),
			req(ok, "SET", "d", "v"),
			req(integer(1), "EXPIREAT", "d", secondsFromNow(100)),
			req(integer(100), "TTL", "d"),
			req(integer(1), "PEXPIREAT", "d", millisFromNow(2500)),
			req(integer(2500), "PTTL", "d"),
			req(integer(1), "PEXPIREAT", "d", "1"),
			req(integer(0), "EXISTS", "d"),
		},
		"counters": {
			req(integer(1), "INCR", "n"),
			req(integer(11), "INCRBY", "n", "10"),
			req(integer(10), "DECR", "n"),
			req(integer(-10), "DECRBY", "n", "20"),
			req(bulk("-10"), "GET", "n"),
			req(integer(-1), "decr", "m"),
			req(notInt, "INCRBY", "n", "abc"),
			req(notInt, "INCRBY", "n", "01"),
			req(notInt, "INCRBY", "n", "1.5"),
			req(ok, "SET", "s", "abc"),
			req(notInt, "INCR", "s"),
			req(ok, "SET", "s", " 1"),
			req(notInt, "INCR", "s"),
			req(ok, "SET", "big", "9223372036854775807"),
			req(overflow, "INCR", "big"),
			req(overflow, "DECRBY", "big", "-1"),
			req("-ERR decrement would overflow\r\n", "DECRBY", "x", "-9223372036854775808"),
			req(ok, "SET", "small", "-9223372036854775808"),
			req(overflow, "DECR", "small"),
			req(ok, "SET", "ttl", "1", "EX", "100"),
			req(integer(2), "INCR", "ttl"),
			req(integer(100), "TTL", "ttl"), // INCR keeps the time to live
			req(wrongArgs("incr"), "INCR"),
			req(wrongArgs("incrby"), "INCRBY", "n"),
		},
		"multiple keys": {
			req(ok, "MSET", "a", "1", "b", "2"),
			req("*3\r\n$1\r\n1\r\n$1\r\n2\r\n$-1\r\n", "MGET", "a", "b", "nope"),
			req(wrongArgs("mset"), "MSET", "a"),
			req(wrongArgs("mset"), "MSET", "a", "1", "b"),
			req(wrongArgs("mget"), "MGET"),
			req(integer(0), "MSETNX", "a", "1", "c", "3"),
			req(null, "GET", "c"),
			req(integer(1), "MSETNX", "c", "3", "d", "4"),
			req(integer(3), "EXISTS", "a", "c", "c"), // a key named twice counts twice
			req(integer(2), "DEL", "a", "b", "nope"),
			req(integer(0), "DEL", "a"),
			req(integer(1), "UNLINK", "c"),
			req(wrongArgs("del"), "DEL"),
			req(integer(1), "DBSIZE"),
			req(ok, "FLUSHDB"),
			req(integer(0), "DBSIZE"),
			req(ok, "SET", "x", "1"),
			req(ok, "FLUSHALL", "ASYNC"),
			req(integer(0), "DBSIZE"),
			req(ok, "FLUSHALL", "sync"),
			req(syntax, "FLUSHALL", "now"),
			req(wrongArgs("dbsize"), "DBSIZE", "x"),
		},
		"client": {
			req(null, "CLIENT", "GETNAME"),
			req(ok, "CLIENT", "SETNAME", "app-1"),
			req(bulk("app-1"), "client", "getname"),
			req("-ERR Client names cannot contain spaces, newlines or special characters.\r\n", "CLIENT", "SETNAME", "a b"),
			req(ok, "CLIENT", "SETNAME", ""),
			req(null, "CLIENT", "GETNAME"),
			ours(ok, "CLIENT", "SETINFO", "LIB-NAME", "go-redis(,go1.26)"),
			ours(ok, "CLIENT", "SETINFO", "lib-ver", "9.22.0"),
			ours("-ERR LIB-VER cannot contain spaces, newlines or special characters.\r\n", "CLIENT", "SETINFO", "LIB-VER", "9 22"),
			ours("-ERR Unrecognized option 'foo'\r\n", "CLIENT", "SETINFO", "foo", "x"),
			ours(integer(1), "CLIENT", "ID"), // the first client of a fresh server
			req(wrongArgs("client"), "CLIENT"),
			req(wrongArgs("client|setname"), "CLIENT", "SETNAME"),
			req("-ERR unknown subcommand 'FOO'. Try CLIENT HELP.\r\n", "CLIENT", "FOO"),
		},
		"config and command": {
			req("*2\r\n$4\r\nsave\r\n$0\r\n\r\n", "CONFIG", "GET", "save"),
			req("*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n", "CONFIG", "GET", "appendonly"),
			req("*2\r\n$9\r\ndatabases\r\n$1\r\n1\r\n", "CONFIG", "GET", "data*"),
			req("*0\r\n", "CONFIG", "GET", "nope"),
			req(wrongArgs("config|get"), "CONFIG", "GET"),
			ours("-ERR unknown subcommand 'SET'. Try CONFIG HELP.\r\n", "CONFIG", "SET", "save", ""),
			ours("*0\r\n", "COMMAND", "DOCS"),
			ours("*0\r\n", "COMMAND", "DOCS", "get"),
			ours(integer(int64(len(commands))), "COMMAND", "COUNT"),
			ours("*1\r\n*6\r\n$3\r\nget\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n", "COMMAND", "INFO", "get"),
			ours("*1\r\n*6\r\n$4\r\nmset\r\n:-3\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:-1\r\n:2\r\n", "COMMAND", "INFO", "MSET"),
			req("*2\r\n$-1\r\n$-1\r\n", "COMMAND", "INFO", "nope", "nope2"),
			req("-ERR unknown subcommand 'FOO'. Try COMMAND HELP.\r\n", "COMMAND", "FOO"),
		},
	}
}

// TestCommands runs each group of steps on a fresh server over one raw TCP
// connection and compares every reply byte for byte with Redis's.
func TestCommands(t *testing.T) {
	for name, steps := range commandGroups(testEpoch) {
		t.Run(name, func(t *testing.T) {
			ts := startServer(t, Options{})
			c := dialRaw(t, ts.addr)
			for _, s := range steps {
				if s.wait != 0 {
					ts.advance(s.wait)
					continue
				}
				c.send(encode(s.args...))
				c.expect(s.reply)
			}
			// Nothing more came than the replies expected.
			c.send([]byte("PING\r\n"))
			c.expect("+PONG\r\n")
		})
	}
}

// TestInline: requests typed by hand get the same replies.
func TestInline(t *testing.T) {
	ts := startServer(t, Options{})
	c := dialRaw(t, ts.addr)
	c.send([]byte("SET greeting \"hello world\\n\"\r\nGET greeting\nset 'it''s' x\r\n\r\nping\r\n"))
	c.expect("+OK\r\n$12\r\nhello world\n\r\n-ERR Protocol error: unbalanced quotes in request\r\n")
	c.expectClosed()
}

func TestKeys(t *testing.T) {
	ts := startServer(t, Options{})
	c := dialRaw(t, ts.addr)
	c.do("MSET", "hello", "1", "hallo", "2", "hxllo", "3", "hllo", "4", "heeeello", "5", "a/b", "6")
	c.do("SET", "hzllo", "gone", "PX", "10")
	ts.advance(11 * time.Millisecond)
	for pattern, want := range map[string][]string{
		"*":        {"a/b", "hallo", "heeeello", "hello", "hllo", "hxllo"},
		"h?llo":    {"hallo", "hello", "hxllo"},
		"h*llo":    {"hallo", "heeeello", "hello", "hllo", "hxllo"},
		"h[ae]llo": {"hallo", "hello"},
		"h[^e]llo": {"hallo", "hxllo"},
		"h[a-b]*":  {"hallo"},
		"a/*":      {"a/b"},
		"nope*":    {},
	} {
		reply, isArray := c.do("KEYS", pattern).([]any)
		if !isArray {
			t.Fatalf("KEYS %s: not an array", pattern)
		}
		got := []string{}
		for _, k := range reply {
			got = append(got, k.(string))
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("KEYS %s = %q, want %q", pattern, got, want)
		}
	}
	if got := c.do("KEYS"); got != redisError("ERR wrong number of arguments for 'keys' command") {
		t.Errorf("KEYS: %v", got)
	}
}

func TestInfo(t *testing.T) {
	ts := startServer(t, Options{})
	c := dialRaw(t, ts.addr)
	c.do("SET", "a", "1")
	c.do("SET", "b", "1", "EX", "10")
	info, _ := c.do("INFO").(string)
	for _, want := range []string{"# Server\r\n", "\r\nredis_version:" + Version + "\r\n", "\r\nredis_mode:standalone\r\n",
		"\r\n\r\n# Clients\r\nconnected_clients:1\r\n", "\r\n\r\n# Keyspace\r\ndb0:keys=2,expires=1,avg_ttl=0\r\n"} {
		if !strings.Contains(info, want) {
			t.Errorf("INFO lacks %q:\n%s", want, info)
		}
	}
	if !strings.HasPrefix(info, "# Server\r\n") {
		t.Errorf("INFO does not start with # Server:\n%s", info)
	}
	server, _ := c.do("INFO", "server").(string)
	if !strings.HasPrefix(server, "# Server\r\n") || strings.Contains(server, "# Clients") {
		t.Errorf("INFO server:\n%s", server)
	}
	if got := c.do("INFO", "nosuchsection"); got != "" {
		t.Errorf("INFO nosuchsection = %q", got)
	}
}

func TestCommandTable(t *testing.T) {
	ts := startServer(t, Options{})
	c := dialRaw(t, ts.addr)
	all, _ := c.do("COMMAND").([]any)
	if len(all) != len(commands) {
		t.Fatalf("COMMAND: %d entries, want %d", len(all), len(commands))
	}
	names, _ := c.do("COMMAND", "LIST").([]any)
	var got []string
	for _, n := range names {
		got = append(got, n.(string))
	}
	for _, want := range []string{"get", "set", "incr", "mget", "mset", "expire", "ttl", "keys", "info", "config", "command", "client", "quit"} {
		if !slices.Contains(got, want) {
			t.Errorf("COMMAND LIST lacks %s", want)
		}
	}
}

// TestAgainstRedis checks the command table itself: it sends the steps that
// are Redis's replies to a real Redis server (Debian's redis-server, 7.0),
// started for the test, or the one RDMANET_KV_REDIS_ADDR names. Real time
// passes there: a group stops at its first move of the clock, and a TTL or
// PTTL may be lower than the table's by the time that passed since the
// test's epoch (much, on a loaded machine or under the lab's emulated CPU),
// never higher.
func TestAgainstRedis(t *testing.T) {
	addr := os.Getenv("RDMANET_KV_REDIS_ADDR")
	if addr == "" {
		addr = startRedis(t)
	}
	// The next whole second, so that TTLs round as in the table.
	now := time.Now().UnixMilli()
	epoch := (now/1000 + 1) * 1000
	time.Sleep(time.Duration(epoch-now) * time.Millisecond)
	for name, steps := range commandGroups(epoch) {
		t.Run(name, func(t *testing.T) {
			c := dialRaw(t, addr)
			var raw bytes.Buffer
			c.r = bufio.NewReader(io.TeeReader(c.conn, &raw))
			c.do("FLUSHALL")
			for _, s := range steps {
				if s.wait != 0 {
					break
				}
				if s.ours {
					continue
				}
				raw.Reset()
				c.do(s.args...)
				got := raw.String()
				elapsed := time.Now().UnixMilli() - epoch
				if got != s.reply && !countedDown(s.args[0], got, s.reply, elapsed) {
					t.Errorf("%q: Redis replies %q, the table says %q", s.args, got, s.reply)
				}
			}
		})
	}
}

// countedDown reports whether got, the reply of a TTL or PTTL command, is
// the table's reply want counted down by at most elapsed milliseconds: a
// time to live set at or after the epoch the table assumes is at most
// want, and at least want less the time since the epoch. TTL rounds to the
// nearest second, as Redis does. 50 ms either way allow for the two
// processes reading the clock at different moments. Negative replies (no
// key, no time to live) do not count down.
func countedDown(cmd, got, want string, elapsed int64) bool {
	unit := int64(1)
	switch {
	case equalFold([]byte(cmd), "pttl"):
	case equalFold([]byte(cmd), "ttl"):
		unit = 1000
	default:
		return false
	}
	g, err1 := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(got, ":"), "\r\n"), 10, 64)
	w, err2 := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(want, ":"), "\r\n"), 10, 64)
	if err1 != nil || err2 != nil || w < 0 {
		return false
	}
	const skew = 50 // ms
	lowest := (w*unit - elapsed - skew + unit/2) / unit
	highest := (w*unit + skew + unit/2) / unit
	if unit == 1 {
		lowest, highest = w-elapsed-skew, w+skew
	}
	return lowest <= g && g <= highest
}

func TestCountedDown(t *testing.T) {
	for _, c := range []struct {
		cmd, got, want string
		elapsed        int64
		ok             bool
	}{
		{"TTL", ":99\r\n", ":100\r\n", 600, true},  // more than half a second since the epoch
		{"TTL", ":99\r\n", ":100\r\n", 100, false}, // too little time for that
		{"ttl", ":100\r\n", ":100\r\n", 0, true},
		{"TTL", ":101\r\n", ":100\r\n", 5000, false}, // never more than the table
		{"PTTL", ":2124\r\n", ":2500\r\n", 376, true},
		{"PTTL", ":2124\r\n", ":2500\r\n", 200, false},
		{"PTTL", ":2540\r\n", ":2500\r\n", 0, true}, // the clocks' skew
		{"PTTL", ":2600\r\n", ":2500\r\n", 0, false},
		{"TTL", ":-1\r\n", ":10\r\n", 100, false},
		{"TTL", ":5\r\n", ":-1\r\n", 100, false},
		{"GET", ":99\r\n", ":100\r\n", 5000, false},
	} {
		if got := countedDown(c.cmd, c.got, c.want, c.elapsed); got != c.ok {
			t.Errorf("countedDown(%s, %q, %q, %d ms) = %v, want %v", c.cmd, c.got, c.want, c.elapsed, got, c.ok)
		}
	}
}
