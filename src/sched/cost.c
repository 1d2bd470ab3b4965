/* Cost model: built-in profiles derived from FLOPs and bandwidth, and least-squares refits.
 * The derivation is written out in docs/arch/sched.md; the numbers here are its inputs. */
#include "tycho/errors.h"
#include "tycho/sched.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct model_shape {
    double params;   /* weights, each read once per decode step and 2 FLOPs per token */
    double layers, attn_dim, kv_heads, head_dim, bytes_per_elem;
};

struct node_hw {
    double gpus, peak_flops, hbm_bytes_s, net_bytes_s; /* per GPU / per node NIC total */
    double mfu, mbu, net_eff, overhead_us;
};

/* LLaMA3-70B: 80 layers, 64 query heads x 128 = 8192, 8 KV heads (GQA), BF16. */
static const struct model_shape llama3_70b = {70.6e9, 80, 8192, 8, 128, 2};

static void derive(const struct model_shape *m, const struct node_hw *h, struct ty_sched_cost *c)
{
    double flops = h->gpus * h->peak_flops * h->mfu * 1e-6; /* effective FLOP per us */
    double hbm = h->gpus * h->hbm_bytes_s * h->mbu * 1e-6;  /* effective bytes per us */
    /* causal attention: QK^T and AV cost 4 * attn_dim * position FLOPs per layer per token;
     * summed over positions P..L-1 that is 2 * attn_dim * layers * (L^2 - P^2) */
    c->prefill[0] = h->overhead_us;
    c->prefill[1] = 2.0 * m->params / flops;
    c->prefill[2] = 2.0 * m->attn_dim * m->layers / flops;
    c->kv_bytes_per_token = 2.0 * m->layers * m->kv_heads * m->head_dim * m->bytes_per_elem;
    c->decode[0] = m->params * m->bytes_per_elem / hbm; /* read all weights once per step */
    c->decode[1] = 2.0 * m->params / flops;             /* per sequence GEMV work, unhidden */
    c->decode[2] = c->kv_bytes_per_token / hbm;         /* read every context token's KV */
    c->net_bytes_per_us = h->net_bytes_s * h->net_eff * 1e-6;
    c->block_tokens = 512;
}

int ty_sched_cost_override(struct ty_sched_cost *c, const double *prefill, uint32_t n_prefill,
                           const double *decode, uint32_t n_decode, double net_gbytes_per_s,
                           char *why, size_t cap)
{
    const char *name[2] = {"prefill", "decode"};
    const double *v[2] = {prefill, decode};
    uint32_t n[2] = {n_prefill, n_decode};
    for (int s = 0; s < 2; s++) {
        if (n[s] && n[s] != 3)
            return snprintf(why, cap, "cost.%s: needs exactly 3 coefficients, not %u", name[s],
                            n[s]), TY_EINVAL;
        for (uint32_t k = 0; k < n[s]; k++)
            if (!(v[s][k] >= 0) || !isfinite(v[s][k]))
                return snprintf(why, cap, "cost.%s[%u]: %g is not a time (coefficients are "
                                "finite and >= 0)", name[s], k, v[s][k]), TY_EINVAL;
    }
    for (uint32_t k = 0; k < n_prefill; k++)
        c->prefill[k] = prefill[k];
    for (uint32_t k = 0; k < n_decode; k++)
        c->decode[k] = decode[k];
    if (net_gbytes_per_s > 0)
        c->net_bytes_per_us = net_gbytes_per_s * 1e3;
    return 0;
}

int ty_sched_cost_profile(const char *name, struct ty_sched_cost *out)
{
    /* A800 SXM: 312 TFLOPS dense BF16, 2.039 TB/s HBM2e; 8 x 100 Gb/s RoCE per node.
     * H800 SXM: 989 TFLOPS dense BF16, 3.35 TB/s HBM3; 8 x 200 Gb/s per node.
     * MFU 40% for prefill, 60% of HBM bandwidth for decode, 80% of line rate for KV moves. */
    static const struct node_hw a800 = {8, 312e12, 2.039e12, 100e9, 0.40, 0.60, 0.80, 10000};
    static const struct node_hw h800 = {8, 989e12, 3.35e12, 200e9, 0.40, 0.60, 0.80, 10000};
    if (!name)
        return TY_EINVAL;
    memset(out, 0, sizeof(*out));
    if (strcmp(name, "llama3-70b-8xa800") == 0)
        derive(&llama3_70b, &a800, out);
    else if (strcmp(name, "llama3-70b-8xh800") == 0)
        derive(&llama3_70b, &h800, out);
    else
        return TY_ENOTFOUND;
    return 0;
}

double ty_sched_cost_prefill_us(const struct ty_sched_cost *c, uint64_t tokens, uint64_t cached)
{
    if (cached >= tokens)
        cached = tokens ? tokens - 1 : 0; /* the last token is always computed */
    double l = (double)tokens, p = (double)cached;
    return c->prefill[0] + c->prefill[1] * (l - p) + c->prefill[2] * (l * l - p * p);
}

