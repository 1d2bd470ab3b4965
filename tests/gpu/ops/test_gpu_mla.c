/* The multi-head latent attention kernels (mla.cu) and DeepSeek's routing (moe.cu) against
 * double-precision loops written here from their definitions (ty_kernels.h; the CPU backend's
 * cpu/mla.c and cpu/forward.c route_deepseek):
 *   - rope_store: the queries' rope part (the first R values of each head untouched), the
 *     latent row RMS-normed and its rope part rotated, stored into the pool's K/V halves (f32,
 *     f16, bf16 pools; interleaved and NeoX pairs; with and without a YaRN table); a skipped
 *     token (slot -1) and every slot nobody names stay poisoned; kv is not modified;
 *   - attn: decode rows and prefill chunks in one call, random non-contiguous pages, contexts
 *     1..300, the reference reading the pool's stored (rounded) values;
 *   - route_deepseek: sigmoid and softmax, with and without a selection bias, with expert
 *     groups (one-expert groups too) and without, renormalised or not, scaled; rows of exact
 *     ties; selections compared exactly, weights to 1e-6.
 * Rope angles are the kernels' defined f32 arithmetic (ggml's recurrence, f32 division, the
 * YaRN mix product by product), cos/sin and everything else in double. Outputs poisoned with
 * NaN first. */
#include "gpu_attn_ref.h"

/* f32 products and sums rounded one by one whatever the compiler's contraction setting. */
static float f32_mul(float a, float b)
{
    volatile float r = a * b;
    return r;
}
static float f32_add(float a, float b)
{
    volatile float r = a + b;
    return r;
}

#define YARN_FACTOR 16.0f
#define NORM_EPS 1e-6f

/* The mix table shaped as model.c's make_yarn: 1 for the first pairs, 0 for the last. */
static void yarn_table(float *mix, int half)
{
    float lo = (float)(half / 4), hi = (float)(half * 3 / 4);
    for (int i = 0; i < half; i++) {
        float y = ((float)i - lo) / (hi - lo);
        mix[i] = 1 - (y < 0 ? 0 : y > 1 ? 1 : y);
    }
}

/* Rope of P values x (pairs (2i, 2i+1) or (i, i + P/2)) at pos into out, in double but for
 * the angle, which is the contract's f32 arithmetic. */
static void ref_rope(double *out, const float *x, int P, int neox, int pos, float theta_scale,
                     const float *div, const float *mix, float fs, float ms)
{
    int half = P / 2;
    float th = (float)pos;
    for (int i = 0; i < half; i++) {
        float ang = th / div[i];
        double mag = 1.0;
        if (mix) {
            ang = f32_add(f32_mul(f32_mul(fs, ang), 1.0f - mix[i]), f32_mul(ang, mix[i]));
            mag = ms;
        }
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        double c = cos((double)ang) * mag, s = sin((double)ang) * mag;
        out[a] = x[a] * c - x[b] * s;
        out[b] = x[a] * s + x[b] * c;
        th *= theta_scale;
    }
}

static float read_pool(const void *pool, enum ty_cuda_dtype t, size_t i)
{
    if (t == TY_CUDA_F32)
        return ((const float *)pool)[i];
    uint16_t h;
    memcpy(&h, (const char *)pool + 2 * i, 2);
    if (t == TY_CUDA_BF16)
        return gt_bf16_to_f32(h);
    _Float16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}

/* ---- rope_store ---------------------------------------------------------------------------- */

struct rcase {
    int T, H, R, P, N, B, neox, yarn;
};

