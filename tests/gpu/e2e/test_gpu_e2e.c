/* End-to-end CUDA backend checks on the real stories260K model, the CPU backend as reference:
 * greedy ids for 256 tokens on several prompts, logits of a prefill, a batch of 8 mixed-length
 * sequences equal to each alone, CUDA graphs on = off (bit-identical logits), and KV exported
 * from one backend continuing on the other; random mkmodel files for the tuned head dims,
 * YaRN rope, mixtures of experts and gpt-oss. Exits 77 without a CUDA device or without
 * $TYCHO_TEST_DATA/models/stories260K/stories260K.gguf.
 *
 * Greedy comparisons allow one kind of divergence only: at a step where the reference's two
 * best logits are within TIE_GAP (float rounding of two different summation orders may pick
 * either); the comparison of that prompt then ends there. Any other difference fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/kvpool.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define B 16
#define TIE_GAP 1e-3f
static ty_model_t *model;
static uint32_t V;

static const char *g_kv = "f32"; /* KV element type of the engines mk_engine makes */

static ty_engine_t *mk_engine(const char *backend, const char *weights, bool no_graphs)
{
    struct ty_engine_opts o = {.kv_block_tokens = B, .max_seqs = 10, .max_ctx = 512,
                               .max_batch_tokens = 512, .no_prefix_sharing = true,
                               .backend = backend, .cuda_weights = weights,
                               .cuda_no_graphs = no_graphs, .kv_dtype = g_kv};
    ty_engine_t *e = NULL;
    assert_int_equal(ty_engine_new(&e, model, &o), 0);
    return e;
}

static void mk_prompt(uint32_t *p, size_t n, uint32_t salt)
{
    p[0] = 1; /* BOS, then in-vocabulary byte-level and merged tokens */
    for (size_t i = 1; i < n; i++)
        p[i] = 259 + (uint32_t)((i * 37 + salt * 101) % 253);
}

static struct ty_gen_params greedy(uint32_t n)
{
    struct ty_gen_params p = {.max_tokens = n, .ignore_eos = true};
    p.sampling.repetition_penalty = 1;
    p.sampling.n_logprobs = 2; /* the top-2 logprob gap tells a near-tie */
    return p;
}

/* Number of equal leading ids; fails unless they are all equal or the first difference is at
 * a near-tie of the reference. */
static size_t compare_ids(const struct ty_gen_result *ref, const struct ty_gen_result *got,
                          const char *what, int idx)
{
    assert_int_equal(ref->n_ids, got->n_ids);
    for (size_t k = 0; k < ref->n_ids; k++) {
        if (ref->ids[k] == got->ids[k])
            continue;
        const struct ty_sample *s = &ref->samples[k];
        float gap = s->n_top >= 2 ? s->top[0].logprob - s->top[1].logprob : INFINITY;
        printf("  %s %d: ids differ at step %zu (%u vs %u), reference top-2 gap %.2g\n", what,
               idx, k, ref->ids[k], got->ids[k], gap);
        if (!(gap < TIE_GAP))
            fail_msg("%s %d: divergence at step %zu is not a near-tie (gap %g)", what, idx, k,
                     gap);
        return k;
    }
    return ref->n_ids;
}

static void test_greedy_256_cpu_vs_cuda(void **state)
{
    enum { N = 6, GEN = 256 };
    static const size_t lens[N] = {1, 5, 17, 33, 64, 100};
    ty_engine_t *cpu = mk_engine("cpu", NULL, false), *gpu = mk_engine("cuda", "f32", false);
    int diverged = 0;
    for (int i = 0; i < N; i++) {
        uint32_t p[128];
        const uint32_t *pp = p;
        mk_prompt(p, lens[i], (uint32_t)i + 3);
        struct ty_gen_params gp = greedy(GEN);
        struct ty_gen_result a = {0}, b = {0};
        assert_int_equal(ty_engine_generate(cpu, &pp, &lens[i], 1, &gp, &a, NULL, NULL), 0);
        assert_int_equal(ty_engine_generate(gpu, &pp, &lens[i], 1, &gp, &b, NULL, NULL), 0);
        assert_int_equal(b.n_ids, GEN);
        diverged += compare_ids(&a, &b, "prompt", i) < GEN;
        ty_gen_result_clear(&a);
        ty_gen_result_clear(&b);
    }
    assert_true(ty_engine_healthy(gpu));
    assert_true(diverged <= 1); /* near-ties are rare: more than one means drift */
    ty_engine_free(cpu);
    ty_engine_free(gpu);
}

