/* Block dot products for quantized weights (cpu-impl.h): inputs quantized to llama.cpp's 8-bit
 * formats (Q8_0 for Q8_0/Q4_0/MXFP4 weights, Q8_K for the K-quants), and one weight row times
 * one quantized input for Q4_0, MXFP4, Q4_K, Q5_K and Q6_K, a scalar reference and an AVX2
 * kernel each.
 * Both sum each block's (or sub-block's) integer products exactly in int32 and scale them by
 * the block's f32 factors; they differ only in the order of the f32 sums. Block layouts: see
 * src/engine/quant.c. */
#include "cpu-impl.h"

#include "tycho/gguf.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

uint32_t ty__cpu_input_block(uint32_t weight_type)
{
    switch (weight_type) {
    case TY_GGML_Q8_0:
    case TY_GGML_Q4_0:
    case TY_GGML_MXFP4:
        return 32;
    case TY_GGML_Q4_K:
    case TY_GGML_Q5_K:
    case TY_GGML_Q6_K:
        return 256;
    default:
        return 0;
    }
}

/* ---- input quantization -------------------------------------------------------------------- */

/* Q8_0: d = max |x| / 127 kept at f16 precision, q = x * (127 / max |x|) rounded to nearest,
 * halves to even: ggml's x86 quantize_row_q8_0 (AVX2), what llama.cpp runs on the machines
 * Tycho is compared on (its scalar reference divides by d and rounds halves away from zero:
 * a rare one-step difference). */
static void quantize_q8_0(const float *x, uint64_t n, int8_t *q, float *d, const float *h2f)
{
    for (uint64_t b = 0; b < n / 32; b++) {
        const float *v = x + b * 32;
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fabsf(v[j]) > amax ? fabsf(v[j]) : amax;
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        d[b] = h2f[ty__cpu_f32_to_half1(amax / 127.0f)];
        for (int j = 0; j < 32; j++)
            q[b * 32 + j] = (int8_t)nearbyintf(v[j] * id);
    }
}

/* Q8_K (ggml's quantize_row_q8_K, the reference llama.cpp also runs on x86): the value of
 * largest magnitude maps to -127 (scale -127 / max), the others round to nearest (halves to
 * even), d = 1 / scale in f32; s = the sums of every 16 quants. */
static void quantize_q8_k(const float *x, uint64_t n, int8_t *q, float *d, int16_t *s)
{
    for (uint64_t b = 0; b < n / 256; b++) {
        const float *v = x + b * 256;
        float amax = 0, max = 0;
        for (int j = 0; j < 256; j++)
            if (fabsf(v[j]) > amax)
                amax = fabsf(v[j]), max = v[j];
        int8_t *qb = q + b * 256;
        if (amax == 0) {
            d[b] = 0;
            memset(qb, 0, 256);
            memset(s + b * 16, 0, 16 * sizeof(int16_t));
            continue;
        }
        float is = -127.0f / max;
        for (int j = 0; j < 256; j++) {
            int r = (int)nearbyintf(is * v[j]);
            qb[j] = (int8_t)(r > 127 ? 127 : r);
        }
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += qb[g * 16 + j];
            s[b * 16 + g] = (int16_t)sum;
        }
        d[b] = 1 / is;
    }
}

#if defined(__x86_64__)
#define AVX2_QIN __attribute__((target("avx2,fma,f16c")))

/* 32 int32 (four vectors of eight, in order) to 32 int8, in order. */
AVX2_QIN static void store_i8x32(int8_t *q, __m256i a, __m256i b, __m256i c, __m256i e)
{
    __m256i ab = _mm256_packs_epi32(a, b), ce = _mm256_packs_epi32(c, e); /* lanes interleaved */
    __m256i v = _mm256_packs_epi16(ab, ce);
    v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, v);
}

AVX2_QIN static float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* quantize_q8_0 with AVX2: the same amax, factor, f16 scale and round-half-to-even products
 * (cvtps rounds as nearbyintf does in the default rounding mode), so the same bits. */
