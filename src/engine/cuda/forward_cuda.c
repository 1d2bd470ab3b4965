/* The CUDA forward pass: the CPU backend's math (cpu/forward.c) on the device. Tokens are
 * reordered internally: single-token (decode) sequences first, then prefill chunks, so that
 * decode attention reads a dense q block; per-token ops do not care about the order and the
 * logits rows are gathered back into batch order. Every per-step integer (token ids,
 * positions, KV slots, block tables, lengths, logits rows) travels in one pinned staging
 * buffer and one host-to-device copy. All-decode steps whose shapes repeat (same number of
 * sequences, same power-of-two context bucket, same pool) replay a captured CUDA graph. */
#include "cuda-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/sampling.h"

#include <limits.h>
#include <math.h>
#include <string.h>

struct plan {
    uint32_t T, nd, np, n_log;
    uint32_t maxp_d, len_d; /* decode block-table row length, context bound (bucketed) */
    uint32_t maxp_p, maxq_p;
    size_t o_tok, o_pos, o_slot, o_dtab, o_dlen, o_ptab, o_pqs, o_pql, o_pkvl, o_lrow, total;
};

static uint32_t seq_end(const struct ty_batch_seq *s)
{
    return ty_kvseq_n_tokens(s->seq) + s->n;
}

/* Validates the batch as the CPU backend does and sizes everything. */
static int plan_sizes(struct plan *p, const ty_model_t *m, uint32_t B, const struct ty_batch *b)
{
    uint64_t T = 0;
    memset(p, 0, sizeof(*p));
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        const struct ty_batch_seq *s = &b->seqs[i];
        if (!s->seq || !s->n || !s->tokens)
            return TY_EINVAL;
        uint64_t end = (uint64_t)ty_kvseq_n_tokens(s->seq) + s->n;
        if (end > (uint64_t)ty_kvseq_n_pages(s->seq) * B || end > (1u << 24))
            return TY_EINVAL;
        for (uint32_t j = 0; j < s->n; j++)
            if (s->tokens[j] >= m->cfg.n_vocab)
                return TY_EINVAL;
        T += s->n;
        p->n_log += s->logits_all ? s->n : 1;
        uint32_t pages = (uint32_t)((end + B - 1) / B);
        if (s->n == 1) {
            p->nd++;
            p->len_d = end > p->len_d ? (uint32_t)end : p->len_d;
        } else {
            p->np++;
            p->maxp_p = pages > p->maxp_p ? pages : p->maxp_p;
            p->maxq_p = s->n > p->maxq_p ? s->n : p->maxq_p;
        }
    }
    if (T == 0 || T > (1u << 20))
        return TY_EINVAL;
    p->T = (uint32_t)T;
    if (p->nd) { /* a power of two >= 256: graphs see few distinct shapes (bucketed with
                  * graphs off too, so that both run the same decode split) */
        uint32_t lb = 256;
        while (lb < p->len_d)
            lb *= 2;
        p->len_d = lb;
    }
    p->maxp_d = (p->len_d + B - 1) / B;
    return 0;
}

static void plan_offsets(struct plan *p)
{
    size_t o = 0;
    p->o_tok = o, o += p->T;
    p->o_pos = o, o += p->T;
    p->o_slot = o, o += p->T;
    p->o_dtab = o, o += (size_t)p->nd * p->maxp_d;
    p->o_dlen = o, o += p->nd;
    p->o_ptab = o, o += (size_t)p->np * p->maxp_p;
    p->o_pqs = o, o += p->np;
    p->o_pql = o, o += p->np;
    p->o_pkvl = o, o += p->np;
    p->o_lrow = o, o += p->n_log;
    p->total = o;
}

static void fill_table(int32_t *row, uint32_t width, const ty_kvseq_t *seq)
{
    uint32_t n = ty_kvseq_n_pages(seq);
    const uint32_t *pg = ty_kvseq_pages(seq);
    for (uint32_t i = 0; i < width; i++)
        row[i] = i < n && pg[i] != TY_KVPOOL_NO_PAGE ? (int32_t)pg[i] : 0; /* padding and
        * released pages (before a sliding window) are never read */
}

/* Tokens of sequence s at internal rows r0.. : ids, positions, slots. */
static void fill_tokens(int32_t *meta, const struct plan *p, const struct ty_batch_seq *s,
                        uint32_t r0, uint32_t B)
{
    uint32_t past = ty_kvseq_n_tokens(s->seq);
    const uint32_t *pg = ty_kvseq_pages(s->seq);
    for (uint32_t j = 0; j < s->n; j++) {
        uint32_t pos = past + j;
        meta[p->o_tok + r0 + j] = (int32_t)s->tokens[j];
        meta[p->o_pos + r0 + j] = (int32_t)pos;
        meta[p->o_slot + r0 + j] = (int32_t)(pg[pos / B] * B + pos % B);
    }
}

static void plan_fill(int32_t *meta, const struct plan *p, const struct ty_batch *b, uint32_t B)
{
    uint32_t di = 0, pi = 0, prow = p->nd, lr = 0;
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        const struct ty_batch_seq *s = &b->seqs[i];
        uint32_t r0;
        if (s->n == 1) {
            r0 = di;
            fill_table(meta + p->o_dtab + (size_t)di * p->maxp_d, p->maxp_d, s->seq);
            meta[p->o_dlen + di++] = (int32_t)seq_end(s);
        } else {
            r0 = prow;
            fill_table(meta + p->o_ptab + (size_t)pi * p->maxp_p, p->maxp_p, s->seq);
            meta[p->o_pqs + pi] = (int32_t)prow;
            meta[p->o_pql + pi] = (int32_t)s->n;
            meta[p->o_pkvl + pi++] = (int32_t)seq_end(s);
            prow += s->n;
        }
        fill_tokens(meta, p, s, r0, B);
        for (uint32_t j = s->logits_all ? 0 : s->n - 1; j < s->n; j++)
            meta[p->o_lrow + lr++] = (int32_t)(r0 + j);
    }
}

