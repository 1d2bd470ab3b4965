/* Index arithmetic of the Hopper prefill attention kernel (attn_prefill_sm90.cu), shared with
 * its plain-C model (tests/unit/engine/test_attn_sm90_tiling.c): which query rows a CTA and a
 * consumer warpgroup own, which K/V tiles they visit (loop bounds), where a tile's tokens live
 * in the paged pool (page table -> TMA box coordinates), where a box lands in a shared-memory
 * stage, which scores are masked, and which accumulator element a thread's register holds.
 * Everything is `static inline` on ints, with no CUDA types, so that C includes it too.
 *
 * Shapes: a CTA owns TY_SM90_BM query rows of one head, split between TY_SM90_CONSUMERS
 * warpgroups of TY_SM90_WG_ROWS rows (one wgmma m64 tile each). K/V tiles are TY_SM90_BN keys.
 * Pool layout (kv.cu): element (page, kv_head, slot, d) at ((page * n_kv + kv_head) *
 * page_tokens + slot) * head_dim + d. A tile is loaded as boxes of ty_sm90_box_rows() tokens by
 * 64 columns (128 bytes, the 128B swizzle width); a box never crosses a page. */
#ifndef TYCHO_ATTN_SM90_TILING_H
#define TYCHO_ATTN_SM90_TILING_H

#include <stdbool.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define TY_SM90_HD __host__ __device__
#else
#define TY_SM90_HD
#endif

enum {
    TY_SM90_WG_ROWS = 64,                             /* rows of one consumer warpgroup */
    TY_SM90_CONSUMERS = 2,                            /* consumer warpgroups per CTA */
    TY_SM90_BM = TY_SM90_WG_ROWS * TY_SM90_CONSUMERS, /* query rows per CTA */
    TY_SM90_BN = 128,                                 /* keys per K/V tile */
    TY_SM90_STAGES = 2,                               /* K/V tiles in flight */
    TY_SM90_COLS = 64,                                /* columns per box (128 bytes, 16-bit) */
    TY_SM90_THREADS = 128 * (TY_SM90_CONSUMERS + 1),  /* + one producer warpgroup */
};

/* True for the shapes the kernel handles: 16-bit pools, head_dim 64 or 128, no sliding window,
 * and pages whose size is a multiple of 8 tokens that divides the tile or is divided by it (a
 * box is min(page, tile) rows, a whole number of 8-row swizzle atoms). */
static inline TY_SM90_HD bool ty_sm90_shape_ok(bool is_16bit, int head_dim, int page_tokens,
                                               int window)
{
    if (!is_16bit || window != 0 || (head_dim != 64 && head_dim != 128))
        return false;
    if (page_tokens <= 0 || page_tokens % 8 != 0)
        return false;
    return page_tokens >= TY_SM90_BN ? page_tokens % TY_SM90_BN == 0
                                     : TY_SM90_BN % page_tokens == 0;
}

/* Tokens per TMA box: a tile's keys come in TY_SM90_BN / box_rows boxes (per 64 columns). */
static inline TY_SM90_HD int ty_sm90_box_rows(int page_tokens)
{
    return page_tokens < TY_SM90_BN ? page_tokens : TY_SM90_BN;
}

/* First query row of CTA bx of a grid of nbx along x: the last row tiles (the longest causal
 * walks) are scheduled first. */
static inline TY_SM90_HD int ty_sm90_cta_row0(int bx, int nbx)
{
    return (nbx - 1 - bx) * TY_SM90_BM;
}

/* Query rows of [row0, row0 + cap) that exist in a chunk of q_len rows (0 if none). */
static inline TY_SM90_HD int ty_sm90_rows(int row0, int cap, int q_len)
{
    int r = q_len - row0;
    return r <= 0 ? 0 : r < cap ? r : cap;
}

/* Position of query row 0 of a chunk: its cached prefix (q_off); row i is at q_off + i. */
static inline TY_SM90_HD int ty_sm90_q_off(int q_len, int kv_len)
{
    return kv_len - q_len;
}

