// Rotary position embedding (Su et al. 2021, RoFormer §3.4), with the llama3 frequency scaling of
// Meta's Llama 3.1 reference code (apply_scaling). One thread per rotated pair. Frequencies and
// angles are computed in double so that large positions keep full f32 accuracy.
#include "ty_kernels_impl.cuh"

#include <math.h>

namespace {

struct rope_params {
    int head_dim, rot_dim, neox;
    double theta;
    double factor, low_ff, high_ff, orig_max;
};

__device__ double rope_inv_freq(const rope_params &p, int j)
{
    double f = pow(p.theta, -2.0 * j / (double)p.rot_dim);
    if (p.factor <= 0.0)
        return f;
    const double pi = 3.14159265358979323846;
    double wavelen = 2.0 * pi / f;
    double low_wavelen = p.orig_max / p.low_ff, high_wavelen = p.orig_max / p.high_ff;
    if (wavelen < high_wavelen)
        return f;
    if (wavelen > low_wavelen)
        return f / p.factor;
    double smooth = (p.orig_max / wavelen - p.low_ff) / (p.high_ff - p.low_ff);
    return (1.0 - smooth) * f / p.factor + smooth * f;
}

__global__ void rope_kernel(float *x, const int32_t *pos, int n_heads, rope_params p, size_t n)
{
    const int half = p.rot_dim / 2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int j = (int)(i % half);
        const size_t th = i / half; /* token * n_heads + head */
        const int t = (int)(th / n_heads);
        float *xh = x + th * p.head_dim;
        const int i0 = p.neox ? j : 2 * j, i1 = p.neox ? j + half : 2 * j + 1;
        double s, c;
        sincos((double)pos[t] * rope_inv_freq(p, j), &s, &c);
        const double x0 = xh[i0], x1 = xh[i1];
        xh[i0] = (float)(x0 * c - x1 * s);
        xh[i1] = (float)(x0 * s + x1 * c);
    }
}

} // namespace

extern "C" int ty_cuda_rope_f32(float *x, const int32_t *pos, int n_tokens, int n_heads,
                                const struct ty_cuda_rope *rope, ty_cuda_stream_t stream)
{
    if (!rope || n_tokens < 0 || n_heads <= 0 || rope->head_dim <= 0 || rope->head_dim % 2)
        return TY_EINVAL;
    rope_params p;
    p.head_dim = rope->head_dim;
    p.rot_dim = rope->rot_dim ? rope->rot_dim : rope->head_dim;
    if (p.rot_dim % 2 || p.rot_dim > p.head_dim || p.rot_dim < 0 || !(rope->theta > 0.0f))
        return TY_EINVAL;
    p.neox = rope->neox != 0;
    p.theta = rope->theta;
    p.factor = rope->llama3_factor;
    p.low_ff = rope->llama3_low_freq_factor;
    p.high_ff = rope->llama3_high_freq_factor;
    p.orig_max = rope->llama3_orig_max_pos;
    if (p.factor > 0.0 && !(p.low_ff > 0.0 && p.high_ff > p.low_ff && p.orig_max > 0.0))
        return TY_EINVAL;
    size_t n = (size_t)n_tokens * n_heads * (p.rot_dim / 2);
    if (n == 0)
        return 0;
    unsigned blocks = ty::ceil_div(n, 256);
    if (blocks > 65535u * 8u)
        blocks = 65535u * 8u;
    rope_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(x, pos, n_heads, p, n);
    return TY_CUDA_LAUNCH_CHECK("rope_f32");
}
