/* GPU op tests, part 1: RMSNorm, residual add, SiLU-gated MLP, dtype conversion, embedding,
 * RoPE (plain, NeoX, partial, llama3-scaled), cuBLAS projections, KV page write/gather/scatter.
 * Each op runs on fresh random inputs of several shapes (odd sizes included) into poisoned
 * outputs and is compared with a plain double-precision loop written from the op's definition. */
#include "gpu_test_util.h"

#include <cublas_v2.h>

static void test_rmsnorm(void **state)
{
    static const int shapes[][2] = {{1, 1}, {7, 1000}, {3, 4096}, {33, 257}, {2, 8192}};
    uint64_t s = 11;
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        int rows = shapes[k][0], dim = shapes[k][1];
        size_t n = (size_t)rows * dim;
        float *x = malloc(n * 4), *w = malloc(dim * 4), *got = malloc(n * 4);
        double *want = malloc(n * 8);
        gt_fill(x, n, &s, -3, 3);
        gt_fill(w, dim, &s, 0.5f, 1.5f);
        for (int r = 0; r < rows; r++) {
            double ss = 0;
            for (int i = 0; i < dim; i++)
                ss += (double)x[r * dim + i] * x[r * dim + i];
            double sc = 1.0 / sqrt(ss / dim + 1e-6);
            for (int i = 0; i < dim; i++)
                want[(size_t)r * dim + i] = x[(size_t)r * dim + i] * sc * w[i];
        }
        float *dx = gt_upload(x, n * 4), *dw = gt_upload(w, dim * 4), *dout = gt_dev(n * 4);
        gt_poison(dout, n * 4);
        assert_int_equal(ty_cuda_rmsnorm_f32(dout, dx, dw, rows, dim, 1e-6f, NULL), 0);
        gt_download(got, dout, n * 4);
        GT_EXPECT_NERR(got, want, n, 1e-6, "rmsnorm %dx%d", rows, dim);
        /* in place (out aliases x) */
        assert_int_equal(ty_cuda_rmsnorm_f32(dx, dx, dw, rows, dim, 1e-6f, NULL), 0);
        gt_download(got, dx, n * 4);
        GT_EXPECT_NERR(got, want, n, 1e-6, "rmsnorm in place %dx%d", rows, dim);
        cudaFree(dx), cudaFree(dw), cudaFree(dout);
        free(x), free(w), free(got), free(want);
    }
}

static void test_add_and_silu_mul(void **state)
{
    static const int shapes[][2] = {{1, 1}, {5, 11008}, {17, 333}, {64, 1}};
    uint64_t s = 12;
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        int rows = shapes[k][0], cols = shapes[k][1];
        size_t n = (size_t)rows * cols, nf = 2 * n;
        float *fused = malloc(nf * 4), *y = malloc(n * 4), *got = malloc(n * 4);
        double *want = malloc(n * 8);
        gt_fill(fused, nf, &s, -8, 8);
        gt_fill(y, n, &s, -1, 1);
        /* fused [gate | up] rows, ld = 2 * cols */
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                double g = fused[(size_t)r * 2 * cols + c], u = fused[(size_t)r * 2 * cols + cols + c];
                want[(size_t)r * cols + c] = g / (1.0 + exp(-g)) * u;
            }
        float *df = gt_upload(fused, nf * 4), *dout = gt_dev(n * 4);
        gt_poison(dout, n * 4);
        assert_int_equal(ty_cuda_silu_mul_f32(dout, df, df + cols, rows, cols, 2 * cols, NULL), 0);
        gt_download(got, dout, n * 4);
        GT_EXPECT_NERR(got, want, n, 1e-6, "silu_mul %dx%d", rows, cols);
        /* residual add: dout += y */
        float *dy = gt_upload(y, n * 4);
        for (size_t i = 0; i < n; i++)
            want[i] += y[i];
        assert_int_equal(ty_cuda_add_f32(dout, dy, n, NULL), 0);
        gt_download(got, dout, n * 4);
        GT_EXPECT_NERR(got, want, n, 1e-6, "add %zu", n);
        cudaFree(df), cudaFree(dout), cudaFree(dy);
        free(fused), free(y), free(got), free(want);
    }
    assert_int_equal(ty_cuda_silu_mul_f32(NULL, NULL, NULL, 2, 4, 3, NULL), TY_EINVAL);
}

