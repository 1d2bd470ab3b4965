// Private helpers of the two attention kernels: vector loads of 4 KV elements as f32, the walk
// over a sequence's paged K/V in tiles that never cross a page, and shape validation.
#ifndef TYCHO_ATTN_COMMON_CUH
#define TYCHO_ATTN_COMMON_CUH

#include "ty_kernels_impl.cuh"

namespace ty {

// 4 consecutive elements, 4-element aligned, widened to f32.
__device__ __forceinline__ float4 load4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float4 load4(const __half *p)
{
    uint2 u = *(const uint2 *)p;
    float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 load4(const __nv_bfloat16 *p)
{
    uint2 u = *(const uint2 *)p;
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x);
    float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

__device__ __forceinline__ float dot4(float4 a, float4 b)
{
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// Copies n tokens x hd elements of one (page, kv head) run, contiguous in the pool, into a
// shared f32 tile with row stride ld. All threads of the block take part.
template <typename T>
__device__ __forceinline__ void load_tile(float *dst, int ld, const T *src, int n, int hd)
{
    const int per_row = hd / 4, total = n * per_row;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int t = i / per_row, c = i % per_row;
        *(float4 *)(dst + t * ld + 4 * c) = load4(src + (size_t)t * hd + 4 * c);
    }
}

// First key position of a sliding window of `window` tokens (0 = none) whose last query is at
// position len - 1: keys before it are masked for that query and every earlier one.
__device__ __forceinline__ int window_first(int len, int window)
{
    return window > 0 && len > window ? len - window : 0;
}

// Start of token `pos`'s row for kv head kh in a pool array.
template <typename T>
__device__ __forceinline__ const T *kv_row(const T *pool, const int32_t *table, int pos, int kh,
                                           int n_kv, int page_tokens, int hd)
{
    const int page = table[pos / page_tokens], off = pos % page_tokens;
    return pool + (((size_t)page * n_kv + kh) * page_tokens + off) * hd;
}

// The block table of row `row` of a forward's q block (ty_cuda_attn_rows): decode rows first,
// then the prefill chunk whose rows hold it.
__device__ __forceinline__ const int32_t *row_table(const ty_cuda_attn_rows &r, int row)
{
    if (row < r.n_decode)
        return r.decode_tables + (size_t)row * r.decode_max_pages;
    int c = 0;
    while (c + 1 < r.n_chunks && row >= r.chunk_q_starts[c + 1])
        c++;
    return r.chunk_tables + (size_t)c * r.chunk_max_pages;
}

} // namespace ty

static inline int ty__attn_check(const ty_cuda_kv_layout *l, const ty_cuda_attn_shape *s)
{
    if (!l || !s || s->n_heads <= 0 || s->n_kv_heads <= 0 || s->n_heads % s->n_kv_heads)
        return TY_EINVAL;
    if (s->head_dim <= 0 || s->head_dim > 256 || s->head_dim % 4 || s->max_pages <= 0 ||
        s->window < 0)
        return TY_EINVAL;
    if (l->n_kv_heads != s->n_kv_heads || l->head_dim != s->head_dim || l->page_tokens <= 0)
        return TY_EINVAL;
    return ty_cuda_dtype_size(l->type) ? 0 : TY_EINVAL;
}

#endif
