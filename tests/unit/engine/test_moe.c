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
 *   - HF qwen3_moe's norm_topk_prob: a zero router over 4 experts that are all the dense FFN
 *     of a qwen3 GGUF gives that file's logits with renormalised weights, and those of the
 *     file with ffn_down halved (2 of 4 picked, 1/4 each) without;
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
    float down_scale;       /* a dense ffn_down's values times this (0: 1) */
};

struct wt {
    char name[96];
    char key[64]; /* whose values (empty: the name less "_exps") */
    uint32_t nd;
    uint64_t ne[3];
    bool ones, zero;
    float scale; /* 0: 1 */
};

/* Element e of tensor t: uniform with std 1/sqrt(cols) (4/sqrt(cols) for the router), times
 * t->scale, keyed by t->key or the name less an "_exps" (expert 0 of a one-expert file is the
 * dense FFN's matrix). */
static float value(const struct wt *t, uint64_t e)
{
    char key[96];
    snprintf(key, sizeof(key), "%s", t->key[0] ? t->key : t->name);
    char *x = strstr(key, "_exps");
    if (x)
        memmove(x, x + 5, strlen(x + 5) + 1);
    uint64_t h = 1469598103934665603ull;
    for (const char *p = key; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    uint64_t r = ty_hash_mix64(h ^ e * 0x9e3779b97f4a7c15ull);
    float u = (float)(r >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
    float s = sqrtf(3.0f / (float)t->ne[0]) * (strstr(key, "gate_inp") ? 4.0f : 1.0f);
    return t->zero ? 0.0f : t->ones ? 1.0f : u * s * (t->scale != 0.0f ? t->scale : 1.0f);
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
    memset(w, 0, sizeof(*w));
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
    bool qwen = strncmp(arch, "qwen3", 5) == 0;
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
            t[n - 1].scale = v->down_scale;
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

/* tmpdir/NAME: an HF qwen3_moe directory (config.json, model.safetensors) of E experts, K
 * used, every expert the dense FFN of write_gguf's qwen3 file (the same values) and the
 * router all zeros: every expert equally probable, the first K picked, each weighted 1/K
 * when norm_topk_prob, else 1/E. */
static const char *write_hf(const char *name, uint32_t E, uint32_t K, bool norm_topk)
{
    static char dir[512];
    char path[600], hf[96], key[64];
    struct wt t[128];
    size_t n = 0;
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    assert_int_equal(mkdir(dir, 0755), 0);
#define T(h, k, nd, c, r, ones) \
    (add(t, &n, h, nd, c, r, 1, ones), snprintf(t[n - 1].key, sizeof(t[n - 1].key), "%s", k))
    T("model.embed_tokens.weight", "token_embd.weight", 2, DIM, VOCAB, false);
    T("model.norm.weight", "output_norm.weight", 1, DIM, 1, true);
    T("lm_head.weight", "output.weight", 2, DIM, VOCAB, false);
    static const struct {
        const char *hf, *gguf;
        uint32_t nd, cols, rows;
        bool ones;
    } layer[] = {
        {"input_layernorm.weight", "attn_norm.weight", 1, DIM, 1, true},
        {"self_attn.q_proj.weight", "attn_q.weight", 2, DIM, HEADS * HD, false},
        {"self_attn.k_proj.weight", "attn_k.weight", 2, DIM, KV_HEADS * HD, false},
        {"self_attn.v_proj.weight", "attn_v.weight", 2, DIM, KV_HEADS * HD, false},
        {"self_attn.o_proj.weight", "attn_output.weight", 2, HEADS * HD, DIM, false},
        {"self_attn.q_norm.weight", "attn_q_norm.weight", 1, HD, 1, true},
        {"self_attn.k_norm.weight", "attn_k_norm.weight", 1, HD, 1, true},
        {"post_attention_layernorm.weight", "ffn_norm.weight", 1, DIM, 1, true},
    };
    for (uint32_t l = 0; l < LAYERS; l++) {
        for (size_t i = 0; i < sizeof(layer) / sizeof(layer[0]); i++) {
            snprintf(hf, sizeof(hf), "model.layers.%u.%s", l, layer[i].hf);
            snprintf(key, sizeof(key), "blk.%u.%s", l, layer[i].gguf);
            T(hf, key, layer[i].nd, layer[i].cols, layer[i].rows, layer[i].ones);
        }
        snprintf(hf, sizeof(hf), "model.layers.%u.mlp.gate.weight", l);
        T(hf, "router", 2, DIM, E, false);
        t[n - 1].zero = true;
        for (uint32_t e = 0; e < E; e++) {
            static const char *const proj[3] = {"gate", "up", "down"};
            for (int i = 0; i < 3; i++) {
                snprintf(hf, sizeof(hf), "model.layers.%u.mlp.experts.%u.%s_proj.weight", l, e,
                         proj[i]);
                snprintf(key, sizeof(key), "blk.%u.ffn_%s.weight", l, proj[i]);
                T(hf, key, 2, i == 2 ? FFN : DIM, i == 2 ? DIM : FFN, false);
            }
        }
    }
#undef T
    /* safetensors: u64 header length, the JSON header (padded to 8), the data */
    char *hdr = malloc(1 << 16);
    size_t h = 0;
    uint64_t off = 0;
    h += (size_t)sprintf(hdr + h, "{");
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = 4 * t[i].ne[0] * t[i].ne[1];
        if (t[i].nd == 2)
            h += (size_t)sprintf(hdr + h, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%llu,%llu],",
                                 i ? "," : "", t[i].name, (unsigned long long)t[i].ne[1],
                                 (unsigned long long)t[i].ne[0]);
        else
            h += (size_t)sprintf(hdr + h, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%llu],",
                                 i ? "," : "", t[i].name, (unsigned long long)t[i].ne[0]);
        h += (size_t)sprintf(hdr + h, "\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                             (unsigned long long)(off + bytes));
        off += bytes;
    }
    h += (size_t)sprintf(hdr + h, "}");
    while (h % 8)
        hdr[h++] = ' ';
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t hl = h;
    assert_int_equal(fwrite(&hl, 8, 1, f), 1);
    assert_int_equal(fwrite(hdr, 1, h, f), h);
    for (size_t i = 0; i < n; i++)
        for (uint64_t e = 0; e < t[i].ne[0] * t[i].ne[1]; e++) {
            float v = value(&t[i], e);
            assert_int_equal(fwrite(&v, 4, 1, f), 1);
        }
    fclose(f);
    free(hdr);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"model_type\": \"qwen3_moe\", \"hidden_size\": %d, \"num_hidden_layers\": %d, "
               "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
               "\"intermediate_size\": %d, \"moe_intermediate_size\": %d, \"vocab_size\": %d, "
               "\"num_experts\": %u, \"num_experts_per_tok\": %u, \"norm_topk_prob\": %s, "
               "\"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 256}\n",
            DIM, LAYERS, HEADS, KV_HEADS, HD, 4 * FFN, FFN, VOCAB, E, K,
            norm_topk ? "true" : "false");
    fclose(f);
    return dir;
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
                               .max_batch_tokens = 64, .kv_dtype = "f32", .n_threads = 2};
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

