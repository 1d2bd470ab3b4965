// Mixture-of-experts FFN pieces (Qwen3-MoE, Mixtral, gpt-oss, DeepSeek-V2/V3; the CPU backend's
// moe_route and moe_ffn in src/engine/cpu/forward.c): the routing of each token (softmax over
// the router logits, the n_used most probable with ties to the lower index, renormalised when
// asked; gpt-oss's k largest logits and their softmax; or DeepSeek's sigmoid/softmax scores
// with a selection bias and group pruning), a matrix-vector
// product per (token, slot) through the picked expert's rows, and the weighted sum of each
// token's slots into the residual in slot order. The expert products read the weights of the
// expert each slot names, so no host round trip (and no per-expert row counts on the host) is
// needed: a decode step stays capturable in a CUDA graph. Long prefill steps group the slots
// by expert on the host and run per-expert GEMMs instead (forward_cuda.c moe_grouped), then
// sum the slots through a row index (combine with rows).
#include "ty_kernels_impl.cuh"

#include <math.h>

namespace {

constexpr int kRouteThreads = 128;
constexpr int kWarps = 4; // rows per block in moe_matvec

// One thread per token: logits row (n_experts) overwritten by its softmax (then marked taken).
__global__ void route_kernel(int32_t *sel, float *w, float *logits, int n_tokens, int E, int K,
                             int norm_topk)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tokens)
        return;
    float *p = logits + (size_t)t * E;
    float mx = -INFINITY;
    for (int e = 0; e < E; e++)
        mx = p[e] > mx ? p[e] : mx;
    double sum = 0;
    for (int e = 0; e < E; e++) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < E; e++)
        p[e] = __fmul_rn(p[e], inv);
    float wsum = 0.0f;
    for (int k = 0; k < K; k++) {
        int best = 0;
        for (int e = 1; e < E; e++)
            best = p[e] > p[best] ? e : best;
        sel[(size_t)t * K + k] = best;
        w[(size_t)t * K + k] = p[best];
        wsum = __fadd_rn(wsum, p[best]);
        p[best] = -INFINITY; // taken
    }
    if (norm_topk) { // at least 2^-14, as llama.cpp's build_moe_ffn clamps
        wsum = wsum > 6.103515625e-5f ? wsum : 6.103515625e-5f;
        for (int k = 0; k < K; k++)
            w[(size_t)t * K + k] = __fdiv_rn(w[(size_t)t * K + k], wsum);
    }
}

// gpt-oss: the k largest of logits + bias, their softmax the weights (the CPU's top_k on the
// raw logits, then softmax_row over the k picks, then norm_weights when asked).
__global__ void route_topk_softmax_kernel(int32_t *sel, float *w, float *logits,
                                          const float *bias, int n_tokens, int E, int K,
                                          int norm_topk)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tokens)
        return;
    float *p = logits + (size_t)t * E, *wt = w + (size_t)t * K;
    for (int e = 0; bias && e < E; e++)
        p[e] = __fadd_rn(p[e], bias[e]);
    float wsum = 0.0f;
    for (int k = 0; k < K; k++) {
        int best = 0;
        for (int e = 1; e < E; e++)
            best = p[e] > p[best] ? e : best;
        sel[(size_t)t * K + k] = best;
        wt[k] = p[best];
        wsum = __fadd_rn(wsum, p[best]);
        p[best] = -INFINITY;
    }
    float mx = -INFINITY;
    for (int k = 0; k < K; k++)
        mx = wt[k] > mx ? wt[k] : mx;
    double sum = 0;
    for (int k = 0; k < K; k++) {
        wt[k] = expf(wt[k] - mx);
        sum += wt[k];
    }
    const float inv = (float)(1.0 / sum);
    for (int k = 0; k < K; k++)
        wt[k] = __fmul_rn(wt[k], inv);
    if (norm_topk) {
        wsum = wsum > 6.103515625e-5f ? wsum : 6.103515625e-5f;
        for (int k = 0; k < K; k++)
            wt[k] = __fdiv_rn(wt[k], wsum);
    }
}

constexpr int kMaxRouteExperts = 256; // the CPU's TY_MODEL_MAX_EXPERTS

