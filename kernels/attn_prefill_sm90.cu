// Causal prefill attention for Hopper (sm_90a), 16-bit pools (f16, bf16), head_dim 64 or 128:
// the FlashAttention-3 structure (Shah et al. 2024) over paged K/V, in its plain form.
//
// A CTA owns TY_SM90_BM = 128 query rows of one head and has three warpgroups. Warpgroup 0 is
// the producer: it gives registers back (setmaxnreg) and one of its warps walks the K/V tiles
// of TY_SM90_BN = 128 keys, loading each into a TY_SM90_STAGES-deep shared-memory ring with TMA
// (cp.async.bulk.tensor, 4-D tensor maps over the pool: column, slot, kv head, page). A tile is
// a few boxes of min(page, 128) tokens x 64 columns, each box's page looked up in the block
// table (attn_sm90_tiling.h ty_sm90_box_at), so pages need not be contiguous. Every stage has a
// "full" mbarrier (the TMA bytes landed) and an "empty" one (all 8 consumer warps are done).
// Warpgroups 1 and 2 are consumers, 64 rows each, Q fragments in registers (f32 in global,
// rounded to the pool type): S = Q K^T is one wgmma m64n128k16 per 16 columns of head_dim
// (A from registers, K from the swizzled stage), then the mask, the online softmax in the exp2
// domain, and O += P V as wgmma m64n{HD}k16 with P from registers (S's accumulator fragment
// is P's A fragment) and V transposed from shared memory.
//
// Not done (yet): the intra-warpgroup pipelining of FA3 (softmax of tile t overlapping the
// QK^T of tile t + 1) and explicit ping-pong scheduling between the two consumer warpgroups;
// the two only overlap as the warp schedulers interleave them.
//
// The last tile of a CTA may reach past kv_end: boxes wholly past it are not loaded, and the
// producer zeroes the tile's rows from kv_end on before it marks the tile full, so that stale
// shared memory or pool slots (P is exactly 0 there, but 0 * NaN is NaN) never reach O.
//
// Every index (rows, loop bounds, boxes, stage offsets, masks, fragment coordinates) comes from
// attn_sm90_tiling.h, which tests/unit/engine/test_attn_sm90_tiling.c runs as a plain-C model.
// The kernel has been compiled, never run: see docs/arch/cuda.md.
#include "attn_prefill_sm90.cuh"
#include "attn_prefill_tune.h"
#include "attn_sm90_tiling.h"
#include "mma_common.cuh"

#include <cuda.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TY_SM90_BODY 1
#else
#define TY_SM90_BODY 0
#endif

