/* The CPU backend: one batched forward pass over the new tokens of many sequences (prefill
 * chunks and decode tokens mixed), llama2.c style but with all tokens of the batch flattened
 * into the rows of each GEMM, and attention reading K/V from the paged pool.
 *
 * Shapes below: T = new tokens in the batch, D = dim, Q = n_heads*head_dim,
 * KV = n_kv_heads*head_dim, F = ffn_dim, V = n_vocab.
 */
#include "backend-impl.h"
#include "cpu-impl.h"

#include "tycho/errors.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void openblas_set_num_threads(int num_threads); /* OpenBLAS extension, not in cblas.h */

struct cpu_ctx {
    uint32_t n_threads;
    ty_cpu_pool_t *pool;
    float *buf; /* all activation scratch, grown on demand */
    size_t buf_floats;
    float *abuf; /* prefill attention scratch, per worker: K, V gathered (ctx, hd) x2 + scores
                  * (rows, ctx) */
    size_t abuf_floats;
};

struct fwd {
    const struct ty_model *m;
    ty_kvpool_t *kv;
    const struct ty_batch *batch;
    uint32_t layer, T, B, max_ctx;
    uint32_t *pos;    /* (T) position of each new token */
    uint32_t *seq_of; /* (T) index into batch->seqs */
    float *x;         /* (T, D) residual stream */
    float *xb;        /* (T, D) normed input; (T, D) branch output */
    float *q;         /* (T, Q) */
    float *k, *v;     /* (T, KV) */
    float *att;       /* (T, Q) attention output */
    float *hb, *hb2;  /* (T, F) */
    /* mixture of experts: router logits (T, n_experts); expert inputs gathered (T, D) and
     * outputs (T, D); each token's weighted expert outputs (T, n_used, D); the routing */
    float *logits, *xg, *yg, *yslot;
    float *route_w;      /* (T, n_used) weights of the picked experts */
    uint32_t *route_e;   /* (T, n_used) the picked experts, most probable first */
    uint32_t *by_expert; /* (T * n_used) token*n_used+slot, grouped by expert */
    uint32_t *exp_start; /* (n_experts + 1) each expert's range in by_expert */
    float *scores;    /* (n_threads, max_ctx) */
    float *ysh;       /* (T, D) DeepSeek's shared expert output */
    float *mla, *mv;  /* MLA: projection scratch (ty__cpu_mla_scratch), values (T, H*v_head) */
    int kvt;          /* the pool's enum ty_kv_dtype */
    ty_cpu_pool_t *pool; /* the backend's workers (few-token matmuls, attention) */
    float *tile;      /* (tile_floats) matmul conversion scratch */
    size_t tile_floats;
};

static const char *cpu_name(const ty_backend_t *b)
{
    return "cpu";
}

static void cpu_free(ty_backend_t *b)
{
    struct cpu_ctx *c = b->context;
    ty__cpu_pool_free(c->pool);
    free(c->buf);
    free(c->abuf);
    free(c);
    free(b);
}

/* Store one f32 row into row `r` of a page chunk, narrowed for a 16-bit pool. */
static void kv_store(const struct fwd *f, void *chunk, size_t r, const float *x)
{
    uint32_t hd = f->m->cfg.head_dim;
    if (f->kvt != TY_KV_F32)
        ty__cpu_f32_to_kv16(f->kvt, x, (uint16_t *)chunk + r * hd, hd);
    else
        memcpy((float *)chunk + r * hd, x, hd * sizeof(float));
}

/* First key position a query at `pos` sees in this layer: pos - W + 1 for a sliding window of
 * W (llama.cpp masks pos - k >= W), else 0. Pages wholly before it may have been released. */
static uint32_t first_key(const struct fwd *f, uint32_t pos)
{
    uint32_t w = f->m->layers[f->layer].window;
    return w && pos >= w ? pos - w + 1 : 0;
}

/* Head h's attention sink in this layer (gpt-oss): a logit that joins the softmax's
 * denominator and weighs no value, as llama.cpp's soft_max with sinks; -inf (no share) when
 * the model has none. */
static float head_sink(const struct fwd *f, uint32_t h)
{
    const struct ty_weight *s = &f->m->layers[f->layer].sinks;
    return s->data ? ((const float *)s->data)[h] : -INFINITY;
}

/* Attention for tasks [begin, end) of T * n_heads (token t, head h), causal over positions
 * first_key(pos[t])..pos[t] of t's sequence, all of which are in the pool by now. */
