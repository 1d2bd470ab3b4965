/* gpt-oss's kernels against loops written from the CPU backend's definitions (cpu/forward.c):
 *   - attention sinks: the rescaled output of ty_cuda_attn_sinks equals the softmax with the
 *     sink logit in its denominator (softmax_row's sink), for decode rows and prefill chunks,
 *     windows, GQA, f32 and f16 pools, pages in a scrambled order;
 *   - SwiGLU-OAI (swiglu_oai) on values across its clamps, the bias add;
 *   - top-k-then-softmax routing with a router bias (moe_route's moe_topk_softmax), ties to
 *     the lower index; the per-expert bias of the expert product.
 * Outputs poisoned with NaN first where the kernel writes them. */
#include "gpu_test_util.h"

/* ---- attention sinks ----------------------------------------------------------------------- */

struct scase {
    int n_heads, n_kv, hd, B, window;
    enum ty_cuda_dtype type;
};

/* One sequence of `len` keys; rows are decode (1 row at position len-1) or a chunk of n rows
 * ending at len-1. Reference: double softmax over the row's keys, with and without the sink. */
static void sink_case(const struct scase *c, int len, int chunk, uint64_t *rng)
{
    int H = c->n_heads, KV = c->n_kv, hd = c->hd, B = c->B, rows = chunk ? chunk : 1;
    int n_pages = (len + B - 1) / B + 1, grp = H / KV;
    size_t pool = (size_t)n_pages * KV * B * hd, es = gt_dtype_size(c->type);
    float *kf = malloc(pool * 4), *vf = malloc(pool * 4), *q = malloc((size_t)rows * H * hd * 4);
    float *sinks = malloc((size_t)H * 4), *out = malloc((size_t)rows * H * hd * 4);
    double *want = malloc((size_t)rows * H * hd * 8);
    void *kenc = malloc(pool * es);
    int32_t table[512], pos[512];
    gt_fill(kf, pool, rng, -1, 1);
    gt_fill(vf, pool, rng, -1, 1);
    gt_fill(q, (size_t)rows * H * hd, rng, -1, 1);
    gt_fill(sinks, H, rng, -2, 4);
    gt_encode(kenc, kf, pool, c->type); /* the reference reads K as stored */
    for (int i = 0; i < n_pages - 1; i++)
        table[i] = n_pages - 1 - i; /* scrambled: page 0 never used */
    float scale = 1.0f / sqrtf((float)hd);
    for (int r = 0; r < rows; r++) {
        int p = len - rows + r, first = c->window && p >= c->window ? p - c->window + 1 : 0;
        pos[r] = p;
        for (int h = 0; h < H; h++) {
            double s[4096], mx = -INFINITY, l = 0, o[256] = {0};
            const float *qr = q + ((size_t)r * H + h) * hd;
            for (int j = first; j <= p; j++) {
                const float *k = kf + (((size_t)table[j / B] * KV + h / grp) * B + j % B) * hd;
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)qr[i] * k[i];
                s[j - first] = d * scale;
                mx = s[j - first] > mx ? s[j - first] : mx;
            }
            for (int j = first; j <= p; j++) {
                const float *v = vf + (((size_t)table[j / B] * KV + h / grp) * B + j % B) * hd;
                double e = exp(s[j - first] - mx);
                l += e;
                for (int i = 0; i < hd; i++)
                    o[i] += e * v[i];
            }
            double ls = l + exp((double)sinks[h] - mx);
            for (int i = 0; i < hd; i++) {
                out[((size_t)r * H + h) * hd + i] = (float)(o[i] / l); /* sink-free input */
                want[((size_t)r * H + h) * hd + i] = o[i] / ls;
            }
        }
    }
    void *dk = gt_upload(kenc, pool * es);
    float *dq = gt_upload(q, (size_t)rows * H * hd * 4);
    float *dout = gt_upload(out, (size_t)rows * H * hd * 4), *ds = gt_upload(sinks, (size_t)H * 4);
    int32_t *dtab = gt_upload(table, sizeof(table)), *dpos = gt_upload(pos, rows * 4);
    int32_t qs0 = 0, *dqs = gt_upload(&qs0, 4);
    struct ty_cuda_kv_layout l = {c->type, KV, B, hd, n_pages};
    struct ty_cuda_attn_shape sh = {H, KV, hd, scale, n_pages - 1, c->window};
    struct ty_cuda_attn_rows rr = chunk ? (struct ty_cuda_attn_rows){0, NULL, 0, 1, dtab, dqs,
                                                                     n_pages - 1}
                                        : (struct ty_cuda_attn_rows){1, dtab, n_pages - 1, 0,
                                                                     NULL, NULL, 0};
    assert_int_equal(ty_cuda_attn_sinks(dout, dq, dk, &l, &sh, ds, dpos, rows, &rr, NULL), 0);
    gt_download(out, dout, (size_t)rows * H * hd * 4);
    GT_EXPECT_NERR(out, want, (size_t)rows * H * hd, 1e-5, "sinks len %d rows %d hd %d %s win %d",
                   len, rows, hd, gt_dtype_name(c->type), c->window);
    free(kf), free(vf), free(q), free(sinks), free(out), free(want), free(kenc);
    cudaFree(dk), cudaFree(dq), cudaFree(dout), cudaFree(ds), cudaFree(dtab), cudaFree(dpos),
        cudaFree(dqs);
}

