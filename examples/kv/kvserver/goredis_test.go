package kvserver

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestGoRedis: go-redis, a popular Redis client, works with the server
// unchanged. It opens each connection with HELLO 3 and CLIENT SETINFO; the
// server answers HELLO as unknown, and go-redis falls back to RESP2.
func TestGoRedis(t *testing.T) {
	ts := startServer(t, Options{})
	var sent recorder
	client := redis.NewClient(&redis.Options{
		Addr:       ts.addr,
		ClientName: "kvserver-test",
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &recordingConn{Conn: c, sent: &sent}, nil
		},
	})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	// The handshake went as described above.
	for _, want := range []string{"$5\r\nhello\r\n$1\r\n3\r\n", "$6\r\nclient\r\n$7\r\nsetinfo\r\n", "$7\r\nsetname\r\n"} {
		if !strings.Contains(strings.ToLower(sent.String()), want) {
			t.Errorf("go-redis did not send %q; it sent %q", want, sent.String())
		}
	}
	if err := client.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("Set: %v", err)
	}
	if got, err := client.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("Get k = %q, %v", got, err)
	}
	if _, err := client.Get(ctx, "missing").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("Get missing: %v, want redis.Nil", err)
	}
	if ok, err := client.SetNX(ctx, "k", "other", 0).Result(); err != nil || ok {
		t.Fatalf("SetNX on an existing key = %v, %v", ok, err)
	}
	for i := int64(1); i <= 3; i++ {
		if got, err := client.Incr(ctx, "n").Result(); err != nil || got != i {
			t.Fatalf("Incr = %d, %v; want %d", got, err, i)
		}
	}
	if got, err := client.IncrBy(ctx, "n", -10).Result(); err != nil || got != -7 {
		t.Fatalf("IncrBy = %d, %v", got, err)
	}
	if err := client.Incr(ctx, "k").Err(); err == nil || err.Error() != "ERR value is not an integer or out of range" {
		t.Fatalf("Incr on a string: %v", err)
	}
	if ok, err := client.Expire(ctx, "k", time.Minute).Result(); err != nil || !ok {
		t.Fatalf("Expire = %v, %v", ok, err)
	}
	if got, err := client.TTL(ctx, "k").Result(); err != nil || got != time.Minute {
		t.Fatalf("TTL = %v, %v", got, err)
	}
	if err := client.Set(ctx, "short", "v", 1500*time.Millisecond).Err(); err != nil {
		t.Fatalf("Set with PX: %v", err)
	}
	if got, err := client.PTTL(ctx, "short").Result(); err != nil || got != 1500*time.Millisecond {
		t.Fatalf("PTTL = %v, %v", got, err)
	}
	ts.advance(2 * time.Second)
	if n, err := client.Exists(ctx, "short").Result(); err != nil || n != 0 {
		t.Fatalf("Exists after expiry = %d, %v", n, err)
	}
	if err := client.MSet(ctx, "a", "1", "b", "2").Err(); err != nil {
		t.Fatalf("MSet: %v", err)
	}
	vals, err := client.MGet(ctx, "a", "b", "missing").Result()
	if err != nil || len(vals) != 3 || vals[0] != "1" || vals[1] != "2" || vals[2] != nil {
		t.Fatalf("MGet = %v, %v", vals, err)
	}

	// A pipeline: many requests in one write, replies read together.
	var incrs []*redis.IntCmd
	cmds, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for range 100 {
			incrs = append(incrs, p.Incr(ctx, "p"))
		}
		p.Set(ctx, "piped", "yes", 0)
		p.Get(ctx, "piped")
		return nil
	})
	if err != nil || len(cmds) != 102 {
		t.Fatalf("Pipelined: %d commands, %v", len(cmds), err)
	}
	for i, c := range incrs {
		if c.Val() != int64(i+1) {
			t.Fatalf("pipelined Incr %d = %d", i, c.Val())
		}
	}
	if got := cmds[101].(*redis.StringCmd).Val(); got != "yes" {
		t.Fatalf("pipelined Get = %q", got)
	}

	if n, err := client.Del(ctx, "a", "b", "missing").Result(); err != nil || n != 2 {
		t.Fatalf("Del = %d, %v", n, err)
	}
	keys, err := client.Keys(ctx, "p*").Result()
	if err != nil || len(keys) != 2 {
		t.Fatalf("Keys p* = %q, %v", keys, err)
	}
	if n, err := client.DBSize(ctx).Result(); err != nil || n != 4 {
		t.Fatalf("DBSize = %d, %v", n, err)
	}
	if got, err := client.ClientGetName(ctx).Result(); err != nil || got != "kvserver-test" {
		t.Fatalf("ClientGetName = %q, %v", got, err)
	}
	if info, err := client.Info(ctx, "server").Result(); err != nil || len(info) == 0 {
		t.Fatalf("Info = %q, %v", info, err)
	}
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("FlushAll: %v", err)
	}
}

// TestGoRedisPool: go-redis's connection pool, with concurrent users.
func TestGoRedisPool(t *testing.T) {
	ts := startServer(t, Options{})
	client := redis.NewClient(&redis.Options{Addr: ts.addr, PoolSize: 4})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const workers, each = 8, 50
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range each {
				key := "w" + strconv.Itoa(w)
				if err := client.Set(ctx, key, i, 0).Err(); err != nil {
					errs <- err
					return
				}
				if err := client.Incr(ctx, "total").Err(); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got, err := client.Get(ctx, "total").Int(); err != nil || got != workers*each {
		t.Fatalf("total = %d, %v", got, err)
	}
}

// recorder keeps what connections wrote.
type recorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

type recordingConn struct {
	net.Conn
	sent *recorder
}

func (c *recordingConn) Write(b []byte) (int, error) {
	c.sent.mu.Lock()
	c.sent.buf.Write(b)
	c.sent.mu.Unlock()
	return c.Conn.Write(b)
}
