/* CUDA backend internals (src/engine/cuda/): the backend context, device copies of a model's
 * weights, per-forward device buffers, and the check macro every CUDA/cuBLAS call goes through.
 *
 * Threads: like every backend, one thread at a time (the engine's); all device work is
 * enqueued on the context's single stream. Ownership: the context owns the stream, the cuBLAS
 * handle, the device weights of the model it last ran, its buffers, pinned staging and graphs.
 */
#ifndef TYCHO_ENGINE_CUDA_IMPL_H
#define TYCHO_ENGINE_CUDA_IMPL_H

#include "backend-impl.h"
#include "model-impl.h"
#include "ty_kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cuda_ctx;

/* Checks a cudaError_t: 0, or TY_ECUDA after logging call, error and file:line and marking the
 * backend unhealthy (sticky) unless the error is a plain allocation failure (TY_ENOMEM). */
#define TY_CU(c, call) ty__cuda_check((c), (call), #call, __FILE__, __LINE__)
/* For clean-up calls (frees, destroys) whose failure changes nothing for the caller: a failure
 * is logged as a warning and cleared, so that the next kernel launch check reports its own
 * error, not this one's (cudaGetLastError returns the last error of any runtime call). */
#define TY_CU_QUIET(call) ty__cuda_quiet((call), #call, __FILE__, __LINE__)
/* Checks a cublasStatus_t the same way. */
#define TY_CUBLAS(c, call) ty__cublas_check((c), (call), #call, __FILE__, __LINE__)
/* Checks a kernel launcher's return code: TY_ECUDA marks the backend unhealthy. */
#define TY_KL(c, call) ty__cuda_kernel_check((c), (call), #call, __FILE__, __LINE__)

int ty__cuda_check(struct cuda_ctx *c, cudaError_t e, const char *call, const char *file,
                   int line);
void ty__cuda_quiet(cudaError_t e, const char *call, const char *file, int line);
int ty__cublas_check(struct cuda_ctx *c, cublasStatus_t s, const char *call, const char *file,
                     int line);
int ty__cuda_kernel_check(struct cuda_ctx *c, int rc, const char *call, const char *file,
                          int line);

/* A (rows, cols) row-major matrix on the device. */
struct cuda_mat {
    void *d;
    enum ty_cuda_dtype type;
    uint32_t rows, cols;
};

struct cuda_layer {
    struct cuda_mat wqkv; /* (Q + 2 KV, D): wq | wk | wv rows */
    struct cuda_mat wo;   /* (D, Q) */
    struct cuda_mat wgu;  /* (2 F, D): w_gate | w_up rows (not in a mixture of experts) */
    struct cuda_mat wdown; /* (D, F) (not in a mixture of experts) */
    /* mixture of experts (cfg.n_experts E): the router and every expert's matrices stacked */
    struct cuda_mat router; /* (E, D) */
    struct cuda_mat exp_gu; /* (E * 2 F, D): expert e's gate rows then its up rows */
    struct cuda_mat exp_down; /* (E * D, F) */
    /* gpt-oss (NULL elsewhere): attention sinks (n_heads), the o-projection's bias (D), the
     * router's (E), the experts' gate|up (E, 2 F: gate then up per expert) and down (E, D) */
    float *sinks, *bo, *router_b, *exp_b_gu, *exp_b_down;
    float *attn_norm, *ffn_norm; /* (D) */
    float *bqkv;                 /* (Q + 2 KV) or NULL */
    float *q_norm, *k_norm;      /* (head_dim) each, or NULL (Qwen3's per-head q/k norm) */
    /* DeepSeek-V2/V3 (MLA: wqkv unused; wo (D, H V)): the low-rank query wq_a (q_lora, D) and
     * its norm, then wq_b (H (N + P), q_lora), or without q_lora the query projection alone
     * in wq_b (H (N + P), D); the latent + rope key wkv_a (R + P, D) and the latent's norm (R);
     * per head k_b and v_b, GGUF's wk_b (H R, N) and wv_b (H V, R), or HF's kv_b (H (N + V), R)
     * in wkv_b alone */
    struct cuda_mat wq_a, wq_b, wkv_a, wk_b, wv_b, wkv_b;
    float *q_a_norm, *kv_a_norm;
    /* DeepSeek's routing bias (E) and shared expert (2 S, D) gate|up, (D, S); dense lead
     * layers use wgu / wdown with their own width */
    float *exp_probs_b;
    struct cuda_mat sh_gu, sh_down;
};

