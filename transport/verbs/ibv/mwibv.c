//go:build ibverbs && linux && cgo

// mwibv.c: the C side of package ibv; see mwibv.h.

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mwibv.h"

struct ibv_context *mwibv_open(const char *name, int *err, char *found, int found_len)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_device *dev = NULL;
	struct ibv_context *ctx;

	if (!list) {
		*err = errno ? errno : ENODEV;
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		if (!name[0] || strcmp(ibv_get_device_name(list[i]), name) == 0) {
			dev = list[i];
			break;
		}
	}
	if (!dev) {
		ibv_free_device_list(list);
		*err = ENODEV;
		return NULL;
	}
	strncpy(found, ibv_get_device_name(dev), found_len - 1);
	found[found_len - 1] = 0;
	ctx = ibv_open_device(dev);
	*err = ctx ? 0 : (errno ? errno : ENODEV);
	ibv_free_device_list(list);
	return ctx;
}

int mwibv_query_port(struct ibv_context *ctx, uint8_t port, struct mwibv_port *out)
{
	struct ibv_port_attr pa;
	int rc = ibv_query_port(ctx, port, &pa);

	if (rc)
		return rc;
	out->lid = pa.lid;
	out->state = pa.state;
	out->link_layer = pa.link_layer;
	out->active_mtu = pa.active_mtu;
	out->gid_tbl_len = pa.gid_tbl_len;
	return 0;
}

int mwibv_gid(struct ibv_context *ctx, uint8_t port, int index, uint8_t *raw, int *type)
{
	struct ibv_gid_entry e;
	int rc = ibv_query_gid_ex(ctx, port, index, &e, 0);

	if (rc) {
		// Older kernels have no GID table query: fall back to the GID alone.
		union ibv_gid g;
		if (rc != EOPNOTSUPP && rc != ENOSYS)
			return rc;
		if (ibv_query_gid(ctx, port, index, &g))
			return errno ? errno : EINVAL;
		memcpy(raw, g.raw, 16);
		*type = -1;
		return 0;
	}
	memcpy(raw, e.gid.raw, 16);
	*type = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 1 : 0;
	return 0;
}

// mwibv_probe_inline reports whether the device creates an RC QP with max_inline_data want.
int mwibv_probe_inline(struct ibv_context *ctx, int want)
{
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = NULL;
	struct ibv_qp *qp = NULL;
	struct ibv_qp_init_attr a;
	int ok = 0;

	if (!pd)
		return 0;
	cq = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	if (cq) {
		memset(&a, 0, sizeof a);
		a.send_cq = cq;
		a.recv_cq = cq;
		a.qp_type = IBV_QPT_RC;
		a.cap.max_send_wr = 1;
		a.cap.max_recv_wr = 1;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		a.cap.max_inline_data = want;
		qp = ibv_create_qp(pd, &a);
		if (qp) {
			ok = 1;
			ibv_destroy_qp(qp);
		}
		ibv_destroy_cq(cq);
	}
	ibv_dealloc_pd(pd);
	return ok;
}

struct ibv_mr *mwibv_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access, int zero_based)
{
	if (zero_based)
		return ibv_reg_mr_iova(pd, (void *)addr, len, 0, access);
	return ibv_reg_mr(pd, (void *)addr, len, access);
}

int mwibv_bind_type1(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t wr_id,
		     uint32_t send_flags, uint64_t addr, uint64_t length, uint32_t access)
{
	struct ibv_mw_bind b;

	memset(&b, 0, sizeof b);
	b.wr_id = wr_id;
	b.send_flags = send_flags;
	b.bind_info.mr = mr;
	b.bind_info.addr = addr;
	b.bind_info.length = length;
	b.bind_info.mw_access_flags = access;
	return ibv_bind_mw(qp, mw, &b);
}

struct mwibv_sq *mwibv_sq_alloc(struct ibv_qp *qp, int cap, int max_sge)
{
	struct mwibv_sq *q = calloc(1, sizeof *q);
	int per = max_sge > 0 ? max_sge : 1;

