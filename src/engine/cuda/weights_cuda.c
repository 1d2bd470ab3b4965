/* Device copies of a model's weights, made once per model: q|k|v and gate|up fused row-wise
 * (one GEMM each), mixture-of-experts routers and stacked experts, multi-head latent
 * attention's projections and DeepSeek's shared experts and routing bias, 16-bit or f32
 * matrices, f32 norms (q/k norms too), biases, gpt-oss's sinks, rope divisors and YaRN's
 * per-pair mix.
 * A matrix whose file type equals the device type is copied as is; any other is converted on
 * the host to f32 rows (the CPU backend's ty__cpu_row_to_f32, so Q8_0 and F16 read exactly
 * as on the CPU), staged through pinned memory and rounded to the device type on the device. */
#include "cuda-impl.h"

#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>

#define STAGE_FLOATS (4u << 20) /* 16 MiB of f32 rows per conversion chunk */

struct upload {
    struct cuda_ctx *c;
    float *stage_h; /* pinned (STAGE_FLOATS) */
    float *stage_d; /* device (STAGE_FLOATS) */
};

static bool same_type(uint32_t ggml, enum ty_cuda_dtype t)
{
    return (ggml == TY_GGML_F32 && t == TY_CUDA_F32) || (ggml == TY_GGML_F16 && t == TY_CUDA_F16) ||
           (ggml == TY_GGML_BF16 && t == TY_CUDA_BF16);
}

/* Converted path: rows to f32 on the host, chunk by chunk, then rounded on the device. */
static int upload_converted(struct upload *u, char *dst, enum ty_cuda_dtype t,
                            const struct ty_weight *w)
{
    struct cuda_ctx *c = u->c;
    uint64_t per = STAGE_FLOATS / w->cols;
    size_t es = ty_cuda_dtype_size(t);
    for (uint64_t r0 = 0; r0 < w->rows; r0 += per) {
        uint64_t nr = w->rows - r0 < per ? w->rows - r0 : per;
        for (uint64_t r = 0; r < nr; r++)
            ty__cpu_row_to_f32(w, r0 + r, u->stage_h + r * w->cols);
        size_t n = (size_t)(nr * w->cols);
        int rc = TY_CU(c, cudaMemcpyAsync(u->stage_d, u->stage_h, n * 4, cudaMemcpyHostToDevice,
                                          c->stream));
        if (!rc)
            rc = TY_KL(c, ty_cuda_convert(dst + r0 * w->cols * es, t, u->stage_d, TY_CUDA_F32, n,
                                          c->stream));
        if (!rc)
            rc = TY_CU(c, cudaStreamSynchronize(c->stream)); /* staging reused next */
        if (rc)
            return rc;
    }
    return 0;
}

/* Rows of `w` into matrix `m` starting at row `row0`. */
static int upload_rows(struct upload *u, struct cuda_mat *m, uint32_t row0,
                       const struct ty_weight *w)
{
    if (!w->data || w->cols != m->cols || row0 + w->rows > m->rows || w->cols > STAGE_FLOATS)
        return TY_EINVAL;
    size_t es = ty_cuda_dtype_size(m->type);
    char *dst = (char *)m->d + (size_t)row0 * m->cols * es;
    if (!same_type(w->type, m->type))
        return upload_converted(u, dst, m->type, w);
    return TY_CU(u->c, cudaMemcpyAsync(dst, w->data, (size_t)(w->rows * w->cols) * es,
                                       cudaMemcpyHostToDevice, u->c->stream));
}

static int mat_alloc_as(struct cuda_ctx *c, struct cuda_model *cm, struct cuda_mat *m,
                        uint32_t rows, uint32_t cols, enum ty_cuda_dtype type)
{
    m->type = type;
    m->rows = rows;
    m->cols = cols;
    size_t bytes = (size_t)rows * cols * ty_cuda_dtype_size(m->type);
    cm->bytes += bytes;
    return TY_CU(c, cudaMalloc(&m->d, bytes));
}

