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

} // namespace ty

// Instantiates a dtype switch: calls F<T>(args...) for the runtime type `dt`.
#define TY_DTYPE_DISPATCH(dt, F, ...)                                                             \
    ((dt) == TY_CUDA_F32    ? F<float>(__VA_ARGS__)                                               \
     : (dt) == TY_CUDA_F16  ? F<__half>(__VA_ARGS__)                                              \
     : (dt) == TY_CUDA_BF16 ? F<__nv_bfloat16>(__VA_ARGS__)                                       \
                            : TY_EINVAL)

#endif
