// The part of rdma-core's ABI that rdmanet uses, declared by rdmanet itself.
//
// rdmanet must build on machines without rdma-core's headers and run on machines
// without its libraries, so libibverbs.so.1 and librdmacm.so.1 are opened with
// dlopen at first use and nothing here includes <infiniband/verbs.h>. Only the
// fields rdmanet reads or writes are named; the rest is padding. Structures that
// rdmanet allocates are declared whole (their size matters); structures that only
// rdma-core allocates are declared up to the last field read.
//
// abi_test.go compiles a program against the real headers and checks every size,
// offset and constant below. Change this file and that test together.

#ifndef RDMANET_ABI_H
#define RDMANET_ABI_H

#include <stdint.h>
#include <stddef.h>

// ---- libibverbs ------------------------------------------------------------

struct rn_ibv_device {                // allocated by libibverbs
	void *_ops[2];
	int node_type;
	int transport_type;
	char name[64];
};

struct rn_ibv_context;
struct rn_ibv_cq;
struct rn_ibv_qp;
struct rn_ibv_srq;
struct rn_ibv_wc;
struct rn_ibv_send_wr;
struct rn_ibv_recv_wr;

// The inline verbs (ibv_poll_cq, ibv_req_notify_cq, ibv_post_srq_recv,
// ibv_post_send, ibv_post_recv) are static functions in verbs.h that call
// through this table.
struct rn_ibv_context_ops {
	void *_before_poll_cq[11];
	int (*poll_cq)(struct rn_ibv_cq *cq, int num_entries, struct rn_ibv_wc *wc);
	int (*req_notify_cq)(struct rn_ibv_cq *cq, int solicited_only);
	void *_before_post_srq_recv[7];
	int (*post_srq_recv)(struct rn_ibv_srq *srq, struct rn_ibv_recv_wr *wr, struct rn_ibv_recv_wr **bad_wr);
	void *_before_post_send[4];
	int (*post_send)(struct rn_ibv_qp *qp, struct rn_ibv_send_wr *wr, struct rn_ibv_send_wr **bad_wr);
	int (*post_recv)(struct rn_ibv_qp *qp, struct rn_ibv_recv_wr *wr, struct rn_ibv_recv_wr **bad_wr);
	void *_after_post_recv[5];
};

struct rn_ibv_context {               // allocated by libibverbs
	struct rn_ibv_device *device;
	struct rn_ibv_context_ops ops;
	int cmd_fd;
	int async_fd;
	int num_comp_vectors;
};

struct rn_ibv_comp_channel {          // allocated by libibverbs
	struct rn_ibv_context *context;
	int fd;
	int refcnt;
};

struct rn_ibv_cq {                    // allocated by libibverbs
	struct rn_ibv_context *context;
	struct rn_ibv_comp_channel *channel;
	void *cq_context;
	uint32_t handle;
	int cqe;
};

struct rn_ibv_qp {                    // allocated by libibverbs
	struct rn_ibv_context *context;
	void *qp_context;
	void *pd;
	struct rn_ibv_cq *send_cq;
	struct rn_ibv_cq *recv_cq;
	void *srq;
	uint32_t handle;
	uint32_t qp_num;
	int state;
	int qp_type;
};

struct rn_ibv_srq {                   // allocated by libibverbs
	struct rn_ibv_context *context;
	void *srq_context;
	void *pd;
	uint32_t handle;
};

struct rn_ibv_srq_attr {
	uint32_t max_wr;
	uint32_t max_sge;
	uint32_t srq_limit;
};

struct rn_ibv_srq_init_attr {
	void *srq_context;
	struct rn_ibv_srq_attr attr;
};

// enum ibv_srq_attr_mask
#define RN_IBV_SRQ_MAX_WR 1
#define RN_IBV_SRQ_LIMIT 2

struct rn_ibv_mr {                    // allocated by libibverbs
	struct rn_ibv_context *context;
	void *pd;
	void *addr;
	size_t length;
	uint32_t handle;
	uint32_t lkey;
	uint32_t rkey;
};

struct rn_ibv_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

struct rn_ibv_send_wr {
	uint64_t wr_id;
	struct rn_ibv_send_wr *next;
	struct rn_ibv_sge *sg_list;
	int num_sge;
	int opcode;
	unsigned int send_flags;
	uint32_t imm_data;                // big-endian on the wire
	uint64_t remote_addr;             // wr.rdma.remote_addr
	uint32_t rkey;                    // wr.rdma.rkey
	uint8_t _rest_of_wr_union[20];    // wr.atomic is the union's largest member
	uint8_t _qp_type_and_bind_mw[56]; // unions rdmanet does not use
};

struct rn_ibv_recv_wr {
	uint64_t wr_id;
	struct rn_ibv_recv_wr *next;
	struct rn_ibv_sge *sg_list;
	int num_sge;
};

struct rn_ibv_wc {
	uint64_t wr_id;
	int status;
	int opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm_data;                // big-endian on the wire
	uint32_t qp_num;
	uint32_t src_qp;
	unsigned int wc_flags;
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
};

struct rn_ibv_qp_cap {
	uint32_t max_send_wr;
	uint32_t max_recv_wr;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
};

struct rn_ibv_qp_init_attr {
	void *qp_context;
	struct rn_ibv_cq *send_cq;
	struct rn_ibv_cq *recv_cq;
	void *srq;
	struct rn_ibv_qp_cap cap;
	int qp_type;
	int sq_sig_all;
};