/* All logits of one prefill (logits_all) and of the following decode step. */
static float *run_logits(ty_engine_t *e, const uint32_t *t, uint32_t n)
{
    float *l = malloc(((size_t)n + 1) * V * 4);
    ty_kvseq_t *s;
    assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e), &s), 0);
    struct ty_batch_seq bs = {s, t, n, true};
    struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
    assert_int_equal(ty_engine_forward(e, &b, l), 0);
    struct ty_batch_seq ds = {s, t + 1, 1, false};
    b.seqs = &ds;
    assert_int_equal(ty_engine_forward(e, &b, l + (size_t)n * V), 0);
    ty_kvpool_seq_free(ty_engine_pool(e), s);
    return l;
}

static double nerr(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            return INFINITY;
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void test_prefill_logits(void **state)
{
    enum { N = 77 };
    uint32_t t[N];
    mk_prompt(t, N, 5);
    ty_engine_t *cpu = mk_engine("cpu", NULL, false);
    float *ref = run_logits(cpu, t, N);
    ty_engine_free(cpu);
    static const struct {
        const char *w;
        double tol;
    } cases[] = {{"f32", 1e-4}, {"f16", 2e-2}, {"bf16", 6e-2}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        ty_engine_t *gpu = mk_engine("cuda", cases[c].w, false);
        float *got = run_logits(gpu, t, N);
        double err = nerr(got, ref, ((size_t)N + 1) * V);
        printf("  %s weights: logits nerr %.3g (tol %.g)\n", cases[c].w, err, cases[c].tol);
        assert_true(err <= cases[c].tol);
        free(got);
        ty_engine_free(gpu);
    }
    free(ref);
}

static void test_batch8_equals_alone(void **state)
{
    enum { N = 8, GEN = 64 };
    uint32_t prompts[N][80];
    size_t lens[N];
    const uint32_t *pp[N];
    struct ty_gen_result alone[N], together[N], eager[N];
    struct ty_gen_params p = greedy(GEN);
    ty_engine_t *e = mk_engine("cuda", "f32", false);
    for (int i = 0; i < N; i++) {
        lens[i] = 3 + (size_t)i * 9; /* 3 .. 66 tokens: one block to five */
        mk_prompt(prompts[i], lens[i], (uint32_t)i);
        pp[i] = prompts[i];
        assert_int_equal(ty_engine_generate(e, &pp[i], &lens[i], 1, &p, &alone[i], NULL, NULL),
                         0);
    }
    assert_int_equal(ty_engine_generate(e, pp, lens, N, &p, together, NULL, NULL), 0);
    assert_int_equal(ty_kvpool_pages_used(ty_engine_pool(e)), 0);
    ty_engine_free(e);
    e = mk_engine("cuda", "f32", true); /* same batch without graphs: bit-identical */
    assert_int_equal(ty_engine_generate(e, pp, lens, N, &p, eager, NULL, NULL), 0);
    ty_engine_free(e);
    for (int i = 0; i < N; i++) {
        compare_ids(&alone[i], &together[i], "batched seq", i);
        assert_memory_equal(together[i].ids, eager[i].ids, GEN * sizeof(uint32_t));
        for (int k = 0; k < GEN; k++)
            assert_true(together[i].samples[k].logprob == eager[i].samples[k].logprob);
        ty_gen_result_clear(&alone[i]);
        ty_gen_result_clear(&together[i]);
        ty_gen_result_clear(&eager[i]);
    }
}

static uint32_t argmax(const float *l)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++)
        best = l[i] > l[best] ? i : best;
    return best;
}

