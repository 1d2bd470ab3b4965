/* Prefill's matmul on block-quantized weights: integer products on 8-row panels (cpu-impl.h).
 *
 * With a few dozen tokens or more every weight is multiplied by many inputs, so the weights
 * can be rearranged once per call and the arithmetic done in the layout that suits AVX2's
 * integer multiplies. Each pool worker takes groups of PR (8) rows; for a group it unpacks the
 * rows' blocks into a panel in its own scratch: the values (Q8_0 as int16, Q4_K and Q6_K as
 * unsigned 8-bit) of the eight rows interleaved 32 bits at a time, so one 256-bit register holds
 * the same 2 (int16) or 4 (8-bit) positions of eight rows, and the block scales beside them as
 * vectors of eight rows. A token's inputs, quantized once per call (ty__cpu_quantize_inputs),
 * are then broadcast 32 bits at a time and one madd (int16) or maddubs (8-bit) gives eight
 * rows' partial sums in eight lanes: no horizontal sums, and each weight register serves PT
 * tokens. Small values are summed in int16 across a sub-block before one madd by the
 * sub-block scale (Q4_K: eight maddubs of 0..15 x |127|; Q6_K: two of 0..63 x |127|), so a
 * K-quant block costs about one multiply per 32 products.
 *
 * The block sums are exact integers, scaled per block into f32 as llama.cpp's kernels do; the
 * f32 sum runs over blocks in order, so a token's output does not depend on the other tokens
 * or the thread count (it may differ in the last bits from the few-token kernels, which sum
 * the same products in another order). AVX2 only; other types and machines keep the tiles. */
#include "cpu-impl.h"

#include "tycho/errors.h"
#include "tycho/gguf.h"

#include <stdlib.h>
#include <string.h>

#define PR 8 /* rows per panel: the lanes of a 256-bit register of int32 */
#define PT 4 /* tokens per micro-kernel step */

/* Panel bytes per weight block (8 rows): */
#define Q8_0_PB (32 + 16 * 32)                /* d[8]; 16 x (8 rows x 2 int16) */
#define Q4_K_PB (64 + 8 * 32 + 4 * 32 + 2048) /* d, dmin; scales; min pairs; 64 x (8 x 4 u8) */
#define Q6_K_PB (32 + 16 * 32 + 8 * 32 + 2048) /* d; scales; scale pairs; 64 x (8 x 4 u8) */

struct qpanel {
    const struct ty_weight *w;
    const float *x;
    float *y;
    uint32_t T;
    uint64_t cols, nb; /* columns, blocks per row */
    size_t rb;         /* bytes per weight row */
    uint32_t ib;       /* input block: 32 or 256 */
    int8_t *xq;        /* (T, cols) quantized inputs */
    int16_t *x16;      /* Q8_0: the same widened to int16 */
    float *xd;         /* (T, nb) their scales */
    int16_t *xs;       /* Q8_K: (T, cols / 16) sums of 16 quants */
    unsigned char *panels;
    size_t panel_bytes; /* per worker */
};

static size_t block_bytes(uint32_t type)
{
    switch (type) {
    case TY_GGML_Q8_0:
        return Q8_0_PB;
    case TY_GGML_Q4_K:
        return Q4_K_PB;
    case TY_GGML_Q6_K:
        return Q6_K_PB;
    default:
        return 0;
    }
}

