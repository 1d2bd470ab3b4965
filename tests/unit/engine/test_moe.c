/* Mixture-of-experts models (Qwen3-MoE, Mixtral as llama with experts) on small GGUF files
 * written here with the GGUF writer (values a function of the tensor's name, so that a dense
 * FFN and an expert can hold the same matrix):
 *   - a qwen3moe and a llama-with-experts file load with their expert counts; an HF
 *     qwen3_moe directory's config is read as transformers reads it;
 *   - every unsupported variant is refused at load with a message naming it: gating other
 *     than softmax, shared experts (key or tensors), an expert weight scale, expert counts
 *     out of range, qwen3moe without experts, 2-D expert tensors, a missing expert matrix, a
 *     dense FFN among the experts; HF dense layers among expert layers, no experts;
 *   - one expert used of one is the dense FFN: a llama file with one expert gives the logits
 *     of the dense llama file whose FFN is that expert;
 *   - grouping by expert does not change a token's result: a prompt's logits from one batch
 *     (every expert gets a group of tokens) equal those from one token at a time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/hash.h"
#include "tycho/kvpool.h"
#include "tycho/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIM 32
#define LAYERS 2
#define HEADS 2
#define KV_HEADS 1
#define HD 16
#define FFN 64
#define VOCAB 48

static char tmpdir[256];

/* What to write; zeroed = a valid qwen3moe file of 4 experts, 2 used. */
struct variant {
    const char *arch;       /* NULL: qwen3moe */
    uint32_t experts, used; /* 0: 4 and 2 */
    bool dense;             /* a dense FFN and no experts (llama only) */
    bool no_expert_count;
    uint32_t gating;        /* <arch>.expert_gating_func, 0: absent */
    uint32_t shared;        /* <arch>.expert_shared_count, 0: absent */
    bool shexp_tensor;      /* blk.0.ffn_gate_inp_shexp.weight */
    float scale;            /* <arch>.expert_weights_scale, 0: absent */
    bool exps_2d;           /* expert tensors as matrices */
    bool drop_up;           /* no blk.N.ffn_up_exps */
    bool dense_too;         /* blk.0.ffn_gate.weight besides the experts */
};

struct wt {
    char name[64];
    uint32_t nd;
    uint64_t ne[3];
    bool ones;
};

/* Element e of the tensor named `name`: uniform with std 1/sqrt(cols) (4/sqrt(cols) for the
 * router), keyed by the name less an "_exps" (expert 0 of a one-expert file is the dense
 * FFN's matrix). */
