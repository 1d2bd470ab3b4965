/* Many-token matmul on block-quantized weights with 8-bit inputs (cpu-impl.h), for prefill.
 *
 * The few-token path (gemv.c) takes one weight row at a time against every input; with
 * hundreds of inputs each row then streams all the quantized inputs from outer caches, and the
 * tile path (f32 rows for BLAS) moves every weight three times and rounds every input to f32.
 * Here the inputs are quantized once per call (ty__cpu_quantize_inputs, split over the worker
 * pool by tokens), the weight rows are split over the pool in groups of QG_ROWS, and each worker
 * walks its rows a block of tokens at a time, sized so those tokens' quantized inputs stay in
 * L2 while every row of the group meets them; a micro-kernel multiplies a few rows by a few
 * tokens at once, so each weight load (and, for K-quants, each unpacking of 4- and 6-bit
 * values) serves several tokens and each input load several rows.
 *
 * Every (row, token) output is summed exactly as the few-token kernels sum it (gemv.c's Q8_0
 * rows, qdot.c's AVX2 Q4_K and Q6_K dots): the same int32 block sums, the same f32 block
 * factors, one 8-lane accumulator fed in block order and reduced by ty__cpu_hsum8, the same
 * mins lanes (Q4_K) and int32 offset (Q6_K). A token's output is therefore bit-identical whatever
 * the batch it came in. AVX2 only (Q8_0, Q4_K, Q6_K); other types and machines keep the tile path.
 */
#include "cpu-impl.h"

#include "tycho/errors.h"
#include "tycho/gguf.h"

#include <stdlib.h>
#include <string.h>

#define QG_ROWS 8           /* rows per pool work unit */
#define QG_L2   (192 << 10) /* bytes of quantized inputs one token block may hold */

struct qgemm {
    const struct ty_weight *w;
    const float *x;    /* (T, cols) */
    float *y;          /* (T, rows) */
    uint32_t T, tb;    /* tokens, tokens per cache block */
    uint64_t cols, nb; /* columns, weight blocks per row */
    size_t rb;         /* bytes per weight row */
    uint32_t ib;       /* input block: 32 or 256 */
    int8_t *xq;        /* (T, cols) quantized inputs */
    float *xd;         /* (T, cols / ib) their scales */
    int16_t *xs;       /* Q8_K: (T, cols / 16) sums of 16 quants; else NULL */
};