/* ---- buffers -------------------------------------------------------------------------------- */

static int ensure_bufs(struct cuda_ctx *c, const struct ty_model_config *m, uint32_t T)
{
    struct cuda_bufs *b = &c->buf;
    if (T <= b->cap_t)
        return 0;
    uint32_t cap = T < 64 ? 64 : T;
    size_t D = m->dim, Q = (size_t)m->n_heads * m->head_dim;
    size_t KV = (size_t)m->n_kv_heads * m->head_dim, F = m->ffn_dim, V = m->n_vocab;
    size_t K = m->n_experts ? m->n_experts_used : 1, E = m->n_experts; /* slots per token */
    size_t QKV = Q + 2 * KV, ATT = Q, FK = K * F; /* FK: FFN rows per token */
    FK = m->dense_ffn_dim > FK ? m->dense_ffn_dim : FK; /* DeepSeek's dense and shared FFNs */
    FK = m->shared_ffn_dim > FK ? m->shared_ffn_dim : FK;
    size_t widest = D > F ? D : F;
    widest = Q > widest ? Q : widest;
    widest = FK > widest ? FK : widest;
    if (m->kv_lora_rank) { /* MLA (the layout in cuda_bufs) */
        size_t H = m->n_heads, R = m->kv_lora_rank, P = m->rope_dim;
        size_t QF = H * (m->qk_nope_dim + P), HR = H * R, HV = H * m->v_head_dim;
        QKV = QF + m->q_lora_rank + R + P;
        Q = H * (R + P);
        ATT = HR + HV;
        size_t in[] = {QF, HR, HV, m->q_lora_rank}; /* 16-bit GEMM inputs */
        for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++)
            widest = in[i] > widest ? in[i] : widest;
    }
    struct {
        void **p;
        size_t bytes;
    } want[] = {{(void **)&b->x, cap * D * 4},          {(void **)&b->xb, cap * D * 4},
                {(void **)&b->qkv, cap * QKV * 4},      {(void **)&b->q, cap * Q * 4},
                {(void **)&b->att, cap * ATT * 4},      {(void **)&b->gu, cap * 2 * FK * 4},
                {(void **)&b->hb, cap * FK * 4},        {(void **)&b->xg, cap * D * 4},
                {(void **)&b->logits, cap * V * 4},     {&b->xh, cap * widest * 2},
                {(void **)&b->ys, E ? cap * K * D * 4 : 0}, {(void **)&b->rlog, cap * E * 4},
                {(void **)&b->rw, E ? cap * K * 4 : 0}, {(void **)&b->re, E ? cap * K * 4 : 0},
                {(void **)&b->grp_d, E ? 2 * cap * K * 4 : 0}};
    ty__cuda_graphs_reset(c);
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        if (*want[i].p)
            TY_CU_QUIET(cudaFree(*want[i].p));
        *want[i].p = NULL;
    }
    b->cap_t = 0;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        if (!want[i].bytes)
            continue; /* a buffer this model does not use (E = 0) */
        int rc = TY_CU(c, cudaMalloc(want[i].p, want[i].bytes));
        if (rc)
            return rc;
    }
    if (b->grp_h)
        TY_CU_QUIET(cudaFreeHost(b->grp_h));
    b->grp_h = NULL;
    if (E) {
        int rc = TY_CU(c, cudaMallocHost((void **)&b->grp_h, 3 * cap * K * 4));
        if (rc)
            return rc;
    }
    b->cap_t = cap;
    return 0;
}

static int ensure_host(struct cuda_ctx *c, const struct plan *p, uint32_t V)
{
    int rc = 0;
    size_t lf = (size_t)p->n_log * V;
    if (p->total > c->meta_cap) {
        size_t cap = p->total * 2;
        if (c->meta_h)
            TY_CU_QUIET(cudaFreeHost(c->meta_h));
        c->meta_h = NULL;
        size_t dcap = c->meta_cap * 4;
        c->meta_cap = 0;
        if (!(rc = TY_CU(c, cudaMallocHost((void **)&c->meta_h, cap * 4))) &&
            !(rc = ty__cuda_grow(c, (void **)&c->meta_d, &dcap, cap * 4)))
            c->meta_cap = cap;
    }
    if (!rc && p->n_log > c->ids_cap) {
        if (c->ids_h)
            TY_CU_QUIET(cudaFreeHost(c->ids_h));
        c->ids_h = NULL;
        size_t dcap = c->ids_cap * 4;
        c->ids_cap = 0;
        if (!(rc = TY_CU(c, cudaMallocHost((void **)&c->ids_h, p->n_log * 4))) &&
            !(rc = ty__cuda_grow(c, (void **)&c->ids_d, &dcap, p->n_log * 4)))
            c->ids_cap = p->n_log;
    }
    if (!rc && lf > c->logits_cap) {
        if (c->logits_h)
            TY_CU_QUIET(cudaFreeHost(c->logits_h));
        c->logits_h = NULL;
        c->logits_cap = 0;
        if (!(rc = TY_CU(c, cudaMallocHost((void **)&c->logits_h, lf * 4))))
            c->logits_cap = lf;
    }
    return rc;
}

/* ---- the pass ------------------------------------------------------------------------------- */

struct pass {
    struct cuda_ctx *c;
    const struct cuda_model *cm;
    const struct ty_model_config *cfg;
    const struct plan *p;
    ty_kvpool_t *pool;
    struct ty_cuda_kv_layout kl;
    const struct ty_batch *batch; /* its layer_cb: such batches never run as graphs */
};

