// The C half of rdmacore: dlopen of rdma-core, one function pointer per symbol
// used, and thin wrappers that batch work so that one cgo call does a whole step.
// Everything is static: this header is included by exactly one Go file.

#define _GNU_SOURCE // dlvsym, be64toh
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include "abi.h"

// rn_send_req, rn_recv_req, rn_wc and rn_cm_event_out are rdmanet's own plain
// structs (no pointers), mirrored in rdmacore.go, so Go passes slices of them
// directly and C converts to and from rdma-core's structs on its stack.
struct rn_send_req {
	uint64_t wr_id;
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t imm;       // host order; sent big-endian
	uint8_t opcode;
	uint8_t flags;
	uint8_t _pad[6];
};

struct rn_recv_req {
	uint64_t wr_id;
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

struct rn_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t imm;       // host order
	uint32_t vendor_err;
	uint32_t wc_flags;
	uint32_t qp_num;
	uint32_t _pad;
};

struct rn_cm_event_out {
	struct rn_rdma_cm_id *id;
	struct rn_rdma_cm_id *listen_id;
	int event;
	int status;
	uint8_t private_data[256];
	uint32_t private_data_len;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t retry_count;
	uint8_t rnr_retry_count;
	uint32_t qp_num;
};

// rn_async_event_out is one asynchronous event, copied out before it is
// acknowledged: what it names (a QP's number and CQ pointer, a CQ, a port).
struct rn_async_event_out {
	int event_type;
	uint32_t port_num;
	uint32_t qp_num;
	uint32_t _pad;
	struct rn_ibv_cq *cq;     // the CQ of a CQ event
	struct rn_ibv_qp *qp;     // the QP of a QP event
	void *srq;                // the SRQ of an SRQ event
};

// Work requests per call into the provider: bounded so the arrays fit the C stack.
#define RN_BATCH 64

#define RN_VERBS_SYMBOLS(X) \
	X(ibv_get_device_list, "IBVERBS_1.1", struct rn_ibv_device **, (int *)) \
	X(ibv_free_device_list, "IBVERBS_1.1", void, (struct rn_ibv_device **)) \
	X(ibv_get_device_guid, "IBVERBS_1.1", uint64_t, (struct rn_ibv_device *)) \
	X(ibv_open_device, "IBVERBS_1.1", struct rn_ibv_context *, (struct rn_ibv_device *)) \
	X(ibv_close_device, "IBVERBS_1.1", int, (struct rn_ibv_context *)) \
	X(ibv_query_device, "IBVERBS_1.1", int, (struct rn_ibv_context *, struct rn_ibv_device_attr *)) \
	X(ibv_query_port, "IBVERBS_1.1", int, (struct rn_ibv_context *, uint8_t, struct rn_ibv_port_attr *)) \
	X(ibv_query_gid, "IBVERBS_1.1", int, (struct rn_ibv_context *, uint8_t, int, uint8_t *)) \
	X(ibv_alloc_pd, "IBVERBS_1.1", void *, (struct rn_ibv_context *)) \
	X(ibv_dealloc_pd, "IBVERBS_1.1", int, (void *)) \
	X(ibv_reg_mr, "IBVERBS_1.1", struct rn_ibv_mr *, (void *, void *, size_t, int)) \
	X(ibv_dereg_mr, "IBVERBS_1.1", int, (struct rn_ibv_mr *)) \
	X(ibv_create_comp_channel, "IBVERBS_1.0", struct rn_ibv_comp_channel *, (struct rn_ibv_context *)) \
	X(ibv_destroy_comp_channel, "IBVERBS_1.0", int, (struct rn_ibv_comp_channel *)) \
	X(ibv_create_cq, "IBVERBS_1.1", struct rn_ibv_cq *, (struct rn_ibv_context *, int, void *, struct rn_ibv_comp_channel *, int)) \
	X(ibv_destroy_cq, "IBVERBS_1.1", int, (struct rn_ibv_cq *)) \
	X(ibv_get_cq_event, "IBVERBS_1.1", int, (struct rn_ibv_comp_channel *, struct rn_ibv_cq **, void **)) \
	X(ibv_ack_cq_events, "IBVERBS_1.1", void, (struct rn_ibv_cq *, unsigned int)) \
	X(ibv_get_async_event, "IBVERBS_1.1", int, (struct rn_ibv_context *, struct rn_ibv_async_event *)) \
	X(ibv_ack_async_event, "IBVERBS_1.1", void, (struct rn_ibv_async_event *)) \
	X(ibv_create_srq, "IBVERBS_1.1", struct rn_ibv_srq *, (void *, struct rn_ibv_srq_init_attr *)) \
	X(ibv_modify_srq, "IBVERBS_1.1", int, (struct rn_ibv_srq *, struct rn_ibv_srq_attr *, int)) \
	X(ibv_destroy_srq, "IBVERBS_1.1", int, (struct rn_ibv_srq *))

