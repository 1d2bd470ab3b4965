/* Few-token matmul straight from F16, BF16 and block-quantized weights (cpu-impl.h).
 *
 * Decode multiplies each weight once per token, so converting a whole tile of rows to f32 and
 * handing it to BLAS moves every weight three times (read 2 bytes, write and read 4) for one
 * multiply-add. Here each weight row is read once, widened in registers, and dotted with the
 * T <= TY_CPU_GEMV_MAX_T inputs; rows are split over the worker pool. x86-64 with AVX2, FMA and
 * F16C takes the vector kernels (checked at run time); other machines a scalar loop. Sums are
 * f32, as in the tile path.
 *
 * Block-quantized weights meet 8-bit inputs, as in llama.cpp: each input is quantized once
 * per call in the weight type's input format (ty__cpu_quantize_inputs: Q8_0 for Q8_0, Q4_0 and MXFP4,
 * Q8_K for the K-quants), and a block's product is an exact integer sum scaled by the block
 * factors. Q8_0 rows are multiplied here, four inputs per weight load; Q4_0 and the K-quants
 * through qdot.c's kernels, one input at a time (the row stays in L1 between inputs). */
#include "cpu-impl.h"

#include "tycho/gguf.h"

#include "tycho/errors.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

struct gemv {
    const struct ty_weight *w;
    const float *x;
    float *y;
    uint32_t T;
    const float *h2f; /* f16 -> f32 table */
    const int8_t *xq;   /* block types: the inputs quantized, (T, cols) */
    const float *xd;    /* their block scales, (T, cols / input block) */
    const int16_t *xs;  /* Q8_K inputs: sums of 16 quants, (T, cols / 16) */
    ty_cpu_qdot_fn dot; /* Q4_0, K-quants: the row kernel */
    bool avx2;          /* take the AVX2 + FMA + F16C kernels */
};

/* How far ahead of the row being read the row loops below ask the caches for weights:
 * a row of a few blocks takes less time than a memory round trip, and the hardware
 * prefetcher alone leaves the kernels waiting (measured on the 32000-row output matrix). */
#define PREFETCH_BYTES 2048

/* Before reading the row of rb bytes at p: ask for the row that many bytes ahead (whole rows,
 * at least PREFETCH_BYTES), a cache line at a time; none when that row is the next slice's. */
static inline void prefetch_ahead(const unsigned char *p, uint64_t rb, uint32_t r, uint32_t r1)
{
    uint64_t ahead = (PREFETCH_BYTES + rb - 1) / rb;
    if (r + ahead >= r1)
        return;
    for (uint64_t o = 0; o < rb; o += 64)
        __builtin_prefetch(p + ahead * rb + o, 0, 3);
}

/* Rows of Q4_0 / K-quant weights, each against every input through g->dot. */
static void rows_qdot(const struct gemv *g, uint32_t r0, uint32_t r1)
{
    const struct ty_weight *w = g->w;
    uint64_t cols = w->cols, ib = ty__cpu_input_block(w->type);
    uint64_t nb = cols / ty_ggml_type_block(w->type), rb = ty_ggml_type_nbytes(w->type, cols);
    for (uint32_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * rb;
        prefetch_ahead(row, rb, r, r1);
        for (uint32_t t = 0; t < g->T; t++) {
            struct ty_cpu_qin in = {g->xq + (size_t)t * cols, g->xd + (size_t)t * (cols / ib),
                                    g->xs ? g->xs + (size_t)t * (cols / 16) : NULL};
            g->y[(size_t)t * w->rows + r] = g->dot(row, &in, nb);
        }
    }
}

/* ---- scalar ------------------------------------------------------------------------------- */