/* y (T, w->rows) = x (T, w->cols) W^T, converting x to the weight type first when 16-bit. */
static int gemm(struct cuda_ctx *c, float *y, const float *x, const struct cuda_mat *w,
                uint32_t T)
{
    const void *in = x;
    if (w->type != TY_CUDA_F32) {
        int rc = TY_KL(c, ty_cuda_convert(c->buf.xh, w->type, x, TY_CUDA_F32,
                                          (size_t)T * w->cols, c->stream));
        if (rc)
            return rc;
        in = c->buf.xh;
    }
    return TY_KL(c, ty_cuda_gemm(c->blas, y, in, w->d, w->type, (int)T, (int)w->cols,
                                 (int)w->rows));
}

/* Per-head products of MLA (k_b, v_b): y_b = x_b W_b^T or x_b W_b over H heads, the inputs
 * x (T rows of ldx floats, head b's at b * x_head) rounded to the weight type first when it is
 * 16-bit (the whole (T, ldx) block, as gemm() does). w_off: the first head's element in w. */
static int gemm_heads(struct cuda_ctx *c, float *y, int ldy, int y_head, const float *x, int ldx,
                      int x_head, const struct cuda_mat *w, size_t w_off, int ldw, int w_head,
                      bool trans, uint32_t T, int n_in, int n_out, int H)
{
    const void *in = x;
    if (w->type != TY_CUDA_F32) {
        int rc = TY_KL(c, ty_cuda_convert(c->buf.xh, w->type, x, TY_CUDA_F32, (size_t)T * ldx,
                                          c->stream));
        if (rc)
            return rc;
        in = c->buf.xh;
    }
    const char *wd = (const char *)w->d + w_off * ty_cuda_dtype_size(w->type);
    return TY_KL(c, ty_cuda_gemm_heads(c->blas, y, ldy, y_head, in, ldx, x_head, wd, w->type, ldw,
                                       w_head, trans, (int)T, n_in, n_out, H));
}

/* Multi-head latent attention (the CPU's cpu/mla.c, arXiv 2405.04434 in the absorbed form):
 * queries (low-rank when q_lora), their no-rope part absorbed through each head's k_b into the
 * latent, rope parts and the new latent rows (normed, roped, stored), attention over the
 * latent rows, each head's output through its v_b, then attn_output into xb. */
static int mla_attention(struct pass *ps, uint32_t l)
{
    struct cuda_ctx *c = ps->c;
    struct cuda_bufs *b = &c->buf;
    const struct cuda_layer *L = &ps->cm->layers[l];
    const struct ty_model_config *m = ps->cfg;
    const struct ty_model *src = ps->cm->src;
    const struct plan *p = ps->p;
    const int32_t *md = c->meta_d;
    uint32_t T = p->T, cap = b->cap_t;
    int H = (int)m->n_heads, N = (int)m->qk_nope_dim, P = (int)m->rope_dim;
    int R = (int)m->kv_lora_rank, V = (int)m->v_head_dim, QL = (int)m->q_lora_rank;
    float *qf = b->qkv, *qa = qf + (size_t)cap * H * (N + P);
    float *kv = qa + (size_t)cap * QL, *lat = b->att, *val = b->att + (size_t)cap * H * R;
    int rc = 0;
    if (QL) {
        rc = gemm(c, qa, b->xb, &L->wq_a, T);
        if (!rc)
            rc = TY_KL(c, ty_cuda_rmsnorm_f32(qa, qa, L->q_a_norm, (int)T, QL, m->rms_eps,
                                              c->stream));
        if (!rc)
            rc = gemm(c, qf, qa, &L->wq_b, T);
    } else {
        rc = gemm(c, qf, b->xb, &L->wq_b, T);
    }
    /* absorbed queries: q[t][h][0..R) = k_b_h q_nope[t][h]; GGUF's k_b (H R, N) holds k_b_h
     * as (R, N), HF's kv_b (H (N + V), R) its transpose in the first N rows of each head */
    if (!rc && L->wkv_b.d)
        rc = gemm_heads(c, b->q, H * (R + P), R + P, qf, H * (N + P), N + P, &L->wkv_b, 0, R,
                        (N + V) * R, true, T, N, R, H);
    else if (!rc)
        rc = gemm_heads(c, b->q, H * (R + P), R + P, qf, H * (N + P), N + P, &L->wk_b, 0, N,
                        R * N, false, T, N, R, H);
    if (!rc)
        rc = gemm(c, kv, b->xb, &L->wkv_a, T);
    struct ty_cuda_mla mla = {H,
                              R,
                              P,
                              N,
                              m->rms_eps,
                              m->rope == TY_ROPE_NEOX,
                              src->rope_theta_scale,
                              ps->cm->freq_div,
                              ps->cm->yarn_mix,
                              src->rope_freq_scale,
                              src->rope_mscale};
    if (!rc)
        rc = TY_KL(c, ty_cuda_mla_rope_store(b->q, qf, kv, L->kv_a_norm,
                                             ty_kvpool_k(ps->pool, l, 0),
                                             ty_kvpool_v(ps->pool, l, 0), &ps->kl, md + p->o_pos,
                                             md + p->o_slot, (int)T, &mla, c->stream));
    struct ty_cuda_attn_rows r = {(int)p->nd, md + p->o_dtab, (int)p->maxp_d, (int)p->np,
                                  md + p->o_ptab, md + p->o_pqs, (int)p->maxp_p};
    if (!rc)
        rc = TY_KL(c, ty_cuda_mla_attn(lat, b->q, ty_kvpool_k(ps->pool, l, 0),
                                       ty_kvpool_v(ps->pool, l, 0), &ps->kl, &mla, m->kq_scale,
                                       md + p->o_pos, (int)T, &r, c->stream));
    /* values: val[t][h] = v_b_h lat[t][h]; GGUF's v_b (H V, R), HF's the last V rows of each
     * head's N + V in kv_b */
    if (!rc && L->wkv_b.d)
        rc = gemm_heads(c, val, H * V, V, lat, H * R, R, &L->wkv_b, (size_t)N * R, R,
                        (N + V) * R, false, T, R, V, H);
    else if (!rc)
        rc = gemm_heads(c, val, H * V, V, lat, H * R, R, &L->wv_b, 0, R, V * R, false, T, R, V,
                        H);
    return rc ? rc : gemm(c, b->xb, val, &L->wo, T);
}