/* Token rows [begin, end) quantized (a pool task); Q8_0 widened to int16 too. */
static void quantize_task(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    (void)thread;
    const struct qpanel *g = arg;
    for (uint32_t t = begin; t < end; t++) {
        int8_t *q = g->xq + (size_t)t * g->cols;
        ty__cpu_quantize_inputs(g->w->type, g->x + (size_t)t * g->cols, g->cols, q,
                                g->xd + (size_t)t * g->nb,
                                g->xs ? g->xs + (size_t)t * (g->cols / 16) : NULL);
        if (g->x16)
            for (uint64_t c = 0; c < g->cols; c++)
                g->x16[(size_t)t * g->cols + c] = q[c];
    }
}

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static float half_at(const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* out[w * 8 + i] = 32-bit word w of vals[i] (words of the rows' values, interleaved). */
static void interleave(uint32_t *out, uint32_t vals[PR][64], uint32_t words)
{
    for (uint32_t k = 0; k < words; k++)
        for (uint32_t i = 0; i < PR; i++)
            out[k * PR + i] = vals[i][k];
}

static uint32_t pair16(int a, int b)
{
    return (uint32_t)(uint16_t)(int16_t)a | (uint32_t)(uint16_t)(int16_t)b << 16;
}

/* ---- Q8_0 ---------------------------------------------------------------------------------- */

AVX2 static void pack_q8_0(const struct qpanel *g, uint32_t r0, uint32_t nr, unsigned char *p)
{
    uint32_t vals[PR][64];
    for (uint64_t b = 0; b < g->nb; b++, p += Q8_0_PB) {
        float *d = (float *)p;
        for (uint32_t i = 0; i < PR; i++) {
            if (i >= nr) {
                d[i] = 0;
                memset(vals[i], 0, sizeof(vals[i]));
                continue;
            }
            const unsigned char *blk = (const unsigned char *)g->w->data + (r0 + i) * g->rb + b * 34;
            d[i] = half_at(blk);
            __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 2));
            _mm256_storeu_si256((__m256i *)vals[i],
                                _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)));
            _mm256_storeu_si256((__m256i *)(vals[i] + 8),
                                _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)));
        }
        interleave((uint32_t *)(p + 32), vals, 16);
    }
}

/* Eight rows x PT tokens: per block 16 madds of the rows' int16 pairs by each token's
 * broadcast pair, into int32; then to f32 by d_w (eight lanes) x d_x. */
AVX2 static void kern_q8_0(const struct qpanel *g, const unsigned char *p, uint32_t t,
                           __m256 acc[PT])
{
    const int16_t *x[PT];
    const float *xd[PT];
    for (uint32_t j = 0; j < PT; j++) {
        uint32_t tj = t + j < g->T ? t + j : g->T - 1;
        x[j] = g->x16 + (size_t)tj * g->cols;
        xd[j] = g->xd + (size_t)tj * g->nb;
        acc[j] = _mm256_setzero_ps();
    }
    for (uint64_t b = 0; b < g->nb; b++, p += Q8_0_PB) {
        __m256i s[PT];
        for (int j = 0; j < PT; j++)
            s[j] = _mm256_setzero_si256();
        const __m256i *wv = (const __m256i *)(p + 32);
        for (int k = 0; k < 16; k++) {
            __m256i w = _mm256_loadu_si256(wv + k);
            for (int j = 0; j < PT; j++) {
                int32_t xp;
                memcpy(&xp, x[j] + b * 32 + 2 * k, 4);
                s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(w, _mm256_set1_epi32(xp)));
            }
        }
        __m256 d = _mm256_loadu_ps((const float *)p);
        for (int j = 0; j < PT; j++)
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]),
                                     _mm256_mul_ps(d, _mm256_set1_ps(xd[j][b])), acc[j]);
    }
}

/* ---- Q4_K ---------------------------------------------------------------------------------- */

AVX2 static void pack_q4_k(const struct qpanel *g, uint32_t r0, uint32_t nr, unsigned char *p)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    uint32_t vals[PR][64];
    for (uint64_t b = 0; b < g->nb; b++, p += Q4_K_PB) {
        float *d = (float *)p, *dmin = d + 8;
        uint32_t *sc = (uint32_t *)(p + 64), *mp = sc + 64;
        for (uint32_t i = 0; i < PR; i++) {
            if (i >= nr) {
                d[i] = dmin[i] = 0;
                memset(vals[i], 0, sizeof(vals[i]));
                for (int s = 0; s < 8; s++)
                    sc[s * PR + i] = 0;
                for (int q = 0; q < 4; q++)
                    mp[q * PR + i] = 0;
                continue;
            }
            const unsigned char *blk =
                (const unsigned char *)g->w->data + (r0 + i) * g->rb + b * 144;
            d[i] = half_at(blk);
            dmin[i] = half_at(blk + 2);
            uint8_t s8[8], m8[8];
            ty__cpu_k_scales(blk + 4, s8, m8);
            for (int s = 0; s < 8; s++)
                sc[s * PR + i] = pair16(s8[s], s8[s]);
            for (int q = 0; q < 4; q++)
                mp[q * PR + i] = pair16(m8[2 * q], m8[2 * q + 1]);
            for (int c = 0; c < 4; c++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * c));
                _mm256_storeu_si256((__m256i *)(vals[i] + 16 * c), _mm256_and_si256(raw, m4));
                _mm256_storeu_si256((__m256i *)(vals[i] + 16 * c + 8),
                                    _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
            }
        }
        interleave((uint32_t *)(p + 64 + 256 + 128), vals, 64);
    }
}