/* A matrix of the model's device weight type. */
static int mat_alloc(struct cuda_ctx *c, struct cuda_model *cm, struct cuda_mat *m,
                     uint32_t rows, uint32_t cols)
{
    return mat_alloc_as(c, cm, m, rows, cols, cm->wtype);
}

/* `n` f32 values (a norm or bias) to a new device array. */
static int vec_upload(struct cuda_ctx *c, struct cuda_model *cm, float **d, const void *src,
                      size_t n)
{
    cm->bytes += n * 4;
    int rc = TY_CU(c, cudaMalloc((void **)d, n * 4));
    return rc ? rc : TY_CU(c, cudaMemcpyAsync(*d, src, n * 4, cudaMemcpyHostToDevice, c->stream));
}

static int upload_biases(struct cuda_ctx *c, struct cuda_model *cm, struct cuda_layer *cl,
                         const struct ty_layer_weights *L, size_t nq, size_t nkv)
{
    if (!L->bq.data || !L->bk.data || !L->bv.data)
        return 0;
    float *h = malloc((nq + 2 * nkv) * 4);
    if (!h)
        return TY_ENOMEM;
    memcpy(h, L->bq.data, nq * 4);
    memcpy(h + nq, L->bk.data, nkv * 4);
    memcpy(h + nq + nkv, L->bv.data, nkv * 4);
    int rc = vec_upload(c, cm, &cl->bqkv, h, nq + 2 * nkv);
    if (!rc)
        rc = TY_CU(c, cudaStreamSynchronize(c->stream)); /* h is pageable and freed next */
    free(h);
    return rc;
}

/* The router (f32) and every expert's gate|up and down of a mixture-of-experts layer, each
 * expert's rows at its place in one stacked matrix (quantized experts dequantized like any
 * matrix); gpt-oss's router and expert biases, stacked the same way. */
static int upload_experts(struct upload *u, struct cuda_model *cm, struct cuda_layer *cl,
                          const struct ty_layer_weights *L)
{
    const struct ty_model_config *cfg = &cm->src->cfg;
    uint32_t D = cfg->dim, F = cfg->ffn_dim, E = cfg->n_experts;
    /* the router in f32 whatever the other weights are (as llama.cpp keeps it): routing
     * picks among near-equal logits, so they are computed as the CPU computes them */
    int rc = mat_alloc_as(u->c, cm, &cl->router, E, D, TY_CUDA_F32);
    if (!rc)
        rc = upload_rows(u, &cl->router, 0, &L->router);
    if (!rc)
        rc = mat_alloc(u->c, cm, &cl->exp_gu, E * 2 * F, D);
    if (!rc)
        rc = mat_alloc(u->c, cm, &cl->exp_down, E * D, F);
    for (uint32_t e = 0; e < E && !rc; e++) {
        if (!(rc = upload_rows(u, &cl->exp_gu, e * 2 * F, &L->exp_gate[e])) &&
            !(rc = upload_rows(u, &cl->exp_gu, e * 2 * F + F, &L->exp_up[e])))
            rc = upload_rows(u, &cl->exp_down, e * D, &L->exp_down[e]);
    }
    if (!rc && L->router_b.data)
        rc = vec_upload(u->c, cm, &cl->router_b, L->router_b.data, E);
    if (!rc && L->exp_b_down.data)
        rc = vec_upload(u->c, cm, &cl->exp_b_down, L->exp_b_down.data, (size_t)E * D);
    if (rc || !L->exp_b_gate.data || !L->exp_b_up.data)
        return rc;
    float *h = malloc((size_t)E * 2 * F * 4); /* gate and up bias rows, stacked as the rows */
    if (!h)
        return TY_ENOMEM;
    for (uint32_t e = 0; e < E; e++) {
        memcpy(h + (size_t)e * 2 * F, (const float *)L->exp_b_gate.data + (size_t)e * F, F * 4);
        memcpy(h + (size_t)e * 2 * F + F, (const float *)L->exp_b_up.data + (size_t)e * F, F * 4);
    }
    rc = vec_upload(u->c, cm, &cl->exp_b_gu, h, (size_t)E * 2 * F);
    if (!rc)
        rc = TY_CU(u->c, cudaStreamSynchronize(u->c->stream)); /* h is pageable, freed next */
    free(h);
    return rc;
}

