/* Q4_0, MXFP4 and K-quant weights on the CPU (src/engine/quant.c, cpu/qdot.c, cpu/gemv.c):
 *  - MXFP4 blocks read as the OCP microscaling spec defines them: E2M1 codes (0, 0.5, 1, 1.5,
 *    2, 3, 4, 6, sign in the top bit) times 2^(e - 127) of the E8M0 byte;
 *  - each dot kernel, scalar and AVX2, on random blocks (every byte random: all nibbles, bit
 *    pairs and 6-bit scales occur; only the f16 block scales are kept finite) against the
 *    reference that widens the weight row (ty_quant_row_dequantize) and the quantized input
 *    (d * q) and sums in double; AVX2 and scalar against each other;
 *  - the input quantizers: Q8_K's 16-sums and its largest value at -127, Q8_0's scales;
 *  - the weight quantizers round-trip within their format's resolution;
 *  - the few-token matmul (1-8 inputs, worker pool and caller thread) and the many-token paths
 *    of ty__cpu_matmul (20 inputs: the integer GEMM; 40: the panel GEMM; or rounded inputs and
 *    BLAS) against the same reference;
 *  - the integer GEMM bit for bit against one token at a time;
 *  - the panel GEMM (prefill) against the reference, a token's bits the same alone and in a
 *    batch, and ty__cpu_matmul taking it above the integer GEMM's token limit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cpu-impl.h"
#include "tycho/gguf.h"
#include "tycho/errors.h"
#include "tycho/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* FP4's eight levels over a block's power-of-two range: 0.0191 measured on these rows */
#define MXFP4_NMSE 0.025

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static double uniform(void) /* [-1, 1) */
{
    return (double)(next() >> 11) / 4503599627370496.0 - 1.0;
}

static void put_half(unsigned char *p, float f)
{
    uint16_t h = ty__cpu_f32_to_half1(f);
    memcpy(p, &h, 2);
}

static const uint32_t types[] = {TY_GGML_Q4_0, TY_GGML_MXFP4, TY_GGML_Q4_K, TY_GGML_Q5_K,
                                 TY_GGML_Q6_K};

/* rows x cols of random blocks of `type`: random bytes, then sane f16 scales. */
static unsigned char *random_blocks(uint32_t type, uint64_t rows, uint64_t cols)
{
    uint32_t block = ty_ggml_type_block(type);
    uint64_t bytes = ty_ggml_type_nbytes(type, block), nb = rows * cols / block;
    unsigned char *p = malloc(nb * bytes);
    for (uint64_t i = 0; i < nb * bytes; i++)
        p[i] = (unsigned char)next();
    for (uint64_t b = 0; b < nb; b++) {
        unsigned char *blk = p + b * bytes;
        float d = (float)(0.001 + 0.01 * fabs(uniform()));
        switch (type) {
        case TY_GGML_Q4_0:
            put_half(blk, d);
            break;
        case TY_GGML_MXFP4: /* scales 2^-9 .. 2^-4 */
            blk[0] = (unsigned char)(118 + b % 6);
            break;
        case TY_GGML_Q6_K:
            put_half(blk + 208, b % 3 ? d : -d);
            break;
        default: /* Q4_K, Q5_K: d and dmin */
            put_half(blk, d);
            put_half(blk + 2, (float)(0.002 * fabs(uniform())));
        }
    }
    return p;
}

struct qinput {
    int8_t *q;
    float *d;
    int16_t *s;
    struct ty_cpu_qin in;
};

static void quantize(uint32_t type, const float *x, uint64_t n, struct qinput *qi)
{
    uint32_t ib = ty__cpu_input_block(type);
    qi->q = malloc(n);
    qi->d = malloc(n / ib * sizeof(float));
    qi->s = malloc(n / 16 * sizeof(int16_t));
    ty__cpu_quantize_inputs(type, x, n, qi->q, qi->d, qi->s);
    qi->in = (struct ty_cpu_qin){qi->q, qi->d, ib == 256 ? qi->s : NULL};
}

static void qinput_free(struct qinput *qi)
{
    free(qi->q);
    free(qi->d);
    free(qi->s);
}