static void attn_task(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    struct fwd *f = arg;
    const struct ty_model_config *c = &f->m->cfg;
    uint32_t hd = c->head_dim, B = f->B, group = c->n_heads / c->n_kv_heads;
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = f->scores + (size_t)thread * f->max_ctx; /* (max_ctx) */
    for (uint32_t task = begin; task < end; task++) {
        uint32_t t = task / c->n_heads, h = task % c->n_heads, kvh = h / group, n = f->pos[t] + 1;
        uint32_t lo = first_key(f, f->pos[t]);
        if (f->batch->seqs[f->seq_of[t]].n > 1)
            continue; /* prefill chunks go through attn_prefill() */
        const uint32_t *pages = ty_kvseq_pages(f->batch->seqs[f->seq_of[t]].seq);
        const float *qv = f->q + ((size_t)t * c->n_heads + h) * hd;
        float *out = f->att + ((size_t)t * c->n_heads + h) * hd;
        float mx = -INFINITY, sink = head_sink(f, h);
        for (uint32_t j = lo; j < n; j++) {
            const void *kc = ty_kvpool_k(f->kv, f->layer, pages[j / B]);
            size_t r = (size_t)kvh * B + j % B;
            float d = 0;
            if (f->kvt != TY_KV_F32) {
                d = ty__cpu_dot_kv16(f->kvt, qv, (const uint16_t *)kc + r * hd, hd);
            } else {
                const float *kp = (const float *)kc + r * hd;
                for (uint32_t i = 0; i < hd; i++)
                    d += qv[i] * kp[i];
            }
            sc[j] = d * scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        mx = sink > mx ? sink : mx;
        double sum = 0;
        for (uint32_t j = lo; j < n; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        sum += (double)expf(sink - mx); /* 0 without sinks */
        float inv = (float)(1.0 / sum);
        memset(out, 0, hd * sizeof(float));
        for (uint32_t j = lo; j < n; j++) {
            const void *vc = ty_kvpool_v(f->kv, f->layer, pages[j / B]);
            size_t r = (size_t)kvh * B + j % B;
            float a = sc[j] * inv;
            if (f->kvt != TY_KV_F32) {
                ty__cpu_axpy_kv16(f->kvt, a, (const uint16_t *)vc + r * hd, out, hd);
            } else {
                const float *vp = (const float *)vc + r * hd;
                for (uint32_t i = 0; i < hd; i++)
                    out[i] += a * vp[i];
            }
        }
    }
}

/* Gather positions base..base+ctx-1 (base a multiple of B) of kv head `kvh` from the
 * sequence's pages into contiguous (ctx, hd) arrays. */
static void gather_kv(struct fwd *f, const uint32_t *pages, uint32_t kvh, uint32_t base,
                      uint32_t ctx, float *kc, float *vc)
{
    uint32_t hd = f->m->cfg.head_dim, B = f->B;
    pages += base / B;
    for (uint32_t j = 0; j < ctx; j += B) {
        uint32_t n = ctx - j < B ? ctx - j : B;
        size_t off = (size_t)kvh * B * hd;
        const void *kp = ty_kvpool_k(f->kv, f->layer, pages[j / B]);
        const void *vp = ty_kvpool_v(f->kv, f->layer, pages[j / B]);
        if (f->kvt != TY_KV_F32) {
            ty__cpu_kv16_to_f32(f->kvt, (const uint16_t *)kp + off, kc + (size_t)j * hd,
                                (size_t)n * hd);
            ty__cpu_kv16_to_f32(f->kvt, (const uint16_t *)vp + off, vc + (size_t)j * hd,
                                (size_t)n * hd);
        } else {
            memcpy(kc + (size_t)j * hd, (const float *)kp + off, (size_t)n * hd * 4);
            memcpy(vc + (size_t)j * hd, (const float *)vp + off, (size_t)n * hd * 4);
        }
    }
}

/* Softmax of row[lo..end) in place (max in f32, sum in double), zeros elsewhere in [0, len);
 * `sink` (-inf: none) joins the max and the denominator as one more column, then dropped. */
static void softmax_row(float *row, uint32_t len, uint32_t lo, uint32_t end, float sink)
{
    float mx = sink;
    for (uint32_t j = lo; j < end; j++)
        mx = row[j] > mx ? row[j] : mx;
    double sum = 0;
    for (uint32_t j = lo; j < end; j++) {
        row[j] = expf(row[j] - mx);
        sum += row[j];
    }
    sum += (double)expf(sink - mx);
    float inv = (float)(1.0 / sum);
    for (uint32_t j = lo; j < end; j++)
        row[j] *= inv;
    for (uint32_t j = 0; j < lo; j++)
        row[j] = 0.0f;
    for (uint32_t j = end; j < len; j++)
        row[j] = 0.0f;
}

/* Score rows held at once in attn_prefill: (rows, ctx) floats of at most this many, so that a
 * long chunk over a long context (8k rows x 128k keys would be 4 GiB) takes 64 MiB. */
#define ATTN_SCORE_FLOATS (1u << 24)

/* Attention of one prefill chunk (n > 1 new tokens at rows t0.., positions p0..) as GEMMs
 * over the keys from the page holding the first row's first key (`base`) on, `rows` query
 * rows at a time, each block over the keys up to its last row only (causal):
 * S (rows, kctx) = Q_h K^T * scale, causal (and window) mask, softmax rows, out = S V.
 * Heads are split over the worker pool, each worker gathering its heads' K and V into its own
 * part of the scratch (a KV head shared by a group is gathered once per query head: ctx * hd
 * conversions against rows * ctx * hd products). */
struct attn_prefill {
    struct fwd *f;
    float *buf;  /* per worker: K, V gathered (ctx, hd) each, then scores (rows, ctx) */
    size_t need; /* floats per worker */
    uint32_t t0, n, p0, base, ctx, rows;
};

static void attn_prefill_task(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    const struct attn_prefill *ap = arg;
    struct fwd *f = ap->f;
    const struct ty_model_config *c = &f->m->cfg;
    uint32_t hd = c->head_dim, group = c->n_heads / c->n_kv_heads, n = ap->n, p0 = ap->p0;
    size_t Q = (size_t)c->n_heads * hd;
    float *kc = ap->buf + (size_t)thread * ap->need, *vc = kc + (size_t)ap->ctx * hd;
    float *S = vc + (size_t)ap->ctx * hd;
    const uint32_t *pages = ty_kvseq_pages(f->batch->seqs[f->seq_of[ap->t0]].seq);
    uint32_t have = UINT32_MAX; /* the KV head now in kc, vc */
    for (uint32_t h = begin; h < end; h++) {
        uint32_t kvh = h / group;
        if (kvh != have)
            gather_kv(f, pages, kvh, ap->base, ap->ctx, kc, vc), have = kvh;
        for (uint32_t r0 = 0; r0 < n; r0 += ap->rows) {
            uint32_t m = n - r0 < ap->rows ? n - r0 : ap->rows, kctx = p0 + r0 + m - ap->base;
            const float *q = f->q + (ap->t0 + r0) * Q + (size_t)h * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)kctx, (int)hd,
                        1.0f / sqrtf((float)hd), q, (int)Q, kc, (int)hd, 0.0f, S, (int)kctx);
            for (uint32_t i = 0; i < m; i++)
                softmax_row(S + (size_t)i * kctx, kctx, first_key(f, p0 + r0 + i) - ap->base,
                            p0 + r0 + i + 1 - ap->base, head_sink(f, h));
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)hd, (int)kctx,
                        1.0f, S, (int)kctx, vc, (int)hd, 0.0f,
                        f->att + (ap->t0 + r0) * Q + (size_t)h * hd, (int)Q);
        }
    }
}