namespace
{

struct sm90_args {
    float *out;
    const float *q;
    const int32_t *tables, *q_starts, *q_lens, *kv_lens;
    int n_heads, n_kv, page_tokens, max_pages;
    float scale_log2; // softmax scale * log2(e)
};

// Shared memory: K stages, V stages (each ty_sm90_tile_bytes), then the mbarriers.
template <int HD> struct sm90_smem {
    enum : uint32_t {
        kTile = TY_SM90_BN * HD * 2,
        kK = 0,
        kV = TY_SM90_STAGES * kTile,
        kBar = 2 * TY_SM90_STAGES * kTile, // full[], empty[], tail
    };
    static constexpr size_t bytes()
    {
        return kBar + 8 * (2 * TY_SM90_STAGES + 1) + 1024;
    }
};

#if TY_SM90_BODY
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n"
                 ".reg .pred ready;\n"
                 "TY_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 ready, [%0], %1;\n"
                 "@!ready bra TY_WAIT;\n"
                 "}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
// One TMA box into shared memory at dst, completing `bar`'s transaction bytes.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                            const ty_sm90_box &b)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(b.col), "r"(b.slot), "r"(b.kv_head),
                 "r"(b.page), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all()
{
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator accesses across the asynchronous wgmma.
template <int N> __device__ __forceinline__ void fence_regs(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x N f32, scale_d ? d + : ) = A (64 x 16, registers) * B (16 x N, shared memory
// descriptor; TNSP: B is stored N-contiguous).
template <typename T, int N, int TNSP>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc,
                                         int scale_d);
template <>
__device__ __forceinline__ void
wgmma_rs<__nv_bfloat16, 128, 0>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
                 "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
                 "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
                 "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
                 "%60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                   "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wgmma_rs<__half, 128, 0>(float (&d)[64], const uint32_t (&a)[4],
                                                         uint64_t desc, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
                 "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
                 "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
                 "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
                 "%60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                   "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

template <>
__device__ __forceinline__ void
wgmma_rs<__nv_bfloat16, 64, 1>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
                 "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
                 "%24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wgmma_rs<__half, 64, 1>(float (&d)[32], const uint32_t (&a)[4],
                                                        uint64_t desc, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
                 "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
                 "%24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

template <>
__device__ __forceinline__ void
wgmma_rs<__nv_bfloat16, 128, 1>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
                 "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
                 "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
                 "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
                 "%60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                   "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wgmma_rs<__half, 128, 1>(float (&d)[64], const uint32_t (&a)[4],
                                                         uint64_t desc, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
                 "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
                 "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
                 "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
                 "%60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                   "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// The producer warp: loads tiles [0, n_tiles) of kv head kh through the chunk's table row.
template <int HD>
__device__ void sm90_produce(const CUtensorMap *tk, const CUtensorMap *tv, uint32_t base,
                             const int32_t *table, int kh, int page_tokens, int kv_end, int n_tiles)
{
    using L = sm90_smem<HD>;
    const int lane = threadIdx.x & 31, box_rows = ty_sm90_box_rows(page_tokens);
    const uint32_t full0 = base + L::kBar, empty0 = full0 + 8 * TY_SM90_STAGES,
                   tail = empty0 + 8 * TY_SM90_STAGES;
    for (int t = 0; t < n_tiles; t++) {
        const int s = ty_sm90_stage(t);
        mbar_wait(empty0 + 8 * s, ty_sm90_phase(t) ^ 1u);
        const int r0 = ty_sm90_tail_row(t, kv_end);
        const bool partial = r0 < TY_SM90_BN;
        const uint32_t bar = partial ? tail : full0 + 8 * s;
        const uint32_t ks = base + L::kK + s * L::kTile, vs = base + L::kV + s * L::kTile;
        if (lane == 0) {
            const int n_boxes = ty_sm90_tile_boxes(t, box_rows, kv_end);
            mbar_expect_tx(bar, ty_sm90_tx_bytes(n_boxes, box_rows, HD));
            for (int j = 0; j < n_boxes; j++) {
                const int key = ty_sm90_box_key(t, j, box_rows);
                for (int c = 0; c < HD / TY_SM90_COLS; c++) {
                    const ty_sm90_box b =
                        ty_sm90_box_at(table, key, page_tokens, c * TY_SM90_COLS, kh);
                    const uint32_t off = ty_sm90_smem_off(c, j * box_rows);
                    tma_load_4d(ks + off, tk, bar, b);
                    tma_load_4d(vs + off, tv, bar, b);
                }
            }
        }
        if (partial) { // the CTA's last tile (once): zero its rows from kv_end, then mark it full
            mbar_wait(tail, 0);
            const int n16 = (TY_SM90_BN - r0) * 8; // 16-byte pieces per 64-column plane
            for (int c = 0; c < HD / TY_SM90_COLS; c++)
                for (int i = lane; i < n16; i += 32) {
                    const uint32_t off = ty_sm90_smem_off(c, r0) + 16u * i;
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(ks + off),
                                 "r"(0u)
                                 : "memory");
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(vs + off),
                                 "r"(0u)
                                 : "memory");
                }
            // generic-proxy writes, read next by wgmma (async proxy)
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncwarp();
            if (lane == 0)
                mbar_arrive(full0 + 8 * s);
        }
    }
}

// One consumer warpgroup (cw = 0, 1): rows [row0 + 64 cw, + 64) of the CTA.
template <typename T, int HD>
__device__ void sm90_consume(const sm90_args &a, uint32_t base, int cw, int h, int chunk, int row0,
                             int rows, int q_off, int kv_end, int n_tiles)
{
    using L = sm90_smem<HD>;
    constexpr int BN = TY_SM90_BN;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x & 31;
    const uint32_t full0 = base + L::kBar, empty0 = full0 + 8 * TY_SM90_STAGES;
    const int wrow0 = cw * TY_SM90_WG_ROWS; // first row of this warpgroup in the CTA
    const int wrows = ty_sm90_rows(wrow0, TY_SM90_WG_ROWS, rows);
    const int w_tiles =
        ty_sm90_n_tiles(ty_sm90_kv_end(q_off, row0 + wrow0, wrows, a.kv_lens[chunk]));
    const size_t grow0 = (size_t)a.q_starts[chunk] + row0 + wrow0; // global row of row 0

    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = ty_sm90_a_row(warp, lane, i), c = ty_sm90_a_col(lane, kk, i, 0);
            float2 v = make_float2(0.0f, 0.0f);
            if (r < wrows)
                v = *(const float2 *)(a.q + ((grow0 + r) * a.n_heads + h) * HD + c);
            qf[kk][i] = ty::pack2<T>(v.x, v.y);
        }

    float o[HD / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < HD / 2; i++)
        o[i] = 0.0f;
    const int warp_min_pos = q_off + row0 + wrow0 + warp * 16;

    for (int t = 0; t < w_tiles; t++) {
        const int s = ty_sm90_stage(t);
        const uint32_t ks = base + L::kK + s * L::kTile, vs = base + L::kV + s * L::kTile;
        mbar_wait(full0 + 8 * s, ty_sm90_phase(t));

        float sc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++)
            sc[i] = 0.0f; // overwritten (scale-d 0 at the first k-step); keeps sc defined
        fence_regs(sc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_rs<T, BN, 0>(sc, qf[kk],
                               ty_sm90_desc(ks + ty_sm90_k_step_off(kk), 16, TY_SM90_SBO), kk > 0);
        wgmma_commit();
        wgmma_wait_all();
        fence_regs(sc);

        if (ty_sm90_tile_masked(t, warp_min_pos, kv_end)) {
#pragma unroll
            for (int i = 0; i < BN / 2; i++) {
                const int qpos = q_off + row0 + wrow0 + ty_sm90_acc_row(warp, lane, i);
                if (!ty_sm90_visible(qpos, t * BN + ty_sm90_acc_col(lane, i), kv_end))
                    sc[i] = -INFINITY;
            }
        }

        // Online softmax of rows g (hf 0) and g + 8 (hf 1); a row's 4 lanes share its max.
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < BN / 2; i++)
                if (((i >> 1) & 1) == hf)
                    mx = fmaxf(mx, sc[i]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m[hf], mx * a.scale_log2);
            const float sub = mn == -INFINITY ? 0.0f : mn; // nothing visible yet: no NaN
            const float alpha = fast_exp2(m[hf] - sub);
            m[hf] = mn;
            float rs = 0.0f;
#pragma unroll
            for (int i = 0; i < BN / 2; i++)
                if (((i >> 1) & 1) == hf) {
                    sc[i] = fast_exp2(fmaf(sc[i], a.scale_log2, -sub));
                    rs += sc[i];
                }
            l[hf] = l[hf] * alpha + rs;
#pragma unroll
            for (int i = 0; i < HD / 2; i++)
                if (((i >> 1) & 1) == hf)
                    o[i] *= alpha;
        }