/* sum_i w_i * (d * q)_i in double, and sum |.| for the tolerance. */
static double reference(uint32_t type, const unsigned char *row, uint64_t cols,
                        const struct qinput *qi, double *mag)
{
    uint32_t ib = ty__cpu_input_block(type);
    float *w = malloc(cols * sizeof(float));
    assert_int_equal(ty_quant_row_dequantize(type, row, w, cols), 0);
    double ref = 0;
    *mag = 0;
    for (uint64_t c = 0; c < cols; c++) {
        double v = (double)w[c] * ((double)qi->d[c / ib] * qi->q[c]);
        ref += v;
        *mag += fabs(v);
    }
    free(w);
    return ref;
}

static void test_kernels(void **st)
{
    (void)st;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        uint32_t type = types[ti];
        ty_cpu_qdot_fn scalar = ty__cpu_qdot_kernel(type, false);
        ty_cpu_qdot_fn avx2 = ty__cpu_have_avx2() ? ty__cpu_qdot_kernel(type, true) : NULL;
        assert_non_null(scalar);
        /* 1 to 8 K blocks, odd counts too (768: the 110M bench model's rows) */
        static const uint64_t sizes[] = {256, 512, 768, 1024, 1280, 2048};
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
            uint64_t cols = sizes[si];
            for (int rep = 0; rep < 20; rep++) {
                unsigned char *w = random_blocks(type, 1, cols);
                float *x = malloc(cols * sizeof(float));
                for (uint64_t c = 0; c < cols; c++)
                    x[c] = (float)(rep % 4 == 3 ? 1e-3 : 1.0) * (float)uniform();
                if (rep == 5) /* an all-zero input block: d = 0, sums 0 */
                    memset(x, 0, 256 * sizeof(float));
                struct qinput qi;
                quantize(type, x, cols, &qi);
                double mag, ref = reference(type, w, cols, &qi, &mag);
                uint64_t nb = cols / ty_ggml_type_block(type);
                double s = scalar(w, &qi.in, nb);
                if (!(fabs(s - ref) <= 1e-5 * mag + 1e-9))
                    fail_msg("%s scalar cols %llu: %.9g, want %.9g", ty_ggml_type_name(type),
                             (unsigned long long)cols, s, ref);
                if (avx2) {
                    double a = avx2(w, &qi.in, nb);
                    if (!(fabs(a - ref) <= 1e-5 * mag + 1e-9) ||
                        !(fabs(a - s) <= 1e-5 * mag + 1e-9))
                        fail_msg("%s avx2 cols %llu: %.9g, scalar %.9g, want %.9g",
                                 ty_ggml_type_name(type), (unsigned long long)cols, a, s, ref);
                }
                qinput_free(&qi);
                free(w);
                free(x);
            }
        }
    }
    assert_null(ty__cpu_qdot_kernel(TY_GGML_F16, false));
}