static void test_sinks(void **state)
{
    static const struct scase cases[] = {
        {8, 1, 64, 16, 0, TY_CUDA_F32},   /* gpt-oss: head_dim 64, GQA 8 */
        {8, 1, 64, 16, 128, TY_CUDA_F16}, /* its sliding layers: 128-token window */
        {4, 2, 8, 7, 5, TY_CUDA_F32},
    };
    uint64_t rng = 5;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sink_case(&cases[i], 1, 0, &rng);
        sink_case(&cases[i], 300, 0, &rng);
        sink_case(&cases[i], 40, 40, &rng);
        sink_case(&cases[i], 250, 17, &rng);
    }
}

/* ---- SwiGLU-OAI, bias ---------------------------------------------------------------------- */

static void test_swiglu_oai_and_bias(void **state)
{
    enum { R = 5, C = 300 };
    uint64_t rng = 9;
    float gu[R * 2 * C], got[R * C], bias[C], y[R * C];
    double want[R * C];
    gt_fill(gu, R * 2 * C, &rng, -12, 12); /* across both clamps (7) */
    gt_fill(bias, C, &rng, -1, 1);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) { /* the CPU's swiglu_oai */
            float g = gu[r * 2 * C + c], u = gu[r * 2 * C + C + c];
            g = g < 7.0f ? g : 7.0f;
            u = u < -7.0f ? -7.0f : u > 7.0f ? 7.0f : u;
            want[r * C + c] = g / (1.0f + expf(1.702f * -g)) * (u + 1.0f);
        }
    float *dgu = gt_upload(gu, sizeof(gu)), *dout = gt_dev(sizeof(got));
    gt_poison(dout, sizeof(got));
    assert_int_equal(ty_cuda_swiglu_oai_f32(dout, dgu, dgu + C, R, C, 2 * C, NULL), 0);
    gt_download(got, dout, sizeof(got));
    GT_EXPECT_NERR(got, want, R * C, 1e-6, "swiglu_oai");
    for (int i = 0; i < R * C; i++)
        want[i] = (double)got[i] + bias[i % C];
    float *db = gt_upload(bias, sizeof(bias));
    assert_int_equal(ty_cuda_add_bias_f32(dout, db, R, C, NULL), 0);
    gt_download(y, dout, sizeof(y));
    GT_EXPECT_NERR(y, want, R * C, 1e-7, "add_bias");
    cudaFree(dgu), cudaFree(dout), cudaFree(db);
}

/* ---- routing and expert biases ------------------------------------------------------------- */

