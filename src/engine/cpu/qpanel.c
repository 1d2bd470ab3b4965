/* Prefill's matmul on K-quant weights: integer products on 8-row panels (cpu-impl.h).
 *
 * With a few dozen tokens or more every weight meets many inputs, so the weights can be
 * rearranged once per call into the layout that suits AVX2's 8-bit multiply. Each pool worker
 * takes groups of PR (8) rows and unpacks a few groups at a time into panels in its own
 * scratch: the 4- or 6-bit values of the eight rows widened to bytes and interleaved 32 bits at
 * a time, so one 256-bit register holds the same four positions of eight rows, and the
 * sub-block scales and mins beside them as vectors of eight rows. A token's inputs, quantized
 * once per call as Q8_K (ty__cpu_quantize_inputs), are broadcast 32 bits at a time and one
 * maddubs gives eight rows' partial sums in eight lanes: no horizontal sums, each weight
 * register serves PT tokens, and the products of a sub-block add up in int16 (Q4_K: eight
 * maddubs of 0..15 x |127| stay under 30,480; Q6_K: two of 0..63 x |127|) before one madd by
 * the sub-block scale, so about one multiply per 32 products.
 *
 * The block sums are exact integers scaled per block into f32, as llama.cpp's kernels do; each
 * (row, token) is one f32 sum over its blocks in order, so a token's output does not depend on
 * the other tokens or the thread count (it may differ in the last bits from the few-token
 * kernels, which sum the same products in another order). On this project's Zen 3 VM the int16
 * madd that Q8_0 would need runs no faster than the FMAs of OpenBLAS's sgemm, measured at
 * 0.76-1.31x of the tile path: Q8_0 keeps the tiles (docs/benchmarks.md). AVX2 only; other
 * types and machines keep the tiles too. */
#include "cpu-impl.h"

#include "tycho/errors.h"
#include "tycho/gguf.h"

#include <stdlib.h>
#include <string.h>

#define PR 8 /* rows per panel: the lanes of a 256-bit register of int32 */
#define PT 4 /* tokens per micro-kernel step */
#define QP_PANELS (192u << 10) /* bytes of panels a worker packs at a time */
#define QP_SLICE  (8u << 10)   /* bytes of one group's panel in a column slice */
#define QP_INPUTS (224u << 10) /* bytes of a slice's inputs a block of tokens may hold */

/* Panel bytes per weight block (8 rows): */
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
    float *xd;         /* (T, nb) their scales */
    int16_t *xs;       /* Q8_K: (T, cols / 16) sums of 16 quants */
    int32_t *xp;       /* Q4_K: (T, cols / 64) sums of 32 quants, two int16 per int32 */
    unsigned char *panels;
    size_t panel_bytes; /* per group of PR rows */
    uint32_t chunk;     /* groups a worker packs at a time */
};

static size_t block_bytes(uint32_t type)
{
    switch (type) {
    case TY_GGML_Q4_K:
        return Q4_K_PB;
    case TY_GGML_Q6_K:
        return Q6_K_PB;
    default:
        return 0;
    }
}

static uint32_t pair16(int a, int b)
{
    return (uint32_t)(uint16_t)(int16_t)a | (uint32_t)(uint16_t)(int16_t)b << 16;
}

/* Token rows [begin, end) quantized (a pool task), with Q4_K's 32-sums. */
static void quantize_task(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    (void)thread;
    const struct qpanel *g = arg;
    for (uint32_t t = begin; t < end; t++) {
        int8_t *q = g->xq + (size_t)t * g->cols;
        ty__cpu_quantize_inputs(g->w->type, g->x + (size_t)t * g->cols, g->cols, q,
                                g->xd + (size_t)t * g->nb,
                                g->xs ? g->xs + (size_t)t * (g->cols / 16) : NULL);
        if (g->xp) { /* sub-blocks 2k, 2k + 1 of 32: at most 32 x 127 each */
            const int16_t *bs = g->xs + (size_t)t * (g->cols / 16);
            for (uint64_t k = 0; k < g->cols / 64; k++)
                g->xp[(size_t)t * (g->cols / 64) + k] =
                    (int32_t)pair16(bs[4 * k] + bs[4 * k + 1], bs[4 * k + 2] + bs[4 * k + 3]);
        }
    }
}

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma,f16c")))
/* In the micro-kernels the loops over the PT tokens (and the few scale pairs) are unrolled so
 * their accumulators stay in registers; the loops over a block's columns are kept rolled
 * (`unroll 1`): unrolled, the compiler hoists their loads and spills the accumulators. */