static void test_input_quantization(void **st)
{
    (void)st;
    float x[512];
    for (int i = 0; i < 512; i++)
        x[i] = (float)uniform();
    x[77] = -3.0f; /* each block's largest magnitude maps to -127, d = max / -127 */
    x[300] = 2.5f;
    struct qinput qi;
    quantize(TY_GGML_Q4_K, x, 512, &qi);
    assert_int_equal(qi.q[77], -127);
    assert_int_equal(qi.q[300], -127);
    assert_true(fabsf(qi.d[0] - 3.0f / 127) < 1e-7f && fabsf(qi.d[1] + 2.5f / 127) < 1e-7f);
    for (int g = 0; g < 32; g++) {
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += qi.q[16 * g + j];
        assert_int_equal(qi.s[g], sum);
    }
    qinput_free(&qi);
    quantize(TY_GGML_Q4_0, x, 512, &qi);
    for (int b = 0; b < 16; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fabsf(x[32 * b + j]) > amax ? fabsf(x[32 * b + j]) : amax;
        assert_true(fabsf(qi.d[b] - amax / 127) <= amax / 127 / 1024); /* an f16 of it */
        for (int j = 0; j < 32; j++) /* x * 127 / amax, halves to even */
            assert_int_equal(qi.q[32 * b + j], (int)nearbyintf(x[32 * b + j] * (127.0f / amax)));
    }
    qinput_free(&qi);
    /* Q8_K: the first of two values of largest magnitude sets the sign; every quant is
     * x * -127 / max rounded, halves to even (exact halves: x = k + 0.5 at scale 1); a zero
     * block is all zeros */
    float y[768] = {0};
    for (int i = 0; i < 256; i++)
        y[i] = (float)(i % 5) - 2.0f + (i % 3 == 0 ? 0.5f : 0.0f);
    y[40] = -127.0f, y[41] = 127.0f; /* scale -127 / -127 = 1: quants are the rounded values */
    for (int i = 256; i < 512; i++)
        y[i] = (float)uniform();
    quantize(TY_GGML_Q6_K, y, 768, &qi);
    for (int b = 0; b < 2; b++) {
        float max = 0;
        for (int j = 0; j < 256; j++)
            if (fabsf(y[256 * b + j]) > fabsf(max))
                max = y[256 * b + j];
        for (int j = 0; j < 256; j++) {
            int r = (int)nearbyintf(-127.0f / max * y[256 * b + j]);
            assert_int_equal(qi.q[256 * b + j], r > 127 ? 127 : r);
        }
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += qi.q[256 * b + 16 * g + j];
            assert_int_equal(qi.s[16 * b + g], sum);
        }
    }
    assert_int_equal(qi.q[40], -127); /* y[40] came first */
    assert_int_equal(qi.q[41], 127);
    assert_int_equal(qi.q[0], -2); /* -1.5 and 1.5 to even */
    assert_int_equal(qi.q[3], 2);
    assert_true(qi.d[2] == 0.0f);
    for (int j = 512; j < 768; j++)
        assert_int_equal(qi.q[j], 0);
    qinput_free(&qi);
}

/* MXFP4 against the format's definition, not our table: code c is E2M1 (sign bit 3, exponent
 * bits 2-1 with bias 1, mantissa bit 0; exponent 0 is subnormal: 0 or 0.5) times 2^(e - 127),
 * value j in the low nibble of byte j, value j + 16 in its high nibble. */
static void test_mxfp4_spec(void **st)
{
    (void)st;
    static const unsigned char es[] = {0, 1, 2, 100, 127, 130, 200};
    for (size_t k = 0; k < sizeof(es); k++) {
        unsigned char blk[17];
        blk[0] = es[k];
        for (int j = 0; j < 16; j++)
            blk[1 + j] = (unsigned char)(j | (15 - j) << 4);
        float y[32];
        assert_int_equal(ty_quant_row_dequantize(TY_GGML_MXFP4, blk, y, 32), 0);
        for (int j = 0; j < 32; j++) {
            int c = j < 16 ? j : 15 - (j - 16);
            int ex = c >> 1 & 3, man = c & 1;
            double v = ex ? ldexp(1.0 + man / 2.0, ex - 1) : man * 0.5;
            v = (c & 8 ? -v : v) * ldexp(1.0, (int)es[k] - 127);
            if ((double)y[j] != v)
                fail_msg("e %u code %d: %.9g, want %.9g", es[k], c, (double)y[j], v);
        }
    }
    /* the quantizer: a block whose largest value is 6 * 2^-3 gets e = 124 and codes exact */
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j % 8 == 7 ? 0.75 : (j % 4) * 0.125) * (j % 2 ? -1 : 1);
    unsigned char q[17];
    float y[32];
    assert_int_equal(ty_quant_row_quantize(TY_GGML_MXFP4, x, q, 32), 0);
    assert_int_equal(ty_quant_row_dequantize(TY_GGML_MXFP4, q, y, 32), 0);
    assert_int_equal(q[0], 124);
    assert_memory_equal(x, y, sizeof(x));
}

