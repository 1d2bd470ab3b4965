// RMSNorm over rows (Zhang & Sennrich 2019), f32 in and out, f32 accumulation.
// One block per row; the block reduces the sum of squares with warp shuffles, then scales.
#include "ty_kernels.h"

#include <cuda_runtime.h>
#include <stdio.h>

#include "tycho/errors.h"

namespace {

constexpr int kThreads = 256;

__device__ float warp_sum(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__global__ void rmsnorm_f32_kernel(float *out, const float *x, const float *w, int dim, float eps)
{
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *orow = out + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    __shared__ float partial[kThreads / 32];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0)
        partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0)
            partial[0] = v;
    }
    __syncthreads();
    const float scale = rsqrtf(partial[0] / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        orow[i] = xr[i] * scale * w[i];
}

} // namespace

extern "C" int ty_cuda_rmsnorm_f32(float *out, const float *x, const float *w, int n_rows, int dim,
                                   float eps, ty_cuda_stream_t stream)
{
    if (n_rows <= 0 || dim <= 0)
        return n_rows == 0 ? 0 : TY_EINVAL;
    rmsnorm_f32_kernel<<<n_rows, kThreads, 0, (cudaStream_t)stream>>>(out, x, w, dim, eps);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "tycho: cuda: rmsnorm launch failed: %s (%s:%d)\n", cudaGetErrorString(e),
                __FILE__, __LINE__);
        return TY_ECUDA;
    }
    return 0;
}
