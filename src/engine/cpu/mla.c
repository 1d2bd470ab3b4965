/* Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434 §2.1) in the absorbed form
 * llama.cpp's deepseek2 graph computes: the paged KV holds, per token, only the RMS-normed
 * latent c (kv_lora_rank R) and the roped shared key part k_pe (rope_dim P). Each head's query
 * [q_nope (N) | q_pe (P)] becomes [k_b_h q_nope (R) | rope(q_pe) (P)], so a score is one dot
 * product against the stored row (multi-query attention with one kv head of R + P), the
 * attention output over the rows' latent part is mapped back per head by v_b (R -> v_head),
 * then through attn_output.
 * Pool layout: the row (R + P values) is cut in two halves, the first in the page's K chunk,
 * the second in its V chunk (cfg.head_dim = (R + P) / 2, one kv head). So a page's two chunks
 * hold exactly the latent rows and every byte count built on ty_kvpool_page_bytes() (transfer
 * to decode, KV pool values, export, metrics) is the latent size per token with no special
 * case downstream. Called from the backend's thread; matmuls fan out on `pool`. */
#include "cpu-impl.h"

#include "tycho/gguf.h"
#include "tycho/kvpool.h"

#include <math.h>
#include <string.h>

size_t ty__cpu_mla_scratch(const struct ty_model_config *c, uint32_t T)
{
    size_t H = c->n_heads, N = c->qk_nope_dim, P = c->rope_dim, R = c->kv_lora_rank;
    size_t V = c->v_head_dim;
    return (size_t)T * (H * (N + P) + c->q_lora_rank + N + R + V);
}

/* `rows` rows of w from row `first`: one head's matrix of a per-head stack (k_b, v_b, or the
 * v rows of HF's kv_b_proj). */
static struct ty_weight head_view(const struct ty_weight *w, uint64_t first, uint64_t rows)
{
    uint64_t row_bytes = ty_ggml_type_nbytes(w->type, w->cols);
    return (struct ty_weight){(const unsigned char *)w->data + first * row_bytes, w->type, rows,
                              w->cols};
}

/* HF's kv_b_proj keeps each head's k part as (N, R), k_b transposed: q_abs (R) =
 * sum_n q_nope[n] * row n, each row widened to f32 into tmp (R). */
static void absorb_rows(const struct ty_weight *kvb, uint64_t first, const float *qn, uint32_t N,
                        float *out, float *tmp)
{
    uint64_t R = kvb->cols;
    memset(out, 0, R * sizeof(float));
    for (uint32_t n = 0; n < N; n++) {
        ty__cpu_row_to_f32(kvb, first + n, tmp);
        for (uint64_t r = 0; r < R; r++)
            out[r] += qn[n] * tmp[r];
    }
}

/* y (T, rows) = x (T, cols) · head h's matrix^T, where x is column block `xoff` of rows of
 * `xstride` floats and y goes to column block `yoff` of rows of `ystride`: gathered into
 * contiguous (T, cols) and scattered back, as the matmul wants whole rows. */
static void head_matmul(ty_cpu_pool_t *pool, const struct ty_weight *w, const float *x,
                        size_t xstride, float *y, size_t ystride, uint32_t T, float *gin,
                        float *gout, float *tile, size_t tile_floats)
{
    for (uint32_t t = 0; t < T; t++)
        memcpy(gin + (size_t)t * w->cols, x + t * xstride, w->cols * sizeof(float));
    ty__cpu_matmul(pool, w, gin, gout, T, tile, tile_floats);
    for (uint32_t t = 0; t < T; t++)
        memcpy(y + t * ystride, gout + (size_t)t * w->rows, w->rows * sizeof(float));
}

void ty__cpu_mla_project(ty_cpu_pool_t *pool, const struct ty_model *m,
                         const struct ty_layer_weights *L, const float *xb, uint32_t T,
                         const uint32_t *pos, float *q, float *kv, float *scratch, float *tile,
                         size_t tile_floats)
{
    const struct ty_model_config *c = &m->cfg;
    uint32_t H = c->n_heads, N = c->qk_nope_dim, P = c->rope_dim, R = c->kv_lora_rank;
    size_t qk = (size_t)N + P, hd = (size_t)R + P;
    float *qf = scratch;                        /* (T, H*(N+P)) the heads' full queries */
    float *qa = qf + (size_t)T * H * qk;        /* (T, q_lora) the low-rank query */
    float *gin = qa + (size_t)T * c->q_lora_rank; /* (T, N) one head's q_nope */
    float *gout = gin + (size_t)T * N;          /* (T, R) its absorbed query */
    if (c->q_lora_rank) {
        ty__cpu_matmul(pool, &L->wq_a, xb, qa, T, tile, tile_floats);
        for (uint32_t t = 0; t < T; t++)
            ty__cpu_rmsnorm(qa + (size_t)t * c->q_lora_rank, qa + (size_t)t * c->q_lora_rank,
                            L->q_a_norm.data, c->q_lora_rank, c->rms_eps);
        ty__cpu_matmul(pool, &L->wq_b, qa, qf, T, tile, tile_floats);
    } else {
        ty__cpu_matmul(pool, &L->wq, xb, qf, T, tile, tile_floats);
    }
    for (uint32_t h = 0; h < H; h++) {
        if (L->wk_b.data) {
            struct ty_weight kb = head_view(&L->wk_b, (uint64_t)h * R, R);
            head_matmul(pool, &kb, qf + h * qk, H * qk, q + h * hd, H * hd, T, gin, gout, tile,
                        tile_floats);
        } else {
            for (uint32_t t = 0; t < T; t++)
                absorb_rows(&L->wkv_b, (uint64_t)h * (N + c->v_head_dim),
                            qf + (size_t)t * H * qk + h * qk, N, q + (size_t)t * H * hd + h * hd,
                            gout);
        }
        for (uint32_t t = 0; t < T; t++) {
            float *pe = q + (size_t)t * H * hd + h * hd + R;
            memcpy(pe, qf + (size_t)t * H * qk + h * qk + N, P * sizeof(float));
            ty__cpu_rope(pe, P, pos[t], m);
        }
    }
    ty__cpu_matmul(pool, &L->wkv_a, xb, kv, T, tile, tile_floats);
    for (uint32_t t = 0; t < T; t++) {
        float *row = kv + (size_t)t * hd;
        ty__cpu_rmsnorm(row, row, L->kv_a_norm.data, R, c->rms_eps);
        ty__cpu_rope(row + R, P, pos[t], m);
    }
}

