/* ty_cuda_qkv_rope_store against a double-precision loop written from its definition: bias,
 * per-head q/k RMSNorm (Qwen3), HF rotate_half order undone, rotary pairs (GGUF interleaved or NeoX), llama-style frequency
 * divisors, q dense, K/V into page slots (f32, f16, bf16 pools; a negative slot writes
 * nothing). Outputs poisoned with NaN first; pool pages not addressed must stay poisoned.
 * YaRN cases take their q and k from the CPU backend's ty__cpu_rope on the same inputs and
 * tables instead (the per-pair mix ramp and magnitude of a 16x YaRN). */
#include "gpu_test_util.h"

#include "cpu/cpu-impl.h" /* ty__cpu_rope: the CPU backend's rope, the YaRN cases' reference */

struct qcase {
    int n_tokens, n_heads, n_kv, hd, B, neox, hf, bias;
    enum ty_cuda_dtype type;
    int norm; /* q/k RMSNorm weights */
    int yarn; /* YaRN mix and magnitude; reference: the CPU backend */
};

#define YARN_FACTOR 16.0f

/* A YaRN mix table shaped as model.c's make_yarn makes one: 1 for the first pairs, 0 for the
 * last, a linear ramp between. */
static void yarn_table(float *mix, int half)
{
    float lo = (float)(half / 4), hi = (float)(half * 3 / 4);
    for (int i = 0; i < half; i++) {
        float y = ((float)i - lo) / (hi - lo);
        mix[i] = 1 - (y < 0 ? 0 : y > 1 ? 1 : y);
    }
}

#define NORM_EPS 1e-6f

/* head (hd) = head / sqrt(mean(head^2) + eps) * w, in double (RMSNorm's definition). */
static void ref_norm(float *head, const float *w, int hd)
{
    double ss = 0;
    for (int i = 0; i < hd; i++)
        ss += (double)head[i] * head[i];
    double scale = 1.0 / sqrt(ss / hd + NORM_EPS);
    for (int i = 0; i < hd; i++)
        head[i] = (float)(head[i] * scale * w[i]);
}

/* Element j (interleaved layout) of head vector src, after the HF reorder when hf. */
static double src_at(const float *src, int hd, int hf, int j)
{
    return hf ? src[(j & 1) ? hd / 2 + (j >> 1) : (j >> 1)] : src[j];
}

static void ref_head(double *out, const float *src, const struct qcase *c, int pos,
                     const float *div, float scale)
{
    int hd = c->hd, half = hd / 2;
    for (int i = 0; i < half; i++) {
        /* the angle as the kernel defines it: ggml's f32 recurrence, f32 division */
        float th = (float)pos;
        for (int k = 0; k < i; k++)
            th *= scale;
        double ang = (double)(th / div[i]);
        int a = c->neox ? i : 2 * i, b = c->neox ? i + half : 2 * i + 1;
        double x0 = src_at(src, hd, c->hf, a), x1 = src_at(src, hd, c->hf, b);
        out[a] = x0 * cos(ang) - x1 * sin(ang);
        out[b] = x0 * sin(ang) + x1 * cos(ang);
    }
}

