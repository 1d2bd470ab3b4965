// Causal prefill attention on tensor cores, for 16-bit pools (f16, bf16) and head_dim 64 or 128:
// the FlashAttention-2 forward (Dao 2023, Algorithm 1 with the §3.1 loop order) over paged K/V.
//
// A block of kWarps warps owns kBr = 16 * kWarps query rows of one head; each warp owns 16 rows
// and keeps them in registers for the whole walk: its Q fragments, its running max m and sum l
// and its output accumulator O (16 x HD f32). K/V tiles of kBc tokens are copied from the pool
// into shared memory with cp.async, one token row at a time through the block table (so tiles
// need not match pages), two stages deep: the next tile's copies are in flight while the
// current one is computed. S = Q K^T and O += P V run on mma.sync m16n8k16 (16-bit operands,
// f32 accumulation); P goes from the S accumulators to the PV operand registers without
// touching shared memory (the C fragment of two adjacent n-tiles is the A fragment of one
// k-step). The softmax runs in the exp2 domain with scale * log2(e) folded into the scores.
//
// Precision: Q and P are rounded to the pool's 16-bit type before the products (as
// FlashAttention does); K and V already are. Everything else is f32.
#include "attn_prefill_tc.cuh"

#include <math.h>
#include <stdint.h>

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBr = 16 * kWarps; // query rows per block
constexpr int kBc = 64;          // key tokens per tile
constexpr int kPad = 8;          // elements of row padding: rows 16 bytes apart mod 128

template <int HD> constexpr int ld() { return HD + kPad; }

template <int HD> constexpr size_t tc_smem_bytes()
{
    return sizeof(uint16_t) * (size_t)ld<HD>() * (kBr + 4 * kBc); // Q, 2 x K, 2 x V
}

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// 16 bytes global -> shared; src_bytes 0 fills the destination with zeros (src still must be a
// valid address).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// d += a * b for one m16n8k16 tile; T selects the 16-bit operand type.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as one register of two 16-bit values, the first in the low half.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}

struct tc_args {
    float *out;
    const float *q;
    const void *k_pool, *v_pool;
    const int32_t *tables, *q_starts, *q_lens, *kv_lens;
    int n_heads, n_kv, page_tokens, max_pages;
    float scale_log2; // softmax scale * log2(e)
};