/* A matrix of its own file shape (rows, cols). */
static int mat_upload(struct upload *u, struct cuda_model *cm, struct cuda_mat *m,
                      const struct ty_weight *w)
{
    int rc = mat_alloc(u->c, cm, m, (uint32_t)w->rows, (uint32_t)w->cols);
    return rc ? rc : upload_rows(u, m, 0, w);
}

/* gate and up (each (F, D)) stacked as one (2 F, D) matrix, and down (D, F). */
static int swiglu_upload(struct upload *u, struct cuda_model *cm, struct cuda_mat *gu,
                         struct cuda_mat *down, const struct ty_weight *gate,
                         const struct ty_weight *up, const struct ty_weight *w_down)
{
    uint32_t F = (uint32_t)gate->rows;
    int rc = mat_alloc(u->c, cm, gu, 2 * F, (uint32_t)gate->cols);
    if (!rc && !(rc = upload_rows(u, gu, 0, gate)))
        rc = upload_rows(u, gu, F, up);
    return rc ? rc : mat_upload(u, cm, down, w_down);
}

/* Multi-head latent attention's matrices and norms (the layout in cuda_layer). */
static int upload_mla(struct upload *u, struct cuda_model *cm, struct cuda_layer *cl,
                      const struct ty_layer_weights *L)
{
    const struct ty_model_config *cfg = &cm->src->cfg;
    int rc = 0;
    if (cfg->q_lora_rank && !(rc = mat_upload(u, cm, &cl->wq_a, &L->wq_a)) &&
        !(rc = vec_upload(u->c, cm, &cl->q_a_norm, L->q_a_norm.data, cfg->q_lora_rank)))
        rc = mat_upload(u, cm, &cl->wq_b, &L->wq_b);
    else if (!cfg->q_lora_rank)
        rc = mat_upload(u, cm, &cl->wq_b, &L->wq);
    if (!rc && !(rc = mat_upload(u, cm, &cl->wkv_a, &L->wkv_a)))
        rc = vec_upload(u->c, cm, &cl->kv_a_norm, L->kv_a_norm.data, cfg->kv_lora_rank);
    if (!rc && L->wkv_b.data)
        rc = mat_upload(u, cm, &cl->wkv_b, &L->wkv_b);
    else if (!rc && !(rc = mat_upload(u, cm, &cl->wk_b, &L->wk_b)))
        rc = mat_upload(u, cm, &cl->wv_b, &L->wv_b);
    return rc ? rc : mat_upload(u, cm, &cl->wo, &L->wo);
}

