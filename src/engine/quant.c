/* ggml block formats, quantized and widened on the host (include/tycho/quant.h).
 *
 * Block layouts (ggml-common.h; d, dmin are IEEE halves; "type-0" x = d * q, "type-1"
 * x = d * q - m):
 *   Q8_0  32 values,  34 bytes: d, 32 x int8
 *   Q4_0  32 values,  18 bytes: d, 16 bytes: value j in the low nibble of byte j, value j + 16
 *         in its high nibble; x = d * (nibble - 8)
 *   Q4_K 256 values, 144 bytes: d, dmin, 12 bytes of eight 6-bit scales and mins (one per 32
 *         values; ty__cpu_k_scales), 128 bytes: each 32-byte run holds 64 values, the low
 *         nibbles the first 32 (scale 2c), the high nibbles the next 32 (scale 2c + 1);
 *         x = d * sc * q - dmin * m
 *   Q5_K 256 values, 176 bytes: as Q4_K with 32 bytes of fifth bits between the scales and
 *         the nibbles: value l of 64-value run c takes bit 2c of byte l, value 32 + l bit 2c + 1
 *   Q6_K 256 values, 210 bytes: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8
 *         scales (one per 16 values), d. Each half of 128 values uses 64 low-nibble bytes and
 *         32 high bytes: values l, l + 32, l + 64, l + 96 (l < 32) are the low nibble of byte
 *         l, of byte l + 32, the high nibble of byte l, of byte l + 32, with bit pairs 0-1,
 *         2-3, 4-5, 6-7 of high byte l on top; x = d * sc * (q - 32)
 *   MXFP4 32 values,  17 bytes: e (E8M0), 16 bytes of FP4 (E2M1) codes laid out as Q4_0's
 *         nibbles; x = ty__mxfp4_values[code] * 2^(e - 128) (the table holds twice each E2M1
 *         value: 0, 1, 2, 3, 4, 6, 8, 12 and their negatives, as ggml keeps them)
 * The widening evaluates each value in ggml's order (d * sc first, then times q, less the
 * min), so an embedding row read here is what llama.cpp's dequantize_row gives. */
#include "tycho/quant.h"

#include "cpu/cpu-impl.h" /* the f16 table, f32 -> half, K-quant scale unpacking */
#include "tycho/errors.h"
#include "tycho/gguf.h"

#include <math.h>
#include <string.h>

bool ty_quant_is_block(uint32_t type)
{
    return type == TY_GGML_Q8_0 || type == TY_GGML_Q4_0 || type == TY_GGML_Q4_K ||
           type == TY_GGML_Q5_K || type == TY_GGML_Q6_K || type == TY_GGML_MXFP4;
}

const int8_t ty__mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float ty__mxfp4_scale(uint8_t e)
{
    /* 2^(e - 128): f32 exponent field e - 1, or the subnormals 2^-128 and 2^-127 */
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float half_at(const float *h2f, const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return h2f[h];
}

static void put_half(unsigned char *p, float f)
{
    uint16_t h = ty__cpu_f32_to_half1(f);
    memcpy(p, &h, 2);
}

/* ---- widening ------------------------------------------------------------------------------ */

static void deq_q8_0(const unsigned char *p, float *y, const float *h2f)
{
    float d = half_at(h2f, p);
    for (int j = 0; j < 32; j++)
        y[j] = d * (float)(int8_t)p[2 + j];
}

static void deq_mxfp4(const unsigned char *p, float *y)
{
    float d = ty__mxfp4_scale(p[0]);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)ty__mxfp4_values[p[1 + j] & 15] * d;
        y[j + 16] = (float)ty__mxfp4_values[p[1 + j] >> 4] * d;
    }
}

static void deq_q4_0(const unsigned char *p, float *y, const float *h2f)
{
    float d = half_at(h2f, p);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((p[2 + j] & 15) - 8);
        y[j + 16] = d * (float)((p[2 + j] >> 4) - 8);
    }
}

/* Q4_K and Q5_K (qh NULL for Q4_K). */
static void deq_k45(const unsigned char *p, const unsigned char *qh, const unsigned char *qs,
                    float *y, const float *h2f)
{
    float d = half_at(h2f, p), dmin = half_at(h2f, p + 2);
    uint8_t sc[8], mn[8];
    ty__cpu_k_scales(p + 4, sc, mn);
    for (int c = 0; c < 4; c++, qs += 32, y += 64) {
        float d1 = d * sc[2 * c], m1 = dmin * mn[2 * c];
        float d2 = d * sc[2 * c + 1], m2 = dmin * mn[2 * c + 1];
        for (int l = 0; l < 32; l++) {
            int h1 = qh ? (qh[l] >> (2 * c) & 1) << 4 : 0;
            int h2 = qh ? (qh[l] >> (2 * c + 1) & 1) << 4 : 0;
            y[l] = d1 * (float)((qs[l] & 15) + h1) - m1;
            y[l + 32] = d2 * (float)((qs[l] >> 4) + h2) - m2;
        }
    }
}