static int attn_prefill(struct fwd *f, struct cpu_ctx *cc, uint32_t t0, uint32_t n)
{
    const struct ty_model_config *c = &f->m->cfg;
    uint32_t hd = c->head_dim, p0 = f->pos[t0];
    uint32_t base = first_key(f, p0) / f->B * f->B, ctx = p0 + n - base;
    uint32_t rows = ATTN_SCORE_FLOATS / ctx ? ATTN_SCORE_FLOATS / ctx : 1;
    rows = rows < n ? rows : n;
    uint32_t nth = ty__cpu_pool_threads(cc->pool); /* any worker may take a head */
    size_t need = 2 * (size_t)ctx * hd + (size_t)rows * ctx;
    if (need * nth > cc->abuf_floats) {
        float *nb = realloc(cc->abuf, need * nth * sizeof(float));
        if (!nb)
            return TY_ENOMEM;
        cc->abuf = nb;
        cc->abuf_floats = need * nth;
    }
    struct attn_prefill ap = {.f = f, .buf = cc->abuf, .need = need, .t0 = t0, .n = n,
                              .p0 = p0, .base = base, .ctx = ctx, .rows = rows};
    if ((uint64_t)n * ctx * hd * c->n_heads < (1u << 18))
        attn_prefill_task(&ap, 0, 0, c->n_heads); /* small: a fork-join costs more */
    else
        ty__cpu_pool_run(cc->pool, c->n_heads, attn_prefill_task, &ap);
    return 0;
}

/* MLA: every (token, head) over the split latent rows on the worker pool (mla.c). */
static int attention_mla(struct fwd *f, struct cpu_ctx *cc)
{
    const uint32_t **pages = malloc(f->T * sizeof(*pages));
    if (!pages)
        return TY_ENOMEM;
    for (uint32_t t = 0; t < f->T; t++)
        pages[t] = ty_kvseq_pages(f->batch->seqs[f->seq_of[t]].seq);
    struct ty__cpu_mla_attn a = {f->m, f->kv, f->layer, f->B, f->max_ctx, f->kvt, f->pos,
                                 pages, f->q, f->att, f->scores};
    ty__cpu_pool_run(cc->pool, f->T * f->m->cfg.n_heads, ty__cpu_mla_attn_task, &a);
    free(pages);
    return 0;
}

/* Prefill chunks through GEMM attention, single tokens through the worker pool. */
static int attention(struct fwd *f, struct cpu_ctx *cc)
{
    int rc = 0;
    if (f->m->cfg.kv_lora_rank)
        return attention_mla(f, cc);
    for (uint32_t i = 0, t = 0; i < f->batch->n_seqs && !rc; t += f->batch->seqs[i++].n)
        if (f->batch->seqs[i].n > 1)
            rc = attn_prefill(f, cc, t, f->batch->seqs[i].n);
    ty__cpu_pool_run(cc->pool, f->T * f->m->cfg.n_heads, attn_task, f);
    return rc;
}

static void add_bias(float *y, const struct ty_weight *b, uint32_t T, uint64_t n)
{
    if (!b->data)
        return;
    const float *bv = b->data;
    for (uint32_t t = 0; t < T; t++)
        for (uint64_t i = 0; i < n; i++)
            y[t * n + i] += bv[i];
}

/* q (n_heads, hd) and k (n_kv_heads, hd) of one token, each head through RMSNorm with the
 * layer's q_norm or k_norm weights, in place. */
