/* CPU reference ops. Numerics follow ggml where it matters for matching llama.cpp's greedy
 * ids: rmsnorm sums in double, rope thetas are the cumulative float product of
 * ggml_rope_cache_init. */
#include "cpu-impl.h"

#include "tycho/gguf.h"
#include "tycho/quant.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Converted tiles: 256 KiB of f32 (stays in L2 between conversion and GEMM) up to 16 tokens,
 * growing with the token count to 4 MiB (split among the pool's workers) at 256 tokens and
 * more: with many tokens the GEMM is compute-bound and each sgemm call's packing, not the
 * tile's trip through L3, is what a small tile multiplies (docs/benchmarks.md 2026-12-07). */
#define TILE_FLOATS     (64u * 1024u)
#define TILE_FLOATS_MAX (1024u * 1024u)

static float f16_table[65536];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

/* IEEE half -> float, including subnormals, inf and NaN. */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void f16_init(void)
{
    for (uint32_t i = 0; i < 65536; i++)
        f16_table[i] = half_to_float((uint16_t)i);
}

const float *ty__cpu_f16_table(void)
{
    pthread_once(&f16_once, f16_init);
    return f16_table;
}

#if defined(__x86_64__)
/* The tile path's two most common conversions with AVX2 + F16C: F16 (eight halves per
 * instruction) and Q8_0 (d times the 32 quants, as ty_quant_row_dequantize computes them). */
__attribute__((target("avx2,f16c"))) static bool row_to_f32_avx2(const struct ty_weight *w,
                                                                uint64_t row, float *out)
{
    uint64_t n = w->cols;
    const unsigned char *base = w->data;
    if (w->type == TY_GGML_F16 && n % 8 == 0) {
        const unsigned char *p = base + row * n * 2;
        for (uint64_t i = 0; i < n; i += 8)
            _mm256_storeu_ps(out + i,
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
        return true;
    }
    if (w->type == TY_GGML_Q8_0 && n % 32 == 0) {
        const unsigned char *p = base + row * (n / 32) * 34;
        for (uint64_t b = 0; b < n / 32; b++, p += 34, out += 32) {
            uint16_t h;
            memcpy(&h, p, 2);
            __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
            for (int k = 0; k < 4; k++) {
                __m128i q = _mm_loadl_epi64((const __m128i *)(p + 2 + 8 * k));
                _mm256_storeu_ps(out + 8 * k,
                                 _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
            }
        }
        return true;
    }
    return false;
}
#endif

void ty__cpu_row_to_f32(const struct ty_weight *w, uint64_t row, float *out)
{
    uint64_t n = w->cols;
    const unsigned char *base = w->data;
#if defined(__x86_64__)
    if ((w->type == TY_GGML_F16 || w->type == TY_GGML_Q8_0) && ty__cpu_have_avx2() &&
        row_to_f32_avx2(w, row, out))
        return;
#endif
    switch (w->type) {
    case TY_GGML_F32:
        memcpy(out, base + row * n * 4, n * 4);
        break;
    case TY_GGML_F16: {
        pthread_once(&f16_once, f16_init);
        const uint16_t *p = (const uint16_t *)(base + row * n * 2);
        for (uint64_t i = 0; i < n; i++)
            out[i] = f16_table[p[i]];
        break;
    }
    case TY_GGML_BF16: {
        const uint16_t *p = (const uint16_t *)(base + row * n * 2);
        for (uint64_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)p[i] << 16;
            memcpy(&out[i], &bits, 4);
        }
        break;
    }
    default:
        /* block types (tycho/quant.h); zeros for a type no loader lets through */
        if (ty_quant_row_dequantize(w->type, base + row * ty_ggml_type_nbytes(w->type, n), out, n))
            memset(out, 0, n * 4);
    }
}

struct convert {
    const struct ty_weight *w;
    uint64_t row0;
    float *out;
};

/* -DTY_CPU_QPANEL=0 builds keep Q4_K/Q6_K prefill on the tiles (to measure qpanel.c). */
#ifndef TY_CPU_QPANEL
#define TY_CPU_QPANEL 1
#endif

/* OpenBLAS runs on one thread (the CPU backend sets it so at creation): every GEMM is split
 * over the worker pool by rows, each worker multiplying its share with a one-thread sgemm
 * (or sgemv), F32 rows straight from the weights and other types converted a tile at a time
 * into the worker's own part of the scratch. No alternation of the pool and OpenBLAS's own
 * threads, which on a machine with one core per thread spin against each other (OpenBLAS's
 * idle threads yield in a loop for a while after each call). */
#define TY_CPU_SPLIT_MIN (1u << 18) /* products below which a matmul is not split */

struct split {
    const struct ty_weight *w;
    const float *x;
    float *y;
    float *scratch;
    size_t per_thread; /* floats of scratch per worker (converted types) */
    uint32_t T;
};

static void split_task(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    const struct split *sp = arg;
    int cols = (int)sp->w->cols, rows = (int)sp->w->rows;
    bool f32 = sp->w->type == TY_GGML_F32;
    float *tile = f32 ? NULL : sp->scratch + (size_t)thread * sp->per_thread;
    uint32_t step = f32 ? end - begin : (uint32_t)(sp->per_thread / (size_t)cols);
    for (uint32_t r0 = begin; r0 < end; r0 += step) {
        uint32_t nr = end - r0 < step ? end - r0 : step;
        const float *wr = f32 ? (const float *)sp->w->data + (size_t)r0 * cols : tile;
        if (!f32)
            for (uint32_t r = 0; r < nr; r++)
                ty__cpu_row_to_f32(sp->w, r0 + r, tile + (size_t)r * cols);
        if (sp->T == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)nr, cols, 1.0f, wr, cols, sp->x, 1, 0.0f,
                        sp->y + r0, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)sp->T, (int)nr, cols, 1.0f,
                        sp->x, cols, wr, cols, 0.0f, sp->y + r0, rows);
    }
}