/* Token rows [begin, end) quantized (a pool task). */
static void quantize_task(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    (void)thread;
    const struct qgemm *g = arg;
    for (uint32_t t = begin; t < end; t++)
        ty__cpu_quantize_inputs(g->w->type, g->x + (size_t)t * g->cols, g->cols,
                                g->xq + (size_t)t * g->cols, g->xd + (size_t)t * (g->cols / g->ib),
                                g->xs ? g->xs + (size_t)t * (g->cols / 16) : NULL);
}

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* A micro-kernel: rows r .. r + nr - 1 times tokens t .. t + nt - 1 (nr, nt at most the
 * kernel's tile; the missing ones are computed on duplicates and not stored). */
typedef void (*tile_fn)(const struct qgemm *g, uint32_t r, uint32_t nr, uint32_t t, uint32_t nt);

/* ---- Q8_0: Q8R rows x Q8T tokens ----------------------------------------------------------- */

/* 8 accumulators, the rows' weights and their absolute values, one input: 2 x 4 measured
 * fastest of 1x4 .. 4x3 on this VM (wider tiles spill). */
#define Q8R 2
#define Q8T 4

/* Per block and (row, token): |w| x (x signed as w) through maddubs, pairs to int32, to f32,
 * fma by d_w * d_x into the pair's accumulator: gemv.c's rows_q8_avx2 step. */
AVX2 static void tile_q8_0(const struct qgemm *g, uint32_t r, uint32_t nr, uint32_t t, uint32_t nt)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const unsigned char *w[Q8R];
    const int8_t *xq[Q8T];
    const float *xd[Q8T];
    for (uint32_t i = 0; i < Q8R; i++)
        w[i] = (const unsigned char *)g->w->data + (size_t)(r + (i < nr ? i : 0)) * g->rb;
    for (uint32_t j = 0; j < Q8T; j++) {
        size_t tj = t + (j < nt ? j : 0);
        xq[j] = g->xq + tj * g->cols;
        xd[j] = g->xd + tj * g->nb;
    }
    __m256 acc[Q8R][Q8T];
    for (int i = 0; i < Q8R; i++)
        for (int j = 0; j < Q8T; j++)
            acc[i][j] = _mm256_setzero_ps();
    for (uint64_t b = 0; b < g->nb; b++) {
        __m256i q[Q8R], u[Q8R];
        float d[Q8R];
        for (int i = 0; i < Q8R; i++) {
            d[i] = ty__cpu_half_f16c(w[i] + b * 34);
            q[i] = _mm256_loadu_si256((const __m256i *)(w[i] + b * 34 + 2));
            u[i] = _mm256_sign_epi8(q[i], q[i]);
        }
        for (int j = 0; j < Q8T; j++) {
            __m256i qx = _mm256_loadu_si256((const __m256i *)(xq[j] + b * 32));
            float dx = xd[j][b];
            for (int i = 0; i < Q8R; i++) {
                __m256i p = _mm256_maddubs_epi16(u[i], _mm256_sign_epi8(qx, q[i]));
                acc[i][j] =
                    _mm256_fmadd_ps(_mm256_set1_ps(d[i] * dx),
                                    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[i][j]);
            }
        }
    }
    for (uint32_t j = 0; j < nt; j++)
        for (uint32_t i = 0; i < nr; i++)
            g->y[(size_t)(t + j) * g->w->rows + r + i] = ty__cpu_hsum8(acc[i][j]);
}

/* ---- K-quants: 1 row x 4 tokens ---------------------------------------------------------------
 */

/* The mins' share of a Q4_K block as four int32 lanes, lane i = mn_2i * (16-sums 4i + 4i + 1)
 * + mn_2i+1 * (16-sums 4i + 2 + 4i + 3) (mn16: the eight mins widened): qdot.c's
 * dot_k45_avx2 keeps these four lanes apart until its final sum. */
AVX2 static __m128i min_lanes(__m128i mn16, const int16_t *bs)
{
    __m128i s = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bs),
                               _mm_loadu_si128((const __m128i *)(bs + 8)));
    return _mm_madd_epi16(mn16, s);
}

/* Q4_K: per 32-byte run of nibbles two sub-blocks of unsigned values, maddubs with each
 * token's inputs, madd by the sub-block scale into int32; d * d_x * that (fma into the
 * token's accumulator), dmin * d_x * the mins' share (four lanes per token, summed at the end).
 * qdot.c's dot_k45_avx2 for Q4_K, one unpacking for four tokens. */