double ty_sched_cost_step_us(const struct ty_sched_cost *c, uint64_t batch, uint64_t ctx_tokens)
{
    return c->decode[0] + c->decode[1] * (double)batch + c->decode[2] * (double)ctx_tokens;
}

double ty_sched_cost_transfer_us(const struct ty_sched_cost *c, uint64_t tokens)
{
    if (c->net_bytes_per_us <= 0)
        return 0;
    return (double)tokens * c->kv_bytes_per_token / c->net_bytes_per_us;
}

/* Solve the 3x3 system a x = b by Gaussian elimination with partial pivoting. */
static int solve3(double a[3][3], double b[3], double x[3])
{
    double tol = 1e-9 * fmax(fabs(a[0][0]), fmax(fabs(a[1][1]), fabs(a[2][2])));
    for (int col = 0; col < 3; col++) {
        int piv = col;
        for (int r = col + 1; r < 3; r++)
            if (fabs(a[r][col]) > fabs(a[piv][col]))
                piv = r;
        if (!(fabs(a[piv][col]) > tol))
            return TY_ERANGE;
        for (int k = 0; k < 3; k++) {
            double t = a[col][k];
            a[col][k] = a[piv][k];
            a[piv][k] = t;
        }
        double t = b[col];
        b[col] = b[piv];
        b[piv] = t;
        for (int r = col + 1; r < 3; r++) {
            double f = a[r][col] / a[col][col];
            for (int k = col; k < 3; k++)
                a[r][k] -= f * a[col][k];
            b[r] -= f * b[col];
        }
    }
    for (int r = 2; r >= 0; r--) {
        double s = b[r];
        for (int k = r + 1; k < 3; k++)
            s -= a[r][k] * x[k];
        x[r] = s / a[r][r];
    }
    return 0;
}

static void features(const struct ty_sched_sample *s, double f[3])
{
    f[0] = 1;
    f[1] = s->x0;
    f[2] = s->x1;
}

/* Least squares over the features in `mask` (bit k: feature k; the others are held at 0) via
 * normal equations, features scaled to unit magnitude first so L^2 terms (1e10) and constants
 * (1) do not ruin the conditioning. */
static int fit_mask(const struct ty_sched_sample *s, size_t n, unsigned mask,
                    double out[3])
{
    if (!s || n < 3)
        return TY_EINVAL;
    double scale[3] = {1, 1, 1}, f[3];
    for (size_t i = 0; i < n; i++) {
        features(&s[i], f);
        if (!isfinite(f[1]) || !isfinite(f[2]) || !isfinite(s[i].us))
            return TY_EINVAL;
        for (int k = 1; k < 3; k++)
            scale[k] = fmax(scale[k], fabs(f[k]));
    }
    double ata[3][3] = {{0}}, atb[3] = {0}, x[3] = {0};
    for (size_t i = 0; i < n; i++) {
        features(&s[i], f);
        for (int k = 0; k < 3; k++)
            f[k] = mask & (1u << k) ? f[k] / scale[k] : 0;
        for (int r = 0; r < 3; r++) {
            for (int k = 0; k < 3; k++)
                ata[r][k] += f[r] * f[k];
            atb[r] += f[r] * s[i].us;
        }
    }
    for (int k = 0; k < 3; k++)
        if (!(mask & (1u << k)))
            ata[k][k] = 1; /* decoupled: x[k] = 0 */
    int rc = solve3(ata, atb, x);
    if (rc < 0)
        return rc;
    for (int k = 0; k < 3; k++) {
        out[k] = x[k] / scale[k];
        if (!isfinite(out[k]))
            return TY_ERANGE;
    }
    return 0;
}

/* Non-negative least squares for three features by enumeration: the constrained optimum is
 * the unconstrained fit of some feature subset, so try all seven and keep the non-negative
 * one with the smallest squared error. */
