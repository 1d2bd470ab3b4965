/* GPU op tests, part 2: paged decode attention (with and without context splits) and causal
 * prefill attention (chunks with cached prefixes, GQA/MQA/MHA, head dims 8..256, page sizes
 * 7..64, f32/f16/bf16 pools) against a double-precision softmax(q k^T * scale) v written from
 * the definition. Pages of every sequence are drawn at random from the pool, so a kernel that
 * ignores the block table or the page layout reads the wrong tokens and fails. With a sliding
 * window the block table entries of pages wholly before it (released by the engine) name a
 * page of NaNs, so a kernel that reads them fails too. */
#include "gpu_attn_ref.h"

struct dcase {
    int n_heads, n_kv, hd, B, n_seqs;
    int lens[8];
};

static void check_decode(const struct dcase *c, enum ty_cuda_dtype dt, int window, uint64_t *s)
{
    struct pool p;
    int first[8];
    for (int i = 0; i < c->n_seqs; i++)
        first[i] = win_first(c->lens[i] - 1, window);
    pool_make(&p, dt, c->n_kv, c->B, c->hd, c->lens, window ? first : NULL, c->n_seqs, s);
    const int H = c->n_heads, hd = c->hd, G = H / c->n_kv;
    int max_len = 0;
    for (int i = 0; i < c->n_seqs; i++)
        max_len = c->lens[i] > max_len ? c->lens[i] : max_len;
    size_t nq = (size_t)c->n_seqs * H * hd;
    float *q = malloc(nq * 4), *got = malloc(nq * 4);
    double *want = malloc(nq * 8), *sc = malloc((size_t)max_len * 8);
    gt_fill(q, nq, s, -2, 2);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < c->n_seqs; i++)
        for (int h = 0; h < H; h++)
            ref_attend(&p, i, h / G, q + ((size_t)i * H + h) * hd, first[i], c->lens[i], scale,
                       want + ((size_t)i * H + h) * hd, sc);
    struct ty_cuda_attn_shape sh = {H, c->n_kv, hd, scale, p.max_pages, window};
    size_t ws = ty_cuda_attn_decode_workspace(&sh, c->n_seqs, max_len);
    void *dws = ws ? gt_dev(ws) : NULL;
    float *dq = gt_upload(q, nq * 4), *dout = gt_dev(nq * 4);
    int32_t *dlens = gt_upload(c->lens, c->n_seqs * 4);
    gt_poison(dout, nq * 4);
    if (dws)
        gt_poison(dws, ws);
    assert_int_equal(ty_cuda_attn_decode(dout, dq, p.dk, p.dv, &p.l, &sh, p.dtables, dlens,
                                         c->n_seqs, max_len, dws, NULL),
                     0);
    gt_download(got, dout, nq * 4);
    GT_EXPECT_NERR(got, want, nq, 2e-5,
                   "decode %s H=%d kv=%d hd=%d B=%d seqs=%d max_len=%d ws=%zu window=%d",
                   gt_dtype_name(dt), H, c->n_kv, hd, c->B, c->n_seqs, max_len, ws, window);
    if (dws)
        cudaFree(dws);
    cudaFree(dq), cudaFree(dout), cudaFree(dlens);
    free(q), free(got), free(want), free(sc);
    pool_free(&p);
}

static void test_decode(void **state)
{
    static const struct dcase cases[] = {
        {8, 4, 8, 16, 3, {1, 17, 300}},                     /* stories260K shape */
        {32, 8, 128, 64, 5, {4097, 1, 65, 2000, 5000}},      /* llama-3-8B heads, long: splits */
        {32, 2, 64, 16, 2, {129, 3000}},                     /* G = 16: two head groups */
        {12, 12, 80, 32, 4, {31, 32, 33, 999}},              /* MHA, head_dim 80 */
        {16, 1, 256, 64, 1, {1500}},                         /* MQA, head_dim 256 */
        {6, 3, 4, 7, 3, {6, 7, 50}},                         /* odd page size */
        /* the bandwidth path (head_dim 64/128): 1, 2 or 4 heads per block, masked heads,
         * one split and many, one-token and odd pages, a 32k context */
        {8, 8, 128, 16, 3, {1, 300, 1000}},                  /* G = 1, splits */
        {4, 4, 64, 64, 2, {5, 20}},                          /* G = 1, one split */
        {16, 8, 128, 32, 4, {17, 255, 513, 2048}},           /* G = 2 */
        {8, 4, 64, 16, 3, {1, 33, 1500}},                    /* G = 2, hd 64 */
        {12, 4, 128, 16, 3, {100, 777, 3}},                  /* group 3: a masked head */
        {12, 4, 64, 64, 2, {250, 1}},                        /* group 3, one split */
        {24, 4, 64, 64, 2, {300, 4000}},                     /* group 6: blocks of 4 + 2 */
        {32, 4, 128, 64, 2, {63, 3333}},                     /* group 8: two blocks of 4 */
        {10, 2, 128, 16, 2, {1, 999}},                       /* group 5: 4 + 1 */
        {96, 96, 64, 16, 8, {1000, 1, 17, 64, 65, 999, 250, 31}}, /* many blocks */
        {32, 8, 128, 64, 8, {256, 512, 16, 15, 1, 4096, 64, 100}},
        {8, 2, 64, 7, 3, {1, 50, 700}},                      /* odd page size */
        {8, 2, 128, 1, 2, {3, 300}},                         /* one-token pages */
        {4, 1, 128, 64, 1, {32768}},                         /* long single context, MQA */
    };
    uint64_t s = 21;
    for (int dt = TY_CUDA_F32; dt <= TY_CUDA_BF16; dt++)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            check_decode(&cases[i], (enum ty_cuda_dtype)dt, 0, &s);
}

