/* GPU op test of the Hopper prefill attention kernel (kernels/attn_prefill_sm90.cu): on an
 * sm_90 device, ty_cuda_attn_prefill takes it for 16-bit pools with head_dim 64/128 and page
 * sizes that tile; its output is checked against the double-precision reference
 * (gpu_attn_ref.h) on a sample of rows (every row would take minutes of CPU at 16k tokens)
 * and against the mma.sync kernel (attn_prefill_tc.cu, the hook in attn_prefill_tune.h turns
 * the new one off) on every row. Shapes: the benchmark's (32/8 heads, head_dim 128, 64-token
 * bf16 pages: 4 x 2k, 1 x 16k, 8 x 4k with cached prefixes) and edges (head_dim 64, f16,
 * 16- and 256-token pages, GQA 1 and 8, one-row chunks, prefixes that are not a multiple of
 * the tile). Exits 77 on any other device: there the kernel is never launched. */
#include "gpu_attn_ref.h"

#include "attn_prefill_tune.h"

struct scase {
    int n_heads, n_kv, hd, B, n_chunks;
    int q_lens[8], kv_lens[8];
};

/* Runs ty_cuda_attn_prefill with the Hopper kernel on (sm90 = 1) or off into host `got`. */
static void run_prefill(float *got, int sm90, const float *dq, const struct pool *p,
                        const struct ty_cuda_attn_shape *sh, const struct scase *c,
                        const int *starts, int max_q, size_t nq)
{
    int32_t *dst = gt_upload(starts, c->n_chunks * 4), *dql = gt_upload(c->q_lens, c->n_chunks * 4);
    int32_t *dkl = gt_upload(c->kv_lens, c->n_chunks * 4);
    float *dout = gt_dev(nq * 4);
    gt_poison(dout, nq * 4);
    ty__attn_prefill_sm90_set_enabled(sm90);
    const int rc = ty_cuda_attn_prefill(dout, dq, p->dk, p->dv, &p->l, sh, p->dtables, dst, dql,
                                        dkl, c->n_chunks, max_q, NULL);
    ty__attn_prefill_sm90_set_enabled(1);
    assert_int_equal(rc, 0);
    GT_CHECK(cudaDeviceSynchronize());
    gt_download(got, dout, nq * 4);
    cudaFree(dout), cudaFree(dst), cudaFree(dql), cudaFree(dkl);
}

/* Whether row r of a chunk of ql rows is checked against the reference: the first and last
 * two, both sides of the first 64-row (warpgroup) and 128-row (CTA) edges, ~40 spread out. */
static bool sampled(int r, int ql)
{
    const int step = ql > 40 ? ql / 40 : 1;
    return r < 2 || r >= ql - 2 || (r < 512 && (r % 64 == 63 || r % 64 == 0)) || r % step == 0;
}