static int attention(struct pass *ps, uint32_t layer, uint32_t window)
{
    struct cuda_ctx *c = ps->c;
    const struct plan *p = ps->p;
    const struct ty_model_config *m = ps->cfg;
    const void *k = ty_kvpool_k(ps->pool, layer, 0), *v = ty_kvpool_v(ps->pool, layer, 0);
    struct ty_cuda_attn_shape sh = {(int)m->n_heads, (int)m->n_kv_heads, (int)m->head_dim,
                                    1.0f / sqrtf((float)m->head_dim), (int)p->maxp_d,
                                    (int)window};
    const int32_t *md = c->meta_d;
    int rc = 0;
    if (p->nd)
        rc = TY_KL(c, ty_cuda_attn_decode(c->buf.att, c->buf.q, k, v, &ps->kl, &sh,
                                          md + p->o_dtab, md + p->o_dlen, (int)p->nd,
                                          (int)p->len_d, c->ws, c->stream));
    sh.max_pages = (int)p->maxp_p;
    if (!rc && p->np)
        rc = TY_KL(c, ty_cuda_attn_prefill(c->buf.att, c->buf.q, k, v, &ps->kl, &sh,
                                           md + p->o_ptab, md + p->o_pqs, md + p->o_pql,
                                           md + p->o_pkvl, (int)p->np, (int)p->maxq_p,
                                           c->stream));
    const float *sinks = ps->cm->layers[layer].sinks;
    if (!rc && sinks) { /* gpt-oss: the sink joins each row's softmax afterwards */
        struct ty_cuda_attn_rows r = {(int)p->nd, md + p->o_dtab, (int)p->maxp_d, (int)p->np,
                                      md + p->o_ptab, md + p->o_pqs, (int)p->maxp_p};
        rc = TY_KL(c, ty_cuda_attn_sinks(c->buf.att, c->buf.q, k, &ps->kl, &sh, sinks,
                                         md + p->o_pos, (int)p->T, &r, c->stream));
    }
    return rc;
}

/* Steps with a prefill chunk and at least this many tokens run their experts as grouped
 * GEMMs (moe_grouped); others, decode steps always, as per-slot products. */
#define MOE_GROUPED_MIN_T 32

/* Expert e's rows of a stacked expert matrix as a matrix of its own. */
static struct cuda_mat expert_view(const struct cuda_mat *m, uint32_t e, uint32_t rows)
{
    size_t es = ty_cuda_dtype_size(m->type);
    return (struct cuda_mat){(char *)m->d + (size_t)e * rows * m->cols * es, m->type, rows,
                             m->cols};
}

/* A prefill step's experts as the CPU computes them (moe_ffn): the picks come to the host,
 * the (token, slot) pairs are grouped by expert in token order (counting sort), the rows
 * gathered, and each expert's gate|up and down run as one GEMM over its group (cuBLAS) with
 * its biases; the weighted slots are then summed through each slot's grouped row. The host
 * round trip ends any graph capture, so decode steps (graph-captured) keep the per-slot
 * products. Writes gu, hb, ys; reads the routing in re and rw; adds the weighted slots to dst. */
