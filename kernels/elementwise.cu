// Elementwise kernels: residual add, bias add, SiLU-gated and SwiGLU-OAI activations, dtype
// conversion, embedding lookup.
// Grid-stride loops over elements; all math in f32.
#include "ty_kernels_impl.cuh"

#include <math.h>

namespace {

constexpr int kThreads = 256;

unsigned grid_for(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b > 65535u * 8u ? 65535u * 8u : (b == 0 ? 1 : b));
}

__global__ void add_kernel(float *x, const float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

__global__ void silu_mul_kernel(float *out, const float *gate, const float *up, int n_cols,
                                int ld_in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)n_cols, c = i % (size_t)n_cols;
        float g = gate[r * ld_in + c];
        out[i] = g / (1.0f + expf(-g)) * up[r * ld_in + c];
    }
}

__global__ void add_bias_kernel(float *y, const float *bias, int n_cols, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], bias[i % (size_t)n_cols]);
}

// gpt-oss's activation, the CPU backend's swiglu_oai expression by expression.
__global__ void swiglu_oai_kernel(float *out, const float *gate, const float *up, int n_cols,
                                  int ld_in, size_t n)
{
    const float alpha = 1.702f, limit = 7.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)n_cols, c = i % (size_t)n_cols;
        float g = gate[r * ld_in + c], u = up[r * ld_in + c];
        g = g < limit ? g : limit;
        u = u < -limit ? -limit : u > limit ? limit : u;
        out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(__fmul_rn(alpha, -g)))),
                           __fadd_rn(u, 1.0f));
    }
}

template <typename D, typename S> __global__ void convert_kernel(D *dst, const S *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = ty::from_f32<D>(ty::to_f32(src[i]));
}

template <typename T>
__global__ void embed_kernel(float *out, const T *table, const int32_t *ids, int dim, int vocab)
{
    const int t = blockIdx.x;
    const int id = ids[t];
    float *o = out + (size_t)t * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = (id >= 0 && id < vocab) ? ty::to_f32(table[(size_t)id * dim + i]) : NAN;
}

template <typename D, typename S> int convert_launch(void *dst, const void *src, size_t n,
                                                      cudaStream_t st)
{
    convert_kernel<D, S><<<grid_for(n), kThreads, 0, st>>>((D *)dst, (const S *)src, n);
    return TY_CUDA_LAUNCH_CHECK("convert");
}

template <typename S> int convert_to_f32(void *dst, const void *src, size_t n, cudaStream_t st)
{
    return convert_launch<float, S>(dst, src, n, st);
}

template <typename D> int convert_from_f32(void *dst, const void *src, size_t n, cudaStream_t st)
{
    return convert_launch<D, float>(dst, src, n, st);
}

template <typename T>
int embed_launch(float *out, const void *table, const int32_t *ids, int n_tokens, int dim,
                 int vocab, cudaStream_t st)
{
    embed_kernel<T><<<n_tokens, 128, 0, st>>>(out, (const T *)table, ids, dim, vocab);
    return TY_CUDA_LAUNCH_CHECK("embed");
}

} // namespace

extern "C" size_t ty_cuda_dtype_size(enum ty_cuda_dtype dt)
{
    switch (dt) {
    case TY_CUDA_F32:
        return 4;
    case TY_CUDA_F16:
    case TY_CUDA_BF16:
        return 2;
    }
    return 0;
}

extern "C" int ty_cuda_add_bias_f32(float *y, const float *bias, int n_rows, int n_cols,
                                    ty_cuda_stream_t stream)
{
    if (n_rows < 0 || n_cols <= 0 || !y || !bias)
        return TY_EINVAL;
    size_t n = (size_t)n_rows * n_cols;
    if (n == 0)
        return 0;
    add_bias_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(y, bias, n_cols, n);
    return TY_CUDA_LAUNCH_CHECK("add_bias_f32");
}

extern "C" int ty_cuda_swiglu_oai_f32(float *out, const float *gate, const float *up, int n_rows,
                                      int n_cols, int ld_in, ty_cuda_stream_t stream)
{
    if (n_rows < 0 || n_cols < 0 || ld_in < n_cols)
        return TY_EINVAL;
    size_t n = (size_t)n_rows * n_cols;
    if (n == 0)
        return 0;
    if (out == up || (out == gate && ld_in != n_cols))
        return TY_EINVAL; /* would overwrite inputs other threads still read */
    swiglu_oai_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(out, gate, up, n_cols,
                                                                         ld_in, n);
    return TY_CUDA_LAUNCH_CHECK("swiglu_oai_f32");
}

extern "C" int ty_cuda_add_f32(float *x, const float *y, size_t n, ty_cuda_stream_t stream)
{
    if (n == 0)
        return 0;
    if (!x || !y)
        return TY_EINVAL;
    add_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(x, y, n);
    return TY_CUDA_LAUNCH_CHECK("add_f32");
}

extern "C" int ty_cuda_silu_mul_f32(float *out, const float *gate, const float *up, int n_rows,
                                    int n_cols, int ld_in, ty_cuda_stream_t stream)
{
    if (n_rows < 0 || n_cols < 0 || ld_in < n_cols)
        return TY_EINVAL;
    size_t n = (size_t)n_rows * n_cols;
    if (n == 0)
        return 0;
    if (out == up || (out == gate && ld_in != n_cols))
        return TY_EINVAL; /* would overwrite inputs other threads still read */
    silu_mul_kernel<<<grid_for(n), kThreads, 0, (cudaStream_t)stream>>>(out, gate, up, n_cols,
                                                                       ld_in, n);
    return TY_CUDA_LAUNCH_CHECK("silu_mul_f32");
}

extern "C" int ty_cuda_convert(void *dst, enum ty_cuda_dtype dst_type, const void *src,
                               enum ty_cuda_dtype src_type, size_t n, ty_cuda_stream_t stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (n == 0)
        return 0;
    if (ty_cuda_dtype_size(dst_type) == 0 || ty_cuda_dtype_size(src_type) == 0)
        return TY_EINVAL;
    if (dst_type == src_type) {
        cudaError_t e = cudaMemcpyAsync(dst, src, n * ty_cuda_dtype_size(dst_type),
                                        cudaMemcpyDeviceToDevice, st);
        if (e == cudaSuccess)
            return 0;
        (void)cudaGetLastError(); /* clear it: the error is reported here */
        TY_LOG_ERROR("cuda", "convert copy: cudaMemcpyAsync failed: %s (%s:%d)",
                     cudaGetErrorString(e), __FILE__, __LINE__);
        return TY_ECUDA;
    }
    if (dst_type == TY_CUDA_F32)
        return TY_DTYPE_DISPATCH(src_type, convert_to_f32, dst, src, n, st);
    if (src_type == TY_CUDA_F32)
        return TY_DTYPE_DISPATCH(dst_type, convert_from_f32, dst, src, n, st);
    return TY_ENOTSUP; /* f16 <-> bf16: not needed by the backend */
}

extern "C" int ty_cuda_embed(float *out, const void *table, enum ty_cuda_dtype type,
                             const int32_t *ids, int n_tokens, int dim, int vocab,
                             ty_cuda_stream_t stream)
{
    if (n_tokens < 0 || dim <= 0 || vocab <= 0)
        return TY_EINVAL;
    if (n_tokens == 0)
        return 0;
    return TY_DTYPE_DISPATCH(type, embed_launch, out, table, ids, n_tokens, dim, vocab,
                             (cudaStream_t)stream);
}