static void test_convert(void **state)
{
    enum { N = 100003 };
    uint64_t s = 13;
    float *x = malloc(N * 4), *r = malloc(N * 4), *back = malloc(N * 4);
    uint16_t *want = malloc(N * 2), *got = malloc(N * 2);
    gt_fill(x, N, &s, -70000, 70000);
    for (int i = 0; i < 1000; i++)
        x[i] = gt_uniform(&s, -1e-3f, 1e-3f); /* small and subnormal halves */
    float *dx = gt_upload(x, N * 4);
    void *dh = gt_dev(N * 2);
    float *db = gt_dev(N * 4);
    for (int t = TY_CUDA_F16; t <= TY_CUDA_BF16; t++) {
        memcpy(r, x, N * 4);
        if (t == TY_CUDA_F16) /* keep f16 inputs inside its range */
            for (int i = 0; i < N; i++)
                r[i] = fmaxf(-65000.0f, fminf(65000.0f, r[i]));
        GT_CHECK(cudaMemcpy(dx, r, N * 4, cudaMemcpyHostToDevice));
        gt_encode(want, r, N, (enum ty_cuda_dtype)t);
        gt_poison(dh, N * 2);
        assert_int_equal(ty_cuda_convert(dh, (enum ty_cuda_dtype)t, dx, TY_CUDA_F32, N, NULL), 0);
        gt_download(got, dh, N * 2);
        assert_memory_equal(got, want, N * 2); /* bit-exact round to nearest even */
        gt_poison(db, N * 4);
        assert_int_equal(ty_cuda_convert(db, TY_CUDA_F32, dh, (enum ty_cuda_dtype)t, N, NULL), 0);
        gt_download(back, db, N * 4);
        assert_memory_equal(back, r, N * 4);
    }
    cudaFree(dx), cudaFree(dh), cudaFree(db);
    free(x), free(r), free(back), free(want), free(got);
}

static void test_embed(void **state)
{
    enum { VOCAB = 1001, DIM = 77, T = 19 };
    uint64_t s = 14;
    float *table = malloc(VOCAB * DIM * 4), *got = malloc(T * DIM * 4);
    double *want = malloc(T * DIM * 8);
    void *enc = malloc(VOCAB * DIM * 4);
    int32_t ids[T];
    for (int t = 0; t < T; t++)
        ids[t] = gt_randint(&s, 0, VOCAB - 1);
    ids[0] = 0, ids[1] = VOCAB - 1;
    for (int dt = TY_CUDA_F32; dt <= TY_CUDA_BF16; dt++) {
        gt_fill(table, VOCAB * DIM, &s, -2, 2);
        gt_encode(enc, table, VOCAB * DIM, (enum ty_cuda_dtype)dt);
        void *dtab = gt_upload(enc, VOCAB * DIM * gt_dtype_size(dt));
        int32_t *dids = gt_upload(ids, sizeof(ids));
        float *dout = gt_dev(T * DIM * 4);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < DIM; i++)
                want[t * DIM + i] = table[ids[t] * DIM + i];
        gt_poison(dout, T * DIM * 4);
        assert_int_equal(ty_cuda_embed(dout, dtab, dt, dids, T, DIM, VOCAB, NULL), 0);
        gt_download(got, dout, T * DIM * 4);
        GT_EXPECT_NERR(got, want, T * DIM, 0.0, "embed %s", gt_dtype_name(dt));
        /* an out-of-range id gives NaNs, not another row */
        int32_t bad[2] = {VOCAB, -1};
        GT_CHECK(cudaMemcpy(dids, bad, sizeof(bad), cudaMemcpyHostToDevice));
        assert_int_equal(ty_cuda_embed(dout, dtab, dt, dids, 2, DIM, VOCAB, NULL), 0);
        gt_download(got, dout, 2 * DIM * 4);
        assert_true(isnan(got[0]) && isnan(got[2 * DIM - 1]));
        cudaFree(dtab), cudaFree(dids), cudaFree(dout);
    }
    free(table), free(got), free(want), free(enc);
}

