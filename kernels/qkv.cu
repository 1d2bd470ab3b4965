// Post-processing of the fused q|k|v projection, one kernel: optional bias, optional per-head
// RMSNorm of q and k (Qwen3; f32 sum of squares, then x * scale * w as ggml's rms_norm and mul),
// the HF rotate_half row order undone, rotary embedding with ggml's angle recurrence
// (theta_0 = pos, theta_{i+1} = theta_i * theta_scale in f32, angle_i = theta_i / freq_div[i];
// what the CPU backend and llama.cpp compute; YaRN's per-pair mix and magnitude on top, from
// the host's table), q written densely and K/V stored straight into their page slots.
// One block per (token, head of q|k|v); the head is staged in shared memory so the in-place
// reordering needs no second buffer. Products are rounded one by one (no FMA contraction) to
// follow the CPU reference's arithmetic.
#include "ty_kernels_impl.cuh"

#include <math.h>

namespace {

struct qkv_params {
    int n_heads, n_kv_heads, head_dim, page_tokens, neox, hf_order;
    float theta_scale, norm_eps;
    float yarn_freq_scale, yarn_mscale; // used where the mix table is not NULL
};

constexpr int kMaxWarps = 4; // qkv_launch uses at most 128 threads

// head[0, hd) *= rsqrt(mean(head^2) + eps) * w, by the whole block; head is in shared memory
// and red holds kMaxWarps partial sums.
__device__ void rmsnorm_head(float *head, float *red, const float *w, int hd, float eps)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        ss = __fadd_rn(ss, __fmul_rn(head[i], head[i]));
    for (int off = 16; off > 0; off >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = 0.0f;
    for (int i = 0; i < (int)(blockDim.x + 31) / 32; i++)
        total += red[i];
    const float scale = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(total, (float)hd), eps));
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        head[i] = __fmul_rn(__fmul_rn(head[i], scale), w[i]);
    __syncthreads();
}

// Index, in the projection's row order, of element j of the interleaved head.
__device__ __forceinline__ int src_index(const qkv_params &p, int j)
{
    const int half = p.head_dim / 2;
    return p.hf_order ? ((j & 1) ? half + (j >> 1) : (j >> 1)) : j;
}

template <typename T>
__device__ __forceinline__ T *pool_row(T *pool, const qkv_params &p, int slot, int kv_head)
{
    const int page = slot / p.page_tokens, off = slot % p.page_tokens;
    return pool + (((size_t)page * p.n_kv_heads + kv_head) * p.page_tokens + off) * p.head_dim;
}

template <typename T>
__global__ void qkv_kernel(float *q_out, T *k_pool, T *v_pool, const float *qkv,
                           const float *bias, const float *freq_div, const float *q_norm,
                           const float *k_norm, const float *yarn_mix, const int32_t *pos,
                           const int32_t *slots, qkv_params p)
{
    extern __shared__ float head[]; // (head_dim) then kMaxWarps partial sums
    const int t = blockIdx.x, h = blockIdx.y, hd = p.head_dim, half = hd / 2;
    const size_t ld = (size_t)(p.n_heads + 2 * p.n_kv_heads) * hd;
    const float *src = qkv + t * ld + (size_t)h * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        head[i] = bias ? __fadd_rn(src[i], bias[(size_t)h * hd + i]) : src[i];
    __syncthreads();
    const float *norm_w = h < p.n_heads ? q_norm : h < p.n_heads + p.n_kv_heads ? k_norm : nullptr;
    if (norm_w) // uniform over the block: every thread reaches the barriers inside
        rmsnorm_head(head, head + hd, norm_w, hd, p.norm_eps);
    const int slot = slots[t];
    if (h >= p.n_heads + p.n_kv_heads) { // V: stored as is
        if (slot < 0)
            return;
        T *dst = pool_row(v_pool, p, slot, h - p.n_heads - p.n_kv_heads);
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            dst[i] = ty::from_f32<T>(head[i]);
        return;
    }
    const bool is_q = h < p.n_heads;
    if (!is_q && slot < 0)
        return;
    float *qdst = q_out + ((size_t)t * p.n_heads + h) * hd;
    T *kdst = is_q ? nullptr : pool_row(k_pool, p, slot, h - p.n_heads);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float c, s;
        ty::rope_cos_sin(pos[t], i, p.theta_scale, freq_div, yarn_mix, p.yarn_freq_scale,
                         p.yarn_mscale, c, s);
        const int a = p.neox ? i : 2 * i, b = p.neox ? i + half : 2 * i + 1;
        const float x0 = head[src_index(p, a)], x1 = head[src_index(p, b)];
        const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        const float y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        if (is_q) {
            qdst[a] = y0;
            qdst[b] = y1;
        } else {
            kdst[a] = ty::from_f32<T>(y0);
            kdst[b] = ty::from_f32<T>(y1);
        }
    }
}