AVX2_QIN static void quantize_q8_0_avx2(const float *x, uint64_t n, int8_t *q, float *d)
{
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (uint64_t b = 0; b < n / 32; b++) {
        const float *v = x + b * 32;
        __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
        __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs), _mm256_and_ps(v1, abs)),
                                 _mm256_max_ps(_mm256_and_ps(v2, abs), _mm256_and_ps(v3, abs)));
        float amax = hmax8(m);
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        d[b] = _cvtsh_ss(_cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT));
        __m256 f = _mm256_set1_ps(id);
        store_i8x32(q + b * 32, _mm256_cvtps_epi32(_mm256_mul_ps(v0, f)),
                    _mm256_cvtps_epi32(_mm256_mul_ps(v1, f)),
                    _mm256_cvtps_epi32(_mm256_mul_ps(v2, f)),
                    _mm256_cvtps_epi32(_mm256_mul_ps(v3, f)));
    }
}

/* quantize_q8_k with AVX2: the first value of largest magnitude found as the scalar loop finds
 * it, the same factor, rounding and clamp, the 16-sums in int16 lanes: the same bits. */
AVX2_QIN static void quantize_q8_k_avx2(const float *x, uint64_t n, int8_t *q, float *d,
                                        int16_t *s)
{
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (uint64_t b = 0; b < n / 256; b++) {
        const float *v = x + b * 256;
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 256; j += 8)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(v + j), abs));
        float amax = hmax8(m), max = 0;
        int8_t *qb = q + b * 256;
        if (amax == 0) {
            d[b] = 0;
            memset(qb, 0, 256);
            memset(s + b * 16, 0, 16 * sizeof(int16_t));
            continue;
        }
        for (int j = 0; j < 256; j++)
            if (fabsf(v[j]) == amax) {
                max = v[j];
                break;
            }
        float is = -127.0f / max;
        __m256 f = _mm256_set1_ps(is);
        __m256i top = _mm256_set1_epi32(127);
        for (int j = 0; j < 256; j += 32) {
            __m256i r[4];
            for (int k = 0; k < 4; k++)
                r[k] = _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(f, _mm256_loadu_ps(v + j + 8 * k))), top);
            store_i8x32(qb + j, r[0], r[1], r[2], r[3]);
            /* the 16-sums of these 32: pairs of vectors of eight, summed across lanes */
            for (int h = 0; h < 2; h++) {
                __m256i t = _mm256_add_epi32(r[2 * h], r[2 * h + 1]);
                __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
                u = _mm_hadd_epi32(u, u);
                u = _mm_hadd_epi32(u, u);
                s[b * 16 + j / 16 + h] = (int16_t)_mm_cvtsi128_si32(u);
            }
        }
        d[b] = 1 / is;
    }
}
#endif

void ty__cpu_quantize_inputs(uint32_t weight_type, const float *x, uint64_t n, int8_t *q, float *d,
                             int16_t *s)
{
    bool k = ty__cpu_input_block(weight_type) == 256;
#if defined(__x86_64__)
    if (ty__cpu_have_avx2()) {
        if (k)
            quantize_q8_k_avx2(x, n, q, d, s);
        else
            quantize_q8_0_avx2(x, n, q, d);
        return;
    }
#endif
    if (k)
        quantize_q8_k(x, n, q, d, s);
    else
        quantize_q8_0(x, n, q, d, ty__cpu_f16_table());
}

void ty__cpu_round_inputs(uint32_t weight_type, const float *x, float *xr, uint64_t cols,
                          uint32_t T)
{
    uint32_t ib = ty__cpu_input_block(weight_type);
    for (uint64_t b = 0; b < T * (cols / ib); b++) {
        int8_t q[256];
        int16_t s[16];
        float d;
        ty__cpu_quantize_inputs(weight_type, x + b * ib, ib, q, &d, s);
        for (uint32_t j = 0; j < ib; j++)
            xr[b * ib + j] = d * (float)q[j];
    }
}

/* ---- scalar reference ---------------------------------------------------------------------- */

static float half_at(const float *h2f, const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return h2f[h];
}