/* RoPE reference written from the RoFormer formula and Meta's apply_scaling. */
static double ref_inv_freq(const struct ty_cuda_rope *r, int rot, int j)
{
    double f = 1.0 / pow(r->theta, (2.0 * j) / rot);
    if (r->llama3_factor <= 0)
        return f;
    double wavelen = 2 * M_PI / f, orig = r->llama3_orig_max_pos;
    if (wavelen < orig / r->llama3_high_freq_factor)
        return f;
    if (wavelen > orig / r->llama3_low_freq_factor)
        return f / r->llama3_factor;
    double smooth = (orig / wavelen - r->llama3_low_freq_factor) /
                    (r->llama3_high_freq_factor - r->llama3_low_freq_factor);
    return (1 - smooth) * f / r->llama3_factor + smooth * f;
}

static void check_rope(const struct ty_cuda_rope *rope, int T, int H, uint64_t *s)
{
    const int hd = rope->head_dim, rot = rope->rot_dim ? rope->rot_dim : hd;
    size_t n = (size_t)T * H * hd;
    float *x = malloc(n * 4), *got = malloc(n * 4);
    double *want = malloc(n * 8);
    int32_t *pos = malloc(T * 4);
    gt_fill(x, n, s, -1, 1);
    for (int t = 0; t < T; t++)
        pos[t] = t < 3 ? t : gt_randint(s, 0, 131071);
    for (size_t i = 0; i < n; i++)
        want[i] = x[i];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < rot / 2; j++) {
                size_t b = ((size_t)t * H + h) * hd;
                int i0 = rope->neox ? j : 2 * j, i1 = rope->neox ? j + rot / 2 : 2 * j + 1;
                double a = pos[t] * ref_inv_freq(rope, rot, j);
                want[b + i0] = x[b + i0] * cos(a) - x[b + i1] * sin(a);
                want[b + i1] = x[b + i0] * sin(a) + x[b + i1] * cos(a);
            }
    float *dx = gt_upload(x, n * 4);
    int32_t *dpos = gt_upload(pos, T * 4);
    assert_int_equal(ty_cuda_rope_f32(dx, dpos, T, H, rope, NULL), 0);
    gt_download(got, dx, n * 4);
    GT_EXPECT_NERR(got, want, n, 1e-6, "rope hd=%d rot=%d neox=%d llama3=%g", hd, rot, rope->neox,
                   rope->llama3_factor);
    cudaFree(dx), cudaFree(dpos);
    free(x), free(got), free(want), free(pos);
}

static void test_rope(void **state)
{
    uint64_t s = 15;
    struct ty_cuda_rope r = {.head_dim = 128, .theta = 10000.0f};
    check_rope(&r, 9, 5, &s);
    r.neox = 1;
    check_rope(&r, 9, 5, &s);
    r = (struct ty_cuda_rope){.head_dim = 8, .theta = 10000.0f}; /* stories260K */
    check_rope(&r, 31, 8, &s);
    r = (struct ty_cuda_rope){.head_dim = 64, .rot_dim = 32, .theta = 10000.0f, .neox = 1};
    check_rope(&r, 7, 3, &s);
    r = (struct ty_cuda_rope){.head_dim = 128, .theta = 500000.0f, .neox = 1,
                              .llama3_factor = 8.0f, .llama3_low_freq_factor = 1.0f,
                              .llama3_high_freq_factor = 4.0f, .llama3_orig_max_pos = 8192};
    check_rope(&r, 13, 4, &s);
    r.neox = 0;
    check_rope(&r, 13, 4, &s);
    r.head_dim = 7;
    assert_int_equal(ty_cuda_rope_f32(NULL, NULL, 1, 1, &r, NULL), TY_EINVAL);
}