static int upload_layer(struct upload *u, struct cuda_model *cm, uint32_t l)
{
    const struct ty_model *m = cm->src;
    const struct ty_model_config *cfg = &m->cfg;
    const struct ty_layer_weights *L = &m->layers[l];
    struct cuda_layer *cl = &cm->layers[l];
    struct cuda_ctx *c = u->c;
    uint32_t D = cfg->dim;
    uint32_t nq = cfg->n_heads * cfg->head_dim, nkv = cfg->n_kv_heads * cfg->head_dim;
    bool experts = cfg->n_experts && l >= cfg->n_dense_lead; /* DeepSeek: dense lead layers */
    int rc = 0;
    if (cfg->kv_lora_rank) {
        rc = upload_mla(u, cm, cl, L);
    } else {
        rc = mat_alloc(c, cm, &cl->wqkv, nq + 2 * nkv, D);
        if (!rc && !(rc = upload_rows(u, &cl->wqkv, 0, &L->wq)) &&
            !(rc = upload_rows(u, &cl->wqkv, nq, &L->wk)))
            rc = upload_rows(u, &cl->wqkv, nq + nkv, &L->wv);
        if (!rc && !(rc = mat_alloc(c, cm, &cl->wo, D, nq)))
            rc = upload_rows(u, &cl->wo, 0, &L->wo);
    }
    if (!rc && experts)
        rc = upload_experts(u, cm, cl, L);
    else if (!rc)
        rc = swiglu_upload(u, cm, &cl->wgu, &cl->wdown, &L->w_gate, &L->w_up, &L->w_down);
    if (!rc && experts && L->exp_probs_b.data)
        rc = vec_upload(c, cm, &cl->exp_probs_b, L->exp_probs_b.data, cfg->n_experts);
    if (!rc && experts && L->sh_gate.data)
        rc = swiglu_upload(u, cm, &cl->sh_gu, &cl->sh_down, &L->sh_gate, &L->sh_up,
                           &L->sh_down);
    if (!rc)
        rc = vec_upload(c, cm, &cl->attn_norm, L->attn_norm.data, D);
    if (!rc)
        rc = vec_upload(c, cm, &cl->ffn_norm, L->ffn_norm.data, D);
    if (!rc)
        rc = upload_biases(c, cm, cl, L, nq, nkv);
    if (!rc && L->sinks.data) /* gpt-oss */
        rc = vec_upload(c, cm, &cl->sinks, L->sinks.data, cfg->n_heads);
    if (!rc && L->bo.data)
        rc = vec_upload(c, cm, &cl->bo, L->bo.data, D);
    if (!rc && L->q_norm.data && L->k_norm.data &&
        !(rc = vec_upload(c, cm, &cl->q_norm, L->q_norm.data, cfg->head_dim)))
        rc = vec_upload(c, cm, &cl->k_norm, L->k_norm.data, cfg->head_dim);
    return rc;
}

static enum ty_cuda_dtype auto_type(const struct cuda_ctx *c, const struct ty_model *m)
{
    if (c->have_forced)
        return c->forced;
    switch (m->cfg.weight_type) {
    case TY_GGML_F32: return TY_CUDA_F32;
    case TY_GGML_BF16: return TY_CUDA_BF16;
    default: return TY_CUDA_F16; /* F16, and Q8_0 dequantized */
    }
}

static int upload_model(struct upload *u, struct cuda_model *cm)
{
    const struct ty_model *m = cm->src;
    struct cuda_ctx *c = u->c;
    uint32_t D = m->cfg.dim, V = m->cfg.n_vocab;
    int rc = mat_alloc(c, cm, &cm->embd, V, D);
    if (!rc)
        rc = upload_rows(u, &cm->embd, 0, &m->tok_embd);
    if (!rc && m->output.data == m->tok_embd.data && m->output.type == m->tok_embd.type) {
        cm->output = cm->embd;
    } else if (!rc && !(rc = mat_alloc(c, cm, &cm->output, V, D))) {
        rc = upload_rows(u, &cm->output, 0, &m->output);
    }
    if (!rc)
        rc = vec_upload(c, cm, &cm->out_norm, m->out_norm.data, D);
    if (!rc)
        rc = vec_upload(c, cm, &cm->freq_div, m->rope_div, m->cfg.rope_dim / 2);
    if (!rc && m->rope_mix) /* YaRN: the table make_yarn computed for the CPU, as is */
        rc = vec_upload(c, cm, &cm->yarn_mix, m->rope_mix, m->cfg.rope_dim / 2);
    for (uint32_t l = 0; l < m->cfg.n_layers && !rc; l++)
        rc = upload_layer(u, cm, l);
    if (!rc)
        rc = TY_CU(c, cudaStreamSynchronize(c->stream));
    return rc;
}

static void mat_free(struct cuda_mat *m)
{
    if (m->d)
        TY_CU_QUIET(cudaFree(m->d));
    m->d = NULL;
}