/* out[w * 8 + i] = 32-bit word w of vals[i] (words of the rows' values, interleaved). */
static void interleave(uint32_t *out, uint32_t vals[PR][64], uint32_t words)
{
    for (uint32_t k = 0; k < words; k++)
        for (uint32_t i = 0; i < PR; i++)
            out[k * PR + i] = vals[i][k];
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
            d[i] = ty__cpu_half_f16c(blk);
            dmin[i] = ty__cpu_half_f16c(blk + 2);
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
AVX2 static inline __attribute__((always_inline)) void
kern_q4_k(const struct qpanel *g, const unsigned char *p, uint32_t t, uint64_t kb0, uint64_t kb1, __m256 acc_io[PT])
{
    __m256 acc[PT];
    const int8_t *x[PT];
    const float *xd[PT];
    const int32_t *xs[PT]; /* 32-sum pairs */
#pragma GCC unroll 16
    for (uint32_t j = 0; j < PT; j++) {
        uint32_t tj = t + j < g->T ? t + j : t; /* past the end: t again, not stored */
        x[j] = g->xq + (size_t)tj * g->cols;
        xd[j] = g->xd + (size_t)tj * g->nb;
        xs[j] = g->xp + (size_t)tj * (g->cols / 64);
        acc[j] = acc_io[j];
    }
    p += kb0 * Q4_K_PB;
    for (uint64_t b = kb0; b < kb1; b++, p += Q4_K_PB) {
        const __m256i *scv = (const __m256i *)(p + 64), *mpv = scv + 8, *wv = mpv + 4;
        __m256i s[PT];
#pragma GCC unroll 16
        for (int j = 0; j < PT; j++)
            s[j] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int sb = 0; sb < 8; sb++) {
            __m256i h[PT];
#pragma GCC unroll 16
            for (int j = 0; j < PT; j++)
                h[j] = _mm256_setzero_si256();
#pragma GCC unroll 1
            for (int k = 0; k < 8; k++) {
                __m256i w = _mm256_loadu_si256(wv + sb * 8 + k);
#pragma GCC unroll 16
                for (int j = 0; j < PT; j++) {
                    int32_t xp;
                    memcpy(&xp, x[j] + b * 256 + 32 * sb + 4 * k, 4);
                    h[j] = _mm256_add_epi16(h[j], _mm256_maddubs_epi16(w, _mm256_set1_epi32(xp)));
                }
            }
            __m256i sc = _mm256_loadu_si256(scv + sb);
#pragma GCC unroll 16
            for (int j = 0; j < PT; j++)
                s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(h[j], sc));
        }
        __m256 d = _mm256_loadu_ps((const float *)p), dmin = _mm256_loadu_ps((const float *)p + 8);
#pragma GCC unroll 16
        for (int j = 0; j < PT; j++) {
            const int32_t *bp = xs[j] + b * 4;
            __m256i m = _mm256_setzero_si256();
#pragma GCC unroll 16
            for (int q = 0; q < 4; q++)
                m = _mm256_add_epi32(
                    m, _mm256_madd_epi16(_mm256_loadu_si256(mpv + q), _mm256_set1_epi32(bp[q])));
            __m256 dx = _mm256_set1_ps(xd[j][b]);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), _mm256_mul_ps(d, dx), acc[j]);
            acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, dx), acc[j]);
        }
    }
#pragma GCC unroll 16
    for (int j = 0; j < PT; j++)
        acc_io[j] = acc[j];
}

/* ---- Q6_K ---------------------------------------------------------------------------------- */

AVX2 static void pack_q6_k(const struct qpanel *g, uint32_t r0, uint32_t nr, unsigned char *p)
{
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
            d[i] = ty__cpu_half_f16c(w + 208);
            for (int s = 0; s < 16; s++)
                sc[s * PR + i] = pair16(s8[s], s8[s]);
            for (int q = 0; q < 8; q++)
                sp[q * PR + i] = pair16(s8[2 * q], s8[2 * q + 1]);
            /* values 128h + 32k + l */
            for (int h = 0; h < 2; h++) {
                __m256i v[4];
                ty__cpu_q6_k_unpack(w, h, v);
                for (int k = 0; k < 4; k++)
                    _mm256_storeu_si256((__m256i *)(vals[i] + 32 * h + 8 * k), v[k]);
            }
        }
        interleave((uint32_t *)(p + 32 + 512 + 256), vals, 64);
    }
}