static int fit_nonneg(const struct ty_sched_sample *s, size_t n, double out[3])
{
    double best = INFINITY, x[3], f[3];
    int rc = TY_ERANGE;
    for (unsigned mask = 1; mask < 8; mask++) {
        int r = fit_mask(s, n, mask, x);
        if (r == TY_EINVAL)
            return r;
        if (r < 0 || x[0] < 0 || x[1] < 0 || x[2] < 0)
            continue;
        double err = 0;
        for (size_t i = 0; i < n; i++) {
            features(&s[i], f);
            double d = x[0] * f[0] + x[1] * f[1] + x[2] * f[2] - s[i].us;
            err += d * d;
        }
        if (err < best) {
            best = err;
            memcpy(out, x, sizeof(x));
            rc = 0;
        }
    }
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* fit_nonneg, then once more without the outliers: samples whose residual is over 8 times
 * the median absolute residual (a stalled machine, a cold start), so that one bad sample
 * cannot set the model for the whole window. */
static int fit_robust(const struct ty_sched_sample *s, size_t n, double out[3])
{
    int rc = fit_nonneg(s, n, out);
    if (rc < 0 || n < 6)
        return rc;
    double *res = malloc(n * sizeof(*res));
    struct ty_sched_sample *keep = malloc(n * sizeof(*keep));
    if (!res || !keep) {
        free(res);
        free(keep);
        return 0; /* the plain fit stands */
    }
    double f[3];
    for (size_t i = 0; i < n; i++) {
        features(&s[i], f);
        res[i] = fabs(out[0] * f[0] + out[1] * f[1] + out[2] * f[2] - s[i].us);
    }
    double *sorted = malloc(n * sizeof(*sorted));
    if (sorted) {
        memcpy(sorted, res, n * sizeof(*res));
        qsort(sorted, n, sizeof(*sorted), cmp_double);
        double limit = fmax(8 * sorted[n / 2], 1.0); /* 1 us: no point trimming an exact fit */
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (res[i] <= limit)
                keep[k++] = s[i];
        double x[3];
        if (k >= 3 && k < n && fit_nonneg(keep, k, x) == 0)
            memcpy(out, x, sizeof(x));
        free(sorted);
    }
    free(res);
    free(keep);
    return 0;
}

/* The fit's coefficients into c (prefill or decode) when it succeeded; returns rc. */
static int keep_fit(struct ty_sched_cost *c, int prefill, int rc, const double x[3])
{
    if (rc == 0)
        memcpy(prefill ? c->prefill : c->decode, x, 3 * sizeof(double));
    return rc;
}

/* Samples that all sit at about one size (x0, the tokens of a prefill call or the sequences
 * of a decode step, within 25 %) tell how long that size takes, not how the time splits
 * between the fixed and the per-token (per-sequence) terms: a burst of one prompt length
 * would otherwise teach "every call costs the same, whatever its size" (the fit puts it all
 * in the constant). The model in use then keeps its shape and is scaled to them, by the
 * median of measured / predicted (a stall among them cannot set it). Returns 1 when it did,
 * 0 when the samples are spread enough to fit (or the model predicts nothing there). */
static int rescale(double k[3], const struct ty_sched_sample *s, size_t n)
{
    double lo = INFINITY, hi = -INFINITY, f[3];
    for (size_t i = 0; i < n; i++) {
        lo = fmin(lo, s[i].x0);
        hi = fmax(hi, s[i].x0);
    }
    if (!(hi <= 1.25 * lo))
        return 0;
    double *r = malloc(n * sizeof(*r));
    if (!r)
        return 0;
    for (size_t i = 0; i < n; i++) {
        features(&s[i], f);
        double pred = k[0] * f[0] + k[1] * f[1] + k[2] * f[2];
        if (!(pred > 0)) {
            free(r);
            return 0;
        }
        r[i] = s[i].us / pred;
    }
    qsort(r, n, sizeof(*r), cmp_double);
    double m = n % 2 ? r[n / 2] : (r[n / 2 - 1] + r[n / 2]) / 2;
    free(r);
    if (!(m > 0) || !isfinite(m))
        return 0;
    for (int j = 0; j < 3; j++)
        k[j] *= m;
    return 1;
}

static int refit(struct ty_sched_cost *c, int prefill, const struct ty_sched_sample *s, size_t n)
{
    if (!s || n < 3)
        return TY_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(s[i].x0) || !isfinite(s[i].x1) || !isfinite(s[i].us))
            return TY_EINVAL;
    if (rescale(prefill ? c->prefill : c->decode, s, n))
        return 0;
    double x[3];
    return keep_fit(c, prefill, fit_robust(s, n, x), x);
}

int ty_sched_cost_refit_prefill(struct ty_sched_cost *c, const struct ty_sched_sample *s,
                                size_t n)
{
    return refit(c, 1, s, n);
}

int ty_sched_cost_refit_decode(struct ty_sched_cost *c, const struct ty_sched_sample *s,
                               size_t n)
{
    return refit(c, 0, s, n);
}

void ty_sched_cost_cpu(const struct ty_sched_model_shape *m, uint32_t block_tokens,
                       struct ty_sched_cost *out)
{
    const double flops = 50e9 * 1e-6, bw = 10e9 * 1e-6; /* per microsecond */
    memset(out, 0, sizeof(*out));
    out->prefill[0] = 1000;
    out->prefill[1] = 2.0 * m->params / flops;
    out->prefill[2] = 2.0 * m->attn_dim * m->layers / flops;
    out->kv_bytes_per_token = m->kv_bytes_per_token;
    out->decode[0] = m->weight_bytes / bw;
    out->decode[1] = 2.0 * m->params / flops;
    out->decode[2] = m->kv_bytes_per_token / bw;
    out->net_bytes_per_us = 1e9 * 1e-6;
    out->block_tokens = block_tokens;
}

