/* Helpers shared by the GPU op tests: skip without a device, a seeded RNG, host-side f16/bf16
 * rounding (independent of the device code: _Float16 and bit arithmetic), device buffers that
 * are poisoned with NaN before every run, and the normalized error used as the pass criterion.
 * Single-threaded test code; every helper aborts the test (cmocka fail) on a CUDA error. */
#ifndef TYCHO_GPU_TEST_UTIL_H
#define TYCHO_GPU_TEST_UTIL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ty_kernels.h"
#include "tycho/errors.h"

#define GT_CHECK(call)                                                                            \
    do {                                                                                          \
        cudaError_t gt__e = (call);                                                               \
        if (gt__e != cudaSuccess)                                                                 \
            fail_msg("%s: %s (%s:%d)", #call, cudaGetErrorString(gt__e), __FILE__, __LINE__);    \
    } while (0)

/* Exits 77 when no device can run kernels. */
static inline void gt_require_gpu(const char *name)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("%s: no CUDA device (%s), skipping\n", name,
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        exit(77);
    }
}

/* xorshift64*: uniform in [0, 1) and in [lo, hi). */
static inline double gt_u01(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static inline float gt_uniform(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)gt_u01(s);
}
static inline int gt_randint(uint64_t *s, int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(gt_u01(s) * (hi - lo + 1));
}

static inline void gt_fill(float *x, size_t n, uint64_t *s, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = gt_uniform(s, lo, hi);
}

/* Round-to-nearest-even to bf16 and back (NaN-free inputs). */
static inline uint16_t gt_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float gt_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline size_t gt_dtype_size(enum ty_cuda_dtype t) { return t == TY_CUDA_F32 ? 4 : 2; }
static inline const char *gt_dtype_name(enum ty_cuda_dtype t)
{
    return t == TY_CUDA_F32 ? "f32" : t == TY_CUDA_F16 ? "f16" : "bf16";
}

/* Encodes f32 values as `t` into dst (n elements) and rounds x in place to what was stored,
 * so that the CPU reference sees exactly the device's inputs. */
static inline void gt_encode(void *dst, float *x, size_t n, enum ty_cuda_dtype t)
{
    for (size_t i = 0; i < n; i++) {
        if (t == TY_CUDA_F32) {
            ((float *)dst)[i] = x[i];
        } else if (t == TY_CUDA_F16) {
            _Float16 h = (_Float16)x[i];
            memcpy((char *)dst + 2 * i, &h, 2);
            x[i] = (float)h;
        } else {
            uint16_t b = gt_f32_to_bf16(x[i]);
            memcpy((char *)dst + 2 * i, &b, 2);
            x[i] = gt_bf16_to_f32(b);
        }
    }
}

static inline void *gt_dev(size_t bytes)
{
    void *p = NULL;
    GT_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}
static inline void *gt_upload(const void *h, size_t bytes)
{
    void *d = gt_dev(bytes);
    GT_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
/* NaN in every f32 (0xffffffff); unwritten outputs then fail the finiteness check. */
static inline void gt_poison(void *d, size_t bytes) { GT_CHECK(cudaMemset(d, 0xff, bytes)); }
static inline void gt_download(void *h, const void *d, size_t bytes)
{
    GT_CHECK(cudaDeviceSynchronize());
    GT_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* ||got - want|| / max(||want||, 1e-30); +inf when got has a non-finite element. */
static inline double gt_nerr(const float *got, const double *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            return INFINITY;
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return sqrt(num) / (den > 1e-60 ? sqrt(den) : 1e-30);
}

#define GT_EXPECT_NERR(got, want, n, tol, ...)                                                    \
    do {                                                                                          \
        double gt__err = gt_nerr((got), (want), (n));                                             \
        if (!(gt__err <= (tol))) {                                                                \
            printf("  FAIL nerr %.3g > tol %.3g: ", gt__err, (double)(tol));                      \
            printf(__VA_ARGS__);                                                                  \
            printf("\n");                                                                         \
            fail();                                                                               \
        }                                                                                         \
    } while (0)

#endif