/* Per sub-block of 32: eight maddubs (0..15 x |127|, at most 30480 in int16), one madd by the
 * eight rows' scales; per block the mins by the 32-sums of the inputs; to f32 by d, dmin. */
AVX2 static void kern_q4_k(const struct qpanel *g, const unsigned char *p, uint32_t t,
                           __m256 acc[PT])
{
    const int8_t *x[PT];
    const float *xd[PT];
    const int16_t *xs[PT];
    for (uint32_t j = 0; j < PT; j++) {
        uint32_t tj = t + j < g->T ? t + j : g->T - 1;
        x[j] = g->xq + (size_t)tj * g->cols;
        xd[j] = g->xd + (size_t)tj * g->nb;
        xs[j] = g->xs + (size_t)tj * (g->cols / 16);
        acc[j] = _mm256_setzero_ps();
    }
    for (uint64_t b = 0; b < g->nb; b++, p += Q4_K_PB) {
        const __m256i *scv = (const __m256i *)(p + 64), *mpv = scv + 8, *wv = mpv + 4;
        __m256i s[PT];
        for (int j = 0; j < PT; j++)
            s[j] = _mm256_setzero_si256();
        for (int sb = 0; sb < 8; sb++) {
            __m256i h[PT];
            for (int j = 0; j < PT; j++)
                h[j] = _mm256_setzero_si256();
            for (int k = 0; k < 8; k++) {
                __m256i w = _mm256_loadu_si256(wv + sb * 8 + k);
                for (int j = 0; j < PT; j++) {
                    int32_t xp;
                    memcpy(&xp, x[j] + b * 256 + 32 * sb + 4 * k, 4);
                    h[j] = _mm256_add_epi16(h[j], _mm256_maddubs_epi16(w, _mm256_set1_epi32(xp)));
                }
            }
            __m256i sc = _mm256_loadu_si256(scv + sb);
            for (int j = 0; j < PT; j++)
                s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(h[j], sc));
        }
        __m256 d = _mm256_loadu_ps((const float *)p), dmin = _mm256_loadu_ps((const float *)p + 8);
        for (int j = 0; j < PT; j++) {
            const int16_t *bs = xs[j] + b * 16;
            __m256i m = _mm256_setzero_si256();
            for (int q = 0; q < 4; q++) {
                /* the 32-sums of sub-blocks 2q, 2q + 1 (at most 32 x 127: int16) */
                int32_t pr = (int32_t)pair16(bs[4 * q] + bs[4 * q + 1], bs[4 * q + 2] + bs[4 * q + 3]);
                m = _mm256_add_epi32(
                    m, _mm256_madd_epi16(_mm256_loadu_si256(mpv + q), _mm256_set1_epi32(pr)));
            }
            __m256 dx = _mm256_set1_ps(xd[j][b]);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), _mm256_mul_ps(d, dx), acc[j]);
            acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, dx), acc[j]);
        }
    }
}

/* ---- Q6_K ---------------------------------------------------------------------------------- */