static float dot_mxfp4(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb)
{
    float sum = 0;
    for (uint64_t b = 0; b < nb; b++, w += 17) {
        const int8_t *q = x->q + b * 32;
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += ty__mxfp4_values[w[1 + j] & 15] * q[j] + ty__mxfp4_values[w[1 + j] >> 4] * q[j + 16];
        sum += x->d[b] * ty__mxfp4_scale(w[0]) * (float)s;
    }
    return sum;
}

static float dot_q4_0(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb)
{
    const float *h2f = ty__cpu_f16_table();
    float sum = 0;
    for (uint64_t b = 0; b < nb; b++, w += 18) {
        const int8_t *q = x->q + b * 32;
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += ((w[2 + j] & 15) - 8) * q[j] + ((w[2 + j] >> 4) - 8) * q[j + 16];
        sum += half_at(h2f, w) * x->d[b] * (float)s;
    }
    return sum;
}

/* Q4_K and Q5_K: per 256 values, sum_s sc_s * (q . x over sub-block s) and
 * sum_s m_s * (sum of x's quants over s, from the 16-sums) in int32, then
 * d * dx * the first - dmin * dx * the second. */
static float dot_k45(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb, bool q5)
{
    const float *h2f = ty__cpu_f16_table();
    uint32_t bytes = q5 ? 176 : 144;
    float sum = 0;
    for (uint64_t b = 0; b < nb; b++, w += bytes) {
        const unsigned char *qh = w + 16, *qs = w + (q5 ? 48 : 16);
        const int8_t *q = x->q + b * 256;
        const int16_t *bs = x->s + b * 16;
        uint8_t sc[8], mn[8];
        ty__cpu_k_scales(w + 4, sc, mn);
        int32_t sumi = 0, summ = 0;
        for (int s = 0; s < 8; s++) {
            int32_t dot = 0;
            for (int l = 0; l < 32; l++) {
                int v = s % 2 ? qs[32 * (s / 2) + l] >> 4 : qs[32 * (s / 2) + l] & 15;
                if (q5)
                    v += (qh[l] >> s & 1) << 4;
                dot += v * q[32 * s + l];
            }
            sumi += sc[s] * dot;
            summ += mn[s] * (bs[2 * s] + bs[2 * s + 1]);
        }
        sum +=
            half_at(h2f, w) * x->d[b] * (float)sumi - half_at(h2f, w + 2) * x->d[b] * (float)summ;
    }
    return sum;
}

static float dot_q4_k(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb)
{
    return dot_k45(w, x, nb, false);
}

static float dot_q5_k(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb)
{
    return dot_k45(w, x, nb, true);
}

/* The 6-bit value (0..63, before the -32) of element i (0..255) of a Q6_K block. */
static int q6_value(const unsigned char *w, int i)
{
    int h = i / 128, r = i % 128, k = r / 32, l = r % 32;
    const unsigned char *ql = w + 64 * h, *qh = w + 128 + 32 * h;
    int lo = k % 2 ? ql[l + 32] : ql[l];
    lo = k / 2 ? lo >> 4 : lo & 15;
    return lo | (qh[l] >> (2 * k) & 3) << 4;
}

static float dot_q6_k(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb)
{
    const float *h2f = ty__cpu_f16_table();
    float sum = 0;
    for (uint64_t b = 0; b < nb; b++, w += 210) {
        const int8_t *q = x->q + b * 256, *sc = (const int8_t *)(w + 192);
        int32_t sumi = 0;
        for (int s = 0; s < 16; s++) {
            int32_t dot = 0;
            for (int j = 0; j < 16; j++)
                dot += (q6_value(w, 16 * s + j) - 32) * q[16 * s + j];
            sumi += sc[s] * dot;
        }
        sum += half_at(h2f, w + 208) * x->d[b] * (float)sumi;
    }
    return sum;
}

