/* The CPU backend's few-token matmul read straight from F16, BF16 and Q8_0 weights (gemv.c)
 * against a reference that widens each row with the tile path's converter and sums in
 * double: every row, every input count 1..8, column counts with a vector tail, the worker
 * pool and the calling thread alone. For Q8_0 the reference quantizes the inputs itself the
 * way ggml's quantize_row_q8_0 does (d = max|x|/127 at f16 precision, q = round(x/d)) and sums
 * d_w * d_x * (int8 products). Outputs start as NaN so a row left unwritten fails. The worker
 * pool (threads.c): every index of every run to one thread, back to back, after the workers
 * went to sleep, and with a slow worker. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cpu-impl.h"
#include "tycho/gguf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng = 88172645463325252ull;
static float scratch[16384]; /* T * cols / 32 + T * cols / 4 floats for the largest case */

static double uniform(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 4503599627370496.0 - 1.0;
}

/* Nearest IEEE half of f (normal range; |f| < 2 here). */
static uint16_t to_half(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    uint32_t sign = (b >> 16) & 0x8000, exp = (b >> 23) & 0xff, man = b & 0x7fffff;
    if (exp < 113) /* below the normal half range: zero (we never make such small values) */
        return (uint16_t)sign;
    uint32_t h = sign | ((exp - 112) << 10) | (man >> 13);
    if ((man & 0x1fff) > 0x1000 || ((man & 0x1fff) == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)h;
}

/* Weight bytes of `type` for rows x cols random values. */
static void *make_weight(uint32_t type, uint64_t rows, uint64_t cols)
{
    if (type == TY_GGML_Q8_0) {
        unsigned char *p = malloc(rows * (cols / 32) * 34);
        for (uint64_t i = 0; i < rows * (cols / 32); i++) {
            uint16_t d = to_half((float)(0.01 + 0.02 * fabs(uniform())));
            memcpy(p + i * 34, &d, 2);
            for (int j = 0; j < 32; j++)
                p[i * 34 + 2 + j] = (unsigned char)(int8_t)(127 * uniform());
            if (i % 5 == 0) /* -128: a file may hold it though ggml's quantizer never writes it */
                p[i * 34 + 2 + i % 32] = 0x80;
        }
        return p;
    }
    uint16_t *p = malloc(rows * cols * 2);
    for (uint64_t i = 0; i < rows * cols; i++) {
        float f = (float)uniform();
        if (type == TY_GGML_F16) {
            p[i] = to_half(f);
        } else {
            uint32_t b;
            memcpy(&b, &f, 4);
            p[i] = (uint16_t)(b >> 16);
        }
    }
    return p;
}

static float half_value(uint16_t h) /* finite halves */
{
    if (!(h & 0x7c00)) /* zero or subnormal: m * 2^-24 */
        return (h & 0x8000 ? -1.0f : 1.0f) * ldexpf((float)(h & 0x3ff), -24);
    uint32_t b = ((uint32_t)(h & 0x8000) << 16) | ((((h >> 10) & 0x1f) + 112u) << 23) |
                 ((uint32_t)(h & 0x3ff) << 13);
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* Input x (cols) as Q8_0 blocks: the values q * d it stands for. */
static void quantized_input(const float *x, uint64_t cols, double *xv)
{
    for (uint64_t b = 0; b < cols / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fabsf(x[b * 32 + j]) > amax ? fabsf(x[b * 32 + j]) : amax;
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        /* f16 of d, subnormal halves included: computed through double, not bit patterns */
        double dh = d < 6.103515625e-05 ? nearbyint((double)d * 16777216.0) / 16777216.0
                                        : half_value(to_half(d));
        for (int j = 0; j < 32; j++)
            xv[b * 32 + j] = dh * roundf(x[b * 32 + j] * id);
    }
}

static void check_scaled(uint32_t type, uint64_t rows, uint64_t cols, ty_cpu_pool_t *pool,
                         double x_scale)
{
    struct ty_weight w = {.data = make_weight(type, rows, cols), .type = type, .rows = rows,
                          .cols = cols};
    float *x = malloc(TY_CPU_GEMV_MAX_T * cols * sizeof(float));
    float *y = malloc(TY_CPU_GEMV_MAX_T * rows * sizeof(float));
    float *row = malloc(cols * sizeof(float));
    double *xv = malloc(cols * sizeof(double));
    for (uint64_t i = 0; i < TY_CPU_GEMV_MAX_T * cols; i++)
        x[i] = (float)(x_scale * uniform());
    for (uint32_t T = 1; T <= TY_CPU_GEMV_MAX_T; T++) {
        assert_true(ty__cpu_gemv_supported(&w, T));
        for (uint64_t i = 0; i < T * rows; i++)
            y[i] = NAN;
        /* with the pool the quantized inputs go to a scratch buffer, alone they are allocated */
        assert_int_equal(ty__cpu_gemv(pool, &w, x, y, T, pool ? scratch : NULL,
                                      pool ? sizeof(scratch) / sizeof(scratch[0]) : 0), 0);
        for (uint64_t r = 0; r < rows; r++) {
            ty__cpu_row_to_f32(&w, r, row);
            for (uint32_t t = 0; t < T; t++) {
                double ref = 0, mag = 0;
                for (uint64_t c = 0; c < cols; c++)
                    xv[c] = x[t * cols + c];
                if (type == TY_GGML_Q8_0)
                    quantized_input(x + t * cols, cols, xv);
                for (uint64_t c = 0; c < cols; c++) {
                    ref += (double)row[c] * xv[c];
                    mag += fabs((double)row[c] * xv[c]);
                }
                double got = y[t * rows + r];
                if (!(fabs(got - ref) <= 1e-5 * mag + 1e-6))
                    fail_msg("type %u rows %llu cols %llu T %u: y[%u][%llu] = %.9g, want %.9g",
                             type, (unsigned long long)rows, (unsigned long long)cols, T, t,
                             (unsigned long long)r, got, ref);
            }
        }
    }
    assert_false(ty__cpu_gemv_supported(&w, TY_CPU_GEMV_MAX_T + 1));
    assert_false(ty__cpu_gemv_supported(&w, 0));
    free((void *)w.data);
    free(x);
    free(y);
    free(row);
    free(xv);
}

static void check(uint32_t type, uint64_t rows, uint64_t cols, ty_cpu_pool_t *pool)
{
    check_scaled(type, rows, cols, pool, 1.0);
}

static void run_all(ty_cpu_pool_t *pool)
{
    for (uint64_t cols = 8; cols <= 136; cols += 43) /* 8, 51, 94, 137: vector tails */
        check(TY_GGML_F16, 37, cols, pool);
    check(TY_GGML_F16, 5, 768, pool);
    check(TY_GGML_BF16, 37, 75, pool);
    check(TY_GGML_BF16, 3, 1024, pool);
    check(TY_GGML_Q8_0, 37, 32, pool);
    check(TY_GGML_Q8_0, 37, 96, pool);
    check(TY_GGML_Q8_0, 5, 1024, pool);
    /* small activations: block scales max|x|/127 below 2^-14 are subnormal halves, not 0 */
    check_scaled(TY_GGML_Q8_0, 7, 256, pool, 0.004);
    check_scaled(TY_GGML_F16, 7, 256, pool, 0.004);
}

static void test_calling_thread(void **st)
{
    (void)st;
    run_all(NULL);
}

static void test_pool(void **st)
{
    (void)st;
    ty_cpu_pool_t *pool;
    assert_int_equal(ty__cpu_pool_new(&pool, 3), 0);
    run_all(pool);
    ty__cpu_pool_free(pool);
}

/* The worker pool hands every index of every run to exactly one thread, whether the workers
 * are still polling from the last run (back to back), asleep (a pause longer than their
 * polling window first), or the caller waits past its own window for a slow worker. */
struct handoff {
    unsigned counts[64];
    unsigned slow; /* microseconds each slice of worker 1 takes */
};

static void handoff_task(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    struct handoff *h = arg;
    if (thread == 1 && h->slow)
        usleep(h->slow);
    for (uint32_t i = begin; i < end; i++)
        h->counts[i]++;
}

static void test_pool_handoff(void **st)
{
    (void)st;
    ty_cpu_pool_t *pool;
    assert_int_equal(ty__cpu_pool_new(&pool, 3), 0);
    struct handoff h = {{0}, 0};
    unsigned runs = 0;
    for (int r = 0; r < 3000; r++, runs++) {
        if (r % 500 == 499)
            usleep(2000); /* past the polling window: the workers sleep */
        h.slow = r % 700 == 3 ? 1000 : 0;
        ty__cpu_pool_run(pool, 64, handoff_task, &h);
    }
    for (int i = 0; i < 64; i++)
        assert_int_equal(h.counts[i], runs);
    ty__cpu_pool_free(pool);
}

static void test_unsupported(void **st)
{
    (void)st;
    float f[32] = {0};
    struct ty_weight w32 = {.data = f, .type = TY_GGML_F32, .rows = 1, .cols = 32};
    struct ty_weight q8 = {.data = f, .type = TY_GGML_Q8_0, .rows = 1, .cols = 48};
    assert_false(ty__cpu_gemv_supported(&w32, 1)); /* F32 goes to BLAS */
    assert_false(ty__cpu_gemv_supported(&q8, 1));  /* not whole blocks */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calling_thread),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_pool_handoff),
        cmocka_unit_test(test_unsupported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