static int moe_grouped(struct pass *ps, const struct cuda_layer *L, float *dst)
{
    struct cuda_ctx *c = ps->c;
    struct cuda_bufs *b = &c->buf;
    const struct ty_model_config *m = ps->cfg;
    uint32_t T = ps->p->T, D = m->dim, F = m->ffn_dim, E = m->n_experts, K = m->n_experts_used;
    uint32_t S = T * K, start[TY_MODEL_MAX_EXPERTS + 1] = {0};
    int32_t *tok = b->grp_h, *row_of = b->grp_h + S, *pick = b->grp_h + 2 * S;
    int rc = TY_CU(c, cudaMemcpyAsync(pick, b->re, S * 4, cudaMemcpyDeviceToHost, c->stream));
    if (!rc)
        rc = TY_CU(c, cudaStreamSynchronize(c->stream));
    if (rc)
        return rc;
    for (uint32_t s = 0; s < S; s++) {
        if ((uint32_t)pick[s] >= E)
            return TY_ECUDA; /* the route kernel writes experts < E only */
        start[pick[s] + 1]++;
    }
    for (uint32_t e = 0; e < E; e++)
        start[e + 1] += start[e];
    uint32_t cur[TY_MODEL_MAX_EXPERTS];
    memcpy(cur, start, E * sizeof(uint32_t));
    for (uint32_t s = 0; s < S; s++) { /* each expert's range in token order */
        uint32_t r = cur[pick[s]]++;
        tok[r] = (int32_t)(s / K);
        row_of[s] = (int32_t)r;
    }
    rc = TY_CU(c, cudaMemcpyAsync(b->grp_d, b->grp_h, 2 * S * 4, cudaMemcpyHostToDevice,
                                  c->stream));
    if (!rc) /* gathered inputs (S, D) into ys, each expert's rows together */
        rc = TY_KL(c, ty_cuda_embed(b->ys, b->xb, TY_CUDA_F32, b->grp_d, (int)S, (int)D, (int)T,
                                    c->stream));
    for (uint32_t e = 0; e < E && !rc; e++) {
        uint32_t n = start[e + 1] - start[e];
        struct cuda_mat w = expert_view(&L->exp_gu, e, 2 * F);
        float *gu = b->gu + (size_t)start[e] * 2 * F;
        if (!n)
            continue;
        rc = gemm(c, gu, b->ys + (size_t)start[e] * D, &w, n);
        if (!rc && L->exp_b_gu)
            rc = TY_KL(c, ty_cuda_add_bias_f32(gu, L->exp_b_gu + (size_t)e * 2 * F, (int)n,
                                               (int)(2 * F), c->stream));
    }
    if (!rc && m->swiglu_oai)
        rc = TY_KL(c, ty_cuda_swiglu_oai_f32(b->hb, b->gu, b->gu + F, (int)S, (int)F,
                                             (int)(2 * F), c->stream));
    else if (!rc)
        rc = TY_KL(c, ty_cuda_silu_mul_f32(b->hb, b->gu, b->gu + F, (int)S, (int)F, (int)(2 * F),
                                           c->stream));
    for (uint32_t e = 0; e < E && !rc; e++) { /* down outputs over the gathered inputs */
        uint32_t n = start[e + 1] - start[e];
        struct cuda_mat w = expert_view(&L->exp_down, e, D);
        float *y = b->ys + (size_t)start[e] * D;
        if (!n)
            continue;
        rc = gemm(c, y, b->hb + (size_t)start[e] * F, &w, n);
        if (!rc && L->exp_b_down)
            rc = TY_KL(c, ty_cuda_add_bias_f32(y, L->exp_b_down + (size_t)e * D, (int)n, (int)D,
                                               c->stream));
    }
    if (!rc)
        rc = TY_KL(c, ty_cuda_moe_combine_rows(dst, b->ys, b->rw, b->grp_d + S, (int)T, (int)K,
                                               (int)D, c->stream));
    return rc;
}

/* The mixture-of-experts FFN of the normed rows xb, added to dst (the residual x, or DeepSeek's
 * shared expert output; the CPU's moe_ffn): router
 * logits (a GEMM, + gpt-oss's bias), each token's experts and weights, each (token, slot)'s
 * gate|up through its expert (+ bias), SwiGLU (gpt-oss: SwiGLU-OAI), down (+ bias), then the
 * weighted slots summed into dst. */
static int moe_ffn(struct pass *ps, const struct cuda_layer *L, float *dst)
{
    struct cuda_ctx *c = ps->c;
    struct cuda_bufs *b = &c->buf;
    const struct ty_model_config *m = ps->cfg;
    int T = (int)ps->p->T, D = (int)m->dim, F = (int)m->ffn_dim, E = (int)m->n_experts;
    int K = (int)m->n_experts_used;
    int rc = gemm(c, b->rlog, b->xb, &L->router, (uint32_t)T);
    if (!rc && m->arch == TY_MODEL_ARCH_DEEPSEEK2) /* sigmoid or softmax, bias, groups, scale */
        rc = TY_KL(c, ty_cuda_moe_route_deepseek(
                          b->re, b->rw, b->rlog, L->exp_probs_b, T, E, K, m->moe_gating != 0,
                          (int)m->n_expert_groups, (int)m->n_group_used, m->moe_norm_topk,
                          m->expert_weights_scale != 0.0f ? m->expert_weights_scale : 1.0f,
                          c->stream));
    else if (!rc && m->moe_topk_softmax) /* gpt-oss: the k largest logits, their softmax */
        rc = TY_KL(c, ty_cuda_moe_route_topk_softmax(b->re, b->rw, b->rlog, L->router_b, T, E,
                                                     K, m->moe_norm_topk, c->stream));
    else if (!rc && L->router_b)
        rc = TY_KL(c, ty_cuda_add_bias_f32(b->rlog, L->router_b, T, E, c->stream));
    if (!rc && !m->moe_topk_softmax && m->arch != TY_MODEL_ARCH_DEEPSEEK2)
        rc = TY_KL(c, ty_cuda_moe_route(b->re, b->rw, b->rlog, T, E, K, m->moe_norm_topk,
                                        c->stream));
    if (!rc && ps->p->np && ps->p->T >= MOE_GROUPED_MIN_T)
        return moe_grouped(ps, L, dst);
    if (!rc)
        rc = TY_KL(c, ty_cuda_moe_matvec_bias(b->gu, b->xb, K, L->exp_gu.d, L->exp_gu.type,
                                              L->exp_b_gu, b->re, T * K, 2 * F, D, c->stream));
    if (!rc && m->swiglu_oai)
        rc = TY_KL(c, ty_cuda_swiglu_oai_f32(b->hb, b->gu, b->gu + F, T * K, F, 2 * F,
                                             c->stream));
    else if (!rc)
        rc = TY_KL(c, ty_cuda_silu_mul_f32(b->hb, b->gu, b->gu + F, T * K, F, 2 * F, c->stream));
    if (!rc)
        rc = TY_KL(c, ty_cuda_moe_matvec_bias(b->ys, b->hb, 1, L->exp_down.d, L->exp_down.type,
                                              L->exp_b_down, b->re, T * K, D, F, c->stream));
    if (!rc)
        rc = TY_KL(c, ty_cuda_moe_combine(dst, b->ys, b->rw, T, K, D, c->stream));
    return rc;
}

/* A SwiGLU FFN of the normed rows xb into y (y may be xb): gate|up (2 F, D) in one GEMM,
 * SiLU(gate) * up, down (D, F). */