static void check(const struct scase *c, enum ty_cuda_dtype dt, uint64_t *s)
{
    struct pool p;
    pool_make(&p, dt, c->n_kv, c->B, c->hd, c->kv_lens, NULL, c->n_chunks, s);
    const int H = c->n_heads, hd = c->hd, G = H / c->n_kv;
    int rows = 0, max_q = 0, max_kv = 0, starts[8];
    for (int i = 0; i < c->n_chunks; i++) {
        starts[i] = rows;
        rows += c->q_lens[i];
        max_q = c->q_lens[i] > max_q ? c->q_lens[i] : max_q;
        max_kv = c->kv_lens[i] > max_kv ? c->kv_lens[i] : max_kv;
    }
    const size_t nq = (size_t)rows * H * hd;
    float *q = malloc(nq * 4), *got = malloc(nq * 4), *old = malloc(nq * 4);
    gt_fill(q, nq, s, -2, 2);
    const float scale = 1.0f / sqrtf((float)hd);
    struct ty_cuda_attn_shape sh = {H, c->n_kv, hd, scale, p.max_pages, 0};
    float *dq = gt_upload(q, nq * 4);
    run_prefill(got, 1, dq, &p, &sh, c, starts, max_q, nq);
    run_prefill(old, 0, dq, &p, &sh, c, starts, max_q, nq);

    /* every row against the mma.sync kernel (both round q and P to the pool type) */
    const double tol = dt == TY_CUDA_F16 ? 2e-3 : 1e-2;
    double num = 0, den = 0;
    for (size_t i = 0; i < nq; i++) {
        if (!isfinite(got[i]))
            fail_msg("sm90 output %zu is %g (%s H=%d hd=%d B=%d)", i, got[i], gt_dtype_name(dt), H,
                     hd, c->B);
        num += ((double)got[i] - old[i]) * ((double)got[i] - old[i]);
        den += (double)old[i] * old[i];
    }
    const double e_old = sqrt(num / (den > 0 ? den : 1));
    if (!(e_old <= tol))
        fail_msg("sm90 vs mma.sync %s H=%d kv=%d hd=%d B=%d chunks=%d: nerr %.3g > %.3g",
                 gt_dtype_name(dt), H, c->n_kv, hd, c->B, c->n_chunks, e_old, tol);

    /* a sample of rows (sampled()) against the reference */
    int n_rows_s = 0;
    for (int i = 0; i < c->n_chunks; i++)
        for (int r = 0; r < c->q_lens[i]; r++)
            n_rows_s += sampled(r, c->q_lens[i]);
    size_t n_s = 0;
    float *sg = malloc((size_t)n_rows_s * H * hd * 4);
    double *sw = malloc((size_t)n_rows_s * H * hd * 8), *sc = malloc((size_t)max_kv * 8);
    for (int i = 0; i < c->n_chunks; i++) {
        const int ql = c->q_lens[i];
        for (int r = 0; r < ql; r++) {
            if (!sampled(r, ql))
                continue;
            for (int h = 0; h < H; h++) {
                const size_t o = ((size_t)(starts[i] + r) * H + h) * hd;
                const int vis = c->kv_lens[i] - ql + r + 1;
                ref_attend(&p, i, h / G, q + o, 0, vis, scale, sw + n_s, sc);
                memcpy(sg + n_s, got + o, (size_t)hd * 4);
                n_s += hd;
            }
        }
    }
    GT_EXPECT_NERR(sg, sw, n_s, tol, "sm90 vs reference %s H=%d kv=%d hd=%d B=%d chunks=%d",
                   gt_dtype_name(dt), H, c->n_kv, hd, c->B, c->n_chunks);
    printf("  ok %s H=%d kv=%d hd=%d B=%d chunks=%d rows=%d max_kv=%d\n", gt_dtype_name(dt), H,
           c->n_kv, hd, c->B, c->n_chunks, rows, max_kv);
    cudaFree(dq);
    free(q), free(got), free(old), free(sg), free(sw), free(sc);
    pool_free(&p);
}

static void test_bench_shapes(void **state)
{
    (void)state;
    static const struct scase cases[] = {
        {32, 8, 128, 64, 4, {2048, 2048, 2048, 2048}, {2048, 2048, 2048, 2048}},
        {32, 8, 128, 64, 1, {16384}, {16384}},
        /* 8 x 4k with cached prefixes of 0..3.5k tokens, some not a multiple of the tile */
        {32,
         8,
         128,
         64,
         8,
         {4096, 3000, 1024, 4096, 1, 777, 2048, 129},
         {4096, 4096, 4096, 7000, 4096, 1000, 2560, 4000}},
    };
    uint64_t s = 90;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check(&cases[i], TY_CUDA_BF16, &s);
}

static void test_edges(void **state)
{
    (void)state;
    static const struct scase cases[] = {
        {8, 8, 64, 16, 3, {1, 65, 200}, {1, 300, 333}}, /* MHA, hd 64, 16-token pages */
        {16, 2, 128, 256, 2, {129, 63}, {700, 63}},     /* pages larger than a tile */
        {8, 1, 128, 128, 2, {128, 257}, {128, 1000}},   /* GQA 8, page = tile */
        {4, 2, 64, 32, 1, {1000}, {1000}},
    };
    uint64_t s = 91;
    for (int dt = TY_CUDA_F16; dt <= TY_CUDA_BF16; dt++)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            check(&cases[i], (enum ty_cuda_dtype)dt, &s);
}

int main(void)
{
    gt_require_gpu("test_gpu_attn_sm90");
    int dev = 0, major = 0, minor = 0;
    GT_CHECK(cudaGetDevice(&dev));
    GT_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    GT_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0) {
        printf("test_gpu_attn_sm90: device is sm_%d%d, not sm_90, skipping\n", major, minor);
        return 77;
    }
    if (!ty__attn_prefill_sm90_available()) {
        printf("test_gpu_attn_sm90: an sm_90 device, but the Hopper kernel cannot run (no sm_90a "
               "code in this build, or no cuTensorMapEncodeTiled in the driver)\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_bench_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
