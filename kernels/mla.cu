// Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434 §2.1) in the absorbed form the
// CPU backend computes (src/engine/cpu/mla.c): the pool holds, per token, one row of R + P
// values (the RMS-normed latent, then the roped shared key), its first half in the page's K
// array and its second half in the V array (a kv layout with one kv head of (R + P) / 2).
//
// mla_rope_store: one block per token for the latent row (RMSNorm with the CPU's double sum of
// squares, then rope of the last P values, stored rounded to the pool type), and blocks of one
// thread per (head, rope pair) for the queries' rope part. Rope as qkv.cu: ggml's f32 angle
// recurrence, products rounded one by one (no FMA contraction), YaRN on top when its table is
// given, so that the angles follow the CPU backend to the last bit.
//
// mla_attn: multi-query attention of the absorbed queries over the latent rows. One block per
// (row, group of HPB heads): the group's queries are staged in shared memory, each of the
// block's warps takes keys round-robin and reads each key's row once for all the group's heads
// (a lane holds 4 consecutive values per 128-value chunk of the row), with an online softmax
// (running max, sum, and the R-value accumulator spread over the lanes). The warps' partial
// results are merged at the end through shared memory in warp order (deterministic). No host
// sync, no allocation: capturable in a CUDA graph.
#include "attn_common.cuh"

#include <math.h>

