// Decode attention over paged KV, split along the context (flash-decoding, Dao et al. 2023):
// block (split, kv head x head group, sequence) streams its share of the sequence's pages in
// tiles of up to kTile tokens through shared memory, keeps an online softmax (Milakov &
// Gimelshein 2018) for up to kMaxG query heads that share the KV head, and either writes the
// normalized output (one split) or an unnormalized partial (o, m, l) that the reduce kernel
// combines. K and V are each read once per KV head, which is what makes it bandwidth-bound.
//
// Three kernels: for head_dim 64 and 128 (the common model shapes), decode_tc_kernel (16-bit
// pools, the default) and decode_fast_kernel (f32 pools, and the benchmark variants of
// attn_decode_tune.h), which stream K/V straight from global memory into registers with
// 16-byte loads and keep many of them in flight (no barrier in their loops; shared memory only
// holds q and the final combine), the former running the products on tensor cores; and
// decode_kernel, the general shared-memory-tiled kernel, for every other head_dim. All write
// the same partials, so the reduce kernel and the workspace layout are shared.
#include "attn_common.cuh"
#include "attn_decode_tune.h"
#include "mma_common.cuh"

#include <math.h>
#include <stdint.h>
#include <string.h>

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;   // tokens per shared-memory tile (never crosses a page)
constexpr int kMaxG = 8;    // query heads per block (larger GQA groups use more blocks)
constexpr int kMaxChunks = 2; // float4 chunks of head_dim per lane: head_dim <= 32 * 4 * 2

struct decode_args {
    float *out;
    float *ws; // partials: (n_seqs, n_heads, n_splits, head_dim + 2) as o..., m, l
    const float *q;
    const int32_t *tables;
    const int32_t *lens;
    int n_heads, n_kv, hd, page_tokens, max_pages, n_groups, n_splits, split_tokens;
    int window; // sliding window (0: none): splits start no earlier than len - window
    float scale;
};

size_t decode_smem(int hd) { return sizeof(float) * (kMaxG * hd + kTile * (hd + 4) + kTile * hd + kMaxG * kTile + 3 * kMaxG); }

struct decode_smem_t {
    float *q, *k, *v, *p, *m, *l, *alpha;
};

__device__ decode_smem_t carve(float *sm, int hd)
{
    decode_smem_t s;
    s.q = sm;
    s.k = s.q + kMaxG * hd;
    s.v = s.k + kTile * (hd + 4);
    s.p = s.v + kTile * hd;
    s.m = s.p + kMaxG * kTile;
    s.l = s.m + kMaxG;
    s.alpha = s.l + kMaxG;
    return s;
}

// Scores of the tile for every head of the block, then the online-softmax update: p becomes
// exp(s - m_new), alpha the factor that rescales what was accumulated before.
__device__ void tile_softmax(decode_smem_t s, int n, int ng, int hd)
{
    const int ld = hd + 4;
    for (int i = threadIdx.x; i < ng * kTile; i += kThreads) {
        const int g = i / kTile, t = i % kTile;
        float acc = -INFINITY;
        if (t < n) {
            acc = 0.0f;
            const float *qr = s.q + g * hd, *kr = s.k + t * ld;
            for (int d = 0; d < hd; d += 4)
                acc += ty::dot4(*(const float4 *)(qr + d), *(const float4 *)(kr + d));
        }
        s.p[g * kTile + t] = acc;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int g = warp; g < ng; g += kWarps) {
        const float sc = s.p[g * kTile + lane];
        const float m_old = s.m[g], m_new = fmaxf(m_old, ty::warp_max(sc));
        const float p = lane < n ? expf(sc - m_new) : 0.0f;
        const float sum = ty::warp_sum(p);
        s.p[g * kTile + lane] = p;
        if (lane == 0) {
            const float a = expf(m_old - m_new); // 0 on the first tile (m_old = -inf)
            s.alpha[g] = a;
            s.l[g] = s.l[g] * a + sum;
            s.m[g] = m_new;
        }
    }
    __syncthreads();
}

// acc[g][j] (this lane's float4 chunks j of head g) += sum over this warp's tokens p * v.
__device__ void tile_values(decode_smem_t s, float4 (&acc)[kMaxG][kMaxChunks], int n, int ng,
                            int hd)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int g = 0; g < kMaxG; g++) {
        if (g < ng) {
            const float a = s.alpha[g];
#pragma unroll
            for (int j = 0; j < kMaxChunks; j++) {
                acc[g][j].x *= a;
                acc[g][j].y *= a;
                acc[g][j].z *= a;
                acc[g][j].w *= a;
            }
        }
    }
    for (int t = warp; t < n; t += kWarps) {
#pragma unroll
        for (int j = 0; j < kMaxChunks; j++) {
            const int d = 4 * (lane + 32 * j);
            if (d >= hd)
                break;
            const float4 v = *(const float4 *)(s.v + t * hd + d);
#pragma unroll
            for (int g = 0; g < kMaxG; g++) {
                if (g < ng) {
                    const float p = s.p[g * kTile + t];
                    acc[g][j].x += p * v.x;
                    acc[g][j].y += p * v.y;
                    acc[g][j].z += p * v.z;
                    acc[g][j].w += p * v.w;
                }
            }
        }
    }
}

// Sums the warps' partial accumulators in shared memory (reusing the K tile) and writes the
// block's result for its heads: normalized, or as a partial for the reduce kernel.
__device__ void finish(const decode_args &a, decode_smem_t s, float4 (&acc)[kMaxG][kMaxChunks],
                       int seq, int h0, int ng, int split)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hd = a.hd;
    float *red = s.k; // kWarps * kMaxG * hd floats <= kTile * (hd + 4)
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kMaxG; g++) {
#pragma unroll
        for (int j = 0; j < kMaxChunks; j++) {
            const int d = 4 * (lane + 32 * j);
            if (g < ng && d < hd)
                *(float4 *)(red + (warp * kMaxG + g) * hd + d) = acc[g][j];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ng * hd; i += kThreads) {
        const int g = i / hd, d = i % hd;
        float o = 0.0f;
        for (int w = 0; w < kWarps; w++)
            o += red[(w * kMaxG + g) * hd + d];
        const size_t sh = (size_t)seq * a.n_heads + h0 + g;
        if (a.n_splits == 1) {
            a.out[sh * hd + d] = s.l[g] > 0.0f ? o / s.l[g] : 0.0f;
        } else {
            float *w = a.ws + (sh * a.n_splits + split) * (hd + 2);
            w[d] = o;
            if (d == 0) {
                w[hd] = s.m[g];
                w[hd + 1] = s.l[g];
            }
        }
    }
}

