/* GPU op tests, part 3: greedy and temperature/top-k/top-p sampling on device against a CPU
 * reference that sorts the row (the textbook definition) and then walks the kept tokens in
 * index order with the same uniform draw u (check_sample), every row compared; whole draws
 * (adjustments, min-p, log-probabilities) against the host's arithmetic. */
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

/* Whether the draw u * z falls in `got`'s interval of the kept tokens' cumulative mass in
 * index order (kept: x >= cut, or x > cut when strict), widened by TOL_U * z on both sides
 * for the device's f32 sums: at 128k tokens one token holds ~1e-5 of the mass, so an exact
 * interval test would fail on rounding alone, while a wrong temperature, top-k or top-p set
 * moves the intervals by far more. */
#define TOL_P 1e-6
#define TOL_U 2e-5
static bool draw_lands_on(const float *x, int vocab, double m, float cut, bool strict, float u,
                          int got)
{
    if (strict ? !(x[got] > cut) : !(x[got] >= cut))
        return false; /* not a kept token */
    double z = 0, lo = 0;
    for (int i = 0; i < vocab; i++)
        if (strict ? x[i] > cut : x[i] >= cut) {
            z += exp(x[i] - m);
            if (i < got)
                lo = z;
        }
    double hi = lo + exp(x[got] - m), target = (double)u * z;
    return target >= lo - TOL_U * z && target < hi + TOL_U * z;
}

/* Checks the device's pick for one row against the definition (sort, top-k, top-p, then the
 * draw in index order). When the top-p boundary lies within rounding distance of p, whether
 * the boundary token is kept depends on summation order: both readings are accepted. */
static bool check_sample(const float *logits, int vocab, float t, int k, float p, float u, int got)
{
    if (!(t > 0))
        return got == ref_argmax(logits, vocab);
    if (got < 0 || got >= vocab)
        return false;
    float *x = malloc(vocab * 4), inv = 1.0f / t;
    int *idx = malloc(vocab * sizeof(int));
    for (int i = 0; i < vocab; i++)
        x[i] = logits[i] * inv, idx[i] = i;
    g_sort_x = x;
    qsort(idx, vocab, sizeof(int), cmp_desc_g);
    double m = x[idx[0]];
    float cut = -INFINITY;
    bool either = false;
    if (k >= 1 && k < vocab)
        cut = x[idx[k - 1]];
    if (p < 1) {
        double z = 0, run = 0;
        for (int i = 0; i < vocab && x[idx[i]] >= cut; i++)
            z += exp(x[idx[i]] - m);
        for (int i = 0; i < vocab && x[idx[i]] >= cut; i++) {
            double w = exp(x[idx[i]] - m);
            run += w;
            if (run >= p * z) {
                either = fabs(run - p * z) < TOL_P * z || fabs(run - w - p * z) < TOL_P * z;
                cut = x[idx[i]];
                break;
            }
        }
    }
    bool ok = draw_lands_on(x, vocab, m, cut, false, u, got) ||
              (either && draw_lands_on(x, vocab, m, cut, true, u, got));
    free(x), free(idx);
    return ok;
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
    int compared = 0;
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
            compared++;
            if (!check_sample(l + (size_t)r * V, V, temp[r], top_k[r], top_p[r], u[r], got[r]))
                fail_msg("vocab %d row %d (t=%g k=%d p=%g u=%g): got %d, not the draw's token",
                         V, r, temp[r], top_k[r], top_p[r], u[r], got[r]);
        }
        cudaFree(dl), cudaFree(dt), cudaFree(dp), cudaFree(du), cudaFree(dk), cudaFree(dids);
        free(l);
    }
    printf("  topk/topp: %d rows compared\n", compared);
}

/* Whole draws (ty_cuda_sample_draws): each row adjusted by its entries (a repetition penalty on
 * a positive and a negative logit, presence/frequency subtractions, a bias that makes a token
 * the best, a ban of the best), the adjusted row equal bit for bit to the host's arithmetic;
 * then greedy rows give the argmax of the adjusted row, sampled rows a token the definition's
 * draw lands on (check_sample), min-p rows a token with p >= min_p x p_max, and the
 * log-probabilities asked for (chosen and top n) those of the adjusted row within 1e-3. */
