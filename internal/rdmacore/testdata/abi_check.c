// Compiled by TestABIMatchesRDMACoreHeaders: every size, offset and constant that
// abi.h declares must equal rdma-core's own. A mismatch fails to compile with the
// name of the field.
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include "../abi.h"

#define SAME_SIZE(ours, theirs) \
	_Static_assert(sizeof(struct ours) == sizeof(struct theirs), "size of " #theirs)
#define SAME_OFFSET(ours, ofield, theirs, tfield) \
	_Static_assert(offsetof(struct ours, ofield) == offsetof(struct theirs, tfield), #theirs "." #tfield)
#define SAME_FIELD(ours, theirs, field) SAME_OFFSET(ours, field, theirs, field)
#define SAME_CONST(ours, theirs) _Static_assert((ours) == (theirs), #theirs)

SAME_OFFSET(rn_ibv_device, node_type, ibv_device, node_type);
SAME_OFFSET(rn_ibv_device, transport_type, ibv_device, transport_type);
SAME_OFFSET(rn_ibv_device, name, ibv_device, name);
_Static_assert(sizeof(((struct rn_ibv_device *)0)->name) == IBV_SYSFS_NAME_MAX, "ibv_device.name length");

SAME_SIZE(rn_ibv_context_ops, ibv_context_ops);
SAME_FIELD(rn_ibv_context_ops, ibv_context_ops, poll_cq);
SAME_FIELD(rn_ibv_context_ops, ibv_context_ops, req_notify_cq);
SAME_FIELD(rn_ibv_context_ops, ibv_context_ops, post_send);
SAME_FIELD(rn_ibv_context_ops, ibv_context_ops, post_recv);
SAME_FIELD(rn_ibv_context_ops, ibv_context_ops, post_srq_recv);
SAME_FIELD(rn_ibv_srq, ibv_srq, context);
SAME_FIELD(rn_ibv_srq, ibv_srq, handle);
SAME_SIZE(rn_ibv_srq_attr, ibv_srq_attr);
SAME_FIELD(rn_ibv_srq_attr, ibv_srq_attr, max_wr);
SAME_FIELD(rn_ibv_srq_attr, ibv_srq_attr, max_sge);
SAME_FIELD(rn_ibv_srq_attr, ibv_srq_attr, srq_limit);
SAME_SIZE(rn_ibv_srq_init_attr, ibv_srq_init_attr);
SAME_FIELD(rn_ibv_srq_init_attr, ibv_srq_init_attr, attr);
SAME_CONST(RN_IBV_SRQ_MAX_WR, IBV_SRQ_MAX_WR);
SAME_CONST(RN_IBV_SRQ_LIMIT, IBV_SRQ_LIMIT);
SAME_FIELD(rn_ibv_context, ibv_context, device);
SAME_FIELD(rn_ibv_context, ibv_context, ops);
SAME_FIELD(rn_ibv_context, ibv_context, cmd_fd);
SAME_FIELD(rn_ibv_context, ibv_context, async_fd);
SAME_FIELD(rn_ibv_context, ibv_context, num_comp_vectors);

SAME_SIZE(rn_ibv_comp_channel, ibv_comp_channel);
SAME_FIELD(rn_ibv_comp_channel, ibv_comp_channel, context);
SAME_FIELD(rn_ibv_comp_channel, ibv_comp_channel, fd);

SAME_FIELD(rn_ibv_cq, ibv_cq, context);
SAME_FIELD(rn_ibv_cq, ibv_cq, channel);
SAME_FIELD(rn_ibv_cq, ibv_cq, cqe);

SAME_FIELD(rn_ibv_qp, ibv_qp, context);
SAME_FIELD(rn_ibv_qp, ibv_qp, send_cq);
SAME_FIELD(rn_ibv_qp, ibv_qp, recv_cq);
SAME_FIELD(rn_ibv_qp, ibv_qp, qp_num);
SAME_FIELD(rn_ibv_qp, ibv_qp, state);
SAME_FIELD(rn_ibv_qp, ibv_qp, qp_type);

SAME_FIELD(rn_ibv_mr, ibv_mr, addr);
SAME_FIELD(rn_ibv_mr, ibv_mr, length);
SAME_FIELD(rn_ibv_mr, ibv_mr, lkey);
SAME_FIELD(rn_ibv_mr, ibv_mr, rkey);

SAME_SIZE(rn_ibv_sge, ibv_sge);
SAME_FIELD(rn_ibv_sge, ibv_sge, addr);
SAME_FIELD(rn_ibv_sge, ibv_sge, length);
SAME_FIELD(rn_ibv_sge, ibv_sge, lkey);

SAME_SIZE(rn_ibv_send_wr, ibv_send_wr);
SAME_FIELD(rn_ibv_send_wr, ibv_send_wr, wr_id);
SAME_FIELD(rn_ibv_send_wr, ibv_send_wr, next);
SAME_FIELD(rn_ibv_send_wr, ibv_send_wr, sg_list);
SAME_FIELD(rn_ibv_send_wr, ibv_send_wr, num_sge);
SAME_FIELD(rn_ibv_send_wr, ibv_send_wr, opcode);
SAME_FIELD(rn_ibv_send_wr, ibv_send_wr, send_flags);
SAME_FIELD(rn_ibv_send_wr, ibv_send_wr, imm_data);
SAME_OFFSET(rn_ibv_send_wr, remote_addr, ibv_send_wr, wr.rdma.remote_addr);
SAME_OFFSET(rn_ibv_send_wr, rkey, ibv_send_wr, wr.rdma.rkey);

SAME_SIZE(rn_ibv_recv_wr, ibv_recv_wr);
SAME_FIELD(rn_ibv_recv_wr, ibv_recv_wr, wr_id);
SAME_FIELD(rn_ibv_recv_wr, ibv_recv_wr, next);
SAME_FIELD(rn_ibv_recv_wr, ibv_recv_wr, sg_list);
SAME_FIELD(rn_ibv_recv_wr, ibv_recv_wr, num_sge);

SAME_SIZE(rn_ibv_wc, ibv_wc);
SAME_FIELD(rn_ibv_wc, ibv_wc, wr_id);
SAME_FIELD(rn_ibv_wc, ibv_wc, status);
SAME_FIELD(rn_ibv_wc, ibv_wc, opcode);
SAME_FIELD(rn_ibv_wc, ibv_wc, vendor_err);
SAME_FIELD(rn_ibv_wc, ibv_wc, byte_len);
SAME_FIELD(rn_ibv_wc, ibv_wc, imm_data);
SAME_FIELD(rn_ibv_wc, ibv_wc, qp_num);
SAME_FIELD(rn_ibv_wc, ibv_wc, wc_flags);

SAME_SIZE(rn_ibv_qp_cap, ibv_qp_cap);
SAME_FIELD(rn_ibv_qp_cap, ibv_qp_cap, max_send_wr);
SAME_FIELD(rn_ibv_qp_cap, ibv_qp_cap, max_recv_wr);
SAME_FIELD(rn_ibv_qp_cap, ibv_qp_cap, max_send_sge);
SAME_FIELD(rn_ibv_qp_cap, ibv_qp_cap, max_recv_sge);
SAME_FIELD(rn_ibv_qp_cap, ibv_qp_cap, max_inline_data);
SAME_SIZE(rn_ibv_qp_init_attr, ibv_qp_init_attr);
SAME_FIELD(rn_ibv_qp_init_attr, ibv_qp_init_attr, send_cq);
SAME_FIELD(rn_ibv_qp_init_attr, ibv_qp_init_attr, recv_cq);
SAME_FIELD(rn_ibv_qp_init_attr, ibv_qp_init_attr, srq);
SAME_FIELD(rn_ibv_qp_init_attr, ibv_qp_init_attr, cap);
SAME_FIELD(rn_ibv_qp_init_attr, ibv_qp_init_attr, qp_type);
SAME_FIELD(rn_ibv_qp_init_attr, ibv_qp_init_attr, sq_sig_all);

SAME_SIZE(rn_ibv_port_attr, ibv_port_attr);
SAME_FIELD(rn_ibv_port_attr, ibv_port_attr, state);
SAME_FIELD(rn_ibv_port_attr, ibv_port_attr, max_mtu);
SAME_FIELD(rn_ibv_port_attr, ibv_port_attr, active_mtu);
SAME_FIELD(rn_ibv_port_attr, ibv_port_attr, gid_tbl_len);
SAME_FIELD(rn_ibv_port_attr, ibv_port_attr, max_msg_sz);
SAME_FIELD(rn_ibv_port_attr, ibv_port_attr, link_layer);

SAME_SIZE(rn_ibv_device_attr, ibv_device_attr);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, fw_ver);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, node_guid);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, max_mr_size);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, vendor_id);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, vendor_part_id);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, max_qp);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, max_qp_wr);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, max_sge);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, max_cq);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, max_cqe);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, max_mr);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, max_pd);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, max_qp_rd_atom);
SAME_FIELD(rn_ibv_device_attr, ibv_device_attr, phys_port_cnt);