static void norm_heads(float *q, float *k, const struct ty_layer_weights *L,
                       const struct ty_model_config *c)
{
    uint32_t hd = c->head_dim;
    for (uint32_t h = 0; h < c->n_heads; h++)
        ty__cpu_rmsnorm(q + h * hd, q + h * hd, L->q_norm.data, hd, c->rms_eps);
    for (uint32_t h = 0; h < c->n_kv_heads; h++)
        ty__cpu_rmsnorm(k + h * hd, k + h * hd, L->k_norm.data, hd, c->rms_eps);
}

/* MLA: the absorbed queries into q and each token's latent + rope row into its slot, the
 * row's first half in the K chunk and its second in the V chunk (mla.c). */
static void mla_and_store(struct fwd *f, const struct ty_layer_weights *L)
{
    uint32_t h = f->m->cfg.head_dim, B = f->B;
    ty__cpu_mla_project(f->pool, f->m, L, f->xb, f->T, f->pos, f->q, f->k, f->mla, f->tile,
                        f->tile_floats);
    for (uint32_t t = 0; t < f->T; t++) {
        const uint32_t *pages = ty_kvseq_pages(f->batch->seqs[f->seq_of[t]].seq);
        uint32_t page = pages[f->pos[t] / B], slot = f->pos[t] % B;
        kv_store(f, ty_kvpool_k(f->kv, f->layer, page), slot, f->k + (size_t)t * 2 * h);
        kv_store(f, ty_kvpool_v(f->kv, f->layer, page), slot, f->k + (size_t)t * 2 * h + h);
    }
}

/* q, k, v projections (+ bias, + q/k norm), rope, and the new K/V written to each token's page
 * slot. */
static void qkv_and_store(struct fwd *f, const struct ty_layer_weights *L)
{
    if (f->m->cfg.kv_lora_rank) {
        mla_and_store(f, L);
        return;
    }
    const struct ty_model_config *c = &f->m->cfg;
    uint32_t hd = c->head_dim, T = f->T, B = f->B;
    size_t nq = (size_t)c->n_heads * hd, nkv = (size_t)c->n_kv_heads * hd;
    ty__cpu_matmul(f->pool, &L->wq, f->xb, f->q, T, f->tile, f->tile_floats);
    ty__cpu_matmul(f->pool, &L->wk, f->xb, f->k, T, f->tile, f->tile_floats);
    ty__cpu_matmul(f->pool, &L->wv, f->xb, f->v, T, f->tile, f->tile_floats);
    add_bias(f->q, &L->bq, T, nq);
    add_bias(f->k, &L->bk, T, nkv);
    add_bias(f->v, &L->bv, T, nkv);
    for (uint32_t t = 0; t < T; t++) {
        float *qt = f->q + t * nq, *kt = f->k + t * nkv, *vt = f->v + t * nkv;
        if (L->q_norm.data) /* Qwen3: each head RMS-normed before rope (llama.cpp, HF alike) */
            norm_heads(qt, kt, L, c);
        if (c->qk_hf_order) {
            ty__cpu_unpermute_heads(qt, c->n_heads, hd, f->att);
            ty__cpu_unpermute_heads(kt, c->n_kv_heads, hd, f->att);
        }
        for (uint32_t h = 0; h < c->n_heads; h++)
            ty__cpu_rope(qt + h * hd, hd, f->pos[t], f->m);
        const uint32_t *pages = ty_kvseq_pages(f->batch->seqs[f->seq_of[t]].seq);
        uint32_t page = pages[f->pos[t] / B], slot = f->pos[t] % B;
        void *kp = ty_kvpool_k(f->kv, f->layer, page), *vp = ty_kvpool_v(f->kv, f->layer, page);
        for (uint32_t h = 0; h < c->n_kv_heads; h++) {
            ty__cpu_rope(kt + h * hd, hd, f->pos[t], f->m);
            kv_store(f, kp, (size_t)h * B + slot, kt + h * hd);
            kv_store(f, vp, (size_t)h * B + slot, vt + h * hd);
        }
    }
}

/* hb (n) = silu(hb) * hb2: SwiGLU, in place */
static void swiglu(float *hb, const float *hb2, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float g = hb[i];
        hb[i] = g / (1.0f + expf(-g)) * hb2[i];
    }
}

/* gpt-oss's expert activation (ggml's swiglu_oai, alpha 1.702, limit 7): the gate clamped
 * from above, the up both ways, hb = g * sigmoid(alpha g) * (u + 1), in place. */
static void swiglu_oai(float *hb, const float *hb2, size_t n)
{
    const float alpha = 1.702f, limit = 7.0f;
    for (size_t i = 0; i < n; i++) {
        float g = hb[i] < limit ? hb[i] : limit;
        float u = hb2[i] < -limit ? -limit : hb2[i] > limit ? limit : hb2[i];
        hb[i] = g / (1.0f + expf(alpha * -g)) * (u + 1.0f);
    }
}

/* Row e of a per-expert bias matrix (absent: nothing) added to each of n rows of y. */
static void add_bias_row(float *y, const struct ty_weight *b, uint32_t e, uint32_t n)
{
    if (!b->data)
        return;
    struct ty_weight row = {(const float *)b->data + (size_t)e * b->cols, b->type, 1, b->cols};
    add_bias(y, &row, n, b->cols);
}

/* The k largest of score[0..n) (ties to the lower index) into sel, each weighted by val at
 * its index (val may be score: read before the pick is marked taken, -inf). Returns the
 * weights' sum, in pick order. */