/* Greedy decode of n tokens after `first` on sequence s. */
static void decode(ty_engine_t *e, ty_kvseq_t *s, uint32_t first, uint32_t *out, int n)
{
    float *l = malloc((size_t)V * 4);
    uint32_t tok = first;
    for (int i = 0; i < n; i++) {
        struct ty_batch_seq bs = {s, &tok, 1, false};
        struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
        assert_int_equal(ty_engine_forward(e, &b, l), 0);
        out[i] = tok = argmax(l);
    }
    free(l);
}

/* Prefill on `from`, export, import into `to`: both continue with the same greedy ids. */
static void export_import(const char *from, const char *to)
{
    enum { LP = 37, GEN = 30 };
    uint32_t t[LP], ref[GEN], got[GEN];
    mk_prompt(t, LP, 9);
    float *l = malloc(LP * (size_t)V * 4);
    ty_engine_t *e1 = mk_engine(from, "f32", false), *e2 = mk_engine(to, "f32", false);
    ty_kvseq_t *s1, *s2;
    assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e1), &s1), 0);
    struct ty_batch_seq bs = {s1, t, LP, false};
    struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
    assert_int_equal(ty_engine_forward(e1, &b, l), 0);
    uint32_t first = argmax(l);
    void *buf;
    size_t len;
    assert_int_equal(ty_kvpool_seq_export(ty_engine_pool(e1), s1, &buf, &len), 0);
    decode(e1, s1, first, ref, GEN);
    assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e2), &s2), 0);
    assert_int_equal(ty_kvpool_seq_import(ty_engine_pool(e2), s2, buf, len), 0);
    assert_int_equal(ty_kvseq_n_tokens(s2), LP);
    decode(e2, s2, first, got, GEN);
    int same = 0;
    while (same < GEN && ref[same] == got[same])
        same++;
    printf("  %s -> %s: %d of %d ids equal\n", from, to, same, GEN);
    assert_int_equal(same, GEN);
    free(buf);
    free(l);
    ty_kvpool_seq_free(ty_engine_pool(e1), s1);
    ty_kvpool_seq_free(ty_engine_pool(e2), s2);
    ty_engine_free(e1);
    ty_engine_free(e2);
}

static void test_export_import_across_backends(void **state)
{
    export_import("cpu", "cuda");
    export_import("cuda", "cpu");
    export_import("cuda", "cuda");
}

/* f16 KV pages on both backends: the CUDA kernels' f16 page writes and reads against the CPU
 * backend's (the same IEEE halves), greedy ids, and KV moved between the two. */
static void test_f16_kv(void **state)
{
    g_kv = "f16";
    ty_engine_t *gpu = mk_engine("cuda", "f32", false);
    assert_int_equal(ty_kvpool_dtype(ty_engine_pool(gpu)), TY_KV_F16);
    ty_engine_free(gpu);
    test_greedy_256_cpu_vs_cuda(state);
    test_export_import_across_backends(state);
    g_kv = "f32";
}

/* A random-weight model made by `tycho mkmodel` (byte vocabulary) with the head dims the
 * tuned kernels serve: f16 KV pages (g_model_kv) on both backends, so CUDA runs the tensor-core prefill
 * attention and the bandwidth decode attention. Two prefill chunks (the second over a cached
 * prefix of 100 tokens, not a tile multiple; more than 64 rows: two row tiles) and three decode
 * steps; every logit row against the CPU backend's; 64 greedy ids after a 40-token prompt
 * equal to the CPU backend's (compare_ids' near-tie rule). args: mkmodel's options. */
static const char *g_model_kv = "f16"; /* check_model's KV pages */
static bool g_model_hf;                   /* check_model loads mkmodel's --hf directory */

static void check_model(const char *args, const char *tag)
{
    const char *bin = getenv("TYCHO_BIN"), *bdir = getenv("TYCHO_BUILD_DIR");
    char tycho[512], path[512], cmd[2400], err[256];
    if (bin)
        snprintf(tycho, sizeof(tycho), "%s", bin);
    else if (bdir)
        snprintf(tycho, sizeof(tycho), "%s/src/cli/tycho", bdir);
    else
        skip(); /* no tycho to make the model with */
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof(path), "%s/tycho-gpu-e2e-%s-%d.gguf", tmp ? tmp : "/tmp", tag,
             (int)getpid());
    char hf[600] = "";
    if (g_model_hf)
        snprintf(hf, sizeof(hf), "%s.hf", path);
    snprintf(cmd, sizeof(cmd), "'%s' mkmodel %s --vocab-from bytes --out '%s'%s%s%s", tycho,
             args, path, hf[0] ? " --hf '" : "", hf, hf[0] ? "'" : "");
    assert_int_equal(system(cmd), 0);
    ty_model_t *m;
    if (ty_model_load(&m, hf[0] ? hf : path, err, sizeof(err)) != 0)
        fail_msg("%s: %s", tag, err);
    unlink(path);
    if (hf[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", hf);
        assert_int_equal(system(cmd), 0);
    }
    const uint32_t Vm = ty_model_config(m)->n_vocab;
    enum { N1 = 100, N2 = 50, STEPS = 3, ROWS = N1 + N2 + STEPS };
    uint32_t t[N1 + N2 + STEPS];
    for (uint32_t i = 0; i < N1 + N2 + STEPS; i++)
        t[i] = i == 0 ? 1 : 3 + (i * 37u) % (Vm - 3);
    float *l[2];
    struct ty_gen_result g[2] = {{0}, {0}};
    for (int k = 0; k < 2; k++) {
        struct ty_engine_opts o = {.kv_block_tokens = B, .max_seqs = 4, .max_ctx = 512,
                                   .max_batch_tokens = 512, .no_prefix_sharing = true,
                                   .backend = k ? "cuda" : "cpu", .kv_dtype = g_model_kv};
        ty_engine_t *e;
        assert_int_equal(ty_engine_new(&e, m, &o), 0);
        const uint32_t *gp = t; /* what `tycho generate` does: 64 greedy ids of a prompt */
        size_t glen = 40;
        struct ty_gen_params gpar = greedy(64);
        assert_int_equal(ty_engine_generate(e, &gp, &glen, 1, &gpar, &g[k], NULL, NULL), 0);
        l[k] = malloc((size_t)ROWS * Vm * 4);
        ty_kvseq_t *sq;
        assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e), &sq), 0);
        struct ty_batch_seq bs = {sq, t, N1, true};
        struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
        assert_int_equal(ty_engine_forward(e, &b, l[k]), 0);
        bs = (struct ty_batch_seq){sq, t + N1, N2, true};
        assert_int_equal(ty_engine_forward(e, &b, l[k] + (size_t)N1 * Vm), 0);
        for (int i = 0; i < STEPS; i++) {
            bs = (struct ty_batch_seq){sq, t + N1 + N2 + i, 1, false};
            assert_int_equal(ty_engine_forward(e, &b, l[k] + (size_t)(N1 + N2 + i) * Vm), 0);
        }
        ty_kvpool_seq_free(ty_engine_pool(e), sq);
        if (k)
            assert_true(ty_engine_healthy(e));
        ty_engine_free(e);
    }
    double e1 = nerr(l[1], l[0], (size_t)(N1 + N2) * Vm);
    double e2 = nerr(l[1] + (size_t)(N1 + N2) * Vm, l[0] + (size_t)(N1 + N2) * Vm,
                     (size_t)STEPS * Vm);
    /* bf16 pages keep 8 bits of mantissa to f16's 11, and the tensor-core paths round q to
     * the page type: a device K that rounds to the neighbouring bf16 moves a logit 8x more */
    const double tol = strcmp(g_model_kv, "bf16") ? 2e-2 : 6e-2;
    printf("  %s (%s, %s KV): prefill logits nerr %.3g, decode logits nerr %.3g\n", tag, args,
           g_model_kv, e1, e2);
    assert_true(e1 <= tol && e2 <= tol);
    compare_ids(&g[0], &g[1], tag, 0); /* equal but at a near-tie of the CPU's */
    ty_gen_result_clear(&g[0]);
    ty_gen_result_clear(&g[1]);
    free(l[0]), free(l[1]);
    ty_model_free(m);
}

