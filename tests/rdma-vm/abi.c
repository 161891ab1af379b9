/* Prints the libibverbs structure layout facts that smc-tokio's hand-written FFI relies on
 * (smc-tokio/src/link/verbs/ffi.rs), in the format of `smc-rdma-test abi`, from the installed
 * <infiniband/verbs.h>. run.sh diffs the two outputs before booting any guest. */
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#define OPS(f) (offsetof(struct ibv_context, ops) + offsetof(struct ibv_context_ops, f))
#define L(name, v) printf("%s %zu\n", name, (size_t)(v))

int main(void)
{
	L("ctx_ops_poll_cq", OPS(poll_cq));
	L("ctx_ops_req_notify_cq", OPS(req_notify_cq));
	L("ctx_ops_post_send", OPS(post_send));
	L("ctx_ops_post_recv", OPS(post_recv));
	L("qp_num", offsetof(struct ibv_qp, qp_num));
	L("mr_lkey", offsetof(struct ibv_mr, lkey));
	L("mr_rkey", offsetof(struct ibv_mr, rkey));
	L("channel_fd", offsetof(struct ibv_comp_channel, fd));
	L("port_link_layer", offsetof(struct ibv_port_attr, link_layer));
	L("port_gid_tbl_len", offsetof(struct ibv_port_attr, gid_tbl_len));
	L("port_active_mtu", offsetof(struct ibv_port_attr, active_mtu));
	L("qp_init_attr_size", sizeof(struct ibv_qp_init_attr));
	L("qp_init_attr_cap", offsetof(struct ibv_qp_init_attr, cap));
	L("qp_init_attr_qp_type", offsetof(struct ibv_qp_init_attr, qp_type));
	L("qp_init_attr_sq_sig_all", offsetof(struct ibv_qp_init_attr, sq_sig_all));
	L("qp_attr_size", sizeof(struct ibv_qp_attr));
	L("qp_attr_cap", offsetof(struct ibv_qp_attr, cap));
	L("qp_attr_ah_attr", offsetof(struct ibv_qp_attr, ah_attr));
	L("qp_attr_pkey_index", offsetof(struct ibv_qp_attr, pkey_index));
	L("qp_attr_max_rd_atomic", offsetof(struct ibv_qp_attr, max_rd_atomic));
	L("qp_attr_min_rnr_timer", offsetof(struct ibv_qp_attr, min_rnr_timer));
	L("qp_attr_port_num", offsetof(struct ibv_qp_attr, port_num));
	L("qp_attr_timeout", offsetof(struct ibv_qp_attr, timeout));
	L("qp_attr_retry_cnt", offsetof(struct ibv_qp_attr, retry_cnt));
	L("qp_attr_rnr_retry", offsetof(struct ibv_qp_attr, rnr_retry));
	L("qp_attr_rate_limit", offsetof(struct ibv_qp_attr, rate_limit));
	L("ah_attr_size", sizeof(struct ibv_ah_attr));
	L("ah_attr_dlid", offsetof(struct ibv_ah_attr, dlid));
	L("ah_attr_is_global", offsetof(struct ibv_ah_attr, is_global));
	L("ah_attr_port_num", offsetof(struct ibv_ah_attr, port_num));
	L("grh_sgid_index", offsetof(struct ibv_global_route, sgid_index));
	L("grh_hop_limit", offsetof(struct ibv_global_route, hop_limit));
	L("send_wr_size", sizeof(struct ibv_send_wr));
	L("send_wr_num_sge", offsetof(struct ibv_send_wr, num_sge));
	L("send_wr_opcode", offsetof(struct ibv_send_wr, opcode));
	L("send_wr_send_flags", offsetof(struct ibv_send_wr, send_flags));
	L("send_wr_remote_addr", offsetof(struct ibv_send_wr, wr.rdma.remote_addr));
	L("send_wr_rkey", offsetof(struct ibv_send_wr, wr.rdma.rkey));
	L("recv_wr_size", sizeof(struct ibv_recv_wr));
	L("sge_size", sizeof(struct ibv_sge));
	L("wc_size", sizeof(struct ibv_wc));
	L("wc_status", offsetof(struct ibv_wc, status));
	L("wc_opcode", offsetof(struct ibv_wc, opcode));
	L("wc_byte_len", offsetof(struct ibv_wc, byte_len));
	L("gid_align", alignof(union ibv_gid));
	return 0;
}
