/* gpt-oss GGUF files (llama.cpp's openai-moe) written here with the GGUF writer:
 *   - a valid file loads as gpt-oss: top-k softmax gating without renormalising, SwiGLU-OAI,
 *     the even layers sliding (llama.cpp's set_swa_pattern(2)) and the odd ones full, no KV
 *     page released early (some layer reads everything); <arch>.attention
 *     .sliding_window_pattern 3 makes layers 0 and 1 of each 3 slide;
 *   - every unsupported or incomplete variant is refused at load with a message naming it:
 *     no attention sinks, no expert biases, no router bias, no output bias, ffn_norm instead
 *     of post_attention_norm, no sliding window, a per-layer pattern array, a pattern of 0, a
 *     separate rope base for sliding layers; sinks and expert biases in a llama file with
 *     experts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model-impl.h"
#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIM 32
#define LAYERS 3
#define HEADS 2
#define KV_HEADS 1
#define HD 16
#define FFN 32
#define VOCAB 48
#define EXPERTS 4
#define WINDOW 8

static char tmpdir[256];

/* What to write; zeroed = a valid gpt-oss file. */
struct variant {
    const char *arch;     /* NULL: gpt-oss */
    const char *drop;     /* leave out every tensor whose name contains this */
    bool ffn_norm;        /* blk.N.ffn_norm.weight instead of post_attention_norm */
    bool no_window;       /* no <arch>.attention.sliding_window */
    uint32_t pattern;     /* <arch>.attention.sliding_window_pattern + 1 (0: absent) */
    bool pattern_arr;     /* the pattern as an array of per-layer flags */
    float base_swa;       /* <arch>.rope.freq_base_swa (0: absent) */
};

struct wt {
    char name[96];
    uint32_t nd;
    uint64_t ne[3];
};

static int fill(void *arg, uint64_t i, uint64_t off, void *buf, size_t len)
{
    (void)arg;
    for (size_t k = 0; k < len / 4; k++) {
        float v = (float)((i * 7919 + off / 4 + k) % 17) / 17.0f - 0.5f;
        memcpy((char *)buf + 4 * k, &v, 4);
    }
    return 0;
}

static void add(struct wt *t, size_t *n, const struct variant *v, const char *name, uint32_t nd,
                uint64_t n0, uint64_t n1, uint64_t n2)
{
    if (v->drop && strstr(name, v->drop))
        return;
    struct wt *w = &t[(*n)++];
    snprintf(w->name, sizeof(w->name), "%s", name);
    w->nd = nd;
    w->ne[0] = n0, w->ne[1] = n1, w->ne[2] = n2;
}