/* Per sub-block of 16: two pairs of maddubs (0..63 x |127|, two at most 32004 in int16), a
 * madd each by the rows' scales; the -32 offset as 32 x the scales by the inputs' 16-sums. */
AVX2 static inline __attribute__((always_inline)) void
kern_q6_k(const struct qpanel *g, const unsigned char *p, uint32_t t, uint64_t kb0, uint64_t kb1, __m256 acc_io[PT])
{
    __m256 acc[PT];
    const int8_t *x[PT];
    const float *xd[PT];
    const int16_t *xs[PT];
#pragma GCC unroll 16
    for (uint32_t j = 0; j < PT; j++) {
        uint32_t tj = t + j < g->T ? t + j : t; /* past the end: t again, not stored */
        x[j] = g->xq + (size_t)tj * g->cols;
        xd[j] = g->xd + (size_t)tj * g->nb;
        xs[j] = g->xs + (size_t)tj * (g->cols / 16);
        acc[j] = acc_io[j];
    }
    p += kb0 * Q6_K_PB;
    for (uint64_t b = kb0; b < kb1; b++, p += Q6_K_PB) {
        const __m256i *scv = (const __m256i *)(p + 32), *spv = scv + 16, *wv = spv + 8;
        __m256i s[PT];
#pragma GCC unroll 16
        for (int j = 0; j < PT; j++)
            s[j] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int u = 0; u < 16; u++) {
            __m256i sc = _mm256_loadu_si256(scv + u);
#pragma GCC unroll 1
            for (int half = 0; half < 2; half++) {
                __m256i w0 = _mm256_loadu_si256(wv + 4 * u + 2 * half);
                __m256i w1 = _mm256_loadu_si256(wv + 4 * u + 2 * half + 1);
#pragma GCC unroll 16
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
#pragma GCC unroll 16
        for (int j = 0; j < PT; j++) {
            const int16_t *bs = xs[j] + b * 16;
            __m256i o = _mm256_setzero_si256();
#pragma GCC unroll 16
            for (int q = 0; q < 8; q++) {
                int32_t pr;
                memcpy(&pr, bs + 2 * q, 4); /* the 16-sums of sub-blocks 2q, 2q + 1 */
                o = _mm256_add_epi32(
                    o, _mm256_madd_epi16(_mm256_loadu_si256(spv + q), _mm256_set1_epi32(pr)));
            }
            s[j] = _mm256_sub_epi32(s[j], _mm256_slli_epi32(o, 5));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]),
                                     _mm256_mul_ps(d, _mm256_set1_ps(xd[j][b])), acc[j]);
        }
    }
#pragma GCC unroll 16
    for (int j = 0; j < PT; j++)
        acc_io[j] = acc[j];
}

typedef void (*pack_fn)(const struct qpanel *g, uint32_t r0, uint32_t nr, unsigned char *p);
typedef void (*kern_fn)(const struct qpanel *g, const unsigned char *p, uint32_t t,
                        uint64_t kb0, uint64_t kb1, __m256 acc[PT]);

/* Row groups [begin, end) (PR rows each), a few at a time: pack them into this worker's
 * panels (at most QP_PANELS bytes, in L2), then walk the columns a few blocks at a time (at
 * most QP_SLICE bytes of panel per group: in L1 while the tokens stream past) and the tokens a
 * block at a time (at most QP_INPUTS bytes of those columns' inputs: in L2 while each group of
 * the chunk meets them), PT tokens per micro-kernel call. A column slice after the first
 * continues each output's accumulator from y, so every (row, token) is one f32 sum over its
 * blocks in order, as without slices (a pool task). */