#define RN_CM_SYMBOLS(X) \
	X(rdma_create_event_channel, "RDMACM_1.0", struct rn_rdma_event_channel *, (void)) \
	X(rdma_destroy_event_channel, "RDMACM_1.0", void, (struct rn_rdma_event_channel *)) \
	X(rdma_create_id, "RDMACM_1.0", int, (struct rn_rdma_event_channel *, struct rn_rdma_cm_id **, void *, int)) \
	X(rdma_destroy_id, "RDMACM_1.0", int, (struct rn_rdma_cm_id *)) \
	X(rdma_bind_addr, "RDMACM_1.0", int, (struct rn_rdma_cm_id *, void *)) \
	X(rdma_resolve_addr, "RDMACM_1.0", int, (struct rn_rdma_cm_id *, void *, void *, int)) \
	X(rdma_resolve_route, "RDMACM_1.0", int, (struct rn_rdma_cm_id *, int)) \
	X(rdma_listen, "RDMACM_1.0", int, (struct rn_rdma_cm_id *, int)) \
	X(rdma_connect, "RDMACM_1.0", int, (struct rn_rdma_cm_id *, struct rn_rdma_conn_param *)) \
	X(rdma_accept, "RDMACM_1.0", int, (struct rn_rdma_cm_id *, struct rn_rdma_conn_param *)) \
	X(rdma_reject, "RDMACM_1.0", int, (struct rn_rdma_cm_id *, const void *, uint8_t)) \
	X(rdma_disconnect, "RDMACM_1.0", int, (struct rn_rdma_cm_id *)) \
	X(rdma_get_cm_event, "RDMACM_1.0", int, (struct rn_rdma_event_channel *, struct rn_rdma_cm_event **)) \
	X(rdma_ack_cm_event, "RDMACM_1.0", int, (struct rn_rdma_cm_event *)) \
	X(rdma_migrate_id, "RDMACM_1.0", int, (struct rn_rdma_cm_id *, struct rn_rdma_event_channel *)) \
	X(rdma_create_qp, "RDMACM_1.0", int, (struct rn_rdma_cm_id *, void *, struct rn_ibv_qp_init_attr *)) \
	X(rdma_destroy_qp, "RDMACM_1.0", void, (struct rn_rdma_cm_id *)) \
	X(rdma_set_option, "RDMACM_1.0", int, (struct rn_rdma_cm_id *, int, int, void *, size_t))

#define RN_DECLARE(name, version, ret, args) static ret (*p_##name) args;
RN_VERBS_SYMBOLS(RN_DECLARE)
RN_CM_SYMBOLS(RN_DECLARE)

// rn_load opens both libraries and resolves every symbol. On failure it returns
// 1 (libibverbs) or 2 (librdmacm) and leaves the reason in err.
static int rn_load(char *err, size_t errlen) {
	void *lib;
	// libibverbs first: librdmacm depends on it, and providers load through it.
	lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!lib) {
		snprintf(err, errlen, "%s", dlerror());
		return 1;
	}
#define RN_RESOLVE(name, version, ret, args) \
	p_##name = (ret (*) args)dlvsym(lib, #name, version); \
	if (!p_##name) { snprintf(err, errlen, "symbol %s@%s not found", #name, version); return LIBNO; }
#define LIBNO 1
	RN_VERBS_SYMBOLS(RN_RESOLVE)
#undef LIBNO
	lib = dlopen("librdmacm.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!lib) {
		snprintf(err, errlen, "%s", dlerror());
		return 2;
	}
#define LIBNO 2
	RN_CM_SYMBOLS(RN_RESOLVE)
#undef LIBNO
	return 0;
}