static void test_draws(void **state)
{
    static const int vocabs[] = {7, 1000, 32000, 128256};
    static const struct {
        float t;
        int k;
        float p, min_p;
        int n_top;
    } params[] = {{0, 0, 1, 0, 0},      {0, 0, 1, 0, 5},   {1, 0, 1, 0, 0},
                  {0.7f, 40, 1, 0, 3},  {1, 0, 0.9f, 0, 0}, {0.8f, 50, 0.95f, 0, 20},
                  {1, 0, 1, 0.1f, 2},   {1.2f, 0, 0.9f, 0.05f, 0}};
    enum { NP = sizeof(params) / sizeof(params[0]), REP = 3, R = NP * REP, NA = 5 };
    uint64_t s = 33;
    for (size_t v = 0; v < sizeof(vocabs) / sizeof(vocabs[0]); v++) {
        const int V = vocabs[v];
        float *l = malloc((size_t)R * V * 4), *adjd = malloc((size_t)R * V * 4);
        struct ty_cuda_draw d[R];
        struct ty_cuda_logit_adj a[R * NA];
        struct ty_cuda_draw_out out[R];
        gt_fill(l, (size_t)R * V, &s, -6, 6);
        memcpy(adjd, l, (size_t)R * V * 4);
        for (int r = 0; r < R; r++) {
            float *x = adjd + (size_t)r * V;
            int best = ref_argmax(x, V), n = 0;
            d[r] = (struct ty_cuda_draw){params[r % NP].t, params[r % NP].p,
                                         params[r % NP].min_p, (float)gt_u01(&s),
                                         params[r % NP].k, r * NA, 0, params[r % NP].n_top,
                                         r % 2};
            int lift = (best + 1 + r) % V, other = (best + 2 + r) % V;
            struct ty_cuda_logit_adj want[4] = {
                {lift, 1, 0, 20.0f},                                 /* made the best */
                {best, 1, 0, r % 3 == 0 ? -INFINITY : 0},            /* banned: another wins */
                {other, 1.3f, 0.5f, 0},                              /* penalised */
                {(other + 1) % V, 0.8f, 0.25f, 0}};
            for (int j = 0; j < 4; j++) { /* one entry per token, as the host makes them */
                bool dup = false;
                for (int i = 0; i < n; i++)
                    dup |= a[r * NA + i].id == want[j].id;
                if (!dup)
                    a[r * NA + n++] = want[j];
            }
            d[r].n_adj = n;
            for (int j = 0; j < n; j++) { /* the host's arithmetic (ty_sampler_draw's) */
                const struct ty_cuda_logit_adj *e = &a[r * NA + j];
                float y = x[e->id];
                if (e->rep != 1.0f)
                    y = y > 0 ? y / e->rep : y * e->rep;
                y -= e->sub;
                y += e->bias;
                x[e->id] = y;
            }
        }
        float *dl = gt_upload(l, (size_t)R * V * 4);
        struct ty_cuda_draw *dd = gt_upload(d, sizeof(d));
        struct ty_cuda_logit_adj *da = gt_upload(a, sizeof(a));
        struct ty_cuda_draw_out *dout = gt_dev(sizeof(out));
        gt_poison(dout, sizeof(out));
        assert_int_equal(ty_cuda_sample_draws(dout, dl, dd, da, R, V, NULL), 0);
        gt_download(out, dout, sizeof(out));
        float *back = malloc((size_t)R * V * 4);
        gt_download(back, dl, (size_t)R * V * 4);
        assert_memory_equal(back, adjd, (size_t)R * V * 4); /* the same adjusted rows */
        for (int r = 0; r < R; r++) {
            const float *x = adjd + (size_t)r * V;
            const int got = out[r].id;
            if (!(d[r].temperature > 0)) {
                assert_int_equal(got, ref_argmax(x, V));
            } else if (d[r].min_p > 0) {
                double m = x[ref_argmax(x, V)] / d[r].temperature;
                assert_true(got >= 0 && got < V);
                assert_true(x[got] / d[r].temperature >= m + log(d[r].min_p) - 1e-4);
            } else if (!check_sample(x, V, d[r].temperature, d[r].top_k, d[r].top_p, d[r].u,
                                     got)) {
                fail_msg("vocab %d row %d: got %d, not the draw's token", V, r, got);
            }
            double mx = x[ref_argmax(x, V)], z = 0;
            for (int i = 0; i < V; i++)
                z += exp((double)x[i] - mx);
            double lse = mx + log(z);
            if (d[r].logprob || d[r].n_top)
                assert_true(fabs(out[r].logprob - (x[got] - lse)) < 1e-3);
            int want_top = d[r].n_top < V ? d[r].n_top : V;
            assert_int_equal(out[r].n_top, want_top);
            int *idx = malloc(V * sizeof(int));
            for (int i = 0; i < V; i++)
                idx[i] = i;
            g_sort_x = x;
            qsort(idx, V, sizeof(int), cmp_desc_g);
            for (int k = 0; k < want_top; k++) {
                assert_true(x[out[r].top_id[k]] == x[idx[k]]); /* ties: any of equal value */
                assert_true(fabs(out[r].top_lp[k] - (x[idx[k]] - lse)) < 1e-3);
            }
            free(idx);
        }
        cudaFree(dl), cudaFree(dd), cudaFree(da), cudaFree(dout);
        free(l), free(adjd), free(back);
    }
}

int main(void)
{
    gt_require_gpu("test_gpu_sample");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_topk_topp),
        cmocka_unit_test(test_draws),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