static void rope_case(const struct rcase *c, enum ty_cuda_dtype dt, uint64_t *rng)
{
    const int T = c->T, H = c->H, R = c->R, P = c->P, N = c->N, B = c->B, RP = R + P;
    const int hh = RP / 2, half = P / 2;
    const int n_pages = (T + B - 1) / B + 2, n_slots = n_pages * B;
    const size_t es = gt_dtype_size(dt), pool_elems = (size_t)n_slots * hh;
    const size_t nq = (size_t)T * H * RP, nqf = (size_t)T * H * (N + P), nkv = (size_t)T * RP;
    float *q0 = malloc(nq * 4), *qf = malloc(nqf * 4), *kv = malloc(nkv * 4), *w = malloc(R * 4);
    float div[512], mix[512];
    const float theta_scale = powf(10000.0f, -2.0f / P), fs = 1.0f / YARN_FACTOR;
    const float ms = 1.0f + 0.1f * logf(YARN_FACTOR);
    int32_t *pos = malloc(T * 4), *slots = malloc(T * 4), *perm = malloc(n_slots * 4);
    gt_fill(q0, nq, rng, -3, 3);
    gt_fill(qf, nqf, rng, -2, 2);
    gt_fill(kv, nkv, rng, -2, 2);
    gt_fill(w, R, rng, 0.5f, 1.5f);
    for (int i = 0; i < half; i++)
        div[i] = i % 3 ? 1.0f : gt_uniform(rng, 1.0f, 8.0f);
    yarn_table(mix, half);
    for (int i = 0; i < n_slots; i++)
        perm[i] = i;
    for (int i = n_slots - 1; i > 0; i--) {
        int j = gt_randint(rng, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int t = 0; t < T; t++) {
        pos[t] = gt_randint(rng, 0, 5000);
        slots[t] = t == 1 ? -1 : perm[t]; /* random distinct slots across pages; one skipped */
    }
    float *dq = gt_upload(q0, nq * 4), *dqf = gt_upload(qf, nqf * 4), *dkv = gt_upload(kv, nkv * 4);
    float *dw = gt_upload(w, R * 4), *ddiv = gt_upload(div, sizeof(div));
    float *dmix = gt_upload(mix, sizeof(mix));
    int32_t *dpos = gt_upload(pos, T * 4), *dslot = gt_upload(slots, T * 4);
    void *kp = gt_dev(pool_elems * es), *vp = gt_dev(pool_elems * es);
    gt_poison(kp, pool_elems * es);
    gt_poison(vp, pool_elems * es);
    struct ty_cuda_kv_layout l = {dt, 1, B, hh, n_pages};
    struct ty_cuda_mla m = {H, R, P, N, NORM_EPS, c->neox, theta_scale, ddiv,
                            c->yarn ? dmix : NULL, fs, ms};
    assert_int_equal(ty_cuda_mla_rope_store(dq, dqf, dkv, dw, kp, vp, &l, dpos, dslot, T, &m,
                                            NULL),
                     0);
    float *q = malloc(nq * 4), *kv_after = malloc(nkv * 4), *got = malloc(RP * 4);
    void *kh = malloc(pool_elems * es), *vh = malloc(pool_elems * es);
    gt_download(q, dq, nq * 4);
    gt_download(kv_after, dkv, nkv * 4);
    gt_download(kh, kp, pool_elems * es);
    gt_download(vh, vp, pool_elems * es);
    assert_memory_equal(kv_after, kv, nkv * 4); /* kv is left unchanged */
    double want[1024];
    const double tol = dt == TY_CUDA_F32 ? 2e-6 : dt == TY_CUDA_F16 ? 1e-3 : 4e-3;
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            const float *qo = q + ((size_t)t * H + h) * RP;
            /* the absorbed part (first R values) as it was, bit for bit */
            assert_memory_equal(qo, q0 + ((size_t)t * H + h) * RP, (size_t)R * 4);
            ref_rope(want, qf + ((size_t)t * H + h) * (N + P) + N, P, c->neox, pos[t],
                     theta_scale, div, c->yarn ? mix : NULL, fs, ms);
            GT_EXPECT_NERR(qo + R, want, P, 2e-6, "q pe t%d h%d R%d P%d neox%d yarn%d", t, h, R,
                           P, c->neox, c->yarn);
        }
        if (slots[t] < 0)
            continue;
        const float *x = kv + (size_t)t * RP;
        double ss = 0;
        for (int i = 0; i < R; i++)
            ss += (double)x[i] * x[i];
        const double sc = 1.0 / sqrt(ss / R + NORM_EPS);
        for (int i = 0; i < R; i++)
            want[i] = x[i] * sc * w[i];
        ref_rope(want + R, x + R, P, c->neox, pos[t], theta_scale, div, c->yarn ? mix : NULL, fs,
                 ms);
        const size_t base = (size_t)slots[t] * hh; /* one kv head: row = page * B + offset */
        for (int i = 0; i < RP; i++)
            got[i] = read_pool(i < hh ? kh : vh, dt, base + (i < hh ? i : i - hh));
        GT_EXPECT_NERR(got, want, R, tol, "latent t%d %s R%d", t, gt_dtype_name(dt), R);
        GT_EXPECT_NERR(got + R, want + R, P, tol, "k pe t%d %s P%d neox%d yarn%d", t,
                       gt_dtype_name(dt), P, c->neox, c->yarn);
    }
    /* slots nobody wrote (the skipped token's included) are still NaN in both halves */
    char *used = calloc(n_slots, 1);
    for (int t = 0; t < T; t++)
        if (slots[t] >= 0)
            used[slots[t]] = 1;
    for (int s = 0; s < n_slots; s++)
        for (int i = 0; !used[s] && i < hh; i++)
            if (!isnan(read_pool(kh, dt, (size_t)s * hh + i)) ||
                !isnan(read_pool(vh, dt, (size_t)s * hh + i)))
                fail_msg("rope_store %s: unaddressed slot %d element %d written", gt_dtype_name(dt),
                         s, i);
    free(used);
    free(q0), free(qf), free(kv), free(w), free(pos), free(slots), free(perm), free(q),
        free(kv_after), free(got), free(kh), free(vh);
    cudaFree(dq), cudaFree(dqf), cudaFree(dkv), cudaFree(dw), cudaFree(ddiv), cudaFree(dmix),
        cudaFree(dpos), cudaFree(dslot), cudaFree(kp), cudaFree(vp);
}