static float value(const struct wt *t, uint64_t e)
{
    char key[64];
    snprintf(key, sizeof(key), "%s", t->name);
    char *x = strstr(key, "_exps");
    if (x)
        memmove(x, x + 5, strlen(x + 5) + 1);
    uint64_t h = 1469598103934665603ull;
    for (const char *p = key; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    uint64_t r = ty_hash_mix64(h ^ e * 0x9e3779b97f4a7c15ull);
    float u = (float)(r >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
    float s = sqrtf(3.0f / (float)t->ne[0]) * (strstr(t->name, "gate_inp") ? 4.0f : 1.0f);
    return t->ones ? 1.0f : u * s;
}

static int fill(void *arg, uint64_t i, uint64_t off, void *buf, size_t len)
{
    const struct wt *t = (const struct wt *)arg + i;
    for (size_t k = 0; k < len / 4; k++) {
        float v = value(t, off / 4 + k);
        memcpy((char *)buf + 4 * k, &v, 4);
    }
    return 0;
}

static void add(struct wt *t, size_t *n, const char *name, uint32_t nd, uint64_t n0, uint64_t n1,
                uint64_t n2, bool ones)
{
    struct wt *w = &t[(*n)++];
    snprintf(w->name, sizeof(w->name), "%s", name);
    w->nd = nd;
    w->ne[0] = n0, w->ne[1] = n1, w->ne[2] = n2;
    w->ones = ones;
}

/* tmpdir/NAME.gguf as v says; returns its path. */
static const char *write_gguf(const char *name, const struct variant *v)
{
    static char path[512];
    const char *arch = v->arch ? v->arch : "qwen3moe";
    bool qwen = strcmp(arch, "qwen3moe") == 0;
    uint32_t E = v->dense ? 0 : v->experts ? v->experts : 4, K = v->used ? v->used : 2;
    struct wt t[64];
    size_t n = 0;
    char key[96], tn[64];
    ty_gguf_writer_t *w;
    assert_int_equal(ty_gguf_writer_new(&w), 0);
#define KV(k, v) (snprintf(key, sizeof(key), "%s." k, arch), ty_gguf_writer_kv_u32(w, key, v))
    assert_int_equal(ty_gguf_writer_kv_str(w, "general.architecture", arch), 0);
    assert_int_equal(KV("context_length", 256), 0);
    assert_int_equal(KV("embedding_length", DIM), 0);
    assert_int_equal(KV("block_count", LAYERS), 0);
    assert_int_equal(KV("feed_forward_length", FFN), 0);
    assert_int_equal(KV("attention.head_count", HEADS), 0);
    assert_int_equal(KV("attention.head_count_kv", KV_HEADS), 0);
    assert_int_equal(KV("attention.key_length", HD), 0);
    if (E && !v->no_expert_count)
        assert_int_equal(KV("expert_count", E), 0);
    if (E)
        assert_int_equal(KV("expert_used_count", K), 0);
    if (v->gating)
        assert_int_equal(KV("expert_gating_func", v->gating), 0);
    if (v->shared)
        assert_int_equal(KV("expert_shared_count", v->shared), 0);
#undef KV
    if (v->scale != 0.0f) {
        snprintf(key, sizeof(key), "%s.expert_weights_scale", arch);
        assert_int_equal(ty_gguf_writer_kv_f32(w, key, v->scale), 0);
    }
    add(t, &n, "token_embd.weight", 2, DIM, VOCAB, 1, false);
    add(t, &n, "output_norm.weight", 1, DIM, 1, 1, true);
    add(t, &n, "output.weight", 2, DIM, VOCAB, 1, false);
    for (uint32_t l = 0; l < LAYERS; l++) {
#define L(s, nd, a, b, c, ones) \
    (snprintf(tn, sizeof(tn), "blk.%u." s, l), add(t, &n, tn, nd, a, b, c, ones))
        L("attn_norm.weight", 1, DIM, 1, 1, true);
        L("attn_q.weight", 2, DIM, HEADS * HD, 1, false);
        L("attn_k.weight", 2, DIM, KV_HEADS * HD, 1, false);
        L("attn_v.weight", 2, DIM, KV_HEADS * HD, 1, false);
        L("attn_output.weight", 2, HEADS * HD, DIM, 1, false);
        if (qwen) {
            L("attn_q_norm.weight", 1, HD, 1, 1, true);
            L("attn_k_norm.weight", 1, HD, 1, 1, true);
        }
        L("ffn_norm.weight", 1, DIM, 1, 1, true);
        if (!E || (v->dense_too && l == 0)) {
            L("ffn_gate.weight", 2, DIM, FFN, 1, false);
            L("ffn_up.weight", 2, DIM, FFN, 1, false);
            L("ffn_down.weight", 2, FFN, DIM, 1, false);
        }
        if (E) {
            uint32_t nd = v->exps_2d ? 2 : 3, e3 = v->exps_2d ? 1 : E;
            L("ffn_gate_inp.weight", 2, DIM, E, 1, false);
            L("ffn_gate_exps.weight", nd, DIM, FFN, e3, false);
            if (!v->drop_up)
                L("ffn_up_exps.weight", nd, DIM, FFN, e3, false);
            L("ffn_down_exps.weight", nd, FFN, DIM, e3, false);
        }
        if (v->shexp_tensor && l == 0)
            L("ffn_gate_inp_shexp.weight", 1, DIM, 1, 1, false);
#undef L
    }
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ty_gguf_writer_tensor(w, t[i].name, TY_GGML_F32, t[i].nd, t[i].ne), 0);
    snprintf(path, sizeof(path), "%s/%s.gguf", tmpdir, name);
    assert_int_equal(ty_gguf_writer_write(w, path, fill, t), 0);
    ty_gguf_writer_free(w);
    return path;
}

static ty_model_t *load(const char *path)
{
    ty_model_t *m;
    char err[256];
    int rc = ty_model_load(&m, path, err, sizeof(err));
    if (rc)
        fail_msg("%s: %s", path, err);
    return m;
}

static void expect_refused(const char *path, int want_rc, const char *want_msg)
{
    ty_model_t *m = NULL;
    char err[256] = "";
    int rc = ty_model_load(&m, path, err, sizeof(err));
    if (rc != want_rc || !strstr(err, want_msg))
        fail_msg("%s: rc %d (want %d), message '%s' (want '%s')", path, rc, want_rc, err,
                 want_msg);
    assert_null(m);
}

static void test_loads(void **state)
{
    (void)state;
    ty_model_t *m = load(write_gguf("qwen3moe", &(struct variant){0}));
    const struct ty_model_config *c = ty_model_config(m);
    assert_int_equal(c->arch, TY_MODEL_ARCH_QWEN3MOE);
    assert_int_equal(c->n_experts, 4);
    assert_int_equal(c->n_experts_used, 2);
    assert_true(c->moe_norm_topk);
    assert_non_null(strstr(ty_model_desc(m), "e2/4"));
    ty_model_free(m);
    m = load(write_gguf("mixtral", &(struct variant){.arch = "llama", .experts = 8}));
    assert_int_equal(ty_model_config(m)->arch, TY_MODEL_ARCH_LLAMA);
    assert_int_equal(ty_model_config(m)->n_experts, 8);
    ty_model_free(m);
}

static void test_refused(void **state)
{
    (void)state;
    expect_refused(write_gguf("sigmoid", &(struct variant){.gating = 2}), TY_ENOTSUP,
                   "expert gating function 2");
    expect_refused(write_gguf("shared", &(struct variant){.shared = 1}), TY_ENOTSUP,
                   "shared experts");
    expect_refused(write_gguf("shexp", &(struct variant){.shexp_tensor = true}), TY_ENOTSUP,
                   "shared experts");
    expect_refused(write_gguf("scale", &(struct variant){.scale = 2.5f}), TY_ENOTSUP,
                   "expert weight scale");
    expect_refused(write_gguf("many", &(struct variant){.experts = 300, .exps_2d = true}), TY_ENOTSUP,
                   "300 experts");
    expect_refused(write_gguf("used", &(struct variant){.used = 5}), TY_ENOTSUP,
                   "5 used per token");
    expect_refused(write_gguf("nocount", &(struct variant){.no_expert_count = true}),
                   TY_EFORMAT, "without qwen3moe.expert_count");
    expect_refused(write_gguf("flat", &(struct variant){.exps_2d = true}), TY_EFORMAT,
                   "must have 3 dimensions");
    expect_refused(write_gguf("noup", &(struct variant){.drop_up = true}), TY_EFORMAT,
                   "missing tensor: ffn_up of expert 0");
    expect_refused(write_gguf("mixed", &(struct variant){.dense_too = true}), TY_ENOTSUP,
                   "dense FFN in a mixture-of-experts model");
    /* HF: config.json is read before any weight */
    static const struct {
        const char *name, *cfg, *msg;
        int rc;
    } hf[] = {
        {"hf-dense-layers", "\"model_type\": \"qwen3_moe\", \"num_experts\": 4, "
                            "\"num_experts_per_tok\": 2, \"mlp_only_layers\": [1]",
         "dense layers among expert layers", TY_ENOTSUP},
        {"hf-sparse-step", "\"model_type\": \"qwen3_moe\", \"num_experts\": 4, "
                           "\"num_experts_per_tok\": 2, \"decoder_sparse_step\": 2",
         "dense layers among expert layers", TY_ENOTSUP},
        {"hf-no-experts", "\"model_type\": \"mixtral\", \"num_local_experts\": 0",
         "0 experts out of range", TY_EFORMAT},
        {"hf-phimoe", "\"model_type\": \"phimoe\"", "unsupported model_type 'phimoe'",
         TY_ENOTSUP},
    };
    for (size_t i = 0; i < sizeof(hf) / sizeof(hf[0]); i++) {
        char dir[512], path[600];
        snprintf(dir, sizeof(dir), "%s/%s", tmpdir, hf[i].name);
        assert_int_equal(mkdir(dir, 0755), 0);
        snprintf(path, sizeof(path), "%s/config.json", dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, "{\"hidden_size\": %d, \"num_hidden_layers\": %d, "
                   "\"num_attention_heads\": %d, \"intermediate_size\": %d, "
                   "\"vocab_size\": %d, %s}\n", DIM, LAYERS, HEADS, FFN, VOCAB, hf[i].cfg);
        fclose(f);
        expect_refused(dir, hf[i].rc, hf[i].msg);
    }
}

/* Logits (n, VOCAB) of prompt p through ty_engine_forward: all in one batch, or one token
 * per call. */
static void prompt_logits(ty_engine_t *e, const uint32_t *p, uint32_t n, bool one_batch,
                          float *out)
{
    ty_kvpool_t *pool = ty_engine_pool(e);
    ty_kvseq_t *s;
    assert_int_equal(ty_kvpool_seq_new(pool, &s), 0);
    for (uint32_t i = 0; i < n; i += one_batch ? n : 1) {
        struct ty_batch_seq bs = {s, p + i, one_batch ? n : 1, true};
        struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
        assert_int_equal(ty_engine_forward(e, &b, out + (size_t)i * VOCAB), 0);
    }
    ty_kvpool_seq_free(pool, s);
}

static ty_engine_t *mk_engine(ty_model_t *m)
{
    struct ty_engine_opts o = {.kv_block_tokens = 16, .max_seqs = 4, .max_ctx = 128,
                               .max_batch_tokens = 64, .kv_dtype = "f32"};
    ty_engine_t *e;
    assert_int_equal(ty_engine_new(&e, m, &o), 0);
    return e;
}

static void expect_close(const float *a, const float *b, size_t n, float tol, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(a[i] - b[i]) <= tol * (1.0f + fabsf(b[i]))))
            fail_msg("%s: logit %zu: %g vs %g", what, i, (double)a[i], (double)b[i]);
}