// DeepSeek-V2/V3 (the CPU's route_deepseek, top_k, norm_weights): p = sigmoid or softmax of
// the logits (kept in the logits row), selection scores s = p + bias in a per-thread array,
// groups outside the n_groups_used best (by their two best s) marked ineligible, then the k
// best s (ties to the lower index) weighted by their p. One thread per token.
__global__ void route_deepseek_kernel(int32_t *sel, float *w, float *logits, const float *bias,
                                      int n_tokens, int E, int K, int sigmoid, int G, int G_used,
                                      int norm_topk, float scale)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tokens)
        return;
    float *p = logits + (size_t)t * E, *wt = w + (size_t)t * K;
    int32_t *st = sel + (size_t)t * K;
    float s[kMaxRouteExperts];
    if (sigmoid) {
        for (int e = 0; e < E; e++)
            p[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-p[e])));
    } else { // softmax_row: max in f32, sum in double
        float mx = -INFINITY;
        for (int e = 0; e < E; e++)
            mx = p[e] > mx ? p[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) {
            p[e] = expf(__fsub_rn(p[e], mx));
            sum += p[e];
        }
        const float inv = (float)(1.0 / sum);
        for (int e = 0; e < E; e++)
            p[e] = __fmul_rn(p[e], inv);
    }
    for (int e = 0; e < E; e++)
        s[e] = bias ? __fadd_rn(p[e], bias[e]) : p[e];
    if (G > 1 && G_used < G) {
        const int per = E / G;
        float gs[kMaxRouteExperts];
        uint32_t keep[kMaxRouteExperts / 32];
        for (int g = 0; g < G; g++) {
            float a = -INFINITY, b = -INFINITY; // the group's best two
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (s[e] > a) {
                    b = a;
                    a = s[e];
                } else if (s[e] > b) {
                    b = s[e];
                }
            }
            gs[g] = per > 1 ? __fadd_rn(a, b) : a;
        }
        for (int i = 0; i < kMaxRouteExperts / 32; i++)
            keep[i] = 0u;
        for (int k = 0; k < G_used; k++) {
            int best = 0;
            for (int g = 1; g < G; g++)
                best = gs[g] > gs[best] ? g : best;
            keep[best >> 5] |= 1u << (best & 31);
            gs[best] = -INFINITY;
        }
        for (int e = 0; e < E; e++) {
            const int g = e / per;
            if (!((keep[g >> 5] >> (g & 31)) & 1u))
                s[e] = -INFINITY;
        }
    }
    float wsum = 0.0f;
    for (int k = 0; k < K; k++) {
        int best = 0;
        for (int e = 1; e < E; e++)
            best = s[e] > s[best] ? e : best;
        st[k] = best;
        wt[k] = p[best];
        wsum = __fadd_rn(wsum, p[best]);
        s[best] = -INFINITY; // taken
    }
    if (norm_topk) // at least 2^-14, as llama.cpp's build_moe_ffn clamps
        wsum = wsum > 6.103515625e-5f ? wsum : 6.103515625e-5f;
    for (int k = 0; k < K; k++) {
        float v = wt[k];
        if (norm_topk)
            v = __fdiv_rn(v, wsum);
        wt[k] = __fmul_rn(v, scale);
    }
}

// y[s][r] = dot(W[sel[s]][r][:], x[s / x_div][:]) (+ bias[sel[s]][r]); one warp per row r.
template <typename T>
__global__ void matvec_kernel(float *y, const float *x, int x_div, const T *w, const float *bias,
                              const int32_t *sel, int rows, int cols)
{
    const int s = blockIdx.x, r = blockIdx.y * kWarps + (int)(threadIdx.x >> 5);
    if (r >= rows)
        return;
    const T *wr = w + ((size_t)sel[s] * rows + r) * cols;
    const float *xr = x + (size_t)(s / x_div) * cols;
    float acc = 0.0f;
    for (int i = threadIdx.x & 31; i < cols; i += 32)
        acc = fmaf(ty::to_f32(wr[i]), xr[i], acc);
    acc = ty::warp_sum(acc);
    if ((threadIdx.x & 31) == 0)
        y[(size_t)s * rows + r] = bias ? __fadd_rn(acc, bias[(size_t)sel[s] * rows + r]) : acc;
}

template <typename T>
int matvec_launch(float *y, const float *x, int x_div, const void *w, const float *bias,
                  const int32_t *sel, int n_slots, int rows, int cols, cudaStream_t st)
{
    dim3 grid((unsigned)n_slots, ty::ceil_div((size_t)rows, kWarps));
    matvec_kernel<T><<<grid, 32 * kWarps, 0, st>>>(y, x, x_div, (const T *)w, bias, sel, rows,
                                                   cols);
    return TY_CUDA_LAUNCH_CHECK("moe_matvec");
}

// x[t][d] += (w0 y0[d]) + (w1 y1[d]) + ... in slot order (the CPU's scaled slots, then sum);
// slot s's output is row rows[s] of ys (NULL: row s).
__global__ void combine_kernel(float *x, const float *ys, const float *w, const int32_t *rows,
                               int K, int dim, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / (size_t)dim, d = i % (size_t)dim;
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            const size_t s = t * K + k, r = rows ? (size_t)rows[s] : s;
            const float v = __fmul_rn(ys[r * dim + d], w[s]);
            acc = k ? __fadd_rn(acc, v) : v;
        }
        x[i] = __fadd_rn(x[i], acc);
    }
}

} // namespace