static void test_rope_store(void **state)
{
    static const struct rcase cases[] = {
        {9, 4, 64, 16, 32, 16, 0, 0},
        {9, 4, 64, 16, 32, 16, 1, 0},
        {9, 4, 64, 16, 32, 16, 0, 1},
        {5, 4, 64, 16, 32, 7, 1, 1},      /* odd page size */
        {6, 16, 512, 64, 128, 16, 0, 1},  /* DeepSeek-V2/V3's shapes, YaRN */
        {6, 16, 512, 64, 128, 16, 1, 0},
        {3, 128, 512, 64, 128, 16, 0, 0}, /* 128 heads: several q blocks per token */
    };
    uint64_t rng = 31;
    for (int dt = TY_CUDA_F32; dt <= TY_CUDA_BF16; dt++)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            rope_case(&cases[i], (enum ty_cuda_dtype)dt, &rng);
}

/* ---- attention ----------------------------------------------------------------------------- */

struct acase {
    int H, R, P, B;
    int n_dec, dec_lens[4];
    int n_chunks, q_lens[3], kv_lens[3];
};

/* Value i (< R + P) of the pool row of sequence seq at position pos: K half, then V half. */
static float row_at(const struct pool *p, int seq, int pos, int i)
{
    const int hh = p->l.head_dim;
    return i < hh ? ref_row(p, p->k, seq, pos, 0)[i] : ref_row(p, p->v, seq, pos, 0)[i - hh];
}

