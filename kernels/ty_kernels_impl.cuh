// Private helpers shared by the kernel files: element loads/stores for the three KV/weight types,
// warp reductions, and the launch check every launcher ends with. Header-only, no state.
#ifndef TYCHO_KERNELS_IMPL_CUH
#define TYCHO_KERNELS_IMPL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "ty_kernels.h"

// log.h is a C header: give its C11 _Noreturn a C++ spelling while it is included.
#define _Noreturn [[noreturn]]
extern "C" {
#include "tycho/errors.h"
#include "tycho/log.h"
}
#undef _Noreturn

// Checks the last launch; logs the kernel name, the CUDA error and the call site.
#define TY_CUDA_LAUNCH_CHECK(what) ty__cuda_launch_check((what), __FILE__, __LINE__)

static inline int ty__cuda_launch_check(const char *what, const char *file, int line)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return 0;
    TY_LOG_ERROR("cuda", "%s launch failed: %s (%s) at %s:%d", what, cudaGetErrorName(e),
                 cudaGetErrorString(e), file, line);
    return TY_ECUDA;
}

namespace ty {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

static inline unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// cos and sin of rope pair i at position pos as the CPU backend's ty__cpu_rope computes them,
// product by product (no FMA contraction): theta_0 = pos, theta_{k+1} = theta_k * theta_scale
// in f32, angle = theta_i / freq_div[i]; with a YaRN mix table (else NULL) the angle becomes
// (freq_scale * angle) * (1 - mix[i]) + angle * mix[i] and cos/sin are scaled by mscale.
__device__ __forceinline__ void rope_cos_sin(int pos, int i, float theta_scale,
                                             const float *freq_div, const float *yarn_mix,
                                             float yarn_freq_scale, float yarn_mscale, float &c,
                                             float &s)
{
    float theta = (float)pos;
    for (int k = 0; k < i; k++)
        theta = __fmul_rn(theta, theta_scale);
    float ang = __fdiv_rn(theta, freq_div[i]);
    if (yarn_mix) {
        const float mx = yarn_mix[i];
        ang = __fadd_rn(__fmul_rn(__fmul_rn(yarn_freq_scale, ang), __fsub_rn(1.0f, mx)),
                        __fmul_rn(ang, mx));
        c = __fmul_rn(cosf(ang), yarn_mscale);
        s = __fmul_rn(sinf(ang), yarn_mscale);
    } else {
        c = cosf(ang);
        s = sinf(ang);
    }
}

} // namespace ty

// Instantiates a dtype switch: calls F<T>(args...) for the runtime type `dt`.
#define TY_DTYPE_DISPATCH(dt, F, ...)                                                             \
    ((dt) == TY_CUDA_F32    ? F<float>(__VA_ARGS__)                                               \
     : (dt) == TY_CUDA_F16  ? F<__half>(__VA_ARGS__)                                              \
     : (dt) == TY_CUDA_BF16 ? F<__nv_bfloat16>(__VA_ARGS__)                                       \
                            : TY_EINVAL)

#endif
