// Token sampling on the device, one block per row of logits. Greedy is an argmax reduction.
// Top-k/top-p avoid sorting the vocabulary: each cut is a threshold on the logits found by
// building the threshold's order-preserving 32-bit key one bit at a time (32 counting or mass
// passes over the row), then one scan in index order picks the sample. A whole draw
// (ty_cuda_sample_draws) first applies the host's per-token adjustments (penalties, logit
// bias, bans), adds min-p as one more key, and finds the top log-probabilities by repeated
// argmax, each after the last in (value, index) order.
#include "ty_kernels_impl.cuh"

#include <limits.h>
#include <math.h>

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

// Order-preserving map from float to uint32 (larger float -> larger key; NaN sorts above +inf
// for positive-signed NaN, which the callers never produce from finite logits).
__device__ __forceinline__ uint32_t fkey(float x)
{
    uint32_t b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

struct argmax_t {
    float v;
    int i;
};

__device__ __forceinline__ argmax_t better(argmax_t a, argmax_t b)
{
    if (b.v > a.v || (b.v == a.v && b.i < a.i) || (a.i < 0 && b.i >= 0))
        return b;
    return a;
}

// Block-wide argmax (lowest index among equal maxima). All threads get the result.
__device__ argmax_t block_argmax(argmax_t a)
{
    __shared__ argmax_t sh[kWarps];
    for (int off = 16; off > 0; off >>= 1) {
        argmax_t o;
        o.v = __shfl_xor_sync(0xffffffffu, a.v, off);
        o.i = __shfl_xor_sync(0xffffffffu, a.i, off);
        a = better(a, o);
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = a;
    __syncthreads();
    argmax_t r = sh[0];
    for (int w = 1; w < kWarps; w++)
        r = better(r, sh[w]);
    return r;
}

__device__ float block_sum(float v)
{
    __shared__ float sh[kWarps];
    v = ty::warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = 0.0f;
    for (int w = 0; w < kWarps; w++)
        r += sh[w];
    return r;
}

// Exclusive prefix sum of one value per thread, in thread order.
__device__ float block_exclusive_scan(float v, float *total)
{
    __shared__ float sh[kWarps];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float inc = v;
    for (int off = 1; off < 32; off <<= 1) {
        float o = __shfl_up_sync(0xffffffffu, inc, off);
        if (lane >= off)
            inc += o;
    }
    __syncthreads();
    if (lane == 31)
        sh[warp] = inc;
    __syncthreads();
    float before = 0.0f, all = 0.0f;
    for (int w = 0; w < kWarps; w++) {
        if (w < warp)
            before += sh[w];
        all += sh[w];
    }
    *total = all;
    return before + inc - v;
}

__device__ argmax_t row_argmax(const float *x, int vocab)
{
    argmax_t a = {-INFINITY, -1};
    for (int i = threadIdx.x; i < vocab; i += kThreads)
        a = better(a, argmax_t{x[i], i});
    return block_argmax(a);
}

__global__ void __launch_bounds__(kThreads) greedy_kernel(int32_t *ids, const float *logits,
                                                          int vocab)
{
    argmax_t a = row_argmax(logits + (size_t)blockIdx.x * vocab, vocab);
    if (threadIdx.x == 0)
        ids[blockIdx.x] = a.i < 0 ? 0 : a.i;
}

// Largest key K with count(key(x_i) >= K) >= k.
__device__ uint32_t topk_threshold(const float *x, int vocab, float inv_t, int k)
{
    uint32_t key = 0;
    for (int bit = 31; bit >= 0; bit--) {
        const uint32_t cand = key | (1u << bit);
        float cnt = 0.0f;
        for (int i = threadIdx.x; i < vocab; i += kThreads)
            cnt += fkey(x[i] * inv_t) >= cand ? 1.0f : 0.0f;
        if (block_sum(cnt) >= (float)k)
            key = cand;
    }
    return key;
}

// Largest key P with mass(key(x_i) >= max(P, floor)) >= target.
__device__ uint32_t topp_threshold(const float *x, int vocab, float inv_t, float m,
                                   uint32_t floor, float target)
{
    uint32_t key = 0;
    for (int bit = 31; bit >= 0; bit--) {
        const uint32_t cand = key | (1u << bit);
        const uint32_t cut = cand > floor ? cand : floor;
        float mass = 0.0f;
        for (int i = threadIdx.x; i < vocab; i += kThreads) {
            const float xi = x[i] * inv_t;
            mass += fkey(xi) >= cut ? expf(xi - m) : 0.0f;
        }
        if (block_sum(mass) >= target)
            key = cand;
    }
    return key > floor ? key : floor;
}

// Picks the first index where the running kept mass (index order) exceeds u * total.
__device__ int pick_in_order(const float *x, int vocab, float inv_t, float m, uint32_t cut,
                             float u)
{
    __shared__ int pick;
    const int chunk = (vocab + kThreads - 1) / kThreads;
    const int c0 = min(vocab, (int)threadIdx.x * chunk), c1 = min(vocab, c0 + chunk);
    float s = 0.0f;
    int last = -1;
    for (int i = c0; i < c1; i++) {
        const float xi = x[i] * inv_t;
        if (fkey(xi) >= cut) {
            s += expf(xi - m);
            last = i;
        }
    }
    float total;
    const float before = block_exclusive_scan(s, &total);
    if (threadIdx.x == 0)
        pick = INT_MAX;
    __syncthreads();
    const float target = u * total;
    if (s > 0.0f && before <= target && target < before + s) {
        float run = before;
        int hit = last; /* rounding may leave run just under target at the chunk's end */
        for (int i = c0; i < c1; i++) {
            const float xi = x[i] * inv_t;
            if (fkey(xi) < cut)
                continue;
            run += expf(xi - m);
            if (run > target) {
                hit = i;
                break;
            }
        }
        atomicMin(&pick, hit);
    }
    __syncthreads();
    if (pick == INT_MAX) { /* rounding put the target past the end: the last kept index */
        __syncthreads();
        if (threadIdx.x == 0)
            pick = -1;
        __syncthreads();
        if (last >= 0)
            atomicMax(&pick, last);
        __syncthreads();
    }
    return pick;
}

// The row's cut for top-k, top-p and min-p in the temperature-scaled space (x * inv_t, max m):
// the key a token must reach to be kept (0: all kept). top_p in [0, 1) cuts (0: the best
// alone), 1 is off.
__device__ uint32_t draw_cut(const float *x, int vocab, float inv_t, float m, int k, float p,
                             float min_p)
{
    uint32_t cut = 0;
    if (k >= 1 && k < vocab)
        cut = topk_threshold(x, vocab, inv_t, k);
    if (p < 1.0f) {
        float z = 0.0f;
        for (int i = threadIdx.x; i < vocab; i += kThreads) {
            const float xi = x[i] * inv_t;
            z += fkey(xi) >= cut ? expf(xi - m) : 0.0f;
        }
        z = block_sum(z);
        cut = topp_threshold(x, vocab, inv_t, m, cut, p * z);
    }
    if (min_p > 0.0f) { // p_i >= min_p * p_max  <=>  x_i >= m + log(min_p)
        const uint32_t mk = fkey(m + logf(min_p));
        cut = mk > cut ? mk : cut;
    }
    return cut;
}

// The sample of a row whose argmax is a: the argmax at temperature t <= 0, else the draw with u
// among the tokens draw_cut keeps (top_p as draw_cut takes it).
__device__ int sample_row(const float *x, int vocab, argmax_t a, float t, int k, float p,
                          float min_p, float u)
{
    const int best = a.i < 0 ? 0 : a.i;
    if (!(t > 0.0f))
        return best;
    const float inv_t = 1.0f / t, m = a.v * inv_t;
    const uint32_t cut = draw_cut(x, vocab, inv_t, m, k, p, min_p);
    u = u < 0.0f ? 0.0f : (u >= 1.0f ? 0.99999994f : u);
    const int pick = pick_in_order(x, vocab, inv_t, m, cut, u);
    return pick < 0 ? best : pick;
}

__global__ void __launch_bounds__(kThreads)
    topkp_kernel(int32_t *ids, const float *logits, const float *temp, const int32_t *top_k,
                 const float *top_p, const float *u, int vocab)
{
    const int r = blockIdx.x;
    const float *x = logits + (size_t)r * vocab;
    const int id = sample_row(x, vocab, row_argmax(x, vocab), temp[r], top_k[r],
                              fmaxf(top_p[r], 0.0f), 0.0f, u[r]);
    if (threadIdx.x == 0)
        ids[r] = id;
}

// The best of x after `prev` in (value descending, index ascending) order (prev.i < 0: the
// best of all); NaN never taken.
__device__ argmax_t row_next_best(const float *x, int vocab, argmax_t prev)
{
    argmax_t a = {-INFINITY, -1};
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
        const float v = x[i];
        if (prev.i < 0 || v < prev.v || (v == prev.v && i > prev.i))
            a = better(a, argmax_t{v, i});
    }
    return block_argmax(a);
}

__global__ void __launch_bounds__(kThreads)
    draws_kernel(ty_cuda_draw_out *out, float *logits, const ty_cuda_draw *draws,
                 const ty_cuda_logit_adj *adj, int vocab)
{
    const int r = blockIdx.x;
    float *x = logits + (size_t)r * vocab;
    const ty_cuda_draw d = draws[r];
    for (int j = threadIdx.x; j < d.n_adj; j += kThreads) { // one entry per token: no races
        const ty_cuda_logit_adj a = adj[d.adj_begin + j];
        if (a.id < 0 || a.id >= vocab)
            continue;
        float l = x[a.id];
        if (a.rep != 1.0f)
            l = l > 0.0f ? l / a.rep : l * a.rep;
        l -= a.sub;
        l += a.bias;
        x[a.id] = l;
    }
    __syncthreads();
    const argmax_t a = row_argmax(x, vocab);
    const float p = d.top_p > 0.0f && d.top_p < 1.0f ? d.top_p : 1.0f; // else off
    const int id = sample_row(x, vocab, a, d.temperature, d.top_k, p, d.min_p, d.u);
    const int n_top = d.n_top < 0 ? 0 : (d.n_top > TY_CUDA_MAX_TOP ? TY_CUDA_MAX_TOP : d.n_top);
    float lse = 0.0f;
    if (d.logprob || n_top) { // log-softmax of the adjusted row at temperature 1
        float z = 0.0f;
        for (int i = threadIdx.x; i < vocab; i += kThreads)
            z += expf(x[i] - a.v);
        lse = a.v + logf(block_sum(z));
    }
    argmax_t prev = {0.0f, -1};
    int got = 0;
    for (int k = 0; k < n_top && k < vocab; k++) {
        prev = row_next_best(x, vocab, prev);
        if (prev.i < 0)
            break;
        if (threadIdx.x == 0) {
            out[r].top_id[k] = prev.i;
            out[r].top_lp[k] = prev.v - lse;
        }
        got++;
    }
    if (threadIdx.x == 0) {
        out[r].id = id;
        out[r].logprob = d.logprob || n_top ? x[id] - lse : 0.0f;
        out[r].n_top = got;
    }
}

} // namespace

