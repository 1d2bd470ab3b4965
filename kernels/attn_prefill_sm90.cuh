// The Hopper prefill attention path (attn_prefill_sm90.cu), private to attn_prefill.cu's
// launcher: the same contract as ty_cuda_attn_prefill for the shapes it accepts. Compiled for
// sm_90a only (wgmma, TMA, setmaxnreg); on every other device the launcher never picks it.
#ifndef TYCHO_ATTN_PREFILL_SM90_CUH
#define TYCHO_ATTN_PREFILL_SM90_CUH

#include "ty_kernels_impl.cuh"

// True when the current device is compute capability 9.0, this binary holds the kernel's
// sm_90a code, the hook (attn_prefill_tune.h) has not turned it off, and the shape is one it
// handles (attn_sm90_tiling.h ty_sm90_shape_ok: 16-bit pools, head_dim 64/128, no window,
// page sizes that tile).
bool ty__attn_prefill_sm90_applies(const ty_cuda_kv_layout *l, const ty_cuda_attn_shape *s);

// Enqueues the kernel; arguments already validated by ty_cuda_attn_prefill.
int ty__attn_prefill_sm90(float *out, const float *q, const void *k_pool, const void *v_pool,
                          const ty_cuda_kv_layout *l, const ty_cuda_attn_shape *s,
                          const int32_t *block_tables, const int32_t *q_starts,
                          const int32_t *q_lens, const int32_t *kv_lens, int n_chunks,
                          int max_q_len, cudaStream_t st);

#endif