template <typename T>
// At least 4 blocks per SM (<= 128 registers): decode needs many loads in flight.
__global__ void __launch_bounds__(kThreads, 4)
    decode_kernel(decode_args a, const T *__restrict__ k_pool, const T *__restrict__ v_pool)
{
    extern __shared__ float4 smem4[];
    const int hd = a.hd, split = blockIdx.x, seq = blockIdx.z;
    const int kh = blockIdx.y / a.n_groups, grp = blockIdx.y % a.n_groups;
    const int G = a.n_heads / a.n_kv;
    const int h0 = kh * G + grp * kMaxG, ng = min(kMaxG, G - grp * kMaxG);
    decode_smem_t s = carve((float *)smem4, hd);
    const int len = a.lens[seq];
    const int end = min(len, (split + 1) * a.split_tokens);
    const int begin = max(split * a.split_tokens, ty::window_first(len, a.window));
    const int32_t *table = a.tables + (size_t)seq * a.max_pages;

    for (int i = threadIdx.x; i < ng * hd; i += kThreads)
        s.q[i] = a.q[((size_t)seq * a.n_heads + h0) * hd + i] * a.scale;
    if (threadIdx.x < kMaxG) {
        s.m[threadIdx.x] = -INFINITY;
        s.l[threadIdx.x] = 0.0f;
    }
    float4 acc[kMaxG][kMaxChunks];
#pragma unroll
    for (int g = 0; g < kMaxG; g++)
#pragma unroll
        for (int j = 0; j < kMaxChunks; j++)
            acc[g][j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    for (int p0 = begin; p0 < end;) {
        const int n = min(min(kTile, a.page_tokens - p0 % a.page_tokens), end - p0);
        __syncthreads(); // previous tile fully consumed
        ty::load_tile(s.k, hd + 4, ty::kv_row(k_pool, table, p0, kh, a.n_kv, a.page_tokens, hd),
                      n, hd);
        ty::load_tile(s.v, hd, ty::kv_row(v_pool, table, p0, kh, a.n_kv, a.page_tokens, hd), n,
                      hd);
        __syncthreads();
        tile_softmax(s, n, ng, hd);
        tile_values(s, acc, n, ng, hd);
        p0 += n;
    }
    finish(a, s, acc, seq, h0, ng, split);
}

// ---- bandwidth-oriented kernel for head_dim 64 / 128 --------------------------------------
//
// Block = 4 warps; its token range [begin, end) is cut into 4 contiguous runs, one per warp.
// In a warp, the 8 lanes of token group tg = lane / 8 share one token row: lane l8 = lane % 8
// owns the 16-byte chunks c * 8 + l8 (c < kNC) of the row, i.e. elements
// c * 8 * kVec + l8 * kVec + j (j < kVec), so each load instruction of the 8 lanes covers 128
// contiguous bytes. One step covers 4 tokens; one iteration U steps (token t0 + 4 u + tg).
// K and V rows of the next iteration are loaded while this one is computed: K right after this
// iteration's scores used K, V after its values used V, so loads are in flight at all times.
// Softmax state (m) is per warp and head; l and acc per lane, reduced over the warp at the end
// and over the 4 warps through shared memory. Tokens past the warp's run are never loaded (their
// table entries may be garbage): their K/V registers are zero and their p is 0.
//
// Variants (attn_decode_tune.h, for bench_gpu_attn decode-sweep; kDefaultVariant is used
// otherwise): U (steps per iteration) and the blocks per SM the registers must allow, the L2
// prefetch qualifier, at most 2 query heads per block (the plan's G), and decode_tc_kernel
// below, which runs the products on tensor cores.

constexpr int kFastWarps = kWarps; // 4 warps, 128 threads
constexpr int kFastMinSplit = 256; // tokens per split at least (default)
constexpr int kFastMaxG = 4;
constexpr int kDefaultVariant = TY__DECODE_TC;
constexpr int kDefaultSplitFactor = TY__DECODE_SPLIT_FIT; // see plan_decode
constexpr int kSplitFactor = 4; // split_factor 0 (the previous default): blocks per SM in all

template <typename T, int HD, int G> struct fast_cfg {
    static constexpr int kVec = 16 / (int)sizeof(T); // elements per 16-byte load
    static constexpr int kEPL = HD / 8;               // elements of a row per lane
    static constexpr int kNC = kEPL / kVec;           // 16-byte loads per lane per row
    // Steps per iteration: 4, or 2 when a lane's row share is 64 bytes (f32, head_dim 128), so
    // that the K+V rows in flight never take more than 64 registers per lane.
    static constexpr int kU = kEPL * (int)sizeof(T) <= 32 ? 4 : 2;
    // Blocks per SM the register budget must allow (255 / 168 / 128 registers for 2 / 3 / 4):
    // the most that compiles without spills (ptxas -v, CUDA 13.0, sm_80 and sm_90a). Per lane,
    // acc takes G * kEPL registers and the K/V rows in flight 8 * kU * kNC.
    static constexpr int kMinBlocks =
        HD == 128 ? (G == 4 ? 2 : G == 2 ? (sizeof(T) == 4 ? 3 : 2) : 4) : (G == 4 ? 3 : 4);
    static_assert(HD % 8 == 0 && kEPL % kVec == 0 && kNC >= 1, "fast decode shape");
};

// decode_fast_kernel's shape in variant V: steps per iteration, blocks per SM (launch bound),
// and whether the loads carry the L2::256B prefetch qualifier. U2 and G2 use 2 steps (half the
// K/V registers in flight) and ask for more blocks per SM, again the most that compiles
// without spills.
template <typename T, int HD, int G, int V> struct fast_var {
    using B = fast_cfg<T, HD, G>;
    static constexpr bool kFewer = V == TY__DECODE_U2 || V == TY__DECODE_G2;
    static constexpr int kU = kFewer ? 2 : B::kU;
    static constexpr int kMinBlocks =
        kFewer && B::kU != 2 ? (HD == 128 && G == 4 ? 3 : 4) : B::kMinBlocks;
    static constexpr bool kPrefetch = V != TY__DECODE_NOPF;
};

// 16-byte read-only load that skips L1 (each K/V byte is read once per block) and, with PF,
// asks L2 to fetch the whole 256-byte line (rows are streamed front to back).
template <bool PF> __device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 r;
    if (PF)
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(p));
    else
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(p));
    return r;
}