template <typename T>
int qkv_launch(float *q_out, void *k_pool, void *v_pool, const float *qkv, const float *bias,
               const struct ty_cuda_qkv *q, const int32_t *pos, const int32_t *slots,
               int n_tokens, const qkv_params &p, cudaStream_t st)
{
    dim3 grid((unsigned)n_tokens, (unsigned)(p.n_heads + 2 * p.n_kv_heads));
    int threads = p.head_dim / 2 < 32 ? 32 : (p.head_dim / 2 > 32 * kMaxWarps ? 32 * kMaxWarps
                                                                                : p.head_dim / 2);
    threads = (threads + 31) / 32 * 32; // whole warps: the norm's shuffles use full masks
    qkv_kernel<T><<<grid, threads, (p.head_dim + kMaxWarps) * sizeof(float), st>>>(
        q_out, (T *)k_pool, (T *)v_pool, qkv, bias, q->freq_div, q->q_norm, q->k_norm,
        q->yarn_mix, pos, slots, p);
    return TY_CUDA_LAUNCH_CHECK("qkv_rope_store");
}

} // namespace

extern "C" int ty_cuda_qkv_rope_store(float *q_out, void *k_pool, void *v_pool,
                                      const struct ty_cuda_kv_layout *l, const float *qkv,
                                      const float *bias, const int32_t *pos,
                                      const int32_t *slots, int n_tokens,
                                      const struct ty_cuda_qkv *q, ty_cuda_stream_t stream)
{
    if (!l || !q || !q->freq_div || n_tokens < 0 || n_tokens > 65535 * 1024 || q->n_heads <= 0 ||
        q->n_kv_heads <= 0 || q->n_heads % q->n_kv_heads || q->head_dim <= 0 ||
        q->head_dim % 2 || q->head_dim > 1024 || l->n_kv_heads != q->n_kv_heads ||
        l->head_dim != q->head_dim || l->page_tokens <= 0 || !(q->theta_scale > 0.0f) ||
        !q->q_norm != !q->k_norm || (q->q_norm && !(q->norm_eps > 0.0f)) ||
        (q->yarn_mix && !(q->yarn_freq_scale > 0.0f && q->yarn_mscale > 0.0f)))
        return TY_EINVAL;
    if (q->n_heads + 2 * q->n_kv_heads > 65535)
        return TY_EINVAL;
    if (n_tokens == 0)
        return 0;
    qkv_params p = {q->n_heads, q->n_kv_heads, q->head_dim, l->page_tokens, q->neox != 0,
                    q->hf_order != 0, q->theta_scale, q->norm_eps, q->yarn_freq_scale,
                    q->yarn_mscale};
    return TY_DTYPE_DISPATCH(l->type, qkv_launch, q_out, k_pool, v_pool, qkv, bias, q, pos,
                             slots, n_tokens, p, (cudaStream_t)stream);
}
