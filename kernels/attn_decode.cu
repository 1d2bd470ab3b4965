// Decode attention over paged KV, split along the context (flash-decoding, Dao et al. 2023):
// block (split, kv head x head group, sequence) streams its share of the sequence's pages in
// tiles of up to kTile tokens through shared memory, keeps an online softmax (Milakov &
// Gimelshein 2018) for up to kMaxG query heads that share the KV head, and either writes the
// normalized output (one split) or an unnormalized partial (o, m, l) that the reduce kernel
// combines. K and V are each read once per KV head, which is what makes it bandwidth-bound.
//
// Two kernels: decode_fast_kernel for head_dim 64 and 128 (the common model shapes), which
// streams K/V straight from global memory into registers with 16-byte loads and keeps many of
// them in flight (no barrier in its loop; shared memory only holds q and the final combine);
// and decode_kernel, the general shared-memory-tiled kernel, for every other head_dim. Both
// write the same partials, so the reduce kernel and the workspace layout are shared.
#include "attn_common.cuh"

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
    const int begin = split * a.split_tokens, end = min(len, begin + a.split_tokens);
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

constexpr int kFastWarps = kWarps; // 4 warps, 128 threads
constexpr int kFastMinSplit = 256; // tokens per split at least
constexpr int kFastMaxG = 4;

template <typename T, int HD, int G> struct fast_cfg {
    static constexpr int kVec = 16 / (int)sizeof(T); // elements per 16-byte load
    static constexpr int kEPL = HD / 8;               // elements of a row per lane
    static constexpr int kNC = kEPL / kVec;           // 16-byte loads per lane per row
    // Steps per iteration: 4, or 2 when a lane's row share is 64 bytes (f32, head_dim 128), so
    // that the K+V rows in flight never take more than 64 registers per lane.
    static constexpr int kU = kEPL * (int)sizeof(T) <= 32 ? 4 : 2;
    static constexpr int kTPI = 4 * kU; // tokens per warp iteration
    // Blocks per SM the register budget must allow (255 / 168 / 128 registers for 2 / 3 / 4):
    // the most that compiles without spills (ptxas -v, CUDA 13.0, sm_80 and sm_90a). Per lane,
    // acc takes G * kEPL registers and the K/V rows in flight 8 * kU * kNC.
    static constexpr int kMinBlocks =
        HD == 128 ? (G == 4 ? 2 : G == 2 ? (sizeof(T) == 4 ? 3 : 2) : 4) : (G == 4 ? 3 : 4);
    static_assert(HD % 8 == 0 && kEPL % kVec == 0 && kNC >= 1, "fast decode shape");
};

// 16-byte read-only load that skips L1 (each K/V byte is read once per block) and asks L2 to
// fetch the whole 256-byte line (rows are streamed front to back).
__device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
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
template <typename T, int HD, int U, int NC>
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
                r[u][c] = ld_stream(row + c * 8 * kVec);
        }
    }
}

template <typename T, int HD, int G>
__global__ void __launch_bounds__(kThreads, (fast_cfg<T, HD, G>::kMinBlocks))
    decode_fast_kernel(decode_args a, const T *__restrict__ k_pool, const T *__restrict__ v_pool)
{
    using C = fast_cfg<T, HD, G>;
    constexpr int kVec = C::kVec, NC = C::kNC, U = C::kU, TPI = C::kTPI;
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
    const int begin = split * a.split_tokens, end = min(len, begin + a.split_tokens);
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
        fast_load<T, HD, U, NC>(kr, k_pool, pg, sl, wb, tg, we, page_rows, kh_rows, lane_off);
        fast_load<T, HD, U, NC>(vr, v_pool, pg, sl, wb, tg, we, page_rows, kh_rows, lane_off);
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
            fast_load<T, HD, U, NC>(kr, k_pool, pg, sl, t0 + TPI, tg, we, page_rows, kh_rows,
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
            fast_load<T, HD, U, NC>(vr, v_pool, pg, sl, t0 + TPI, tg, we, page_rows, kh_rows,
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
    // Combine the warps (an empty warp has m = -inf, l = 0, acc = 0) and write.
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
            const float f = mw == -INFINITY ? 0.0f : expf(mw - M);
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
                w[HD] = M;
                w[HD + 1] = L;
            }
        }
    }
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