static int swiglu_ffn(struct cuda_ctx *c, float *y, const struct cuda_mat *gu,
                      const struct cuda_mat *down, uint32_t T)
{
    struct cuda_bufs *b = &c->buf;
    int F = (int)gu->rows / 2;
    int rc = gemm(c, b->gu, b->xb, gu, T);
    if (!rc)
        rc = TY_KL(c, ty_cuda_silu_mul_f32(b->hb, b->gu, b->gu + F, (int)T, F, 2 * F, c->stream));
    return rc ? rc : gemm(c, y, b->hb, down, T);
}

/* q|k|v (fused GEMM, bias, norms, rope, KV store), attention, attn_output into xb. */
static int qkv_attention(struct pass *ps, uint32_t l, const struct ty_cuda_qkv *q)
{
    struct cuda_ctx *c = ps->c;
    struct cuda_bufs *b = &c->buf;
    const struct cuda_layer *L = &ps->cm->layers[l];
    uint32_t T = ps->p->T;
    int rc = gemm(c, b->qkv, b->xb, &L->wqkv, T);
    if (!rc)
        rc = TY_KL(c, ty_cuda_qkv_rope_store(b->q, ty_kvpool_k(ps->pool, l, 0),
                                             ty_kvpool_v(ps->pool, l, 0), &ps->kl, b->qkv,
                                             L->bqkv, c->meta_d + ps->p->o_pos,
                                             c->meta_d + ps->p->o_slot, (int)T, q, c->stream));
    if (!rc)
        rc = attention(ps, l, ps->cm->src->layers[l].window);
    return rc ? rc : gemm(c, b->xb, b->att, &L->wo, T);
}

static int layer_forward(struct pass *ps, uint32_t l)
{
    struct cuda_ctx *c = ps->c;
    const struct cuda_layer *L = &ps->cm->layers[l];
    const struct ty_model_config *m = ps->cfg;
    const struct ty_model *src = ps->cm->src;
    struct cuda_bufs *b = &c->buf;
    uint32_t T = ps->p->T, D = m->dim;
    struct ty_cuda_qkv q = {(int)m->n_heads, (int)m->n_kv_heads, (int)m->head_dim,
                            m->rope == TY_ROPE_NEOX, m->qk_hf_order, src->rope_theta_scale,
                            ps->cm->freq_div, L->q_norm, L->k_norm, m->rms_eps,
                            ps->cm->yarn_mix, src->rope_freq_scale, src->rope_mscale};
    int rc = TY_KL(c, ty_cuda_rmsnorm_f32(b->xb, b->x, L->attn_norm, (int)T, (int)D, m->rms_eps,
                                          c->stream));
    if (!rc && m->kv_lora_rank)
        rc = mla_attention(ps, l);
    else if (!rc)
        rc = qkv_attention(ps, l, &q);
    if (!rc && L->bo) /* gpt-oss */
        rc = TY_KL(c, ty_cuda_add_bias_f32(b->xb, L->bo, (int)T, (int)D, c->stream));
    if (!rc)
        rc = TY_KL(c, ty_cuda_add_f32(b->x, b->xb, (size_t)T * D, c->stream));
    if (!rc)
        rc = TY_KL(c, ty_cuda_rmsnorm_f32(b->xb, b->x, L->ffn_norm, (int)T, (int)D, m->rms_eps,
                                          c->stream));
    if (!rc && m->n_experts && l >= m->n_dense_lead) {
        /* DeepSeek's shared expert into xg, the routed sum added to it, then xg to x: x +
         * (routed + shared), the CPU's (llama.cpp's) order of the adds */
        if (L->sh_gu.d)
            rc = swiglu_ffn(c, b->xg, &L->sh_gu, &L->sh_down, T);
        if (!rc)
            rc = moe_ffn(ps, L, L->sh_gu.d ? b->xg : b->x);
        if (!rc && L->sh_gu.d)
            rc = TY_KL(c, ty_cuda_add_f32(b->x, b->xg, (size_t)T * D, c->stream));
        return rc;
    }
    if (!rc) /* the dense FFN (DeepSeek's dense lead layers have their own width) */
        rc = swiglu_ffn(c, b->xb, &L->wgu, &L->wdown, T);
    if (!rc)
        rc = TY_KL(c, ty_cuda_add_f32(b->x, b->xb, (size_t)T * D, c->stream));
    return rc;
}

/* Everything between the metadata upload and the logits download (what a graph holds). */
static int enqueue(struct pass *ps)
{
    struct cuda_ctx *c = ps->c;
    const struct cuda_model *cm = ps->cm;
    const struct ty_model_config *m = ps->cfg;
    const struct plan *p = ps->p;
    struct cuda_bufs *b = &c->buf;
    int rc = TY_KL(c, ty_cuda_embed(b->x, cm->embd.d, cm->embd.type, c->meta_d + p->o_tok,
                                    (int)p->T, (int)m->dim, (int)m->n_vocab, c->stream));
    for (uint32_t l = 0; l < m->n_layers && !rc; l++) {
        rc = layer_forward(ps, l);
        if (!rc && ps->batch->layer_cb) { /* layer l's K/V must be in the pool when it runs */
            rc = TY_CU(c, cudaStreamSynchronize(c->stream));
            if (!rc)
                ps->batch->layer_cb(ps->batch->layer_arg, ps->batch, l);
        }
    }
    if (!rc) /* the rows that want logits, in batch order (an f32 "embedding" of x) */
        rc = TY_KL(c, ty_cuda_embed(b->xg, b->x, TY_CUDA_F32, c->meta_d + p->o_lrow,
                                    (int)p->n_log, (int)m->dim, (int)p->T, c->stream));
    if (!rc)
        rc = TY_KL(c, ty_cuda_rmsnorm_f32(b->xg, b->xg, cm->out_norm, (int)p->n_log, (int)m->dim,
                                          m->rms_eps, c->stream));
    if (!rc)
        rc = gemm(c, b->logits, b->xg, &cm->output, p->n_log);
    return rc;
}