static void check_gemm(cublasHandle_t h, enum ty_cuda_dtype dt, int M, int K, int N, uint64_t *s)
{
    float *x = malloc((size_t)M * K * 4), *w = malloc((size_t)N * K * 4), *got = malloc((size_t)M * N * 4);
    double *want = malloc((size_t)M * N * 8);
    void *xe = malloc((size_t)M * K * 4), *we = malloc((size_t)N * K * 4);
    gt_fill(x, (size_t)M * K, s, -1, 1);
    gt_fill(w, (size_t)N * K, s, -1, 1);
    gt_encode(xe, x, (size_t)M * K, dt);
    gt_encode(we, w, (size_t)N * K, dt);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double a = 0;
            for (int k = 0; k < K; k++)
                a += (double)x[(size_t)i * K + k] * w[(size_t)j * K + k];
            want[(size_t)i * N + j] = a;
        }
    size_t es = gt_dtype_size(dt);
    void *dx = gt_upload(xe, (size_t)M * K * es), *dw = gt_upload(we, (size_t)N * K * es);
    float *dy = gt_dev((size_t)M * N * 4);
    gt_poison(dy, (size_t)M * N * 4);
    assert_int_equal(ty_cuda_gemm((ty_cublas_t)h, dy, dx, dw, dt, M, K, N), 0);
    gt_download(got, dy, (size_t)M * N * 4);
    GT_EXPECT_NERR(got, want, (size_t)M * N, dt == TY_CUDA_F32 ? 1e-6 : 1e-5, "gemm %s %dx%dx%d",
                   gt_dtype_name(dt), M, K, N);
    cudaFree(dx), cudaFree(dw), cudaFree(dy);
    free(x), free(w), free(got), free(want), free(xe), free(we);
}

static void test_gemm(void **state)
{
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    uint64_t s = 16;
    static const int shapes[][3] = {{1, 64, 32}, {7, 288, 768}, {33, 65, 17}, {64, 1024, 512}, {1, 4096, 3}};
    for (int dt = TY_CUDA_F32; dt <= TY_CUDA_BF16; dt++)
        for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++)
            check_gemm(h, (enum ty_cuda_dtype)dt, shapes[k][0], shapes[k][1], shapes[k][2], &s);
    cublasDestroy(h);
}

/* kv_write into shuffled pages, then gather those pages, scatter them into a second pool and
 * check every element against a host model of the layout (page, kv_head, token, head_dim). */