/* The CPU backend's rope of one head (interleaved-order input) into out. */
static void cpu_head(double *out, const float *src, const struct qcase *c, int pos,
                     float *div, float *mix, float scale)
{
    struct ty_model m;
    float x[1024];
    memset(&m, 0, sizeof(m));
    m.cfg.rope = c->neox ? TY_ROPE_NEOX : TY_ROPE_NORM;
    m.rope_theta_scale = scale;
    m.rope_div = div;
    m.rope_mix = mix;
    m.rope_freq_scale = 1.0f / YARN_FACTOR;
    m.rope_mscale = 1.0f + 0.1f * logf(YARN_FACTOR);
    for (int j = 0; j < c->hd; j++)
        x[j] = (float)src_at(src, c->hd, c->hf, j);
    ty__cpu_rope(x, (uint32_t)c->hd, (uint32_t)pos, &m);
    for (int j = 0; j < c->hd; j++)
        out[j] = x[j];
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

static void run_case(const struct qcase *c, uint64_t *rng)
{
    int T = c->n_tokens, hd = c->hd, Q = c->n_heads * hd, KV = c->n_kv * hd, ld = Q + 2 * KV;
    int n_pages = (T + c->B - 1) / c->B + 2;
    size_t page_elems = (size_t)c->n_kv * c->B * hd, pool_elems = page_elems * n_pages;
    size_t es = gt_dtype_size(c->type);
    float *qkv = malloc((size_t)T * ld * 4), *bias = malloc((size_t)ld * 4);
    float *qn = malloc((size_t)hd * 4), *kn = malloc((size_t)hd * 4);
    gt_fill(qn, hd, rng, 0.5f, 1.5f);
    gt_fill(kn, hd, rng, 0.5f, 1.5f);
    float div[512], mix[512], scale = powf(10000.0f, -2.0f / hd);
    yarn_table(mix, hd / 2);
    int32_t *pos = malloc(T * 4), *slots = malloc(T * 4);
    gt_fill(qkv, (size_t)T * ld, rng, -2, 2);
    gt_fill(bias, ld, rng, -0.5f, 0.5f);
    for (int i = 0; i < hd / 2; i++)
        div[i] = i % 3 ? 1.0f : gt_uniform(rng, 1.0f, 8.0f);
    for (int t = 0; t < T; t++) {
        pos[t] = gt_randint(rng, 0, 5000);
        slots[t] = t == 1 ? -1 : t + c->B / 2; /* distinct, across pages; one skipped */
    }
    float *dq = gt_upload(qkv, (size_t)T * ld * 4), *db = gt_upload(bias, (size_t)ld * 4);
    float *ddiv = gt_upload(div, sizeof(div)), *dqo = gt_dev((size_t)T * Q * 4);
    float *dmix = gt_upload(mix, sizeof(mix));
    float *dqn = gt_upload(qn, (size_t)hd * 4), *dkn = gt_upload(kn, (size_t)hd * 4);
    int32_t *dpos = gt_upload(pos, T * 4), *dslot = gt_upload(slots, T * 4);
    void *kp = gt_dev(pool_elems * es), *vp = gt_dev(pool_elems * es);
    gt_poison(dqo, (size_t)T * Q * 4);
    gt_poison(kp, pool_elems * es);
    gt_poison(vp, pool_elems * es);
    struct ty_cuda_kv_layout l = {c->type, c->n_kv, c->B, hd, n_pages};
    struct ty_cuda_qkv p = {c->n_heads, c->n_kv, hd, c->neox, c->hf, scale, ddiv,
                            c->norm ? dqn : NULL, c->norm ? dkn : NULL, NORM_EPS,
                            c->yarn ? dmix : NULL, 1.0f / YARN_FACTOR,
                            1.0f + 0.1f * logf(YARN_FACTOR)};
    assert_int_equal(ty_cuda_qkv_rope_store(dqo, kp, vp, &l, dq, c->bias ? db : NULL, dpos,
                                            dslot, T, &p, NULL), 0);
    float *q = malloc((size_t)T * Q * 4);
    void *kh = malloc(pool_elems * es), *vh = malloc(pool_elems * es);
    gt_download(q, dqo, (size_t)T * Q * 4);
    gt_download(kh, kp, pool_elems * es);
    gt_download(vh, vp, pool_elems * es);
    double *want = malloc((size_t)hd * 8), tol = c->type == TY_CUDA_F32 ? 2e-6 : 1e-2;
    float *src = malloc((size_t)ld * 4), *got = malloc((size_t)hd * 4);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < ld; i++)
            src[i] = qkv[(size_t)t * ld + i] + (c->bias ? bias[i] : 0.0f);
        for (int h = 0; c->norm && h < c->n_heads + c->n_kv; h++)
            ref_norm(src + h * hd, h < c->n_heads ? qn : kn, hd);
        for (int h = 0; h < c->n_heads + 2 * c->n_kv; h++) {
            bool isq = h < c->n_heads, isv = h >= c->n_heads + c->n_kv;
            if (isv)
                for (int j = 0; j < hd; j++)
                    want[j] = src[h * hd + j];
            else if (c->yarn)
                cpu_head(want, src + h * hd, c, pos[t], div, mix, scale);
            else
                ref_head(want, src + h * hd, c, pos[t], div, scale);
            if (isq) {
                GT_EXPECT_NERR(q + ((size_t)t * c->n_heads + h) * hd, want, hd, 2e-6,
                               "q t%d h%d hd%d neox%d hf%d norm%d", t, h, hd, c->neox, c->hf,
                               c->norm);
                continue;
            }
            if (slots[t] < 0)
                continue;
            int kh_i = isv ? h - c->n_heads - c->n_kv : h - c->n_heads;
            size_t base = (((size_t)(slots[t] / c->B) * c->n_kv + kh_i) * c->B + slots[t] % c->B) *
                          hd;
            for (int j = 0; j < hd; j++)
                got[j] = read_pool(isv ? vh : kh, c->type, base + j);
            GT_EXPECT_NERR(got, want, hd, tol, "%s t%d h%d %s", isv ? "v" : "k", t, h,
                           gt_dtype_name(c->type));
        }
    }
    /* the skipped token's slot (t = 1) was written by nobody: still poisoned (NaN) */
    int sk = 1 + c->B / 2;
    size_t skip = (((size_t)(sk / c->B) * c->n_kv) * c->B + sk % c->B) * hd;
    if (T > 1)
        assert_true(isnan(read_pool(kh, c->type, skip)) && isnan(read_pool(vh, c->type, skip)));
    free(qn), free(kn), cudaFree(dqn), cudaFree(dkn);
    free(qkv), free(bias), free(pos), free(slots), free(q), free(kh), free(vh), free(want),
        free(src), free(got);
    cudaFree(dq), cudaFree(db), cudaFree(ddiv), cudaFree(dmix), cudaFree(dqo), cudaFree(dpos),
        cudaFree(dslot), cudaFree(kp), cudaFree(vp);
}

