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

typedef struct ty_cpu_pool ty_cpu_pool_t;

/* y (T, w->rows) = x (T, w->cols) · w^T. F32 weights go straight to OpenBLAS; F16, BF16 and
 * Q8_0 weights with few tokens (decode) through ty__cpu_gemv on `pool` (may be NULL: the
 * calling thread alone); otherwise converted a tile of rows at a time into `scratch`
 * (scratch_floats) for BLAS, Q8_0 against inputs rounded as 8-bit (ty__cpu_q8_0_round_inputs;
 * without memory for them, the f32 inputs). */
void ty__cpu_matmul(ty_cpu_pool_t *pool, const struct ty_weight *w, const float *x, float *y,
                    uint32_t T, float *scratch, size_t scratch_floats);
/* Scratch floats ty__cpu_matmul needs for a weight with `cols` inputs. */
size_t ty__cpu_matmul_scratch(uint64_t cols);

/* Few-token matmul read straight from the weights' own type (gemv.c): supported when w and T
 * qualify (F16, BF16, Q8_0 with cols % 32 == 0; 1 <= T <= TY_CPU_GEMV_MAX_T). Q8_0 multiplies
 * 8-bit quantized inputs (as llama.cpp does), kept in `scratch` (scratch_floats; allocated
 * when too small or NULL). Returns 0, or TY_ENOMEM with y untouched. */
#define TY_CPU_GEMV_MAX_T 8
/* xr (T, cols) = x as a Q8_0 input has it (the quantization above, dequantized): what the tile
 * path multiplies Q8_0 weights with, so that many-token calls agree with few-token ones and
 * with llama.cpp, which quantizes every input of a Q8_0 matmul. cols % 32 == 0. */
void ty__cpu_q8_0_round_inputs(const float *x, float *xr, uint64_t cols, uint32_t T);
bool ty__cpu_gemv_supported(const struct ty_weight *w, uint32_t T);
int ty__cpu_gemv(ty_cpu_pool_t *pool, const struct ty_weight *w, const float *x, float *y,
                 uint32_t T, float *scratch, size_t scratch_floats);

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

#endif