/* Rows row0 + [begin, end) of a tile to f32 (a worker pool task). */
static void convert_rows(void *arg, uint32_t thread, uint32_t begin, uint32_t end)
{
    (void)thread;
    const struct convert *cv = arg;
    for (uint32_t r = begin; r < end; r++)
        ty__cpu_row_to_f32(cv->w, cv->row0 + r, cv->out + (size_t)r * cv->w->cols);
}

size_t ty__cpu_matmul_scratch(uint64_t cols)
{
    return cols > TILE_FLOATS_MAX ? cols : TILE_FLOATS_MAX;
}

void ty__cpu_matmul(ty_cpu_pool_t *pool, const struct ty_weight *w, const float *x, float *y,
                    uint32_t T, float *scratch, size_t scratch_floats)
{
    int rows = (int)w->rows, cols = (int)w->cols;
    if (ty__cpu_gemv_supported(w, T) &&
        ty__cpu_gemv(pool, w, x, y, T, scratch, scratch_floats) == 0)
        return; /* else (no memory for Q8_0's quantized inputs) the tile path */
    if (T > TY_CPU_GEMV_MAX_T && T <= TY_CPU_QGEMM_MAX_T && ty__cpu_qgemm_supported(w) &&
        ty__cpu_qgemm(pool, w, x, y, T) == 0)
        return; /* else (no memory for the quantized inputs) the tile path */
    if (TY_CPU_QPANEL && T > TY_CPU_QGEMM_MAX_T && ty__cpu_qpanel_supported(w) &&
        ty__cpu_qpanel(pool, w, x, y, T, scratch, scratch_floats * sizeof(float)) == 0)
        return; /* else (no memory) the tile path */
    /* a small product (a tiny model's decode) stays on the caller: a fork-join costs more */
    if ((uint64_t)rows * (uint64_t)cols * T < TY_CPU_SPLIT_MIN)
        pool = NULL;
    uint32_t nth = pool ? ty__cpu_pool_threads(pool) : 1;
    struct split sp = {.w = w, .x = x, .y = y, .scratch = scratch, .T = T};
    if (w->type == TY_GGML_F32) {
        if (pool)
            ty__cpu_pool_run(pool, (uint32_t)rows, split_task, &sp);
        else
            split_task(&sp, 0, 0, (uint32_t)rows);
        return;
    }
    /* Converted tiles: trade conversion work per call for no resident f32 copy. */
    float *xr = NULL;
    uint32_t ib = ty__cpu_input_block(w->type);
    if (ib && cols % ib == 0 && (xr = malloc((size_t)T * (size_t)cols * sizeof(float)))) {
        ty__cpu_round_inputs(w->type, x, xr, (uint64_t)cols, T);
        sp.x = x = xr;
    }
    size_t tf = (size_t)TILE_FLOATS * (T > 16 ? T / 16 : 1), per = scratch_floats / nth;
    tf = tf < scratch_floats ? tf : scratch_floats;
    if (per >= (size_t)cols) { /* a row per worker at least */
        sp.per_thread = tf < per ? (tf > (size_t)cols ? tf : (size_t)cols) : per;
        if (pool)
            ty__cpu_pool_run(pool, (uint32_t)rows, split_task, &sp);
        else
            split_task(&sp, 0, 0, (uint32_t)rows);
        free(xr);
        return;
    }
    /* scratch too small for a row per worker: the pool converts a tile, then one sgemm */
    int tile = (int)(tf > (size_t)cols ? tf / (size_t)cols : 1);
    for (int r0 = 0; r0 < rows; r0 += tile) {
        int nr = rows - r0 < tile ? rows - r0 : tile;
        struct convert cv = {.w = w, .row0 = (uint64_t)r0, .out = scratch};
        if (pool)
            ty__cpu_pool_run(pool, (uint32_t)nr, convert_rows, &cv);
        else
            convert_rows(&cv, 0, 0, (uint32_t)nr);
        if (T == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, nr, cols, 1.0f, scratch, cols, x, 1, 0.0f,
                        y + r0, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, nr, cols, 1.0f, x, cols,
                        scratch, cols, 0.0f, y + r0, rows);
    }
    free(xr);
}