static void test_roundtrip(void **st)
{
    (void)st;
    static const struct {
        uint32_t type;
        double max_nmse;
    } cases[] = {{TY_GGML_Q8_0, 1e-4},
                 {TY_GGML_Q4_0, 0.012},
                 {TY_GGML_MXFP4, MXFP4_NMSE},
                 {TY_GGML_Q4_K, 0.012},
                 {TY_GGML_Q5_K, 0.003},
                 {TY_GGML_Q6_K, 0.001}};
    enum { N = 4096 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    unsigned char *q = malloc(ty_ggml_type_nbytes(TY_GGML_Q8_0, N));
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        for (int i = 0; i < N; i++)
            x[i] = (float)(uniform() * (i % 512 < 256 ? 1.0 : 0.01) + (i % 1024 < 512 ? 0.3 : 0));
        assert_int_equal(ty_quant_row_quantize(cases[k].type, x, q, N), 0);
        assert_int_equal(ty_quant_row_dequantize(cases[k].type, q, y, N), 0);
        double err = 0, sig = 0;
        for (int i = 0; i < N; i++) {
            err += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
            sig += (double)x[i] * x[i];
        }
        if (!(err / sig <= cases[k].max_nmse))
            fail_msg("%s round trip nmse %.3g", ty_ggml_type_name(cases[k].type), err / sig);
    }
    assert_int_equal(ty_quant_row_quantize(TY_GGML_Q4_K, x, q, 128), TY_EINVAL); /* not whole */
    assert_int_equal(ty_quant_row_quantize(TY_GGML_F16, x, q, 256), TY_EINVAL);
    assert_int_equal(ty_quant_row_dequantize(TY_GGML_Q6_K, q, y, 100), TY_EINVAL);
    free(x);
    free(y);
    free(q);
}

/* ty__cpu_matmul (few-token kernels for T <= 8, tiles + BLAS above) against the reference. */
static void check_matmul(uint32_t type, uint64_t rows, uint64_t cols, ty_cpu_pool_t *pool)
{
    enum { TMAX = 40 };
    struct ty_weight w = {
        .data = random_blocks(type, rows, cols), .type = type, .rows = rows, .cols = cols};
    uint64_t rb = ty_ggml_type_nbytes(type, cols);
    float *x = malloc(TMAX * cols * sizeof(float)), *y = malloc(TMAX * rows * sizeof(float));
    size_t ns = ty__cpu_matmul_scratch(cols);
    float *scratch = malloc(ns * sizeof(float));
    for (uint64_t i = 0; i < TMAX * cols; i++)
        x[i] = (float)uniform();
    static const uint32_t Ts[] = {1, 2, 3, 5, 8, 20, TMAX}; /* 40: panels or tiles */
    for (size_t k = 0; k < sizeof(Ts) / sizeof(Ts[0]); k++) {
        uint32_t T = Ts[k];
        assert_true(ty__cpu_gemv_supported(&w, T) == (T <= TY_CPU_GEMV_MAX_T));
        for (uint64_t i = 0; i < T * rows; i++)
            y[i] = NAN;
        ty__cpu_matmul(pool, &w, x, y, T, scratch, ns);
        for (uint32_t t = 0; t < T; t++) {
            struct qinput qi;
            quantize(type, x + t * cols, cols, &qi);
            for (uint64_t r = 0; r < rows; r++) {
                double mag,
                    ref = reference(type, (const unsigned char *)w.data + r * rb, cols, &qi, &mag);
                double got = y[t * rows + r];
                if (!(fabs(got - ref) <= 1e-5 * mag + 1e-9))
                    fail_msg("%s rows %llu cols %llu T %u: y[%u][%llu] = %.9g, want %.9g",
                             ty_ggml_type_name(type), (unsigned long long)rows,
                             (unsigned long long)cols, T, t, (unsigned long long)r, got, ref);
            }
            qinput_free(&qi);
        }
    }
    free((void *)w.data);
    free(x);
    free(y);
    free(scratch);
}

static void test_matmul(void **st)
{
    (void)st;
    ty_cpu_pool_t *pool;
    assert_int_equal(ty__cpu_pool_new(&pool, 3), 0);
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        check_matmul(types[ti], 37, 512, pool);
        check_matmul(types[ti], 5, 256, NULL);
    }
    check_matmul(TY_GGML_Q4_0, 9, 96, pool);
    check_matmul(TY_GGML_Q8_0, 37, 512, pool); /* the AVX2 widening into tiles */
    check_matmul(TY_GGML_Q8_0, 5, 256, NULL);
    ty__cpu_pool_free(pool);
}

/* ty__cpu_qgemm (prefill's integer GEMM) against ty__cpu_gemv one token at a time, bit for
 * bit: a token's output must not depend on how many tokens came with it. T and rows off the
 * register tiles, a token count past one cache block of tokens, a zero input row, 1-3 threads
 * and the caller alone; ty__cpu_matmul between the gemv and GEMM limits must give the same
 * bits. */