static float top_k(float *score, const float *val, uint32_t n, uint32_t k, uint32_t *sel,
                   float *w)
{
    float sum = 0;
    for (uint32_t j = 0; j < k; j++) {
        uint32_t best = 0;
        for (uint32_t e = 1; e < n; e++)
            best = score[e] > score[best] ? e : best;
        sel[j] = best;
        w[j] = val[best];
        sum += w[j];
        score[best] = -INFINITY; /* taken */
    }
    return sum;
}

/* w[0..k) divided by their sum, clamped to at least 2^-14 as llama.cpp's build_moe_ffn does. */
static void norm_weights(float *w, uint32_t k, float sum)
{
    sum = sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
    for (uint32_t j = 0; j < k; j++)
        w[j] /= sum;
}

/* One token's experts as llama.cpp's build_moe_ffn picks them for deepseek2: probabilities
 * p by softmax or sigmoid (cfg.moe_gating) of the router logits; the selection scores p plus
 * the bias exp_probs_b (DeepSeek-V3's e_score_correction); with expert groups, only the
 * n_group_used groups with the largest sums of their two best scores stay eligible; the
 * n_used best scores, weighted by their unbiased p, renormalised when moe_norm_topk, times
 * expert_weights_scale. */
static void route_deepseek(const struct ty_model_config *c, const struct ty_layer_weights *L,
                           float *p, uint32_t *sel, float *w)
{
    uint32_t E = c->n_experts, K = c->n_experts_used, G = c->n_expert_groups;
    float s[TY_MODEL_MAX_EXPERTS];
    if (c->moe_gating)
        for (uint32_t e = 0; e < E; e++)
            p[e] = 1.0f / (1.0f + expf(-p[e]));
    else
        softmax_row(p, E, 0, E, -INFINITY);
    for (uint32_t e = 0; e < E; e++)
        s[e] = p[e] + (L->exp_probs_b.data ? ((const float *)L->exp_probs_b.data)[e] : 0.0f);
    if (G > 1 && c->n_group_used < G) {
        uint32_t per = E / G;
        float gs[TY_MODEL_MAX_EXPERTS];
        bool keep[TY_MODEL_MAX_EXPERTS] = {false};
        for (uint32_t g = 0; g < G; g++) {
            float a = -INFINITY, b = -INFINITY;
            for (uint32_t e = g * per; e < (g + 1) * per; e++) {
                if (s[e] > a) {
                    b = a;
                    a = s[e];
                } else if (s[e] > b) {
                    b = s[e];
                }
            }
            gs[g] = a + (per > 1 ? b : 0.0f);
        }
        for (uint32_t k = 0; k < c->n_group_used; k++) {
            uint32_t best = 0;
            for (uint32_t g = 1; g < G; g++)
                best = gs[g] > gs[best] ? g : best;
            keep[best] = true;
            gs[best] = -INFINITY;
        }
        for (uint32_t e = 0; e < E; e++)
            s[e] = keep[e / per] ? s[e] : -INFINITY;
    }
    float sum = top_k(s, p, E, K, sel, w);
    if (c->moe_norm_topk)
        norm_weights(w, K, sum);
    float scale = c->expert_weights_scale != 0.0f ? c->expert_weights_scale : 1.0f;
    for (uint32_t k = 0; k < K; k++)
        w[k] *= scale;
}

/* Each token's experts as llama.cpp's build_moe_ffn picks them (softmax gating): softmax over
 * the router logits (plus its bias), the n_used most probable (ties to the lower index), their
 * probabilities divided by their sum (at least 2^-14, as llama.cpp clamps) when
 * moe_norm_topk; or (moe_topk_softmax, gpt-oss) the n_used largest logits, their softmax the
 * weights; then the (token, slot) pairs grouped by expert (counting sort). */
static void moe_route(struct fwd *f, const struct ty_layer_weights *L)
{
    const struct ty_model_config *c = &f->m->cfg;
    uint32_t T = f->T, E = c->n_experts, K = c->n_experts_used;
    ty__cpu_matmul(f->pool, &L->router, f->xb, f->logits, T, f->tile, f->tile_floats);
    add_bias(f->logits, &L->router_b, T, E);
    memset(f->exp_start, 0, (E + 1) * sizeof(uint32_t));
    for (uint32_t t = 0; t < T; t++) {
        float *p = f->logits + (size_t)t * E, *w = f->route_w + (size_t)t * K;
        uint32_t *sel = f->route_e + (size_t)t * K;
        if (c->arch == TY_MODEL_ARCH_DEEPSEEK2) {
            route_deepseek(c, L, p, sel, w);
        } else {
            if (!c->moe_topk_softmax)
                softmax_row(p, E, 0, E, -INFINITY);
            float sum = top_k(p, p, E, K, sel, w);
            if (c->moe_topk_softmax) /* gpt-oss: the weights are the softmax of the k logits */
                softmax_row(w, K, 0, K, -INFINITY);
            if (c->moe_norm_topk)
                norm_weights(w, K, sum);
        }
        for (uint32_t k = 0; k < K; k++)
            f->exp_start[sel[k] + 1]++;
    }
    for (uint32_t e = 0; e < E; e++)
        f->exp_start[e + 1] += f->exp_start[e];
    /* fill each expert's range in token order; logits rows are free now: their first E
     * floats of scratch stand for the fill cursors */
    uint32_t *cur = (uint32_t *)f->logits;
    memcpy(cur, f->exp_start, E * sizeof(uint32_t));
    for (uint32_t i = 0; i < T * K; i++)
        f->by_expert[cur[f->route_e[i]]++] = i;
}