// The 16 bytes of a load as f32 elements.
__device__ __forceinline__ void widen(uint4 u, float (&f)[4], float)
{
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ float2 half2_bits(unsigned w)
{
    __half2 h;
    memcpy(&h, &w, sizeof(h));
    return __half22float2(h);
}
__device__ __forceinline__ void widen(uint4 u, float (&f)[8], __half)
{
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = half2_bits(w[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ void widen(uint4 u, float (&f)[8], __nv_bfloat16)
{
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) { // element 2i in the low half of word i (little endian)
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// Where the warp's tokens of one iteration live: page id and slot of token t + 4 u + tg, for
// the tokens below `we` only (table entries past the sequence may be garbage).
template <int U>
__device__ __forceinline__ void fast_lookup(int (&pg)[U], int (&sl)[U], const int32_t *table,
                                            int t, int tg, int we, int page_tokens)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int tok = t + 4 * u + tg;
        pg[u] = 0;
        sl[u] = 0;
        if (tok < we) {
            const int pi = tok / page_tokens;
            pg[u] = __ldg(table + pi);
            sl[u] = tok - pi * page_tokens;
        }
    }
}

// Issues the loads of this lane's chunks of the iteration's rows (zeros for tokens >= we).
template <typename T, int HD, int U, int NC, bool PF>
__device__ __forceinline__ void fast_load(uint4 (&r)[U][NC], const T *pool, const int (&pg)[U],
                                          const int (&sl)[U], int t, int tg, int we,
                                          size_t page_rows, int kh_rows, int lane_off)
{
    constexpr int kVec = 16 / (int)sizeof(T);
#pragma unroll
    for (int u = 0; u < U; u++) {
#pragma unroll
        for (int c = 0; c < NC; c++)
            r[u][c] = make_uint4(0u, 0u, 0u, 0u);
        if (t + 4 * u + tg < we) {
            const T *row =
                pool + ((size_t)pg[u] * page_rows + (size_t)(kh_rows + sl[u])) * HD + lane_off;
#pragma unroll
            for (int c = 0; c < NC; c++)
                r[u][c] = ld_stream<PF>(row + c * 8 * kVec);
        }
    }
}

// Combines the block's 4 warps (an empty warp has m = -inf, l = 0, o = 0) for its heads
// h0 .. h0 + ng - 1 and writes the result: normalized, or as a partial for the reduce kernel.
// With LOG2 the warps' m are in log2 units (decode_tc_kernel's exp2 softmax); partials always
// hold natural-log units, as the reduce kernel expects.
template <int HD, int G, bool LOG2>
__device__ void fast_combine(const decode_args &a, const float (&red_o)[kFastWarps][G][HD],
                             const float (&red_m)[kFastWarps][G],
                             const float (&red_l)[kFastWarps][G], int seq, int h0, int ng,
                             int split)
{
    for (int i = threadIdx.x; i < ng * HD; i += kThreads) {
        const int g = i / HD, d = i % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < kFastWarps; w++)
            M = fmaxf(M, red_m[w][g]);
        float o = 0.0f, L = 0.0f;
#pragma unroll
        for (int w = 0; w < kFastWarps; w++) {
            const float mw = red_m[w][g];
            const float f = mw == -INFINITY ? 0.0f : LOG2 ? exp2f(mw - M) : expf(mw - M);
            o += f * red_o[w][g][d];
            L += f * red_l[w][g];
        }
        const size_t sh = (size_t)seq * a.n_heads + h0 + g;
        if (a.n_splits == 1) {
            a.out[sh * HD + d] = L > 0.0f ? o / L : 0.0f;
        } else {
            float *w = a.ws + (sh * a.n_splits + split) * (HD + 2);
            w[d] = o;
            if (d == 0) {
                w[HD] = LOG2 ? M * 0.693147180559945309f : M;
                w[HD + 1] = L;
            }
        }
    }
}

template <typename T, int HD, int G, int U, int MINB, bool PF>
__global__ void __launch_bounds__(kThreads, MINB)
    decode_fast_kernel(decode_args a, const T *__restrict__ k_pool, const T *__restrict__ v_pool)
{
    using C = fast_cfg<T, HD, G>;
    constexpr int kVec = C::kVec, NC = C::kNC, TPI = 4 * U;
    __shared__ __align__(16) float sq[G][HD];
    __shared__ __align__(16) float red_o[kFastWarps][G][HD];
    __shared__ float red_m[kFastWarps][G], red_l[kFastWarps][G];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tg = lane >> 3, l8 = lane & 7;
    const int split = blockIdx.x, seq = blockIdx.z;
    const int kh = blockIdx.y / a.n_groups, grp = blockIdx.y % a.n_groups;
    const int group = a.n_heads / a.n_kv;
    const int h0 = kh * group + grp * G, ng = min(G, group - grp * G); // heads h0 .. h0+ng-1
    const int pt = a.page_tokens;
    const int len = a.lens[seq];
    const int end = min(len, (split + 1) * a.split_tokens);
    const int begin = max(split * a.split_tokens, ty::window_first(len, a.window));
    // The warp's run [wb, we): a multiple of TPI tokens, except where it is cut by `end`.
    const int per = ((max(end - begin, 0) + kFastWarps - 1) / kFastWarps + TPI - 1) / TPI * TPI;
    const int wb = begin + warp * per, we = min(end, wb + per);
    const int32_t *table = a.tables + (size_t)seq * a.max_pages;
    const size_t page_rows = (size_t)a.n_kv * pt; // rows of one page (all KV heads)
    const int kh_rows = kh * pt, lane_off = l8 * kVec;

    // The block's query heads, times scale (0 for masked heads), in shared memory: registers
    // are the scarce resource here (acc and K/V in flight), and each q chunk read per iteration
    // is reused for the U token steps.
    for (int i = threadIdx.x; i < G * HD; i += kThreads) {
        const int g = i / HD;
        sq[g][i % HD] = g < ng ? a.q[((size_t)seq * a.n_heads + h0) * HD + i] * a.scale : 0.0f;
    }
    __syncthreads();
    float acc[G][NC][kVec], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int j = 0; j < kVec; j++)
                acc[g][c][j] = 0.0f;
    }

    if (wb < we) { // warp-uniform: every lane of the warp runs the same iterations
        uint4 kr[U][NC], vr[U][NC];
        int pg[U], sl[U];
        fast_lookup<U>(pg, sl, table, wb, tg, we, pt);
        fast_load<T, HD, U, NC, PF>(kr, k_pool, pg, sl, wb, tg, we, page_rows, kh_rows, lane_off);
        fast_load<T, HD, U, NC, PF>(vr, v_pool, pg, sl, wb, tg, we, page_rows, kh_rows, lane_off);
        fast_lookup<U>(pg, sl, table, wb + TPI, tg, we, pt);
        for (int t0 = wb; t0 < we; t0 += TPI) {
            // Partial scores over this lane's elements, then K of the next iteration.
            float s[U][G];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int g = 0; g < G; g++)
                    s[u][g] = 0.0f;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                float qc[G][kVec];
#pragma unroll
                for (int g = 0; g < G; g++)
#pragma unroll
                    for (int j = 0; j < kVec; j += 4) {
                        const float4 v = *(const float4 *)&sq[g][c * 8 * kVec + lane_off + j];
                        qc[g][j] = v.x;
                        qc[g][j + 1] = v.y;
                        qc[g][j + 2] = v.z;
                        qc[g][j + 3] = v.w;
                    }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    float kf[kVec];
                    widen(kr[u][c], kf, T());
#pragma unroll
                    for (int g = 0; g < G; g++)
#pragma unroll
                        for (int j = 0; j < kVec; j++)
                            s[u][g] = fmaf(qc[g][j], kf[j], s[u][g]);
                }
            }
            fast_load<T, HD, U, NC, PF>(kr, k_pool, pg, sl, t0 + TPI, tg, we, page_rows, kh_rows,
                                        lane_off);
            // Full scores (same value in the 8 lanes of a token), -inf past the warp's run.
