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

static inline float bf16_1(uint16_t h)
{
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* One element of a 16-bit row widened: bfloat16 by the shift, IEEE half through the table. */
static inline float wide1(bool bf, uint16_t h, const float *h2f)
{
    return bf ? bf16_1(h) : h2f[h];
}

#if defined(__x86_64__)
#define AVX2F __attribute__((target("avx2,fma,f16c")))

AVX2F static inline __m256 ld8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

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
    for (; i < n; i++)
        y[i] = bf16_1(x[i]);
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
#endif

void ty__cpu_bf16_to_f32(const uint16_t *x, float *y, size_t n)
{
#if defined(__x86_64__)
    if (ty__cpu_have_avx2()) {
        bf16_to_f32_avx2(x, y, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        y[i] = bf16_1(x[i]);
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

/* ---- attention over 16-bit rows -------------------------------------------------------------
 * q . k for a query row against an f16 or bf16 key row, and y += a * v for a value row. With
 * AVX2 + FMA + F16C: eight lanes, four accumulators for the dot (summed pairwise at the end);
 * otherwise in order. One body per operation; `bf` picks the widening. */
#if defined(__x86_64__)
__attribute__((always_inline)) AVX2F static inline float
dot16_avx2(const float *q, const uint16_t *k, uint32_t n, bool bf, const float *h2f)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    uint32_t i = 0;
#define LD(p) (bf ? ldb8(p) : ld8(p))
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), LD(k + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), LD(k + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 16), LD(k + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 24), LD(k + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), LD(k + i), a0);
    float d = ty__cpu_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++)
        d += q[i] * wide1(bf, k[i], h2f);
    return d;
}

__attribute__((always_inline)) AVX2F static inline void
axpy16_avx2(float a, const uint16_t *v, float *y, uint32_t n, bool bf, const float *h2f)
{
    __m256 va = _mm256_set1_ps(a);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, LD(v + i), _mm256_loadu_ps(y + i)));
#undef LD
    for (; i < n; i++)
        y[i] += a * wide1(bf, v[i], h2f);
}

AVX2F static float dot_f16_avx2(const float *q, const uint16_t *k, uint32_t n, const float *h2f)
{
    return dot16_avx2(q, k, n, false, h2f);
}

AVX2F static float dot_bf16_avx2(const float *q, const uint16_t *k, uint32_t n, const float *h2f)
{
    return dot16_avx2(q, k, n, true, h2f);
}

AVX2F static void axpy_f16_avx2(float a, const uint16_t *v, float *y, uint32_t n,
                                const float *h2f)
{
    axpy16_avx2(a, v, y, n, false, h2f);
}

AVX2F static void axpy_bf16_avx2(float a, const uint16_t *v, float *y, uint32_t n,
                                 const float *h2f)
{
    axpy16_avx2(a, v, y, n, true, h2f);
}
#endif

static float dot16(const float *q, const uint16_t *k, uint32_t n, bool bf)
{
    const float *h2f = bf ? NULL : ty__cpu_f16_table();
#if defined(__x86_64__)
    if (ty__cpu_have_avx2())
        return (bf ? dot_bf16_avx2 : dot_f16_avx2)(q, k, n, h2f);
#endif
    float d = 0;
    for (uint32_t i = 0; i < n; i++)
        d += q[i] * wide1(bf, k[i], h2f);
    return d;
}

static void axpy16(float a, const uint16_t *v, float *y, uint32_t n, bool bf)
{
    const float *h2f = bf ? NULL : ty__cpu_f16_table();
#if defined(__x86_64__)
    if (ty__cpu_have_avx2()) {
        (bf ? axpy_bf16_avx2 : axpy_f16_avx2)(a, v, y, n, h2f);
        return;
    }
#endif
    for (uint32_t i = 0; i < n; i++)
        y[i] += a * wide1(bf, v[i], h2f);
}

float ty__cpu_dot_half(const float *q, const uint16_t *k, uint32_t n)
{
    return dot16(q, k, n, false);
}

void ty__cpu_axpy_half(float a, const uint16_t *v, float *y, uint32_t n)
{
    axpy16(a, v, y, n, false);
}

float ty__cpu_dot_bf16(const float *q, const uint16_t *k, uint32_t n)
{
    return dot16(q, k, n, true);
}

void ty__cpu_axpy_bf16(float a, const uint16_t *v, float *y, uint32_t n)
{
    axpy16(a, v, y, n, true);
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
    return dot16(q, k, n, dtype == TY_KV_BF16);
}

void ty__cpu_axpy_kv16(int dtype, float a, const uint16_t *v, float *y, uint32_t n)
{
    axpy16(a, v, y, n, dtype == TY_KV_BF16);
}