extern "C" int ty_cuda_moe_route(int32_t *sel, float *w, float *logits, int n_tokens,
                                 int n_experts, int n_used, int norm_topk,
                                 ty_cuda_stream_t stream)
{
    if (n_tokens < 0 || n_experts <= 0 || n_used <= 0 || n_used > n_experts)
        return TY_EINVAL;
    if (n_tokens == 0)
        return 0;
    route_kernel<<<ty::ceil_div((size_t)n_tokens, kRouteThreads), kRouteThreads, 0,
                   (cudaStream_t)stream>>>(sel, w, logits, n_tokens, n_experts, n_used,
                                           norm_topk != 0);
    return TY_CUDA_LAUNCH_CHECK("moe_route");
}

extern "C" int ty_cuda_moe_matvec_bias(float *y, const float *x, int x_div, const void *w,
                                       enum ty_cuda_dtype type, const float *bias,
                                       const int32_t *sel, int n_slots, int rows, int cols,
                                       ty_cuda_stream_t stream)
{
    if (n_slots < 0 || x_div <= 0 || rows <= 0 || rows > 65535 * kWarps || cols <= 0)
        return TY_EINVAL;
    if (n_slots == 0)
        return 0;
    return TY_DTYPE_DISPATCH(type, matvec_launch, y, x, x_div, w, bias, sel, n_slots, rows,
                             cols, (cudaStream_t)stream);
}

extern "C" int ty_cuda_moe_matvec(float *y, const float *x, int x_div, const void *w,
                                  enum ty_cuda_dtype type, const int32_t *sel, int n_slots,
                                  int rows, int cols, ty_cuda_stream_t stream)
{
    return ty_cuda_moe_matvec_bias(y, x, x_div, w, type, nullptr, sel, n_slots, rows, cols,
                                   stream);
}

extern "C" int ty_cuda_moe_route_topk_softmax(int32_t *sel, float *w, float *logits,
                                              const float *bias, int n_tokens, int n_experts,
                                              int n_used, int norm_topk, ty_cuda_stream_t stream)
{
    if (n_tokens < 0 || n_experts <= 0 || n_used <= 0 || n_used > n_experts)
        return TY_EINVAL;
    if (n_tokens == 0)
        return 0;
    route_topk_softmax_kernel<<<ty::ceil_div((size_t)n_tokens, kRouteThreads), kRouteThreads, 0,
                                (cudaStream_t)stream>>>(sel, w, logits, bias, n_tokens,
                                                        n_experts, n_used, norm_topk != 0);
    return TY_CUDA_LAUNCH_CHECK("moe_route_topk_softmax");
}

extern "C" int ty_cuda_moe_route_deepseek(int32_t *sel, float *w, float *logits,
                                          const float *bias, int n_tokens, int n_experts,
                                          int n_used, int sigmoid, int n_groups,
                                          int n_groups_used, int norm_topk, float scale,
                                          ty_cuda_stream_t stream)
{
    if (n_tokens < 0 || n_experts <= 0 || n_experts > kMaxRouteExperts || n_used <= 0 ||
        n_used > n_experts || n_groups < 0)
        return TY_EINVAL;
    // groups prune only with n_groups > 1 and n_groups_used < n_groups: whole groups, at
    // least one kept, enough eligible experts for n_used picks
    if (n_groups > 1 && n_groups_used < n_groups &&
        (n_experts % n_groups || n_groups_used <= 0 ||
         n_used > n_groups_used * (n_experts / n_groups)))
        return TY_EINVAL;
    if (n_tokens == 0)
        return 0;
    route_deepseek_kernel<<<ty::ceil_div((size_t)n_tokens, kRouteThreads), kRouteThreads, 0,
                            (cudaStream_t)stream>>>(sel, w, logits, bias, n_tokens, n_experts,
                                                    n_used, sigmoid != 0, n_groups,
                                                    n_groups_used, norm_topk != 0, scale);
    return TY_CUDA_LAUNCH_CHECK("moe_route_deepseek");
}

extern "C" int ty_cuda_moe_combine(float *x, const float *ys, const float *w, int n_tokens,
                                   int n_used, int dim, ty_cuda_stream_t stream)
{
    return ty_cuda_moe_combine_rows(x, ys, w, nullptr, n_tokens, n_used, dim, stream);
}

extern "C" int ty_cuda_moe_combine_rows(float *x, const float *ys, const float *w,
                                        const int32_t *rows, int n_tokens, int n_used, int dim,
                                        ty_cuda_stream_t stream)
{
    if (n_tokens < 0 || n_used <= 0 || dim <= 0)
        return TY_EINVAL;
    size_t n = (size_t)n_tokens * dim;
    if (n == 0)
        return 0;
    unsigned blocks = ty::ceil_div(n, 256);
    blocks = blocks > 65535u * 8u ? 65535u * 8u : blocks;
    combine_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(x, ys, w, rows, n_used, dim, n);
    return TY_CUDA_LAUNCH_CHECK("moe_combine");
}