// ---- verbs -----------------------------------------------------------------

// rn_open_device opens the device called name; returns NULL with errno ENODEV
// when there is no such device.
static struct rn_ibv_context *rn_open_device(const char *name) {
	int n = 0;
	struct rn_ibv_device **list = p_ibv_get_device_list(&n);
	if (!list) return NULL;
	struct rn_ibv_context *ctx = NULL;
	int found = 0;
	for (int i = 0; i < n; i++) {
		if (strncmp(list[i]->name, name, sizeof(list[i]->name)) == 0) {
			found = 1;
			ctx = p_ibv_open_device(list[i]);
			break;
		}
	}
	int saved = errno;
	p_ibv_free_device_list(list);
	errno = found ? saved : ENODEV;
	return ctx;
}

// rn_list_devices writes up to max names (64 bytes each) and GUIDs; returns the
// number of devices or -1 with errno.
static int rn_list_devices(char *names, uint64_t *guids, int *transport, int max) {
	int n = 0;
	struct rn_ibv_device **list = p_ibv_get_device_list(&n);
	if (!list) return -1;
	if (n > max) n = max;
	for (int i = 0; i < n; i++) {
		memcpy(names + 64 * i, list[i]->name, 64);
		names[64 * i + 63] = 0;
		guids[i] = be64toh(p_ibv_get_device_guid(list[i]));
		transport[i] = list[i]->transport_type;
	}
	p_ibv_free_device_list(list);
	return n;
}

// rn_post_send returns the provider's error (0 or an errno) in the high 32 bits
// and how many requests were posted in the low 32: an out-parameter would make
// Go allocate on every call.
static int64_t rn_post_send(struct rn_ibv_qp *qp, const struct rn_send_req *req, int n) {
	int posted = 0;
	struct rn_ibv_send_wr wr[RN_BATCH];
	struct rn_ibv_sge sge[RN_BATCH];
	while (posted < n) {
		int m = n - posted;
		if (m > RN_BATCH) m = RN_BATCH;
		memset(wr, 0, sizeof(wr[0]) * m);
		for (int i = 0; i < m; i++) {
			const struct rn_send_req *r = &req[posted + i];
			sge[i].addr = r->addr;
			sge[i].length = r->length;
			sge[i].lkey = r->lkey;
			wr[i].wr_id = r->wr_id;
			wr[i].next = i + 1 < m ? &wr[i + 1] : NULL;
			wr[i].sg_list = &sge[i];
			wr[i].num_sge = r->length ? 1 : 0;
			wr[i].opcode = r->opcode;
			wr[i].send_flags = r->flags;
			wr[i].imm_data = htonl(r->imm);
			wr[i].remote_addr = r->remote_addr;
			wr[i].rkey = r->rkey;
		}
		struct rn_ibv_send_wr *bad = NULL;
		int rc = qp->context->ops.post_send(qp, wr, &bad);
		if (rc) {
			if (bad) posted += (int)(bad - wr);
			return ((int64_t)rc << 32) | (uint32_t)posted;
		}
		posted += m;
	}
	return (uint32_t)posted;
}

// rn_fill_recvs chains m receive requests in wr and sge, for one provider
// call.
static void rn_fill_recvs(struct rn_ibv_recv_wr *wr, struct rn_ibv_sge *sge, const struct rn_recv_req *req, int m) {
	for (int i = 0; i < m; i++) {
		sge[i].addr = req[i].addr;
		sge[i].length = req[i].length;
		sge[i].lkey = req[i].lkey;
		wr[i].wr_id = req[i].wr_id;
		wr[i].next = i + 1 < m ? &wr[i + 1] : NULL;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = req[i].length ? 1 : 0;
	}
}