void ty__cpu_rmsnorm(float *out, const float *x, const float *g, uint32_t n, float eps)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (uint32_t i = 0; i < n; i++)
        out[i] = x[i] * scale * g[i];
}

void ty__cpu_rope(float *x, uint32_t head_dim, uint32_t pos, const struct ty_model *m)
{
    uint32_t half = head_dim / 2;
    float theta = (float)pos;
    for (uint32_t i = 0; i < half; i++) {
        float t = theta / m->rope_div[i], c, s;
        if (m->rope_mix) { /* YaRN */
            t = m->rope_freq_scale * t * (1 - m->rope_mix[i]) + t * m->rope_mix[i];
            c = cosf(t) * m->rope_mscale;
            s = sinf(t) * m->rope_mscale;
        } else {
            c = cosf(t);
            s = sinf(t);
        }
        uint32_t a = m->cfg.rope == TY_ROPE_NEOX ? i : 2 * i;
        uint32_t b = m->cfg.rope == TY_ROPE_NEOX ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
        theta *= m->rope_theta_scale;
    }
}

void ty__cpu_unpermute_heads(float *x, uint32_t n_heads, uint32_t head_dim, float *tmp)
{
    uint32_t half = head_dim / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        /* HF row j*half + i holds what the interleaved layout keeps at 2i + j */
        for (uint32_t i = 0; i < half; i++) {
            tmp[2 * i] = v[i];
            tmp[2 * i + 1] = v[half + i];
        }
        memcpy(v, tmp, head_dim * sizeof(float));
    }
}