/* y (n, w->rows) = x (n, w->cols) · w^T for an expert's group of n rows. Block-quantized
 * experts take the 8-bit-input integer path (gemv.c) TY_CPU_GEMV_MAX_T rows at a time
 * whatever n is: a token's expert output then does not depend on how many other tokens
 * (of its prompt, or of the other sequences in the step) chose the same expert, and equals
 * llama.cpp's integer block sums in prefill too. Other types as ty__cpu_matmul takes them. */
static void expert_matmul(struct fwd *f, const struct ty_weight *w, const float *x, float *y,
                          uint32_t n)
{
    uint32_t step = ty__cpu_input_block(w->type) && ty__cpu_gemv_supported(w, 1)
                        ? TY_CPU_GEMV_MAX_T
                        : n;
    for (uint32_t i = 0; i < n; i += step) {
        uint32_t m = n - i < step ? n - i : step;
        ty__cpu_matmul(f->pool, w, x + (size_t)i * w->cols, y + (size_t)i * w->rows, m, f->tile,
                       f->tile_floats);
    }
}

/* The mixture-of-experts FFN of the normed rows xb, added to x: the tokens routed to each
 * expert gathered into one matrix and pushed through that expert's gate, up (each + its bias,
 * gpt-oss), SwiGLU (or SwiGLU-OAI) and down (+ bias)
 * as batched matmuls (whatever the weight type: ty__cpu_matmul), each output row scaled by its
 * routing weight into its token's slot; then each token's slots summed in slot order (as
 * llama.cpp adds the experts' views). */
static void moe_ffn(struct fwd *f, const struct ty_layer_weights *L)
{
    const struct ty_model_config *c = &f->m->cfg;
    uint32_t D = c->dim, F = c->ffn_dim, K = c->n_experts_used;
    moe_route(f, L);
    for (uint32_t e = 0; e < c->n_experts; e++) {
        uint32_t n = f->exp_start[e + 1] - f->exp_start[e];
        const uint32_t *rows = f->by_expert + f->exp_start[e];
        if (!n)
            continue;
        for (uint32_t i = 0; i < n; i++)
            memcpy(f->xg + (size_t)i * D, f->xb + (size_t)(rows[i] / K) * D, D * sizeof(float));
        expert_matmul(f, &L->exp_gate[e], f->xg, f->hb, n);
        expert_matmul(f, &L->exp_up[e], f->xg, f->hb2, n);
        add_bias_row(f->hb, &L->exp_b_gate, e, n); /* gpt-oss's expert biases */
        add_bias_row(f->hb2, &L->exp_b_up, e, n);
        if (c->swiglu_oai)
            swiglu_oai(f->hb, f->hb2, (size_t)n * F);
        else
            swiglu(f->hb, f->hb2, (size_t)n * F);
        expert_matmul(f, &L->exp_down[e], f->hb, f->yg, n);
        add_bias_row(f->yg, &L->exp_b_down, e, n);
        for (uint32_t i = 0; i < n; i++) {
            float w = f->route_w[rows[i]], *dst = f->yslot + (size_t)rows[i] * D;
            const float *src = f->yg + (size_t)i * D;
            for (uint32_t d = 0; d < D; d++)
                dst[d] = src[d] * w;
        }
    }
    for (uint32_t t = 0; t < f->T; t++) {
        float *x = f->x + (size_t)t * D, *acc = f->xb + (size_t)t * D;
        const float *y = f->yslot + (size_t)t * K * D;
        memcpy(acc, y, D * sizeof(float));
        for (uint32_t k = 1; k < K; k++)
            for (uint32_t d = 0; d < D; d++)
                acc[d] += y[(size_t)k * D + d];
        if (L->sh_gate.data) /* DeepSeek: routed + shared, then the residual (llama.cpp) */
            for (uint32_t d = 0; d < D; d++)
                acc[d] += f->ysh[(size_t)t * D + d];
        for (uint32_t d = 0; d < D; d++)
            x[d] += acc[d];
    }
}

/* DeepSeek's shared expert of the normed rows xb into ysh: a SwiGLU FFN, run before the
 * routed experts overwrite xb with their sum. */
static void shared_expert(struct fwd *f, const struct ty_layer_weights *L)
{
    uint32_t T = f->T;
    ty__cpu_matmul(f->pool, &L->sh_gate, f->xb, f->hb, T, f->tile, f->tile_floats);
    ty__cpu_matmul(f->pool, &L->sh_up, f->xb, f->hb2, T, f->tile, f->tile_floats);
    swiglu(f->hb, f->hb2, (size_t)T * L->sh_gate.rows);
    ty__cpu_matmul(f->pool, &L->sh_down, f->hb, f->ysh, T, f->tile, f->tile_floats);
}