AVX2 static void pack_q6_k(const struct qpanel *g, uint32_t r0, uint32_t nr, unsigned char *p)
{
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    uint32_t vals[PR][64];
    for (uint64_t b = 0; b < g->nb; b++, p += Q6_K_PB) {
        float *d = (float *)p;
        uint32_t *sc = (uint32_t *)(p + 32), *sp = sc + 128;
        for (uint32_t i = 0; i < PR; i++) {
            if (i >= nr) {
                d[i] = 0;
                memset(vals[i], 0, sizeof(vals[i]));
                for (int s = 0; s < 16; s++)
                    sc[s * PR + i] = 0;
                for (int q = 0; q < 8; q++)
                    sp[q * PR + i] = 0;
                continue;
            }
            const unsigned char *w =
                (const unsigned char *)g->w->data + (r0 + i) * g->rb + b * 210;
            const int8_t *s8 = (const int8_t *)(w + 192);
            d[i] = half_at(w + 208);
            for (int s = 0; s < 16; s++)
                sc[s * PR + i] = pair16(s8[s], s8[s]);
            for (int q = 0; q < 8; q++)
                sp[q * PR + i] = pair16(s8[2 * q], s8[2 * q + 1]);
            /* values 128h + 32k + l, as qdot.c's dot_q6_k_avx2 unpacks them */
            for (int h = 0; h < 2; h++) {
                const unsigned char *ql = w + 64 * h;
                __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
                __m256i hb = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
                __m256i v[4] = {
                    _mm256_or_si256(_mm256_and_si256(l0, m4),
                                    _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)),
                    _mm256_or_si256(_mm256_and_si256(l1, m4),
                                    _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                    _mm256_and_si256(hb, m30)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30)),
                };
                for (int k = 0; k < 4; k++)
                    _mm256_storeu_si256((__m256i *)(vals[i] + 32 * h + 8 * k), v[k]);
            }
        }
        interleave((uint32_t *)(p + 32 + 512 + 256), vals, 64);
    }
}

/* Per sub-block of 16: two pairs of maddubs (0..63 x |127|, two at most 32004 in int16), a
 * madd each by the rows' scales; the -32 offset as 32 x the scales by the inputs' 16-sums. */
AVX2 static void kern_q6_k(const struct qpanel *g, const unsigned char *p, uint32_t t,
                           __m256 acc[PT])
{
    const int8_t *x[PT];
    const float *xd[PT];
    const int16_t *xs[PT];
    for (uint32_t j = 0; j < PT; j++) {
        uint32_t tj = t + j < g->T ? t + j : g->T - 1;
        x[j] = g->xq + (size_t)tj * g->cols;
        xd[j] = g->xd + (size_t)tj * g->nb;
        xs[j] = g->xs + (size_t)tj * (g->cols / 16);
        acc[j] = _mm256_setzero_ps();
    }
    for (uint64_t b = 0; b < g->nb; b++, p += Q6_K_PB) {
        const __m256i *scv = (const __m256i *)(p + 32), *spv = scv + 16, *wv = spv + 8;
        __m256i s[PT];
        for (int j = 0; j < PT; j++)
            s[j] = _mm256_setzero_si256();
        for (int u = 0; u < 16; u++) {
            __m256i sc = _mm256_loadu_si256(scv + u);
            for (int half = 0; half < 2; half++) {
                __m256i w0 = _mm256_loadu_si256(wv + 4 * u + 2 * half);
                __m256i w1 = _mm256_loadu_si256(wv + 4 * u + 2 * half + 1);
                for (int j = 0; j < PT; j++) {
                    int32_t x0, x1;
                    memcpy(&x0, x[j] + b * 256 + 16 * u + 8 * half, 4);
                    memcpy(&x1, x[j] + b * 256 + 16 * u + 8 * half + 4, 4);
                    __m256i h = _mm256_add_epi16(_mm256_maddubs_epi16(w0, _mm256_set1_epi32(x0)),
                                                 _mm256_maddubs_epi16(w1, _mm256_set1_epi32(x1)));
                    s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(h, sc));
                }
            }
        }
        __m256 d = _mm256_loadu_ps((const float *)p);
        for (int j = 0; j < PT; j++) {
            const int16_t *bs = xs[j] + b * 16;
            __m256i o = _mm256_setzero_si256();
            for (int q = 0; q < 8; q++) {
                int32_t pr = (int32_t)pair16(bs[2 * q], bs[2 * q + 1]);
                o = _mm256_add_epi32(
                    o, _mm256_madd_epi16(_mm256_loadu_si256(spv + q), _mm256_set1_epi32(pr)));
            }
            s[j] = _mm256_sub_epi32(s[j], _mm256_slli_epi32(o, 5));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]),
                                     _mm256_mul_ps(d, _mm256_set1_ps(xd[j][b])), acc[j]);
        }
    }
}

typedef void (*pack_fn)(const struct qpanel *g, uint32_t r0, uint32_t nr, unsigned char *p);
typedef void (*kern_fn)(const struct qpanel *g, const unsigned char *p, uint32_t t,
                        __m256 acc[PT]);

/* Row groups [begin, end) (PR rows each): pack the group's panel into this worker's scratch,
 * then every token, PT at a time (a pool task). */
