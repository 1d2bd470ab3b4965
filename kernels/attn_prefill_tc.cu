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
#include "mma_common.cuh"
#include "attn_prefill_tune.h"

#include <math.h>
#include <stdint.h>

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kPad = 8;          // elements of row padding: rows 16 bytes apart mod 128

template <int HD> constexpr int ld() { return HD + kPad; }

struct tc_args {
    float *out;
    const float *q;
    const void *k_pool, *v_pool;
    const int32_t *tables, *q_starts, *q_lens, *kv_lens;
    int n_heads, n_kv, page_tokens, max_pages;
    float scale_log2; // softmax scale * log2(e)
};

// 2^x on the special-function unit (inputs here are <= 0 or -inf; ftz is harmless).
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// The kernel's shape: MT m16 row tiles per warp (rows per block = 16 * MT * kWarps), BC keys
// per K/V tile, Q fragments kept in registers for the whole walk (QREG) or re-read from shared
// memory at every k-step (fewer registers).
template <int HD, int MT, int BC> struct tc_shape {
    static constexpr int kRows = 16 * MT * kWarps;
    static constexpr int kChunks = HD / 8;                   // 16-byte chunks per token row
    static constexpr int kRowsPerThread = BC * kChunks / kThreads; // token rows one thread copies
    static constexpr int kRowStep = kThreads / kChunks;       // between a thread's rows
    static constexpr size_t smem_bytes() { return sizeof(uint16_t) * (size_t)ld<HD>() * (kRows + 4 * BC); }
};

// Issues the cp.async copies of tokens [p0, p0 + BC) of one KV head into the K and V tiles,
// as two commit groups (K first). Each thread copies one 16-byte chunk column of
// kRowsPerThread token rows; a row's pool offset is found once for K and V. Tokens at or past
// kv_end are zero-filled (their table entries are never read).
template <typename T, int HD, int MT, int BC>
__device__ __forceinline__ void load_kv_tile(T *ks, T *vs, const T *kp, const T *vp,
                                             const int32_t *table, int p0, int kv_end, int kh,
                                             int n_kv, int page_tokens)
{
    using S = tc_shape<HD, MT, BC>;
    const int ch = threadIdx.x % S::kChunks, t0 = threadIdx.x / S::kChunks;
    size_t off[S::kRowsPerThread];
    bool ok[S::kRowsPerThread];
#pragma unroll
    for (int i = 0; i < S::kRowsPerThread; i++) {
        const int pos = p0 + t0 + i * S::kRowStep;
        ok[i] = pos < kv_end;
        off[i] = 0;
        if (ok[i]) {
            const int page = table[pos / page_tokens], slot = pos - (pos / page_tokens) * page_tokens;
            off[i] = (((size_t)page * n_kv + kh) * page_tokens + slot) * HD + ch * 8;
        }
    }
#pragma unroll
    for (int i = 0; i < S::kRowsPerThread; i++)
        ty::cp_async16(ks + (t0 + i * S::kRowStep) * ld<HD>() + ch * 8, kp + off[i], ok[i] ? 16 : 0);
    ty::cp_commit();
#pragma unroll
    for (int i = 0; i < S::kRowsPerThread; i++)
        ty::cp_async16(vs + (t0 + i * S::kRowStep) * ld<HD>() + ch * 8, vp + off[i], ok[i] ? 16 : 0);
    ty::cp_commit();
}