static void check_qgemm(uint32_t type, uint64_t rows, uint64_t cols, uint32_t T,
                        ty_cpu_pool_t *pool)
{
    struct ty_weight w = {
        .data = random_blocks(type, rows, cols), .type = type, .rows = rows, .cols = cols};
    float *x = malloc(T * cols * sizeof(float)), *y = malloc(T * rows * sizeof(float));
    float *y1 = malloc(rows * sizeof(float)), *ym = malloc(T * rows * sizeof(float));
    size_t ns = ty__cpu_matmul_scratch(cols);
    float *scratch = malloc(ns * sizeof(float));
    for (uint32_t t = 0; t < T; t++)
        for (uint64_t c = 0; c < cols; c++)
            x[t * cols + c] = t == 3 ? 0.0f : (float)((1 + t % 7) * uniform());
    for (uint64_t i = 0; i < T * rows; i++)
        y[i] = ym[i] = NAN;
    assert_int_equal(ty__cpu_qgemm(pool, &w, x, y, T), 0);
    if (T <= TY_CPU_QGEMM_MAX_T)
        ty__cpu_matmul(pool, &w, x, ym, T, scratch, ns);
    else
        memcpy(ym, y, T * rows * sizeof(float)); /* the tile path: checked in check_matmul */
    for (uint32_t t = 0; t < T; t++) {
        assert_int_equal(ty__cpu_gemv(NULL, &w, x + t * cols, y1, 1, NULL, 0), 0);
        for (uint64_t r = 0; r < rows; r++)
            if (memcmp(&y[t * rows + r], &y1[r], sizeof(float)) ||
                memcmp(&ym[t * rows + r], &y1[r], sizeof(float)))
                fail_msg("%s rows %llu cols %llu T %u: y[%u][%llu] = %.9g (matmul %.9g), "
                         "one token alone %.9g",
                         ty_ggml_type_name(type), (unsigned long long)rows,
                         (unsigned long long)cols, T, t, (unsigned long long)r, y[t * rows + r],
                         ym[t * rows + r], y1[r]);
    }
    free((void *)w.data);
    free(x);
    free(y);
    free(y1);
    free(ym);
    free(scratch);
}

static void test_qgemm(void **st)
{
    (void)st;
    struct ty_weight q40 = {.type = TY_GGML_Q4_0, .rows = 1, .cols = 32};
    assert_false(ty__cpu_qgemm_supported(&q40)); /* keeps the tile path */
    if (!ty__cpu_have_avx2()) {
        print_message("no AVX2: the integer GEMM is not used here\n");
        return;
    }
    static const uint32_t gtypes[] = {TY_GGML_Q8_0, TY_GGML_Q4_K, TY_GGML_Q6_K};
    for (uint32_t n = 0; n <= 3; n++) {
        ty_cpu_pool_t *pool = NULL;
        if (n)
            assert_int_equal(ty__cpu_pool_new(&pool, n), 0);
        for (size_t ti = 0; ti < sizeof(gtypes) / sizeof(gtypes[0]); ti++) {
            struct ty_weight w = {.type = gtypes[ti], .rows = 1, .cols = 512};
            assert_true(ty__cpu_qgemm_supported(&w));
            check_qgemm(gtypes[ti], 37, 512, 9, pool);
            check_qgemm(gtypes[ti], 5, 256, 14, pool);
            check_qgemm(gtypes[ti], 11, 768, TY_CPU_QGEMM_MAX_T, pool);
            check_qgemm(gtypes[ti], 43, 2048, 101, pool); /* 96 tokens per cache block */
        }
        if (pool)
            ty__cpu_pool_free(pool);
    }
}

/* ty__cpu_qpanel (prefill's panel GEMM) against the double reference, and a token's outputs
 * the same bits whatever the batch and thread count: rows and tokens off the 8-row panels and
 * 4-token steps, a zero input row, 1-3 threads and the caller alone, scratch too small for a
 * panel per worker; ty__cpu_matmul above TY_CPU_QGEMM_MAX_T takes it. */