static void test_tuned_head_dims(void **state)
{
    check_model("--dims 256,2,4,2,688 --type f16", "hd64-gqa2");
    check_model("--dims 512,2,4,1,1024 --type f16", "hd128-mqa");
    check_model("--dims 1024,1,8,2,1024 --type f16", "hd128-gqa4");
}

/* YaRN rope (the CPU's per-pair mix table uploaded as is): an original context of 64 tokens
 * stretched 8 times, so positions 64..152 of check_model's prompt lie past it; llama's
 * interleaved pairs and Qwen3's NeoX pairs with q/k norms. */
static void test_yarn(void **state)
{
    check_model("--dims 256,2,4,2,688 --type f16 --yarn 8,64", "yarn-llama");
    check_model("--arch qwen3 --dims 256,2,4,2,688 --type f16 --yarn 8,64", "yarn-qwen3");
}

/* Mixtures of experts (kernels/moe.cu): Qwen3-MoE (q/k norms, NeoX rope) and Mixtral (GGUF
 * llama with experts), 8 experts with 2 used; F32 files, so the device routes on the logits the
 * CPU routes on (a near-tie flipped by rounding would pick another expert). */
static void test_moe(void **state)
{
    check_model("--arch qwen3moe --dims 256,2,4,2,128 --type f32 --experts 8 --experts-used 2",
                "qwen3moe");
    check_model("--arch mixtral --dims 256,2,4,2,128 --type f32 --experts 8 --experts-used 2",
                "mixtral");
}

/* gpt-oss (attention sinks, q/k/v/output biases, even layers sliding over 16 tokens, biased
 * experts with SwiGLU-OAI, top-k-then-softmax routing, YaRN): 153 positions, so windows and
 * YaRN's stretch both matter; F32 as test_moe. */
static void test_gptoss(void **state)
{
    check_model("--arch gpt-oss --dims 256,2,4,2,128 --type f32 --experts 8 --experts-used 2 "
                "--yarn 4,64 --untied",
                "gpt-oss");
}

/* Greedy picks on the device (struct ty_batch.ids; the CUDA backend's greedy_ids): a prefill
 * batch (one prompt with every row) and then 8 all-decode steps of 3 sequences (graph-captured)
 * give in ids the argmax of each row of the same batches run for logits, and the logits
 * buffer is left as it was (only the ids come back). */
/* One engine's part of test_greedy_ids_on_device and test_draws_on_device: prompts a (a row for
 * every token), b and c as new sequences s[0..3) in one batch with `picks`' ids or draws, rows
 * into logits (poisoned with 0x7f bytes first, so what is left unwritten shows). */
static void three_prompts(ty_engine_t *e, ty_kvseq_t *s[3], const uint32_t *a, const uint32_t *b,
                          const uint32_t *c, const struct ty_batch *picks, float *logits,
                          size_t rows)
{
    for (int i = 0; i < 3; i++)
        assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e), &s[i]), 0);
    struct ty_batch_seq bs[3] = {{s[0], a, 30, true}, {s[1], b, 45, false}, {s[2], c, 12, false}};
    struct ty_batch batch = *picks;
    batch.seqs = bs;
    batch.n_seqs = 3;
    memset(logits, 0x7f, rows * V * 4);
    assert_int_equal(ty_engine_forward(e, &batch, logits), 0);
}

