/* IEEE half and bfloat16 rows for the 16-bit KV caches: the scalar conversions define the result (round to
 * nearest even, as F16C and CUDA's __float2half_rn do), the F16C loops give the same bits
 * eight at a time. */
#include "cpu-impl.h"

#include "tycho/kvpool.h"

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

/* ---- attention over f16 rows ----------------------------------------------------------------
 * q . k for a query row against an f16 key row, and y += a * v for an f16 value row. With
 * AVX2 + FMA + F16C: eight lanes, four accumulators for the dot (summed pairwise at the end);
 * otherwise in order, through the table. */
#if defined(__x86_64__)
#define AVX2F __attribute__((target("avx2,fma,f16c")))

AVX2F static inline __m256 ld8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

AVX2F static float dot_avx2(const float *q, const uint16_t *k, uint32_t n, const float *h2f)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ld8(k + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), ld8(k + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 16), ld8(k + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 24), ld8(k + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ld8(k + i), a0);
    float d = ty__cpu_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++)
        d += q[i] * h2f[k[i]];
    return d;
}

AVX2F static void axpy_avx2(float a, const uint16_t *v, float *y, uint32_t n, const float *h2f)
{
    __m256 va = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, ld8(v + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * h2f[v[i]];
}
#endif

float ty__cpu_dot_half(const float *q, const uint16_t *k, uint32_t n)
{
    const float *h2f = ty__cpu_f16_table();
#if defined(__x86_64__)
    if (ty__cpu_have_avx2())
        return dot_avx2(q, k, n, h2f);
#endif
    float d = 0;
    for (uint32_t i = 0; i < n; i++)
        d += q[i] * h2f[k[i]];
    return d;
}

void ty__cpu_axpy_half(float a, const uint16_t *v, float *y, uint32_t n)
{
    const float *h2f = ty__cpu_f16_table();
#if defined(__x86_64__)
    if (ty__cpu_have_avx2()) {
        axpy_avx2(a, v, y, n, h2f);
        return;
    }
#endif
    for (uint32_t i = 0; i < n; i++)
        y[i] += a * h2f[v[i]];
}

/* ---- bfloat16 rows ---------------------------------------------------------------------------
 * Widening puts the 16 bits on top of a zero low half. Narrowing adds 0x7fff plus the kept
 * part's lowest bit before truncating: round to nearest, ties to even, a carry into the
 * exponent being the right result up to inf; a NaN keeps its top bits and is made quiet. The
 * AVX2 loops do the same integer arithmetic eight lanes at a time. */
uint16_t ty__cpu_f32_to_bf16_1(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(x >> 16 | 0x40u);
    return (uint16_t)((x + 0x7fffu + (x >> 16 & 1u)) >> 16);
}

#if defined(__x86_64__)
AVX2F static inline __m256 ldb8(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

AVX2F static void bf16_to_f32_avx2(const uint16_t *x, float *y, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, ldb8(x + i));
    for (; i < n; i++) {
        uint32_t b = (uint32_t)x[i] << 16;
        memcpy(y + i, &b, 4);
    }
}

AVX2F static void f32_to_bf16_avx2(const float *x, uint16_t *y, size_t n)
{
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(x + i));
        __m256i r = _mm256_add_epi32(v, _mm256_add_epi32(bias,
                                                         _mm256_and_si256(_mm256_srli_epi32(v, 16), one)));
        r = _mm256_srli_epi32(r, 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, abs), inf);
        __m256i q = _mm256_or_si256(_mm256_srli_epi32(v, 16), quiet);
        r = _mm256_blendv_epi8(r, q, nan);
        /* 32-bit lanes hold 16-bit results: pack (per 128-bit half) and put the halves in order */
        __m256i p = _mm256_packus_epi32(r, r);
        p = _mm256_permute4x64_epi64(p, 0x08);
        _mm_storeu_si128((__m128i *)(y + i), _mm256_castsi256_si128(p));
    }
    for (; i < n; i++)
        y[i] = ty__cpu_f32_to_bf16_1(x[i]);
}

AVX2F static float dot_bf16_avx2(const float *q, const uint16_t *k, uint32_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ldb8(k + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), ldb8(k + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 16), ldb8(k + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 24), ldb8(k + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ldb8(k + i), a0);
    float d = ty__cpu_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) {
        uint32_t b = (uint32_t)k[i] << 16;
        float kf;
        memcpy(&kf, &b, 4);
        d += q[i] * kf;
    }
    return d;
}

AVX2F static void axpy_bf16_avx2(float a, const uint16_t *v, float *y, uint32_t n)
{
    __m256 va = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, ldb8(v + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) {
        uint32_t b = (uint32_t)v[i] << 16;
        float vf;
        memcpy(&vf, &b, 4);
        y[i] += a * vf;
    }
}
#endif

void ty__cpu_bf16_to_f32(const uint16_t *x, float *y, size_t n)
{
#if defined(__x86_64__)
    if (ty__cpu_have_avx2()) {
        bf16_to_f32_avx2(x, y, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)x[i] << 16;
        memcpy(y + i, &b, 4);
    }
}

void ty__cpu_f32_to_bf16(const float *x, uint16_t *y, size_t n)
{
#if defined(__x86_64__)
    if (ty__cpu_have_avx2()) {
        f32_to_bf16_avx2(x, y, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        y[i] = ty__cpu_f32_to_bf16_1(x[i]);
}

float ty__cpu_dot_bf16(const float *q, const uint16_t *k, uint32_t n)
{
#if defined(__x86_64__)
    if (ty__cpu_have_avx2())
        return dot_bf16_avx2(q, k, n);
#endif
    float d = 0, kf;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)k[i] << 16;
        memcpy(&kf, &b, 4);
        d += q[i] * kf;
    }
    return d;
}

void ty__cpu_axpy_bf16(float a, const uint16_t *v, float *y, uint32_t n)
{
#if defined(__x86_64__)
    if (ty__cpu_have_avx2()) {
        axpy_bf16_avx2(a, v, y, n);
        return;
    }
#endif
    float vf;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)v[i] << 16;
        memcpy(&vf, &b, 4);
        y[i] += a * vf;
    }
}

void ty__cpu_kv16_to_f32(int dtype, const uint16_t *x, float *y, size_t n)
{
    (dtype == TY_KV_BF16 ? ty__cpu_bf16_to_f32 : ty__cpu_half_to_f32)(x, y, n);
}

void ty__cpu_f32_to_kv16(int dtype, const float *x, uint16_t *y, size_t n)
{
    (dtype == TY_KV_BF16 ? ty__cpu_f32_to_bf16 : ty__cpu_f32_to_half)(x, y, n);
}

float ty__cpu_dot_kv16(int dtype, const float *q, const uint16_t *k, uint32_t n)
{
    return (dtype == TY_KV_BF16 ? ty__cpu_dot_bf16 : ty__cpu_dot_half)(q, k, n);
}

void ty__cpu_axpy_kv16(int dtype, float a, const uint16_t *v, float *y, uint32_t n)
{
    (dtype == TY_KV_BF16 ? ty__cpu_axpy_bf16 : ty__cpu_axpy_half)(a, v, y, n);
}