static void attn_case(const struct acase *c, enum ty_cuda_dtype dt, uint64_t *rng)
{
    const int H = c->H, R = c->R, RP = c->R + c->P, n_seqs = c->n_dec + c->n_chunks;
    int lens[7], starts[3], rows = c->n_dec, max_len = 0;
    for (int i = 0; i < c->n_dec; i++)
        lens[i] = c->dec_lens[i];
    for (int i = 0; i < c->n_chunks; i++) {
        lens[c->n_dec + i] = c->kv_lens[i];
        starts[i] = rows;
        rows += c->q_lens[i];
    }
    for (int i = 0; i < n_seqs; i++)
        max_len = lens[i] > max_len ? lens[i] : max_len;
    struct pool p;
    pool_make(&p, dt, 1, c->B, RP / 2, lens, NULL, n_seqs, rng);
    int32_t *pos = malloc(rows * 4), *seq = malloc(rows * 4);
    for (int i = 0; i < c->n_dec; i++)
        pos[i] = lens[i] - 1, seq[i] = i;
    for (int k = 0; k < c->n_chunks; k++)
        for (int r = 0; r < c->q_lens[k]; r++) {
            pos[starts[k] + r] = c->kv_lens[k] - c->q_lens[k] + r;
            seq[starts[k] + r] = c->n_dec + k;
        }
    const size_t nq = (size_t)rows * H * RP, nout = (size_t)rows * H * R, pad = 64;
    float *q = malloc(nq * 4), *got = malloc((nout + pad) * 4);
    double *want = malloc(nout * 8), *sc = malloc((size_t)max_len * 8);
    gt_fill(q, nq, rng, -2, 2);
    const float scale = 2.0f / sqrtf((float)RP);
    for (int i = 0; i < rows; i++)
        for (int h = 0; h < H; h++) {
            const float *qr = q + ((size_t)i * H + h) * RP;
            double mx = -INFINITY, z = 0, *o = want + ((size_t)i * H + h) * R;
            for (int j = 0; j <= pos[i]; j++) {
                double d = 0;
                for (int e = 0; e < RP; e++)
                    d += (double)qr[e] * row_at(&p, seq[i], j, e);
                sc[j] = d * scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int e = 0; e < R; e++)
                o[e] = 0;
            for (int j = 0; j <= pos[i]; j++) {
                double wj = exp(sc[j] - mx);
                z += wj;
                for (int e = 0; e < R; e++)
                    o[e] += wj * row_at(&p, seq[i], j, e);
            }
            for (int e = 0; e < R; e++)
                o[e] /= z;
        }
    float *dq = gt_upload(q, nq * 4), *dout = gt_dev((nout + pad) * 4);
    int32_t *dpos = gt_upload(pos, rows * 4);
    int32_t *dqs = c->n_chunks ? gt_upload(starts, c->n_chunks * 4) : NULL;
    gt_poison(dout, (nout + pad) * 4);
    struct ty_cuda_mla m = {H, R, c->P, 128, NORM_EPS, 0, 0.5f, NULL, NULL, 0.0f, 0.0f};
    struct ty_cuda_attn_rows rr = {c->n_dec,
                                   c->n_dec ? p.dtables : NULL,
                                   p.max_pages,
                                   c->n_chunks,
                                   c->n_chunks ? p.dtables + (size_t)c->n_dec * p.max_pages
                                               : NULL,
                                   dqs,
                                   p.max_pages};
    assert_int_equal(
        ty_cuda_mla_attn(dout, dq, p.dk, p.dv, &p.l, &m, scale, dpos, rows, &rr, NULL), 0);
    gt_download(got, dout, (nout + pad) * 4);
    GT_EXPECT_NERR(got, want, nout, 1e-5, "mla_attn %s H%d R%d P%d B%d rows %d",
                   gt_dtype_name(dt), H, R, c->P, c->B, rows);
    for (size_t i = nout; i < nout + pad; i++) /* nothing past the output */
        assert_true(isnan(got[i]));
    free(pos), free(seq), free(q), free(got), free(want), free(sc);
    cudaFree(dq), cudaFree(dout), cudaFree(dpos);
    if (dqs)
        cudaFree(dqs);
    pool_free(&p);
}

static void test_attn(void **state)
{
    static const struct acase cases[] = {
        /* decode rows and prefill chunks together */
        {4, 64, 16, 16, 3, {1, 17, 300}, 2, {5, 33}, {5, 150}},
        {16, 512, 64, 16, 2, {300, 2}, 3, {1, 20, 7}, {300, 40, 7}}, /* DeepSeek-V2/V3 */
        /* decode only, prefill only */
        {16, 512, 64, 16, 4, {1, 16, 33, 257}, 0, {0}, {0}},
        {4, 64, 16, 16, 0, {0}, 3, {16, 1, 9}, {16, 100, 200}},
        /* heads not a multiple of a block's group; other row lengths (1, 2 and 8 chunks of
         * 128) */
        {5, 64, 16, 16, 1, {77}, 1, {12}, {90}},
        {6, 128, 32, 16, 2, {3, 129}, 1, {4}, {64}},
        {3, 960, 64, 16, 1, {200}, 1, {6}, {31}},
    };
    uint64_t rng = 37;
    for (int dt = TY_CUDA_F32; dt <= TY_CUDA_BF16; dt++)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            attn_case(&cases[i], (enum ty_cuda_dtype)dt, &rng);
}

/* ---- DeepSeek routing ---------------------------------------------------------------------- */

struct dsroute {
    int E, K, sigmoid, bias, G, Gu, norm;
    float scale;
};

/* route_deepseek's definition in double: selections into sel, weights into w; the selection
 * scores (before group pruning) into s and the group scores into gs (for the near-tie guard). */