namespace {

constexpr int kRopeThreads = 128;
constexpr int kAttnWarps = 8;
constexpr int kMaxRow = 1024; // R + P: at most 8 chunks of 128 values per row

struct mla_params {
    int n_heads, R, P, N, hh, page_tokens, neox;
    float theta_scale, norm_eps;
    float yarn_freq_scale, yarn_mscale; // used where the mix table is not NULL
};

// cos and sin of rope pair i at position pos (ty::rope_cos_sin, as qkv.cu).
__device__ __forceinline__ void rope_cs(int pos, int i, const float *freq_div,
                                        const float *yarn_mix, const mla_params &p, float &c,
                                        float &s)
{
    ty::rope_cos_sin(pos, i, p.theta_scale, freq_div, yarn_mix, p.yarn_freq_scale,
                     p.yarn_mscale, c, s);
}

// Element e (0 <= e < 2 hh) of a pool row whose halves start at k and v.
template <typename T>
__device__ __forceinline__ void store_elem(T *k, T *v, int hh, int e, float x)
{
    if (e < hh)
        k[e] = ty::from_f32<T>(x);
    else
        v[e - hh] = ty::from_f32<T>(x);
}

// grid (n_tokens, 1 + q blocks). blockIdx.y 0: token t's latent row into the pool; y >= 1:
// thread (y - 1) * blockDim.x + x takes rope pair (head, i) of token t's query.
template <typename T>
__global__ void __launch_bounds__(kRopeThreads)
    mla_rope_store_kernel(float *q, const float *qf, const float *kv, const float *norm,
                          T *k_pool, T *v_pool, const float *freq_div, const float *yarn_mix,
                          const int32_t *pos, const int32_t *slots, mla_params p)
{
    __shared__ double red[kRopeThreads / 32];
    const int t = blockIdx.x, half = p.P / 2, RP = p.R + p.P;
    if (blockIdx.y > 0) {
        const int idx = (int)(blockIdx.y - 1) * (int)blockDim.x + (int)threadIdx.x;
        if (idx >= p.n_heads * half)
            return;
        const int h = idx / half, i = idx % half;
        float c, s;
        rope_cs(pos[t], i, freq_div, yarn_mix, p, c, s);
        const float *src = qf + ((size_t)t * p.n_heads + h) * (p.N + p.P) + p.N;
        float *dst = q + ((size_t)t * p.n_heads + h) * RP + p.R;
        const int a = p.neox ? i : 2 * i, b = p.neox ? i + half : 2 * i + 1;
        const float x0 = src[a], x1 = src[b];
        dst[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        dst[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        return;
    }
    const int slot = slots[t];
    if (slot < 0) // uniform over the block: no barrier is skipped by part of it
        return;
    const float *x = kv + (size_t)t * RP;
    // the CPU's ty__cpu_rmsnorm: sum of squares in double (each square exact in double)
    double ss = 0.0;
    for (int i = threadIdx.x; i < p.R; i += blockDim.x)
        ss += (double)x[i] * (double)x[i];
    for (int off = 16; off > 0; off >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = ss;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < (int)(blockDim.x + 31) / 32; w++)
        total += red[w];
    const float scale =
        __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(total / (double)p.R), p.norm_eps)));
    const size_t base = ((size_t)(slot / p.page_tokens) * p.page_tokens + slot % p.page_tokens) *
                        (size_t)p.hh; // one kv head
    T *kd = k_pool + base, *vd = v_pool + base;
    for (int i = threadIdx.x; i < p.R; i += blockDim.x)
        store_elem(kd, vd, p.hh, i, __fmul_rn(__fmul_rn(x[i], scale), norm[i]));
    const float *pe = x + p.R;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float c, s;
        rope_cs(pos[t], i, freq_div, yarn_mix, p, c, s);
        const int a = p.neox ? i : 2 * i, b = p.neox ? i + half : 2 * i + 1;
        const float x0 = pe[a], x1 = pe[b];
        store_elem(kd, vd, p.hh, p.R + a, __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
        store_elem(kd, vd, p.hh, p.R + b, __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
    }
}

template <typename T>
int rope_store_launch(float *q, const float *qf, const float *kv, const float *norm,
                      void *k_pool, void *v_pool, const struct ty_cuda_mla *m,
                      const int32_t *pos, const int32_t *slots, int n_tokens,
                      const mla_params &p, cudaStream_t st)
{
    const unsigned qblocks = ty::ceil_div((size_t)p.n_heads * (p.P / 2), kRopeThreads);
    dim3 grid((unsigned)n_tokens, 1u + qblocks);
    mla_rope_store_kernel<T><<<grid, kRopeThreads, 0, st>>>(q, qf, kv, norm, (T *)k_pool,
                                                            (T *)v_pool, m->freq_div,
                                                            m->yarn_mix, pos, slots, p);
    return TY_CUDA_LAUNCH_CHECK("mla_rope_store");
}

// Heads per block: their accumulators (HPB * NC float4 per lane) stay in registers.
__host__ __device__ constexpr int mla_heads_per_block(int nc) { return nc <= 5 ? 4 : 2; }

// grid (n_rows, ceil(H / HPB)), kAttnWarps warps. NC = ceil((R + P) / 128) chunks per row.
template <typename T, int NC>
__global__ void __launch_bounds__(kAttnWarps * 32)
    mla_attn_kernel(float *out, const float *q, const T *k_pool, const T *v_pool,
                    const int32_t *pos, ty_cuda_attn_rows r, int H, int R, int RP, int hh, int B,
                    float scale)
{
    constexpr int HPB = mla_heads_per_block(NC), W = NC * 128; // W: padded row length
    // the group's queries (zero past RP and for heads past H); after the key loop, the merged
    // accumulators
    __shared__ __align__(16) float qs[HPB * W];
    __shared__ float wm[kAttnWarps][HPB], wl[kAttnWarps][HPB], sm[HPB], sl[HPB];
    const int row = blockIdx.x, h0 = blockIdx.y * HPB;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < HPB * W; i += blockDim.x) {
        const int hq = i / W, e = i % W;
        qs[i] = h0 + hq < H && e < RP ? q[((size_t)row * H + h0 + hq) * RP + e] : 0.0f;
    }
    const int32_t *tab = ty::row_table(r, row);
    const int last = pos[row]; // keys 0 .. last (no window)
    __syncthreads();