        uint32_t pf[BN / 16][4];
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                pf[kk][i] = ty::pack2<T>(sc[ty_sm90_p_src(kk, i, 0)], sc[ty_sm90_p_src(kk, i, 1)]);
        fence_regs(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wgmma_rs<T, HD, 1>(
                o, pf[kk], ty_sm90_desc(vs + ty_sm90_v_step_off(kk), TY_SM90_V_LBO, TY_SM90_SBO),
                1);
        wgmma_commit();
        wgmma_wait_all();
        fence_regs(o);
        __syncwarp();
        if (lane == 0)
            mbar_arrive(empty0 + 8 * s);
    }
    // Tiles the CTA loads but this warpgroup's rows never see: hand them back unread.
    for (int t = w_tiles; t < n_tiles; t++) {
        mbar_wait(full0 + 8 * ty_sm90_stage(t), ty_sm90_phase(t));
        __syncwarp();
        if (lane == 0)
            mbar_arrive(empty0 + 8 * ty_sm90_stage(t));
    }

#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float lv = l[hf];
        lv += __shfl_xor_sync(0xffffffffu, lv, 1);
        lv += __shfl_xor_sync(0xffffffffu, lv, 2);
        const float inv = lv > 0.0f ? 1.0f / lv : 0.0f;
        const int r = ty_sm90_acc_row(warp, lane, 2 * hf);
        if (r >= wrows)
            continue;
        float *op = a.out + ((grow0 + r) * a.n_heads + h) * HD;
#pragma unroll
        for (int i = 0; i < HD / 2; i += 4)
            *(float2 *)(op + ty_sm90_acc_col(lane, i + 2 * hf)) =
                make_float2(o[i + 2 * hf] * inv, o[i + 2 * hf + 1] * inv);
    }
}
#endif // TY_SM90_BODY

