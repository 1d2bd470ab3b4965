/* Backend interface table (ggml-backend-impl.h style) and the pieces the backends share. name,
 * free, forward and kv_dtypes are required; kv_storage (NULL: the pool uses host memory)
 * and healthy (NULL: always healthy) are optional; layer_ranges says forward runs pipeline
 * stages (a layer range with hidden states in and out, tycho/backend.h; false:
 * ty_backend_forward refuses them with TY_ENOTSUP before forward is called). */
#ifndef TYCHO_ENGINE_BACKEND_IMPL_H
#define TYCHO_ENGINE_BACKEND_IMPL_H

#include "tycho/backend.h"

struct ty_backend_i {
    const char *(*name)(const ty_backend_t *b);
    void (*free)(ty_backend_t *b);
    int (*forward)(ty_backend_t *b, const ty_model_t *m, ty_kvpool_t *pool,
                   const struct ty_batch *batch, float *logits);
    int (*kv_storage)(ty_backend_t *b, struct ty_kvpool_storage *out);
    bool (*healthy)(const ty_backend_t *b);
    uint32_t kv_dtypes; /* 1u << enum ty_kv_dtype for each KV page type forward reads */
    bool greedy_ids;    /* forward fills batch->ids itself (else ty_backend_forward does) */
    bool draws;         /* forward carries out batch->draws (else ty_backend_forward does,
                         * on the rows forward writes) */
    bool layer_ranges;
};

struct ty_sampler;

struct ty_backend {
    const struct ty_backend_i *iface;
    void *context;
    struct ty_sampler *draw_scratch; /* ty_backend_forward's draws on the host (made once) */
};

struct ty_weight;

/* Row `row` of weight `w` as w->cols f32 values in `out`, from any file type the engine loads
 * (F32, F16, BF16 and the block types of tycho/quant.h; zeros for others). The CPU
 * backend's reading (cpu/ops.c); the CUDA backend converts weights of another type than its
 * device type with it, so they read exactly as on the CPU. Thread-safe. */
void ty__cpu_row_to_f32(const struct ty_weight *w, uint64_t row, float *out);

#endif