// ONEBAR: one barrier per tile (wait for the tile's K and V together, then issue the next
// tile's copies into the stage every warp has left), instead of three (K, V, end of tile).
template <typename T, int HD, int MT, int BC, bool QREG, bool ONEBAR, int MINB = 2>
__global__ void __launch_bounds__(kThreads, MINB) prefill_tc_kernel(tc_args a)
{
    using S = tc_shape<HD, MT, BC>;
    constexpr int kBr = S::kRows;
    extern __shared__ float4 smem4[];
    T *sq = (T *)smem4;
    T *sk = sq + kBr * ld<HD>(); // 2 stages
    T *sv = sk + 2 * BC * ld<HD>();
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
    const int n_tiles = (kv_end + BC - 1) / BC;
    const size_t row0 = (size_t)a.q_starts[chunk] + i0;

    load_kv_tile<T, HD, MT, BC>(sk, sv, kp, vp, table, 0, kv_end, kh, a.n_kv, a.page_tokens);

    // Q rows (f32 in global) -> 16-bit shared tile; rows past the chunk are zeros.
    for (int i = threadIdx.x; i < kBr * (HD / 4); i += kThreads) {
        const int r = i / (HD / 4), c = 4 * (i % (HD / 4));
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < rows)
            v = *(const float4 *)(a.q + ((row0 + r) * a.n_heads + h) * HD + c);
        uint2 u = make_uint2(ty::pack2<T>(v.x, v.y), ty::pack2<T>(v.z, v.w));
        *(uint2 *)(sq + r * ld<HD>() + c) = u;
    }
    __syncthreads();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tq = lane & 3; // fragment row (and row + 8), column pair
    const int wrow = warp * 16 * MT;        // this warp's first row in the block
    // A fragment of m-tile mt, k-step kk: lanes 0-15 rows 0-15 at column 0, 16-31 at column 8.
    const T *qa = sq + (wrow + (lane & 15)) * ld<HD>() + (lane >> 4) * 8;
    uint32_t qf[QREG ? MT : 1][QREG ? HD / 16 : 1][4];
    if (QREG) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                ty::ldsm_x4(qf[QREG ? mt : 0][QREG ? kk : 0], qa + mt * 16 * ld<HD>() + kk * 16);
    }

    const int warp_min_pos = first_pos + i0 + wrow; // the causal mask's smallest row position
    float m[MT][2], l[MT][2];
    float o[MT][HD / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;
    }

    for (int t = 0; t < n_tiles; t++) {
        const int p0 = t * BC, st = t & 1;
        const T *k_s = sk + st * BC * ld<HD>(), *v_s = sv + st * BC * ld<HD>();
        const bool more = t + 1 < n_tiles;
        if (ONEBAR) {
            ty::cp_wait<0>(); // this thread's copies of tile t (K and V) have landed
            __syncthreads(); // everyone's have, and every warp is done with tile t - 1
            if (more) // into the stage tile t - 1 used
                load_kv_tile<T, HD, MT, BC>(sk + (st ^ 1) * BC * ld<HD>(),
                                            sv + (st ^ 1) * BC * ld<HD>(), kp, vp, table, p0 + BC,
                                            kv_end, kh, a.n_kv, a.page_tokens);
        } else {
            if (more) { // stage st^1 was last read in iteration t - 1, which ended with a barrier
                load_kv_tile<T, HD, MT, BC>(sk + (st ^ 1) * BC * ld<HD>(),
                                            sv + (st ^ 1) * BC * ld<HD>(), kp, vp, table, p0 + BC,
                                            kv_end, kh, a.n_kv, a.page_tokens);
                ty::cp_wait<3>(); // K of tile t has landed (V of t and tile t + 1 may still fly)
            } else {
                ty::cp_wait<1>();
            }
            __syncthreads();
        }

        // S = Q K^T: per m-tile 16 rows x BC keys, as BC / 8 n-tiles.
        float s[MT][BC / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < BC / 8; j++)
                s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t qk[MT][4];
            if (!QREG) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    ty::ldsm_x4(qk[mt], qa + mt * 16 * ld<HD>() + kk * 16);
            }
#pragma unroll
            for (int j = 0; j < BC / 16; j++) { // two n-tiles per ldmatrix.x4
                uint32_t b[4];
                ty::ldsm_x4(b, k_s + (j * 16 + (lane & 7) + (lane >> 4) * 8) * ld<HD>() + kk * 16 +
                               ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const uint32_t(&qa_f)[4] = QREG ? qf[QREG ? mt : 0][QREG ? kk : 0] : qk[mt];
                    ty::mma16816<T>(s[mt][2 * j], qa_f, b[0], b[1]);
                    ty::mma16816<T>(s[mt][2 * j + 1], qa_f, b[2], b[3]);
                }
            }
        }

        // Mask: keys past the row's position (causal) or past kv_end; only tiles that reach
        // past this warp's first row need it.
        if (p0 + BC - 1 > warp_min_pos || p0 + BC > kv_end) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const int qp0 = warp_min_pos + mt * 16 + g, qp1 = qp0 + 8;