	if (!q)
		return NULL;
	q->qp = qp;
	q->cap = cap;
	q->max_sge = max_sge;
	q->in = calloc(cap, sizeof *q->in);
	q->wr = calloc(cap, sizeof *q->wr);
	q->sge = calloc((size_t)cap * per, sizeof *q->sge);
	q->mwcopy = calloc(cap, sizeof *q->mwcopy);
	if (!q->in || !q->wr || !q->sge || !q->mwcopy) {
		mwibv_sq_free(q);
		return NULL;
	}
	for (int i = 0; i < cap; i++)
		q->wr[i].sg_list = &q->sge[(size_t)i * per];
	return q;
}

void mwibv_sq_free(struct mwibv_sq *q)
{
	if (!q)
		return;
	free(q->in);
	free(q->wr);
	free(q->sge);
	free(q->mwcopy);
	free(q);
}

struct mwibv_rq *mwibv_rq_alloc(struct ibv_qp *qp, int cap, int max_sge)
{
	struct mwibv_rq *q = calloc(1, sizeof *q);
	int per = max_sge > 0 ? max_sge : 1;

	if (!q)
		return NULL;
	q->qp = qp;
	q->cap = cap;
	q->max_sge = max_sge;
	q->wr = calloc(cap, sizeof *q->wr);
	q->sge = calloc((size_t)cap * per, sizeof *q->sge);
	if (!q->wr || !q->sge) {
		mwibv_rq_free(q);
		return NULL;
	}
	for (int i = 0; i < cap; i++)
		q->wr[i].sg_list = &q->sge[(size_t)i * per];
	return q;
}

struct mwibv_rq *mwibv_srq_alloc(struct ibv_srq *srq, int cap, int max_sge)
{
	struct mwibv_rq *q = mwibv_rq_alloc(NULL, cap, max_sge);

	if (q)
		q->srq = srq;
	return q;
}

void mwibv_rq_free(struct mwibv_rq *q)
{
	if (!q)
		return;
	free(q->wr);
	free(q->sge);
	free(q);
}

int mwibv_post_send(struct mwibv_sq *q, int n)
{
	int *bad = &q->bad;
	struct ibv_send_wr *badwr = NULL;
	int rc;

	for (int i = 0; i < n; i++) {
		struct mwibv_swr *in = &q->in[i];
		struct ibv_send_wr *wr = &q->wr[i];
		struct ibv_sge *sg = wr->sg_list;

		memset(wr, 0, sizeof *wr);
		wr->sg_list = sg;
		wr->wr_id = in->wr_id;
		wr->next = i + 1 < n ? &q->wr[i + 1] : NULL;
		wr->num_sge = in->num_sge;
		wr->opcode = in->opcode;
		wr->send_flags = in->send_flags;
		in->advanced = 0;
		switch (in->opcode) {
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			wr->imm_data = htonl(in->imm);
			/* fallthrough */
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_READ:
			wr->wr.rdma.remote_addr = in->remote_addr;
			wr->wr.rdma.rkey = in->rkey;
			break;
		case IBV_WR_SEND_WITH_IMM:
			wr->imm_data = htonl(in->imm);
			break;
		case IBV_WR_SEND_WITH_INV:
		case IBV_WR_LOCAL_INV:
			wr->invalidate_rkey = in->inv_rkey;
			break;
		case IBV_WR_BIND_MW: {
			// The provider reads the window's current key from mw->rkey at post time
			// (rxe checks it against the kernel's). A private copy per request lets a
			// batch bind one window several times in order, and lets a new rkey whose
			// index names another object be presented with a key the kernel refuses
			// (MW_BIND_ERR) instead of silently binding this window.
			struct ibv_mw *copy = &q->mwcopy[i];
			*copy = *in->mw;
			in->prev_rkey = in->mw->rkey;
			if ((in->rkey >> 8) == (in->mw->rkey >> 8)) {
				in->mw->rkey = in->rkey;
				in->advanced = 1;
			} else {
				copy->rkey = in->mw->rkey ^ 0x80;
			}
			wr->bind_mw.mw = copy;
			wr->bind_mw.rkey = in->rkey;
			wr->bind_mw.bind_info.mr = in->mr;
			wr->bind_mw.bind_info.addr = in->remote_addr;
			wr->bind_mw.bind_info.length = in->length;
			wr->bind_mw.bind_info.mw_access_flags = in->access;
			break;
		}
		default:
			break;
		}
	}
	rc = ibv_post_send(q->qp, &q->wr[0], &badwr);
	if (rc == 0)
		return 0;
	*bad = badwr ? (int)(badwr - &q->wr[0]) : 0;
	if (*bad < 0 || *bad > n)
		*bad = 0;
	// Requests from *bad on were not posted: undo their key updates, newest first.
	for (int i = n - 1; i >= *bad; i--)
		if (q->in[i].advanced)
			q->in[i].mw->rkey = q->in[i].prev_rkey;
	return rc;
}

