/* C entry points of the CUDA kernels. Every launcher enqueues on the given stream and returns
 * 0 or TY_ECUDA (the launch error is logged with its call site); it never synchronizes.
 * Pointers are device pointers. Callers own all buffers. */
#ifndef TYCHO_KERNELS_H
#define TYCHO_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *ty_cuda_stream_t;

/* out[r][i] = x[r][i] * w[i] / sqrt(mean_i(x[r][i]^2) + eps)
 * x, out: (n_rows, dim) row-major f32; w: (dim) f32. out may alias x. */
int ty_cuda_rmsnorm_f32(float *out, const float *x, const float *w, int n_rows, int dim, float eps,
                        ty_cuda_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif
