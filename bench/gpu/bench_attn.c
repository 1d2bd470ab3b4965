/* GPU attention benchmarks (issue 7 item 4).
 * decode: paged decode attention at batch 64 with 4k-token contexts (llama-3-8B heads: 32 query,
 * 8 KV, head_dim 128, bf16 pool, 64-token pages in shuffled order); achieved read bandwidth is
 * compared with a device-to-device cudaMemcpy of the same bytes in the same run (copy bandwidth
 * counted as read + write, as bandwidthTest does).
 * prefill: causal prefill attention, 4 sequences x 1024, 2048 and 4096 tokens, same heads (the
 * 16-bit pool takes the tensor-core path); TFLOP/s counted as
 * 4 * n_heads * L^2 * head_dim / 2 * 2 per sequence (causal half of QK^T and PV), the same
 * formula bench/gpu/sdpa_ref.py uses for PyTorch's scaled_dot_product_attention. On an sm_90
 * device that is the Hopper kernel (attn_prefill_sm90.cu, turned on here: servers take it only
 * with TYCHO_CUDA_SM90_PREFILL=1); `prefill` then also times the
 * mma.sync kernel (attn_prefill_tc.cu) on the same inputs at 4 x 2k, 1 x 16k and 8 x 4k and
 * prints both and the normalized difference of their outputs.
 * Prints "RESULT <name> <value> <unit>" lines. Exit 77 without a GPU. */
#include "attn_decode_tune.h"
#include "attn_prefill_tune.h"
#include "ty_kernels.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__,          \
                    __LINE__);                                                                    \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

enum { H = 32, KVH = 8, HD = 128, B = 64 };

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)rng;
}

/* Pool of n_pages random bf16 pages (K and V) and per-sequence tables of shuffled pages. */
static void make_pool(int n_pages, void **dk, void **dv, size_t *bytes)
{
    *bytes = (size_t)n_pages * KVH * B * HD * 2;
    uint16_t *h = malloc(*bytes);
    for (size_t i = 0; i < *bytes / 2; i++)
        h[i] = (uint16_t)(0x3c00 + (next_u32() & 0x3ff)) ^ (next_u32() & 0x8000); /* small bf16 */
    CK(cudaMalloc(dk, *bytes));
    CK(cudaMalloc(dv, *bytes));
    CK(cudaMemcpy(*dk, h, *bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(*dv, h, *bytes, cudaMemcpyHostToDevice));
    free(h);
}

static int32_t *make_tables(int n_seqs, int pages_per_seq)
{
    int n = n_seqs * pages_per_seq;
    int32_t *t = malloc(n * 4);
    for (int i = 0; i < n; i++)
        t[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(next_u32() % (uint32_t)(i + 1)), x = t[i];
        t[i] = t[j], t[j] = x;
    }
    int32_t *d;
    CK(cudaMalloc((void **)&d, n * 4));
    CK(cudaMemcpy(d, t, n * 4, cudaMemcpyHostToDevice));
    free(t);
    return d;
}

static float *dev_f32(size_t n, float val)
{
    float *h = malloc(n * 4), *d;
    for (size_t i = 0; i < n; i++)
        h[i] = val * ((float)(next_u32() % 2001) / 1000.0f - 1.0f);
    CK(cudaMalloc((void **)&d, n * 4));
    CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static int32_t *dev_i32_const(int n, int v)
{
    int32_t *h = malloc(n * 4), *d;
    for (int i = 0; i < n; i++)
        h[i] = v;
    CK(cudaMalloc((void **)&d, n * 4));
    CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static double time_copy_ms(void *dst, const void *src, size_t bytes, int iters)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(a, 0));
    for (int i = 0; i < iters; i++)
        CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms / iters;
}

/* One decode-attention setup: n_seqs sequences of ctx tokens over a random bf16 pool with
 * shuffled pages, random q; the benchmark and the variant sweep time the same thing. */
struct dcase {
    int n_seqs, ctx;
    void *dk, *dv;
    size_t bytes; /* of the K pool (V the same) */
    int32_t *tables, *lens;
    float *q, *out;
    size_t nq; /* q / out floats */
    struct ty_cuda_kv_layout l;
    struct ty_cuda_attn_shape s;
};

static void dcase_make(struct dcase *c, int n_seqs, int ctx)
{
    const int pps = ctx / B;
    c->n_seqs = n_seqs, c->ctx = ctx;
    make_pool(n_seqs * pps, &c->dk, &c->dv, &c->bytes);
    c->tables = make_tables(n_seqs, pps);
    c->lens = dev_i32_const(n_seqs, ctx);
    c->nq = (size_t)n_seqs * H * HD;
    c->q = dev_f32(c->nq, 1.0f);
    CK(cudaMalloc((void **)&c->out, c->nq * 4));
    c->l = (struct ty_cuda_kv_layout){TY_CUDA_BF16, KVH, B, HD, n_seqs * pps};
    c->s = (struct ty_cuda_attn_shape){H, KVH, HD, 1.0f / sqrtf(HD), pps, 0};
}

static void dcase_free(struct dcase *c)
{
    cudaFree(c->dk), cudaFree(c->dv), cudaFree(c->tables), cudaFree(c->lens);
    cudaFree(c->q), cudaFree(c->out);
}

static int dcase_run(const struct dcase *c, void *ws)
{
    return ty_cuda_attn_decode(c->out, c->q, c->dk, c->dv, &c->l, &c->s, c->tables, c->lens,
                               c->n_seqs, c->ctx, ws, NULL);
}

/* Milliseconds per call over iters calls (after the caller's warm-up). */
static double dcase_time_ms(const struct dcase *c, void *ws, int iters)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, 0));
    for (int i = 0; i < iters; i++)
        dcase_run(c, ws);
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ms / iters;
}

static int bench_decode(int n_seqs, int ctx)
{
    struct dcase c;
    dcase_make(&c, n_seqs, ctx);
    size_t wsb = ty_cuda_attn_decode_workspace(&c.s, n_seqs, ctx), bytes = c.bytes;
    void *ws = NULL;
    if (wsb)
        CK(cudaMalloc(&ws, wsb));
    for (int i = 0; i < 3; i++)
        if (dcase_run(&c, ws))
            return 1;
    const double ms = dcase_time_ms(&c, ws, 20);
    double attn_gbs = 2.0 * bytes / (ms * 1e-3) / 1e9;
    double copy_ms = time_copy_ms(c.dv, c.dk, bytes, 10);
    double copy_gbs = 2.0 * bytes / (copy_ms * 1e-3) / 1e9;
    printf("decode attention: batch %d ctx %d, %.1f MiB KV read, %.3f ms, %.0f GB/s; "
           "D2D copy %.0f GB/s (read+write); ratio %.2f\n",
           n_seqs, ctx, 2.0 * bytes / 1048576.0, ms, attn_gbs, copy_gbs, attn_gbs / copy_gbs);
    printf("RESULT decode_attn_b%d_ctx%d_gbs %.1f GB/s\n", n_seqs, ctx, attn_gbs);
    printf("RESULT d2d_copy_gbs %.1f GB/s\n", copy_gbs);
    printf("RESULT decode_attn_b%d_ctx%d_vs_copy %.3f ratio\n", n_seqs, ctx, attn_gbs / copy_gbs);
    dcase_free(&c);
    if (ws)
        cudaFree(ws);
    return 0;
}

/* Prefill attention at n_seqs x L; when out_h is given the output is copied there (f32,
 * n_seqs * L * H * HD) and the RNG restarts from a fixed seed so that every call sees the
 * same inputs (the variant sweep compares outputs). */
static double last_tflops; /* of the latest bench_prefill_out */

static int bench_prefill_out(int n_seqs, int L, float *out_h, const char *tag)
{
    if (out_h)
        rng = 0x9e3779b97f4a7c15ull;
    const int pps = L / B;
    void *dk, *dv;
    size_t bytes;
    make_pool(n_seqs * pps, &dk, &dv, &bytes);
    int32_t *tables = make_tables(n_seqs, pps), *lens = dev_i32_const(n_seqs, L);
    int32_t *starts_h = malloc(n_seqs * 4), *starts;
    for (int i = 0; i < n_seqs; i++)
        starts_h[i] = i * L;
    CK(cudaMalloc((void **)&starts, n_seqs * 4));
    CK(cudaMemcpy(starts, starts_h, n_seqs * 4, cudaMemcpyHostToDevice));
    free(starts_h);
    float *q = dev_f32((size_t)n_seqs * L * H * HD, 1.0f), *out;
    CK(cudaMalloc((void **)&out, (size_t)n_seqs * L * H * HD * 4));
    struct ty_cuda_kv_layout l = {TY_CUDA_BF16, KVH, B, HD, n_seqs * pps};
    struct ty_cuda_attn_shape s = {H, KVH, HD, 1.0f / sqrtf(HD), pps, 0};
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int iters = 5;
    if (ty_cuda_attn_prefill(out, q, dk, dv, &l, &s, tables, starts, lens, lens, n_seqs, L, NULL))
        return 1;
    CK(cudaEventRecord(a, 0));
    for (int i = 0; i < iters; i++)
        ty_cuda_attn_prefill(out, q, dk, dv, &l, &s, tables, starts, lens, lens, n_seqs, L, NULL);
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    ms /= iters;
    double flops = (double)n_seqs * H * 4.0 * L * (double)L * HD / 2.0;
    double tflops = flops / (ms * 1e-3) / 1e12;
    last_tflops = tflops;
    printf("prefill attention%s: %d x %d tokens, causal, %.3f ms, %.1f TFLOP/s\n", tag, n_seqs,
           L, ms, tflops);
    if (!out_h)
        printf("RESULT prefill_attn_b%d_L%d_tflops %.2f TFLOP/s\n", n_seqs, L, tflops);
    else
        CK(cudaMemcpy(out_h, out, (size_t)n_seqs * L * H * HD * 4, cudaMemcpyDeviceToHost));
    cudaFree(dk), cudaFree(dv), cudaFree(tables), cudaFree(lens), cudaFree(starts);
    cudaFree(q), cudaFree(out);
    return 0;
}

/* Whether ty_cuda_attn_prefill runs the Hopper kernel here: an sm_90 device. */
static bool on_sm90(void)
{
    int dev = 0, major = 0, minor = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0;
}

static int bench_prefill(int n_seqs, int L)
{
    return bench_prefill_out(n_seqs, L, NULL, on_sm90() ? " [sm90 wgmma kernel]" : "");
}

/* sm_90 only: the Hopper kernel and the mma.sync kernel on the same inputs. */
static int prefill_sm90_vs_tc(int n_seqs, int L)
{
    size_t n = (size_t)n_seqs * L * H * HD;
    float *ref = malloc(n * 4), *got = malloc(n * 4);
    ty__attn_prefill_sm90_set_enabled(0);
    int rc = bench_prefill_out(n_seqs, L, ref, " [mma.sync kernel]");
    const double tc = last_tflops;
    ty__attn_prefill_sm90_set_enabled(1);
    rc |= bench_prefill_out(n_seqs, L, got, " [sm90 wgmma kernel]");
    const double sm90 = last_tflops;
    if (!rc) {
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++)
            num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]),
                den += (double)ref[i] * ref[i];
        const double e = sqrt(num / (den > 0 ? den : 1));
        printf("  sm90 vs mma.sync: normalized difference %.2g%s\n", e, e < 1e-2 ? "" : "  BAD");
        printf("RESULT prefill_tc_b%d_L%d_tflops %.2f TFLOP/s\n", n_seqs, L, tc);
        printf("RESULT prefill_sm90_b%d_L%d_tflops %.2f TFLOP/s\n", n_seqs, L, sm90);
        printf("RESULT prefill_sm90_vs_tc_b%d_L%d %.3f ratio\n", n_seqs, L, sm90 / tc);
        rc = e < 1e-2 ? 0 : 1;
    }
    free(ref), free(got);
    return rc;
}

/* Every tensor-core prefill shape (attn_prefill_tune.h) at 4 x L, outputs compared with
 * variant 0's on the same inputs. */
static int prefill_sweep(int L)
{
    enum { NV = 5 };
    static const char *names[NV] = {"128 rows, 64-key tiles, 1 barrier (default)",
                                     "64 rows, Q in registers, 3 barriers (first version)",
                                     "64 rows, Q in registers, 1 barrier",
                                     "128 rows, 32-key tiles, 1 barrier",
                                     "128 rows, 64-key tiles, 3 barriers"};
    size_t n = (size_t)4 * L * H * HD;
    float *ref = malloc(n * 4), *got = malloc(n * 4);
    int rc = 0;
    const int sm90 = ty__attn_prefill_sm90_set_enabled(0); /* the variants are mma.sync's */
    for (int v = 0; v < NV && !rc; v++) {
        char tag[96];
        snprintf(tag, sizeof(tag), " [variant %d: %s]", v, names[v]);
        if (ty__attn_prefill_tc_set_variant(v))
            return 1;
        rc = bench_prefill_out(4, L, v ? got : ref, tag);
        if (!rc && v) {
            double num = 0, den = 0;
            for (size_t i = 0; i < n; i++)
                num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]),
                    den += (double)ref[i] * ref[i];
            double e = sqrt(num / (den > 0 ? den : 1));
            printf("  variant %d vs variant 0: normalized difference %.2g%s\n", v, e,
                   e < 2e-3 ? "" : "  BAD");
        }
    }
    ty__attn_prefill_tc_set_variant(0);
    ty__attn_prefill_sm90_set_enabled(sm90);
    free(ref), free(got);
    return rc;
}

/* decode-sweep: every decode variant x split setting of the list below (attn_decode_tune.h) at
 * batch 64 x 4096 and batch 1 x 32768 tokens, the inputs of bench_decode (bf16 pool, shuffled
 * 64-token pages), allocated once per size so that every combination sees the same data. Each
 * output is compared with the reference combination's (the first: base at split factor 4, the
 * kernel that test_gpu_attention passed on the H200 before the sweep existed). */
struct sweep_combo {
    int variant, split_factor, min_split; /* ty__decode_tune fields (0: default) */
};
#define FIT TY__DECODE_SPLIT_FIT
static const struct sweep_combo sweep_combos[] = {
    {TY__DECODE_BASE, 4, 0}, {TY__DECODE_BASE, 8, 0},   {TY__DECODE_BASE, FIT, 0},
    {TY__DECODE_U2, 4, 0},   {TY__DECODE_U2, FIT, 0},   {TY__DECODE_G2, 4, 0},
    {TY__DECODE_NOPF, 4, 0}, {TY__DECODE_TC, 4, 0},     {TY__DECODE_TC, 8, 0},
    {TY__DECODE_TC, FIT, 0}, {TY__DECODE_TC, 16, 128},  {TY__DECODE_TCS, 4, 0},
    {TY__DECODE_TCS, 8, 0},  {TY__DECODE_TCS, FIT, 0},  {TY__DECODE_TCS, 16, 128},
};
#undef FIT
enum { N_SWEEP = sizeof(sweep_combos) / sizeof(sweep_combos[0]) };

struct sweep_result {
    int ok, n_splits;
    double ms, gbs, maxdiff, maxref;
};

static void sweep_name(const struct sweep_combo *c, char *buf, size_t n)
{
    char f[16];
    if (c->split_factor == TY__DECODE_SPLIT_FIT)
        snprintf(f, sizeof(f), "fit");
    else
        snprintf(f, sizeof(f), "f%d", c->split_factor ? c->split_factor : 4);
    if (c->min_split)
        snprintf(buf, n, "%s_%s_ms%d", ty__attn_decode_variant_name(c->variant), f, c->min_split);
    else
        snprintf(buf, n, "%s_%s", ty__attn_decode_variant_name(c->variant), f);
}

/* Runs every combination at n_seqs x ctx; res[i] gets combination i's numbers. Returns the
 * copy bandwidth (read + write) of the K pool's bytes, or a negative value on failure. */
static double sweep_size(int n_seqs, int ctx, struct sweep_result *res)
{
    struct dcase c;
    dcase_make(&c, n_seqs, ctx);
    const size_t nq = c.nq, bytes = c.bytes;
    float *ref = malloc(nq * 4), *got = malloc(nq * 4);
    /* K and V hold the same bytes (make_pool), so the copy leaves the inputs as they were */
    const double copy_gbs = 2.0 * bytes / (time_copy_ms(c.dv, c.dk, bytes, 10) * 1e-3) / 1e9;
    for (int i = 0; i < N_SWEEP; i++) {
        struct sweep_result *r = &res[i];
        memset(r, 0, sizeof(*r));
        struct ty__decode_tune t = {sweep_combos[i].variant, sweep_combos[i].split_factor,
                                    sweep_combos[i].min_split};
        if (ty__attn_decode_set_tune(&t))
            continue;
        const size_t wsb = ty_cuda_attn_decode_workspace(&c.s, n_seqs, ctx);
        r->n_splits = wsb ? (int)(wsb / (4 * nq / HD * (HD + 2))) : 1;
        void *ws = NULL;
        if (wsb)
            CK(cudaMalloc(&ws, wsb));
        CK(cudaMemset(c.out, 0xff, nq * 4)); /* NaN: a kernel that writes nothing fails */
        int rc = 0;
        for (int k = 0; k < 3 && !rc; k++)
            rc = dcase_run(&c, ws);
        CK(cudaDeviceSynchronize());
        if (!rc) {
            CK(cudaMemcpy(got, c.out, nq * 4, cudaMemcpyDeviceToHost));
            r->ms = dcase_time_ms(&c, ws, 20);
            r->gbs = 2.0 * bytes / (r->ms * 1e-3) / 1e9;
            if (i == 0)
                memcpy(ref, got, nq * 4);
            double md = 0, mr = 0;
            for (size_t k = 0; k < nq; k++) {
                const double d = fabs((double)got[k] - ref[k]);
                md = d > md || d != d ? d : md; /* NaN propagates */
                mr = fabs(ref[k]) > mr ? fabs(ref[k]) : mr;
            }
            r->maxdiff = md, r->maxref = mr;
            r->ok = md <= 1e-3 * mr; /* false for NaN */
        }
        if (ws)
            cudaFree(ws);
    }
    ty__attn_decode_set_tune(NULL);
    dcase_free(&c);
    free(ref), free(got);
    return copy_gbs;
}

/* Whether combination c is what the library runs when nothing is set (d: its settings). */
static int sweep_is_default(const struct sweep_combo *c, const struct ty__decode_tune *d)
{
    return c->variant == d->variant && (c->split_factor ? c->split_factor : 4) == d->split_factor &&
           (c->min_split ? c->min_split : 256) == d->min_split;
}

/* The sweep's table and RESULT lines; c64, c1: the copy bandwidths. */
static int sweep_report(const struct sweep_result *r64, const struct sweep_result *r1, double c64,
                        double c1)
{
    struct ty__decode_tune d;
    ty__attn_decode_set_tune(NULL);
    ty__attn_decode_get_tune(&d);
    char def[64] = "not in the list";
    for (int i = 0; i < N_SWEEP; i++)
        if (sweep_is_default(&sweep_combos[i], &d))
            sweep_name(&sweep_combos[i], def, sizeof(def));
    printf("decode sweep: bf16 pool, %d query / %d KV heads, head_dim %d, %d-token pages in "
           "shuffled order; GB/s = K+V bytes read / time (%d iterations); ratio = GB/s / D2D "
           "copy GB/s (read+write, same bytes)\n",
           H, KVH, HD, B, 20);
    printf("  D2D copy: b64 ctx4096 %.0f GB/s, b1 ctx32768 %.0f GB/s\n", c64, c1);
    printf("  variants (blocks/SM for this shape):\n"
           "    base: f32 FMAs, 8 lanes per token row, 16 tokens per warp iteration, 2/SM (the "
           "kernel before the sweep)\n"
           "    u2:   base with 8 tokens per iteration (fewer registers), 3/SM\n"
           "    g2:   u2 with 2 query heads per block (2 blocks per KV head, K/V read twice), "
           "4/SM\n"
           "    nopf: base without the L2::256B prefetch qualifier on the K/V loads, 2/SM\n"
           "    tc:   tensor cores (mma.sync m16n8k16) for QK^T and PV, 16 tokens per iteration, "
           "3/SM\n"
           "    tcs:  tc with Q's fragments in shared memory instead of registers, 4/SM\n");
    printf("  split settings: fN = splits aim at N x SMs blocks in all (N = 4 before the sweep), "
           "with at least 256 tokens per split (M with _msM); fit = the split count whose grid "
           "fills whole waves of blocks/SM x SMs best\n");
    printf("  maxdiff = max |out - out of base_f4| over the batch (same inputs); BAD when above "
           "1e-3 x max |out of base_f4|; BAD rows cannot win; * = the library default (%s)\n",
           def);
    printf("%-16s | %-40s | %-40s\n", "", "batch 64, ctx 4096", "batch 1, ctx 32768");
    printf("%-16s | %6s %7s %6s %6s %9s   | %6s %7s %6s %6s %9s\n", "combination", "splits", "ms",
           "GB/s", "ratio", "maxdiff", "splits", "ms", "GB/s", "ratio", "maxdiff");
    int best64 = -1, best1 = -1;
    for (int i = 0; i < N_SWEEP; i++) {
        char name[64];
        sweep_name(&sweep_combos[i], name, sizeof(name));
        const int is_def = sweep_is_default(&sweep_combos[i], &d);
        char line[2][96];
        const struct sweep_result *rr[2] = {&r64[i], &r1[i]};
        const double cc[2] = {c64, c1};
        for (int k = 0; k < 2; k++) {
            const struct sweep_result *r = rr[k];
            if (r->ms > 0)
                snprintf(line[k], sizeof(line[k]), "%6d %7.4f %6.0f %6.3f %9.2g%s", r->n_splits,
                         r->ms, r->gbs, r->gbs / cc[k], r->maxdiff, r->ok ? "   " : " BAD");
            else
                snprintf(line[k], sizeof(line[k]), "%6s %40s", "", "FAILED (launch or tune)");
        }
        printf("%-15s%s | %s | %s\n", name, is_def ? "*" : " ", line[0], line[1]);
        if (r64[i].ok && (best64 < 0 || r64[i].gbs > r64[best64].gbs))
            best64 = i;
        if (r1[i].ok && (best1 < 0 || r1[i].gbs > r1[best1].gbs))
            best1 = i;
    }
    if (best64 < 0 || best1 < 0)
        return 1;
    char n64[64], n1[64];
    sweep_name(&sweep_combos[best64], n64, sizeof(n64));
    sweep_name(&sweep_combos[best1], n1, sizeof(n1));
    printf("RESULT decode_sweep_best_b64 %.3f ratio %s\n", r64[best64].gbs / c64, n64);
    printf("RESULT decode_sweep_best_b1 %.3f ratio %s\n", r1[best1].gbs / c1, n1);
    return 0;
}

static int decode_sweep(void)
{
    static struct sweep_result r64[N_SWEEP], r1[N_SWEEP];
    const double c64 = sweep_size(64, 4096, r64), c1 = sweep_size(1, 32768, r1);
    return sweep_report(r64, r1, c64, c1);
}

int main(int argc, char **argv)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("bench_gpu_attn: no CUDA device (%s), skipping\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    const char *what = argc > 1 ? argv[1] : "all";
    int rc = 0;
    if (!strcmp(what, "all") || !strcmp(what, "decode")) {
        rc |= bench_decode(64, 4096);
        rc |= bench_decode(1, 32768); /* a long single context: the split path */
    }
    if (!strcmp(what, "decode-sweep"))
        rc |= decode_sweep();
    if (!strcmp(what, "prefill-sweep")) {
        rc |= prefill_sweep(2048);
        rc |= prefill_sweep(4096);
    }
    if (!strcmp(what, "all") || !strcmp(what, "prefill")) {
        ty__attn_prefill_sm90_set_enabled(1);
        rc |= bench_prefill(4, 1024);
        rc |= bench_prefill(4, 2048);
        rc |= bench_prefill(4, 4096);
        if (on_sm90()) {
            rc |= prefill_sm90_vs_tc(4, 2048);
            rc |= prefill_sm90_vs_tc(1, 16384);
            rc |= prefill_sm90_vs_tc(8, 4096);
        }
    }
    return rc;
}