#define N_PROMPT 24

static void mk_prompt(uint32_t *p, uint32_t salt)
{
    for (uint32_t i = 0; i < N_PROMPT; i++)
        p[i] = (i * 7 + salt * 13 + 1) % VOCAB;
}

static void test_one_expert_is_dense(void **state)
{
    (void)state;
    ty_model_t *moe = load(write_gguf("one", &(struct variant){.arch = "llama", .experts = 1,
                                                                 .used = 1}));
    ty_model_t *dense = load(write_gguf("dense", &(struct variant){.arch = "llama",
                                                                     .dense = true}));
    ty_engine_t *em = mk_engine(moe), *ed = mk_engine(dense);
    uint32_t p[N_PROMPT];
    float *a = malloc(2 * N_PROMPT * VOCAB * sizeof(float)), *b = a + N_PROMPT * VOCAB;
    mk_prompt(p, 1);
    prompt_logits(em, p, N_PROMPT, true, a);
    prompt_logits(ed, p, N_PROMPT, true, b);
    expect_close(a, b, N_PROMPT * VOCAB, 1e-5f, "one expert vs dense");
    free(a);
    ty_engine_free(em);
    ty_engine_free(ed);
    ty_model_free(moe);
    ty_model_free(dense);
}

static void test_grouping(void **state)
{
    (void)state;
    const char *arch[2] = {"qwen3moe", "llama"};
    for (int k = 0; k < 2; k++) {
        ty_model_t *m = load(write_gguf(arch[k], &(struct variant){.arch = arch[k],
                                                                     .experts = 8}));
        ty_engine_t *e = mk_engine(m);
        uint32_t p[N_PROMPT];
        float *a = malloc(2 * N_PROMPT * VOCAB * sizeof(float)), *b = a + N_PROMPT * VOCAB;
        mk_prompt(p, 2);
        prompt_logits(e, p, N_PROMPT, true, a);
        prompt_logits(e, p, N_PROMPT, false, b);
        expect_close(a, b, N_PROMPT * VOCAB, 1e-4f, arch[k]);
        free(a);
        ty_engine_free(e);
        ty_model_free(m);
    }
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/tycho-moe-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loads),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_one_expert_is_dense),
        cmocka_unit_test(test_grouping),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