#pragma unroll
            for (int u = 0; u < U; u++) {
                const bool valid = t0 + 4 * u + tg < we;
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float d = s[u][g];
                    d += __shfl_xor_sync(0xffffffffu, d, 1);
                    d += __shfl_xor_sync(0xffffffffu, d, 2);
                    d += __shfl_xor_sync(0xffffffffu, d, 4);
                    s[u][g] = valid ? d : -INFINITY;
                }
            }
            // Online softmax over the warp's TPI tokens; s becomes p = exp(s - m_new). Token
            // t0 (u = 0, tg = 0) is always valid, so m_new is finite.
#pragma unroll
            for (int g = 0; g < G; g++) {
                float tm = s[0][g];
#pragma unroll
                for (int u = 1; u < U; u++)
                    tm = fmaxf(tm, s[u][g]);
                tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 8));
                tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 16));
                const float m_new = fmaxf(m[g], tm);
                const float alpha = m[g] == -INFINITY ? 0.0f : expf(m[g] - m_new);
                m[g] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const float p = s[u][g] == -INFINITY ? 0.0f : expf(s[u][g] - m_new);
                    s[u][g] = p;
                    sum += p;
                }
                l[g] = l[g] * alpha + sum;
#pragma unroll
                for (int c = 0; c < NC; c++)
#pragma unroll
                    for (int j = 0; j < kVec; j++)
                        acc[g][c][j] *= alpha;
            }
            // Values, then V of the next iteration and the page lookups of the one after.
#pragma unroll
            for (int u = 0; u < U; u++) {
                float vf[NC][kVec];
#pragma unroll
                for (int c = 0; c < NC; c++)
                    widen(vr[u][c], vf[c], T());
#pragma unroll
                for (int g = 0; g < G; g++)
#pragma unroll
                    for (int c = 0; c < NC; c++)
#pragma unroll
                        for (int j = 0; j < kVec; j++)
                            acc[g][c][j] = fmaf(s[u][g], vf[c][j], acc[g][c][j]);
            }
            fast_load<T, HD, U, NC, PF>(vr, v_pool, pg, sl, t0 + TPI, tg, we, page_rows, kh_rows,
                                        lane_off);
            fast_lookup<U>(pg, sl, table, t0 + 2 * TPI, tg, we, pt);
        }
    }

    // Sum acc and l over the warp's 4 token groups (the 8 lanes of a group hold the same l).
#pragma unroll
    for (int g = 0; g < G; g++) {
        l[g] += __shfl_xor_sync(0xffffffffu, l[g], 8);
        l[g] += __shfl_xor_sync(0xffffffffu, l[g], 16);
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int j = 0; j < kVec; j++) {
                acc[g][c][j] += __shfl_xor_sync(0xffffffffu, acc[g][c][j], 8);
                acc[g][c][j] += __shfl_xor_sync(0xffffffffu, acc[g][c][j], 16);
            }
    }
    if (tg == 0) {
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int c = 0; c < NC; c++)
#pragma unroll
                for (int j = 0; j < kVec; j += 4)
                    *(float4 *)&red_o[warp][g][c * 8 * kVec + lane_off + j] =
                        make_float4(acc[g][c][j], acc[g][c][j + 1], acc[g][c][j + 2],
                                    acc[g][c][j + 3]);
    }
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            red_m[warp][g] = m[g];
            red_l[warp][g] = l[g];
        }
    }
    __syncthreads();
    fast_combine<HD, G, false>(a, red_o, red_m, red_l, seq, h0, ng, split);
}

// ---- tensor-core helpers ------------------------------------------------------------------

// The two values of a packed pair as f32 (exact).
__device__ __forceinline__ float2 tc_unpack(uint32_t w, __half) { return half2_bits(w); }
__device__ __forceinline__ float2 tc_unpack(uint32_t w, __nv_bfloat16)
{
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// 2^x on the special-function unit (x <= 0 or -inf here).
__device__ __forceinline__ float tc_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- tensor-core kernel for 16-bit pools --------------------------------------------------
//
// decode_tc_kernel has decode_fast_kernel's block, warp-run, split and prefetch structure (4
// warps, contiguous runs, next iteration's K/V in flight, the same partials) but a warp
// iteration covers 16 tokens and both products run on mma.sync m16n8k16 with f32
// accumulation, which removes the f32 FMAs and the 16-to-32-bit widening that take most of
// decode_fast_kernel's issue slots. Lane = (g = lane / 4, tq = lane % 4) as in the fragment
// layouts of the PTX ISA.
//  S = Q K^T per 8-token n-tile: A = Q with rows 0-3 the block's heads rounded to T ("hi") and
//   rows 8-11 the rounding remainders rounded to T ("lo"), other rows 0, so the hi and lo
//   partial scores of head g land in the same lane and add up to q.k with ~2^-16 relative
//   error in q (bf16; f16 ~2^-21) instead of 2^-8. B = K^T: lane (g, tq) loads 16 bytes of
//   token g per 32 dims (dims 32m + 8tq .. +7); which dims a k-step's fragment holds differs
//   from the canonical order, but identically in A and B, which a dot product does not see.
//  O^T += V^T P^T per 16 dims: A = V^T, built from 16-byte loads of tokens 2tq, 2tq + 1,
//   2tq + 8, 2tq + 9 (dims 64c + 8g .. +7) with byte permutes that pair two tokens' values of
//   one dim; B = P^T with columns 0-3 the p of the heads rounded to T and columns 4-7 the
//   remainders (from the lanes 16 apart), so P, too, enters with ~2^-16 error. Output column
//   h + 4 is added to column h at the end.
// The softmax runs in the exp2 domain (q carries scale * log2 e; with f16 pools that product
// must stay below 65504, the f16 maximum). Each lane keeps m and its part of l for head g
// (g < 4; rows 4-7 are idle). Q's fragments stay in registers (TC), or in shared memory, read
// at every k-step (QS, variant TCS: 32 registers fewer for head_dim 128, so 4 blocks per SM
// instead of 3).

constexpr int kTcTPI = 16; // tokens per warp iteration
// Blocks per SM (launch bound): the most without spills (ptxas -v, CUDA 13.0, sm_80 and sm_90a).
template <int HD, bool QS> constexpr int tc_min_blocks() { return HD == 128 && !QS ? 3 : 4; }

// Row of token tok in the pool (page id * n_kv * page_tokens + kv head * page_tokens + slot),
// 0 for a token at or past we (whose table entry is never read). t0, pi0, off0: the
// iteration's first token, its page index and slot; the 16 tokens of an iteration cross at most
// one page boundary unless pages are shorter than 16 tokens. 32 bits hold any row index: a row
// is >= 128 bytes.
__device__ __forceinline__ uint32_t tc_row(const int32_t *table, int tok, int we, int t0, int pi0,
                                           int off0, int pt, uint32_t page_rows, uint32_t kh_rows)
{
    if (tok >= we)
        return 0u;
    int o = off0 + (tok - t0), pi = pi0;
    if (o >= pt) {
        if (o < 2 * pt) {
            pi++;
            o -= pt;
        } else {
            pi = tok / pt;
            o = tok - pi * pt;
        }
    }
    return (uint32_t)__ldg(table + pi) * page_rows + kh_rows + (uint32_t)o;
}

// Rows of the iteration starting at t0 (K and / or V): K tokens t0 + g, t0 + 8 + g; V tokens
// t0 + tc_vtok(tq, u).
__device__ __forceinline__ int tc_vtok(int tq, int u) { return 2 * tq + (u & 1) + 8 * (u >> 1); }
__device__ __forceinline__ void tc_lookup(uint32_t (&rk)[2], uint32_t (&rv)[4], bool k, bool v,
                                          const int32_t *table, int t0, int we, int g, int tq,
                                          int pt, uint32_t page_rows, uint32_t kh_rows)
{
    const int pi0 = t0 / pt, off0 = t0 - pi0 * pt;
#pragma unroll
    for (int j = 0; j < 2; j++)
        if (k)
            rk[j] = tc_row(table, t0 + 8 * j + g, we, t0, pi0, off0, pt, page_rows, kh_rows);
#pragma unroll
    for (int u = 0; u < 4; u++)
        if (v)
            rv[u] = tc_row(table, t0 + tc_vtok(tq, u), we, t0, pi0, off0, pt, page_rows, kh_rows);
}

template <typename T, int HD>
__device__ __forceinline__ void tc_load(uint4 (&kr)[2][HD / 32], uint4 (&vr)[4][HD / 64],
                                        bool k, const T *pool, const uint32_t (&rk)[2],
                                        const uint32_t (&rv)[4], int t0, int we, int g, int tq)
{
    if (k) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
#pragma unroll
            for (int m = 0; m < HD / 32; m++)
                kr[j][m] = make_uint4(0u, 0u, 0u, 0u);
            if (t0 + 8 * j + g < we) {
                const T *row = pool + (size_t)rk[j] * HD + 8 * tq;
#pragma unroll
                for (int m = 0; m < HD / 32; m++)
                    kr[j][m] = ld_stream<true>(row + 32 * m);
            }
        }
    } else {
#pragma unroll
        for (int u = 0; u < 4; u++) {
#pragma unroll
            for (int c = 0; c < HD / 64; c++)
                vr[u][c] = make_uint4(0u, 0u, 0u, 0u);
            if (t0 + tc_vtok(tq, u) < we) {
                const T *row = pool + (size_t)rv[u] * HD + 8 * g;
#pragma unroll
                for (int c = 0; c < HD / 64; c++)
                    vr[u][c] = ld_stream<true>(row + 64 * c);
            }
        }
    }
}