void ty__cpu_mla_values(ty_cpu_pool_t *pool, const struct ty_model *m,
                        const struct ty_layer_weights *L, const float *att, uint32_t T,
                        float *out, float *scratch, float *tile, size_t tile_floats)
{
    const struct ty_model_config *c = &m->cfg;
    uint32_t H = c->n_heads, P = c->rope_dim, R = c->kv_lora_rank, V = c->v_head_dim;
    float *gin = scratch, *gout = scratch + (size_t)T * R; /* (T, R) (T, V) */
    for (uint32_t h = 0; h < H; h++) {
        uint64_t hf_first = (uint64_t)h * (c->qk_nope_dim + V) + c->qk_nope_dim;
        struct ty_weight vb = L->wv_b.data ? head_view(&L->wv_b, (uint64_t)h * V, V)
                                           : head_view(&L->wkv_b, hf_first, V);
        head_matmul(pool, &vb, att + (size_t)h * (R + P), (size_t)H * (R + P), out + h * V,
                    (size_t)H * V, T, gin, gout, tile, tile_floats);
    }
}

/* q . row for one pool row stored as two halves (K chunk: values 0..h-1, V chunk: h..2h-1). */
static float row_dot(int kvt, const float *q, const void *k, const void *v, size_t r, uint32_t h)
{
    if (kvt != TY_KV_F32)
        return ty__cpu_dot_kv16(kvt, q, (const uint16_t *)k + r * h, h) +
               ty__cpu_dot_kv16(kvt, q + h, (const uint16_t *)v + r * h, h);
    const float *a = (const float *)k + r * h, *b = (const float *)v + r * h;
    float d = 0;
    for (uint32_t i = 0; i < h; i++)
        d += q[i] * a[i];
    float e = 0;
    for (uint32_t i = 0; i < h; i++)
        e += q[h + i] * b[i];
    return d + e;
}

/* y += a * the first n values of a split row (n <= 2h). */
static void row_axpy(int kvt, float a, const void *k, const void *v, size_t r, uint32_t h,
                     uint32_t n, float *y)
{
    uint32_t nk = n < h ? n : h, nv = n - nk;
    if (kvt != TY_KV_F32) {
        ty__cpu_axpy_kv16(kvt, a, (const uint16_t *)k + r * h, y, nk);
        if (nv)
            ty__cpu_axpy_kv16(kvt, a, (const uint16_t *)v + r * h, y + h, nv);
        return;
    }
    const float *pk = (const float *)k + r * h, *pv = (const float *)v + r * h;
    for (uint32_t i = 0; i < nk; i++)
        y[i] += a * pk[i];
    for (uint32_t i = 0; i < nv; i++)
        y[h + i] += a * pv[i];
}

void ty__cpu_mla_attn_task(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    const struct ty__cpu_mla_attn *A = arg;
    const struct ty_model_config *c = &A->m->cfg;
    uint32_t h = c->head_dim, row = 2 * h, R = c->kv_lora_rank, B = A->B;
    float *sc = A->scores + (size_t)thread * A->max_ctx; /* (max_ctx) */
    for (uint32_t task = begin; task < end; task++) {
        uint32_t t = task / c->n_heads, hd = task % c->n_heads, n = A->pos[t] + 1;
        const uint32_t *pages = A->pages[t];
        const float *q = A->q + ((size_t)t * c->n_heads + hd) * row;
        float *out = A->att + ((size_t)t * c->n_heads + hd) * row;
        float mx = -INFINITY;
        for (uint32_t j = 0; j < n; j++) {
            uint32_t pg = pages[j / B];
            sc[j] = row_dot(A->kvt, q, ty_kvpool_k(A->kv, A->layer, pg),
                            ty_kvpool_v(A->kv, A->layer, pg), j % B, h) * c->kq_scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        double sum = 0;
        for (uint32_t j = 0; j < n; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float inv = (float)(1.0 / sum);
        memset(out, 0, row * sizeof(float));
        for (uint32_t j = 0; j < n; j++) {
            uint32_t pg = pages[j / B];
            row_axpy(A->kvt, sc[j] * inv, ty_kvpool_k(A->kv, A->layer, pg),
                     ty_kvpool_v(A->kv, A->layer, pg), j % B, h, R, out);
        }
    }
}