struct rn_ibv_port_attr {
	int state;
	int max_mtu;
	int active_mtu;
	int gid_tbl_len;
	uint32_t port_cap_flags;
	uint32_t max_msg_sz;
	uint32_t bad_pkey_cntr;
	uint32_t qkey_viol_cntr;
	uint16_t pkey_tbl_len;
	uint16_t lid;
	uint16_t sm_lid;
	uint8_t lmc;
	uint8_t max_vl_num;
	uint8_t sm_sl;
	uint8_t subnet_timeout;
	uint8_t init_type_reply;
	uint8_t active_width;
	uint8_t active_speed;
	uint8_t phys_state;
	uint8_t link_layer;
	uint8_t flags;
	uint16_t port_cap_flags2;
};

struct rn_ibv_device_attr {
	char fw_ver[64];
	uint64_t node_guid;
	uint64_t sys_image_guid;
	uint64_t max_mr_size;
	uint64_t page_size_cap;
	uint32_t vendor_id;
	uint32_t vendor_part_id;
	uint32_t hw_ver;
	int max_qp;
	int max_qp_wr;
	unsigned int device_cap_flags;
	int max_sge;
	int max_sge_rd;
	int max_cq;
	int max_cqe;
	int max_mr;
	int max_pd;
	int max_qp_rd_atom;
	int max_ee_rd_atom;
	int max_res_rd_atom;
	int max_qp_init_rd_atom;
	int max_ee_init_rd_atom;
	int atomic_cap;
	int max_ee;
	int max_rdd;
	int max_mw;
	int max_raw_ipv6_qp;
	int max_raw_ethy_qp;
	int max_mcast_grp;
	int max_mcast_qp_attach;
	int max_total_mcast_qp_attach;
	int max_ah;
	int max_fmr;
	int max_map_per_fmr;
	int max_srq;
	int max_srq_wr;
	int max_srq_sge;
	uint16_t max_pkeys;
	uint8_t local_ca_ack_delay;
	uint8_t phys_port_cnt;
};

#define RN_IBV_QPT_RC 2

#define RN_IBV_WR_RDMA_WRITE 0
#define RN_IBV_WR_RDMA_WRITE_WITH_IMM 1
#define RN_IBV_WR_SEND 2
#define RN_IBV_WR_SEND_WITH_IMM 3

#define RN_IBV_SEND_FENCE 1
#define RN_IBV_SEND_SIGNALED 2
#define RN_IBV_SEND_SOLICITED 4
#define RN_IBV_SEND_INLINE 8

#define RN_IBV_WC_WITH_IMM 2

#define RN_IBV_ACCESS_LOCAL_WRITE 1
#define RN_IBV_ACCESS_REMOTE_WRITE 2
#define RN_IBV_ACCESS_REMOTE_READ 4

// struct ibv_async_event: filled by ibv_get_async_event, given back to
// ibv_ack_async_event.
struct rn_ibv_async_event {
	union {
		struct rn_ibv_cq *cq;
		struct rn_ibv_qp *qp;
		void *srq;
		void *wq;
		int port_num;
	} element;
	int event_type;                       // enum ibv_event_type
};

// enum ibv_event_type
#define RN_IBV_EVENT_CQ_ERR 0
#define RN_IBV_EVENT_QP_FATAL 1
#define RN_IBV_EVENT_QP_REQ_ERR 2
#define RN_IBV_EVENT_QP_ACCESS_ERR 3
#define RN_IBV_EVENT_COMM_EST 4
#define RN_IBV_EVENT_SQ_DRAINED 5
#define RN_IBV_EVENT_PATH_MIG 6
#define RN_IBV_EVENT_PATH_MIG_ERR 7
#define RN_IBV_EVENT_DEVICE_FATAL 8
#define RN_IBV_EVENT_PORT_ACTIVE 9
#define RN_IBV_EVENT_PORT_ERR 10
#define RN_IBV_EVENT_LID_CHANGE 11
#define RN_IBV_EVENT_PKEY_CHANGE 12
#define RN_IBV_EVENT_SM_CHANGE 13
#define RN_IBV_EVENT_SRQ_ERR 14
#define RN_IBV_EVENT_SRQ_LIMIT_REACHED 15
#define RN_IBV_EVENT_QP_LAST_WQE_REACHED 16
#define RN_IBV_EVENT_CLIENT_REREGISTER 17
#define RN_IBV_EVENT_GID_CHANGE 18
#define RN_IBV_EVENT_WQ_FATAL 19

// ---- librdmacm -------------------------------------------------------------

struct rn_rdma_event_channel {        // allocated by librdmacm
	int fd;
};

struct rn_sockaddr_storage {
	uint8_t bytes[128];
} __attribute__((aligned(8)));

struct rn_rdma_cm_id {                // allocated by librdmacm
	struct rn_ibv_context *verbs;
	struct rn_rdma_event_channel *channel;
	void *context;
	struct rn_ibv_qp *qp;
	struct rn_sockaddr_storage src_addr;  // route.addr.src_storage
	struct rn_sockaddr_storage dst_addr;  // route.addr.dst_storage
	uint8_t _ib_addr[40];                 // route.addr.addr.ibaddr
	void *path_rec;
	int num_paths;
	int _route_padding;                   // struct rdma_route is 8-aligned
	int ps;
	uint8_t port_num;
};

struct rn_rdma_conn_param {
	const void *private_data;
	uint8_t private_data_len;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t flow_control;
	uint8_t retry_count;
	uint8_t rnr_retry_count;
	uint8_t srq;
	uint32_t qp_num;
};

struct rn_rdma_cm_event {             // allocated by librdmacm
	struct rn_rdma_cm_id *id;
	struct rn_rdma_cm_id *listen_id;
	int event;
	int status;
	struct rn_rdma_conn_param conn;   // param.conn
};

#define RN_RDMA_PS_TCP 0x0106
#define RN_RDMA_OPTION_ID 0
#define RN_RDMA_OPTION_ID_ACK_TIMEOUT 3

#endif