/* Keys [0, kv_end) that rows [row0, row0 + n_rows) see, causally; 0 when n_rows is 0. */
static inline TY_SM90_HD int ty_sm90_kv_end(int q_off, int row0, int n_rows, int kv_len)
{
    if (n_rows <= 0)
        return 0;
    int e = q_off + row0 + n_rows;
    return e < kv_len ? e : kv_len;
}

/* K/V tiles that cover keys [0, kv_end): the loop bound. */
static inline TY_SM90_HD int ty_sm90_n_tiles(int kv_end)
{
    return (kv_end + TY_SM90_BN - 1) / TY_SM90_BN;
}

/* Ring slot of tile t and the parity of its use of that slot (mbarrier phase). */
static inline TY_SM90_HD int ty_sm90_stage(int t)
{
    return t % TY_SM90_STAGES;
}
static inline TY_SM90_HD uint32_t ty_sm90_phase(int t)
{
    return (uint32_t)(t / TY_SM90_STAGES) & 1u;
}

/* Box j of tile t: its first key, and whether it holds any key below kv_end (boxes wholly
 * past it are not loaded: their page-table entries may not exist). */
static inline TY_SM90_HD int ty_sm90_box_key(int t, int j, int box_rows)
{
    return t * TY_SM90_BN + j * box_rows;
}

/* Boxes of tile t that are loaded (those starting below kv_end), and the bytes they bring
 * into the stage, K and V together (the producer's expect_tx count). */
static inline TY_SM90_HD int ty_sm90_tile_boxes(int t, int box_rows, int kv_end)
{
    int n = 0;
    while (n < TY_SM90_BN / box_rows && ty_sm90_box_key(t, n, box_rows) < kv_end)
        n++;
    return n;
}
static inline TY_SM90_HD uint32_t ty_sm90_tx_bytes(int n_boxes, int box_rows, int head_dim)
{
    return 2u * (uint32_t)n_boxes * (uint32_t)box_rows * 128u * (uint32_t)(head_dim / TY_SM90_COLS);
}

/* First row of tile t at or past kv_end (TY_SM90_BN if none): the producer zeroes rows from
 * there on before the tile is marked full. */
static inline TY_SM90_HD int ty_sm90_tail_row(int t, int kv_end)
{
    int r = kv_end - t * TY_SM90_BN;
    return r >= TY_SM90_BN ? TY_SM90_BN : r;
}

/* TMA coordinates (innermost first: column, slot, kv head, page) of the box starting at key
 * `key` and column `col0`, through the chunk's row of the page table. */
struct ty_sm90_box {
    int col, slot, kv_head, page;
};
static inline TY_SM90_HD struct ty_sm90_box ty_sm90_box_at(const int32_t *table, int key,
                                                           int page_tokens, int col0, int kh)
{
    struct ty_sm90_box b;
    b.col = col0;
    b.slot = key % page_tokens;
    b.kv_head = kh;
    b.page = table[key / page_tokens];
    return b;
}

/* Byte offset, inside one stage's K (or V) tile, of the 128-byte row holding key row r
 * (0 <= r < TY_SM90_BN) of 64-column chunk c: chunks are planes of TY_SM90_BN rows, so a box
 * of rows [r0, r0 + box_rows) of chunk c lands at ty_sm90_smem_off(c, r0), 1024-byte aligned
 * when r0 is a multiple of 8 (the 128B swizzle atom). Within the row the TMA permutes the
 * 16-byte pieces: piece p of row r is stored at piece p ^ (r % 8). */
static inline TY_SM90_HD uint32_t ty_sm90_smem_off(int c, int r)
{
    return (uint32_t)c * TY_SM90_BN * 128u + (uint32_t)r * 128u;
}
static inline TY_SM90_HD uint32_t ty_sm90_swizzle(uint32_t off)
{
    return off ^ (((off >> 7) & 7u) << 4);
}
static inline TY_SM90_HD uint32_t ty_sm90_tile_bytes(int head_dim)
{
    return (uint32_t)TY_SM90_BN * (uint32_t)head_dim * 2u;
}