#pragma unroll
                for (int j = 0; j < BC / 8; j++) {
                    const int c = p0 + j * 8 + 2 * tq;
                    if (c > qp0 || c >= kv_end) s[mt][j][0] = -INFINITY;
                    if (c + 1 > qp0 || c + 1 >= kv_end) s[mt][j][1] = -INFINITY;
                    if (c > qp1 || c >= kv_end) s[mt][j][2] = -INFINITY;
                    if (c + 1 > qp1 || c + 1 >= kv_end) s[mt][j][3] = -INFINITY;
                }
            }
        }

        // Online softmax for rows g (half 0) and g + 8 (half 1) of each m-tile; the 4 lanes
        // of a row share its max. m is kept in the exp2 domain (raw max x scale * log2 e), so
        // p = 2^(s * scale_log2 - m) is one FFMA and one MUFU per score.
        float al[MT][2];
        bool grew = false;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < BC / 8; j++)
                    mx = fmaxf(mx, fmaxf(s[mt][j][2 * hf], s[mt][j][2 * hf + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mn = fmaxf(m[mt][hf], mx * a.scale_log2);
                // A row with nothing visible yet keeps m = -inf; subtract 0 instead so that no
                // NaN appears (its p are all 2^-inf = 0).
                const float sub = mn == -INFINITY ? 0.0f : mn;
                al[mt][hf] = fast_exp2(m[mt][hf] - sub);
                grew |= mn != m[mt][hf];
                m[mt][hf] = mn;
                float rs = 0.0f;
#pragma unroll
                for (int j = 0; j < BC / 8; j++) {
                    s[mt][j][2 * hf] = fast_exp2(fmaf(s[mt][j][2 * hf], a.scale_log2, -sub));
                    s[mt][j][2 * hf + 1] =
                        fast_exp2(fmaf(s[mt][j][2 * hf + 1], a.scale_log2, -sub));
                    rs += s[mt][j][2 * hf] + s[mt][j][2 * hf + 1];
                }
                l[mt][hf] = l[mt][hf] * al[mt][hf] + rs;
                if (MT > 1) { // no registers to spare for deferring it (see below)
#pragma unroll
                    for (int j = 0; j < HD / 8; j++)
                        o[mt][j][2 * hf] *= al[mt][hf], o[mt][j][2 * hf + 1] *= al[mt][hf];
                }
            }
        }
        // Past the first tiles a row's max rarely grows: skip the rescale when no row of the
        // warp's grew (alpha is then exactly 1 for all of them).
        if (MT == 1 && __any_sync(0xffffffffu, grew)) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < HD / 8; j++) {
                    o[mt][j][0] *= al[mt][0], o[mt][j][1] *= al[mt][0];
                    o[mt][j][2] *= al[mt][1], o[mt][j][3] *= al[mt][1];
                }
        }

        if (!ONEBAR) {
            if (more)
                ty::cp_wait<2>(); // V of tile t
            else
                ty::cp_wait<0>();
            __syncthreads();
        }

        // O += P V: k-steps of 16 keys; P's A fragment comes from S n-tiles 2kk and 2kk + 1.
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                pa[mt][0] = ty::pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = ty::pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = ty::pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = ty::pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int j = 0; j < HD / 16; j++) { // two n-tiles of head_dim per ldmatrix.x4
                uint32_t b[4];
                ty::ldsm_x4_t(b, v_s + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld<HD>() +
                                 j * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    ty::mma16816<T>(o[mt][2 * j], pa[mt], b[0], b[1]);
                    ty::mma16816<T>(o[mt][2 * j + 1], pa[mt], b[2], b[3]);
                }
            }
        }
        if (!ONEBAR)
            __syncthreads(); // all warps are done with stage st before it is refilled
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            // l: each lane summed its own columns; the row's 4 lanes add up.
            float lv = l[mt][hf];
            lv += __shfl_xor_sync(0xffffffffu, lv, 1);
            lv += __shfl_xor_sync(0xffffffffu, lv, 2);
            const float inv = lv > 0.0f ? 1.0f / lv : 0.0f;
            const int r = wrow + mt * 16 + g + 8 * hf;
            if (r >= rows)
                continue;
            float *op = a.out + ((row0 + r) * a.n_heads + h) * HD + 2 * tq;