template <typename T, int HD>
__global__ void __launch_bounds__(TY_SM90_THREADS, 1)
    prefill_sm90_kernel(const __grid_constant__ CUtensorMap tk,
                        const __grid_constant__ CUtensorMap tv, const sm90_args a)
{
#if TY_SM90_BODY
    using L = sm90_smem<HD>;
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t base = (ty::smem_addr(smem_raw) + 1023u) & ~1023u; // 128B swizzle atoms
    const int h = blockIdx.y, chunk = blockIdx.z;
    const int q_len = a.q_lens[chunk], kv_len = a.kv_lens[chunk];
    const int row0 = ty_sm90_cta_row0(blockIdx.x, gridDim.x);
    const int rows = ty_sm90_rows(row0, TY_SM90_BM, q_len);
    if (rows == 0)
        return;
    const int q_off = ty_sm90_q_off(q_len, kv_len);
    const int kv_end = ty_sm90_kv_end(q_off, row0, rows, kv_len);
    const int n_tiles = ty_sm90_n_tiles(kv_end);
    const uint32_t full0 = base + L::kBar, empty0 = full0 + 8 * TY_SM90_STAGES;
    if (threadIdx.x == 0) {
        for (int s = 0; s < TY_SM90_STAGES; s++) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, 4 * TY_SM90_CONSUMERS);
        }
        mbar_init(empty0 + 8 * TY_SM90_STAGES, 1); // tail
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (threadIdx.x < 32)
            sm90_produce<HD>(&tk, &tv, base, a.tables + (size_t)chunk * a.max_pages,
                             h / (a.n_heads / a.n_kv), a.page_tokens, kv_end, n_tiles);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    sm90_consume<T, HD>(a, base, wg - 1, h, chunk, row0, rows, q_off, kv_end, n_tiles);
#else
    __trap(); // never launched: ty__attn_prefill_sm90_applies is false off sm_90a
#endif
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda); NULL if absent.
typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

encode_tiled_fn encode_fn()
{
    static encode_tiled_fn fn = NULL;
    static bool tried = false;
    if (!tried) {
        tried = true;
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (encode_tiled_fn)p;
    }
    return fn;
}

// A 4-D map over one pool array (column, slot, kv head, page), boxes of 64 columns x box_rows
// slots, 128B swizzle (what the wgmma descriptors of the kernel expect).
int make_map(CUtensorMap *map, const void *pool, const ty_cuda_kv_layout *l)
{
    encode_tiled_fn fn = encode_fn();
    if (!fn)
        return TY_ECUDA;
    const int hd = l->head_dim, pt = l->page_tokens;
    const cuuint64_t dims[4] = {(cuuint64_t)hd, (cuuint64_t)pt, (cuuint64_t)l->n_kv_heads,
                                (cuuint64_t)l->n_pages};
    const cuuint64_t strides[3] = {(cuuint64_t)hd * 2, (cuuint64_t)pt * hd * 2,
                                   (cuuint64_t)l->n_kv_heads * pt * hd * 2};
    const cuuint32_t box[4] = {TY_SM90_COLS, (cuuint32_t)ty_sm90_box_rows(pt), 1, 1};
    const cuuint32_t estr[4] = {1, 1, 1, 1};
    CUresult r = fn(map,
                    l->type == TY_CUDA_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                           : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                    4, (void *)pool, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                    CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        TY_LOG_ERROR("cuda", "cuTensorMapEncodeTiled failed (%d) for the prefill KV pool", (int)r);
        return TY_ECUDA;
    }
    return 0;
}