// rn_post_recvs posts n receives to qp or, if srq is set, to srq, in
// batches. It returns the provider's error (0 or an errno) in the high 32
// bits and how many requests were posted in the low 32: an out-parameter
// would make Go allocate on every call.
static int64_t rn_post_recvs(struct rn_ibv_qp *qp, struct rn_ibv_srq *srq, const struct rn_recv_req *req, int n) {
	int posted = 0;
	struct rn_ibv_recv_wr wr[RN_BATCH];
	struct rn_ibv_sge sge[RN_BATCH];
	while (posted < n) {
		int m = n - posted;
		if (m > RN_BATCH) m = RN_BATCH;
		rn_fill_recvs(wr, sge, &req[posted], m);
		struct rn_ibv_recv_wr *bad = NULL;
		int rc = srq ? srq->context->ops.post_srq_recv(srq, wr, &bad)
		             : qp->context->ops.post_recv(qp, wr, &bad);
		if (rc) {
			if (bad) posted += (int)(bad - wr);
			return ((int64_t)rc << 32) | (uint32_t)posted;
		}
		posted += m;
	}
	return (uint32_t)posted;
}

static int64_t rn_post_recv(struct rn_ibv_qp *qp, const struct rn_recv_req *req, int n) {
	return rn_post_recvs(qp, NULL, req, n);
}

static int64_t rn_post_srq_recv(struct rn_ibv_srq *srq, const struct rn_recv_req *req, int n) {
	return rn_post_recvs(NULL, srq, req, n);
}

// rn_create_srq creates a shared receive queue of max_wr receives of one
// SGE each in pd, and returns the sizes the provider gave it in *max_wr.
static struct rn_ibv_srq *rn_create_srq(void *pd, uint32_t *max_wr, uint32_t limit) {
	struct rn_ibv_srq_init_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.attr.max_wr = *max_wr;
	attr.attr.max_sge = 1;
	attr.attr.srq_limit = limit;
	struct rn_ibv_srq *srq = p_ibv_create_srq(pd, &attr);
	if (srq) *max_wr = attr.attr.max_wr;
	return srq;
}

// rn_arm_srq sets the queue's limit: when fewer receives than limit are
// posted, the device raises SRQ_LIMIT_REACHED once (and the limit is off
// until set again).
static int rn_arm_srq(struct rn_ibv_srq *srq, uint32_t limit) {
	struct rn_ibv_srq_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.srq_limit = limit;
	return p_ibv_modify_srq(srq, &attr, RN_IBV_SRQ_LIMIT);
}

static int rn_destroy_srq(struct rn_ibv_srq *srq) { return p_ibv_destroy_srq(srq); }

// rn_poll_cq returns the number of completions written to out, or a negative
// value on error.
static int rn_poll_cq(struct rn_ibv_cq *cq, struct rn_wc *out, int n) {
	struct rn_ibv_wc wc[RN_BATCH];
	if (n > RN_BATCH) n = RN_BATCH;
	int got = cq->context->ops.poll_cq(cq, n, wc);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].imm = ntohl(wc[i].imm_data);
		out[i].vendor_err = wc[i].vendor_err;
		out[i].wc_flags = wc[i].wc_flags;
		out[i].qp_num = wc[i].qp_num;
	}
	return got;
}

static int rn_req_notify_cq(struct rn_ibv_cq *cq, int solicited_only) {
	return cq->context->ops.req_notify_cq(cq, solicited_only);
}

// ---- rdma_cm ---------------------------------------------------------------

static int rn_conn(struct rn_rdma_cm_id *id, int accept, const void *pdata, int pdlen,
		uint8_t responder_resources, uint8_t initiator_depth, uint8_t retry_count,
		uint8_t rnr_retry_count) {
	struct rn_rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.private_data = pdlen ? pdata : NULL;
	p.private_data_len = (uint8_t)pdlen;
	p.responder_resources = responder_resources;
	p.initiator_depth = initiator_depth;
	p.retry_count = retry_count;
	p.rnr_retry_count = rnr_retry_count;
	return accept ? p_rdma_accept(id, &p) : p_rdma_connect(id, &p);
}