static void test_greedy_ids_on_device(void **state)
{
    uint32_t a[30], b[45], c[12];
    mk_prompt(a, 30, 1), mk_prompt(b, 45, 2), mk_prompt(c, 12, 3);
    enum { ROWS = 30 + 1 + 1, STEPS = 8 };
    float *want = malloc((size_t)ROWS * V * 4), *buf = malloc((size_t)ROWS * V * 4);
    uint32_t ids[ROWS], next[2][3];
    ty_engine_t *e[2] = {mk_engine("cuda", "f32", false), mk_engine("cuda", "f32", false)};
    ty_kvseq_t *s[2][3];
    three_prompts(e[0], s[0], a, b, c, &(struct ty_batch){0}, want, ROWS);
    three_prompts(e[1], s[1], a, b, c, &(struct ty_batch){.ids = ids}, buf, ROWS);
    for (uint32_t r = 0; r < ROWS; r++)
        assert_int_equal(ids[r], argmax(want + (size_t)r * V));
    for (size_t i = 0; i < (size_t)ROWS * V; i++)
        assert_true(buf[i] != buf[i] || ((uint32_t *)buf)[i] == 0x7f7f7f7fu);
    for (int i = 0; i < 3; i++)
        next[0][i] = next[1][i] = ids[i == 0 ? 29 : 29 + i];
    for (int step = 0; step < STEPS; step++) {
        for (int k = 0; k < 2; k++) {
            struct ty_batch_seq bs[3];
            for (int i = 0; i < 3; i++)
                bs[i] = (struct ty_batch_seq){s[k][i], &next[k][i], 1, false};
            struct ty_batch batch = {.seqs = bs, .n_seqs = 3, .ids = k ? ids : NULL};
            assert_int_equal(ty_engine_forward(e[k], &batch, k ? buf : want), 0);
        }
        for (int i = 0; i < 3; i++) {
            assert_int_equal(ids[i], argmax(want + (size_t)i * V));
            next[0][i] = next[1][i] = ids[i];
        }
    }
    for (int k = 0; k < 2; k++) {
        assert_true(ty_engine_healthy(e[k]));
        for (int i = 0; i < 3; i++)
            ty_kvpool_seq_free(ty_engine_pool(e[k]), s[k][i]);
        ty_engine_free(e[k]);
    }
    free(want);
    free(buf);
}

/* Draws on the device (struct ty_batch.draws) in the engine: the batch of
 * test_greedy_ids_on_device on two CUDA engines, one with draws (greedy after adjustments: a
 * ban of each row's best token and a bias lifting another, and the top 5 log-probabilities),
 * the other writing its rows, drawn on the host by ty_sampler_draw with the same draws: the
 * same ids, log-probabilities within 1e-3, and the drawing engine's logits buffer untouched. */
static void test_draws_on_device(void **state)
{
    uint32_t a[30], b[45], c[12];
    mk_prompt(a, 30, 1), mk_prompt(b, 45, 2), mk_prompt(c, 12, 3);
    enum { ROWS = 30 + 1 + 1 };
    float *want = malloc((size_t)ROWS * V * 4), *buf = malloc((size_t)ROWS * V * 4);
    struct ty_sample got[ROWS], ref;
    struct ty_row_draw d[ROWS];
    struct ty_logit_adj adj[ROWS * 2];
    ty_engine_t *e[2] = {mk_engine("cuda", "f32", false), mk_engine("cuda", "f32", false)};
    ty_kvseq_t *s[2][3];
    three_prompts(e[0], s[0], a, b, c, &(struct ty_batch){0}, want, ROWS);
    for (uint32_t r = 0; r < ROWS; r++) {
        uint32_t best = argmax(want + (size_t)r * V), lift = (best + 17 + r) % V;
        adj[2 * r] = (struct ty_logit_adj){best, 1, 0, -INFINITY};
        adj[2 * r + 1] = (struct ty_logit_adj){lift, 1.1f, 0.2f, r % 2 ? 30.0f : 0};
        d[r] = (struct ty_row_draw){.adj_begin = 2 * r, .n_adj = 2, .n_logprobs = 5,
                                    .logprobs = true};
    }
    three_prompts(e[1], s[1], a, b, c,
                  &(struct ty_batch){.draws = d, .adj = adj, .samples = got}, buf, ROWS);
    for (size_t i = 0; i < (size_t)ROWS * V; i++)
        assert_true(((uint32_t *)buf)[i] == 0x7f7f7f7fu);
    ty_sampler_t *host;
    struct ty_sampling_params none = {0};
    assert_int_equal(ty_sampler_new(&host, &none, V), 0);
    for (uint32_t r = 0; r < ROWS; r++) {
        ty_sampler_draw(host, want + (size_t)r * V, &d[r], adj + d[r].adj_begin, &ref);
        assert_int_equal(got[r].id, ref.id);
        assert_true(fabsf(got[r].logprob - ref.logprob) < 1e-3f);
        assert_int_equal(got[r].n_top, ref.n_top);
        for (uint32_t j = 0; j < ref.n_top; j++)
            assert_true(fabsf(got[r].top[j].logprob - ref.top[j].logprob) < 1e-3f);
    }
    ty_sampler_free(host);
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 3; i++)
            ty_kvpool_seq_free(ty_engine_pool(e[k]), s[k][i]);
        ty_engine_free(e[k]);
    }
    free(want);
    free(buf);
}