static float bf16_to_float(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void rows_scalar(const struct gemv *g, uint32_t r0, uint32_t r1)
{
    const struct ty_weight *w = g->w;
    uint64_t cols = w->cols;
    for (uint32_t r = r0; r < r1; r++) {
        for (uint32_t t = 0; t < g->T; t++) {
            const float *x = g->x + (size_t)t * cols;
            float sum = 0;
            if (w->type == TY_GGML_Q8_0) {
                const unsigned char *p = (const unsigned char *)w->data + r * (cols / 32) * 34;
                const int8_t *xq = g->xq + (size_t)t * cols;
                const float *xd = g->xd + (size_t)t * (cols / 32);
                for (uint64_t b = 0; b < cols / 32; b++, p += 34) {
                    uint16_t d16;
                    memcpy(&d16, p, 2);
                    int32_t s = 0;
                    for (int j = 0; j < 32; j++)
                        s += (int32_t)(int8_t)p[2 + j] * xq[b * 32 + j];
                    sum += g->h2f[d16] * xd[b] * (float)s;
                }
            } else {
                const uint16_t *p = (const uint16_t *)w->data + r * cols;
                if (w->type == TY_GGML_F16)
                    for (uint64_t c = 0; c < cols; c++)
                        sum += g->h2f[p[c]] * x[c];
                else
                    for (uint64_t c = 0; c < cols; c++)
                        sum += bf16_to_float(p[c]) * x[c];
            }
            g->y[(size_t)t * w->rows + r] = sum;
        }
    }
}

/* ---- AVX2 + FMA + F16C ---------------------------------------------------------------------- */

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* Eight 16-bit weights at p, widened to f32. */
AVX2 static __m256 load8(const uint16_t *p, bool bf16)
{
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (!bf16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* One F16 / BF16 row against n (1..4, a constant after inlining, so the accumulators stay in
 * registers) inputs: 32 columns a step, two accumulators per input for n > 1, four for n = 1
 * (the FMA latency needs that many chains in flight). */
__attribute__((always_inline)) AVX2 static inline void row16(const uint16_t *p, const float *x,
                                                            uint64_t cols, bool bf16,
                                                            uint32_t n, const float *h2f,
                                                            float *out, size_t ostride)
{
    uint64_t c32 = cols & ~(uint64_t)31;
    __m256 a[4][4];
    for (uint32_t t = 0; t < n; t++)
        a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm256_setzero_ps();
    for (uint64_t c = 0; c < c32; c += 32) {
        __m256 w0 = load8(p + c, bf16), w1 = load8(p + c + 8, bf16);
        __m256 w2 = load8(p + c + 16, bf16), w3 = load8(p + c + 24, bf16);
        for (uint32_t t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * cols + c;
            if (n == 1) {
                a[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), a[t][0]);
                a[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), a[t][1]);
                a[t][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt + 16), a[t][2]);
                a[t][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), a[t][3]);
            } else {
                a[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), a[t][0]);
                a[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), a[t][1]);
                a[t][0] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt + 16), a[t][0]);
                a[t][1] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), a[t][1]);
            }
        }
    }
    for (uint32_t t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * cols;
        __m256 v = _mm256_add_ps(a[t][0], a[t][1]);
        if (n == 1)
            v = _mm256_add_ps(v, _mm256_add_ps(a[t][2], a[t][3]));
        float sum = ty__cpu_hsum8(v);
        for (uint64_t c = c32; c < cols; c++)
            sum += (bf16 ? bf16_to_float(p[c]) : h2f[p[c]]) * xt[c];
        out[(size_t)t * ostride] = sum;
    }
}

AVX2 static void rows_16_avx2(const struct gemv *g, uint32_t r0, uint32_t r1)
{
    const struct ty_weight *w = g->w;
    uint64_t cols = w->cols;
    bool bf16 = w->type == TY_GGML_BF16;
    for (uint32_t r = r0; r < r1; r++) {
        const uint16_t *p = (const uint16_t *)w->data + r * cols;
        prefetch_ahead((const unsigned char *)p, cols * 2, r, r1);
        for (uint32_t t0 = 0; t0 < g->T; t0 += 4) {
            const float *x = g->x + (size_t)t0 * cols;
            float *out = g->y + (size_t)t0 * w->rows + r;
            switch (g->T - t0 < 4 ? g->T - t0 : 4) {
            case 1:
                row16(p, x, cols, bf16, 1, g->h2f, out, w->rows);
                break;
            case 2:
                row16(p, x, cols, bf16, 2, g->h2f, out, w->rows);
                break;
            case 3:
                row16(p, x, cols, bf16, 3, g->h2f, out, w->rows);
                break;
            default:
                row16(p, x, cols, bf16, 4, g->h2f, out, w->rows);
            }
        }
    }
}

/* Q8_0 rows (blocks of 32: f16 scale, 32 int8) against the quantized inputs: per block the
 * 32 int8 products summed exactly (|w| x sign-adjusted x through maddubs, then pairs to
 * int32), scaled by d_w * d_x into an f32 accumulator per input. */