/* ---- AVX2 ---------------------------------------------------------------------------------- */

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* Q4_0 and MXFP4, 32 4-bit codes per block after a 2- or 1-byte scale: the 16 bytes widen to
 * 32 codes (low nibbles in the low lane), which become signed values (Q4_0: less 8; MXFP4: a
 * byte shuffle through the table of doubled E2M1 values), then signed x signed through
 * maddubs (|w| with x carrying w's sign); each block's factor is the weight scale (Q4_0's f16
 * d, MXFP4's 2^(e - 128)) times the input's, as ggml multiplies them. */
__attribute__((always_inline)) AVX2 static inline float
dot_nib32_avx2(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb, bool mx)
{
    const __m256i m4 = _mm256_set1_epi8(15), eight = _mm256_set1_epi8(8);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m128i t = _mm_loadu_si128((const __m128i *)ty__mxfp4_values);
    const __m256i lut = _mm256_set_m128i(t, t);
    const uint32_t head = mx ? 1 : 2;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (uint64_t b = 0; b < nb; b++, w += head + 16) {
        __m128i raw = _mm_loadu_si128((const __m128i *)(w + head));
        __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), m4);
        v = mx ? _mm256_shuffle_epi8(lut, v) : _mm256_sub_epi8(v, eight);
        __m256i q = _mm256_loadu_si256((const __m256i *)(x->q + b * 32));
        __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(q, v));
        __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        __m256 d = _mm256_set1_ps((mx ? ty__mxfp4_scale(w[0]) : ty__cpu_half_f16c(w)) * x->d[b]);
        if (b % 2)
            acc1 = _mm256_fmadd_ps(d, f, acc1);
        else
            acc0 = _mm256_fmadd_ps(d, f, acc0);
    }
    return ty__cpu_hsum8(_mm256_add_ps(acc0, acc1));
}

AVX2 static float dot_q4_0_avx2(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb)
{
    return dot_nib32_avx2(w, x, nb, false);
}

AVX2 static float dot_mxfp4_avx2(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb)
{
    return dot_nib32_avx2(w, x, nb, true);
}

/* A K block's eight 6-bit scales (low 128 bits) and mins (high 128 bits) as int16 lanes: the
 * unpacking of ty__cpu_k_scales, done on three 32-bit words at once. */
AVX2 static __m256i k_scales_avx2(const unsigned char *s)
{
    uint32_t u[3];
    memcpy(u, s, 12);
    uint32_t sc_lo = u[0] & 0x3f3f3f3f, mn_lo = u[1] & 0x3f3f3f3f;
    uint32_t sc_hi = (u[2] & 0x0f0f0f0f) | (u[0] >> 6 & 0x03030303) << 4;
    uint32_t mn_hi = (u[2] >> 4 & 0x0f0f0f0f) | (u[1] >> 6 & 0x03030303) << 4;
    return _mm256_cvtepu8_epi16(
        _mm_set_epi32((int)mn_hi, (int)mn_lo, (int)sc_hi, (int)sc_lo));
}

/* Q4_K / Q5_K: each 32-byte run of nibbles gives two sub-blocks of 32 unsigned values (plus
 * 16 for a set fifth bit); maddubs (unsigned values x signed inputs, no saturation: 31 * 127 *
 * 2 < 2^15), madd by the sub-block's scale (broadcast from the unpacked scales by a byte
 * shuffle) into int32 lanes summed over the block. The mins' share: the pairs of 16-sums
 * (one per sub-block) madd the mins, four int32 lanes per block scaled by dmin * dx. */