template <typename T, int HD, bool QS>
__global__ void __launch_bounds__(kThreads, (tc_min_blocks<HD, QS>()))
    decode_tc_kernel(decode_args a, const T *__restrict__ k_pool, const T *__restrict__ v_pool)
{
    constexpr int KC = HD / 32, VC = HD / 64, NT = HD / 16; // NT: k-steps of S, tiles of O^T
    __shared__ uint4 sqf[QS ? NT : 1][32]; // QS: lane's Q fragment of k-step s at sqf[s][lane]
    __shared__ __align__(16) float red_o[kFastWarps][kFastMaxG][HD];
    __shared__ float red_m[kFastWarps][kFastMaxG], red_l[kFastWarps][kFastMaxG];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const int split = blockIdx.x, seq = blockIdx.z;
    const int kh = blockIdx.y / a.n_groups, grp = blockIdx.y % a.n_groups;
    // The group's heads in n_groups blocks of gb (<= 4) heads: h0 .. h0 + ng - 1.
    const int group = a.n_heads / a.n_kv, gb = (group + a.n_groups - 1) / a.n_groups;
    const int h0 = kh * group + grp * gb, ng = min(gb, group - grp * gb);
    const int pt = a.page_tokens;
    const int len = a.lens[seq];
    const int end = min(len, (split + 1) * a.split_tokens);
    const int begin = max(split * a.split_tokens, ty::window_first(len, a.window));
    const int per =
        ((max(end - begin, 0) + kFastWarps - 1) / kFastWarps + kTcTPI - 1) / kTcTPI * kTcTPI;
    const int wb = begin + warp * per, we = min(end, wb + per);
    const int32_t *table = a.tables + (size_t)seq * a.max_pages;
    const uint32_t page_rows = (uint32_t)(a.n_kv * pt), kh_rows = (uint32_t)(kh * pt);

    // Q's A fragments of the NT k-steps: k-step s holds dims d .. d + 3 of head g,
    // d = 32 (s / 2) + 8 tq + 4 (s % 2), the same dims as K's B fragment of that k-step.
    uint32_t qf[QS ? 1 : NT][4];
    if (!QS || warp == 0) {
        const float qs = a.scale * 1.44269504088896341f; // exp2 domain
        const float *qh = a.q + ((size_t)seq * a.n_heads + h0 + min(g, ng - 1)) * HD;
#pragma unroll
        for (int s = 0; s < NT; s++) {
            const int d = 32 * (s >> 1) + 8 * tq + 4 * (s & 1);
            float x[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                x[i] = g < ng ? qh[d + i] * qs : 0.0f;
#pragma unroll
            for (int i = 0; i < 2; i++) { // hi to row g (a0, a2), lo to row g + 8 (a1, a3)
                const uint32_t hi = ty::pack2<T>(x[2 * i], x[2 * i + 1]);
                const float2 h = tc_unpack(hi, T());
                qf[QS ? 0 : s][2 * i] = hi;
                qf[QS ? 0 : s][2 * i + 1] = ty::pack2<T>(x[2 * i] - h.x, x[2 * i + 1] - h.y);
            }
            if (QS)
                sqf[QS ? s : 0][lane] = make_uint4(qf[0][0], qf[0][1], qf[0][2], qf[0][3]);
        }
    }
    if (QS)
        __syncthreads();

    float acc[NT][4]; // O^T tile i: rows dims 64 (i / 4) + 8 g + 2 (i % 4) (+1), cols 2tq (+1)
#pragma unroll
    for (int i = 0; i < NT; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float m_run = -INFINITY, l_run = 0.0f; // head g's, log2 units; l over this lane's tokens

    if (wb < we) { // warp-uniform
        uint4 kr[2][KC], vr[4][VC];
        uint32_t rk[2], rv[4];
        // TC looks the rows up an iteration before their loads; QS (short of registers) just
        // before them.
        tc_lookup(rk, rv, true, true, table, wb, we, g, tq, pt, page_rows, kh_rows);
        tc_load<T, HD>(kr, vr, true, k_pool, rk, rv, wb, we, g, tq);
        tc_load<T, HD>(kr, vr, false, v_pool, rk, rv, wb, we, g, tq);
        if (!QS)
            tc_lookup(rk, rv, true, true, table, wb + kTcTPI, we, g, tq, pt, page_rows, kh_rows);
        for (int t0 = wb; t0 < we; t0 += kTcTPI) {
            // S for tokens t0 + 8 j + (0..7), then K of the next iteration.
            float s[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
                for (int m = 0; m < KC; m++) {
                    if (QS) {
                        const uint4 f0 = sqf[QS ? 2 * m : 0][lane];
                        const uint4 f1 = sqf[QS ? 2 * m + 1 : 0][lane];
                        const uint32_t q0[4] = {f0.x, f0.y, f0.z, f0.w};
                        const uint32_t q1[4] = {f1.x, f1.y, f1.z, f1.w};
                        ty::mma16816<T>(s[j], q0, kr[j][m].x, kr[j][m].y);
                        ty::mma16816<T>(s[j], q1, kr[j][m].z, kr[j][m].w);
                    } else {
                        ty::mma16816<T>(s[j], qf[QS ? 0 : 2 * m], kr[j][m].x, kr[j][m].y);
                        ty::mma16816<T>(s[j], qf[QS ? 0 : 2 * m + 1], kr[j][m].z, kr[j][m].w);
                    }
                }
            }
            if (QS)
                tc_lookup(rk, rv, true, false, table, t0 + kTcTPI, we, g, tq, pt, page_rows,
                          kh_rows);
            tc_load<T, HD>(kr, vr, true, k_pool, rk, rv, t0 + kTcTPI, we, g, tq);
            // Head g's scores (hi + lo rows) of tokens t0 + tc_vtok(tq, u); -inf past the run.
            float p[4] = {s[0][0] + s[0][2], s[0][1] + s[0][3], s[1][0] + s[1][2],
                          s[1][1] + s[1][3]};
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (t0 + tc_vtok(tq, u) >= we)
                    p[u] = -INFINITY;
            float mx = fmaxf(fmaxf(p[0], p[1]), fmaxf(p[2], p[3]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m_run, mx); // finite: token t0 is in the run
            const float alpha = tc_exp2(m_run - m_new); // 0 on the first iteration
            m_run = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                p[u] = tc_exp2(p[u] - m_new);
                sum += p[u];
            }
            l_run = l_run * alpha + sum;
            // P^T's B fragment: column g of lanes g < 4 = p rounded to T, column g of lanes
            // g >= 4 = the remainders of head g - 4, computed 16 lanes below.
            uint32_t b0 = ty::pack2<T>(p[0], p[1]), b1 = ty::pack2<T>(p[2], p[3]);
            const float2 h0f = tc_unpack(b0, T()), h1f = tc_unpack(b1, T());
            uint32_t r0 = ty::pack2<T>(p[0] - h0f.x, p[1] - h0f.y);
            uint32_t r1 = ty::pack2<T>(p[2] - h1f.x, p[3] - h1f.y);
            r0 = __shfl_xor_sync(0xffffffffu, r0, 16);
            r1 = __shfl_xor_sync(0xffffffffu, r1, 16);
            if (g >= 4) {
                b0 = r0;
                b1 = r1;
            }
            // Rescale: this lane's columns 2tq and 2tq + 1 belong to heads hc and hc + 1.
            const int hc = (2 * tq) & 3;
            const float al0 = __shfl_sync(0xffffffffu, alpha, 4 * hc);
            const float al1 = __shfl_sync(0xffffffffu, alpha, 4 * hc + 4);
#pragma unroll
            for (int i = 0; i < NT; i++) {
                acc[i][0] *= al0;
                acc[i][1] *= al1;
                acc[i][2] *= al0;
                acc[i][3] *= al1;
            }
            // O^T += V^T P^T, then V of the next iteration and the lookups of the one after.
#pragma unroll
            for (int c = 0; c < VC; c++) {
                const uint32_t w[4][4] = {{vr[0][c].x, vr[0][c].y, vr[0][c].z, vr[0][c].w},
                                          {vr[1][c].x, vr[1][c].y, vr[1][c].z, vr[1][c].w},
                                          {vr[2][c].x, vr[2][c].y, vr[2][c].z, vr[2][c].w},
                                          {vr[3][c].x, vr[3][c].y, vr[3][c].z, vr[3][c].w}};
#pragma unroll
                for (int i = 0; i < 4; i++) { // rows: dim 2i (low halves), 2i + 1 (high)
                    const uint32_t av[4] = {__byte_perm(w[0][i], w[1][i], 0x5410),
                                            __byte_perm(w[0][i], w[1][i], 0x7632),
                                            __byte_perm(w[2][i], w[3][i], 0x5410),
                                            __byte_perm(w[2][i], w[3][i], 0x7632)};
                    ty::mma16816<T>(acc[4 * c + i], av, b0, b1);
                }
            }
            if (QS)
                tc_lookup(rk, rv, false, true, table, t0 + kTcTPI, we, g, tq, pt, page_rows,
                          kh_rows);
            tc_load<T, HD>(kr, vr, false, v_pool, rk, rv, t0 + kTcTPI, we, g, tq);
            if (!QS)
                tc_lookup(rk, rv, true, true, table, t0 + 2 * kTcTPI, we, g, tq, pt, page_rows,
                          kh_rows);
        }
    }

    // l over the row's 4 lanes; columns h + 4 (lanes tq = 2, 3) onto columns h (tq = 0, 1).
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[i][e] += __shfl_xor_sync(0xffffffffu, acc[i][e], 2);
    if (tq < 2) {
#pragma unroll
        for (int i = 0; i < NT; i++) {
            const int d = 64 * (i >> 2) + 8 * g + 2 * (i & 3);
            *(float2 *)&red_o[warp][2 * tq][d] = make_float2(acc[i][0], acc[i][2]);
            *(float2 *)&red_o[warp][2 * tq + 1][d] = make_float2(acc[i][1], acc[i][3]);
        }
    }
    if (tq == 0 && g < kFastMaxG) {
        red_m[warp][g] = m_run;
        red_l[warp][g] = l_run;
    }
    __syncthreads();
    fast_combine<HD, kFastMaxG, true>(a, red_o, red_m, red_l, seq, h0, ng, split);
}

// out[seq][h] = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max_s m_s.
__global__ void decode_reduce_kernel(float *out, const float *ws, int n_splits, int hd)
{
    const size_t sh = blockIdx.x;
    const float *w = ws + sh * n_splits * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++)
        M = fmaxf(M, w[s * (hd + 2) + hd]);
    float L = 0.0f;
    for (int s = 0; s < n_splits; s++) {
        const float m = w[s * (hd + 2) + hd];
        L += m == -INFINITY ? 0.0f : w[s * (hd + 2) + hd + 1] * expf(m - M);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float m = w[s * (hd + 2) + hd];
            if (m != -INFINITY)
                o += w[s * (hd + 2) + d] * expf(m - M);
        }
        out[sh * hd + d] = L > 0.0f ? o / L : 0.0f;
    }
}