static void ref_route(const float *lg, const float *bias, const struct dsroute *c, int32_t *sel,
                      double *w, double *s, double *gs)
{
    const int E = c->E;
    double p[256], mx = -INFINITY, sum = 0;
    if (c->sigmoid) {
        for (int e = 0; e < E; e++)
            p[e] = 1.0 / (1.0 + exp(-(double)lg[e]));
    } else {
        for (int e = 0; e < E; e++)
            mx = lg[e] > mx ? lg[e] : mx;
        for (int e = 0; e < E; e++)
            sum += p[e] = exp(lg[e] - mx);
        for (int e = 0; e < E; e++)
            p[e] /= sum;
    }
    double sel_s[256];
    for (int e = 0; e < E; e++)
        sel_s[e] = s[e] = p[e] + (bias ? bias[e] : 0.0);
    if (c->G > 1 && c->Gu < c->G) {
        const int per = E / c->G;
        double g2[256];
        int keep[256] = {0};
        for (int g = 0; g < c->G; g++) {
            double a = -INFINITY, b = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (s[e] > a)
                    b = a, a = s[e];
                else if (s[e] > b)
                    b = s[e];
            }
            g2[g] = gs[g] = per > 1 ? a + b : a;
        }
        for (int k = 0; k < c->Gu; k++) {
            int best = 0;
            for (int g = 1; g < c->G; g++)
                best = g2[g] > g2[best] ? g : best;
            keep[best] = 1;
            g2[best] = -INFINITY;
        }
        for (int e = 0; e < E; e++)
            if (!keep[e / per])
                sel_s[e] = -INFINITY;
    }
    double wsum = 0;
    for (int k = 0; k < c->K; k++) {
        int best = 0;
        for (int e = 1; e < E; e++)
            best = sel_s[e] > sel_s[best] ? e : best;
        sel[k] = best;
        w[k] = p[best];
        wsum += w[k];
        sel_s[best] = -INFINITY;
    }
    if (c->norm)
        wsum = wsum > 6.103515625e-5 ? wsum : 6.103515625e-5;
    for (int k = 0; k < c->K; k++)
        w[k] = (c->norm ? w[k] / wsum : w[k]) * c->scale;
}

/* Whether two of the n values lie so close (1e-6 relative, 5e-8 absolute: far above the f32
 * kernel's rounding) that the kernel could order them differently from the reference, without
 * being the same by construction (same[i] == same[j] >= 0: bit-identical on both sides). */
static bool near_tie(const double *x, const int *same, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            double big = fabs(x[i]) > fabs(x[j]) ? fabs(x[i]) : fabs(x[j]);
            if (fabs(x[i] - x[j]) < 1e-6 * big + 5e-8 &&
                !(same && same[i] >= 0 && same[i] == same[j]))
                return true;
        }
    return false;
}

static void route_case(const struct dsroute *c, int T, uint64_t *rng)
{
    const int E = c->E, K = c->K;
    float *lg = malloc((size_t)T * E * 4), *w = malloc((size_t)T * K * 4), bias[256];
    int32_t *sel = malloc((size_t)T * K * 4);
    for (int e = 0; e < E; e++) /* k/32: many experts share a bias (exact ties below) */
        bias[e] = (float)gt_randint(rng, -3, 3) / 32.0f;
    const float *b = c->bias ? bias : NULL;
    for (int t = 0; t < T; t++) {
        float *r = lg + (size_t)t * E;
        if (t % 4 == 1) { /* all equal: p exact in f32 (0.5 or 1/E), ties of equal biases */
            for (int e = 0; e < E; e++)
                r[e] = 0.0f;
            continue;
        }
        int32_t ts[16];
        double tw[16], s[256], gs[256];
        int same[256];
        for (int tries = 0;; tries++) {
            assert_true(tries < 1000);
            gt_fill(r, E, rng, -4, 4);
            for (int e = 0; e < E; e++)
                same[e] = -1;
            if (t % 4 == 2) { /* a tied best pair at e1 < e2 (a tie where their biases agree) */
                int e1 = gt_randint(rng, 0, E - 2), e2 = gt_randint(rng, e1 + 1, E - 1);
                r[e1] = r[e2] = 5.0f;
                if (!b || b[e1] == b[e2])
                    same[e1] = same[e2] = 0;
            }
            for (int g = 0; g < 256; g++)
                gs[g] = (double)g; /* no groups: nothing to guard */
            ref_route(r, b, c, ts, tw, s, gs);
            if (!near_tie(s, same, E) && !near_tie(gs, NULL, c->G > 1 ? c->G : 1))
                break;
        }
    }
    float *dl = gt_upload(lg, (size_t)T * E * 4), *dw = gt_dev((size_t)T * K * 4);
    float *db = gt_upload(bias, sizeof(bias));
    int32_t *ds = gt_dev((size_t)T * K * 4);
    gt_poison(dw, (size_t)T * K * 4);
    gt_poison(ds, (size_t)T * K * 4);
    assert_int_equal(ty_cuda_moe_route_deepseek(ds, dw, dl, c->bias ? db : NULL, T, E, K,
                                                c->sigmoid, c->G, c->Gu, c->norm, c->scale, NULL),
                     0);
    gt_download(w, dw, (size_t)T * K * 4);
    gt_download(sel, ds, (size_t)T * K * 4);
    for (int t = 0; t < T; t++) {
        int32_t rs[16];
        double want[16], s[256], gs[256];
        ref_route(lg + (size_t)t * E, b, c, rs, want, s, gs);
        for (int k = 0; k < K; k++)
            if (sel[(size_t)t * K + k] != rs[k])
                fail_msg("route_deepseek E%d K%d sig%d bias%d G%d/%d: token %d slot %d picked "
                         "%d, reference %d",
                         E, K, c->sigmoid, c->bias, c->Gu, c->G, t, k, sel[(size_t)t * K + k],
                         rs[k]);
        GT_EXPECT_NERR(w + (size_t)t * K, want, K, 1e-6,
                       "route_deepseek weights t%d E%d K%d sig%d bias%d G%d/%d norm%d", t, E, K,
                       c->sigmoid, c->bias, c->Gu, c->G, c->norm);
    }
    free(lg), free(w), free(sel);
    cudaFree(dl), cudaFree(dw), cudaFree(db), cudaFree(ds);
}