// Issues the cp.async copies of tokens [p0, p0 + kBc) of one KV head into a shared tile;
// tokens at or past kv_end are zero-filled (their table entries are never read).
template <typename T, int HD>
__device__ __forceinline__ void load_kv_tile(T *dst, const T *pool, const int32_t *table, int p0,
                                             int kv_end, int kh, int n_kv, int page_tokens)
{
    constexpr int kChunks = HD / 8; // 16-byte chunks per token row
#pragma unroll
    for (int i = 0; i < kBc * kChunks / kThreads; i++) {
        const int c = threadIdx.x + i * kThreads;
        const int t = c / kChunks, ch = c % kChunks, pos = p0 + t;
        const T *src = pool;
        int bytes = 0;
        if (pos < kv_end) {
            const int page = table[pos / page_tokens], slot = pos % page_tokens;
            src = pool + (((size_t)page * n_kv + kh) * page_tokens + slot) * HD + ch * 8;
            bytes = 16;
        }
        cp_async16(dst + t * ld<HD>() + ch * 8, src, bytes);
    }
}

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads, 2) prefill_tc_kernel(tc_args a)
{
    extern __shared__ float4 smem4[];
    T *sq = (T *)smem4;
    T *sk = sq + kBr * ld<HD>(); // 2 stages
    T *sv = sk + 2 * kBc * ld<HD>();
    const int h = blockIdx.y, chunk = blockIdx.z;
    const int q_len = a.q_lens[chunk], kv_len = a.kv_lens[chunk];
    // The longest row tiles (the last ones: causal) start first.
    const int i0 = (gridDim.x - 1 - blockIdx.x) * kBr;
    if (i0 >= q_len)
        return;
    const int kh = h / (a.n_heads / a.n_kv);
    const int32_t *table = a.tables + (size_t)chunk * a.max_pages;
    const T *kp = (const T *)a.k_pool, *vp = (const T *)a.v_pool;
    const int rows = min(kBr, q_len - i0);
    const int first_pos = kv_len - q_len;                   // position of query row 0
    const int kv_end = min(kv_len, first_pos + i0 + rows); // keys any row of the block sees
    const int n_tiles = (kv_end + kBc - 1) / kBc;
    const size_t row0 = (size_t)a.q_starts[chunk] + i0;

    load_kv_tile<T, HD>(sk, kp, table, 0, kv_end, kh, a.n_kv, a.page_tokens);
    cp_commit();
    load_kv_tile<T, HD>(sv, vp, table, 0, kv_end, kh, a.n_kv, a.page_tokens);
    cp_commit();

    // Q rows (f32 in global) -> 16-bit shared tile; rows past the chunk are zeros.
    for (int i = threadIdx.x; i < kBr * (HD / 4); i += kThreads) {
        const int r = i / (HD / 4), c = 4 * (i % (HD / 4));
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < rows)
            v = *(const float4 *)(a.q + ((row0 + r) * a.n_heads + h) * HD + c);
        uint2 u = make_uint2(pack2<T>(v.x, v.y), pack2<T>(v.z, v.w));
        *(uint2 *)(sq + r * ld<HD>() + c) = u;
    }
    __syncthreads();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tq = lane & 3; // fragment row (and row + 8), column pair
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        ldsm_x4(qf[kk], sq + (warp * 16 + (lane & 15)) * ld<HD>() + kk * 16 + (lane >> 4) * 8);

    // This thread's two rows: positions for the causal mask.
    const int qpos0 = first_pos + i0 + warp * 16 + g, qpos1 = qpos0 + 8;
    const int warp_min_pos = first_pos + i0 + warp * 16;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    for (int t = 0; t < n_tiles; t++) {
        const int p0 = t * kBc, st = t & 1;
        const T *k_s = sk + st * kBc * ld<HD>(), *v_s = sv + st * kBc * ld<HD>();
        const bool more = t + 1 < n_tiles;
        if (more) { // stage st^1 was last read in iteration t - 1, which ended with a barrier
            load_kv_tile<T, HD>(sk + (st ^ 1) * kBc * ld<HD>(), kp, table, p0 + kBc, kv_end, kh,
                                a.n_kv, a.page_tokens);
            cp_commit();
            load_kv_tile<T, HD>(sv + (st ^ 1) * kBc * ld<HD>(), vp, table, p0 + kBc, kv_end, kh,
                                a.n_kv, a.page_tokens);
            cp_commit();
            cp_wait<3>(); // K of tile t has landed (V of t and tile t + 1 may still fly)
        } else {
            cp_wait<1>();
        }
        __syncthreads();

        // S = Q K^T: 16 rows x kBc keys per warp, as kBc / 8 n-tiles.
        float s[kBc / 8][4];
#pragma unroll
        for (int j = 0; j < kBc / 8; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
            for (int j = 0; j < kBc / 16; j++) { // two n-tiles per ldmatrix.x4
                uint32_t b[4];
                ldsm_x4(b, k_s + (j * 16 + (lane & 7) + (lane >> 4) * 8) * ld<HD>() + kk * 16 +
                               ((lane >> 3) & 1) * 8);
                mma16816<T>(s[2 * j], qf[kk], b[0], b[1]);
                mma16816<T>(s[2 * j + 1], qf[kk], b[2], b[3]);
            }
        }

        // Mask: keys past the row's position (causal) or past kv_end; only tiles that reach
        // past this warp's first row need it.
        if (p0 + kBc - 1 > warp_min_pos || p0 + kBc > kv_end) {
#pragma unroll
            for (int j = 0; j < kBc / 8; j++) {
                const int c = p0 + j * 8 + 2 * tq;
                if (c > qpos0 || c >= kv_end) s[j][0] = -INFINITY;
                if (c + 1 > qpos0 || c + 1 >= kv_end) s[j][1] = -INFINITY;
                if (c > qpos1 || c >= kv_end) s[j][2] = -INFINITY;
                if (c + 1 > qpos1 || c + 1 >= kv_end) s[j][3] = -INFINITY;
            }
        }

        // Online softmax for rows g (0) and g + 8 (1); the 4 lanes of a row share its max.
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < kBc / 8; j++) {
            s[j][0] *= a.scale_log2, s[j][1] *= a.scale_log2;
            s[j][2] *= a.scale_log2, s[j][3] *= a.scale_log2;
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        // A row with nothing visible yet keeps m = -inf; subtract 0 instead so that no NaN
        // appears (its p are all exp2(-inf) = 0).
        const float sub0 = mn0 == -INFINITY ? 0.0f : mn0, sub1 = mn1 == -INFINITY ? 0.0f : mn1;
        const float al0 = exp2f(m0 - sub0), al1 = exp2f(m1 - sub1);
        m0 = mn0, m1 = mn1;
        float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
        for (int j = 0; j < kBc / 8; j++) {
            s[j][0] = exp2f(s[j][0] - sub0), s[j][1] = exp2f(s[j][1] - sub0);
            s[j][2] = exp2f(s[j][2] - sub1), s[j][3] = exp2f(s[j][3] - sub1);
            rs0 += s[j][0] + s[j][1];
            rs1 += s[j][2] + s[j][3];
        }
        l0 = l0 * al0 + rs0, l1 = l1 * al1 + rs1;
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            o[j][0] *= al0, o[j][1] *= al0, o[j][2] *= al1, o[j][3] *= al1;

        if (more)
            cp_wait<2>(); // V of tile t
        else
            cp_wait<0>();
        __syncthreads();

        // O += P V: k-steps of 16 keys; P's A fragment comes from S n-tiles 2kk and 2kk + 1.
#pragma unroll
        for (int kk = 0; kk < kBc / 16; kk++) {
            uint32_t pa[4];
            pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int j = 0; j < HD / 16; j++) { // two n-tiles of head_dim per ldmatrix.x4
                uint32_t b[4];
                ldsm_x4_t(b, v_s + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld<HD>() +
                                 j * 16 + (lane >> 4) * 8);
                mma16816<T>(o[2 * j], pa, b[0], b[1]);
                mma16816<T>(o[2 * j + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads(); // all warps are done with stage st before it is refilled
    }

    // l: each lane summed its own columns; the row's 4 lanes add up.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    float *o0 = a.out + ((row0 + r0) * a.n_heads + h) * HD + 2 * tq;
    float *o1 = a.out + ((row0 + r1) * a.n_heads + h) * HD + 2 * tq;
#pragma unroll
    for (int j = 0; j < HD / 8; j++) {
        if (r0 < rows)
            *(float2 *)(o0 + j * 8) = make_float2(o[j][0] * inv0, o[j][1] * inv0);
        if (r1 < rows)
            *(float2 *)(o1 + j * 8) = make_float2(o[j][2] * inv1, o[j][3] * inv1);
    }
}

template <typename T, int HD>
int tc_launch(const tc_args &a, int n_chunks, int max_q_len, cudaStream_t st)
{
    const size_t smem = tc_smem_bytes<HD>();
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(prefill_tc_kernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem) != cudaSuccess)
        return TY_CUDA_LAUNCH_CHECK("attn_prefill_tc smem attribute");
    dim3 grid((max_q_len + kBr - 1) / kBr, a.n_heads, n_chunks);
    prefill_tc_kernel<T, HD><<<grid, kThreads, smem, st>>>(a);
    return TY_CUDA_LAUNCH_CHECK("attn_prefill_tc");
}

template <typename T>
int tc_launch_hd(const tc_args &a, int hd, int n_chunks, int max_q_len, cudaStream_t st)
{
    return hd == 64 ? tc_launch<T, 64>(a, n_chunks, max_q_len, st)
                    : tc_launch<T, 128>(a, n_chunks, max_q_len, st);
}

} // namespace

