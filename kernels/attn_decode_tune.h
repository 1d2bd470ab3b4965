/* Benchmark-only hook of the paged decode attention (attn_decode.cu): selects the variant of the
 * head_dim 64/128 fast path and the split plan that ty_cuda_attn_decode and
 * ty_cuda_attn_decode_workspace use from then on (both read it, so set it before sizing the
 * workspace), so that bench_gpu_attn decode-sweep can time the variants against each other in
 * one run. Not thread-safe; not for serving code. */
#ifndef TYCHO_ATTN_DECODE_TUNE_H
#define TYCHO_ATTN_DECODE_TUNE_H

#ifdef __cplusplus
extern "C" {
#endif

enum ty__decode_variant {
    TY__DECODE_DEFAULT = 0, /* the variant the library uses when nothing is set */
    TY__DECODE_BASE,        /* 4 warps, 8 lanes per token row, 16 tokens per iteration (16-bit) */
    TY__DECODE_U2,          /* BASE with 8 tokens per iteration: fewer registers, more blocks/SM */
    TY__DECODE_G2,          /* U2 with at most 2 query heads per block (GQA 4: 2 blocks per KV
                             * head, which read K/V twice, the second time mostly from L2) */
    TY__DECODE_NOPF,        /* BASE without the L2::256B prefetch qualifier on the K/V loads */
    TY__DECODE_TC,          /* tensor cores (mma.sync) for Q K^T and P V; 16-bit pools only,
                             * f32 pools run BASE */
    TY__DECODE_TCS,         /* TC with Q's fragments in shared memory instead of registers:
                             * 4 blocks per SM instead of 3 (head_dim 128) */
    TY__DECODE_N_VARIANTS
};

/* split_factor value: instead of a block count target, the split count (up to the one that
 * min_split allows) whose grid fills whole waves of blocks-per-SM x SMs best. */
#define TY__DECODE_SPLIT_FIT (-1)

struct ty__decode_tune {
    int variant;      /* enum ty__decode_variant; 0: the default variant */
    int split_factor; /* splits aim at split_factor * SMs blocks in all (0: 4, the plan before
                       * the variants existed), or TY__DECODE_SPLIT_FIT */
    int min_split;    /* fewest tokens per split; 0: 256 */
};

/* NULL restores the defaults (which need not be the 0 fields: see ty__attn_decode_get_tune).
 * Returns 0, or TY_EINVAL for an unknown variant or an out-of-range field (split_factor
 * TY__DECODE_SPLIT_FIT or 0..64, min_split 0 or 16..65536). */
int ty__attn_decode_set_tune(const struct ty__decode_tune *t);

/* The settings in use, 0 fields resolved (after set_tune(NULL): the library defaults). */
void ty__attn_decode_get_tune(struct ty__decode_tune *t);

/* Short name of a variant ("base", "u2", ...; TY__DECODE_DEFAULT gives the name of the variant
 * it stands for), or NULL when out of range. */
const char *ty__attn_decode_variant_name(int variant);

#ifdef __cplusplus
}
#endif

#endif