template <typename T, int HD>
int sm90_launch(const CUtensorMap &tk, const CUtensorMap &tv, const sm90_args &a, int n_chunks,
                int max_q_len, cudaStream_t st)
{
    const size_t smem = sm90_smem<HD>::bytes();
    if (cudaFuncSetAttribute(prefill_sm90_kernel<T, HD>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return TY_CUDA_LAUNCH_CHECK("attn_prefill_sm90 smem attribute");
    dim3 grid((max_q_len + TY_SM90_BM - 1) / TY_SM90_BM, a.n_heads, n_chunks);
    prefill_sm90_kernel<T, HD><<<grid, TY_SM90_THREADS, smem, st>>>(tk, tv, a);
    return TY_CUDA_LAUNCH_CHECK("attn_prefill_sm90");
}

// ty__attn_prefill_sm90_set_enabled's setting; -1: the environment decides. The kernel has
// never run on hardware, so a server takes it only when asked (TYCHO_CUDA_SM90_PREFILL=1);
// tests and benchmarks turn it on through the hook.
int g_enabled = -1;

bool enabled()
{
    if (g_enabled < 0) {
        const char *env = getenv("TYCHO_CUDA_SM90_PREFILL");
        g_enabled = env && !strcmp(env, "1");
    }
    return g_enabled != 0;
}

// Whether device `dev` can run the kernel: compute capability 9.0 and sm_90 code for the
// kernel in this binary (a build without 90a would only have the trapping stub).
bool device_ok_uncached(int dev)
{
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return false;
    if (major != 9 || minor != 0)
        return false;
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, prefill_sm90_kernel<__nv_bfloat16, 128>) != cudaSuccess)
        return false;
    return fa.binaryVersion == 90 && encode_fn() != NULL;
}

// device_ok_uncached of the current device, asked once per device (ints: a race only asks
// twice).
bool device_ok()
{
    static signed char known[64]; // 0 unknown, 1 yes, -1 no
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return false;
    if (dev < 0 || dev >= 64)
        return device_ok_uncached(dev);
    if (!known[dev])
        known[dev] = device_ok_uncached(dev) ? 1 : -1;
    return known[dev] > 0;
}

} // namespace

extern "C" int ty__attn_prefill_sm90_set_enabled(int on)
{
    const int was = enabled();
    g_enabled = on != 0;
    return was;
}

extern "C" int ty__attn_prefill_sm90_available(void)
{
    return device_ok();
}

bool ty__attn_prefill_sm90_applies(const ty_cuda_kv_layout *l, const ty_cuda_attn_shape *s)
{
    return enabled() &&
           ty_sm90_shape_ok(l->type == TY_CUDA_F16 || l->type == TY_CUDA_BF16, s->head_dim,
                            l->page_tokens, s->window) &&
           device_ok();
}

int ty__attn_prefill_sm90(float *out, const float *q, const void *k_pool, const void *v_pool,
                          const ty_cuda_kv_layout *l, const ty_cuda_attn_shape *s,
                          const int32_t *block_tables, const int32_t *q_starts,
                          const int32_t *q_lens, const int32_t *kv_lens, int n_chunks,
                          int max_q_len, cudaStream_t st)
{
    CUtensorMap tk, tv;
    int rc = make_map(&tk, k_pool, l);
    if (!rc)
        rc = make_map(&tv, v_pool, l);
    if (rc)
        return rc;
    sm90_args a;
    a.out = out;
    a.q = q;
    a.tables = block_tables;
    a.q_starts = q_starts;
    a.q_lens = q_lens;
    a.kv_lens = kv_lens;
    a.n_heads = s->n_heads;
    a.n_kv = s->n_kv_heads;
    a.page_tokens = l->page_tokens;
    a.max_pages = s->max_pages;
    a.scale_log2 = s->scale * 1.4426950408889634f;
    const bool f16 = l->type == TY_CUDA_F16;
    if (s->head_dim == 64)
        return f16 ? sm90_launch<__half, 64>(tk, tv, a, n_chunks, max_q_len, st)
                   : sm90_launch<__nv_bfloat16, 64>(tk, tv, a, n_chunks, max_q_len, st);
    return f16 ? sm90_launch<__half, 128>(tk, tv, a, n_chunks, max_q_len, st)
               : sm90_launch<__nv_bfloat16, 128>(tk, tv, a, n_chunks, max_q_len, st);
}