AVX2 static inline __attribute__((always_inline)) void
run_panels(const struct qpanel *g, uint32_t thread, uint32_t begin, uint32_t end, pack_fn pack,
           kern_fn kern)
{
    unsigned char *panels = g->panels + (size_t)thread * g->panel_bytes * g->chunk;
    uint32_t rows = (uint32_t)g->w->rows;
    uint64_t ks = QP_SLICE / block_bytes(g->w->type); /* blocks per column slice */
    ks = ks ? ks : 1;
    uint32_t tb = (uint32_t)(QP_INPUTS / (ks * g->ib)) / PT * PT; /* one byte per input */
    tb = tb < PT ? PT : tb;
    for (uint32_t c0 = begin; c0 < end; c0 += g->chunk) {
        uint32_t c1 = end - c0 < g->chunk ? end : c0 + g->chunk;
        for (uint32_t grp = c0; grp < c1; grp++) {
            uint32_t r0 = grp * PR;
            pack(g, r0, rows - r0 < PR ? rows - r0 : PR,
                 panels + (size_t)(grp - c0) * g->panel_bytes);
        }
        for (uint64_t kb0 = 0; kb0 < g->nb; kb0 += ks) {
            uint64_t kb1 = g->nb - kb0 < ks ? g->nb : kb0 + ks;
            for (uint32_t t0 = 0; t0 < g->T; t0 += tb) {
                uint32_t t1 = g->T - t0 < tb ? g->T : t0 + tb;
                for (uint32_t grp = c0; grp < c1; grp++) {
                    uint32_t r0 = grp * PR, nr = rows - r0 < PR ? rows - r0 : PR;
                    const unsigned char *p = panels + (size_t)(grp - c0) * g->panel_bytes;
                    for (uint32_t t = t0; t < t1; t += PT) {
                        uint32_t nt = t1 - t < PT ? t1 - t : PT;
                        __m256 acc[PT];
                        float tmp[PR] = {0};
                        for (uint32_t j = 0; j < PT; j++) {
                            float *y = g->y + (size_t)(t + (j < nt ? j : 0)) * rows + r0;
                            if (kb0 == 0)
                                acc[j] = _mm256_setzero_ps();
                            else if (nr == PR)
                                acc[j] = _mm256_loadu_ps(y);
                            else
                                memcpy(tmp, y, nr * sizeof(float)), acc[j] = _mm256_loadu_ps(tmp);
                        }
                        kern(g, p, t, kb0, kb1, acc);
                        for (uint32_t j = 0; j < nt; j++) {
                            float *y = g->y + (size_t)(t + j) * rows + r0;
                            if (nr == PR) {
                                _mm256_storeu_ps(y, acc[j]);
                            } else {
                                _mm256_storeu_ps(tmp, acc[j]);
                                memcpy(y, tmp, nr * sizeof(float));
                            }
                        }
                    }
                }
            }
        }
    }
}

AVX2 static void task_q4_k(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    run_panels(arg, thread, begin, end, pack_q4_k, kern_q4_k);
}

AVX2 static void task_q6_k(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    run_panels(arg, thread, begin, end, pack_q6_k, kern_q6_k);
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
    size_t np = w->type == TY_GGML_Q4_K ? n / 64 : 0;
    g.chunk = (uint32_t)(QP_PANELS / g.panel_bytes);
    g.chunk = g.chunk ? g.chunk : 1;
    bool own = scratch_bytes < g.panel_bytes * g.chunk * nth + 64;
    /* panels (64-byte aligned), 32-sum pairs, scales, 16-sums, quants: one allocation */
    size_t pb = own ? g.panel_bytes * g.chunk * nth + 64 : 0;
    char *buf = malloc(pb + np * sizeof(int32_t) + nd * sizeof(float) + ns * sizeof(int16_t) + n);
    if (!buf)
        return TY_ENOMEM;
    char *base = own ? buf : scratch;
    g.panels = (unsigned char *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
    char *at = buf + pb;
    g.xp = np ? (int32_t *)at : NULL;
    at += np * sizeof(int32_t);
    g.xd = (float *)at;
    at += nd * sizeof(float);
    g.xs = ns ? (int16_t *)at : NULL;
    at += ns * sizeof(int16_t);
    g.xq = (int8_t *)at;
    uint32_t groups = (uint32_t)((w->rows + PR - 1) / PR);
    ty_cpu_task_cb task = w->type == TY_GGML_Q4_K ? task_q4_k : task_q6_k;
    if (pool) {
        ty__cpu_pool_run(pool, T, quantize_task, &g);
        ty__cpu_pool_run(pool, groups, task, &g);
    } else {
        quantize_task(&g, 0, 0, T);
        task(&g, 0, 0, groups);
    }
    free(buf);
    return 0;
#else
    (void)pool, (void)w, (void)x, (void)y, (void)T, (void)scratch, (void)scratch_bytes;
    return TY_ENOTSUP;
#endif
}
