//go:build linux

package rdmanet_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/rdmanet"
)

// TestLabZeroCopy: 2 MiB through write buffers committed in pieces,
// WriteFroms of registered memory and views of random sizes, up to 8 held at once and released out of order,
// on every data path (rxe, siw, rxe with iWARP's) and in a session, with
// SHA-256 at both ends. The host's tests check the ring accounting over
// link.Pipe; this one, that real RDMA writes land where the views are.
func TestLabZeroCopy(t *testing.T) {
	env := labenv.RequireRDMA(t)
	for _, dp := range dataPaths(env) {
		for _, ps := range plainAndSession(dp.name, dp.cfg) {
			cfg := ps.cfg
			t.Run(ps.name, func(t *testing.T) {
				checkLeaks(t)
				c1, c2, stop := pipe(t, dp.env, cfg)
				defer stop()
				w, r := c1.(*rdmanet.Conn), c2.(*rdmanet.Conn)
				w.SetDeadline(time.Now().Add(2 * time.Minute))
				r.SetDeadline(time.Now().Add(2 * time.Minute))
				const size = 2 << 20 // 39.6 s for six at 8 MiB in the race pass of a make test; rings of 256 KiB wrap 8 times in 2
				mem, err := rdmanet.NewMemory(96 << 10)
				if err != nil {
					t.Fatal(err)
				}
				defer func() {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					if err := mem.Close(ctx); err != nil {
						t.Errorf("Memory.Close: %v", err)
					}
				}()
				var sent [32]byte
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(1, 2))
					h := sha256.New()
					for pos := 0; pos < size; {
						n := min(1+rng.IntN(96<<10), size-pos)
						if rng.IntN(2) == 0 {
							// From registered memory, poisoned once WriteFrom
							// returns: a request still reading it would send
							// the poison.
							b := mem.Bytes()[:n]
							for i := range b {
								b[i] = byte(rng.Uint32())
							}
							h.Write(b)
							if _, err := w.WriteFrom(mem, b); err != nil {
								t.Errorf("WriteFrom(%d) at %d: %v", n, pos, err)
								return
							}
							for i := range b {
								b[i] = 0xa5
							}
							pos += n
							continue
						}
						b, err := w.WriteBuffer(n)
						if err != nil {
							t.Errorf("WriteBuffer(%d) at %d: %v", n, pos, err)
							return
						}
						for i := range b {
							b[i] = byte(rng.Uint32())
						}
						h.Write(b)
						if _, err := w.Commit(n); err != nil {
							t.Errorf("Commit(%d) at %d: %v", n, pos, err)
							return
						}
						pos += n
					}
					h.Sum(sent[:0])
				}()
				rng := rand.New(rand.NewPCG(3, 4))
				h := sha256.New()
				// Each view's CRC when taken, checked again at its release: the
				// peer's later writes must not land in it.
				type view struct {
					b   []byte
					crc uint32
				}
				var held []view
				release := func(i int) {
					if crc32.ChecksumIEEE(held[i].b) != held[i].crc {
						t.Fatalf("a view of %d bytes changed before its release", len(held[i].b))
					}
					if err := r.ReleaseView(held[i].b); err != nil {
						t.Fatal(err)
					}
					held = append(held[:i], held[i+1:]...)
				}
				got := 0
				for got < size {
					if len(held) > 0 && (len(held) >= 8 || rng.IntN(3) == 0) {
						release(rng.IntN(len(held)))
						continue
					}
					v, err := r.ReadView(min(1+rng.IntN(64<<10), size-got))
					if errors.Is(err, rdmanet.ErrViewsFull) {
						for len(held) > 0 {
							release(0)
						}
						continue
					}
					if err != nil && err != io.EOF {
						t.Fatalf("ReadView after %d bytes: %v", got, err)
					}
					h.Write(v)
					held = append(held, view{v, crc32.ChecksumIEEE(v)})
					got += len(v)
				}
				wg.Wait()
				// Copied only while its registration was made (in the
				// background, at the first WriteFrom).
				if st := mem.Stats(); st.Sent == 0 || st.Copied > st.Sent {
					t.Errorf("registered memory %+v: want WriteFrom's bytes sent from it once registered", st)
				} else {
					t.Logf("registered memory %+v", st)
				}
				var recvd [32]byte
				if h.Sum(recvd[:0]); recvd != sent {
					t.Fatal("SHA-256 differs between the write buffers and the views")
				}
				for len(held) > 0 {
					release(0)
				}
			})
		}
	}
}