/* bf16 KV pages (engine.kv_dtype: bf16) on both backends: the same rounding to nearest even
 * on either side, so greedy ids agree and pages move between CPU and CUDA engines as bytes; the
 * stories260K model (head_dim 8: the general kernels) and the tuned head dims (tensor-core
 * prefill, bandwidth decode, and on Hopper the wgmma prefill, in their bf16 instances). */
static void test_bf16_kv(void **state)
{
    g_kv = "bf16";
    ty_engine_t *gpu = mk_engine("cuda", "f32", false);
    assert_int_equal(ty_kvpool_dtype(ty_engine_pool(gpu)), TY_KV_BF16);
    ty_engine_free(gpu);
    test_greedy_256_cpu_vs_cuda(state);
    test_export_import_across_backends(state);
    g_kv = "f32";
    g_model_kv = "bf16";
    check_model("--dims 256,2,4,2,688 --type f16", "hd64-gqa2-bf16kv");
    check_model("--dims 1024,1,8,2,1024 --type f16", "hd128-gqa4-bf16kv");
    g_model_kv = "f16";
}

/* DeepSeek-V3's shape (tycho mkmodel --arch deepseek2): multi-head latent attention with a
 * low-rank query (kernels/mla.cu: the latent rows as the paged KV, absorbed queries, per-head
 * k_b/v_b through batched cuBLAS), a dense first layer, sigmoid routing over 4 expert groups
 * with a selection bias, a shared expert; DeepSeek-V2's softmax routing; F32 files as test_moe
 * (routing on the CPU's logits) and an F16 one; and the same weights as a Hugging Face
 * directory (kv_b_proj instead of k_b/v_b: the transposed absorption). */
static void test_deepseek2(void **state)
{
    check_model("--arch deepseek2 --dims 256,2,4,4,128 --type f32", "deepseek2");
    check_model("--arch deepseek2 --dims 256,2,4,4,128 --type f32 --deepseek-v2", "deepseek-v2");
    check_model("--arch deepseek2 --dims 256,2,4,4,128 --type f16 --yarn 4,64", "deepseek2-f16");
    g_model_hf = true;
    check_model("--arch deepseek2 --dims 256,2,4,4,128 --type f32", "deepseek2-hf");
    g_model_hf = false;
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("test_gpu_e2e: no CUDA device, skipping\n");
        return 77;
    }
    const char *data = getenv("TYCHO_TEST_DATA");
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/models/stories260K/stories260K.gguf", data ? data : "");
    if (!data || ty_model_load(&model, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "skip: %s\n", data ? err : "TYCHO_TEST_DATA not set");
        return 77;
    }
    V = ty_model_config(model)->n_vocab;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_logits),
        cmocka_unit_test(test_greedy_256_cpu_vs_cuda),
        cmocka_unit_test(test_batch8_equals_alone),
        cmocka_unit_test(test_export_import_across_backends),
        cmocka_unit_test(test_f16_kv),
        cmocka_unit_test(test_bf16_kv),
        cmocka_unit_test(test_greedy_ids_on_device),
        cmocka_unit_test(test_draws_on_device),
        cmocka_unit_test(test_tuned_head_dims),
        cmocka_unit_test(test_yarn),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_gptoss),
        cmocka_unit_test(test_deepseek2),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ty_model_free(model);
    return rc;
}