static void test_qkv_rope_store(void **state)
{
    static const struct qcase cases[] = {
        {5, 8, 4, 8, 16, 0, 0, 0, TY_CUDA_F32, 0, 0},
        {9, 4, 4, 64, 7, 0, 1, 0, TY_CUDA_F32, 0, 0},
        {3, 14, 2, 64, 64, 1, 0, 1, TY_CUDA_F32, 0, 0},
        {17, 32, 8, 128, 16, 0, 1, 0, TY_CUDA_F16, 0, 0},
        {2, 2, 1, 256, 32, 1, 0, 1, TY_CUDA_BF16, 0, 0},
        {1, 12, 12, 80, 16, 0, 0, 1, TY_CUDA_F32, 0, 0},
        /* Qwen3: q/k norm, NeoX, no bias; head_dim 128 (4 warps) and 80 (2 warps, one partly
         * idle in the rope) */
        {6, 16, 8, 128, 16, 1, 0, 0, TY_CUDA_F32, 1, 0},
        {4, 4, 2, 80, 16, 1, 0, 0, TY_CUDA_F16, 1, 0},
        {3, 8, 2, 64, 16, 1, 0, 1, TY_CUDA_F32, 1, 0},
        /* YaRN against the CPU backend: GGUF llama order, HF order, NeoX with Qwen3's norms */
        {7, 8, 4, 64, 16, 0, 0, 0, TY_CUDA_F32, 0, 1},
        {5, 4, 2, 128, 16, 0, 1, 1, TY_CUDA_F16, 0, 1},
        {4, 8, 2, 64, 16, 1, 0, 0, TY_CUDA_F32, 1, 1},
    };
    uint64_t rng = 42;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_case(&cases[i], &rng);
}

static void test_qkv_rejects_bad_shapes(void **state)
{
    struct ty_cuda_kv_layout l = {TY_CUDA_F32, 2, 16, 8, 4};
    float div[4] = {1, 1, 1, 1};
    struct ty_cuda_qkv p = {4, 2, 8, 0, 0, 0.5f, div, NULL, NULL, 0.0f, NULL, 0.0f, 0.0f};
    p.n_heads = 3; /* not a multiple of n_kv_heads */
    assert_int_equal(ty_cuda_qkv_rope_store(NULL, NULL, NULL, &l, NULL, NULL, NULL, NULL, 1, &p,
                                            NULL), TY_EINVAL);
    p.n_heads = 4;
    p.head_dim = 7;
    assert_int_equal(ty_cuda_qkv_rope_store(NULL, NULL, NULL, &l, NULL, NULL, NULL, NULL, 1, &p,
                                            NULL), TY_EINVAL);
    p.head_dim = 8;
    p.q_norm = div; /* a q norm without a k norm */
    assert_int_equal(ty_cuda_qkv_rope_store(NULL, NULL, NULL, &l, NULL, NULL, NULL, NULL, 1, &p,
                                            NULL), TY_EINVAL);
}

int main(void)
{
    gt_require_gpu("test_gpu_qkv");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qkv_rope_store),
        cmocka_unit_test(test_qkv_rejects_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
