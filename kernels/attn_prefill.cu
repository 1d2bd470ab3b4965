// Causal prefill attention over paged KV with FlashAttention-2's loop order (Dao 2023, §3.1):
// a block owns kRows query rows of one head, walks the key positions they can see in tiles that
// never cross a page, and keeps per-row running max m, sum l and an unnormalized output that is
// rescaled by exp(m_old - m_new) whenever the max grows; the division by l happens once at the
// end. This is the general path (any head_dim multiple of 4 up to 256, f32/f16/bf16 pools,
// f32 math on CUDA cores). 16-bit pools with head_dim 64 or 128 take the tensor-core path in
// attn_prefill_tc.cu instead.
#include "attn_common.cuh"
#include "attn_prefill_sm90.cuh"
#include "attn_prefill_tc.cuh"

#include <math.h>

namespace {

constexpr int kThreads = 128;
constexpr int kRows = 32;   // query rows per block; 4 threads per row
constexpr int kTile = 32;   // key tokens per tile
constexpr int kChunks = 16; // float4 chunks of head_dim per thread: head_dim <= 4 * 4 * 16

struct prefill_args {
    float *out;
    const float *q;
    const int32_t *tables, *q_starts, *q_lens, *kv_lens;
    int n_heads, n_kv, hd, page_tokens, max_pages, window;
    float scale;
};

size_t prefill_smem(int hd)
{
    return sizeof(float) * (2 * kRows * (hd + 4) + kTile * hd + kRows * (kTile + 1));
}

// Scores of row r against the tile (columns sub, sub+4, ...), masked causally and to the
// sliding window (window 0: none; llama.cpp masks qpos - key >= window), and the
// online-softmax update of the row's m and l; leaves p in ps and returns alpha.
__device__ float row_scores(const float *qs, const float *ks, float *ps, int hd, int r, int sub,
                            int n, int p0, int qpos, int window, bool valid, float &m, float &l)
{
    const int ld = hd + 4;
    float sc[kTile / 4];
    float tmax = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile / 4; j++) {
        const int c = sub + 4 * j;
        float acc = -INFINITY;
        if (valid && c < n && p0 + c <= qpos && (window == 0 || qpos - (p0 + c) < window)) {
            acc = 0.0f;
            for (int d = 0; d < hd; d += 4)
                acc += ty::dot4(*(const float4 *)(qs + r * ld + d),
                                *(const float4 *)(ks + c * ld + d));
        }
        sc[j] = acc;
        tmax = fmaxf(tmax, acc);
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
    const float m_new = fmaxf(m, tmax);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kTile / 4; j++) {
        const float p = m_new == -INFINITY ? 0.0f : expf(sc[j] - m_new);
        ps[r * (kTile + 1) + sub + 4 * j] = p;
        sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
    l = l * alpha + sum;
    m = m_new;
    return alpha;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    prefill_kernel(prefill_args a, const T *__restrict__ k_pool, const T *__restrict__ v_pool)
{
    extern __shared__ float4 smem4[];
    const int hd = a.hd, ld = hd + 4, h = blockIdx.y, chunk = blockIdx.z;
    const int q_len = a.q_lens[chunk], kv_len = a.kv_lens[chunk];
    const int i0 = blockIdx.x * kRows;
    if (i0 >= q_len)
        return;
    const int kh = h / (a.n_heads / a.n_kv);
    const int32_t *table = a.tables + (size_t)chunk * a.max_pages;
    float *qs = (float *)smem4, *ks = qs + kRows * ld, *vs = ks + kTile * ld;
    float *ps = vs + kTile * hd;
    const size_t row0 = (size_t)a.q_starts[chunk] + i0;
    const int rows = min(kRows, q_len - i0);
    for (int i = threadIdx.x; i < rows * (hd / 4); i += kThreads) {
        const int r = i / (hd / 4), c = 4 * (i % (hd / 4));
        float4 v = *(const float4 *)(a.q + ((row0 + r) * a.n_heads + h) * hd + c);
        *(float4 *)(qs + r * ld + c) =
            make_float4(v.x * a.scale, v.y * a.scale, v.z * a.scale, v.w * a.scale);
    }
    const int r = threadIdx.x >> 2, sub = threadIdx.x & 3;
    const bool valid = r < rows;
    const int first_pos = kv_len - q_len;
    const int qpos = first_pos + i0 + r;
    const int kv_end = min(kv_len, first_pos + i0 + rows);
    float m = -INFINITY, l = 0.0f;
    float4 acc[kChunks];
#pragma unroll
    for (int j = 0; j < kChunks; j++)
        acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    // keys before the window of the block's first row are masked for all its rows
    for (int p0 = ty::window_first(first_pos + i0 + 1, a.window); p0 < kv_end;) {
        const int n = min(min(kTile, a.page_tokens - p0 % a.page_tokens), kv_end - p0);
        __syncthreads();
        ty::load_tile(ks, ld, ty::kv_row(k_pool, table, p0, kh, a.n_kv, a.page_tokens, hd), n, hd);
        ty::load_tile(vs, hd, ty::kv_row(v_pool, table, p0, kh, a.n_kv, a.page_tokens, hd), n, hd);
        __syncthreads();
        const float alpha = row_scores(qs, ks, ps, hd, r, sub, n, p0, qpos, a.window, valid, m, l);
        __syncwarp();
#pragma unroll
        for (int j = 0; j < kChunks; j++) {
            const int d = 4 * (sub + 4 * j);
            if (d < hd) {
                float4 o = acc[j];
                o.x *= alpha, o.y *= alpha, o.z *= alpha, o.w *= alpha;
                for (int t = 0; t < n; t++) {
                    const float p = ps[r * (kTile + 1) + t];
                    const float4 v = *(const float4 *)(vs + t * hd + d);
                    o.x += p * v.x, o.y += p * v.y, o.z += p * v.z, o.w += p * v.w;
                }
                acc[j] = o;
            }
        }
        p0 += n;
    }
    if (!valid)
        return;
    float *o = a.out + ((row0 + r) * a.n_heads + h) * hd;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; j++) {
        const int d = 4 * (sub + 4 * j);
        if (d < hd)
            *(float4 *)(o + d) =
                make_float4(acc[j].x * inv, acc[j].y * inv, acc[j].z * inv, acc[j].w * inv);
    }
}

template <typename T>
int prefill_launch(const prefill_args &a, const void *k_pool, const void *v_pool, int n_chunks,
                   int max_q_len, cudaStream_t st)
{
    const size_t smem = prefill_smem(a.hd);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(prefill_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem) != cudaSuccess)
        return TY_CUDA_LAUNCH_CHECK("attn_prefill smem attribute");
    dim3 grid((max_q_len + kRows - 1) / kRows, a.n_heads, n_chunks);
    prefill_kernel<T><<<grid, kThreads, smem, st>>>(a, (const T *)k_pool, (const T *)v_pool);
    return TY_CUDA_LAUNCH_CHECK("attn_prefill");
}

} // namespace

