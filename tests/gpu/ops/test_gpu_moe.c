/* The mixture-of-experts kernels (moe.cu) against loops written from the CPU backend's
 * definitions (cpu/forward.c moe_route, top_k, norm_weights, moe_ffn):
 *   - routing: the experts picked (exactly, ties to the lower index: rows of equal logits and
 *     rows with a tied best pair) and their weights, with and without renormalisation;
 *   - the per-slot expert product for f32, f16 and bf16 stacks, a token's row for all its
 *     slots (x_div = n_used) and a row per slot (x_div = 1);
 *   - the weighted sum of each token's slots into the residual, in slot order, with the slots
 *     in place or grouped (a row index per slot, as the prefill's per-expert GEMMs leave them).
 * Outputs poisoned with NaN first. The whole FFN against the CPU backend on a model is
 * test_gpu_e2e's test_moe. */
#include "gpu_test_util.h"

/* The CPU's routing of one row (softmax with a double sum, k picks, optional renorm). */
static void ref_route(const float *logits, int E, int K, int norm, int32_t *sel, float *w)
{
    float p[512], mx = -INFINITY;
    for (int e = 0; e < E; e++)
        mx = logits[e] > mx ? logits[e] : mx;
    double sum = 0;
    for (int e = 0; e < E; e++) {
        p[e] = expf(logits[e] - mx);
        sum += p[e];
    }
    float inv = (float)(1.0 / sum), wsum = 0;
    for (int e = 0; e < E; e++)
        p[e] *= inv;
    for (int k = 0; k < K; k++) {
        int best = 0;
        for (int e = 1; e < E; e++)
            best = p[e] > p[best] ? e : best;
        sel[k] = best;
        w[k] = p[best];
        wsum += w[k];
        p[best] = -INFINITY;
    }
    for (int k = 0; norm && k < K; k++)
        w[k] /= wsum > 6.103515625e-5f ? wsum : 6.103515625e-5f;
}

static void route_case(int T, int E, int K, int norm, uint64_t *rng)
{
    float *lg = malloc((size_t)T * E * 4), *w = malloc((size_t)T * K * 4);
    int32_t *sel = malloc((size_t)T * K * 4);
    for (int t = 0; t < T; t++) {
        float *r = lg + (size_t)t * E;
        for (int e = 0; e < E; e++) /* well-separated values: no near-ties by rounding */
            r[e] = 0.25f * (float)gt_randint(rng, -24, 24);
        if (t % 4 == 1) /* all equal: experts 0..K-1 */
            for (int e = 0; e < E; e++)
                r[e] = 1.5f;
        if (t % 4 == 2) { /* a tied best pair at e1 < e2 */
            int e1 = gt_randint(rng, 0, E - 2), e2 = gt_randint(rng, e1 + 1, E - 1);
            r[e1] = r[e2] = 7.0f;
        }
    }
    float *dl = gt_upload(lg, (size_t)T * E * 4), *dw = gt_dev((size_t)T * K * 4);
    int32_t *ds = gt_dev((size_t)T * K * 4);
    gt_poison(dw, (size_t)T * K * 4);
    assert_int_equal(ty_cuda_moe_route(ds, dw, dl, T, E, K, norm, NULL), 0);
    gt_download(w, dw, (size_t)T * K * 4);
    gt_download(sel, ds, (size_t)T * K * 4);
    for (int t = 0; t < T; t++) {
        int32_t rs[64];
        float rw[64];
        double want[64];
        ref_route(lg + (size_t)t * E, E, K, norm, rs, rw);
        for (int k = 0; k < K; k++) {
            if (sel[(size_t)t * K + k] != rs[k])
                fail_msg("route T%d E%d K%d norm%d: token %d slot %d picked %d, CPU %d", T, E, K,
                         norm, t, k, sel[(size_t)t * K + k], rs[k]);
            want[k] = rw[k];
        }
        GT_EXPECT_NERR(w + (size_t)t * K, want, K, 1e-6, "route weights t%d E%d K%d", t, E, K);
    }
    free(lg), free(w), free(sel);
    cudaFree(dl), cudaFree(dw), cudaFree(ds);
}

static void test_route(void **state)
{
    uint64_t rng = 7;
    route_case(37, 8, 2, 1, &rng);  /* Mixtral */
    route_case(19, 128, 8, 1, &rng); /* Qwen3-MoE-30B-A3B's shape */
    route_case(9, 60, 4, 0, &rng);   /* Qwen1.5-MoE-like: no renormalisation */
    route_case(5, 4, 4, 1, &rng);    /* every expert used */
}