/* ---- CUDA graphs ------------------------------------------------------------------------------ */

static uint64_t graph_key(const struct plan *p, const ty_kvpool_t *pool)
{
    uint64_t h = 1469598103934665603ull;
    uint64_t v[] = {p->nd, p->len_d, p->n_log, (uint64_t)(uintptr_t)pool};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        h = (h ^ v[i]) * 1099511628211ull;
    return h;
}

static int capture(struct pass *ps, struct cuda_graph *g)
{
    struct cuda_ctx *c = ps->c;
    cudaGraph_t graph = NULL;
    c->capturing = true; /* errors here are capture problems, not device faults */
    int rc = TY_CU(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    int erc = rc ? rc : enqueue(ps);
    if (!rc)
        rc = TY_CU(c, cudaStreamEndCapture(c->stream, &graph));
    if (!rc && !erc)
        rc = TY_CU(c, cudaGraphInstantiate(&g->exec, graph, 0));
    c->capturing = false;
    if (graph)
        TY_CU_QUIET(cudaGraphDestroy(graph));
    c->n_graph_captures += !rc && !erc;
    return erc ? erc : rc;
}

/* Runs an all-decode step through a graph: eager the first time a shape is seen (lazy module
 * loading happens outside any capture), captured the second time, replayed afterwards. */
static int run_graph(struct pass *ps)
{
    struct cuda_ctx *c = ps->c;
    uint64_t key = graph_key(ps->p, ps->pool);
    struct cuda_graph *g = NULL, *lru = &c->graph[0];
    for (int i = 0; i < TY_CUDA_MAX_GRAPHS && !g; i++) {
        if (c->graph[i].used && c->graph[i].key == key)
            g = &c->graph[i];
        else if (!c->graph[i].used || c->graph[i].last_use < lru->last_use)
            lru = !lru->used ? lru : &c->graph[i];
    }
    if (!g) {
        if (lru->used && lru->exec)
            TY_CU_QUIET(cudaGraphExecDestroy(lru->exec));
        *lru = (struct cuda_graph){.used = true, .key = key, .last_use = ++c->graph_clock};
        return enqueue(ps);
    }
    g->last_use = ++c->graph_clock;
    if (!g->exec) {
        int rc = capture(ps, g);
        if (rc) {
            TY_LOG_WARN("cuda", "%s: decode step capture failed (%s), graphs off", c->name,
                        ty_err_name(rc));
            c->graphs = false;
            return c->failed ? rc : enqueue(ps);
        }
    }
    c->n_graph_launches++;
    return TY_CU(c, cudaGraphLaunch(g->exec, c->stream));
}

/* ---- entry ---------------------------------------------------------------------------------- */

static int prepare(struct cuda_ctx *c, const ty_model_t *m, ty_kvpool_t *pool,
                   const struct ty_batch *batch, struct plan *p)
{
    const struct ty_model_config *cfg = &m->cfg;
    uint32_t B = ty_kvpool_block_tokens(pool);
    int rc = plan_sizes(p, m, B, batch);
    if (rc)
        return rc;
    plan_offsets(p);
    if ((rc = TY_CU(c, cudaSetDevice(c->device))) || (rc = ty__cuda_model_use(c, m)) ||
        (rc = ensure_bufs(c, cfg, p->T)) || (rc = ensure_host(c, p, cfg->n_vocab)))
        return rc;
    if (p->nd) {
        struct ty_cuda_attn_shape sh = {(int)cfg->n_heads, (int)cfg->n_kv_heads,
                                        (int)cfg->head_dim, 1.0f, (int)p->maxp_d, 0};
        size_t ws = ty_cuda_attn_decode_workspace(&sh, (int)p->nd, (int)p->len_d);
        if ((rc = ty__cuda_grow(c, &c->ws, &c->ws_cap, ws)))
            return rc;
    }
    plan_fill(c->meta_h, p, batch, B);
    return TY_CU(c, cudaMemcpyAsync(c->meta_d, c->meta_h, p->total * 4, cudaMemcpyHostToDevice,
                                    c->stream));
}

static bool pool_fits(const ty_kvpool_t *pool, const struct ty_model_config *m)
{
    return !ty_kvpool_is_host(pool) &&
           ty_kvpool_page_bytes(pool) == (size_t)m->n_kv_heads * ty_kvpool_block_tokens(pool) *
                                             m->head_dim *
                                             ty_kv_dtype_size(ty_kvpool_dtype(pool));
}

/* The kernels' element type of a pool's pages (the same IEEE half / bfloat16 bits, rounded to
 * nearest even when stored, as the CPU backend's, so pages move between the two as bytes). */
static enum ty_cuda_dtype kv_type(enum ty_kv_dtype t)
{
    return t == TY_KV_F16 ? TY_CUDA_F16 : t == TY_KV_BF16 ? TY_CUDA_BF16 : TY_CUDA_F32;
}

/* The batch's draws on the device (struct ty_batch.draws): the rows' parameters and
 * adjustments go up in one copy, one kernel draws every row (ty_cuda_sample_draws), and the
 * results come back, never the logits rows. */
static int run_draws(struct cuda_ctx *c, const struct ty_batch *batch, uint32_t n_log,
                     uint32_t V)
{
    uint32_t n_adj = 0;
    for (uint32_t i = 0; i < n_log; i++) /* adj_begin indexes the caller's whole array */
        if (batch->draws[i].n_adj && batch->draws[i].adj_begin + batch->draws[i].n_adj > n_adj)
            n_adj = batch->draws[i].adj_begin + batch->draws[i].n_adj;
    size_t up = n_log * sizeof(struct ty_cuda_draw) + n_adj * sizeof(struct ty_cuda_logit_adj);
    size_t down = n_log * sizeof(struct ty_cuda_draw_out), need = up + down;
    int rc = 0;
    if (need > c->draw_cap) {
        if (c->draw_h)
            TY_CU_QUIET(cudaFreeHost(c->draw_h));
        c->draw_h = NULL;
        size_t dcap = c->draw_cap;
        c->draw_cap = 0;
        if (!(rc = TY_CU(c, cudaMallocHost(&c->draw_h, need))) &&
            !(rc = ty__cuda_grow(c, &c->draw_d, &dcap, need)))
            c->draw_cap = need;
        if (rc)
            return rc;
    }
    struct ty_cuda_draw *dh = c->draw_h;
    struct ty_cuda_logit_adj *ah = (struct ty_cuda_logit_adj *)(dh + n_log);
    for (uint32_t i = 0; i < n_log; i++) {
        const struct ty_row_draw *d = &batch->draws[i];
        dh[i] = (struct ty_cuda_draw){
            .temperature = d->temperature, .top_p = d->top_p, .min_p = d->min_p,
            .u = (float)d->u, .top_k = d->top_k > INT32_MAX ? INT32_MAX : (int32_t)d->top_k,
            .adj_begin = (int32_t)d->adj_begin, .n_adj = (int32_t)d->n_adj,
            .n_top = (int32_t)d->n_logprobs, .logprob = d->logprobs || d->n_logprobs};
    }
    for (uint32_t j = 0; j < n_adj; j++)
        ah[j] = (struct ty_cuda_logit_adj){(int32_t)batch->adj[j].id, batch->adj[j].rep,
                                           batch->adj[j].sub, batch->adj[j].bias};
    struct ty_cuda_draw *dd = c->draw_d;
    struct ty_cuda_logit_adj *ad = (struct ty_cuda_logit_adj *)(dd + n_log);
    struct ty_cuda_draw_out *od = (struct ty_cuda_draw_out *)((char *)c->draw_d + up);
    const struct ty_cuda_draw_out *oh =
        (const struct ty_cuda_draw_out *)((const char *)c->draw_h + up);
    if (!(rc = TY_CU(c, cudaMemcpyAsync(dd, dh, up, cudaMemcpyHostToDevice, c->stream))) &&
        !(rc = TY_KL(c, ty_cuda_sample_draws(od, c->buf.logits, dd, ad, (int)n_log, (int)V,
                                             c->stream))) &&
        !(rc = TY_CU(c, cudaMemcpyAsync((void *)oh, od, down, cudaMemcpyDeviceToHost,
                                        c->stream))))
        rc = TY_CU(c, cudaStreamSynchronize(c->stream));
    for (uint32_t i = 0; i < n_log && !rc; i++) {
        struct ty_sample *s = &batch->samples[i];
        memset(s, 0, sizeof(*s));
        s->id = (uint32_t)oh[i].id;
        s->logprob = oh[i].logprob;
        s->n_top = oh[i].n_top < 0                        ? 0
                   : oh[i].n_top > TY_SAMPLE_MAX_LOGPROBS ? TY_SAMPLE_MAX_LOGPROBS
                                                          : (uint32_t)oh[i].n_top;
        for (uint32_t k = 0; k < s->n_top; k++)
            s->top[k] = (struct ty_token_logprob){(uint32_t)oh[i].top_id[k], oh[i].top_lp[k]};
    }
    return rc;
}

int ty__cuda_forward(ty_backend_t *b, const ty_model_t *m, ty_kvpool_t *pool,
                     const struct ty_batch *batch, float *logits)
{
    struct cuda_ctx *c = b->context;
    struct plan p;
    if (c->failed)
        return TY_ECUDA;
    if (!pool_fits(pool, &m->cfg))
        return TY_EINVAL; /* a host pool, or one made for another geometry */
    int rc = prepare(c, m, pool, batch, &p);
    if (rc)
        return rc;
    struct pass ps = {c, c->model, &m->cfg, &p, pool,
                      {kv_type(ty_kvpool_dtype(pool)),
                       (int)m->cfg.n_kv_heads, (int)ty_kvpool_block_tokens(pool),
                       (int)m->cfg.head_dim, (int)ty_kvpool_pages_total(pool)},
                      batch};
    rc = c->graphs && p.np == 0 && !batch->layer_cb ? run_graph(&ps) : enqueue(&ps);
    if (batch->draws)
        return rc ? rc : run_draws(c, batch, p.n_log, m->cfg.n_vocab);
    if (batch->ids) { /* greedy rows: the picks come back, never the rows */
        if (!rc)
            rc = TY_KL(c, ty_cuda_sample_greedy(c->ids_d, c->buf.logits, (int)p.n_log,
                                                (int)m->cfg.n_vocab, c->stream));
        if (!rc)
            rc = TY_CU(c, cudaMemcpyAsync(c->ids_h, c->ids_d, p.n_log * 4,
                                          cudaMemcpyDeviceToHost, c->stream));
        if (!rc)
            rc = TY_CU(c, cudaStreamSynchronize(c->stream));
        for (uint32_t i = 0; i < p.n_log && !rc; i++)
            batch->ids[i] = (uint32_t)c->ids_h[i];
        return rc;
    }
    size_t bytes = (size_t)p.n_log * m->cfg.n_vocab * 4;
    if (!rc)
        rc = TY_CU(c, cudaMemcpyAsync(c->logits_h, c->buf.logits, bytes, cudaMemcpyDeviceToHost,
                                      c->stream));
    if (!rc)
        rc = TY_CU(c, cudaStreamSynchronize(c->stream));
    if (!rc)
        memcpy(logits, c->logits_h, bytes);
    return rc;
}
