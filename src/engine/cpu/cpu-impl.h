/* CPU backend internals: element conversion, GEMM wrapper, small ops, a worker pool.
 * Every function here is called from the backend's owning thread; ty__cpu_pool_run() fans a
 * range out to the workers and returns when all are done. */
#ifndef TYCHO_ENGINE_CPU_IMPL_H
#define TYCHO_ENGINE_CPU_IMPL_H

#include "backend-impl.h" /* ty__cpu_row_to_f32, shared with the CUDA backend */
#include "model-impl.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The IEEE half -> f32 table (all 65536 values, built once). */
const float *ty__cpu_f16_table(void);

/* AVX2 + FMA + F16C usable on this CPU (probed once). */
bool ty__cpu_have_avx2(void);

/* Rows of IEEE halves <-> f32 (half.c): exact widening; narrowing rounds to nearest even
 * (subnormals kept, overflow to inf, NaN stays NaN), the same bits with or without F16C. */
void ty__cpu_half_to_f32(const uint16_t *x, float *y, size_t n);
void ty__cpu_f32_to_half(const float *x, uint16_t *y, size_t n);
/* One value, the scalar rule (what the rows give without F16C). */
uint16_t ty__cpu_f32_to_half1(float f);
/* Decode attention over f16 K/V rows: q . k, and y += a * v (n elements). With AVX2 the dot's
 * sum runs in eight lanes and four accumulators, so its last bits differ from in-order. */
float ty__cpu_dot_half(const float *q, const uint16_t *k, uint32_t n);
void ty__cpu_axpy_half(float a, const uint16_t *v, float *y, uint32_t n);
/* The same for bfloat16 (f32's top 16 bits): widening is exact; narrowing rounds to nearest
 * even (NaN stays a quiet NaN, overflow rounds to inf), the same bits with or without AVX2. */
void ty__cpu_bf16_to_f32(const uint16_t *x, float *y, size_t n);
void ty__cpu_f32_to_bf16(const float *x, uint16_t *y, size_t n);
uint16_t ty__cpu_f32_to_bf16_1(float f);
float ty__cpu_dot_bf16(const float *q, const uint16_t *k, uint32_t n);
void ty__cpu_axpy_bf16(float a, const uint16_t *v, float *y, uint32_t n);
/* KV page rows of a 16-bit pool dtype (TY_KV_F16 or TY_KV_BF16, enum ty_kv_dtype): the
 * functions above by dtype, for the forward pass. */
void ty__cpu_kv16_to_f32(int dtype, const uint16_t *x, float *y, size_t n);
void ty__cpu_f32_to_kv16(int dtype, const float *x, uint16_t *y, size_t n);
float ty__cpu_dot_kv16(int dtype, const float *q, const uint16_t *k, uint32_t n);
void ty__cpu_axpy_kv16(int dtype, float a, const uint16_t *v, float *y, uint32_t n);

/* MXFP4 (quant.c): the 16 FP4 (E2M1) codes as twice their value (0, 1, 2, 3, 4, 6, 8, 12
 * and negatives: integers, as ggml keeps them), and a block's E8M0 exponent e as the matching
 * scale 2^(e - 128) (half the E8M0 value). */
extern const int8_t ty__mxfp4_values[16];
float ty__mxfp4_scale(uint8_t e);

typedef struct ty_cpu_pool ty_cpu_pool_t;

/* y (T, w->rows) = x (T, w->cols) · w^T. F32 weights go straight to OpenBLAS; F16, BF16 and
 * block-quantized weights with few tokens (decode) through ty__cpu_gemv on `pool` (may be
 * NULL: the calling thread alone); otherwise converted a tile of rows at a time into
 * `scratch` (scratch_floats) for BLAS, block types against inputs rounded as their 8-bit
 * input format (ty__cpu_round_inputs; without memory for them, the f32 inputs); up to
 * TY_CPU_QGEMM_MAX_T tokens the block types ty__cpu_qgemm takes go there instead. */
void ty__cpu_matmul(ty_cpu_pool_t *pool, const struct ty_weight *w, const float *x, float *y,
                    uint32_t T, float *scratch, size_t scratch_floats);
/* Scratch floats ty__cpu_matmul needs for a weight with `cols` inputs. */
size_t ty__cpu_matmul_scratch(uint64_t cols);

/* Few-token matmul read straight from the weights' own type (gemv.c): supported when w and T
 * qualify (F16, BF16, and the block types of tycho/quant.h; 1 <= T <= TY_CPU_GEMV_MAX_T).
 * Block types multiply 8-bit quantized inputs (as llama.cpp does: ty__cpu_quantize_inputs),
 * kept in `scratch` (scratch_floats; allocated when too small or NULL). Returns 0, or
 * TY_ENOMEM with y untouched. */
#define TY_CPU_GEMV_MAX_T 8
bool ty__cpu_gemv_supported(const struct ty_weight *w, uint32_t T);
int ty__cpu_gemv(ty_cpu_pool_t *pool, const struct ty_weight *w, const float *x, float *y,
                 uint32_t T, float *scratch, size_t scratch_floats);