    float m[HPB], l[HPB];
    float4 acc[HPB][NC];
#pragma unroll
    for (int hq = 0; hq < HPB; hq++) {
        m[hq] = -INFINITY;
        l[hq] = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++)
            acc[hq][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    for (int j = warp; j <= last; j += kAttnWarps) {
        const size_t base = ((size_t)tab[j / B] * B + j % B) * (size_t)hh;
        float4 v[NC];
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int e = c * 128 + 4 * lane; // hh % 4 == 0: a float4 never straddles halves
            v[c] = e >= RP   ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                   : e < hh ? ty::load4(k_pool + base + e)
                            : ty::load4(v_pool + base + (e - hh));
        }
#pragma unroll
        for (int hq = 0; hq < HPB; hq++) {
            float d = 0.0f;
#pragma unroll
            for (int c = 0; c < NC; c++)
                d += ty::dot4(*(const float4 *)(qs + hq * W + c * 128 + 4 * lane), v[c]);
            const float s = ty::warp_sum(d) * scale; // the same in every lane
            const float mn = fmaxf(m[hq], s);
            const float a = expf(m[hq] - mn), pe = expf(s - mn); // a = 0 for the first key
            l[hq] = l[hq] * a + pe;
            m[hq] = mn;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                acc[hq][c].x = acc[hq][c].x * a + pe * v[c].x;
                acc[hq][c].y = acc[hq][c].y * a + pe * v[c].y;
                acc[hq][c].z = acc[hq][c].z * a + pe * v[c].z;
                acc[hq][c].w = acc[hq][c].w * a + pe * v[c].w;
            }
        }
    }

    // merge the warps: common max, total sum, accumulators rescaled and added in warp order
    if (lane == 0) {
#pragma unroll
        for (int hq = 0; hq < HPB; hq++) {
            wm[warp][hq] = m[hq];
            wl[warp][hq] = l[hq];
        }
    }
    __syncthreads(); // every warp is done with qs too
    if (threadIdx.x < HPB) {
        float M = -INFINITY, L = 0.0f;
        for (int w = 0; w < kAttnWarps; w++)
            M = fmaxf(M, wm[w][threadIdx.x]);
        for (int w = 0; w < kAttnWarps; w++) // an idle warp: exp(-inf) * 0 = 0
            L += wl[w][threadIdx.x] * expf(wm[w][threadIdx.x] - M);
        sm[threadIdx.x] = M; // finite: key 0 is always seen (by warp 0)
        sl[threadIdx.x] = L;
    }
    __syncthreads();
    for (int w = 0; w < kAttnWarps; w++) {
        if (warp == w) {
#pragma unroll
            for (int hq = 0; hq < HPB; hq++) {
                const float f = expf(m[hq] - sm[hq]); // 0 for an idle warp
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    const int e = c * 128 + 4 * lane;
                    if (e >= R)
                        continue;
                    float4 *d = (float4 *)(qs + hq * W + e);
                    const float4 x = acc[hq][c];
                    float4 y = make_float4(x.x * f, x.y * f, x.z * f, x.w * f);
                    if (w > 0) {
                        const float4 o = *d;
                        y = make_float4(o.x + y.x, o.y + y.y, o.z + y.z, o.w + y.w);
                    }
                    *d = y;
                }
            }
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < HPB * R; i += blockDim.x) {
        const int hq = i / R, e = i % R;
        if (h0 + hq < H)
            out[((size_t)row * H + h0 + hq) * R + e] = qs[hq * W + e] / sl[hq];
    }
}

template <typename T, int NC>
int attn_launch_nc(float *out, const float *q, const void *k_pool, const void *v_pool,
                   const ty_cuda_attn_rows &r, const int32_t *pos, int n_rows, int H, int R,
                   int RP, int B, float scale, cudaStream_t st)
{
    constexpr int HPB = mla_heads_per_block(NC);
    dim3 grid((unsigned)n_rows, ty::ceil_div((size_t)H, HPB));
    mla_attn_kernel<T, NC><<<grid, kAttnWarps * 32, 0, st>>>(
        out, q, (const T *)k_pool, (const T *)v_pool, pos, r, H, R, RP, RP / 2, B, scale);
    return TY_CUDA_LAUNCH_CHECK("mla_attn");
}

template <typename T>
int attn_launch(float *out, const float *q, const void *k_pool, const void *v_pool,
                const ty_cuda_attn_rows &r, const int32_t *pos, int n_rows, int H, int R, int RP,
                int B, float scale, cudaStream_t st)
{
    using launch_fn = int (*)(float *, const float *, const void *, const void *,
                              const ty_cuda_attn_rows &, const int32_t *, int, int, int, int, int,
                              float, cudaStream_t);
    static constexpr launch_fn by_nc[] = {attn_launch_nc<T, 1>, attn_launch_nc<T, 2>,
                                          attn_launch_nc<T, 3>, attn_launch_nc<T, 4>,
                                          attn_launch_nc<T, 5>, attn_launch_nc<T, 6>,
                                          attn_launch_nc<T, 7>, attn_launch_nc<T, 8>};
    const int nc = (RP + 127) / 128; // 128-value chunks per row
    if (nc < 1 || nc > 8)
        return TY_EINVAL;
    return by_nc[nc - 1](out, q, k_pool, v_pool, r, pos, n_rows, H, R, RP, B, scale, st);
}