/* The causal mask: key `key` is visible to the query at position qpos of a chunk whose keys
 * end at kv_end. */
static inline TY_SM90_HD bool ty_sm90_visible(int qpos, int key, int kv_end)
{
    return key <= qpos && key < kv_end;
}

/* Whether tile t needs the mask at all for rows whose smallest position is min_qpos: some
 * key of it lies past a row's position or past kv_end. */
static inline TY_SM90_HD bool ty_sm90_tile_masked(int t, int min_qpos, int kv_end)
{
    int last = t * TY_SM90_BN + TY_SM90_BN - 1;
    return last > min_qpos || last >= kv_end;
}

/* wgmma m64nN f32 accumulator fragment: register i of lane `lane` in warp `warp` (0-3) of a
 * warpgroup holds row ty_sm90_acc_row, column ty_sm90_acc_col of the 64 x N tile. */
static inline TY_SM90_HD int ty_sm90_acc_row(int warp, int lane, int i)
{
    return warp * 16 + lane / 4 + 8 * ((i >> 1) & 1);
}
static inline TY_SM90_HD int ty_sm90_acc_col(int lane, int i)
{
    return (i >> 2) * 8 + 2 * (lane % 4) + (i & 1);
}

/* wgmma A fragment (64 x 16, from registers): half h (0, 1) of register i (0-3) of a lane of
 * warp `warp` holds row ty_sm90_a_row, column ty_sm90_a_col of k-step kk. */
static inline TY_SM90_HD int ty_sm90_a_row(int warp, int lane, int i)
{
    return warp * 16 + lane / 4 + 8 * (i & 1);
}
static inline TY_SM90_HD int ty_sm90_a_col(int lane, int kk, int i, int h)
{
    return kk * 16 + 8 * (i >> 1) + 2 * (lane % 4) + h;
}

/* P as the A operand of O += P V: half h of register i for k-step kk is accumulator register
 * ty_sm90_p_src of S (the same row and column: S's C fragment is P's A fragment). */
static inline TY_SM90_HD int ty_sm90_p_src(int kk, int i, int h)
{
    return 4 * (2 * kk + (i >> 1)) + 2 * (i & 1) + h;
}

/* wgmma shared-memory matrix descriptor (PTX ISA, "matrix descriptor"): start address, leading
 * and stride byte offsets (all >> 4, 14 bits each), swizzle mode in bits 62-63 (1 = 128B). */
static inline TY_SM90_HD uint64_t ty_sm90_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((smem_addr >> 4) & 0x3fffu) | (uint64_t)((lbo >> 4) & 0x3fffu) << 16 |
           (uint64_t)((sbo >> 4) & 0x3fffu) << 32 | (uint64_t)1 << 62;
}

/* Where k-step kk (16 wide) of each GEMM starts inside a stage's tile, in bytes:
 * S = Q K^T reads K K-major (head_dim contiguous): step kk is 32 bytes into 64-column chunk
 * kk / 4 (the hardware applies the swizzle to the computed addresses; rows 8 apart are 1024
 * bytes apart = SBO). O += P V reads V MN-major (head_dim contiguous, transposed): step kk is
 * keys 16 kk.. = two 8-row groups of 1024 bytes; 64-column chunks are a plane (LBO) apart. */
static inline TY_SM90_HD uint32_t ty_sm90_k_step_off(int kk)
{
    return ty_sm90_smem_off(kk / 4, 0) + (uint32_t)(kk % 4) * 32u;
}
static inline TY_SM90_HD uint32_t ty_sm90_v_step_off(int kk)
{
    return (uint32_t)kk * 2048u;
}
enum {
    TY_SM90_SBO = 1024,               /* 8 rows of 128 bytes */
    TY_SM90_V_LBO = TY_SM90_BN * 128, /* one 64-column plane */
};

#endif
