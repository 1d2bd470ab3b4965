/* ggml's block quantization formats on the host: rows of f32 quantized into blocks (weights,
 * the way ggml's reference quantizers work: what `tycho mkmodel` writes) and rows of blocks
 * widened back to f32 (what the CPU backend's tile path, its embedding lookup and the CUDA
 * upload read). Layouts are ggml-common.h's block_q8_0, block_q4_0, block_q4_K, block_q5_K,
 * block_q6_K and block_mxfp4 (sizes in gguf.c's type table). Pure functions of their arguments: any thread,
 * nothing kept, the caller owns every buffer. */
#ifndef TYCHO_QUANT_H
#define TYCHO_QUANT_H

#include <stdbool.h>
#include <stdint.h>

/* Whether `type` is one of the block types above (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, MXFP4). */
bool ty_quant_is_block(uint32_t type);

/* n values of x (n a multiple of ty_ggml_type_block(type)) into ty_ggml_type_nbytes(type, n)
 * bytes at out. Scales are chosen from each block's range (absmax for Q8_0/Q4_0/Q6_K, its
 * power of two for MXFP4, min/max for the "type-1" Q4_K/Q5_K), then the values rounded to the
 * nearest level; finite
 * inputs only. Returns 0, or TY_EINVAL for another type or a bad n. */
int ty_quant_row_quantize(uint32_t type, const float *x, void *out, uint64_t n);

/* n values from ty_ggml_type_nbytes(type, n) bytes of blocks at in, widened to f32 at out
 * (every byte pattern is a valid block). Returns 0, or TY_EINVAL for another type or a bad n. */
int ty_quant_row_dequantize(uint32_t type, const void *in, float *out, uint64_t n);

#endif