static void check_kv(enum ty_cuda_dtype dt, int n_kv, int B, int hd, int n_pages, int T,
                     uint64_t *s)
{
    struct ty_cuda_kv_layout l = {dt, n_kv, B, hd, n_pages};
    size_t es = gt_dtype_size(dt), page = ty_cuda_kv_page_bytes(&l);
    assert_int_equal(page, (size_t)n_kv * B * hd * es);
    size_t pool_elems = (size_t)n_pages * n_kv * B * hd, row = (size_t)n_kv * hd;
    float *k = malloc(T * row * 4), *v = malloc(T * row * 4);
    gt_fill(k, T * row, s, -4, 4);
    gt_fill(v, T * row, s, -4, 4);
    int32_t *slots = malloc(T * 4), *perm = malloc(n_pages * 4);
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = gt_randint(s, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int used = (T + B - 1) / B;
    for (int t = 0; t < T; t++)
        slots[t] = perm[t / B] * B + t % B;
    if (T > 2)
        slots[1] = -1; /* padding row: must not be written */
    void *kp = gt_dev(pool_elems * es), *vp = gt_dev(pool_elems * es);
    GT_CHECK(cudaMemset(kp, 0, pool_elems * es));
    GT_CHECK(cudaMemset(vp, 0, pool_elems * es));
    float *dk = gt_upload(k, T * row * 4), *dv = gt_upload(v, T * row * 4);
    int32_t *dslots = gt_upload(slots, T * 4);
    assert_int_equal(ty_cuda_kv_write(kp, vp, &l, dk, dv, dslots, T, NULL), 0);
    char *hk = malloc(pool_elems * es), *want = calloc(pool_elems, es);
    gt_download(hk, kp, pool_elems * es);
    for (int t = 0; t < T; t++) {
        if (slots[t] < 0)
            continue;
        for (int h = 0; h < n_kv; h++) {
            size_t dst = (((size_t)(slots[t] / B) * n_kv + h) * B + slots[t] % B) * hd;
            gt_encode(want + dst * es, k + t * row + h * hd, hd, dt);
        }
    }
    assert_memory_equal(hk, want, pool_elems * es);
    char *wantv = calloc(pool_elems, es);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_kv && slots[t] >= 0; h++) {
            size_t dst = (((size_t)(slots[t] / B) * n_kv + h) * B + slots[t] % B) * hd;
            gt_encode(wantv + dst * es, v + t * row + h * hd, hd, dt);
        }
    gt_download(hk, vp, pool_elems * es);
    assert_memory_equal(hk, wantv, pool_elems * es);
    free(wantv);
    /* gather the request's pages, scatter into a fresh pool at other ids */
    int32_t *dperm = gt_upload(perm, used * 4);
    char *dcontig = gt_dev(used * page), *dpool2 = gt_dev(pool_elems * es);
    gt_poison(dcontig, used * page);
    GT_CHECK(cudaMemset(dpool2, 0, pool_elems * es));
    assert_int_equal(ty_cuda_kv_copy_pages(kp, dcontig, dperm, used, page, 0, NULL), 0);
    char *hc = malloc(used * page);
    gt_download(hc, dcontig, used * page);
    for (int i = 0; i < used; i++)
        assert_memory_equal(hc + i * page, want + perm[i] * page, page);
    int32_t *rev = malloc(used * 4);
    for (int i = 0; i < used; i++)
        rev[i] = n_pages - 1 - i;
    int32_t *drev = gt_upload(rev, used * 4);
    assert_int_equal(ty_cuda_kv_copy_pages(dpool2, dcontig, drev, used, page, 1, NULL), 0);
    gt_download(hk, dpool2, pool_elems * es);
    for (int i = 0; i < used; i++)
        assert_memory_equal(hk + rev[i] * page, want + perm[i] * page, page);
    cudaFree(kp), cudaFree(vp), cudaFree(dk), cudaFree(dv), cudaFree(dslots), cudaFree(dperm);
    cudaFree(dcontig), cudaFree(dpool2), cudaFree(drev);
    free(k), free(v), free(slots), free(perm), free(hk), free(want), free(hc), free(rev);
}

static void test_kv_pages(void **state)
{
    uint64_t s = 17;
    for (int dt = TY_CUDA_F32; dt <= TY_CUDA_BF16; dt++) {
        check_kv((enum ty_cuda_dtype)dt, 4, 16, 8, 9, 37, &s);
        check_kv((enum ty_cuda_dtype)dt, 8, 64, 128, 6, 200, &s);
        check_kv((enum ty_cuda_dtype)dt, 1, 7, 4, 11, 50, &s); /* page bytes not a multiple of 16 */
    }
}

int main(void)
{
    gt_require_gpu("test_gpu_ops_basic");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm), cmocka_unit_test(test_add_and_silu_mul),
        cmocka_unit_test(test_convert), cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rope),    cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_kv_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
