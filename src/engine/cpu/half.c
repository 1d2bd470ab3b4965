/* IEEE half rows for the f16 KV cache: the scalar conversions define the result (round to
 * nearest even, as F16C and CUDA's __float2half_rn do), the F16C loops give the same bits
 * eight at a time. */
#include "cpu-impl.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define F16C __attribute__((target("avx2,f16c")))
#endif

uint16_t ty__cpu_f32_to_half1(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: quiet, top payload bits kept */
        return (uint16_t)(sign | 0x7e00u | (ax >> 13 & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 rounds past the largest half (65504): inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal half m * 2^-24 (exact scaling) */
        float af;
        memcpy(&af, &ax, 4);
        return (uint16_t)(sign | (uint32_t)nearbyintf(af * 16777216.0f));
    }
    uint32_t h = (ax >> 13) - (112u << 10), rest = ax & 0x1fffu; /* exponent re-biased */
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is still the right half */
    return (uint16_t)(sign | h);
}

#if defined(__x86_64__)
F16C static void half_to_f32_f16c(const uint16_t *x, float *y, size_t n, const float *h2f)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++)
        y[i] = h2f[x[i]];
}

F16C static void f32_to_half_f16c(const float *x, uint16_t *y, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        y[i] = ty__cpu_f32_to_half1(x[i]);
}
#endif

void ty__cpu_half_to_f32(const uint16_t *x, float *y, size_t n)
{
    const float *h2f = ty__cpu_f16_table();
#if defined(__x86_64__)
    if (ty__cpu_have_avx2()) {
        half_to_f32_f16c(x, y, n, h2f);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        y[i] = h2f[x[i]];
}

void ty__cpu_f32_to_half(const float *x, uint16_t *y, size_t n)
{
#if defined(__x86_64__)
    if (ty__cpu_have_avx2()) {
        f32_to_half_f16c(x, y, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        y[i] = ty__cpu_f32_to_half1(x[i]);
}