SAME_FIELD(rn_rdma_event_channel, rdma_event_channel, fd);
SAME_FIELD(rn_rdma_cm_id, rdma_cm_id, verbs);
SAME_FIELD(rn_rdma_cm_id, rdma_cm_id, channel);
SAME_FIELD(rn_rdma_cm_id, rdma_cm_id, context);
SAME_FIELD(rn_rdma_cm_id, rdma_cm_id, qp);
SAME_OFFSET(rn_rdma_cm_id, src_addr, rdma_cm_id, route.addr.src_storage);
SAME_OFFSET(rn_rdma_cm_id, dst_addr, rdma_cm_id, route.addr.dst_storage);
SAME_FIELD(rn_rdma_cm_id, rdma_cm_id, ps);
SAME_FIELD(rn_rdma_cm_id, rdma_cm_id, port_num);
_Static_assert(sizeof(struct rn_sockaddr_storage) == sizeof(struct sockaddr_storage), "sockaddr_storage");

SAME_SIZE(rn_rdma_conn_param, rdma_conn_param);
SAME_FIELD(rn_rdma_conn_param, rdma_conn_param, private_data);
SAME_FIELD(rn_rdma_conn_param, rdma_conn_param, private_data_len);
SAME_FIELD(rn_rdma_conn_param, rdma_conn_param, responder_resources);
SAME_FIELD(rn_rdma_conn_param, rdma_conn_param, initiator_depth);
SAME_FIELD(rn_rdma_conn_param, rdma_conn_param, flow_control);
SAME_FIELD(rn_rdma_conn_param, rdma_conn_param, retry_count);
SAME_FIELD(rn_rdma_conn_param, rdma_conn_param, rnr_retry_count);
SAME_FIELD(rn_rdma_conn_param, rdma_conn_param, srq);
SAME_FIELD(rn_rdma_conn_param, rdma_conn_param, qp_num);