int sm_count(void)
{
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
        n = 108;
    return n;
}

// ---- fast-path dispatch -------------------------------------------------------------------

template <typename T> using fast_fn = void (*)(decode_args, const T *, const T *);

template <typename T, int HD, int G, int V> fast_fn<T> fast_kernel_of()
{
    using P = fast_var<T, HD, G, V>;
    return decode_fast_kernel<T, HD, G, P::kU, P::kMinBlocks, P::kPrefetch>;
}

// The kernel variant V runs for (T, HD, G): G2 runs U2's kernel (with the plan's G <= 2); TC
// runs decode_tc_kernel for 16-bit pools and BASE's kernel for f32.
template <typename T, int HD, int G> fast_fn<T> pick_fast_g(int variant)
{
    switch (variant) {
    case TY__DECODE_U2:
    case TY__DECODE_G2:
        return fast_kernel_of<T, HD, G, TY__DECODE_U2>();
    case TY__DECODE_NOPF:
        return fast_kernel_of<T, HD, G, TY__DECODE_NOPF>();
    case TY__DECODE_TC:
    case TY__DECODE_TCS:
        if constexpr (sizeof(T) == 2)
            return variant == TY__DECODE_TC ? decode_tc_kernel<T, HD, false>
                                            : decode_tc_kernel<T, HD, true>;
        else
            return fast_kernel_of<T, HD, G, TY__DECODE_BASE>();
    default:
        return fast_kernel_of<T, HD, G, TY__DECODE_BASE>();
    }
}