/* Sliding windows (Mistral): shorter and longer than the contexts, across page and split
 * boundaries, on the general and the bandwidth paths. */
static void test_decode_window(void **state)
{
    static const struct dcase cases[] = {
        {8, 4, 8, 16, 3, {1, 17, 300}},
        {32, 8, 128, 64, 5, {4097, 1, 65, 2000, 5000}},
        {12, 4, 64, 16, 3, {100, 777, 3}},
        {8, 2, 64, 7, 3, {1, 50, 700}},
    };
    static const int windows[] = {1, 32, 33, 1000};
    uint64_t s = 23;
    for (int dt = TY_CUDA_F32; dt <= TY_CUDA_BF16; dt++)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            for (size_t w = 0; w < sizeof(windows) / sizeof(windows[0]); w++)
                check_decode(&cases[i], (enum ty_cuda_dtype)dt, windows[w], &s);
}

struct pcase {
    int n_heads, n_kv, hd, B, n_chunks;
    int q_lens[6], kv_lens[6];
};

static void check_prefill(const struct pcase *c, enum ty_cuda_dtype dt, int window, uint64_t *s)
{
    struct pool p;
    int first[6];
    for (int i = 0; i < c->n_chunks; i++) /* what the chunk's first row sees */
        first[i] = win_first(c->kv_lens[i] - c->q_lens[i], window);
    pool_make(&p, dt, c->n_kv, c->B, c->hd, c->kv_lens, window ? first : NULL, c->n_chunks, s);
    const int H = c->n_heads, hd = c->hd, G = H / c->n_kv;
    int rows = 0, max_q = 0, max_kv = 0, starts[6];
    for (int i = 0; i < c->n_chunks; i++) {
        starts[i] = rows;
        rows += c->q_lens[i];
        max_q = c->q_lens[i] > max_q ? c->q_lens[i] : max_q;
        max_kv = c->kv_lens[i] > max_kv ? c->kv_lens[i] : max_kv;
    }
    size_t nq = (size_t)rows * H * hd;
    float *q = malloc(nq * 4), *got = malloc(nq * 4);
    double *want = malloc(nq * 8), *sc = malloc((size_t)max_kv * 8);
    gt_fill(q, nq, s, -2, 2);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < c->n_chunks; i++)
        for (int r = 0; r < c->q_lens[i]; r++)
            for (int h = 0; h < H; h++) {
                size_t o = ((size_t)(starts[i] + r) * H + h) * hd;
                int vis = c->kv_lens[i] - c->q_lens[i] + r + 1; /* causal */
                ref_attend(&p, i, h / G, q + o, win_first(vis - 1, window), vis, scale,
                           want + o, sc);
            }
    struct ty_cuda_attn_shape sh = {H, c->n_kv, hd, scale, p.max_pages, window};
    float *dq = gt_upload(q, nq * 4), *dout = gt_dev(nq * 4);
    int32_t *dst = gt_upload(starts, c->n_chunks * 4), *dql = gt_upload(c->q_lens, c->n_chunks * 4);
    int32_t *dkl = gt_upload(c->kv_lens, c->n_chunks * 4);
    gt_poison(dout, nq * 4);
    assert_int_equal(ty_cuda_attn_prefill(dout, dq, p.dk, p.dv, &p.l, &sh, p.dtables, dst, dql,
                                          dkl, c->n_chunks, max_q, NULL),
                     0);
    gt_download(got, dout, nq * 4);
    /* 16-bit pools with head_dim 64/128 run on tensor cores, which round q and the softmax
     * weights to the pool's type too (as FlashAttention does): f16 keeps 11 significant bits,
     * bf16 8. Every other shape (and every window: no tensor-core path yet) computes in f32. */
    const bool tc = dt != TY_CUDA_F32 && (hd == 64 || hd == 128) && !window;
    const double tol = !tc ? 2e-5 : dt == TY_CUDA_F16 ? 2e-3 : 1e-2;
    GT_EXPECT_NERR(got, want, nq, tol,
                   "prefill %s H=%d kv=%d hd=%d B=%d chunks=%d rows=%d window=%d",
                   gt_dtype_name(dt), H, c->n_kv, hd, c->B, c->n_chunks, rows, window);
    cudaFree(dq), cudaFree(dout), cudaFree(dst), cudaFree(dql), cudaFree(dkl);
    free(q), free(got), free(want), free(sc);
    pool_free(&p);
}