// rn_get_cm_event copies one event out and leaves it unacknowledged in *raw:
// until rn_ack_cm_event, librdmacm destroys neither its ID nor its listener
// (rdma_destroy_id waits for the acks), so the caller can map the ID's
// pointer to its own object before another ID can take that memory.
static int rn_get_cm_event(struct rn_rdma_event_channel *ch, struct rn_cm_event_out *out, struct rn_rdma_cm_event **raw) {
	struct rn_rdma_cm_event *ev = NULL;
	if (p_rdma_get_cm_event(ch, &ev)) return -1;
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	out->event = ev->event;
	out->status = ev->status;
	out->private_data_len = 0;
	if (ev->conn.private_data && ev->conn.private_data_len) {
		out->private_data_len = ev->conn.private_data_len;
		memcpy(out->private_data, ev->conn.private_data, ev->conn.private_data_len);
	}
	out->responder_resources = ev->conn.responder_resources;
	out->initiator_depth = ev->conn.initiator_depth;
	out->retry_count = ev->conn.retry_count;
	out->rnr_retry_count = ev->conn.rnr_retry_count;
	out->qp_num = ev->conn.qp_num;
	*raw = ev;
	return 0;
}

static void rn_ack_cm_event(struct rn_rdma_cm_event *ev) { p_rdma_ack_cm_event(ev); }

static int rn_create_qp(struct rn_rdma_cm_id *id, void *pd, struct rn_ibv_cq *send_cq,
		struct rn_ibv_cq *recv_cq, struct rn_ibv_srq *srq, struct rn_ibv_qp_cap *cap, int sq_sig_all) {
	struct rn_ibv_qp_init_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = send_cq;
	attr.recv_cq = recv_cq;
	attr.srq = srq;
	attr.cap = *cap;
	attr.qp_type = RN_IBV_QPT_RC;
	attr.sq_sig_all = sq_sig_all;
	if (p_rdma_create_qp(id, pd, &attr)) return -1;
	*cap = attr.cap;
	return 0;
}

// ---- one-line wrappers: cgo cannot call through a function pointer ----------

static int rn_close_device(struct rn_ibv_context *c) { return p_ibv_close_device(c); }
static int rn_query_device(struct rn_ibv_context *c, struct rn_ibv_device_attr *a) { return p_ibv_query_device(c, a); }
static int rn_query_port(struct rn_ibv_context *c, uint8_t port, struct rn_ibv_port_attr *a) {
	// The exported ibv_query_port fills the pre-1.1.8 prefix of the struct (up to
	// link_layer); zero the rest, as verbs.h's inline wrapper does.
	memset(a, 0, sizeof(*a));
	return p_ibv_query_port(c, port, a);
}
static int rn_query_gid(struct rn_ibv_context *c, uint8_t port, int index, uint8_t *gid) { return p_ibv_query_gid(c, port, index, gid); }
static void *rn_alloc_pd(struct rn_ibv_context *c) { return p_ibv_alloc_pd(c); }
static int rn_dealloc_pd(void *pd) { return p_ibv_dealloc_pd(pd); }
static struct rn_ibv_mr *rn_reg_mr(void *pd, void *addr, size_t len, int access) { return p_ibv_reg_mr(pd, addr, len, access); }
static int rn_dereg_mr(struct rn_ibv_mr *mr) { return p_ibv_dereg_mr(mr); }
static struct rn_ibv_comp_channel *rn_create_comp_channel(struct rn_ibv_context *c) { return p_ibv_create_comp_channel(c); }
static int rn_destroy_comp_channel(struct rn_ibv_comp_channel *ch) { return p_ibv_destroy_comp_channel(ch); }
static struct rn_ibv_cq *rn_create_cq(struct rn_ibv_context *c, int cqe, struct rn_ibv_comp_channel *ch, int vector) { return p_ibv_create_cq(c, cqe, NULL, ch, vector); }
static int rn_destroy_cq(struct rn_ibv_cq *cq) { return p_ibv_destroy_cq(cq); }
// rn_get_cq_event returns the CQ (NULL with errno on failure): an out-parameter
// would make Go allocate on every call.
static struct rn_ibv_cq *rn_get_cq_event(struct rn_ibv_comp_channel *ch) {
	struct rn_ibv_cq *cq;
	void *ctx;
	return p_ibv_get_cq_event(ch, &cq, &ctx) ? NULL : cq;
}
static void rn_ack_cq_events(struct rn_ibv_cq *cq, unsigned int n) { p_ibv_ack_cq_events(cq, n); }

