// The tensor-core prefill attention path (attn_prefill_tc.cu), private to attn_prefill.cu's
// launcher: the same contract as ty_cuda_attn_prefill for the shapes it accepts.
#ifndef TYCHO_ATTN_PREFILL_TC_CUH
#define TYCHO_ATTN_PREFILL_TC_CUH

#include "ty_kernels_impl.cuh"

// True for 16-bit pools (f16, bf16) with head_dim 64 or 128.
bool ty__attn_prefill_tc_applies(const ty_cuda_kv_layout *l, const ty_cuda_attn_shape *s);

// Enqueues the kernel; arguments already validated by ty_cuda_attn_prefill.
int ty__attn_prefill_tc(float *out, const float *q, const void *k_pool, const void *v_pool,
                        const ty_cuda_kv_layout *l, const ty_cuda_attn_shape *s,
                        const int32_t *block_tables, const int32_t *q_starts,
                        const int32_t *q_lens, const int32_t *kv_lens, int n_chunks,
                        int max_q_len, cudaStream_t st);

#endif