// Whether head_dim has a decode_fast_kernel instance.
bool fast_head_dim(int hd) { return hd == 64 || hd == 128; }

// Everything the launcher and ty_cuda_attn_decode_workspace must agree on.
struct decode_plan {
    bool fast;            // decode_fast_kernel (else decode_kernel)
    int G;                // query heads per block (fast: 1, 2 or 4; else kMaxG)
    int n_groups;         // blocks per KV head: ceil(group / G)
    int n_splits, split_tokens;
};

// decode_kernel: splits so that the grid covers about two waves of SMs, each split >= 256
// tokens, split_tokens a multiple of the tile. decode_fast_kernel: about four blocks per SM
// (it runs 2-4 per SM, so that is one to two full waves, and many blocks even out sequences of
// different lengths), each split >= kFastMinSplit tokens and a multiple of 64.
decode_plan plan_decode(const ty_cuda_attn_shape *s, int n_seqs, int max_len)
{
    decode_plan p;
    const int group = s->n_heads >= s->n_kv_heads ? s->n_heads / s->n_kv_heads : 1;
    p.fast = fast_head_dim(s->head_dim);
    p.G = !p.fast ? kMaxG : group <= 1 ? 1 : group <= 2 ? 2 : kFastMaxG;
    p.n_groups = (group + p.G - 1) / p.G;
    const long base = (long)n_seqs * s->n_kv_heads * p.n_groups;
    long n, per;
    if (p.fast) {
        const long want = (4L * sm_count() + base - 1) / base, cap = max_len / kFastMinSplit;
        n = want < cap ? want : cap;
        if (n < 1)
            n = 1;
        per = (max_len + n - 1) / n;
        per = (per + 63) / 64 * 64;
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
    if (rc == 0 && a.n_splits > 1) {
        decode_reduce_kernel<<<n_seqs * a.n_heads, 64, 0, st>>>(a.out, a.ws, a.n_splits, a.hd);
        rc = TY_CUDA_LAUNCH_CHECK("attn_decode reduce");
    }
    return rc;
}

template <typename T, int HD, int G>
int decode_fast_launch_g(const decode_args &a, const void *k_pool, const void *v_pool,
                         int n_seqs, cudaStream_t st)
{
    dim3 grid(a.n_splits, a.n_kv * a.n_groups, n_seqs);
    decode_fast_kernel<T, HD, G>
        <<<grid, kThreads, 0, st>>>(a, (const T *)k_pool, (const T *)v_pool);
    return TY_CUDA_LAUNCH_CHECK("attn_decode fast");
}

template <typename T, int HD>
int decode_fast_launch_hd(const decode_args &a, const void *k_pool, const void *v_pool,
                          int n_seqs, cudaStream_t st, int G)
{
    return G == 1   ? decode_fast_launch_g<T, HD, 1>(a, k_pool, v_pool, n_seqs, st)
           : G == 2 ? decode_fast_launch_g<T, HD, 2>(a, k_pool, v_pool, n_seqs, st)
           : G == 4 ? decode_fast_launch_g<T, HD, 4>(a, k_pool, v_pool, n_seqs, st)
                    : TY_EINVAL;
}

template <typename T>
int decode_fast_launch(const decode_args &a, const void *k_pool, const void *v_pool, int n_seqs,
                       cudaStream_t st, int G)
{
    int rc = a.hd == 64    ? decode_fast_launch_hd<T, 64>(a, k_pool, v_pool, n_seqs, st, G)
             : a.hd == 128 ? decode_fast_launch_hd<T, 128>(a, k_pool, v_pool, n_seqs, st, G)
                           : TY_EINVAL;
    if (rc == 0 && a.n_splits > 1) {
        decode_reduce_kernel<<<n_seqs * a.n_heads, 64, 0, st>>>(a.out, a.ws, a.n_splits, a.hd);
        rc = TY_CUDA_LAUNCH_CHECK("attn_decode reduce");
    }
    return rc;
}

} // namespace

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
    a.scale = s->scale;
    const decode_plan p = plan_decode(s, n_seqs, max_seq_len);
    // The fast kernel reads K/V with 16-byte loads; a pool that is not 16-byte aligned (never
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
                                 (cudaStream_t)stream, p.G);
    return TY_DTYPE_DISPATCH(l->type, decode_launch, a, k_pool, v_pool, n_seqs,
                             (cudaStream_t)stream);
}