template <typename T, int HD> fast_fn<T> pick_fast_hd(int G, int variant)
{
    return G == 1   ? pick_fast_g<T, HD, 1>(variant)
           : G == 2 ? pick_fast_g<T, HD, 2>(variant)
           : G == 4 ? pick_fast_g<T, HD, 4>(variant)
                    : nullptr;
}

template <typename T> fast_fn<T> pick_fast(int hd, int G, int variant)
{
    return hd == 64 ? pick_fast_hd<T, 64>(G, variant)
           : hd == 128 ? pick_fast_hd<T, 128>(G, variant)
                       : nullptr;
}

// ---- plan and tuning state ----------------------------------------------------------------

// Whether head_dim has a decode_fast_kernel instance.
bool fast_head_dim(int hd) { return hd == 64 || hd == 128; }

// What ty__attn_decode_set_tune selected (the defaults unless a benchmark set it).
struct decode_tune_state {
    int variant, split_factor, min_split;
};
decode_tune_state g_tune = {kDefaultVariant, kDefaultSplitFactor, kFastMinSplit};

// Blocks of variant's kernel for (hd, G) that fit on one SM, from its bf16 instance (the plan
// must not depend on the dtype: the workspace size does not know it); 1 if the query fails.
int fast_blocks_per_sm(int hd, int G, int variant)
{
    static int known[TY__DECODE_N_VARIANTS][2][3]; // [variant][hd 128][G 1, 2, 4]; 0: not yet
    int &n = known[variant][hd == 128][G == 4 ? 2 : G - 1];
    if (n == 0) {
        const fast_fn<__nv_bfloat16> k = pick_fast<__nv_bfloat16>(hd, G, variant);
        if (!k ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kThreads, 0) != cudaSuccess) {
            (void)cudaGetLastError(); // this call's own error: not for the next launch check
            n = 0;
        }
        if (n <= 0)
            n = 1;
    }
    return n;
}

// Splits for TY__DECODE_SPLIT_FIT, with base blocks per split and slots = blocks per SM x SMs:
// of the counts 1 .. cap (and at most 4 waves), the smallest whose grid fills its waves within
// 3% as well as the best does (fill = blocks / (waves * slots)): equal blocks run in waves, and
// a part-filled last wave leaves SMs idle, while every split adds partials and block starts.
double wave_fill(long blocks, long slots)
{
    const long waves = (blocks + slots - 1) / slots;
    return (double)blocks / (double)(waves * slots);
}
long fit_splits(long base, long cap, long slots)
{
    const long waves4 = (4 * slots + base - 1) / base, top = cap < waves4 ? cap : waves4;
    double best = 0.0;
    for (long c = 1; c <= top; c++)
        best = fmax(best, wave_fill(base * c, slots));
    for (long c = 1; c <= top; c++)
        if (wave_fill(base * c, slots) * 1.03 >= best)
            return c;
    return 1;
}

// Everything the launcher and ty_cuda_attn_decode_workspace must agree on.
struct decode_plan {
    bool fast;            // decode_fast_kernel / decode_tc_kernel (else decode_kernel)
    int variant;          // TY__DECODE_* (fast only)
    int G;                // query heads per block (fast: 1, 2 or 4; else kMaxG)
    int n_groups;         // blocks per KV head: ceil(group / G)
    int n_splits, split_tokens;
};

// decode_kernel: splits so that the grid covers about two waves of SMs, each split >= 256
// tokens, split_tokens a multiple of the tile. Fast path: each split >= min_split (default 256)
// tokens; by default (TY__DECODE_SPLIT_FIT) fit_splits' count, split_tokens a multiple of 16
// (the kernels' warp runs are multiples of 16 tokens either way); with a split_factor, about
// split_factor blocks per SM in all (4: one to two waves of the kernels' 2-4 blocks per SM),
// split_tokens a multiple of 64. G2 caps G at 2; the other variants share G, so the
// tensor-core kernel (any G <= 4) and its f32 fallback agree.
decode_plan plan_decode(const ty_cuda_attn_shape *s, int n_seqs, int max_len)
{
    decode_plan p;
    const int group = s->n_heads >= s->n_kv_heads ? s->n_heads / s->n_kv_heads : 1;
    p.fast = fast_head_dim(s->head_dim);
    p.variant = g_tune.variant;
    const int gmax = p.variant == TY__DECODE_G2 ? 2 : kFastMaxG;
    p.G = !p.fast ? kMaxG : group <= 1 ? 1 : group <= 2 ? 2 : gmax;
    p.n_groups = (group + p.G - 1) / p.G;
    const long base = (long)n_seqs * s->n_kv_heads * p.n_groups;
    long n, per;
    if (p.fast) {
        const long cap = max_len / g_tune.min_split;
        const bool fit = g_tune.split_factor == TY__DECODE_SPLIT_FIT;
        if (fit) {
            const long slots = (long)fast_blocks_per_sm(s->head_dim, p.G, p.variant) * sm_count();
            n = fit_splits(base, cap, slots);
        } else {
            const long want = ((long)g_tune.split_factor * sm_count() + base - 1) / base;
            n = want < cap ? want : cap;
        }
        if (n < 1)
            n = 1;
        const int align = fit ? 16 : 64;
        per = (max_len + n - 1) / n;
        per = (per + align - 1) / align * align;
    } else {
        const long want = (2L * sm_count() + base - 1) / base, cap = (max_len + 255) / 256;
        n = want < cap ? want : cap;
        if (n < 1)
            n = 1;
        per = (max_len + n - 1) / n;
        per = (per + kTile - 1) / kTile * kTile;
    }
    p.split_tokens = per > 0 ? (int)per : kTile;
    p.n_splits = (max_len + p.split_tokens - 1) / p.split_tokens;
    if (p.n_splits < 1)
        p.n_splits = 1;
    return p;
}