static void test_route_deepseek(void **state)
{
    static const struct dsroute cases[] = {
        {64, 6, 1, 1, 8, 3, 1, 2.5f},  /* V3-style (sigmoid, bias, groups), small */
        {256, 8, 1, 1, 8, 4, 1, 2.5f}, /* DeepSeek-V3's shape */
        {64, 6, 0, 0, 8, 3, 0, 1.0f},  /* V2-style: softmax, groups, no renormalisation */
        {64, 6, 0, 1, 8, 3, 1, 2.5f},
        {64, 6, 1, 0, 8, 3, 0, 1.0f},
        {16, 4, 1, 1, 1, 1, 1, 2.5f},  /* no groups */
        {16, 4, 0, 0, 0, 0, 1, 2.5f},
        {16, 2, 1, 1, 16, 4, 0, 2.5f}, /* one-expert groups: a group's score is its best */
        {64, 6, 1, 1, 8, 8, 1, 1.0f},  /* every group used: no pruning */
        {16, 16, 0, 1, 1, 1, 1, 1.0f}, /* every expert used */
    };
    uint64_t rng = 41;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        route_case(&cases[i], 37, &rng);
}

/* ---- argument checks ----------------------------------------------------------------------- */

static void test_rejects_bad_args(void **state)
{
    float div[64] = {1};
    struct ty_cuda_kv_layout l = {TY_CUDA_F16, 1, 16, 40, 4};
    struct ty_cuda_mla m = {4, 64, 16, 32, NORM_EPS, 0, 0.5f, div, NULL, 0.0f, 0.0f};
    int32_t tabs[1] = {0};
    struct ty_cuda_attn_rows rr = {1, tabs, 1, 0, NULL, NULL, 0};
    float x = 0.0f;
    /* the valid shapes pass the checks: nothing to do for zero rows */
    assert_int_equal(ty_cuda_mla_rope_store(NULL, NULL, NULL, &x, NULL, NULL, &l, NULL, NULL, 0,
                                            &m, NULL),
                     0);
    rr.n_decode = 0;
    assert_int_equal(ty_cuda_mla_attn(NULL, NULL, NULL, NULL, &l, &m, 1.0f, NULL, 0, &rr, NULL),
                     0);
    rr.n_decode = 1;
    m.rope_dim = 15; /* odd */
    l.head_dim = (64 + 15) / 2;
    assert_int_equal(ty_cuda_mla_rope_store(NULL, NULL, NULL, &x, NULL, NULL, &l, NULL, NULL, 1,
                                            &m, NULL),
                     TY_EINVAL);
    assert_int_equal(ty_cuda_mla_attn(NULL, NULL, NULL, NULL, &l, &m, 1.0f, NULL, 1, &rr, NULL),
                     TY_EINVAL);
    m.rope_dim = 16, l.head_dim = 40;
    m.n_heads = 0;
    assert_int_equal(ty_cuda_mla_rope_store(NULL, NULL, NULL, &x, NULL, NULL, &l, NULL, NULL, 1,
                                            &m, NULL),
                     TY_EINVAL);
    assert_int_equal(ty_cuda_mla_attn(NULL, NULL, NULL, NULL, &l, &m, 1.0f, NULL, 1, &rr, NULL),
                     TY_EINVAL);
    m.n_heads = 4;
    l.head_dim = 80; /* not (R + P) / 2 */
    assert_int_equal(ty_cuda_mla_rope_store(NULL, NULL, NULL, &x, NULL, NULL, &l, NULL, NULL, 1,
                                            &m, NULL),
                     TY_EINVAL);
    assert_int_equal(ty_cuda_mla_attn(NULL, NULL, NULL, NULL, &l, &m, 1.0f, NULL, 1, &rr, NULL),
                     TY_EINVAL);
    l.head_dim = 40;
    l.n_kv_heads = 2; /* one latent row per token */
    assert_int_equal(ty_cuda_mla_attn(NULL, NULL, NULL, NULL, &l, &m, 1.0f, NULL, 1, &rr, NULL),
                     TY_EINVAL);
    l.n_kv_heads = 1;
    m.kv_lora_rank = 1024, l.head_dim = (1024 + 16) / 2; /* a row past 1024 values */
    assert_int_equal(ty_cuda_mla_attn(NULL, NULL, NULL, NULL, &l, &m, 1.0f, NULL, 1, &rr, NULL),
                     TY_EINVAL);
    m.kv_lora_rank = 66, l.head_dim = (66 + 16) / 2; /* halves not whole groups of 4 */
    assert_int_equal(ty_cuda_mla_attn(NULL, NULL, NULL, NULL, &l, &m, 1.0f, NULL, 1, &rr, NULL),
                     TY_EINVAL);
    m.kv_lora_rank = 64, l.head_dim = 40;
    m.freq_div = NULL;
    assert_int_equal(ty_cuda_mla_rope_store(NULL, NULL, NULL, &x, NULL, NULL, &l, NULL, NULL, 1,
                                            &m, NULL),
                     TY_EINVAL);
    m.freq_div = div;
    rr.n_decode = 0; /* prefill rows without chunks */
    assert_int_equal(ty_cuda_mla_attn(NULL, NULL, NULL, NULL, &l, &m, 1.0f, NULL, 1, &rr, NULL),
                     TY_EINVAL);
    assert_int_equal(ty_cuda_mla_attn(NULL, NULL, NULL, NULL, &l, &m, 1.0f, NULL, 1, NULL, NULL),
                     TY_EINVAL);

    /* routing: n_used > n_experts, too many experts, groups that do not divide, none kept,
     * fewer eligible experts than picks */
    assert_int_equal(
        ty_cuda_moe_route_deepseek(NULL, NULL, NULL, NULL, 1, 8, 9, 1, 1, 1, 1, 1.0f, NULL),
        TY_EINVAL);
    assert_int_equal(
        ty_cuda_moe_route_deepseek(NULL, NULL, NULL, NULL, 1, 512, 8, 1, 1, 1, 1, 1.0f, NULL),
        TY_EINVAL);
    assert_int_equal(
        ty_cuda_moe_route_deepseek(NULL, NULL, NULL, NULL, 1, 60, 8, 1, 8, 3, 1, 1.0f, NULL),
        TY_EINVAL);
    assert_int_equal(
        ty_cuda_moe_route_deepseek(NULL, NULL, NULL, NULL, 1, 64, 8, 1, 8, 0, 1, 1.0f, NULL),
        TY_EINVAL);
    assert_int_equal(
        ty_cuda_moe_route_deepseek(NULL, NULL, NULL, NULL, 1, 64, 9, 1, 8, 1, 1, 1.0f, NULL),
        TY_EINVAL);
    assert_int_equal(
        ty_cuda_moe_route_deepseek(NULL, NULL, NULL, NULL, 0, 64, 8, 1, 8, 3, 1, 1.0f, NULL), 0);
}

int main(void)
{
    gt_require_gpu("test_gpu_mla");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_store),
        cmocka_unit_test(test_attn),
        cmocka_unit_test(test_route_deepseek),
        cmocka_unit_test(test_rejects_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
