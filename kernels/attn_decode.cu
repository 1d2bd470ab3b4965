// Decode attention over paged KV, split along the context (flash-decoding, Dao et al. 2023):
// block (split, kv head x head group, sequence) streams its share of the sequence's pages in
// tiles of up to kTile tokens through shared memory, keeps an online softmax (Milakov &
// Gimelshein 2018) for up to kMaxG query heads that share the KV head, and either writes the
// normalized output (one split) or an unnormalized partial (o, m, l) that the reduce kernel
// combines. K and V are each read once per KV head, which is what makes it bandwidth-bound.
#include "attn_common.cuh"

#include <math.h>

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

// Splits so that the grid covers about two waves of SMs, each split >= 256 tokens.
void plan_splits(const ty_cuda_attn_shape *s, int n_seqs, int max_len, int *n_splits,
                 int *split_tokens)
{
    const int groups = (s->n_heads / s->n_kv_heads + kMaxG - 1) / kMaxG;
    const long base = (long)n_seqs * s->n_kv_heads * groups;
    long want = (2L * sm_count() + base - 1) / base;
    long cap = (max_len + 255) / 256;
    long n = want < cap ? want : cap;
    if (n < 1)
        n = 1;
    int per = (int)((max_len + n - 1) / n);
    per = (per + kTile - 1) / kTile * kTile;
    *split_tokens = per > 0 ? per : kTile;
    *n_splits = (max_len + *split_tokens - 1) / *split_tokens;
    if (*n_splits < 1)
        *n_splits = 1;
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

} // namespace

extern "C" size_t ty_cuda_attn_decode_workspace(const struct ty_cuda_attn_shape *s, int n_seqs,
                                                int max_seq_len)
{
    if (!s || s->n_kv_heads <= 0 || s->n_heads <= 0 || n_seqs <= 0 || max_seq_len <= 0)
        return 0;
    int n_splits, per;
    plan_splits(s, n_seqs, max_seq_len, &n_splits, &per);
    if (n_splits == 1)
        return 0;
    return sizeof(float) * (size_t)n_seqs * s->n_heads * n_splits * (s->head_dim + 2);
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
    a.n_groups = (s->n_heads / s->n_kv_heads + kMaxG - 1) / kMaxG;
    a.scale = s->scale;
    plan_splits(s, n_seqs, max_seq_len, &a.n_splits, &a.split_tokens);
    if (a.n_splits > 1 && !workspace)
        return TY_EINVAL;
    return TY_DTYPE_DISPATCH(l->type, decode_launch, a, k_pool, v_pool, n_seqs,
                             (cudaStream_t)stream);
}