static void test_prefill(void **state)
{
    static const struct pcase cases[] = {
        {8, 4, 8, 16, 2, {1, 37}, {1, 37}},                         /* stories260K shape */
        {8, 2, 64, 16, 4, {20, 130, 1, 64}, {100, 130, 77, 64}},    /* cached prefixes */
        {32, 8, 128, 64, 2, {257, 31}, {257, 1000}},
        {12, 12, 80, 32, 3, {33, 5, 70}, {33, 40, 70}},             /* MHA, head_dim 80 */
        {16, 1, 256, 64, 1, {45}, {100}},                           /* MQA, head_dim 256 */
        {6, 3, 4, 7, 2, {13, 50}, {20, 50}},                        /* odd page size */
        {4, 4, 128, 16, 1, {300}, {300}},                           /* page < tile */
        /* tensor-core path (16-bit pools): several row and key tiles, partial last tiles,
         * prefixes that are not a multiple of the tile, a one-row chunk, GQA 4 and MHA */
        {16, 4, 128, 16, 3, {200, 64, 1}, {700, 64, 300}},
        {8, 8, 64, 7, 2, {129, 65}, {129, 500}},
    };
    uint64_t s = 22;
    for (int dt = TY_CUDA_F32; dt <= TY_CUDA_BF16; dt++)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            check_prefill(&cases[i], (enum ty_cuda_dtype)dt, 0, &s);
}

static void test_prefill_window(void **state)
{
    static const struct pcase cases[] = {
        {8, 4, 8, 16, 2, {1, 37}, {1, 37}},
        {8, 2, 64, 16, 4, {20, 130, 1, 64}, {100, 130, 77, 64}},
        {16, 4, 128, 16, 3, {200, 64, 1}, {700, 64, 300}},
        {6, 3, 4, 7, 2, {13, 50}, {20, 50}},
    };
    static const int windows[] = {1, 16, 33, 500};
    uint64_t s = 24;
    for (int dt = TY_CUDA_F32; dt <= TY_CUDA_BF16; dt++)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            for (size_t w = 0; w < sizeof(windows) / sizeof(windows[0]); w++)
                check_prefill(&cases[i], (enum ty_cuda_dtype)dt, windows[w], &s);
}

static void test_rejects_bad_shapes(void **state)
{
    struct ty_cuda_kv_layout l = {TY_CUDA_F16, 4, 16, 64, 10};
    struct ty_cuda_attn_shape sh = {6, 4, 64, 0.125f, 4, 0}; /* 6 heads over 4 kv heads */
    assert_int_equal(ty_cuda_attn_decode(NULL, NULL, NULL, NULL, &l, &sh, NULL, NULL, 1, 10,
                                         NULL, NULL),
                     TY_EINVAL);
    sh = (struct ty_cuda_attn_shape){8, 4, 66, 0.125f, 4, 0}; /* head_dim not a multiple of 4 */
    assert_int_equal(ty_cuda_attn_prefill(NULL, NULL, NULL, NULL, &l, &sh, NULL, NULL, NULL, NULL,
                                          1, 10, NULL),
                     TY_EINVAL);
    sh = (struct ty_cuda_attn_shape){8, 4, 64, 0.125f, 4, 0};
    assert_int_equal(ty_cuda_attn_decode(NULL, NULL, NULL, NULL, &l, &sh, NULL, NULL, 1, 65,
                                         NULL, NULL),
                     TY_EINVAL); /* max_seq_len beyond max_pages * page_tokens */
    sh = (struct ty_cuda_attn_shape){8, 4, 64, 0.125f, 4, -1}; /* negative window */
    assert_int_equal(ty_cuda_attn_prefill(NULL, NULL, NULL, NULL, &l, &sh, NULL, NULL, NULL, NULL,
                                          1, 10, NULL),
                     TY_EINVAL);
}

int main(void)
{
    gt_require_gpu("test_gpu_attention");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_prefill),
        cmocka_unit_test(test_decode_window),
        cmocka_unit_test(test_prefill_window),
        cmocka_unit_test(test_rejects_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
