//go:build ibverbs && linux && cgo

// mwibv.h: the C side of package ibv. libibverbs' work request and completion structs
// contain unions and linked lists, which are awkward to build from Go; the Go side fills
// the flat structs below (in C memory allocated once per queue pair or completion queue)
// and one C call per batch converts them and calls libibverbs.

#ifndef MWIBV_H
#define MWIBV_H

#include <stdint.h>
#include <infiniband/verbs.h>

// mwibv_swr is one send work request in a flat layout.
struct mwibv_swr {
	uint64_t wr_id;
	uint64_t remote_addr; // RDMA READ/WRITE: remote address; BIND_MW: window start
	uint64_t length;      // BIND_MW: window length
	struct ibv_mw *mw;    // BIND_MW: the window
	struct ibv_mr *mr;    // BIND_MW: the region
	uint32_t opcode;      // enum ibv_wr_opcode
	uint32_t send_flags;  // enum ibv_send_flags
	uint32_t imm;         // *_WITH_IMM: immediate data, host byte order
	uint32_t inv_rkey;    // SEND_WITH_INV, LOCAL_INV: the rkey to invalidate
	uint32_t rkey;        // RDMA READ/WRITE: remote key; BIND_MW: the window's new rkey
	uint32_t access;      // BIND_MW: the window's access flags
	uint32_t num_sge;     // SGEs, already stored at the QP's sge[i * max_sge]
	uint32_t prev_rkey;   // set by mwibv_post_send: mw->rkey before this request
	uint32_t advanced;    // set by mwibv_post_send: mw->rkey was moved to rkey
	uint32_t pad;
};

// mwibv_sq is the preallocated send side of a queue pair: cap requests of up to max_sge
// SGEs each.
struct mwibv_sq {
	struct ibv_qp *qp;
	int cap;
	int max_sge;
	int bad; // set by mwibv_post_send on failure
	struct mwibv_swr *in;
	struct ibv_send_wr *wr;
	struct ibv_sge *sge;
	struct ibv_mw *mwcopy;
};

// mwibv_rq is the preallocated receive side of a queue pair, or of a shared receive queue
// (srq set, qp NULL). The Go side fills wr[i].wr_id, wr[i].num_sge and the SGEs at
// sge[i * max_sge]; sg_list is linked once at allocation.
struct mwibv_rq {
	struct ibv_qp *qp;
	struct ibv_srq *srq;
	int cap;
	int max_sge;
	int bad; // set by mwibv_post_recv on failure
	struct ibv_recv_wr *wr;
	struct ibv_sge *sge;
};

// mwibv_wc is one work completion in a flat layout.
struct mwibv_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t flags;
	uint32_t byte_len;
	uint32_t imm_inv; // immediate data (host order) with IBV_WC_WITH_IMM, else the invalidated rkey
	uint32_t qp_num;
	uint32_t vendor_err;
	uint32_t pad;
};

struct mwibv_port {
	uint16_t lid;
	uint8_t state;
	uint8_t link_layer;
	uint32_t active_mtu;
	int gid_tbl_len;
};

struct ibv_context *mwibv_open(const char *name, int *err, char *found, int found_len);
int mwibv_query_port(struct ibv_context *ctx, uint8_t port, struct mwibv_port *out);
// mwibv_gid returns 0 and fills raw and type (0 IB/RoCE v1, 1 RoCE v2) for a populated
// entry of the GID table, or an errno.
int mwibv_gid(struct ibv_context *ctx, uint8_t port, int index, uint8_t *raw, int *type);
int mwibv_probe_inline(struct ibv_context *ctx, int want);

// What the Go allocator answered (mwibvGoAlloc): memory, IBV_ALLOCATOR_USE_DEFAULT, NULL.
enum { MWIBV_ALLOC_OK = 0, MWIBV_ALLOC_DEFAULT = 1, MWIBV_ALLOC_FAIL = 2 };

// mwibv_alloc_parent_domain allocates a parent domain of pd with td (or NULL) and, where
// allocator is not 0 (a cgo.Handle of the Go allocator), the custom allocator callbacks.
struct ibv_pd *mwibv_alloc_parent_domain(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_td *td, uintptr_t allocator);
struct ibv_mr *mwibv_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access, int zero_based);
int mwibv_bind_type1(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t wr_id,
		     uint32_t send_flags, uint64_t addr, uint64_t length, uint32_t access);

struct mwibv_sq *mwibv_sq_alloc(struct ibv_qp *qp, int cap, int max_sge);
void mwibv_sq_free(struct mwibv_sq *q);
struct mwibv_rq *mwibv_rq_alloc(struct ibv_qp *qp, int cap, int max_sge);
struct mwibv_rq *mwibv_srq_alloc(struct ibv_srq *srq, int cap, int max_sge);
void mwibv_rq_free(struct mwibv_rq *q);

// mwibv_post_send posts in[0..n) with one ibv_post_send. It returns 0, or an errno with
// q->bad set to the index of the first request that was not posted. (The index lives in
// C memory so that the Go caller passes no pointer to its own stack, which would escape.)
int mwibv_post_send(struct mwibv_sq *q, int n);
// mwibv_post_recv posts wr[0..n) with one ibv_post_recv (ibv_post_srq_recv for an SRQ's),
// reporting failure likewise.
int mwibv_post_recv(struct mwibv_rq *q, int n);
// mwibv_poll polls up to n completions into scratch and converts them into out. It
// returns how many, or a negative errno.
int mwibv_poll(struct ibv_cq *cq, struct ibv_wc *scratch, struct mwibv_wc *out, int n);

// mwibv_cq_event takes one event from the CQ's channel and acknowledges it: 0 when it got
// one, 1 when none is pending, or an errno.
int mwibv_cq_event(struct ibv_comp_channel *ch);
// mwibv_async_event takes one asynchronous event and acknowledges it: 0 when it got one
// (with its type and, for QP events, the QP number, else -1; for SRQ events the SRQ, else
// 0), 1 when none is pending, or an errno.
int mwibv_async_event(struct ibv_context *ctx, int *type, int64_t *qpn, uintptr_t *srq);

#endif