extern "C" int ty_cuda_attn_prefill(float *out, const float *q, const void *k_pool,
                                    const void *v_pool, const struct ty_cuda_kv_layout *l,
                                    const struct ty_cuda_attn_shape *s,
                                    const int32_t *block_tables, const int32_t *q_starts,
                                    const int32_t *q_lens, const int32_t *kv_lens, int n_chunks,
                                    int max_q_len, ty_cuda_stream_t stream)
{
    int rc = ty__attn_check(l, s);
    if (rc || n_chunks < 0 || max_q_len < 0)
        return rc ? rc : TY_EINVAL;
    if (n_chunks == 0 || max_q_len == 0)
        return 0;
    cudaStream_t st = (cudaStream_t)stream;
    if (ty__attn_prefill_sm90_applies(l, s)) // Hopper: wgmma + TMA, when built for sm_90a
        return ty__attn_prefill_sm90(out, q, k_pool, v_pool, l, s, block_tables, q_starts,
                                     q_lens, kv_lens, n_chunks, max_q_len, st);
    if (s->window == 0 && ty__attn_prefill_tc_applies(l, s)) // no window in the TC path yet
        return ty__attn_prefill_tc(out, q, k_pool, v_pool, l, s, block_tables, q_starts, q_lens,
                                   kv_lens, n_chunks, max_q_len, st);
    prefill_args a;
    a.out = out;
    a.q = q;
    a.tables = block_tables;
    a.q_starts = q_starts;
    a.q_lens = q_lens;
    a.kv_lens = kv_lens;
    a.n_heads = s->n_heads;
    a.n_kv = s->n_kv_heads;
    a.hd = s->head_dim;
    a.page_tokens = l->page_tokens;
    a.max_pages = s->max_pages;
    a.window = s->window;
    a.scale = s->scale;
    return TY_DTYPE_DISPATCH(l->type, prefill_launch, a, k_pool, v_pool, n_chunks, max_q_len, st);
}