/* Many-token matmul on block-quantized weights (qgemm.c): the inputs quantized once as
 * ty__cpu_gemv quantizes them, rows split over `pool` (may be NULL), a cache- and
 * register-blocked integer kernel; each output bit-identical to what ty__cpu_gemv gives for
 * the same row and input, so a token's result does not depend on its batch. Supported with
 * AVX2 for Q8_0, Q4_K and Q6_K weights, any T. Returns 0, or TY_ENOMEM with y untouched.
 * ty__cpu_matmul takes it for TY_CPU_GEMV_MAX_T < T <= TY_CPU_QGEMM_MAX_T: above that the
 * panels (ty__cpu_qpanel, K-quants) and OpenBLAS's f32 sgemm on converted tiles (Q8_0) are
 * faster, each input load here feeding one multiply (docs/benchmarks.md). A build may set
 * it (-DTY_CPU_QGEMM_MAX_T=...) to measure the GEMM on prefill. */
#ifndef TY_CPU_QGEMM_MAX_T
#define TY_CPU_QGEMM_MAX_T 32
#endif
bool ty__cpu_qgemm_supported(const struct ty_weight *w);
int ty__cpu_qgemm(ty_cpu_pool_t *pool, const struct ty_weight *w, const float *x, float *y,
                  uint32_t T);

/* Prefill's matmul on block-quantized weights (qpanel.c): the inputs quantized once as
 * ty__cpu_gemv quantizes them, rows split over `pool` (may be NULL) in groups of eight, each
 * group unpacked into an interleaved panel (in `scratch` when it has room for one per worker,
 * else allocated) and multiplied with integer madd/maddubs, eight rows per register. The block
 * sums are exact; a token's output does not depend on its batch or the thread count, but may
 * differ in the last bits from ty__cpu_gemv's. Supported with AVX2 for Q8_0, Q4_K and Q6_K.
 * ty__cpu_matmul takes it above TY_CPU_QGEMM_MAX_T tokens. Returns 0, or TY_ENOMEM with y
 * untouched. */
bool ty__cpu_qpanel_supported(const struct ty_weight *w);
int ty__cpu_qpanel(ty_cpu_pool_t *pool, const struct ty_weight *w, const float *x, float *y,
                   uint32_t T, void *scratch, size_t scratch_bytes);

/* ---- block dot products (qdot.c) ---------------------------------------------------------- */

/* The input format a block weight type is multiplied with, as in llama.cpp (its vec_dot_type):
 * Q8_0 (blocks of 32: d = max|x|/127 at f16 precision, q = x * 127/max|x| rounded half to even,
 * ggml's x86 quantize_row_q8_0) for Q8_0 and Q4_0; Q8_K (blocks of 256: the value of largest
 * magnitude maps to -127, d = 1/scale kept in f32, plus the sum of every 16 quants: ggml's
 * quantize_row_q8_K) for Q4_K, Q5_K and Q6_K. Returns the input block size (32 or 256), or 0
 * for a type that is not a block type. */
uint32_t ty__cpu_input_block(uint32_t weight_type);

/* One input row quantized for a block type: q (cols) int8, d (cols / input block) scales,
 * s (cols / 16) sums of 16 quants for Q8_K (NULL for Q8_0). */
struct ty_cpu_qin {
    const int8_t *q;
    const float *d;
    const int16_t *s;
};

/* Quantize n values (a multiple of the input block of weight_type; rows of inputs may be
 * quantized together when each is) into q, d and, for Q8_K, s (as struct ty_cpu_qin). */
void ty__cpu_quantize_inputs(uint32_t weight_type, const float *x, uint64_t n, int8_t *q,
                             float *d, int16_t *s);
/* xr (T, cols) = x as a quantized input has it (the quantization above, widened): what the
 * tile path multiplies block weights with, so that many-token calls agree with few-token
 * ones and with llama.cpp, which quantizes every input of a quantized matmul. cols must be a
 * multiple of the input block. */
void ty__cpu_round_inputs(uint32_t weight_type, const float *x, float *xr, uint64_t cols,
                          uint32_t T);

/* w (nb blocks of one weight row) . x, the block products exact in int32, scaled per block
 * into an f32 sum. Q8_0 rows are gemv.c's own (four inputs per weight load). */
typedef float (*ty_cpu_qdot_fn)(const unsigned char *w, const struct ty_cpu_qin *x,
                                uint64_t nb);
/* The kernel for a Q4_0, Q4_K, Q5_K or Q6_K row: AVX2 (needs ty__cpu_have_avx2()) or the
 * scalar reference; NULL for other types. */
ty_cpu_qdot_fn ty__cpu_qdot_kernel(uint32_t weight_type, bool avx2);