// ---- launchers ----------------------------------------------------------------------------

int launch_reduce(const decode_args &a, int n_seqs, cudaStream_t st)
{
    decode_reduce_kernel<<<n_seqs * a.n_heads, 64, 0, st>>>(a.out, a.ws, a.n_splits, a.hd);
    return TY_CUDA_LAUNCH_CHECK("attn_decode reduce");
}

template <typename T>
int launch_fast(fast_fn<T> kern, const decode_args &a, const void *k_pool, const void *v_pool,
                int n_seqs, cudaStream_t st)
{
    dim3 grid(a.n_splits, a.n_kv * a.n_groups, n_seqs);
    kern<<<grid, kThreads, 0, st>>>(a, (const T *)k_pool, (const T *)v_pool);
    return TY_CUDA_LAUNCH_CHECK("attn_decode fast");
}

template <typename T>
int decode_launch(const decode_args &a, const void *k_pool, const void *v_pool, int n_seqs,
                  cudaStream_t st)
{
    const size_t smem = decode_smem(a.hd);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(decode_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem) != cudaSuccess)
        return TY_CUDA_LAUNCH_CHECK("attn_decode smem attribute");
    dim3 grid(a.n_splits, a.n_kv * a.n_groups, n_seqs);
    decode_kernel<T><<<grid, kThreads, smem, st>>>(a, (const T *)k_pool, (const T *)v_pool);
    int rc = TY_CUDA_LAUNCH_CHECK("attn_decode");
    if (rc == 0 && a.n_splits > 1)
        rc = launch_reduce(a, n_seqs, st);
    return rc;
}

// ---- fast-path launch ---------------------------------------------------------------------

template <typename T>
int decode_fast_launch(const decode_args &a, const void *k_pool, const void *v_pool, int n_seqs,
                       cudaStream_t st, int G, int variant)
{
    const fast_fn<T> kern = pick_fast<T>(a.hd, G, variant);
    if (!kern)
        return TY_EINVAL;
    int rc = launch_fast<T>(kern, a, k_pool, v_pool, n_seqs, st);
    if (rc == 0 && a.n_splits > 1)
        rc = launch_reduce(a, n_seqs, st);
    return rc;
}

} // namespace

extern "C" int ty__attn_decode_set_tune(const struct ty__decode_tune *t)
{
    if (!t) {
        g_tune = {kDefaultVariant, kDefaultSplitFactor, kFastMinSplit};
        return 0;
    }
    if (t->variant < 0 || t->variant >= TY__DECODE_N_VARIANTS ||
        (t->split_factor < 0 && t->split_factor != TY__DECODE_SPLIT_FIT) ||
        t->split_factor > 64 || (t->min_split != 0 && (t->min_split < 16 || t->min_split > 65536)))
        return TY_EINVAL;
    g_tune.variant = t->variant ? t->variant : kDefaultVariant;
    g_tune.split_factor = t->split_factor ? t->split_factor : kSplitFactor;
    g_tune.min_split = t->min_split ? t->min_split : kFastMinSplit;
    return 0;
}

extern "C" void ty__attn_decode_get_tune(struct ty__decode_tune *t)
{
    t->variant = g_tune.variant;
    t->split_factor = g_tune.split_factor;
    t->min_split = g_tune.min_split;
}

extern "C" const char *ty__attn_decode_variant_name(int variant)
{
    static const char *const names[TY__DECODE_N_VARIANTS] = {NULL,   "base", "u2", "g2",
                                                             "nopf", "tc",   "tcs"};
    if (variant == TY__DECODE_DEFAULT)
        variant = kDefaultVariant;
    return variant > 0 && variant < TY__DECODE_N_VARIANTS ? names[variant] : NULL;
}

extern "C" size_t ty_cuda_attn_decode_workspace(const struct ty_cuda_attn_shape *s, int n_seqs,
                                                int max_seq_len)
{
    if (!s || s->n_kv_heads <= 0 || s->n_heads <= 0 || n_seqs <= 0 || max_seq_len <= 0)
        return 0;
    const decode_plan p = plan_decode(s, n_seqs, max_seq_len);
    if (p.n_splits == 1)
        return 0;
    return sizeof(float) * (size_t)n_seqs * s->n_heads * p.n_splits * (s->head_dim + 2);
}

extern "C" int ty_cuda_attn_decode(float *out, const float *q, const void *k_pool,
                                   const void *v_pool, const struct ty_cuda_kv_layout *l,
                                   const struct ty_cuda_attn_shape *s,
                                   const int32_t *block_tables, const int32_t *seq_lens,
                                   int n_seqs, int max_seq_len, void *workspace,
                                   ty_cuda_stream_t stream)
{
    int rc = ty__attn_check(l, s);
    if (rc || n_seqs < 0 || max_seq_len <= 0 || max_seq_len > s->max_pages * l->page_tokens)
        return rc ? rc : TY_EINVAL;
    if (n_seqs == 0)
        return 0;
    decode_args a;
    a.out = out;
    a.ws = (float *)workspace;
    a.q = q;
    a.tables = block_tables;
    a.lens = seq_lens;
    a.n_heads = s->n_heads;
    a.n_kv = s->n_kv_heads;
    a.hd = s->head_dim;
    a.page_tokens = l->page_tokens;
    a.max_pages = s->max_pages;
    a.window = s->window;
    a.scale = s->scale;
    const decode_plan p = plan_decode(s, n_seqs, max_seq_len);
    // The fast kernels read K/V with 16-byte loads; a pool that is not 16-byte aligned (never
    // the case for cudaMalloc'd layers) takes the general kernel, with the same split plan so
    // that the workspace size still holds.
    const bool fast = p.fast && (uintptr_t)k_pool % 16 == 0 && (uintptr_t)v_pool % 16 == 0;
    a.n_groups = fast ? p.n_groups : (s->n_heads / s->n_kv_heads + kMaxG - 1) / kMaxG;
    a.n_splits = p.n_splits;
    a.split_tokens = p.split_tokens;
    if (a.n_splits > 1 && !workspace)
        return TY_EINVAL;
    if (fast)
        return TY_DTYPE_DISPATCH(l->type, decode_fast_launch, a, k_pool, v_pool, n_seqs,
                                 (cudaStream_t)stream, p.G, p.variant);
    return TY_DTYPE_DISPATCH(l->type, decode_launch, a, k_pool, v_pool, n_seqs,
                             (cudaStream_t)stream);
}