AVX2 static void panel_task(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    const struct qpanel *g = arg;
    pack_fn pack;
    kern_fn kern;
    switch (g->w->type) {
    case TY_GGML_Q8_0:
        pack = pack_q8_0, kern = kern_q8_0;
        break;
    case TY_GGML_Q4_K:
        pack = pack_q4_k, kern = kern_q4_k;
        break;
    default:
        pack = pack_q6_k, kern = kern_q6_k;
    }
    unsigned char *p = g->panels + (size_t)thread * g->panel_bytes;
    uint32_t rows = (uint32_t)g->w->rows;
    for (uint32_t grp = begin; grp < end; grp++) {
        uint32_t r0 = grp * PR, nr = rows - r0 < PR ? rows - r0 : PR;
        pack(g, r0, nr, p);
        for (uint32_t t = 0; t < g->T; t += PT) {
            __m256 acc[PT];
            kern(g, p, t, acc);
            for (uint32_t j = 0; j < PT && t + j < g->T; j++) {
                float *y = g->y + (size_t)(t + j) * rows + r0;
                if (nr == PR) {
                    _mm256_storeu_ps(y, acc[j]);
                } else {
                    float tmp[PR];
                    _mm256_storeu_ps(tmp, acc[j]);
                    memcpy(y, tmp, nr * sizeof(float));
                }
            }
        }
    }
}
#endif

bool ty__cpu_qpanel_supported(const struct ty_weight *w)
{
#if defined(__x86_64__)
    uint32_t ib = ty__cpu_input_block(w->type);
    return block_bytes(w->type) && ib && w->cols % ib == 0 &&
           w->cols % ty_ggml_type_block(w->type) == 0 && w->rows <= UINT32_MAX &&
           ty__cpu_have_avx2();
#else
    (void)w;
    return false;
#endif
}

int ty__cpu_qpanel(ty_cpu_pool_t *pool, const struct ty_weight *w, const float *x, float *y,
                   uint32_t T, void *scratch, size_t scratch_bytes)
{
#if defined(__x86_64__)
    struct qpanel g = {
        .w = w, .x = x, .y = y, .T = T, .cols = w->cols, .ib = ty__cpu_input_block(w->type)};
    g.nb = g.cols / g.ib; /* the input block is the weight block for these types */
    g.rb = ty_ggml_type_nbytes(w->type, g.cols);
    uint32_t nth = pool ? ty__cpu_pool_threads(pool) : 1;
    g.panel_bytes = (block_bytes(w->type) * g.nb + 63) & ~(size_t)63;
    size_t n = (size_t)T * g.cols, nd = (size_t)T * g.nb, ns = g.ib == 256 ? n / 16 : 0;
    size_t n16 = w->type == TY_GGML_Q8_0 ? n : 0;
    bool own = scratch_bytes < g.panel_bytes * nth + 64;
    /* panels (64-byte aligned), scales, 16-sums, int16 inputs, quants: one allocation */
    size_t pb = own ? g.panel_bytes * nth + 64 : 0;
    char *buf = malloc(pb + nd * sizeof(float) + ns * sizeof(int16_t) + n16 * sizeof(int16_t) + n);
    if (!buf)
        return TY_ENOMEM;
    char *base = own ? buf : scratch;
    g.panels = (unsigned char *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
    g.xd = (float *)(buf + pb);
    g.xs = ns ? (int16_t *)(buf + pb + nd * sizeof(float)) : NULL;
    g.x16 = n16 ? (int16_t *)(buf + pb + nd * sizeof(float) + ns * sizeof(int16_t)) : NULL;
    g.xq = (int8_t *)(buf + pb + nd * sizeof(float) + ns * sizeof(int16_t) + n16 * sizeof(int16_t));
    uint32_t groups = (uint32_t)((w->rows + PR - 1) / PR);
    if (pool) {
        ty__cpu_pool_run(pool, T, quantize_task, &g);
        ty__cpu_pool_run(pool, groups, panel_task, &g);
    } else {
        quantize_task(&g, 0, 0, T);
        panel_task(&g, 0, 0, groups);
    }
    free(buf);
    return 0;
#else
    (void)pool, (void)w, (void)x, (void)y, (void)T, (void)scratch, (void)scratch_bytes;
    return TY_ENOTSUP;
#endif
}