extern "C" int ty_cuda_sample_draws(ty_cuda_draw_out *out, float *logits,
                                    const ty_cuda_draw *draws, const ty_cuda_logit_adj *adj,
                                    int n_rows, int vocab, ty_cuda_stream_t stream)
{
    if (n_rows < 0 || vocab <= 0)
        return TY_EINVAL;
    if (n_rows == 0)
        return 0;
    draws_kernel<<<n_rows, kThreads, 0, (cudaStream_t)stream>>>(out, logits, draws, adj, vocab);
    return TY_CUDA_LAUNCH_CHECK("sample_draws");
}

extern "C" int ty_cuda_sample_greedy(int32_t *ids, const float *logits, int n_rows, int vocab,
                                     ty_cuda_stream_t stream)
{
    if (n_rows < 0 || vocab <= 0)
        return TY_EINVAL;
    if (n_rows == 0)
        return 0;
    greedy_kernel<<<n_rows, kThreads, 0, (cudaStream_t)stream>>>(ids, logits, vocab);
    return TY_CUDA_LAUNCH_CHECK("sample_greedy");
}

extern "C" int ty_cuda_sample_topkp(int32_t *ids, const float *logits, const float *temp,
                                    const int32_t *top_k, const float *top_p, const float *u,
                                    int n_rows, int vocab, ty_cuda_stream_t stream)
{
    if (n_rows < 0 || vocab <= 0)
        return TY_EINVAL;
    if (n_rows == 0)
        return 0;
    topkp_kernel<<<n_rows, kThreads, 0, (cudaStream_t)stream>>>(ids, logits, temp, top_k, top_p,
                                                                u, vocab);
    return TY_CUDA_LAUNCH_CHECK("sample_topkp");
}