static int layer_forward(struct fwd *f, struct cpu_ctx *cc)
{
    const struct ty_model_config *c = &f->m->cfg;
    const struct ty_layer_weights *L = &f->m->layers[f->layer];
    uint32_t T = f->T, D = c->dim, F = L->w_gate.data ? (uint32_t)L->w_gate.rows : c->ffn_dim;
    for (uint32_t t = 0; t < T; t++)
        ty__cpu_rmsnorm(f->xb + (size_t)t * D, f->x + (size_t)t * D, L->attn_norm.data, D,
                        c->rms_eps);
    qkv_and_store(f, L);
    int rc = attention(f, cc);
    if (rc)
        return rc;
    const float *att = f->att;
    if (c->kv_lora_rank) { /* MLA: the latent outputs through v_b */
        ty__cpu_mla_values(f->pool, f->m, L, f->att, T, f->mv, f->mla, f->tile, f->tile_floats);
        att = f->mv;
    }
    ty__cpu_matmul(f->pool, &L->wo, att, f->xb, T, f->tile, f->tile_floats);
    add_bias(f->xb, &L->bo, T, D);
    for (size_t i = 0; i < (size_t)T * D; i++)
        f->x[i] += f->xb[i];
    for (uint32_t t = 0; t < T; t++)
        ty__cpu_rmsnorm(f->xb + (size_t)t * D, f->x + (size_t)t * D, L->ffn_norm.data, D,
                        c->rms_eps);
    if (c->n_experts && f->layer >= c->n_dense_lead) {
        if (L->sh_gate.data)
            shared_expert(f, L);
        moe_ffn(f, L);
        return 0;
    }
    ty__cpu_matmul(f->pool, &L->w_gate, f->xb, f->hb, T, f->tile, f->tile_floats);
    ty__cpu_matmul(f->pool, &L->w_up, f->xb, f->hb2, T, f->tile, f->tile_floats);
    swiglu(f->hb, f->hb2, (size_t)T * F);
    ty__cpu_matmul(f->pool, &L->w_down, f->hb, f->xb, T, f->tile, f->tile_floats);
    for (size_t i = 0; i < (size_t)T * D; i++)
        f->x[i] += f->xb[i];
    return 0;
}

/* Check the batch and fill pos/seq_of; returns T via f->T and max context via f->max_ctx. */
static int plan_batch(struct fwd *f, const struct ty_batch *b)
{
    uint32_t t = 0;
    f->max_ctx = 1;
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        const struct ty_batch_seq *s = &b->seqs[i];
        uint64_t past = ty_kvseq_n_tokens(s->seq), end = past + s->n;
        if (!s->n || end > (uint64_t)ty_kvseq_n_pages(s->seq) * f->B || end > (1u << 24))
            return TY_EINVAL;
        for (uint32_t j = 0; j < s->n; j++, t++) {
            if (s->tokens[j] >= f->m->cfg.n_vocab)
                return TY_EINVAL;
            f->pos[t] = (uint32_t)(past + j);
            f->seq_of[t] = i;
        }
        f->max_ctx = end > f->max_ctx ? (uint32_t)end : f->max_ctx;
    }
    return 0;
}

static uint32_t batch_tokens(const struct ty_batch *b)
{
    uint64_t T = 0;
    for (uint32_t i = 0; i < b->n_seqs; i++)
        T += b->seqs[i].n;
    return T > (1u << 20) ? 0 : (uint32_t)T;
}

static int carve(struct cpu_ctx *cc, struct fwd *f, uint32_t T, uint32_t max_ctx)
{
    const struct ty_model_config *c = &f->m->cfg;
    size_t D = c->dim, Q = (size_t)c->n_heads * c->head_dim, KV = (size_t)c->n_kv_heads * c->head_dim;
    if (c->kv_lora_rank) /* MLA: queries and rows of the whole latent + rope row */
        Q = (size_t)c->n_heads * 2 * c->head_dim, KV = 2 * (size_t)c->head_dim;
    size_t F = c->ffn_dim;
    F = c->dense_ffn_dim > F ? c->dense_ffn_dim : F; /* DeepSeek's dense and shared FFNs */
    F = c->shared_ffn_dim > F ? c->shared_ffn_dim : F;
    size_t cols = D > F ? (D > Q ? D : Q) : F;
    size_t mla = c->kv_lora_rank ? ty__cpu_mla_scratch(c, T) + T * (size_t)c->n_heads *
                                   c->v_head_dim : 0;
    if (c->kv_lora_rank) { /* attn_output, wq_b and v_b inputs */
        size_t mc = (size_t)c->n_heads * c->v_head_dim;
        mc = c->q_lora_rank > mc ? c->q_lora_rank : mc;
        mc = c->kv_lora_rank > mc ? c->kv_lora_rank : mc;
        cols = cols > mc ? cols : mc;
    }
    f->tile_floats = ty__cpu_matmul_scratch(cols);
    size_t E = c->n_experts, K = c->n_experts_used;
    size_t moe = E ? T * (E + 3 * D + K * D + 2 * K) + T * K + E + 1 : 0;
    size_t need = T * (2 * D + 2 * Q + 2 * KV + 2 * F) + (size_t)cc->n_threads * max_ctx +
                  f->tile_floats + moe + mla;
    if (need > cc->buf_floats) {
        float *nb = realloc(cc->buf, need * sizeof(float));
        if (!nb)
            return TY_ENOMEM;
        cc->buf = nb;
        cc->buf_floats = need;
    }
    float *p = cc->buf;
    f->x = p, p += T * D;
    f->xb = p, p += T * D;
    f->q = p, p += T * Q;
    f->att = p, p += T * Q;
    f->k = p, p += T * KV;
    f->v = p, p += T * KV;
    f->hb = p, p += T * F;
    f->hb2 = p, p += T * F;
    f->scores = p, p += (size_t)cc->n_threads * max_ctx;
    if (E) { /* the routing's integers share the float scratch (same size) */
        f->logits = p, p += T * E;
        f->xg = p, p += T * D;
        f->yg = p, p += T * D;
        f->yslot = p, p += T * K * D;
        f->route_w = p, p += T * K;
        f->route_e = (uint32_t *)p, p += T * K;
        f->by_expert = (uint32_t *)p, p += T * K;
        f->exp_start = (uint32_t *)p, p += E + 1;
        f->ysh = p, p += T * D;
    }
    if (c->kv_lora_rank) {
        f->mla = p, p += ty__cpu_mla_scratch(c, T);
        f->mv = p, p += T * (size_t)c->n_heads * c->v_head_dim;
    }
    f->tile = p;
    return 0;
}