// rn_get_async_event copies one asynchronous event out and acknowledges it
// at once, so none is ever left unacknowledged (ibv_destroy_qp, _cq and
// ibv_close_device wait for the acks of their events). Returns -1 with
// errno (EAGAIN on a non-blocking descriptor with no event).
static int rn_get_async_event(struct rn_ibv_context *c, struct rn_async_event_out *out) {
	struct rn_ibv_async_event ev;
	if (p_ibv_get_async_event(c, &ev)) return -1;
	memset(out, 0, sizeof(*out));
	out->event_type = ev.event_type;
	switch (ev.event_type) {
	case RN_IBV_EVENT_CQ_ERR:
		out->cq = ev.element.cq;
		break;
	case RN_IBV_EVENT_QP_FATAL: case RN_IBV_EVENT_QP_REQ_ERR: case RN_IBV_EVENT_QP_ACCESS_ERR:
	case RN_IBV_EVENT_COMM_EST: case RN_IBV_EVENT_SQ_DRAINED: case RN_IBV_EVENT_PATH_MIG:
	case RN_IBV_EVENT_PATH_MIG_ERR: case RN_IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qp = ev.element.qp;
		if (ev.element.qp) {
			out->qp_num = ev.element.qp->qp_num;
			out->cq = ev.element.qp->send_cq;
		}
		break;
	case RN_IBV_EVENT_SRQ_ERR: case RN_IBV_EVENT_SRQ_LIMIT_REACHED:
		out->srq = ev.element.srq;
		break;
	case RN_IBV_EVENT_PORT_ACTIVE: case RN_IBV_EVENT_PORT_ERR: case RN_IBV_EVENT_LID_CHANGE:
	case RN_IBV_EVENT_PKEY_CHANGE: case RN_IBV_EVENT_SM_CHANGE: case RN_IBV_EVENT_CLIENT_REREGISTER:
	case RN_IBV_EVENT_GID_CHANGE:
		out->port_num = (uint32_t)ev.element.port_num;
		break;
	default:
		break;
	}
	p_ibv_ack_async_event(&ev);
	return 0;
}

static struct rn_rdma_event_channel *rn_create_event_channel(void) { return p_rdma_create_event_channel(); }
static void rn_destroy_event_channel(struct rn_rdma_event_channel *ch) { p_rdma_destroy_event_channel(ch); }
static int rn_create_id(struct rn_rdma_event_channel *ch, struct rn_rdma_cm_id **id) { return p_rdma_create_id(ch, id, NULL, RN_RDMA_PS_TCP); }
static int rn_destroy_id(struct rn_rdma_cm_id *id) { return p_rdma_destroy_id(id); }
static int rn_bind_addr(struct rn_rdma_cm_id *id, void *sa) { return p_rdma_bind_addr(id, sa); }
static int rn_resolve_addr(struct rn_rdma_cm_id *id, void *src, void *dst, int ms) { return p_rdma_resolve_addr(id, src, dst, ms); }
static int rn_resolve_route(struct rn_rdma_cm_id *id, int ms) { return p_rdma_resolve_route(id, ms); }
static int rn_listen(struct rn_rdma_cm_id *id, int backlog) { return p_rdma_listen(id, backlog); }
static int rn_reject(struct rn_rdma_cm_id *id, const void *pdata, int len) { return p_rdma_reject(id, len ? pdata : NULL, (uint8_t)len); }
static int rn_disconnect(struct rn_rdma_cm_id *id) { return p_rdma_disconnect(id); }
static int rn_migrate_id(struct rn_rdma_cm_id *id, struct rn_rdma_event_channel *ch) { return p_rdma_migrate_id(id, ch); }
static void rn_destroy_qp(struct rn_rdma_cm_id *id) { p_rdma_destroy_qp(id); }
static int rn_set_ack_timeout(struct rn_rdma_cm_id *id, uint8_t t) {
	return p_rdma_set_option(id, RN_RDMA_OPTION_ID, RN_RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t));
}