/* Device copy of one model (uploaded once, reused while the backend runs that model). */
struct cuda_model {
    const struct ty_model *src;
    enum ty_cuda_dtype wtype;
    struct cuda_mat embd, output; /* output.d == embd.d when tied */
    float *out_norm;              /* (D) */
    float *freq_div;              /* (head_dim / 2) */
    float *yarn_mix;              /* (head_dim / 2): the host's m->rope_mix, or NULL */
    struct cuda_layer *layers; /* (src->cfg.n_layers) */
    size_t bytes; /* device bytes of weights */
};

/* Device activation buffers for up to cap_t tokens of the current model. */
struct cuda_bufs {
    uint32_t cap_t;
    float *x, *xb, *qkv, *q, *att, *gu, *hb, *xg, *logits;
    /* MLA: qkv holds the heads' full queries (cap_t, H (N + P)), then the low-rank query
     * (cap_t, q_lora), then wkv_a's rows (cap_t, R + P); q the absorbed queries (cap_t, H (R +
     * P)); att the latent outputs (cap_t, H R), then at att + cap_t H R the values (cap_t, H V) */
    /* gu and hb hold n_used rows per token in a mixture of experts; then also: */
    float *ys;     /* (cap_t * n_used, D) each (token, slot)'s expert output */
    float *rlog;   /* (cap_t, E) router logits, then their softmax */
    float *rw;     /* (cap_t, n_used) routing weights */
    int32_t *re;   /* (cap_t, n_used) picked experts */
    /* prefill's grouped experts: (2, cap_t * n_used) device / (3, cap_t * n_used) pinned:
     * each grouped row's token, each slot's grouped row (and the picks, downloaded) */
    int32_t *grp_d, *grp_h;
    void *xh; /* 16-bit copy of a GEMM input (NULL for f32 weights) */
};

#define TY_CUDA_MAX_GRAPHS 16

struct cuda_graph {
    bool used;
    uint64_t key, last_use;
    cudaGraphExec_t exec;
};

struct cuda_ctx {
    int device;
    char name[24];
    bool have_forced;
    enum ty_cuda_dtype forced; /* weight type from the options */
    bool graphs;               /* capture all-decode steps */
    bool failed;               /* sticky: a device error was seen */
    bool capturing;            /* inside a graph capture: errors do not set `failed` */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    struct cuda_model *model;
    struct cuda_bufs buf;
    int32_t *meta_h, *meta_d; /* pinned host / device copies of per-forward ints */
    size_t meta_cap;          /* int32 elements */
    float *logits_h;          /* pinned */
    size_t logits_cap;        /* floats */
    int32_t *ids_d, *ids_h;   /* greedy picks (struct ty_batch.ids): device / pinned */
    size_t ids_cap;           /* entries */
    void *draw_h, *draw_d;    /* draws (struct ty_batch.draws): rows and adjustments up, the
                               * results down; pinned / device */
    size_t draw_cap;          /* bytes */
    void *ws;                 /* decode attention workspace */
    size_t ws_cap;
    struct cuda_graph graph[TY_CUDA_MAX_GRAPHS];
    uint64_t graph_clock;
    uint64_t n_graph_launches, n_graph_captures; /* for tests and logs */
};


/* Upload `m` (freeing a previous model's copy) unless it is already resident. */
int ty__cuda_model_use(struct cuda_ctx *c, const struct ty_model *m);
void ty__cuda_model_free(struct cuda_ctx *c);

/* Grows device memory *p to at least `bytes` (contents are lost); resets graphs when it moves. */
int ty__cuda_grow(struct cuda_ctx *c, void **p, size_t *cap, size_t bytes);
/* Drops every captured graph (buffers moved or the model changed). */
void ty__cuda_graphs_reset(struct cuda_ctx *c);

int ty__cuda_forward(ty_backend_t *b, const ty_model_t *m, ty_kvpool_t *pool,
                     const struct ty_batch *batch, float *logits);

#endif