AVX2 static void tile_q4_k(const struct qgemm *g, uint32_t r, uint32_t nr, uint32_t t, uint32_t nt)
{
    (void)nr;
    const __m256i m4 = _mm256_set1_epi8(15);
    const unsigned char *w = (const unsigned char *)g->w->data + (size_t)r * g->rb;
    const int8_t *xq[4];
    const float *xd[4];
    const int16_t *xs[4];
    for (uint32_t j = 0; j < 4; j++) {
        size_t tj = t + (j < nt ? j : 0);
        xq[j] = g->xq + tj * g->cols;
        xd[j] = g->xd + tj * g->nb;
        xs[j] = g->xs + tj * (g->cols / 16);
    }
    __m256 acc[4];
    __m128 accm[4];
    for (int j = 0; j < 4; j++) {
        acc[j] = _mm256_setzero_ps();
        accm[j] = _mm_setzero_ps();
    }
    for (uint64_t b = 0; b < g->nb; b++, w += 144) {
        uint8_t sc[8], mn[8];
        ty__cpu_k_scales(w + 4, sc, mn);
        __m128i mn16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
        __m256i sumi[4];
        for (int j = 0; j < 4; j++)
            sumi[j] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * c));
            __m256i lo = _mm256_and_si256(raw, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            __m256i s0 = _mm256_set1_epi16(sc[2 * c]), s1 = _mm256_set1_epi16(sc[2 * c + 1]);
            for (int j = 0; j < 4; j++) {
                const int8_t *q = xq[j] + b * 256 + 64 * c;
                __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q));
                __m256i p1 =
                    _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 32)));
                sumi[j] = _mm256_add_epi32(sumi[j], _mm256_add_epi32(_mm256_madd_epi16(p0, s0),
                                                                     _mm256_madd_epi16(p1, s1)));
            }
        }
        float d = ty__cpu_half_f16c(w), dmin = ty__cpu_half_f16c(w + 2);
        for (int j = 0; j < 4; j++) {
            float dx = xd[j][b];
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
            accm[j] = _mm_fmadd_ps(_mm_set1_ps(dmin * dx),
                                   _mm_cvtepi32_ps(min_lanes(mn16, xs[j] + b * 16)), accm[j]);
        }
    }
    for (uint32_t j = 0; j < nt; j++) {
        __m128 m = _mm_add_ps(accm[j], _mm_movehl_ps(accm[j], accm[j]));
        m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
        g->y[(size_t)(t + j) * g->w->rows + r] = ty__cpu_hsum8(acc[j]) - _mm_cvtss_f32(m);
    }
}

/* Q6_K: the unsigned 6-bit values (0..63) of each 32-value run through maddubs with each
 * token's inputs, madd by the run's two 16-value scales; the -32 offset comes back in
 * int32 as 32 * sum_s sc_s * 16-sum_s before the block's one conversion. qdot.c's dot_q6_k_avx2,
 * one unpacking for four tokens. */
AVX2 static void tile_q6_k(const struct qgemm *g, uint32_t r, uint32_t nr, uint32_t t, uint32_t nt)
{
    (void)nr;
    const unsigned char *w = (const unsigned char *)g->w->data + (size_t)r * g->rb;
    const int8_t *xq[4];
    const float *xd[4];
    const int16_t *xs[4];
    for (uint32_t j = 0; j < 4; j++) {
        size_t tj = t + (j < nt ? j : 0);
        xq[j] = g->xq + tj * g->cols;
        xd[j] = g->xd + tj * g->nb;
        xs[j] = g->xs + tj * (g->cols / 16);
    }
    __m256 acc[4];
    for (int j = 0; j < 4; j++)
        acc[j] = _mm256_setzero_ps();
    for (uint64_t b = 0; b < g->nb; b++, w += 210) {
        const int8_t *sc = (const int8_t *)(w + 192);
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        __m256i sumi[4];
        for (int j = 0; j < 4; j++)
            sumi[j] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i v[4];
            ty__cpu_q6_k_unpack(w, h, v);
            for (int k = 0; k < 4; k++) {
                int s = 8 * h + 2 * k;
                __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[s + 1]), _mm_set1_epi16(sc[s]));
                for (int j = 0; j < 4; j++) {
                    __m256i p = _mm256_maddubs_epi16(
                        v[k],
                        _mm256_loadu_si256((const __m256i *)(xq[j] + b * 256 + 128 * h + 32 * k)));
                    sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(p, scv));
                }
            }
        }
        float dw = ty__cpu_half_f16c(w + 208);
        for (int j = 0; j < 4; j++) {
            __m256i c =
                _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)(xs[j] + b * 16)));
            sumi[j] = _mm256_sub_epi32(sumi[j], _mm256_slli_epi32(c, 5));
            acc[j] =
                _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[j][b]), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
        }
    }
    for (uint32_t j = 0; j < nt; j++)
        g->y[(size_t)(t + j) * g->w->rows + r] = ty__cpu_hsum8(acc[j]);
}