#pragma unroll
            for (int j = 0; j < HD / 8; j++)
                *(float2 *)(op + j * 8) =
                    make_float2(o[mt][j][2 * hf] * inv, o[mt][j][2 * hf + 1] * inv);
        }
    }
}

template <typename T, int HD, int MT, int BC, bool QREG, bool ONEBAR, int MINB = 2>
int tc_launch(const tc_args &a, int n_chunks, int max_q_len, cudaStream_t st)
{
    using S = tc_shape<HD, MT, BC>;
    const size_t smem = S::smem_bytes();
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(prefill_tc_kernel<T, HD, MT, BC, QREG, ONEBAR, MINB>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return TY_CUDA_LAUNCH_CHECK("attn_prefill_tc smem attribute");
    dim3 grid((max_q_len + S::kRows - 1) / S::kRows, a.n_heads, n_chunks);
    prefill_tc_kernel<T, HD, MT, BC, QREG, ONEBAR, MINB><<<grid, kThreads, smem, st>>>(a);
    return TY_CUDA_LAUNCH_CHECK("attn_prefill_tc");
}

int g_variant = 0; // ty__attn_prefill_tc_set_variant; 0 = the default shape

// The shapes timed by `bench_gpu_attn prefill-sweep` (attn_prefill_tune.h). On an H200 (4 x 2048
// tokens, 32/8 heads, head_dim 128, bf16): 0 195, 1 144, 2 147, 3 189, 4 195 TFLOP/s; two m16
// tiles per warp (128 rows per block) win, the barrier count does not matter. Capping registers
// for 3 blocks per SM (64 rows, Q from shared memory; MINB = 3) ran at 144 (64-key tiles, held
// to 2 blocks by shared memory) and 167 (32-key tiles): more warps did not pay for the lost reuse.
template <typename T, int HD>
int tc_launch_variant(const tc_args &a, int n_chunks, int max_q_len, cudaStream_t st)
{
    switch (g_variant) {
    case 1: // 64 rows, 64-key tiles, Q in registers, three barriers per tile
        return tc_launch<T, HD, 1, 64, true, false>(a, n_chunks, max_q_len, st);
    case 2: // 64 rows, 64-key tiles, Q in registers
        return tc_launch<T, HD, 1, 64, true, true>(a, n_chunks, max_q_len, st);
    case 3: // 128 rows (two m-tiles per warp), 32-key tiles
        return tc_launch<T, HD, 2, 32, false, true>(a, n_chunks, max_q_len, st);
    case 4: // 128 rows, 64-key tiles, three barriers per tile
        return tc_launch<T, HD, 2, 64, false, false>(a, n_chunks, max_q_len, st);
    default: // 128 rows, 64-key tiles, Q re-read from shared memory, one barrier per tile
        return tc_launch<T, HD, 2, 64, false, true>(a, n_chunks, max_q_len, st);
    }
}

template <typename T>
int tc_launch_hd(const tc_args &a, int hd, int n_chunks, int max_q_len, cudaStream_t st)
{
    return hd == 64 ? tc_launch_variant<T, 64>(a, n_chunks, max_q_len, st)
                    : tc_launch_variant<T, 128>(a, n_chunks, max_q_len, st);
}

} // namespace

extern "C" int ty__attn_prefill_tc_set_variant(int v)
{
    if (v < 0 || v > 4)
        return TY_EINVAL;
    g_variant = v;
    return 0;
}

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