static void check_qpanel(uint32_t type, uint64_t rows, uint64_t cols, uint32_t T,
                         ty_cpu_pool_t *pool)
{
    struct ty_weight w = {
        .data = random_blocks(type, rows, cols), .type = type, .rows = rows, .cols = cols};
    uint64_t rb = ty_ggml_type_nbytes(type, cols);
    float *x = malloc(T * cols * sizeof(float)), *y = malloc(T * rows * sizeof(float));
    float *y1 = malloc(rows * sizeof(float)), *ym = malloc(T * rows * sizeof(float));
    size_t ns = ty__cpu_matmul_scratch(cols);
    float *scratch = malloc(ns * sizeof(float));
    for (uint32_t t = 0; t < T; t++)
        for (uint64_t c = 0; c < cols; c++)
            x[t * cols + c] = t == 3 ? 0.0f : (float)((1 + t % 7) * uniform());
    for (uint64_t i = 0; i < T * rows; i++)
        y[i] = ym[i] = NAN;
    assert_int_equal(ty__cpu_qpanel(pool, &w, x, y, T, NULL, 0), 0);
    ty__cpu_matmul(pool, &w, x, ym, T, scratch, ns);
    for (uint32_t t = 0; t < T; t++) {
        struct qinput qi;
        quantize(type, x + t * cols, cols, &qi);
        /* the same token alone (padded to one micro-kernel step by duplicates) */
        assert_int_equal(ty__cpu_qpanel(NULL, &w, x + t * cols, y1, 1, scratch, ns * 4), 0);
        for (uint64_t r = 0; r < rows; r++) {
            double mag, ref = reference(type, (const unsigned char *)w.data + r * rb, cols, &qi,
                                        &mag);
            double got = y[t * rows + r];
            if (!(fabs(got - ref) <= 1e-5 * mag + 1e-9) ||
                memcmp(&y[t * rows + r], &y1[r], sizeof(float)) ||
                (T > TY_CPU_QGEMM_MAX_T && memcmp(&ym[t * rows + r], &y1[r], sizeof(float))))
                fail_msg("%s rows %llu cols %llu T %u: y[%u][%llu] = %.9g (alone %.9g, matmul "
                         "%.9g), want %.9g",
                         ty_ggml_type_name(type), (unsigned long long)rows,
                         (unsigned long long)cols, T, t, (unsigned long long)r, got, y1[r],
                         ym[t * rows + r], ref);
        }
        qinput_free(&qi);
    }
    free((void *)w.data);
    free(x);
    free(y);
    free(y1);
    free(ym);
    free(scratch);
}

static void test_qpanel(void **st)
{
    (void)st;
    struct ty_weight q40 = {.type = TY_GGML_Q4_0, .rows = 1, .cols = 32};
    struct ty_weight q80 = {.type = TY_GGML_Q8_0, .rows = 1, .cols = 32};
    assert_false(ty__cpu_qpanel_supported(&q40)); /* keep the tile path */
    assert_false(ty__cpu_qpanel_supported(&q80));
    if (!ty__cpu_have_avx2()) {
        print_message("no AVX2: the panel GEMM is not used here\n");
        return;
    }
    static const uint32_t gtypes[] = {TY_GGML_Q4_K, TY_GGML_Q6_K};
    for (uint32_t n = 0; n <= 3; n++) {
        ty_cpu_pool_t *pool = NULL;
        if (n)
            assert_int_equal(ty__cpu_pool_new(&pool, n), 0);
        for (size_t ti = 0; ti < sizeof(gtypes) / sizeof(gtypes[0]); ti++) {
            struct ty_weight w = {.type = gtypes[ti], .rows = 1, .cols = 512};
            assert_true(ty__cpu_qpanel_supported(&w));
            check_qpanel(gtypes[ti], 37, 512, TY_CPU_QGEMM_MAX_T + 1, pool);
            check_qpanel(gtypes[ti], 5, 256, 7, pool);
            check_qpanel(gtypes[ti], 16, 768, 64, pool);
            check_qpanel(gtypes[ti], 43, 2048, 101, pool);
        }
        if (pool)
            ty__cpu_pool_free(pool);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels),
        cmocka_unit_test(test_input_quantization),
        cmocka_unit_test(test_mxfp4_spec),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_qgemm),
        cmocka_unit_test(test_qpanel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