static void deq_q6_k(const unsigned char *p, float *y, const float *h2f)
{
    float d = half_at(h2f, p + 208);
    for (int h = 0; h < 2; h++, y += 128) {
        const unsigned char *ql = p + 64 * h, *qh = p + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(p + 192) + 8 * h;
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 15) | (qh[l] & 3) << 4) - 32;
            int q2 = ((ql[l + 32] & 15) | (qh[l] >> 2 & 3) << 4) - 32;
            int q3 = ((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4) - 32;
            int q4 = ((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

int ty_quant_row_dequantize(uint32_t type, const void *in, float *out, uint64_t n)
{
    uint32_t block = ty_ggml_type_block(type);
    if (!ty_quant_is_block(type) || n % block)
        return TY_EINVAL;
    const float *h2f = ty__cpu_f16_table();
    const unsigned char *p = in;
    uint64_t bytes = ty_ggml_type_nbytes(type, block);
    for (uint64_t b = 0; b < n / block; b++, p += bytes, out += block) {
        switch (type) {
        case TY_GGML_Q8_0:
            deq_q8_0(p, out, h2f);
            break;
        case TY_GGML_Q4_0:
            deq_q4_0(p, out, h2f);
            break;
        case TY_GGML_MXFP4:
            deq_mxfp4(p, out);
            break;
        case TY_GGML_Q4_K:
            deq_k45(p, NULL, p + 16, out, h2f);
            break;
        case TY_GGML_Q5_K:
            deq_k45(p, p + 16, p + 48, out, h2f);
            break;
        default:
            deq_q6_k(p, out, h2f);
            break;
        }
    }
    return 0;
}

/* ---- quantizing ---------------------------------------------------------------------------- */

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* The value of largest magnitude among n (its sign kept), as ggml's absmax quantizers use. */
static float signed_absmax(const float *x, int n)
{
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax)
            amax = fabsf(x[j]), max = x[j];
    return max;
}

static void q_q8_0(const float *x, unsigned char *p)
{
    float amax = fabsf(signed_absmax(x, 32)), d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    put_half(p, d);
    for (int j = 0; j < 32; j++)
        p[2 + j] = (unsigned char)(int8_t)nearbyintf(x[j] * id);
}

/* Q4_0: the largest-magnitude value becomes -8 exactly; the others round to nearest. */
static void q_q4_0(const float *x, unsigned char *p)
{
    float d = signed_absmax(x, 32) / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    put_half(p, d);
    for (int j = 0; j < 16; j++) {
        int a = clampi((int)floorf(x[j] * id + 8.5f), 0, 15);
        int b = clampi((int)floorf(x[j + 16] * id + 8.5f), 0, 15);
        p[2 + j] = (unsigned char)(a | b << 4);
    }
}

/* MXFP4 as ggml's reference quantizer: e = floor(log2 max|x|) - 2 + 127 (0 for an all-zero
 * block), so the largest magnitude is 4 to 8 times 2^(e - 127) (E2M1 reaches 6; above that
 * it saturates), then each value takes the nearest level (the first on a tie). */
static void q_mxfp4(const float *x, unsigned char *p)
{
    float amax = 0;
    for (int j = 0; j < 32; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    uint8_t e = amax > 0 ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
    float d = ty__mxfp4_scale(e);
    p[0] = e;
    for (int j = 0; j < 32; j++) {
        int best = 0;
        float err = fabsf((float)ty__mxfp4_values[0] * d - x[j]);
        for (int i = 1; i < 16; i++) {
            float e2 = fabsf((float)ty__mxfp4_values[i] * d - x[j]);
            if (e2 < err)
                best = i, err = e2;
        }
        if (j < 16)
            p[1 + j] = (unsigned char)best;
        else
            p[1 + j - 16] |= (unsigned char)(best << 4);
    }
}

/* Pack eight 6-bit scales and mins as ty__cpu_k_scales unpacks them. */
static void k_scales_pack(const uint8_t sc[8], const uint8_t mn[8], unsigned char s[12])
{
    for (int j = 0; j < 4; j++) {
        s[j] = sc[j];
        s[j + 4] = mn[j];
    }
    for (int j = 4; j < 8; j++) {
        s[j + 4] = (unsigned char)((sc[j] & 15) | (mn[j] & 15) << 4);
        s[j - 4] |= (unsigned char)((sc[j] >> 4) << 6);
        s[j] |= (unsigned char)((mn[j] >> 4) << 6);
    }
}

/* Q4_K (nmax 15) and Q5_K (nmax 31): per 32 values a step (max - min) / nmax and a min
 * (min clipped to <= 0, as ggml's make_qkx quantizers do), both quantized to 6 bits against
 * the block's largest, then every value to the nearest level of its quantized step. */
static void q_k45(const float *x, unsigned char *p, int nmax)
{
    float step[8], mins[8], max_step = 0, max_min = 0;
    for (int s = 0; s < 8; s++) {
        float lo = 0, hi = x[32 * s];
        for (int l = 0; l < 32; l++) {
            lo = x[32 * s + l] < lo ? x[32 * s + l] : lo;
            hi = x[32 * s + l] > hi ? x[32 * s + l] : hi;
        }
        step[s] = hi > lo ? (hi - lo) / (float)nmax : 0.0f;
        mins[s] = -lo;
        max_step = step[s] > max_step ? step[s] : max_step;
        max_min = mins[s] > max_min ? mins[s] : max_min;
    }
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; s++) {
        sc[s] =
            (uint8_t)(max_step > 0 ? clampi((int)nearbyintf(63 * step[s] / max_step), 0, 63) : 0);
        mn[s] = (uint8_t)(max_min > 0 ? clampi((int)nearbyintf(63 * mins[s] / max_min), 0, 63) : 0);
    }
    put_half(p, max_step / 63.0f);
    put_half(p + 2, max_min / 63.0f);
    memset(p + 4, 0, (size_t)(nmax == 15 ? 140 : 172));
    k_scales_pack(sc, mn, p + 4);
    const float *h2f = ty__cpu_f16_table();
    float d = half_at(h2f, p), dmin = half_at(h2f, p + 2);
    unsigned char *qh = nmax == 31 ? p + 16 : NULL, *qs = p + (nmax == 31 ? 48 : 16);
    for (int s = 0; s < 8; s++) {
        float dl = d * sc[s], ml = dmin * mn[s];
        for (int l = 0; l < 32; l++) {
            int q = dl > 0 ? clampi((int)nearbyintf((x[32 * s + l] + ml) / dl), 0, nmax) : 0;
            int c = s / 2, i = 32 * c + l; /* byte of run c */
            qs[i] |= (unsigned char)((q & 15) << (s % 2 ? 4 : 0));
            if (qh)
                qh[l] |= (unsigned char)((q >> 4) << s);
        }
    }
}

/* Q6_K: per 16 values the largest-magnitude one maps to -32; the 16 steps are quantized to
 * int8 against the block's largest step (which becomes -128), the values to [-32, 31]. */
static void q_q6_k(const float *x, unsigned char *p)
{
    float step[16], max_step = 0, amax_step = 0;
    for (int s = 0; s < 16; s++) {
        step[s] = signed_absmax(x + 16 * s, 16) / -32.0f;
        if (fabsf(step[s]) > amax_step)
            amax_step = fabsf(step[s]), max_step = step[s];
    }
    float is = max_step != 0 ? -128.0f / max_step : 0.0f;
    int8_t *sc = (int8_t *)(p + 192);
    for (int s = 0; s < 16; s++)
        sc[s] = (int8_t)clampi((int)nearbyintf(is * step[s]), -128, 127);
    put_half(p + 208, is != 0 ? 1.0f / is : 0.0f);
    float d = half_at(ty__cpu_f16_table(), p + 208);
    uint8_t q[256];
    for (int i = 0; i < 256; i++) {
        float dl = d * sc[i / 16];
        q[i] = (uint8_t)(dl != 0 ? clampi((int)nearbyintf(x[i] / dl), -32, 31) + 32 : 32);
    }
    for (int h = 0; h < 2; h++) {
        unsigned char *ql = p + 64 * h, *qh = p + 128 + 32 * h;
        const uint8_t *v = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (unsigned char)((v[l] & 15) | (v[l + 64] & 15) << 4);
            ql[l + 32] = (unsigned char)((v[l + 32] & 15) | (v[l + 96] & 15) << 4);
            qh[l] = (unsigned char)(v[l] >> 4 | (v[l + 32] >> 4) << 2 | (v[l + 64] >> 4) << 4 |
                                    (v[l + 96] >> 4) << 6);
        }
    }
}

int ty_quant_row_quantize(uint32_t type, const float *x, void *out, uint64_t n)
{
    uint32_t block = ty_ggml_type_block(type);
    if (!ty_quant_is_block(type) || n % block)
        return TY_EINVAL;
    unsigned char *p = out;
    uint64_t bytes = ty_ggml_type_nbytes(type, block);
    for (uint64_t b = 0; b < n / block; b++, p += bytes, x += block) {
        switch (type) {
        case TY_GGML_Q8_0:
            q_q8_0(x, p);
            break;
        case TY_GGML_Q4_0:
            q_q4_0(x, p);
            break;
        case TY_GGML_MXFP4:
            q_mxfp4(x, p);
            break;
        case TY_GGML_Q4_K:
            q_k45(x, p, 15);
            break;
        case TY_GGML_Q5_K:
            q_k45(x, p, 31);
            break;
        default:
            q_q6_k(x, p);
            break;
        }
    }
    return 0;
}