__attribute__((always_inline)) AVX2 static inline float
dot_k45_avx2(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb, bool q5)
{
    const __m256i m4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
    uint32_t bytes = q5 ? 176 : 144;
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (uint64_t b = 0; b < nb; b++, w += bytes) {
        const unsigned char *qs = w + (q5 ? 48 : 16);
        const int8_t *q = x->q + b * 256;
        __m256i scmn = k_scales_avx2(w + 4);
        __m128i sc128 = _mm256_castsi256_si128(scmn);
        __m256i sc = _mm256_set_m128i(sc128, sc128);
        __m256i bs = _mm256_loadu_si256((const __m256i *)(x->s + b * 16));
        __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        __m128i summ = _mm_madd_epi16(_mm256_extracti128_si256(scmn, 1), pairs);
        __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(raw, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if (q5) {
                __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * c)));
                __m256i b1 = _mm256_set1_epi8((char)(2 << (2 * c)));
                lo = _mm256_or_si256(
                    lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), sixteen));
                hi = _mm256_or_si256(
                    hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen));
            }
            /* int16 lane 2c (bytes 4c, 4c + 1) and lane 2c + 1 everywhere */
            __m256i s0 = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((short)((4 * c + 1) << 8 | 4 * c)));
            __m256i s1 =
                _mm256_shuffle_epi8(sc, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
            __m256i p0 =
                _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(q + 64 * c)));
            __m256i p1 =
                _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 64 * c + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(p0, s0),
                                                           _mm256_madd_epi16(p1, s1)));
        }
        float dx = x->d[b];
        acc = _mm256_fmadd_ps(_mm256_set1_ps(ty__cpu_half_f16c(w) * dx), _mm256_cvtepi32_ps(sumi), acc);
        accm = _mm_fmadd_ps(_mm_set1_ps(ty__cpu_half_f16c(w + 2) * dx), _mm_cvtepi32_ps(summ), accm);
    }
    accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    accm = _mm_add_ss(accm, _mm_shuffle_ps(accm, accm, 1));
    return ty__cpu_hsum8(acc) - _mm_cvtss_f32(accm);
}

AVX2 static float dot_q4_k_avx2(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb)
{
    return dot_k45_avx2(w, x, nb, false);
}

AVX2 static float dot_q5_k_avx2(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb)
{
    return dot_k45_avx2(w, x, nb, true);
}

/* Q6_K: the unsigned 6-bit values (0..63) through maddubs (63 * 127 * 2 < 2^15), madd by the
 * two 16-value scales of each 32-value load (a byte shuffle of the 16 scales, widened); the
 * -32 comes back in int32 as 32 * sum_s sc_s * 16-sum_s (one madd), so a block is one
 * integer sum (|sum| < 2^29) times d * dx. */
AVX2 static float dot_q6_k_avx2(const unsigned char *w, const struct ty_cpu_qin *x, uint64_t nb)
{
    /* bytes 0..7 pick scale 0, bytes 8..15 scale 1; plus s for the pair (s, s + 1) */
    const __m128i pair = _mm_set_epi64x(0x0101010101010101LL, 0);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < nb; b++, w += 210) {
        const int8_t *q = x->q + b * 256;
        __m128i sc = _mm_loadu_si128((const __m128i *)(w + 192));
        __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc),
                                         _mm256_loadu_si256((const __m256i *)(x->s + b * 16)));
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i v[4];
            ty__cpu_q6_k_unpack(w, h, v);
            for (int k = 0; k < 4; k++) {
                __m256i p = _mm256_maddubs_epi16(
                    v[k], _mm256_loadu_si256((const __m256i *)(q + 128 * h + 32 * k)));
                __m256i scv = _mm256_cvtepi8_epi16(
                    _mm_shuffle_epi8(sc, _mm_add_epi8(pair, _mm_set1_epi8((char)(8 * h + 2 * k)))));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scv));
            }
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(ty__cpu_half_f16c(w + 208) * x->d[b]),
                              _mm256_cvtepi32_ps(sumi), acc);
    }
    return ty__cpu_hsum8(acc);
}
#endif

ty_cpu_qdot_fn ty__cpu_qdot_kernel(uint32_t weight_type, bool avx2)
{
#if defined(__x86_64__)
    if (avx2) {
        switch (weight_type) {
        case TY_GGML_Q4_0:
            return dot_q4_0_avx2;
        case TY_GGML_MXFP4:
            return dot_mxfp4_avx2;
        case TY_GGML_Q4_K:
            return dot_q4_k_avx2;
        case TY_GGML_Q5_K:
            return dot_q5_k_avx2;
        case TY_GGML_Q6_K:
            return dot_q6_k_avx2;
        default:
            return NULL;
        }
    }
#else
    (void)avx2;
#endif
    switch (weight_type) {
    case TY_GGML_Q4_0:
        return dot_q4_0;
    case TY_GGML_MXFP4:
        return dot_mxfp4;
    case TY_GGML_Q4_K:
        return dot_q4_k;
    case TY_GGML_Q5_K:
        return dot_q5_k;
    case TY_GGML_Q6_K:
        return dot_q6_k;
    default:
        return NULL;
    }
}
