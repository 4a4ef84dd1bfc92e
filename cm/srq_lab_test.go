package cm_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/internal/labenv"
	"github.com/rdmanet/sdk/internal/leakcheck"
	"github.com/rdmanet/sdk/verbs"
)

// TestLabSharedReceiveQueue: two connections accepted on queue pairs whose
// receives come from one shared receive queue (verbs.SRQ, cm.QPConfig.SRQ).
// Messages from both clients land in the queue's receives, each completion
// naming the queue pair that took it; fewer receives posted than the armed
// limit raise SRQ_LIMIT_REACHED, naming the queue; and everything is
// released, the shared queue after its queue pairs.
func TestLabSharedReceiveQueue(t *testing.T) {
	env := labenv.RequireRDMA(t)
	leakcheck.Check(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const (
		clients  = 2
		perConn  = 3
		recvs    = 8
		limit    = 4
		slotSize = 256
	)

	// The server's side: one protection domain, completion queue, receive
	// buffer and shared queue for both connections, made on the first
	// request's device.
	var (
		pd   *verbs.PD
		ch   *verbs.CompChannel
		cq   *verbs.CQ
		buf  *verbs.Buffer
		mr   *verbs.MR
		srq  *verbs.SRQ
		evs  *verbs.AsyncEvents
		qps  []*verbs.QP
		ids  []*cm.ID
		made []interface{ Close() error } // in the order made
		must = func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
	)
	t.Cleanup(func() {
		// Queue pairs (with their IDs) before the shared queue, and the
		// rest in the reverse of the order made.
		for _, id := range ids {
			id.Close()
		}
		for i := len(made) - 1; i >= 0; i-- {
			if err := made[i].Close(); err != nil {
				t.Errorf("close %T: %v", made[i], err)
			}
		}
	})
	ln, addr := listen(t, env, 8)
	accepted := make(chan error, clients)
	go func() {
		for range clients {
			req, err := ln.GetRequest(ctx)
			if err != nil {
				accepted <- err
				return
			}
			ids = append(ids, req.ID)
			if pd == nil {
				dev := req.ID.Context()
				var err error
				step := func(c interface{ Close() error }, e error) {
					if err = e; e == nil {
						made = append(made, c)
					}
				}
				if pd, err = dev.AllocPD(); err == nil {
					made = append(made, pd)
				}
				if err == nil {
					ch, err = dev.NewCompChannel()
					step(ch, err)
				}
				if err == nil {
					cq, err = dev.NewCQ(64, ch, 0)
					step(cq, err)
				}
				if err == nil {
					buf, err = verbs.NewBuffer(recvs * slotSize)
					step(buf, err)
				}
				if err == nil {
					mr, err = pd.Register(buf, verbs.AccessLocalWrite)
					step(mr, err)
				}
				if err == nil {
					srq, err = pd.NewSRQ(recvs, 0)
					step(srq, err)
				}
				if err == nil {
					evs, err = dev.NewAsyncEvents()
					step(evs, err)
				}
				if err != nil {
					accepted <- err
					return
				}
			}
			qp, err := req.ID.CreateQP(pd, cm.QPConfig{
				SendCQ: cq, RecvCQ: cq, SRQ: srq,
				Cap: verbs.QPCap{MaxSendWR: 8, MaxSendSGE: 1, MaxInlineData: 64},
			})
			if err != nil {
				accepted <- fmt.Errorf("a queue pair on the shared queue: %w", err)
				return
			}
			qps = append(qps, qp)
			accepted <- req.ID.Accept(ctx, cm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7})
		}
	}()
	var conns []*endpoint
	for range clients {
		id := resolvedID(t, ctx, env.AddrA, addr)
		c := newEndpoint(t, id)
		if _, err := id.Connect(ctx, cm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}); err != nil {
			t.Fatalf("connect: %v", err)
		}
		must(<-accepted)
		conns = append(conns, c)
	}
	if srq.MaxWR() < recvs {
		t.Fatalf("the shared queue holds %d receives, asked for %d", srq.MaxWR(), recvs)
	}
	wrs := make([]verbs.RecvWR, recvs)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: uint64(i), Local: mr.Slice(i*slotSize, slotSize)}
	}
	must(srq.PostRecv(wrs))
	must(srq.Arm(limit))
	must(cq.RequestNotify(false))

	// Each client sends perConn messages naming itself.
	want := map[uint32][]string{} // by the server's queue pair number
	for i, c := range conns {
		var sends []verbs.SendWR
		for j := range perConn {
			m := fmt.Sprintf("client %d message %d", i, j)
			copy(c.buf.Bytes()[j*slotSize:], m)
			sends = append(sends, verbs.SendWR{ID: uint64(j), Local: c.mr.Slice(j*slotSize, len(m)), Opcode: verbs.OpSend, Flags: verbs.SendSignaled})
			want[qps[i].Num()] = append(want[qps[i].Num()], m)
		}
		must(c.qp.PostSend(sends))
		c.await(t, perConn)
	}
	server := &endpoint{cq: cq, ch: ch}
	got := map[uint32][]string{}
	for _, wc := range server.await(t, clients*perConn) {
		if wc.Opcode != verbs.WCRecv || wc.ID >= recvs {
			t.Fatalf("completion %+v, want a receive of the shared queue", wc)
		}
		got[wc.QPNum] = append(got[wc.QPNum], string(buf.Bytes()[int(wc.ID)*slotSize:][:wc.ByteLen]))
	}
	for qp, msgs := range want {
		if fmt.Sprint(got[qp]) != fmt.Sprint(msgs) {
			t.Errorf("queue pair %d took %q, want %q", qp, got[qp], msgs)
		}
	}
	if len(got) != clients {
		t.Errorf("completions named %d queue pairs, want %d: %v", len(got), clients, got)
	}

	// recvs - clients*perConn receives are left, fewer than the limit.
	for {
		ev, err := evs.Wait(ctx)
		if err != nil {
			t.Fatalf("waiting for SRQ_LIMIT_REACHED with %d receives posted and a limit of %d: %v", recvs-clients*perConn, limit, err)
		}
		t.Logf("asynchronous event %v", ev)
		if ev.Type == verbs.EventSRQLimitReached {
			if ev.SRQ != srq.Raw() {
				t.Errorf("SRQ_LIMIT_REACHED names %p, not the shared queue %p", ev.SRQ, srq.Raw())
			}
			break
		}
	}
	if r := verbs.Resources(); r.SRQs != 1 {
		t.Errorf("%d shared receive queues open, want 1", r.SRQs)
	}
}