static void matvec_case(int T, int K, int E, int rows, int cols, int x_div, enum ty_cuda_dtype t,
                        uint64_t *rng)
{
    int S = T * K, nx = S / x_div;
    size_t nw = (size_t)E * rows * cols, es = gt_dtype_size(t);
    float *wf = malloc(nw * 4), *x = malloc((size_t)nx * cols * 4);
    float *y = malloc((size_t)S * rows * 4);
    void *wenc = malloc(nw * es);
    int32_t *sel = malloc((size_t)S * 4);
    gt_fill(wf, nw, rng, -1, 1);
    gt_fill(x, (size_t)nx * cols, rng, -1, 1);
    gt_encode(wenc, wf, nw, t);
    for (int s = 0; s < S; s++)
        sel[s] = gt_randint(rng, 0, E - 1);
    void *dw = gt_upload(wenc, nw * es);
    float *dx = gt_upload(x, (size_t)nx * cols * 4), *dy = gt_dev((size_t)S * rows * 4);
    int32_t *ds = gt_upload(sel, (size_t)S * 4);
    gt_poison(dy, (size_t)S * rows * 4);
    assert_int_equal(ty_cuda_moe_matvec(dy, dx, x_div, dw, t, ds, S, rows, cols, NULL), 0);
    gt_download(y, dy, (size_t)S * rows * 4);
    double *want = malloc((size_t)rows * 8);
    for (int s = 0; s < S; s++) {
        const float *xr = x + (size_t)(s / x_div) * cols;
        for (int r = 0; r < rows; r++) {
            const float *wr = wf + ((size_t)sel[s] * rows + r) * cols;
            double acc = 0;
            for (int i = 0; i < cols; i++)
                acc += (double)wr[i] * xr[i];
            want[r] = acc;
        }
        GT_EXPECT_NERR(y + (size_t)s * rows, want, rows, 1e-5, "matvec slot %d %s rows %d cols %d",
                       s, gt_dtype_name(t), rows, cols);
    }
    free(wf), free(x), free(y), free(wenc), free(sel), free(want);
    cudaFree(dw), cudaFree(dx), cudaFree(dy), cudaFree(ds);
}

static void test_matvec(void **state)
{
    uint64_t rng = 11;
    matvec_case(5, 2, 8, 2 * 48, 64, 2, TY_CUDA_F32, &rng);  /* gate|up: a row per token */
    matvec_case(5, 2, 8, 64, 48, 1, TY_CUDA_F32, &rng);      /* down: a row per slot */
    matvec_case(3, 8, 16, 2 * 96, 128, 8, TY_CUDA_F16, &rng);
    matvec_case(4, 4, 6, 130, 33, 1, TY_CUDA_BF16, &rng);    /* rows not a block multiple */
}

static void test_combine(void **state)
{
    enum { T = 7, K = 3, D = 200 };
    uint64_t rng = 3;
    float x[T * D], ys[T * K * D], w[T * K], got[T * D];
    double want[T * D];
    gt_fill(x, T * D, &rng, -1, 1);
    gt_fill(ys, T * K * D, &rng, -2, 2);
    gt_fill(w, T * K, &rng, 0, 1);
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) { /* the CPU's order: scaled slots, summed, then added */
            float acc = ys[(size_t)t * K * D + d] * w[t * K];
            for (int k = 1; k < K; k++)
                acc += ys[((size_t)t * K + k) * D + d] * w[t * K + k];
            want[t * D + d] = x[t * D + d] + acc;
        }
    float *dx = gt_upload(x, sizeof(x)), *dy = gt_upload(ys, sizeof(ys));
    float *dw = gt_upload(w, sizeof(w));
    assert_int_equal(ty_cuda_moe_combine(dx, dy, dw, T, K, D, NULL), 0);
    gt_download(got, dx, sizeof(got));
    GT_EXPECT_NERR(got, want, T * D, 2e-7, "combine");
    /* the same slots stored grouped (slot s at row rows[s], a permutation) */
    static float yg[T * K * D];
    int32_t rows[T * K];
    for (int s = 0; s < T * K; s++)
        rows[s] = (s * 5 + 3) % (T * K); /* 5 is prime to 21 */
    for (int s = 0; s < T * K; s++)
        memcpy(yg + (size_t)rows[s] * D, ys + (size_t)s * D, D * sizeof(float));
    float *dyg = gt_upload(yg, sizeof(yg));
    int32_t *drows = gt_upload(rows, sizeof(rows));
    GT_CHECK(cudaMemcpy(dx, x, sizeof(x), cudaMemcpyHostToDevice));
    assert_int_equal(ty_cuda_moe_combine_rows(dx, dyg, dw, drows, T, K, D, NULL), 0);
    gt_download(got, dx, sizeof(got));
    GT_EXPECT_NERR(got, want, T * D, 2e-7, "combine_rows");
    cudaFree(dx), cudaFree(dy), cudaFree(dw), cudaFree(dyg), cudaFree(drows);
}

static void test_rejects_bad_shapes(void **state)
{
    assert_int_equal(ty_cuda_moe_route(NULL, NULL, NULL, 1, 4, 5, 1, NULL), TY_EINVAL);
    assert_int_equal(ty_cuda_moe_route(NULL, NULL, NULL, 1, 0, 1, 1, NULL), TY_EINVAL);
    assert_int_equal(ty_cuda_moe_matvec(NULL, NULL, 0, NULL, TY_CUDA_F32, NULL, 1, 4, 4, NULL),
                     TY_EINVAL);
    assert_int_equal(ty_cuda_moe_combine(NULL, NULL, NULL, 1, 0, 4, NULL), TY_EINVAL);
}

int main(void)
{
    gt_require_gpu("test_gpu_moe");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_matvec),
        cmocka_unit_test(test_combine),
        cmocka_unit_test(test_rejects_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