void ty__cuda_model_free(struct cuda_ctx *c)
{
    struct cuda_model *cm = c->model;
    if (!cm)
        return;
    TY_CU_QUIET(cudaStreamSynchronize(c->stream));
    for (uint32_t l = 0; cm->layers && l < cm->src->cfg.n_layers; l++) {
        struct cuda_layer *cl = &cm->layers[l];
        mat_free(&cl->wqkv);
        mat_free(&cl->wo);
        mat_free(&cl->wgu);
        mat_free(&cl->wdown);
        mat_free(&cl->router);
        mat_free(&cl->exp_gu);
        mat_free(&cl->exp_down);
        struct cuda_mat *mla[] = {&cl->wq_a, &cl->wq_b,  &cl->wkv_a, &cl->wk_b,
                                  &cl->wv_b, &cl->wkv_b, &cl->sh_gu, &cl->sh_down};
        for (size_t i = 0; i < sizeof(mla) / sizeof(mla[0]); i++)
            mat_free(mla[i]);
        float *v[] = {cl->attn_norm, cl->ffn_norm,  cl->bqkv,      cl->q_norm,
                      cl->k_norm,    cl->sinks,     cl->bo,        cl->router_b,
                      cl->exp_b_gu,  cl->exp_b_down, cl->q_a_norm, cl->kv_a_norm,
                      cl->exp_probs_b};
        for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
            if (v[i])
                TY_CU_QUIET(cudaFree(v[i]));
    }
    if (cm->output.d != cm->embd.d)
        mat_free(&cm->output);
    mat_free(&cm->embd);
    if (cm->out_norm)
        TY_CU_QUIET(cudaFree(cm->out_norm));
    if (cm->freq_div)
        TY_CU_QUIET(cudaFree(cm->freq_div));
    if (cm->yarn_mix)
        TY_CU_QUIET(cudaFree(cm->yarn_mix));
    free(cm->layers);
    free(cm);
    c->model = NULL;
    c->buf.cap_t = 0; /* sized for this model's dims: reallocated for the next one */
    ty__cuda_graphs_reset(c);
}

int ty__cuda_model_use(struct cuda_ctx *c, const struct ty_model *m)
{
    if (c->model && c->model->src == m)
        return 0;
    uint32_t R = m->cfg.kv_lora_rank, RP = R + m->cfg.rope_dim;
    if (R && (R % 4 || (RP / 2) % 4 || RP > 1024)) { /* mla.cu's 16-byte row loads */
        TY_LOG_ERROR("cuda", "%s: MLA latent rank %u + rope %u not supported by the CUDA "
                     "kernels (the rank and half the row must be multiples of 4, the row at most "
                     "1024)", c->name, R, m->cfg.rope_dim);
        return TY_ENOTSUP;
    }
    ty__cuda_model_free(c);
    struct cuda_model *cm = calloc(1, sizeof(*cm));
    struct upload u = {.c = c};
    if (!cm || !(cm->layers = calloc(m->cfg.n_layers, sizeof(*cm->layers)))) {
        free(cm);
        return TY_ENOMEM;
    }
    cm->src = m;
    cm->wtype = auto_type(c, m);
    c->model = cm;
    int rc = TY_CU(c, cudaMallocHost((void **)&u.stage_h, STAGE_FLOATS * 4));
    if (!rc)
        rc = TY_CU(c, cudaMalloc((void **)&u.stage_d, STAGE_FLOATS * 4));
    if (!rc)
        rc = upload_model(&u, cm);
    if (u.stage_h)
        TY_CU_QUIET(cudaFreeHost(u.stage_h));
    if (u.stage_d)
        TY_CU_QUIET(cudaFree(u.stage_d));
    if (rc) {
        ty__cuda_model_free(c);
        return rc;
    }
    TY_LOG_INFO("cuda", "%s: %s uploaded, %.1f MiB of %s weights", c->name, m->desc,
                cm->bytes / 1048576.0, cm->wtype == TY_CUDA_F32   ? "f32"
                                       : cm->wtype == TY_CUDA_F16 ? "f16"
                                                                  : "bf16");
    return 0;
}