/* HF Qwen3-MoE's norm_topk_prob: with a zero router and every expert the dense FFN, the
 * output is the dense FFN's when the picked weights are renormalised (2 of 4, 1/2 each), and
 * K/E = 1/2 of it when they are not: the dense file with ffn_down halved (exactly). */
static void test_hf_norm_topk(void **state)
{
    (void)state;
    char *paths[4] = { /* copies: the writers return their own static buffers */
        strdup(write_hf("hf-norm", 4, 2, true)),
        strdup(write_gguf("q3-dense", &(struct variant){.arch = "qwen3", .dense = true})),
        strdup(write_hf("hf-raw", 4, 2, false)),
        strdup(write_gguf("q3-half", &(struct variant){.arch = "qwen3", .dense = true,
                                                        .down_scale = 0.5f})),
    };
    float *lg[4];
    uint32_t p[N_PROMPT];
    mk_prompt(p, 4);
    for (int i = 0; i < 4; i++) {
        ty_model_t *m = load(paths[i]);
        assert_int_equal(ty_model_config(m)->moe_norm_topk, i == 0);
        ty_engine_t *e = mk_engine(m);
        lg[i] = malloc(N_PROMPT * VOCAB * sizeof(float));
        prompt_logits(e, p, N_PROMPT, true, lg[i]);
        ty_engine_free(e);
        ty_model_free(m);
    }
    expect_close(lg[0], lg[1], N_PROMPT * VOCAB, 1e-5f, "hf norm_topk_prob true vs dense");
    expect_close(lg[2], lg[3], N_PROMPT * VOCAB, 1e-5f, "hf norm_topk_prob false vs half");
    float diff = 0;
    for (size_t i = 0; i < N_PROMPT * VOCAB; i++)
        diff = fmaxf(diff, fabsf(lg[2][i] - lg[0][i]));
    assert_true(diff > 1e-2f); /* the weights' sum matters */
    for (int i = 0; i < 4; i++) {
        free(lg[i]);
        free(paths[i]);
    }
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
        cmocka_unit_test(test_hf_norm_topk),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