/* Q4_K / Q5_K: the eight 6-bit scales and mins packed in 12 bytes (ggml's get_scale_min_k4):
 * j < 4 in the low 6 bits of bytes j (scale) and j + 4 (min); j >= 4 in the nibbles of byte
 * j + 4 with the top bits in the high 2 bits of bytes j - 4 (scale) and j (min). */
static inline void ty__cpu_k_scales(const unsigned char *s, uint8_t sc[8], uint8_t mn[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (uint8_t)((s[j + 4] & 15) | (s[j - 4] >> 6) << 4);
        mn[j] = (uint8_t)((s[j + 4] >> 4) | (s[j] >> 6) << 4);
    }
}

#if defined(__x86_64__)
#include <immintrin.h>
/* Q6_K: half h (0, 1) of the block at w unpacked to unsigned 6-bit values (0..63), 32 per
 * vector: v[k] byte l = value 128h + 32k + l (low nibbles from ql, bit pairs from qh; the
 * -32 offset is the caller's). For the AVX2 kernels of qdot.c, qgemm.c and qpanel.c. */
__attribute__((target("avx2"))) static inline void ty__cpu_q6_k_unpack(const unsigned char *w,
                                                                     int h, __m256i v[4])
{
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    const unsigned char *ql = w + 64 * h;
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
    __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i hb = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
    v[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
    v[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
    v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
    v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
}

/* The f16 at p (unaligned) as a float, through F16C (for the AVX2 kernels). */
__attribute__((target("f16c"))) static inline float ty__cpu_half_f16c(const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The sum of v's eight lanes (for AVX2 kernels: gemv.c, qdot.c). */
__attribute__((target("avx2"))) static inline float ty__cpu_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#endif

/* out (n) = x (n) / rms(x) * g (n); out may be x */
void ty__cpu_rmsnorm(float *out, const float *x, const float *g, uint32_t n, float eps);
/* Rotate one head vector x (head_dim) at position pos (ggml_rope NORM or NEOX). */
void ty__cpu_rope(float *x, uint32_t head_dim, uint32_t pos, const struct ty_model *m);
/* HF rotate_half row order -> interleaved, in place, for n_heads heads of head_dim. */
void ty__cpu_unpermute_heads(float *x, uint32_t n_heads, uint32_t head_dim, float *tmp);

/* A slice [begin, end) run by worker `thread` (0 = the caller). */
typedef void (*ty_cpu_task_cb)(void *arg, uint32_t thread, uint32_t begin, uint32_t end);
int ty__cpu_pool_new(ty_cpu_pool_t **out, uint32_t n_threads);
void ty__cpu_pool_free(ty_cpu_pool_t *p);
/* Run fn over [0, n) split into contiguous parts, one per thread (the caller takes one). */
void ty__cpu_pool_run(ty_cpu_pool_t *p, uint32_t n, ty_cpu_task_cb fn, void *arg);
/* Threads of the pool, the caller included. */
uint32_t ty__cpu_pool_threads(const ty_cpu_pool_t *p);

/* ---- multi-head latent attention (mla.c), DeepSeek-V2/V3 ---------------------------------- */

/* Scratch floats the two MLA projections need for T tokens. */
size_t ty__cpu_mla_scratch(const struct ty_model_config *c, uint32_t T);
/* From the normed rows xb (T, dim) at positions pos: q (T, n_heads, R + P) the absorbed,
 * roped queries, kv (T, R + P) each token's pool row (normed latent, roped k_pe). */
void ty__cpu_mla_project(ty_cpu_pool_t *pool, const struct ty_model *m,
                         const struct ty_layer_weights *L, const float *xb, uint32_t T,
                         const uint32_t *pos, float *q, float *kv, float *scratch, float *tile,
                         size_t tile_floats);
/* out (T, n_heads * v_head) = each head's attention output over the latent (the first R of
 * att's (T, n_heads, R + P) rows) through v_b. */
void ty__cpu_mla_values(ty_cpu_pool_t *pool, const struct ty_model *m,
                        const struct ty_layer_weights *L, const float *att, uint32_t T,
                        float *out, float *scratch, float *tile, size_t tile_floats);

/* Attention of (token, head) tasks [begin, end) over MLA's split pool rows (mla.c): causal over
 * the token's sequence, scores scaled by cfg.kq_scale, the output's first kv_lora_rank values
 * the weighted latent (the rest left zero). A ty_cpu_task_cb with a struct ty__cpu_mla_attn. */
struct ty__cpu_mla_attn {
    const struct ty_model *m;
    struct ty_kvpool *kv;
    uint32_t layer, B, max_ctx;
    int kvt;                       /* enum ty_kv_dtype of the pool */
    const uint32_t *pos;           /* (T) */
    const uint32_t *const *pages;  /* (T) each token's block table */
    const float *q;                /* (T, n_heads, R + P) */
    float *att;                    /* (T, n_heads, R + P) */
    float *scores;                 /* (n_threads, max_ctx) */
};
void ty__cpu_mla_attn_task(void *arg, uint32_t thread, uint32_t begin, uint32_t end);

#endif