static void test_route_topk_softmax(void **state)
{
    enum { T = 9, E = 32, K = 4 };
    uint64_t rng = 13;
    float lg[T * E], bias[E], w[T * K];
    int32_t sel[T * K];
    for (int i = 0; i < T * E; i++)
        lg[i] = 0.25f * (float)gt_randint(&rng, -20, 20);
    for (int e = 0; e < E; e++)
        bias[e] = 0.125f * (float)gt_randint(&rng, -4, 4);
    for (int e = 0; e < E; e++) /* row 2: all equal after the bias: experts 0..K-1 */
        lg[2 * E + e] = 3.0f - bias[e];
    float *dl = gt_upload(lg, sizeof(lg)), *db = gt_upload(bias, sizeof(bias));
    float *dw = gt_dev(sizeof(w));
    int32_t *ds = gt_dev(sizeof(sel));
    gt_poison(dw, sizeof(w));
    assert_int_equal(ty_cuda_moe_route_topk_softmax(ds, dw, dl, db, T, E, K, 0, NULL), 0);
    gt_download(w, dw, sizeof(w));
    gt_download(sel, ds, sizeof(sel));
    for (int t = 0; t < T; t++) { /* the CPU: top_k on logits + bias, softmax of the picks */
        float p[E], pw[K], mx = -INFINITY;
        double sum = 0, want[K];
        for (int e = 0; e < E; e++)
            p[e] = lg[t * E + e] + bias[e];
        for (int k = 0; k < K; k++) {
            int best = 0;
            for (int e = 1; e < E; e++)
                best = p[e] > p[best] ? e : best;
            if (sel[t * K + k] != best)
                fail_msg("topk_softmax token %d slot %d picked %d, CPU %d", t, k, sel[t * K + k],
                         best);
            pw[k] = p[best];
            p[best] = -INFINITY;
            mx = pw[k] > mx ? pw[k] : mx;
        }
        for (int k = 0; k < K; k++)
            sum += want[k] = expf(pw[k] - mx);
        for (int k = 0; k < K; k++)
            want[k] /= sum;
        GT_EXPECT_NERR(w + t * K, want, K, 1e-6, "topk_softmax weights t%d", t);
    }
    cudaFree(dl), cudaFree(db), cudaFree(dw), cudaFree(ds);
}

static void test_matvec_bias(void **state)
{
    enum { S = 6, E = 4, ROWS = 70, COLS = 40 };
    uint64_t rng = 17;
    float w[E * ROWS * COLS], x[S * COLS], b[E * ROWS], y[S * ROWS];
    int32_t sel[S];
    double want[S * ROWS];
    gt_fill(w, E * ROWS * COLS, &rng, -1, 1);
    gt_fill(x, S * COLS, &rng, -1, 1);
    gt_fill(b, E * ROWS, &rng, -1, 1);
    for (int s = 0; s < S; s++)
        sel[s] = gt_randint(&rng, 0, E - 1);
    for (int s = 0; s < S; s++)
        for (int r = 0; r < ROWS; r++) {
            double acc = 0;
            for (int i = 0; i < COLS; i++)
                acc += (double)w[((size_t)sel[s] * ROWS + r) * COLS + i] * x[s * COLS + i];
            want[s * ROWS + r] = acc + b[sel[s] * ROWS + r];
        }
    float *dw = gt_upload(w, sizeof(w)), *dx = gt_upload(x, sizeof(x));
    float *db = gt_upload(b, sizeof(b));
    float *dy = gt_dev(sizeof(y));
    int32_t *ds = gt_upload(sel, sizeof(sel));
    gt_poison(dy, sizeof(y));
    assert_int_equal(ty_cuda_moe_matvec_bias(dy, dx, 1, dw, TY_CUDA_F32, db, ds, S, ROWS, COLS,
                                             NULL), 0);
    gt_download(y, dy, sizeof(y));
    GT_EXPECT_NERR(y, want, S * ROWS, 1e-6, "matvec_bias");
    cudaFree(dw), cudaFree(dx), cudaFree(db), cudaFree(dy), cudaFree(ds);
}

int main(void)
{
    gt_require_gpu("test_gpu_gptoss");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sinks),
        cmocka_unit_test(test_swiglu_oai_and_bias),
        cmocka_unit_test(test_route_topk_softmax),
        cmocka_unit_test(test_matvec_bias),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
