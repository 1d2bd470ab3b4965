/* GPU op tests, part 3: greedy and temperature/top-k/top-p sampling on device against a CPU
 * reference that sorts the row (the textbook definition) and then walks the kept tokens in
 * index order with the same uniform draw u. Rows whose draw lands within rounding distance
 * of a boundary are counted as ambiguous instead of compared; they must stay rare. */
#include "gpu_test_util.h"

static int cmp_desc(const void *a, const void *b, void *ctx)
{
    const float *x = ctx;
    float xa = x[*(const int *)a], xb = x[*(const int *)b];
    return xa < xb ? 1 : xa > xb ? -1 : 0;
}

static const float *g_sort_x;
static int cmp_desc_g(const void *a, const void *b) { return cmp_desc(a, b, (void *)g_sort_x); }

static int ref_argmax(const float *l, int vocab)
{
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

/* Returns the reference pick, or -1 when the draw is too close to a boundary to decide. */
static int ref_sample(const float *logits, int vocab, float t, int k, float p, float u)
{
    if (!(t > 0))
        return ref_argmax(logits, vocab);
    float *x = malloc(vocab * 4), inv = 1.0f / t;
    int *idx = malloc(vocab * sizeof(int)), res = -1;
    for (int i = 0; i < vocab; i++)
        x[i] = logits[i] * inv, idx[i] = i;
    g_sort_x = x;
    qsort(idx, vocab, sizeof(int), cmp_desc_g);
    double m = x[idx[0]];
    float cut = -INFINITY;
    if (k >= 1 && k < vocab)
        cut = x[idx[k - 1]];
    if (p < 1) {
        double z = 0, run = 0;
        for (int i = 0; i < vocab && x[idx[i]] >= cut; i++)
            z += exp(x[idx[i]] - m);
        for (int i = 0; i < vocab && x[idx[i]] >= cut; i++) {
            run += exp(x[idx[i]] - m);
            if (run >= p * z) {
                if (fabs(run - p * z) < 1e-5 * z || fabs(run - exp(x[idx[i]] - m) - p * z) < 1e-5 * z)
                    goto out; /* top-p boundary within rounding */
                cut = x[idx[i]];
                break;
            }
        }
    }
    double z = 0, run = 0;
    for (int i = 0; i < vocab; i++)
        if (x[i] >= cut)
            z += exp(x[i] - m);
    for (int i = 0; i < vocab; i++) {
        if (x[i] < cut)
            continue;
        double w = exp(x[i] - m);
        if (run + w > u * z) {
            if (fabs(run + w - u * z) < 1e-5 * z || fabs(run - u * z) < 1e-5 * z)
                goto out;
            res = i;
            break;
        }
        run += w;
    }
out:
    free(x), free(idx);
    return res;
}

static void test_greedy(void **state)
{
    static const int vocabs[] = {1, 7, 1000, 32000, 128256};
    uint64_t s = 31;
    for (size_t v = 0; v < sizeof(vocabs) / sizeof(vocabs[0]); v++) {
        const int V = vocabs[v], R = 9;
        float *l = malloc((size_t)R * V * 4);
        gt_fill(l, (size_t)R * V, &s, -20, 20);
        if (V > 200) { /* equal maxima: the lowest index wins */
            l[5] = l[150] = 1000.0f;
            l[V + V - 1] = l[V + 3] = 500.0f;
        }
        for (int i = 0; i < V; i++)
            l[(size_t)2 * V + i] = -1e30f; /* all equal and very negative */
        int32_t got[9];
        float *dl = gt_upload(l, (size_t)R * V * 4);
        int32_t *dids = gt_dev(sizeof(got));
        gt_poison(dids, sizeof(got));
        assert_int_equal(ty_cuda_sample_greedy(dids, dl, R, V, NULL), 0);
        gt_download(got, dids, sizeof(got));
        for (int r = 0; r < R; r++)
            assert_int_equal(got[r], ref_argmax(l + (size_t)r * V, V));
        cudaFree(dl), cudaFree(dids);
        free(l);
    }
}

static void test_topk_topp(void **state)
{
    static const int vocabs[] = {1, 7, 1000, 32000, 128256};
    static const struct {
        float t;
        int k;
        float p;
    } params[] = {{0, 0, 1}, {1, 0, 1}, {0.7f, 40, 1}, {1, 0, 0.9f}, {0.8f, 50, 0.95f},
                  {1.3f, 1, 1}, {1, 1 << 30, 0.5f}, {2, 3, 0.1f}, {0.5f, 0, 0.99f}, {1, 2, 1}};
    enum { NP = sizeof(params) / sizeof(params[0]), REP = 4, R = NP * REP };
    uint64_t s = 32;
    int compared = 0, ambiguous = 0;
    for (size_t v = 0; v < sizeof(vocabs) / sizeof(vocabs[0]); v++) {
        const int V = vocabs[v];
        float *l = malloc((size_t)R * V * 4), temp[R], top_p[R], u[R];
        int32_t top_k[R], got[R];
        gt_fill(l, (size_t)R * V, &s, -6, 6);
        for (int r = 0; r < R; r++) {
            temp[r] = params[r % NP].t, top_k[r] = params[r % NP].k, top_p[r] = params[r % NP].p;
            u[r] = (float)gt_u01(&s);
        }
        float *dl = gt_upload(l, (size_t)R * V * 4), *dt = gt_upload(temp, sizeof(temp));
        float *dp = gt_upload(top_p, sizeof(top_p)), *du = gt_upload(u, sizeof(u));
        int32_t *dk = gt_upload(top_k, sizeof(top_k)), *dids = gt_dev(sizeof(got));
        gt_poison(dids, sizeof(got));
        assert_int_equal(ty_cuda_sample_topkp(dids, dl, dt, dk, dp, du, R, V, NULL), 0);
        gt_download(got, dids, sizeof(got));
        for (int r = 0; r < R; r++) {
            int want = ref_sample(l + (size_t)r * V, V, temp[r], top_k[r], top_p[r], u[r]);
            if (want < 0) {
                ambiguous++;
                continue;
            }
            compared++;
            if (got[r] != want)
                fail_msg("vocab %d row %d (t=%g k=%d p=%g u=%g): got %d want %d", V, r, temp[r],
                         top_k[r], top_p[r], u[r], got[r], want);
        }
        cudaFree(dl), cudaFree(dt), cudaFree(dp), cudaFree(du), cudaFree(dk), cudaFree(dids);
        free(l);
    }
    printf("  topk/topp: %d rows compared, %d ambiguous\n", compared, ambiguous);
    assert_true(ambiguous * 20 <= compared + ambiguous);
}

int main(void)
{
    gt_require_gpu("test_gpu_sample");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_topk_topp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