int mwibv_post_recv(struct mwibv_rq *q, int n)
{
	int *bad = &q->bad;
	struct ibv_recv_wr *badwr = NULL;
	int rc;

	for (int i = 0; i < n; i++)
		q->wr[i].next = i + 1 < n ? &q->wr[i + 1] : NULL;
	if (q->srq)
		rc = ibv_post_srq_recv(q->srq, &q->wr[0], &badwr);
	else
		rc = ibv_post_recv(q->qp, &q->wr[0], &badwr);
	if (rc == 0)
		return 0;
	*bad = badwr ? (int)(badwr - &q->wr[0]) : 0;
	if (*bad < 0 || *bad > n)
		*bad = 0;
	return rc;
}

int mwibv_poll(struct ibv_cq *cq, struct ibv_wc *scratch, struct mwibv_wc *out, int n)
{
	int k = ibv_poll_cq(cq, n, scratch);

	if (k < 0)
		return k;
	for (int i = 0; i < k; i++) {
		struct ibv_wc *w = &scratch[i];
		struct mwibv_wc *o = &out[i];

		o->wr_id = w->wr_id;
		o->status = w->status;
		o->opcode = w->opcode;
		o->flags = w->wc_flags;
		o->byte_len = w->byte_len;
		o->imm_inv = (w->wc_flags & IBV_WC_WITH_IMM) ? ntohl(w->imm_data) : w->invalidated_rkey;
		o->qp_num = w->qp_num;
		o->vendor_err = w->vendor_err;
	}
	return k;
}

int mwibv_cq_event(struct ibv_comp_channel *ch)
{
	struct ibv_cq *cq;
	void *cq_ctx;

	if (ibv_get_cq_event(ch, &cq, &cq_ctx)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 1;
		return errno ? errno : EIO;
	}
	ibv_ack_cq_events(cq, 1);
	return 0;
}

int mwibv_async_event(struct ibv_context *ctx, int *type, int64_t *qpn, uintptr_t *srq)
{
	struct ibv_async_event ev;

	if (ibv_get_async_event(ctx, &ev)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 1;
		return errno ? errno : EIO;
	}
	*type = ev.event_type;
	*qpn = -1;
	*srq = 0;
	switch (ev.event_type) {
	case IBV_EVENT_SRQ_LIMIT_REACHED:
	case IBV_EVENT_SRQ_ERR:
		*srq = (uintptr_t)ev.element.srq;
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		*qpn = ev.element.qp->qp_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 0;
}

// The parent domain's allocator callbacks: libibverbs calls them inside the verb that
// creates or destroys an object of the parent domain, on the thread that called it, and
// they call the Go allocator (allocator.go) named by pd_context, a cgo.Handle.
extern int mwibvGoAlloc(uintptr_t h, size_t size, size_t align, uint64_t type, void **out);
extern void mwibvGoFree(uintptr_t h, void *ptr, uint64_t type);

static void *mwibv_pd_alloc(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment, uint64_t type)
{
	void *p = NULL;
	(void)pd;
	switch (mwibvGoAlloc((uintptr_t)pd_context, size, alignment, type, &p)) {
	case MWIBV_ALLOC_OK:
		return p;
	case MWIBV_ALLOC_DEFAULT:
		return IBV_ALLOCATOR_USE_DEFAULT;
	default:
		return NULL;
	}
}

static void mwibv_pd_free(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t type)
{
	(void)pd;
	mwibvGoFree((uintptr_t)pd_context, ptr, type);
}

struct ibv_pd *mwibv_alloc_parent_domain(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_td *td, uintptr_t allocator)
{
	struct ibv_parent_domain_init_attr attr;

	memset(&attr, 0, sizeof attr);
	attr.pd = pd;
	attr.td = td;
	if (allocator) {
		attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
		attr.alloc = mwibv_pd_alloc;
		attr.free = mwibv_pd_free;
		attr.pd_context = (void *)allocator;
	}
	return ibv_alloc_parent_domain(ctx, &attr);
}