/* Final norm and the output projection for the rows that want logits. */
static void output_logits(struct fwd *f, float *logits)
{
    const struct ty_model_config *c = &f->m->cfg;
    uint32_t D = c->dim, n = 0, t = 0;
    for (uint32_t i = 0; i < f->batch->n_seqs; i++) {
        const struct ty_batch_seq *s = &f->batch->seqs[i];
        for (uint32_t j = 0; j < s->n; j++, t++)
            if (s->logits_all || j == s->n - 1)
                ty__cpu_rmsnorm(f->xb + (size_t)n++ * D, f->x + (size_t)t * D,
                                f->m->out_norm.data, D, c->rms_eps);
    }
    ty__cpu_matmul(f->pool, &f->m->output, f->xb, logits, n, f->tile, f->tile_floats);
}

static int cpu_forward(ty_backend_t *b, const ty_model_t *m, ty_kvpool_t *pool,
                       const struct ty_batch *batch, float *logits)
{
    struct cpu_ctx *cc = b->context;
    struct fwd f = {.m = m, .kv = pool, .batch = batch, .B = ty_kvpool_block_tokens(pool),
                    .pool = cc->pool, .kvt = (int)ty_kvpool_dtype(pool)};
    uint32_t T = batch_tokens(batch);
    if (T == 0 || !ty_kvpool_is_host(pool))
        return TY_EINVAL;
    f.T = T;
    f.pos = malloc(2 * (size_t)T * sizeof(uint32_t));
    if (!f.pos)
        return TY_ENOMEM;
    f.seq_of = f.pos + T;
    int rc = plan_batch(&f, batch);
    if (!rc)
        rc = carve(cc, &f, T, f.max_ctx);
    if (rc)
        goto out;
    uint32_t lo, hi; /* the stage's layers (all for a whole pass); checked by the caller */
    if ((rc = ty_batch_layers(batch, m->cfg.n_layers, &lo, &hi)))
        goto out;
    if (batch->hidden_in)
        memcpy(f.x, batch->hidden_in, (size_t)T * m->cfg.dim * sizeof(float));
    else
        for (uint32_t t = 0, k = 0; k < batch->n_seqs; k++)
            for (uint32_t j = 0; j < batch->seqs[k].n; j++, t++)
                ty__cpu_row_to_f32(&m->tok_embd, batch->seqs[k].tokens[j],
                                   f.x + (size_t)t * m->cfg.dim);
    for (f.layer = lo; f.layer < hi && !rc; f.layer++) {
        rc = layer_forward(&f, cc);
        if (!rc && batch->layer_cb)
            batch->layer_cb(batch->layer_arg, batch, f.layer);
    }
    if (!rc && batch->hidden_out)
        memcpy(batch->hidden_out, f.x, (size_t)T * m->cfg.dim * sizeof(float));
    else if (!rc)
        output_logits(&f, logits);
out:
    free(f.pos);
    return rc;
}

static const struct ty_backend_i cpu_iface = {
    .name = cpu_name,
    .free = cpu_free,
    .forward = cpu_forward,
    .kv_dtypes = 1u << TY_KV_F32 | 1u << TY_KV_F16 | 1u << TY_KV_BF16,
    .layer_ranges = true,
};

int ty_backend_cpu_new(ty_backend_t **out, const struct ty_backend_cpu_opts *opts)
{
    ty_backend_t *b = calloc(1, sizeof(*b));
    struct cpu_ctx *c = calloc(1, sizeof(*c));
    int rc = TY_ENOMEM;
    if (!b || !c)
        goto err;
    c->n_threads = opts && opts->n_threads ? opts->n_threads : 1;
    if (c->n_threads > 256) {
        rc = TY_EINVAL;
        goto err;
    }
    if ((rc = ty__cpu_pool_new(&c->pool, c->n_threads)))
        goto err;
    openblas_set_num_threads(1); /* the pool splits every GEMM (ops.c) */
    b->iface = &cpu_iface;
    b->context = c;
    *out = b;
    return 0;
err:
    free(c);
    free(b);
    return rc;
}