bool ty__attn_prefill_tc_applies(const ty_cuda_kv_layout *l, const ty_cuda_attn_shape *s)
{
    return (l->type == TY_CUDA_F16 || l->type == TY_CUDA_BF16) &&
           (s->head_dim == 64 || s->head_dim == 128);
}

int ty__attn_prefill_tc(float *out, const float *q, const void *k_pool, const void *v_pool,
                        const ty_cuda_kv_layout *l, const ty_cuda_attn_shape *s,
                        const int32_t *block_tables, const int32_t *q_starts,
                        const int32_t *q_lens, const int32_t *kv_lens, int n_chunks,
                        int max_q_len, cudaStream_t st)
{
    tc_args a;
    a.out = out;
    a.q = q;
    a.k_pool = k_pool;
    a.v_pool = v_pool;
    a.tables = block_tables;
    a.q_starts = q_starts;
    a.q_lens = q_lens;
    a.kv_lens = kv_lens;
    a.n_heads = s->n_heads;
    a.n_kv = s->n_kv_heads;
    a.page_tokens = l->page_tokens;
    a.max_pages = s->max_pages;
    a.scale_log2 = s->scale * 1.4426950408889634f;
    return l->type == TY_CUDA_F16
               ? tc_launch_hd<__half>(a, s->head_dim, n_chunks, max_q_len, st)
               : tc_launch_hd<__nv_bfloat16>(a, s->head_dim, n_chunks, max_q_len, st);
}