// Shape checks shared by both entry points: one kv head of (R + P) / 2 per pool row.
int mla_check(const struct ty_cuda_kv_layout *l, const struct ty_cuda_mla *m)
{
    if (!l || !m || m->n_heads <= 0 || m->kv_lora_rank <= 0 || m->rope_dim <= 0 ||
        m->rope_dim % 2 || m->qk_nope_dim < 0)
        return TY_EINVAL;
    const long long RP = (long long)m->kv_lora_rank + m->rope_dim;
    if (RP % 2 || l->n_kv_heads != 1 || (long long)l->head_dim * 2 != RP ||
        l->page_tokens <= 0 || !ty_cuda_dtype_size(l->type))
        return TY_EINVAL;
    return 0;
}

} // namespace

extern "C" int ty_cuda_mla_rope_store(float *q, const float *qf, const float *kv,
                                      const float *norm, void *k_pool, void *v_pool,
                                      const struct ty_cuda_kv_layout *l, const int32_t *pos,
                                      const int32_t *slots, int n_tokens,
                                      const struct ty_cuda_mla *m, ty_cuda_stream_t stream)
{
    if (mla_check(l, m) || n_tokens < 0 || !m->freq_div || !norm ||
        !(m->theta_scale > 0.0f) || !(m->norm_eps >= 0.0f) ||
        (m->yarn_mix && !(m->yarn_freq_scale > 0.0f && m->yarn_mscale > 0.0f)))
        return TY_EINVAL;
    if ((long long)m->n_heads * (m->rope_dim / 2) > 65534LL * kRopeThreads) // grid.y
        return TY_EINVAL;
    if (n_tokens == 0)
        return 0;
    mla_params p = {m->n_heads,
                    m->kv_lora_rank,
                    m->rope_dim,
                    m->qk_nope_dim,
                    l->head_dim,
                    l->page_tokens,
                    m->neox != 0,
                    m->theta_scale,
                    m->norm_eps,
                    m->yarn_freq_scale,
                    m->yarn_mscale};
    return TY_DTYPE_DISPATCH(l->type, rope_store_launch, q, qf, kv, norm, k_pool, v_pool, m, pos,
                             slots, n_tokens, p, (cudaStream_t)stream);
}

extern "C" int ty_cuda_mla_attn(float *out, const float *q, const void *k_pool,
                                const void *v_pool, const struct ty_cuda_kv_layout *l,
                                const struct ty_cuda_mla *m, float scale, const int32_t *pos,
                                int n_rows, const struct ty_cuda_attn_rows *r,
                                ty_cuda_stream_t stream)
{
    if (mla_check(l, m) || !r || n_rows < 0)
        return TY_EINVAL;
    const int R = m->kv_lora_rank, RP = R + m->rope_dim;
    // float4 loads: a row's halves and its latent part are whole groups of 4 values
    if (RP > kMaxRow || R % 4 || (RP / 2) % 4 || m->n_heads > 65535)
        return TY_EINVAL;
    if (r->n_decode < 0 || r->n_chunks < 0 || r->n_decode > n_rows ||
        (r->n_chunks > 0 &&
         (!r->chunk_tables || !r->chunk_q_starts || r->chunk_max_pages <= 0)) ||
        (r->n_decode > 0 && (!r->decode_tables || r->decode_max_pages <= 0)) ||
        (r->n_decode < n_rows && r->n_chunks == 0))
        return TY_EINVAL;
    if (n_rows == 0)
        return 0;
    return TY_DTYPE_DISPATCH(l->type, attn_launch, out, q, k_pool, v_pool, *r, pos, n_rows,
                             m->n_heads, R, RP, l->page_tokens, scale, (cudaStream_t)stream);
}