AVX2 static void rows_q8_avx2(const struct gemv *g, uint32_t r0, uint32_t r1)
{
    const struct ty_weight *w = g->w;
    uint64_t cols = w->cols, nb = cols / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    for (uint32_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * nb * 34;
        prefetch_ahead(row, nb * 34, r, r1);
        for (uint32_t t0 = 0; t0 < g->T; t0 += 4) {
            uint32_t n = g->T - t0 < 4 ? g->T - t0 : 4;
            __m256 a[4];
            for (uint32_t t = 0; t < 4; t++)
                a[t] = _mm256_setzero_ps();
            const unsigned char *p = row;
            for (uint64_t b = 0; b < nb; b++, p += 34) {
                uint16_t d16;
                memcpy(&d16, p, 2);
                float dw = g->h2f[d16];
                __m256i qw = _mm256_loadu_si256((const __m256i *)(p + 2));
                __m256i aw = _mm256_sign_epi8(qw, qw);
                for (uint32_t t = 0; t < n; t++) {
                    size_t i = (size_t)(t0 + t);
                    __m256i qx = _mm256_loadu_si256((const __m256i *)(g->xq + i * cols + b * 32));
                    __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(qx, qw));
                    __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                    a[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * g->xd[i * nb + b]), f, a[t]);
                }
            }
            for (uint32_t t = 0; t < n; t++)
                g->y[(size_t)(t0 + t) * w->rows + r] = ty__cpu_hsum8(a[t]);
        }
    }
}

/* AVX2 and FMA as the compiler's CPU model sees them (which includes the OS saving the YMM
 * state), F16C from CPUID leaf 1 (ECX bit 29; not every compiler's __builtin_cpu_supports
 * knows it). Computed once per process. */
static bool avx2_ok;
static pthread_once_t avx2_once = PTHREAD_ONCE_INIT;

static void avx2_probe(void)
{
    unsigned a, b, c = 0, d;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    avx2_ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}
#endif

/* Whether the vector kernels run here; read by the caller, passed to the workers in g. */
bool ty__cpu_have_avx2(void)
{
#if defined(__x86_64__)
    pthread_once(&avx2_once, avx2_probe);
    return avx2_ok;
#else
    return false;
#endif
}

static void task(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    (void)thread;
    const struct gemv *g = arg;
    if (g->dot) {
        rows_qdot(g, begin, end);
        return;
    }
#if defined(__x86_64__)
    if (g->avx2) {
        if (g->w->type == TY_GGML_Q8_0)
            rows_q8_avx2(g, begin, end);
        else
            rows_16_avx2(g, begin, end);
        return;
    }
#endif
    rows_scalar(g, begin, end);
}

bool ty__cpu_gemv_supported(const struct ty_weight *w, uint32_t T)
{
    if (T == 0 || T > TY_CPU_GEMV_MAX_T)
        return false;
    uint32_t ib = ty__cpu_input_block(w->type);
    if (ib)
        return w->cols % ib == 0 && w->cols % ty_ggml_type_block(w->type) == 0;
    return w->type == TY_GGML_F16 || w->type == TY_GGML_BF16;
}

int ty__cpu_gemv(ty_cpu_pool_t *pool, const struct ty_weight *w, const float *x, float *y,
                 uint32_t T, float *scratch, size_t scratch_floats)
{
    struct gemv g = {.w = w, .x = x, .y = y, .T = T, .h2f = ty__cpu_f16_table(),
                     .avx2 = ty__cpu_have_avx2()};
    float *own = NULL;
    uint32_t ib = ty__cpu_input_block(w->type);
    if (ib) {
        /* quantized inputs in the caller's scratch: T * cols/ib scales, T * cols/16 int16
         * sums (Q8_K), then T * cols int8 */
        size_t n = (size_t)T * w->cols, nd = n / ib, ns = ib == 256 ? n / 32 : 0;
        size_t need = nd + ns + (n + 3) / 4;
        float *buf = scratch;
        if (need > scratch_floats && !(buf = own = malloc(need * sizeof(float))))
            return TY_ENOMEM;
        int16_t *xs = ns ? (int16_t *)(buf + nd) : NULL;
        int8_t *xq = (int8_t *)(buf + nd + ns);
        ty__cpu_quantize_inputs(w->type, x, n, xq, buf, xs);
        g.xd = buf;
        g.xs = xs;
        g.xq = xq;
        g.dot = ty__cpu_qdot_kernel(w->type, g.avx2); /* NULL for Q8_0: rows below */
    }
    if (pool)
        ty__cpu_pool_run(pool, (uint32_t)w->rows, task, &g);
    else
        task(&g, 0, 0, (uint32_t)w->rows);
    free(own);
    return 0;
}