SAME_FIELD(rn_rdma_cm_event, rdma_cm_event, id);
SAME_FIELD(rn_rdma_cm_event, rdma_cm_event, listen_id);
SAME_FIELD(rn_rdma_cm_event, rdma_cm_event, event);
SAME_FIELD(rn_rdma_cm_event, rdma_cm_event, status);
SAME_OFFSET(rn_rdma_cm_event, conn, rdma_cm_event, param.conn);

SAME_CONST(RN_IBV_QPT_RC, IBV_QPT_RC);
SAME_CONST(RN_IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE);
SAME_CONST(RN_IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM);
SAME_CONST(RN_IBV_WR_SEND, IBV_WR_SEND);
SAME_CONST(RN_IBV_WR_SEND_WITH_IMM, IBV_WR_SEND_WITH_IMM);
SAME_CONST(RN_IBV_SEND_FENCE, IBV_SEND_FENCE);
SAME_CONST(RN_IBV_SEND_SIGNALED, IBV_SEND_SIGNALED);
SAME_CONST(RN_IBV_SEND_SOLICITED, IBV_SEND_SOLICITED);
SAME_CONST(RN_IBV_SEND_INLINE, IBV_SEND_INLINE);
SAME_CONST(RN_IBV_WC_WITH_IMM, IBV_WC_WITH_IMM);
SAME_CONST(RN_IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_LOCAL_WRITE);
SAME_CONST(RN_IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_WRITE);
SAME_CONST(RN_IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_READ);
SAME_CONST(RN_RDMA_PS_TCP, RDMA_PS_TCP);
SAME_CONST(RN_RDMA_OPTION_ID, RDMA_OPTION_ID);
SAME_CONST(RN_RDMA_OPTION_ID_ACK_TIMEOUT, RDMA_OPTION_ID_ACK_TIMEOUT);

SAME_SIZE(rn_ibv_async_event, ibv_async_event);
SAME_FIELD(rn_ibv_async_event, ibv_async_event, element);
SAME_FIELD(rn_ibv_async_event, ibv_async_event, event_type);
SAME_CONST(RN_IBV_EVENT_CQ_ERR, IBV_EVENT_CQ_ERR);
SAME_CONST(RN_IBV_EVENT_QP_FATAL, IBV_EVENT_QP_FATAL);
SAME_CONST(RN_IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
SAME_CONST(RN_IBV_EVENT_QP_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
SAME_CONST(RN_IBV_EVENT_COMM_EST, IBV_EVENT_COMM_EST);
SAME_CONST(RN_IBV_EVENT_SQ_DRAINED, IBV_EVENT_SQ_DRAINED);
SAME_CONST(RN_IBV_EVENT_PATH_MIG, IBV_EVENT_PATH_MIG);
SAME_CONST(RN_IBV_EVENT_PATH_MIG_ERR, IBV_EVENT_PATH_MIG_ERR);
SAME_CONST(RN_IBV_EVENT_DEVICE_FATAL, IBV_EVENT_DEVICE_FATAL);
SAME_CONST(RN_IBV_EVENT_PORT_ACTIVE, IBV_EVENT_PORT_ACTIVE);
SAME_CONST(RN_IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ERR);
SAME_CONST(RN_IBV_EVENT_LID_CHANGE, IBV_EVENT_LID_CHANGE);
SAME_CONST(RN_IBV_EVENT_PKEY_CHANGE, IBV_EVENT_PKEY_CHANGE);
SAME_CONST(RN_IBV_EVENT_SM_CHANGE, IBV_EVENT_SM_CHANGE);
SAME_CONST(RN_IBV_EVENT_SRQ_ERR, IBV_EVENT_SRQ_ERR);
SAME_CONST(RN_IBV_EVENT_SRQ_LIMIT_REACHED, IBV_EVENT_SRQ_LIMIT_REACHED);
SAME_CONST(RN_IBV_EVENT_QP_LAST_WQE_REACHED, IBV_EVENT_QP_LAST_WQE_REACHED);
SAME_CONST(RN_IBV_EVENT_CLIENT_REREGISTER, IBV_EVENT_CLIENT_REREGISTER);
SAME_CONST(RN_IBV_EVENT_GID_CHANGE, IBV_EVENT_GID_CHANGE);
SAME_CONST(RN_IBV_EVENT_WQ_FATAL, IBV_EVENT_WQ_FATAL);