/* tmpdir/NAME.gguf as v says; returns its path. */
static const char *write_gguf(const char *name, const struct variant *v)
{
    static char path[512];
    const char *arch = v->arch ? v->arch : "gpt-oss";
    struct wt t[128];
    size_t n = 0;
    char key[96], tn[64];
    ty_gguf_writer_t *w;
    assert_int_equal(ty_gguf_writer_new(&w), 0);
#define KV(k, x) (snprintf(key, sizeof(key), "%s." k, arch), ty_gguf_writer_kv_u32(w, key, x))
    assert_int_equal(ty_gguf_writer_kv_str(w, "general.architecture", arch), 0);
    assert_int_equal(KV("context_length", 256), 0);
    assert_int_equal(KV("embedding_length", DIM), 0);
    assert_int_equal(KV("block_count", LAYERS), 0);
    assert_int_equal(KV("expert_feed_forward_length", FFN), 0);
    assert_int_equal(KV("attention.head_count", HEADS), 0);
    assert_int_equal(KV("attention.head_count_kv", KV_HEADS), 0);
    assert_int_equal(KV("attention.key_length", HD), 0);
    assert_int_equal(KV("expert_count", EXPERTS), 0);
    assert_int_equal(KV("expert_used_count", 2), 0);
    if (!v->no_window)
        assert_int_equal(KV("attention.sliding_window", WINDOW), 0);
    if (v->pattern)
        assert_int_equal(KV("attention.sliding_window_pattern", v->pattern - 1), 0);
#undef KV
    if (v->pattern_arr) { /* key, type ARRAY, element BOOL, count, the flags */
        unsigned char raw[128];
        const char *k = "gpt-oss.attention.sliding_window_pattern";
        uint64_t kl = strlen(k), cnt = LAYERS;
        uint32_t arr = TY_GGUF_ARRAY, el = TY_GGUF_BOOL;
        size_t o = 0;
        memcpy(raw + o, &kl, 8), o += 8;
        memcpy(raw + o, k, kl), o += kl;
        memcpy(raw + o, &arr, 4), o += 4;
        memcpy(raw + o, &el, 4), o += 4;
        memcpy(raw + o, &cnt, 8), o += 8;
        for (uint32_t l = 0; l < LAYERS; l++)
            raw[o++] = l % 2 == 0;
        assert_int_equal(ty_gguf_writer_kv_raw(w, raw, o), 0);
    }
    if (v->base_swa != 0.0f) {
        snprintf(key, sizeof(key), "%s.rope.freq_base_swa", arch);
        assert_int_equal(ty_gguf_writer_kv_f32(w, key, v->base_swa), 0);
    }
    add(t, &n, v, "token_embd.weight", 2, DIM, VOCAB, 1);
    add(t, &n, v, "output_norm.weight", 1, DIM, 1, 1);
    add(t, &n, v, "output.weight", 2, DIM, VOCAB, 1);
    for (uint32_t l = 0; l < LAYERS; l++) {
#define L(s, nd, a, b, c) (snprintf(tn, sizeof(tn), "blk.%u." s, l), add(t, &n, v, tn, nd, a, b, c))
        L("attn_norm.weight", 1, DIM, 1, 1);
        L("attn_q.weight", 2, DIM, HEADS * HD, 1);
        L("attn_k.weight", 2, DIM, KV_HEADS * HD, 1);
        L("attn_v.weight", 2, DIM, KV_HEADS * HD, 1);
        L("attn_q.bias", 1, HEADS * HD, 1, 1);
        L("attn_k.bias", 1, KV_HEADS * HD, 1, 1);
        L("attn_v.bias", 1, KV_HEADS * HD, 1, 1);
        L("attn_output.weight", 2, HEADS * HD, DIM, 1);
        L("attn_output.bias", 1, DIM, 1, 1);
        L("attn_sinks.weight", 1, HEADS, 1, 1);
        if (v->ffn_norm)
            L("ffn_norm.weight", 1, DIM, 1, 1);
        else
            L("post_attention_norm.weight", 1, DIM, 1, 1);
        L("ffn_gate_inp.weight", 2, DIM, EXPERTS, 1);
        L("ffn_gate_inp.bias", 1, EXPERTS, 1, 1);
        L("ffn_gate_exps.weight", 3, DIM, FFN, EXPERTS);
        L("ffn_gate_exps.bias", 2, FFN, EXPERTS, 1);
        L("ffn_up_exps.weight", 3, DIM, FFN, EXPERTS);
        L("ffn_up_exps.bias", 2, FFN, EXPERTS, 1);
        L("ffn_down_exps.weight", 3, FFN, DIM, EXPERTS);
        L("ffn_down_exps.bias", 2, DIM, EXPERTS, 1);
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
    ty_model_t *m = NULL;
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
    ty_model_t *m = load(write_gguf("gptoss", &(struct variant){0}));
    const struct ty_model_config *c = ty_model_config(m);
    assert_int_equal(c->arch, TY_MODEL_ARCH_GPTOSS);
    assert_int_equal(c->rope, TY_ROPE_NEOX);
    assert_true(c->moe_topk_softmax);
    assert_true(c->swiglu_oai);
    assert_false(c->moe_norm_topk);
    assert_int_equal(c->sliding_window, WINDOW);
    assert_int_equal(c->kv_window, 0); /* the odd layers read every key */
    for (uint32_t l = 0; l < LAYERS; l++)
        assert_int_equal(m->layers[l].window, l % 2 == 0 ? WINDOW : 0);
    assert_non_null(m->layers[1].sinks.data);
    ty_model_free(m);
    m = load(write_gguf("period3", &(struct variant){.pattern = 3 + 1}));
    for (uint32_t l = 0; l < LAYERS; l++)
        assert_int_equal(m->layers[l].window, l % 3 < 2 ? WINDOW : 0);
    ty_model_free(m);
}

static void test_refused(void **state)
{
    (void)state;
    expect_refused(write_gguf("nosinks", &(struct variant){.drop = "attn_sinks"}), TY_EFORMAT,
                   "missing tensor: attn_sinks (attention sinks) of layer 0");
    expect_refused(write_gguf("noexpb", &(struct variant){.drop = "ffn_up_exps.bias"}),
                   TY_EFORMAT, "missing tensor: ffn_up_exps.bias of layer 0");
    expect_refused(write_gguf("norouterb", &(struct variant){.drop = "ffn_gate_inp.bias"}),
                   TY_EFORMAT, "missing tensor: ffn_gate_inp.bias of layer 0");
    expect_refused(write_gguf("nobo", &(struct variant){.drop = "attn_output.bias"}), TY_EFORMAT,
                   "missing tensor: attn_output.bias of layer 0");
    expect_refused(write_gguf("ffnnorm", &(struct variant){.ffn_norm = true}), TY_EFORMAT,
                   "its FFN norm is blk.0.post_attention_norm");
    expect_refused(write_gguf("nowindow", &(struct variant){.no_window = true}), TY_EFORMAT,
                   "gpt-oss model without gpt-oss.attention.sliding_window");
    expect_refused(write_gguf("patarr", &(struct variant){.pattern_arr = true}), TY_ENOTSUP,
                   "per-layer sliding-window pattern");
    expect_refused(write_gguf("pat0", &(struct variant){.pattern = 0 + 1}), TY_ENOTSUP,
                   "unsupported sliding-window pattern 0");
    expect_refused(write_gguf("baseswa", &(struct variant){.base_swa = 5000.0f}), TY_ENOTSUP,
                   "separate rope base for sliding layers");
    expect_refused(write_gguf("llamasinks", &(struct variant){.arch = "llama", .ffn_norm = true}),
                   TY_ENOTSUP, "expert biases in a llama model");
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/tycho-gptoss-XXXXXX");
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
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