/* The micro-kernel of a type and its tile (rows x tokens); NULL where there is none. */
static tile_fn tile_kernel(uint32_t type, uint32_t *mr, uint32_t *mt)
{
    *mt = 4;
    *mr = 1;
    switch (type) {
    case TY_GGML_Q8_0:
        *mr = Q8R;
        *mt = Q8T;
        return tile_q8_0;
    case TY_GGML_Q4_K:
        return tile_q4_k;
    case TY_GGML_Q6_K:
        return tile_q6_k;
    default:
        return NULL;
    }
}

/* Row groups [begin, end) (QG_ROWS rows each) against every token, a token block at a time
 * (a pool task). */
static void gemm_task(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    (void)thread;
    const struct qgemm *g = arg;
    uint32_t mr, mt, rows = (uint32_t)g->w->rows;
    tile_fn tile = tile_kernel(g->w->type, &mr, &mt);
    uint32_t r_end = end * QG_ROWS < rows ? end * QG_ROWS : rows;
    for (uint32_t t0 = 0; t0 < g->T; t0 += g->tb) {
        uint32_t t1 = g->T - t0 < g->tb ? g->T : t0 + g->tb;
        for (uint32_t r = begin * QG_ROWS; r < r_end; r += mr) {
            uint32_t nr = r_end - r < mr ? r_end - r : mr;
            for (uint32_t t = t0; t < t1; t += mt)
                tile(g, r, nr, t, t1 - t < mt ? t1 - t : mt);
        }
    }
}
#endif

bool ty__cpu_qgemm_supported(const struct ty_weight *w)
{
#if defined(__x86_64__)
    uint32_t mr, mt, ib = ty__cpu_input_block(w->type);
    return ib && w->cols % ib == 0 && w->cols % ty_ggml_type_block(w->type) == 0 &&
           tile_kernel(w->type, &mr, &mt) && ty__cpu_have_avx2();
#else
    (void)w;
    return false;
#endif
}

int ty__cpu_qgemm(ty_cpu_pool_t *pool, const struct ty_weight *w, const float *x, float *y,
                  uint32_t T)
{
#if defined(__x86_64__)
    struct qgemm g = {
        .w = w, .x = x, .y = y, .T = T, .cols = w->cols, .ib = ty__cpu_input_block(w->type)};
    g.nb = g.cols / g.ib; /* the input block is the weight block for these types */
    g.rb = ty_ggml_type_nbytes(w->type, g.cols);
    size_t n = (size_t)T * g.cols, nd = n / g.ib, ns = g.ib == 256 ? n / 16 : 0;
    /* scales, then 16-sums, then quants: one allocation */
    char *buf = malloc(nd * sizeof(float) + ns * sizeof(int16_t) + n);
    if (!buf)
        return TY_ENOMEM;
    g.xd = (float *)buf;
    g.xs = ns ? (int16_t *)(buf + nd * sizeof(float)) : NULL;
    g.xq = (int8_t *)(buf + nd * sizeof(float) + ns * sizeof(int16_t));
    uint32_t tb = (uint32_t)(QG_L2 / g.cols) & ~3u;
    g.tb = tb < 4 ? 4 : tb;
    uint32_t units = (uint32_t)((w->rows + QG_ROWS - 1) / QG_ROWS);
    if (pool) {
        ty__cpu_pool_run(pool, T, quantize_task, &g);
        ty__cpu_pool_run(pool, units, gemm_task, &g);
    } else {
        quantize_task(&g, 0, 0, T);
        gemm_task(&g, 0, 0, units);
    }
    free(buf);
    return 0;
#else
    (void)pool, (void)w, (void)x, (void)y, (void)T;
    return TY_ENOTSUP;
#endif
}
