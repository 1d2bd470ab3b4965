/* `tycho mkmodel`: write a random-weight GGUF of a given shape and architecture (llama, qwen2,
 * qwen3, and the mixtures of experts qwen3moe, mixtral, gpt-oss and deepseek2 (MLA), with
 * llama.cpp's names and metadata), the tokenizer metadata copied from an existing
 * GGUF or a built-in byte vocabulary, so that the file loads in llama.cpp too; optionally the
 * same weights as a Hugging Face directory. Used to measure speed at real sizes against other
 * engines on the very same file, and to check each architecture against llama.cpp. */
#include "cli.h"

#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/hash.h"
#include "tycho/quant.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct dims {
    uint32_t dim, layers, heads, kv_heads, ffn, vocab, ctx;
    bool tied;
    uint32_t head_dim; /* 0: dim / heads */
    uint32_t window;   /* sliding-window attention on every layer; 0: none */
    uint32_t experts, experts_used; /* mixture of experts (an --arch with them); ffn each */
    float yarn_factor; /* YaRN rope scaling by this factor (0: none) ... */
    uint32_t yarn_orig; /* ... of an original context of this many tokens */
    bool ds_v2; /* deepseek2 with DeepSeek-V2's routing: softmax, no selection bias or groups,
                 * weights not renormalised nor scaled */
};

static const struct {
    const char *name;
    struct dims d;
} presets[] = {
    /* ~110M: llama2.c's stories110M shape, tied embeddings over the 32k Llama-2 vocab */
    {"110m", {768, 12, 12, 12, 2048, 32000, 1024, true, 0, 0, 0, 0, 0, 0, false}},
    /* ~1.1B: TinyLlama-1.1B shape (GQA 32/4) */
    {"1b", {2048, 22, 32, 4, 5632, 32000, 2048, false, 0, 0, 0, 0, 0, 0, false}},
    /* a small file for tests */
    {"tiny", {64, 2, 4, 2, 128, 32000, 256, true, 0, 0, 0, 0, 0, 0, false}},
};

/* An architecture: the --arch name, as llama.cpp names it in GGUF (general.architecture and
 * the key prefix) and as Hugging Face names it (config.json model_type and class), with the
 * tensors it adds to the Llama layer. A mixture of experts replaces the FFN by a router and
 * 3-D expert tensors (GGUF) or per-expert matrices (HF, names with %u for the expert). */
/* MOE_GPTOSS: llama.cpp's openai-moe (HF: hf_op's layout): q/k/v/output biases, attention sinks,
 * post_attention_norm as the FFN norm, a biased router, biased experts, sliding even layers */
enum moe_kind { MOE_NONE, MOE_QWEN3, MOE_MIXTRAL, MOE_GPTOSS, MOE_DEEPSEEK };
struct arch_spec {
    const char *name, *gguf, *hf_type, *hf_class;
    bool qkv_bias, qk_norm;
    bool hf_permute; /* HF keeps llama's q/k rows permuted for rotate_half (see write_hf) */
    float rms_eps;
    enum moe_kind moe;
    const char *hf_router, *hf_exp[3]; /* gate, up, down */
};

static const struct arch_spec arches[] = {
    {"llama", "llama", "llama", "LlamaForCausalLM", false, false, true, 1e-5f, MOE_NONE, NULL,
     {NULL}},
    {"qwen2", "qwen2", "qwen2", "Qwen2ForCausalLM", true, false, false, 1e-6f, MOE_NONE, NULL,
     {NULL}},
    {"qwen3", "qwen3", "qwen3", "Qwen3ForCausalLM", false, true, false, 1e-6f, MOE_NONE, NULL,
     {NULL}},
    {"qwen3moe", "qwen3moe", "qwen3_moe", "Qwen3MoeForCausalLM", false, true, false, 1e-6f,
     MOE_QWEN3, "mlp.gate.weight",
     {"mlp.experts.%u.gate_proj.weight", "mlp.experts.%u.up_proj.weight",
      "mlp.experts.%u.down_proj.weight"}},
    /* llama.cpp converts Mixtral to a llama GGUF with experts */
    {"mixtral", "llama", "mixtral", "MixtralForCausalLM", false, false, true, 1e-5f, MOE_MIXTRAL,
     "block_sparse_moe.gate.weight",
     {"block_sparse_moe.experts.%u.w1.weight", "block_sparse_moe.experts.%u.w3.weight",
      "block_sparse_moe.experts.%u.w2.weight"}},
    {"gpt-oss", "gpt-oss", "gpt_oss", "GptOssForCausalLM", true, false, false, 1e-5f,
     MOE_GPTOSS, NULL, {NULL}},
    /* DeepSeek-V3's shape: MLA, a leading dense layer, then sigmoid-gated experts in groups
     * with a selection bias and a shared expert (mla_dims); HF keeps kv_b_proj whole */
    {"deepseek2", "deepseek2", "deepseek_v3", "DeepseekV3ForCausalLM", false, false, false,
     1e-6f, MOE_DEEPSEEK, "mlp.gate.weight",
     {"mlp.experts.%u.gate_proj.weight", "mlp.experts.%u.up_proj.weight",
      "mlp.experts.%u.down_proj.weight"}},
};

/* deepseek2's MLA sizes from the shape: a head's no-rope query/key part and its value are
 * head_dim wide, its rope part half that; the latent and the low-rank query dim / 2. The
 * first layer is dense; 4 expert groups of which 2 are kept when the experts divide. */
struct mla_dims {
    uint32_t nope, rope, v, kv_lora, q_lora, dense_lead, groups, groups_used;
};

static struct mla_dims mla_dims(const struct dims *d)
{
    uint32_t hd = d->head_dim ? d->head_dim : d->dim / d->heads;
    bool grouped = d->experts % 4 == 0 && d->experts_used <= d->experts / 2 && !d->ds_v2;
    return (struct mla_dims){hd, hd / 2, hd, d->dim / 2, d->dim / 2, d->layers > 1,
                             grouped ? 4 : 0, grouped ? 2 : 0};
}

/* --type: the matrices' ggml type, or a llama.cpp-style mix. q4_k_m is llama.cpp's Q4_K_M
 * (llama_tensor_get_type): Q4_K matrices, Q6_K for the output and for attn_v and ffn_down in
 * the layers use_more_bits picks (the first and last eighth, every third in between). */
struct ftype {
    const char *name;
    uint32_t type, more;  /* matrices; the mix's wider type (0: none) */
    uint32_t file_type;   /* general.file_type (llama_ftype) */
    uint32_t exps;        /* the 3-D expert tensors' type (0: as the other matrices) */
};

static const struct ftype ftypes[] = {
    {"f32", TY_GGML_F32, 0, 0, 0},   {"f16", TY_GGML_F16, 0, 1, 0},
    {"q8_0", TY_GGML_Q8_0, 0, 7, 0}, {"q4_0", TY_GGML_Q4_0, 0, 2, 0},
    {"q4_k", TY_GGML_Q4_K, 0, 14, 0}, {"q5_k", TY_GGML_Q5_K, 0, 16, 0},
    {"q6_k", TY_GGML_Q6_K, 0, 18, 0}, {"q4_k_m", TY_GGML_Q4_K, TY_GGML_Q6_K, 15, 0},
    {"mxfp4", TY_GGML_MXFP4, 0, 38, 0}, /* llama.cpp's MXFP4_MOE file type; every matrix */
    /* llama.cpp's MXFP4_MOE as llama_tensor_get_type makes it (what gpt-oss files ship):
     * MXFP4 expert tensors, Q8_0 every other matrix, the router F32 */
    {"mxfp4_moe", TY_GGML_Q8_0, 0, 38, TY_GGML_MXFP4},
};

static bool use_more_bits(uint32_t layer, uint32_t n_layers)
{
    return layer < n_layers / 8 || layer >= 7 * n_layers / 8 ||
           (layer >= n_layers / 8 && (layer - n_layers / 8) % 3 == 2);
}

/* How a tensor's values are drawn. Matrices are uniform with std 1/sqrt(row length) so that
 * every layer's output is as large as its input (real models' scale): each position's
 * context then changes the logits and greedy output varies, as it would not with tiny
 * weights, where the residual stream stays the current token's embedding. */
enum tkind {
    TK_MATRIX, /* std 1/sqrt(cols) */
    TK_ONES,   /* RMSNorm weights */
    TK_BIAS,   /* uniform in [-0.5, 0.5] */
    TK_QKNORM, /* uniform in [0.5, 1.5]: a per-element gain that matters */
    TK_ROUTER, /* std 2/sqrt(cols): router logits of std ~2, picks far from ties */
    TK_SINK,   /* uniform in [-2, 2]: attention sinks that take a visible share */
};

/* gpt-oss's HF experts (transformers' GptOssExperts): gate and up fused into gate_up_proj
 * [E, D, 2F] (input-major, gate at even and up at odd columns; the gate spec followed by the
 * up spec, which HF_SKIP leaves out), the biases into gate_up_proj_bias [E, 2F], down_proj
 * [E, F, D] (input-major). */
enum hf_op { HF_AS_IS, HF_SKIP, HF_GATE_UP, HF_GATE_UP_BIAS, HF_DOWN_T };

/* One tensor of the file: GGUF name and ne (ne[0] = row length; ne[2] experts of a 3-D
 * expert tensor), Hugging Face name (per expert: a format with %u for the expert). */
struct tspec {
    char gguf[64], hf[96];
    uint32_t type, nd;
    uint64_t ne[3];
    enum tkind kind;
    uint32_t permute_heads; /* HF: rows in rotate_half order, this many heads (0: as is) */
    enum hf_op hf_op;       /* HF: how the tensor is laid out there */
    uint32_t kvb_v; /* deepseek2 attn_k_b: HF writes it with the next spec (attn_v_b, v_head
                     * kvb_v) as one kv_b_proj, per head N rows of k (transposed) then v */
};

struct fill_ctx {
    uint64_t seed;
    const struct tspec *t;
};

static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
    int exp = (int)e - 127 + 15;
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00);
    if (exp <= 0)
        return (uint16_t)sign; /* |x| < 6e-5 flushes to zero: fine for random weights */
    uint32_t h = sign | ((uint32_t)exp << 10) | (m >> 13);
    if ((m >> 12) & 1) /* round half up */
        h++;
    return (uint16_t)h;
}

/* Uniform in [-1, 1], a function of (seed, tensor, element) only. */
static float rand_unit(const struct fill_ctx *c, uint64_t i, uint64_t e)
{
    uint64_t r = ty_hash_mix64(c->seed ^ (i << 40) ^ e * 0x9e3779b97f4a7c15ull);
    return (float)(r >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* Element e of tensor i, by its kind. */
static float rand_weight(const struct fill_ctx *c, uint64_t i, uint64_t e)
{
    const struct tspec *t = &c->t[i];
    switch (t->kind) {
    case TK_ONES: return 1.0f;
    case TK_BIAS: return 0.5f * rand_unit(c, i, e);
    case TK_QKNORM: return 1.0f + 0.5f * rand_unit(c, i, e);
    case TK_ROUTER: return rand_unit(c, i, e) * sqrtf(12.0f / (float)t->ne[0]);
    case TK_SINK: return 2.0f * rand_unit(c, i, e);
    default: return rand_unit(c, i, e) * sqrtf(3.0f / (float)t->ne[0]);
    }
}

/* Block-quantized bytes [off, off + len) of tensor i (tycho/quant.h: ggml's block layouts,
 * quantized from the block's range as ggml's reference quantizers do): each block made whole,
 * then cut to the writer's chunk. */
static void fill_blocks(const struct fill_ctx *c, uint64_t i, uint64_t off, unsigned char *buf,
                        size_t len)
{
    uint32_t type = c->t[i].type, n = ty_ggml_type_block(type);
    uint64_t bytes = ty_ggml_type_nbytes(type, n);
    for (uint64_t b = off / bytes; b * bytes < off + len; b++) {
        unsigned char blk[256];
        float x[256];
        for (uint32_t j = 0; j < n; j++)
            x[j] = rand_weight(c, i, b * n + j);
        ty_quant_row_quantize(type, x, blk, n);
        uint64_t from = off > b * bytes ? off - b * bytes : 0;
        uint64_t to = off + len < (b + 1) * bytes ? off + len - b * bytes : bytes;
        memcpy(buf + (b * bytes + from - off), blk + from, to - from);
    }
}

/* Bytes [off, off + len) of tensor i (the GGUF writer's callback; write_hf's too). */
static int fill(void *arg, uint64_t i, uint64_t off, void *buf, size_t len)
{
    struct fill_ctx *c = arg;
    uint32_t type = c->t[i].type;
    if (ty_quant_is_block(type)) {
        fill_blocks(c, i, off, buf, len);
        return 0;
    }
    size_t esz = type == TY_GGML_F32 ? 4 : 2;
    uint64_t e0 = off / esz;
    for (size_t k = 0; k < len / esz; k++) {
        float v = rand_weight(c, i, e0 + k);
        if (esz == 4) {
            memcpy((char *)buf + k * 4, &v, 4);
        } else {
            uint16_t h = float_to_half(v);
            memcpy((char *)buf + k * 2, &h, 2);
        }
    }
    return 0;
}

static uint32_t head_dim(const struct dims *d)
{
    return d->head_dim ? d->head_dim : d->dim / d->heads;
}

/* The hyper-parameters llama.cpp reads for the architecture (llama_model::load_hparams). */
static int add_kv(ty_gguf_writer_t *w, const struct dims *d, const struct arch_spec *a,
                  const struct ftype *ft)
{
    char key[96];
    int rc = 0;
    uint32_t hd = head_dim(d);
#define KV_U32(k, v) (snprintf(key, sizeof(key), "%s." k, a->gguf), ty_gguf_writer_kv_u32(w, key, v))
#define KV_F32(k, v) (snprintf(key, sizeof(key), "%s." k, a->gguf), ty_gguf_writer_kv_f32(w, key, v))
    rc |= ty_gguf_writer_kv_str(w, "general.architecture", a->gguf);
    rc |= ty_gguf_writer_kv_str(w, "general.name", "tycho-mkmodel random");
    rc |= ty_gguf_writer_kv_u32(w, "general.file_type", ft->file_type);
    rc |= KV_U32("context_length", d->ctx);
    rc |= KV_U32("embedding_length", d->dim);
    rc |= KV_U32("block_count", d->layers);
    rc |= KV_U32("feed_forward_length", d->ffn);
    rc |= KV_U32("attention.head_count", d->heads);
    if (a->moe != MOE_DEEPSEEK) {
        rc |= KV_U32("attention.head_count_kv", d->kv_heads);
        rc |= KV_U32("attention.key_length", hd);
        rc |= KV_U32("attention.value_length", hd);
        rc |= KV_U32("rope.dimension_count", hd);
    }
    rc |= KV_F32("attention.layer_norm_rms_epsilon", a->rms_eps);
    rc |= KV_F32("rope.freq_base", 10000.0f);
    if (d->window) /* the key llama.cpp names LLM_KV_ATTENTION_SLIDING_WINDOW */
        rc |= KV_U32("attention.sliding_window", d->window);
    if (a->moe) { /* LLM_KV_EXPERT_COUNT, _USED_COUNT, _FEED_FORWARD_LENGTH (qwen3moe's) */
        rc |= KV_U32("expert_count", d->experts);
        rc |= KV_U32("expert_used_count", d->experts_used);
        if (a->moe == MOE_QWEN3 || a->moe == MOE_GPTOSS)
            rc |= KV_U32("expert_feed_forward_length", d->ffn);
    }
    if (a->moe == MOE_DEEPSEEK) { /* llama.cpp's DeepseekV2Model converter's keys */
        struct mla_dims md = mla_dims(d);
        rc |= KV_U32("attention.head_count_kv", 1);
        rc |= KV_U32("attention.key_length", md.kv_lora + md.rope);
        rc |= KV_U32("attention.value_length", md.kv_lora);
        rc |= KV_U32("attention.key_length_mla", md.nope + md.rope);
        rc |= KV_U32("attention.value_length_mla", md.v);
        rc |= KV_U32("rope.dimension_count", md.rope);
        rc |= KV_U32("attention.q_lora_rank", md.q_lora);
        rc |= KV_U32("attention.kv_lora_rank", md.kv_lora);
        rc |= KV_U32("leading_dense_block_count", md.dense_lead);
        rc |= KV_U32("expert_feed_forward_length", d->ffn);
        rc |= KV_U32("expert_shared_count", 1);
        rc |= KV_F32("expert_weights_scale", d->ds_v2 ? 1.0f : 2.5f);
        snprintf(key, sizeof(key), "%s.expert_weights_norm", a->gguf);
        rc |= ty_gguf_writer_kv_bool(w, key, !d->ds_v2);
        rc |= KV_U32("expert_gating_func", d->ds_v2 ? 1 : 2); /* softmax, sigmoid */
        if (md.groups) {
            rc |= KV_U32("expert_group_count", md.groups);
            rc |= KV_U32("expert_group_used_count", md.groups_used);
        }
    }
    if (d->yarn_factor > 0) {
        snprintf(key, sizeof(key), "%s.rope.scaling.type", a->gguf);
        rc |= ty_gguf_writer_kv_str(w, key, "yarn");
        rc |= KV_F32("rope.scaling.factor", d->yarn_factor);
        rc |= KV_U32("rope.scaling.original_context_length", d->yarn_orig);
        if (a->moe == MOE_DEEPSEEK) /* the converter's 0.1 * mscale_all_dim (V3's: 1) */
            rc |= KV_F32("rope.scaling.yarn_log_multiplier", 0.1f);
    }
#undef KV_U32
#undef KV_F32
    return rc ? TY_ENOMEM : 0;
}

/* Copy tokenizer.* entries; the vocabulary size becomes the token count. */
static int copy_vocab(ty_gguf_writer_t *w, const char *path, uint32_t *n_vocab)
{
    char err[256];
    ty_gguf_t *g;
    int rc = ty_gguf_open(&g, path, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "tycho mkmodel: %s\n", err);
        return rc;
    }
    enum ty_gguf_vtype et;
    uint64_t n = 0;
    const void *data;
    if (!ty_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data) || !n || n > (1u << 22)) {
        fprintf(stderr, "tycho mkmodel: %s has no tokenizer.ggml.tokens\n", path);
        ty_gguf_close(g);
        return TY_EFORMAT;
    }
    *n_vocab = (uint32_t)n;
    for (uint64_t i = 0; i < ty_gguf_n_kv(g) && !rc; i++) {
        const char *key;
        enum ty_gguf_vtype t;
        const void *raw;
        uint64_t len;
        ty_gguf_kv_at(g, i, &key, &t, &raw, &len);
        if (strncmp(key, "tokenizer.", 10) == 0)
            rc = ty_gguf_writer_kv_raw(w, raw, len);
    }
    ty_gguf_close(g);
    return rc;
}

/* ---- the built-in vocabulary: SentencePiece-style with byte fallback only ----------------- */

struct raw_buf {
    unsigned char *p;
    size_t n, cap;
};

static void raw_put(struct raw_buf *b, const void *data, size_t len)
{
    if (b->n + len > b->cap) {
        b->cap = (b->n + len) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            abort(); /* small metadata: OOM aborts (STYLE.md) */
    }
    memcpy(b->p + b->n, data, len);
    b->n += len;
}

static void raw_u32(struct raw_buf *b, uint32_t v)
{
    unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                           (unsigned char)(v >> 24)};
    raw_put(b, le, 4);
}

static void raw_u64(struct raw_buf *b, uint64_t v)
{
    raw_u32(b, (uint32_t)v);
    raw_u32(b, (uint32_t)(v >> 32));
}

static void raw_str(struct raw_buf *b, const char *s)
{
    raw_u64(b, strlen(s));
    raw_put(b, s, strlen(s));
}

/* Begin one GGUF key/value entry holding an array of `n` elements of type `elem`. */
static void raw_arr_head(struct raw_buf *b, const char *key, enum ty_gguf_vtype elem, uint64_t n)
{
    b->n = 0;
    raw_str(b, key);
    raw_u32(b, TY_GGUF_ARRAY);
    raw_u32(b, elem);
    raw_u64(b, n);
}

/* Tokens <unk>, <s>, </s> and the 256 byte tokens <0x00>..<0xFF>: every text encodes (through
 * byte fallback) and decodes, so a random model needs no donor file. */
static int builtin_vocab(ty_gguf_writer_t *w, uint32_t *n_vocab)
{
    enum { N = 3 + 256 };
    static const char *const specials[3] = {"<unk>", "<s>", "</s>"};
    struct raw_buf b = {0};
    char tok[8];
    int rc = ty_gguf_writer_kv_str(w, "tokenizer.ggml.model", "llama");
    raw_arr_head(&b, "tokenizer.ggml.tokens", TY_GGUF_STRING, N);
    for (int i = 0; i < N; i++) {
        if (i < 3) {
            raw_str(&b, specials[i]);
        } else {
            snprintf(tok, sizeof(tok), "<0x%02X>", i - 3);
            raw_str(&b, tok);
        }
    }
    rc |= ty_gguf_writer_kv_raw(w, b.p, b.n);
    raw_arr_head(&b, "tokenizer.ggml.scores", TY_GGUF_FLOAT32, N);
    for (int i = 0; i < N; i++)
        raw_u32(&b, 0); /* 0.0f */
    rc |= ty_gguf_writer_kv_raw(w, b.p, b.n);
    raw_arr_head(&b, "tokenizer.ggml.token_type", TY_GGUF_INT32, N);
    for (int i = 0; i < N; i++)
        raw_u32(&b, i == 0 ? 2 : i < 3 ? 3 : 6); /* unknown, control, byte */
    rc |= ty_gguf_writer_kv_raw(w, b.p, b.n);
    free(b.p);
    rc |= ty_gguf_writer_kv_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    rc |= ty_gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", 1);
    rc |= ty_gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
    rc |= ty_gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", true);
    *n_vocab = N;
    return rc ? TY_ENOMEM : 0;
}

static void spec(struct tspec *t, const char *gguf, const char *hf, uint32_t type, uint64_t cols,
                 uint64_t rows, enum tkind kind)
{
    snprintf(t->gguf, sizeof(t->gguf), "%s", gguf);
    snprintf(t->hf, sizeof(t->hf), "%s", hf);
    t->type = kind == TK_MATRIX ? type : TY_GGML_F32; /* norms and biases stay F32 */
    t->nd = rows > 1 ? 2 : 1;
    t->ne[0] = cols;
    t->ne[1] = rows;
    t->ne[2] = 1;
    t->kind = kind;
    t->permute_heads = 0;
    t->hf_op = HF_AS_IS;
    t->kvb_v = 0;
}

/* gpt-oss's layer after attn_output: the output's bias, the
 * sinks, post_attention_norm (the FFN norm), the biased router and the biased experts (the
 * mix's expert type); llama.cpp's openai-moe names. Returns the new count. */
static size_t gptoss_layer(struct tspec *t, size_t n, uint32_t l, const struct dims *d,
                           const struct ftype *ft)
{
    uint32_t exps = ft->exps ? ft->exps : ft->type;
    char g[64], h[96];
#define GT(gs, hs, ty, cols, rows, kind)                                                          \
    do {                                                                                          \
        snprintf(g, sizeof(g), "blk.%u.%s", l, gs);                                               \
        snprintf(h, sizeof(h), "model.layers.%u.%s", l, hs);                                      \
        spec(&t[n++], g, h, ty, cols, rows, kind);                                                \
    } while (0)
    GT("attn_output.bias", "self_attn.o_proj.bias", ft->type, d->dim, 1, TK_BIAS);
    GT("attn_sinks.weight", "self_attn.sinks", ft->type, d->heads, 1, TK_SINK);
    GT("post_attention_norm.weight", "post_attention_layernorm.weight", ft->type, d->dim, 1,
       TK_ONES);
    GT("ffn_gate_inp.weight", "mlp.router.weight", TY_GGML_F32, d->dim, d->experts, TK_ROUTER);
    GT("ffn_gate_inp.bias", "mlp.router.bias", ft->type, d->experts, 1, TK_BIAS);
    GT("ffn_gate_exps.weight", "mlp.experts.gate_up_proj", exps, d->dim, d->ffn, TK_MATRIX);
    t[n - 1].nd = 3, t[n - 1].ne[2] = d->experts, t[n - 1].hf_op = HF_GATE_UP;
    GT("ffn_up_exps.weight", "", exps, d->dim, d->ffn, TK_MATRIX);
    t[n - 1].nd = 3, t[n - 1].ne[2] = d->experts, t[n - 1].hf_op = HF_SKIP;
    GT("ffn_down_exps.weight", "mlp.experts.down_proj", exps, d->ffn, d->dim, TK_MATRIX);
    t[n - 1].nd = 3, t[n - 1].ne[2] = d->experts, t[n - 1].hf_op = HF_DOWN_T;
    GT("ffn_gate_exps.bias", "mlp.experts.gate_up_proj_bias", ft->type, d->ffn, d->experts,
       TK_BIAS);
    t[n - 1].hf_op = HF_GATE_UP_BIAS;
    GT("ffn_up_exps.bias", "", ft->type, d->ffn, d->experts, TK_BIAS);
    t[n - 1].hf_op = HF_SKIP;
    GT("ffn_down_exps.bias", "mlp.experts.down_proj_bias", ft->type, d->dim, d->experts,
       TK_BIAS);
#undef GT
    return n;
}

/* A deepseek2 layer after its attn_norm, llama.cpp's names (room for 17): MLA's low-rank q,
 * the latent + rope projection, k_b and v_b (3-D: one matrix per head), then a dense FFN in
 * the leading layers, else the F32 router, the selection bias, the experts and the shared
 * expert. */
static size_t deepseek_layer(struct tspec *t, const struct dims *d, uint32_t l, uint32_t type)
{
    struct mla_dims md = mla_dims(d);
    uint32_t H = d->heads;
    size_t n = 0;
    char g[64];
    char h[96];
#define DT(name, hname, ty, cols, rows, kind)                                                     \
    do {                                                                                          \
        snprintf(g, sizeof(g), "blk.%u.%s", l, name);                                             \
        snprintf(h, sizeof(h), "model.layers.%u.%s", l, hname);                                   \
        spec(&t[n++], g, hname[0] ? h : "", ty, cols, rows, kind);                                \
    } while (0)
    DT("attn_q_a.weight", "self_attn.q_a_proj.weight", type, d->dim, md.q_lora, TK_MATRIX);
    DT("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", type, md.q_lora, 1, TK_QKNORM);
    DT("attn_q_b.weight", "self_attn.q_b_proj.weight", type, md.q_lora, H * (md.nope + md.rope),
       TK_MATRIX);
    DT("attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight", type, d->dim,
       md.kv_lora + md.rope, TK_MATRIX);
    DT("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", type, md.kv_lora, 1,
       TK_QKNORM);
    DT("attn_k_b.weight", "self_attn.kv_b_proj.weight", type, md.nope, md.kv_lora, TK_MATRIX);
    t[n - 1].nd = 3, t[n - 1].ne[2] = H, t[n - 1].kvb_v = md.v;
    DT("attn_v_b.weight", "", type, md.kv_lora, md.v, TK_MATRIX); /* HF: in kv_b_proj */
    t[n - 1].nd = 3, t[n - 1].ne[2] = H;
    DT("attn_output.weight", "self_attn.o_proj.weight", type, H * md.v, d->dim, TK_MATRIX);
    DT("ffn_norm.weight", "post_attention_layernorm.weight", type, d->dim, 1, TK_ONES);
    if (l < md.dense_lead) {
        DT("ffn_gate.weight", "mlp.gate_proj.weight", type, d->dim, d->ffn, TK_MATRIX);
        DT("ffn_down.weight", "mlp.down_proj.weight", type, d->ffn, d->dim, TK_MATRIX);
        DT("ffn_up.weight", "mlp.up_proj.weight", type, d->dim, d->ffn, TK_MATRIX);
        return n;
    }
    DT("ffn_gate_inp.weight", "mlp.gate.weight", TY_GGML_F32, d->dim, d->experts, TK_ROUTER);
    if (!d->ds_v2)
        DT("exp_probs_b.bias", "mlp.gate.e_score_correction_bias", TY_GGML_F32, d->experts, 1,
           TK_BIAS);
    DT("ffn_gate_exps.weight", "mlp.experts.%u.gate_proj.weight", type, d->dim, d->ffn,
       TK_MATRIX);
    t[n - 1].nd = 3, t[n - 1].ne[2] = d->experts;
    DT("ffn_down_exps.weight", "mlp.experts.%u.down_proj.weight", type, d->ffn, d->dim,
       TK_MATRIX);
    t[n - 1].nd = 3, t[n - 1].ne[2] = d->experts;
    DT("ffn_up_exps.weight", "mlp.experts.%u.up_proj.weight", type, d->dim, d->ffn, TK_MATRIX);
    t[n - 1].nd = 3, t[n - 1].ne[2] = d->experts;
    DT("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight", type, d->dim, d->ffn,
       TK_MATRIX);
    DT("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight", type, d->ffn, d->dim,
       TK_MATRIX);
    DT("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight", type, d->dim, d->ffn,
       TK_MATRIX);
#undef DT
    return n;
}

/* Every tensor of the model, in file order, into t (room for 5 + 20 per layer); returns the
 * count. Names follow llama.cpp (GGUF) and transformers (HF). */
static size_t build_specs(struct tspec *t, const struct dims *d, const struct arch_spec *a,
                          const struct ftype *ft)
{
    uint32_t hd = head_dim(d), q = d->heads * hd, kv = d->kv_heads * hd, type = ft->type;
    uint32_t wide = ft->more ? ft->more : type;
    size_t n = 0;
    char g[64], h[96];
    spec(&t[n++], "token_embd.weight", "model.embed_tokens.weight", type, d->dim, d->vocab,
         TK_MATRIX);
    spec(&t[n++], "output_norm.weight", "model.norm.weight", type, d->dim, 1, TK_ONES);
    if (!d->tied)
        spec(&t[n++], "output.weight", "lm_head.weight", wide, d->dim, d->vocab, TK_MATRIX);
    for (uint32_t l = 0; l < d->layers; l++) {
        uint32_t more = use_more_bits(l, d->layers) ? wide : type;
#define LT_TYPE(gs, hs, ty, cols, rows, kind)                                                     \
    do {                                                                                          \
        snprintf(g, sizeof(g), "blk.%u.%s", l, gs);                                               \
        snprintf(h, sizeof(h), "model.layers.%u.%s", l, hs);                                      \
        spec(&t[n++], g, h, ty, cols, rows, kind);                                                \
    } while (0)
#define LT(gs, hs, cols, rows, kind) LT_TYPE(gs, hs, type, cols, rows, kind)
        LT("attn_norm.weight", "input_layernorm.weight", d->dim, 1, TK_ONES);
        if (a->moe == MOE_DEEPSEEK) {
            n += deepseek_layer(t + n, d, l, type);
            continue;
        }
        LT("attn_q.weight", "self_attn.q_proj.weight", d->dim, q, TK_MATRIX);
        t[n - 1].permute_heads = a->hf_permute ? d->heads : 0;
        LT("attn_k.weight", "self_attn.k_proj.weight", d->dim, kv, TK_MATRIX);
        t[n - 1].permute_heads = a->hf_permute ? d->kv_heads : 0;
        LT_TYPE("attn_v.weight", "self_attn.v_proj.weight", more, d->dim, kv, TK_MATRIX);
        if (a->qkv_bias) {
            LT("attn_q.bias", "self_attn.q_proj.bias", q, 1, TK_BIAS);
            LT("attn_k.bias", "self_attn.k_proj.bias", kv, 1, TK_BIAS);
            LT("attn_v.bias", "self_attn.v_proj.bias", kv, 1, TK_BIAS);
        }
        if (a->qk_norm) {
            LT("attn_q_norm.weight", "self_attn.q_norm.weight", hd, 1, TK_QKNORM);
            LT("attn_k_norm.weight", "self_attn.k_norm.weight", hd, 1, TK_QKNORM);
        }
        LT("attn_output.weight", "self_attn.o_proj.weight", q, d->dim, TK_MATRIX);
        if (a->moe == MOE_GPTOSS) {
            n = gptoss_layer(t, n, l, d, ft);
            continue;
        }
        LT("ffn_norm.weight", "post_attention_layernorm.weight", d->dim, 1, TK_ONES);
        if (a->moe) { /* the router stays F32, as llama.cpp's quantizer keeps ffn_gate_inp */
            LT_TYPE("ffn_gate_inp.weight", a->hf_router, TY_GGML_F32, d->dim, d->experts,
                    TK_ROUTER);
            LT("ffn_gate_exps.weight", a->hf_exp[0], d->dim, d->ffn, TK_MATRIX);
            t[n - 1].nd = 3, t[n - 1].ne[2] = d->experts;
            LT_TYPE("ffn_down_exps.weight", a->hf_exp[2], more, d->ffn, d->dim, TK_MATRIX);
            t[n - 1].nd = 3, t[n - 1].ne[2] = d->experts;
            LT("ffn_up_exps.weight", a->hf_exp[1], d->dim, d->ffn, TK_MATRIX);
            t[n - 1].nd = 3, t[n - 1].ne[2] = d->experts;
            continue;
        }
        LT("ffn_gate.weight", "mlp.gate_proj.weight", d->dim, d->ffn, TK_MATRIX);
        LT_TYPE("ffn_down.weight", "mlp.down_proj.weight", more, d->ffn, d->dim, TK_MATRIX);
        LT("ffn_up.weight", "mlp.up_proj.weight", d->dim, d->ffn, TK_MATRIX);
#undef LT
#undef LT_TYPE
    }
    return n;
}

static int parse_dims(const char *s, struct dims *d)
{
    /* dim,layers,heads,kv_heads,ffn */
    int n = sscanf(s, "%u,%u,%u,%u,%u", &d->dim, &d->layers, &d->heads, &d->kv_heads, &d->ffn);
    d->ctx = 2048;
    d->tied = true;
    return n == 5 && d->dim && d->layers && d->layers <= 512 && d->heads && d->kv_heads &&
                   d->dim % d->heads == 0 && d->heads % d->kv_heads == 0 && d->ffn &&
                   d->dim <= 65536 && d->ffn <= 262144
               ? 0
               : TY_EINVAL;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tycho mkmodel (--preset 110m|1b|tiny | --dims D,LAYERS,HEADS,KV_HEADS,FFN)\n"
               "         --vocab-from TOKENIZER.gguf|bytes --out FILE.gguf\n"
               "         [--type f32|f16|q8_0|q4_0|q4_k|q5_k|q6_k|q4_k_m|mxfp4|mxfp4_moe]\n"
               "         [--arch llama|qwen2|qwen3|qwen3moe|mixtral|gpt-oss|deepseek2]\n"
               "         [--head-dim N] [--untied] [--seed S] [--sliding-window N]\n"
               "         [--yarn FACTOR,ORIG_CTX] [--ctx N] [--experts N] [--experts-used K]\n"
               "         [--deepseek-v2] [--hf DIR]\n"
               "  --type: the matrices' ggml type (norms and biases stay f32); q4_k_m is\n"
               "          llama.cpp's mix (Q4_K, Q6_K output and some attn_v / ffn_down);\n"
               "          mxfp4_moe llama.cpp's MXFP4_MOE (MXFP4 experts, Q8_0 elsewhere)\n"
               "  --vocab-from bytes: a built-in 259-token byte-fallback vocabulary (no donor file)\n"
               "  --arch: the GGUF architecture (llama.cpp's names and tensors): llama (default),\n"
               "          qwen2 (q/k/v biases), qwen3 (per-head q/k RMSNorm); mixtures of\n"
               "          experts: qwen3moe (Qwen3-MoE), mixtral (GGUF llama with experts),\n"
               "          gpt-oss (sinks, biased experts, even layers sliding)\n"
               "          deepseek2 (DeepSeek-V3's shape: MLA with a latent of D/2 and a rope\n"
               "          part of head_dim/2, a dense first layer, sigmoid-routed experts in 4\n"
               "          groups with a selection bias, a shared expert; HF deepseek_v3)\n"
               "  --deepseek-v2: deepseek2 with DeepSeek-V2's routing (softmax, no bias or\n"
               "          groups, weights neither renormalised nor scaled)\n"
               "  --head-dim: attention head size when not D/HEADS (as Qwen3 models have)\n"
               "  --untied: a separate output matrix instead of the embeddings\n"
               "  --sliding-window N: Mistral-style attention over the last N tokens on every\n"
               "          layer (<arch>.attention.sliding_window; llama.cpp reads it only for\n"
               "          architectures with SWA, not for llama, qwen2 or qwen3)\n"
               "  --experts N, --experts-used K: a mixture of experts' size (8 and 2), each\n"
               "          expert an FFN of the FFN size; the router stays f32\n"
               "  --yarn FACTOR,ORIG_CTX: YaRN rope scaling (<arch>.rope.scaling.*, HF rope_scaling)\n"
               "          by FACTOR over an original context of ORIG_CTX tokens\n"
               "  --ctx N: the context length (<arch>.context_length, max_position_embeddings);\n"
               "          default: the preset's, 2048 with --dims\n"
               "  --hf DIR: also write the same weights as a Hugging Face directory\n"
               "            (config.json + model.safetensors; f32 or f16; no tokenizer files)\n");
}

/* ---- the Hugging Face copy ------------------------------------------------------------------ */

/* HF llama q/k rows are in rotate_half order (transformers' convert_llama_weights_to_hf.py
 * permute()): row j*half + i of a head holds the GGUF (interleaved) row 2i + j. */
static void permute_rows(unsigned char *dst, const unsigned char *src, uint32_t heads,
                         uint32_t hd, size_t row_bytes)
{
    uint32_t half = hd / 2;
    for (uint32_t h = 0; h < heads; h++)
        for (uint32_t j = 0; j < 2; j++)
            for (uint32_t i = 0; i < half; i++)
                memcpy(dst + ((size_t)h * hd + j * half + i) * row_bytes,
                       src + ((size_t)h * hd + 2 * i + j) * row_bytes, row_bytes);
}

static int write_hf_config(const char *dir, const struct dims *d, const struct arch_spec *a,
                           uint32_t type)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    fprintf(f,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
            "  \"hidden_size\": %u,\n  \"intermediate_size\": %u,\n"
            "  \"num_hidden_layers\": %u,\n  \"num_attention_heads\": %u,\n"
            "  \"num_key_value_heads\": %u,\n  \"head_dim\": %u,\n  \"vocab_size\": %u,\n"
            "  \"max_position_embeddings\": %u,\n  \"rms_norm_eps\": %.9g,\n"
            "  \"rope_theta\": 10000.0,\n  \"attention_bias\": %s,\n"
            "  \"tie_word_embeddings\": %s,\n  \"hidden_act\": \"silu\",\n"
            "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"torch_dtype\": \"%s\"",
            a->hf_class, a->hf_type, d->dim, d->ffn, d->layers, d->heads, d->kv_heads,
            head_dim(d), d->vocab, d->ctx, (double)a->rms_eps, a->qkv_bias ? "true" : "false",
            d->tied ? "true" : "false", type == TY_GGML_F16 ? "float16" : "float32");
    if (d->window && a->moe != MOE_GPTOSS) /* Mistral's key; Qwen2-style configs also need use_sliding_window */
        fprintf(f, ",\n  \"sliding_window\": %u,\n  \"use_sliding_window\": true,\n"
                   "  \"max_window_layers\": 0", d->window);
    if (a->moe == MOE_QWEN3) /* transformers' Qwen3MoeConfig: every layer sparse */
        fprintf(f, ",\n  \"num_experts\": %u,\n  \"num_experts_per_tok\": %u,\n"
                   "  \"moe_intermediate_size\": %u,\n  \"norm_topk_prob\": true,\n"
                   "  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": []",
                d->experts, d->experts_used, d->ffn);
    if (a->moe == MOE_MIXTRAL)
        fprintf(f, ",\n  \"num_local_experts\": %u,\n  \"num_experts_per_tok\": %u",
                d->experts, d->experts_used);
    if (a->moe == MOE_GPTOSS) { /* transformers' GptOssConfig: even layers slide */
        fprintf(f, ",\n  \"num_local_experts\": %u,\n  \"num_experts_per_tok\": %u,\n"
                   "  \"sliding_window\": %u,\n  \"swiglu_limit\": 7.0,\n  \"layer_types\": [",
                d->experts, d->experts_used, d->window);
        for (uint32_t l = 0; l < d->layers; l++)
            fprintf(f, "%s\"%s\"", l ? ", " : "", l % 2 ? "full_attention" : "sliding_attention");
        fprintf(f, "]");
    }
    if (a->moe == MOE_DEEPSEEK) { /* transformers' DeepseekV3Config */
        struct mla_dims md = mla_dims(d);
        fprintf(f, ",\n  \"q_lora_rank\": %u,\n  \"kv_lora_rank\": %u,\n"
                   "  \"qk_nope_head_dim\": %u,\n  \"qk_rope_head_dim\": %u,\n"
                   "  \"v_head_dim\": %u,\n  \"n_routed_experts\": %u,\n"
                   "  \"num_experts_per_tok\": %u,\n  \"moe_intermediate_size\": %u,\n"
                   "  \"n_shared_experts\": 1,\n  \"first_k_dense_replace\": %u,\n"
                   "  \"n_group\": %u,\n  \"topk_group\": %u,\n  \"topk_method\": \"%s\",\n"
                   "  \"scoring_func\": \"%s\",\n  \"norm_topk_prob\": %s,\n"
                   "  \"routed_scaling_factor\": %s",
                md.q_lora, md.kv_lora, md.nope, md.rope, md.v, d->experts, d->experts_used,
                d->ffn, md.dense_lead, md.groups ? md.groups : 1,
                md.groups_used ? md.groups_used : 1, d->ds_v2 ? "greedy" : "noaux_tc",
                d->ds_v2 ? "softmax" : "sigmoid", d->ds_v2 ? "false" : "true",
                d->ds_v2 ? "1.0" : "2.5");
    }
    if (d->yarn_factor > 0)
        fprintf(f, ",\n  \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": %.9g, "
                   "\"original_max_position_embeddings\": %u%s}", (double)d->yarn_factor,
                d->yarn_orig, a->moe == MOE_DEEPSEEK ? ", \"mscale\": 1.0, \"mscale_all_dim\": 1.0"
                                                    : "");
    fprintf(f, "\n}\n");
    return fclose(f) ? -errno : 0;
}

/* Safetensors tensors of spec t: one, or one per expert of a 3-D expert tensor. */
static uint64_t st_count(const struct tspec *t)
{
    if (!t->hf[0])
        return 0; /* in another spec's tensor (deepseek2's attn_v_b: kv_b_proj) */
    return t->nd == 3 && !t->kvb_v ? t->ne[2] : 1;
}

/* deepseek2's kv_b_proj (n_heads * (nope + v), kv_lora): spec t (attn_k_b, ne {nope, kv_lora,
 * n_heads}) and the next (attn_v_b, ne {kv_lora, v, n_heads}) as HF keeps them: per head the
 * nope rows of k (k_b transposed back), then the v rows. */
static int kvb_compose(struct fill_ctx *fc, size_t i, const struct tspec *t, unsigned char *out)
{
    uint64_t N = t[0].ne[0], R = t[0].ne[1], H = t[0].ne[2], V = t[0].kvb_v;
    size_t es = t[0].type == TY_GGML_F16 ? 2 : 4;
    size_t kb = N * R * H * es, vb = R * V * H * es;
    unsigned char *k = malloc(kb), *v = malloc(vb);
    if (!k || !v) {
        free(k);
        free(v);
        return TY_ENOMEM;
    }
    fill(fc, i, 0, k, kb);
    fill(fc, i + 1, 0, v, vb);
    for (uint64_t h = 0; h < H; h++) {
        for (uint64_t j = 0; j < N; j++)
            for (uint64_t r = 0; r < R; r++)
                memcpy(out + ((h * (N + V) + j) * R + r) * es, k + ((h * R + r) * N + j) * es, es);
        memcpy(out + (h * (N + V) + N) * R * es, v + h * V * R * es, V * R * es);
    }
    free(k);
    free(v);
    return 0;
}

/* Tensor e of spec t (st_count): its name, and its bytes (each expert's the same). */
static uint64_t st_tensor(const struct tspec *t, uint64_t e, char *name, size_t cap)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral" /* arches[]' names, %u = the expert */
    if (t->nd == 3 && !t->kvb_v)
        snprintf(name, cap, t->hf, (unsigned)e);
    else
        snprintf(name, cap, "%s", t->hf);
#pragma GCC diagnostic pop
    if (t->kvb_v)
        return ty_ggml_type_nbytes(t->type, t->ne[2] * (t->ne[0] + t->kvb_v) * t->ne[1]);
    return ty_ggml_type_nbytes(t->type, t->ne[0] * t->ne[1]);
}

/* Bytes and shape of a gpt-oss expert tensor in HF's layout (hf_op). */
static uint64_t hf_bytes(const struct tspec *t)
{
    uint64_t all = ty_ggml_type_nbytes(t->type, t->ne[0] * t->ne[1] * t->ne[2]);
    return t->hf_op == HF_GATE_UP || t->hf_op == HF_GATE_UP_BIAS ? 2 * all : all;
}

static json_t *hf_shape(const struct tspec *t)
{
    json_int_t a = (json_int_t)t->ne[0], b = (json_int_t)t->ne[1], e = (json_int_t)t->ne[2];
    switch (t->hf_op) {
    case HF_GATE_UP: return json_pack("[III]", e, a, 2 * b);     /* [E, D, 2F] */
    case HF_GATE_UP_BIAS: return json_pack("[II]", b, 2 * a);    /* [E, 2F] */
    default: return json_pack("[III]", e, a, b);                 /* down: [E, F, D] */
    }
}

/* Tensor i's HF bytes (hf_op) into out: gate (i) and up (i + 1) interleaved, or down
 * transposed per expert. Returns 0 or TY_ENOMEM. */
static int hf_fill(struct fill_ctx *fc, const struct tspec *t, size_t i, unsigned char *out)
{
    const struct tspec *s = &t[i];
    size_t esz = s->type == TY_GGML_F32 ? 4 : 2, all = hf_bytes(s) / esz;
    uint64_t a = s->ne[0], b = s->ne[1];
    bool fused = s->hf_op != HF_DOWN_T;
    unsigned char *src = malloc(fused ? 2 * all / 2 * esz : all * esz);
    if (!src)
        return TY_ENOMEM;
    if (fused) { /* gate then up, each (rows b, cols a) per expert, or (E, F) biases */
        fill(fc, i, 0, src, all / 2 * esz);
        fill(fc, i + 1, 0, src + all / 2 * esz, all / 2 * esz);
        for (size_t k = 0; k < all / 2; k++) {
            /* bias: k = e*F + f -> e*2F + 2f + j; matrix: k = (e*F + f)*D + d ->
             * (e*D + d)*2F + 2f + j */
            size_t dst = s->hf_op == HF_GATE_UP_BIAS
                             ? 2 * k
                             : ((k / (a * b)) * a + k % a) * 2 * b + 2 * (k / a % b);
            memcpy(out + dst * esz, src + k * esz, esz);
            memcpy(out + (dst + 1) * esz, src + (all / 2 + k) * esz, esz);
        }
    } else { /* down: GGUF (E, D rows, F cols) -> HF [E, F, D] */
        fill(fc, i, 0, src, all * esz);
        for (size_t k = 0; k < all; k++) {
            uint64_t e = k / (a * b), r = k / a % b, c = k % a; /* row r of D, col c of F */
            memcpy(out + ((e * a + c) * b + r) * esz, src + k * esz, esz);
        }
    }
    free(src);
    return 0;
}

/* The safetensors header (huggingface/safetensors README): tensors back to back in file
 * order, the JSON padded with spaces to a multiple of 8 bytes. */
static char *st_header(const struct tspec *t, size_t n, uint64_t *hlen)
{
    json_t *o = json_object();
    uint64_t off = 0;
    char name[128];
    for (size_t i = 0; i < n; i++)
        for (uint64_t e = 0; e < st_count(&t[i]); e++) {
            uint64_t bytes = st_tensor(&t[i], e, name, sizeof(name));
            if (t[i].hf_op) { /* gpt-oss's experts: one tensor for all */
                if (t[i].hf_op != HF_SKIP)
                    json_object_set_new(o, t[i].hf, json_pack(
                        "{s:s, s:o, s:[II]}", "dtype", t[i].type == TY_GGML_F16 ? "F16" : "F32",
                        "shape", hf_shape(&t[i]), "data_offsets", (json_int_t)off,
                        (json_int_t)(off + hf_bytes(&t[i]))));
                off += t[i].hf_op != HF_SKIP ? hf_bytes(&t[i]) : 0;
                break;
            }
            json_t *shape = t[i].kvb_v ? json_pack("[II]", (json_int_t)(t[i].ne[2] *
                                                               (t[i].ne[0] + t[i].kvb_v)),
                                                   (json_int_t)t[i].ne[1])
                            : t[i].nd >= 2 ? json_pack("[II]", (json_int_t)t[i].ne[1],
                                                       (json_int_t)t[i].ne[0])
                                           : json_pack("[I]", (json_int_t)t[i].ne[0]);
            json_object_set_new(o, name,
                                json_pack("{s:s, s:o, s:[II]}", "dtype",
                                          t[i].type == TY_GGML_F16 ? "F16" : "F32", "shape",
                                          shape, "data_offsets", (json_int_t)off,
                                          (json_int_t)(off + bytes)));
            off += bytes;
        }
    char *js = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!js)
        abort(); /* small metadata: OOM aborts (STYLE.md) */
    size_t len = strlen(js), padded = (len + 7) / 8 * 8;
    char *h = realloc(js, padded + 1);
    if (!h)
        abort();
    memset(h + len, ' ', padded - len);
    h[padded] = 0;
    *hlen = padded;
    return h;
}

/* DIR/config.json and DIR/model.safetensors holding exactly the GGUF's values (the same
 * fill; each expert of a 3-D tensor its own matrix), q/k rows permuted where HF's layout
 * differs. */
static int write_hf(const char *dir, const struct tspec *t, size_t n, const struct dims *d,
                    const struct arch_spec *a, uint32_t type, struct fill_ctx *fc)
{
    char path[4096], name[128];
    uint64_t hlen;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return -errno;
    int rc = write_hf_config(dir, d, a, type);
    if (rc)
        return rc;
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -errno;
    char *h = st_header(t, n, &hlen);
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(hlen >> (8 * i));
    if (fwrite(le, 1, 8, f) != 8 || fwrite(h, 1, hlen, f) != hlen)
        rc = TY_EIO;
    free(h);
    for (size_t i = 0; i < n && !rc; i++)
        for (uint64_t e = 0; e < st_count(&t[i]) && !rc; e++) {
            if (t[i].hf_op) { /* gpt-oss's experts: one tensor for all */
                if (t[i].hf_op != HF_SKIP) {
                    unsigned char *hb = malloc(hf_bytes(&t[i]));
                    if (!hb)
                        rc = TY_ENOMEM;
                    else if (!(rc = hf_fill(fc, t, i, hb)) &&
                             fwrite(hb, 1, hf_bytes(&t[i]), f) != hf_bytes(&t[i]))
                        rc = TY_EIO;
                    free(hb);
                }
                break;
            }
            size_t bytes = st_tensor(&t[i], e, name, sizeof(name)), row = bytes / t[i].ne[1];
            unsigned char *buf = malloc(bytes), *perm = t[i].permute_heads ? malloc(bytes) : NULL;
            if (!buf || (t[i].permute_heads && !perm)) {
                rc = TY_ENOMEM;
            } else if (t[i].kvb_v) {
                rc = kvb_compose(fc, i, t + i, buf);
                if (!rc && fwrite(buf, 1, bytes, f) != bytes)
                    rc = TY_EIO;
            } else {
                fill(fc, i, e * bytes, buf, bytes);
                if (perm)
                    permute_rows(perm, buf, t[i].permute_heads, head_dim(d), row);
                if (fwrite(perm ? perm : buf, 1, bytes, f) != bytes)
                    rc = TY_EIO;
            }
            free(buf);
            free(perm);
        }
    if (fclose(f) && !rc)
        rc = TY_EIO;
    return rc;
}

/* ---- the GGUF ------------------------------------------------------------------------------ */

static int write_model(const struct dims *d, const struct arch_spec *a, const struct ftype *ft,
                       const char *vocab, const char *out, const char *hf, uint64_t seed)
{
    ty_gguf_writer_t *w = NULL;
    struct dims dd = *d;
    size_t n = 0;
    struct tspec *t = calloc(5 + 20 * (size_t)d->layers, sizeof(*t));
    int rc = t ? ty_gguf_writer_new(&w) : TY_ENOMEM;
    if (rc)
        goto out;
    rc = strcmp(vocab, "bytes") == 0 ? builtin_vocab(w, &dd.vocab) : copy_vocab(w, vocab, &dd.vocab);
    if (rc || (rc = add_kv(w, &dd, a, ft)))
        goto out;
    n = build_specs(t, &dd, a, ft);
    for (size_t i = 0; i < n && !rc; i++)
        rc = ty_gguf_writer_tensor(w, t[i].gguf, t[i].type, t[i].nd, t[i].ne);
    struct fill_ctx fc = {seed, t};
    if (!rc)
        rc = ty_gguf_writer_write(w, out, fill, &fc);
    if (!rc && hf)
        rc = write_hf(hf, t, n, &dd, a, ft->type, &fc);
out:
    ty_gguf_writer_free(w);
    free(t);
    return rc;
}

static const struct arch_spec *find_arch(const char *name)
{
    for (size_t i = 0; i < sizeof(arches) / sizeof(arches[0]); i++)
        if (strcmp(arches[i].name, name) == 0)
            return &arches[i];
    return NULL;
}

/* Shape checks that depend on the options together; 0 or a message on stderr. */
static int check_shape(const struct dims *d, const struct ftype *ft, const char *hf,
                       const struct arch_spec *a)
{
    uint32_t hd = head_dim(d), block = ty_ggml_type_block(ft->type);
    if (hd == 0 || hd % 2 || hd > 1024) {
        fprintf(stderr, "tycho mkmodel: --head-dim must be even, 2..1024\n");
        return TY_CLI_EXIT_USAGE;
    }
    /* every matrix row (dim, ffn or heads*head_dim long) holds whole blocks */
    if (d->dim % block || d->ffn % block || (d->heads * hd) % block) {
        fprintf(stderr, "tycho mkmodel: %s needs dim, ffn and heads*head_dim to be multiples "
                        "of %u\n", ft->name, block);
        return TY_CLI_EXIT_USAGE;
    }
    if (a->moe == MOE_DEEPSEEK) { /* k_b rows are head_dim long, v_b and q_b rows dim / 2 */
        uint32_t hd2 = d->head_dim ? d->head_dim : d->dim / d->heads;
        if (hd2 % block || (d->dim / 2) % block || hd2 % 4) {
            fprintf(stderr, "tycho mkmodel: deepseek2 %s needs head_dim and dim/2 to be "
                            "multiples of %u (and head_dim of 4)\n", ft->name, block);
            return TY_CLI_EXIT_USAGE;
        }
    }
    if (hf && block > 1) {
        fprintf(stderr, "tycho mkmodel: --hf needs --type f32 or f16 (safetensors has no %s)\n",
                ft->name);
        return TY_CLI_EXIT_USAGE;
    }
    return 0;
}

static const struct ftype *find_ftype(const char *name)
{
    for (size_t i = 0; i < sizeof(ftypes) / sizeof(ftypes[0]); i++)
        if (strcmp(ftypes[i].name, name) == 0)
            return &ftypes[i];
    return NULL;
}

static int run_mkmodel(int argc, char **argv)
{
    static const struct option opts[] = {
        {"preset", 1, 0, 'p'}, {"dims", 1, 0, 'd'},     {"vocab-from", 1, 0, 'v'},
        {"out", 1, 0, 'o'},    {"type", 1, 0, 't'},     {"seed", 1, 0, 's'},
        {"arch", 1, 0, 'a'},   {"head-dim", 1, 0, 'H'}, {"untied", 0, 0, 'U'},
        {"hf", 1, 0, 'F'},     {"help", 0, 0, 'h'},     {"sliding-window", 1, 0, 'W'},
        {"yarn", 1, 0, 'Y'},   {"experts", 1, 0, 'E'}, {"experts-used", 1, 0, 'K'},
        {"ctx", 1, 0, 'C'},    {"deepseek-v2", 0, 0, '2'},
        {0, 0, 0, 0}};
    float yarn_factor = 0;
    uint32_t yarn_orig = 0;
    struct dims d = {0};
    const char *vocab = NULL, *out = NULL, *hf = NULL;
    const struct arch_spec *arch = &arches[0];
    const struct ftype *ft = &ftypes[0];
    uint32_t hd = 0, window = 0, experts = 0, experts_used = 0, ctx = 0;
    uint64_t seed = 1;
    bool have = false, untied = false, ds_v2 = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
                if (strcmp(optarg, presets[i].name) == 0)
                    d = presets[i].d, have = true;
            if (!have) {
                fprintf(stderr, "tycho mkmodel: unknown preset '%s'\n", optarg);
                return TY_CLI_EXIT_USAGE;
            }
            break;
        case 'd':
            if (parse_dims(optarg, &d)) {
                fprintf(stderr, "tycho mkmodel: bad --dims '%s'\n", optarg);
                return TY_CLI_EXIT_USAGE;
            }
            have = true;
            break;
        case 'v': vocab = optarg; break;
        case 'o': out = optarg; break;
        case 'F': hf = optarg; break;
        case 'U': untied = true; break;
        case 't':
            if (!(ft = find_ftype(optarg))) {
                fprintf(stderr, "tycho mkmodel: --type is f32, f16, q8_0, q4_0, q4_k, q5_k, "
                                "q6_k, q4_k_m, mxfp4 or mxfp4_moe\n");
                return TY_CLI_EXIT_USAGE;
            }
            break;
        case 'a':
            if (!(arch = find_arch(optarg))) {
                fprintf(stderr, "tycho mkmodel: --arch is llama, qwen2, qwen3, qwen3moe, "
                                "mixtral, gpt-oss or deepseek2\n");
                return TY_CLI_EXIT_USAGE;
            }
            break;
        case 'H':
            hd = (uint32_t)strtoul(optarg, NULL, 10);
            if (hd == 0) {
                fprintf(stderr, "tycho mkmodel: bad --head-dim '%s'\n", optarg);
                return TY_CLI_EXIT_USAGE;
            }
            break;
        case 'W':
            window = (uint32_t)strtoul(optarg, NULL, 10);
            if (window == 0) {
                fprintf(stderr, "tycho mkmodel: bad --sliding-window '%s'\n", optarg);
                return TY_CLI_EXIT_USAGE;
            }
            break;
        case 'E': experts = (uint32_t)strtoul(optarg, NULL, 10); break;
        case '2': ds_v2 = true; break;
        case 'K': experts_used = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'Y': {
            char *end;
            yarn_factor = strtof(optarg, &end);
            yarn_orig = *end == ',' ? (uint32_t)strtoul(end + 1, &end, 10) : 0;
            if (!(yarn_factor >= 1 && yarn_factor <= 1024) || yarn_orig == 0 || *end) {
                fprintf(stderr, "tycho mkmodel: bad --yarn '%s' (FACTOR,ORIG_CTX: a factor of 1 "
                                "to 1024 and a context)\n", optarg);
                return TY_CLI_EXIT_USAGE;
            }
            break;
        }
        case 'C':
            ctx = (uint32_t)strtoul(optarg, NULL, 10);
            if (ctx < 16 || ctx > (1u << 24)) {
                fprintf(stderr, "tycho mkmodel: bad --ctx '%s' (16 to 16777216 tokens)\n",
                        optarg);
                return TY_CLI_EXIT_USAGE;
            }
            break;
        case 's': seed = strtoull(optarg, NULL, 10); break;
        case 'h': usage(stdout); return TY_CLI_EXIT_OK;
        default: usage(stderr); return TY_CLI_EXIT_USAGE;
        }
    }
    if (!have || !vocab || !out || optind != argc) {
        usage(stderr);
        return TY_CLI_EXIT_USAGE;
    }
    d.head_dim = hd ? hd : d.head_dim;
    d.window = window;
    if (arch->moe == MOE_GPTOSS)
        d.window = window ? window : 16; /* gpt-oss's even layers always slide */
    if ((experts || experts_used) && !arch->moe) {
        fprintf(stderr, "tycho mkmodel: --experts needs a mixture-of-experts --arch\n");
        return TY_CLI_EXIT_USAGE;
    }
    d.experts = arch->moe ? (experts ? experts : 8) : 0;
    d.experts_used = arch->moe ? (experts_used ? experts_used : 2) : 0;
    if (arch->moe && (d.experts > 256 || d.experts_used > d.experts || d.experts_used > 16)) {
        fprintf(stderr, "tycho mkmodel: --experts 1..256, --experts-used 1..16 and at most "
                        "--experts\n");
        return TY_CLI_EXIT_USAGE;
    }
    if (ds_v2 && arch->moe != MOE_DEEPSEEK) {
        fprintf(stderr, "tycho mkmodel: --deepseek-v2 needs --arch deepseek2\n");
        return TY_CLI_EXIT_USAGE;
    }
    d.ds_v2 = ds_v2;
    d.yarn_factor = yarn_factor;
    d.yarn_orig = yarn_orig;
    d.ctx = ctx ? ctx : d.ctx;
    d.tied = d.tied && !untied;
    int rc = check_shape(&d, ft, hf, arch);
    if (rc)
        return rc;
    rc = write_model(&d, arch, ft, vocab, out, hf, seed);
    if (rc) {
        fprintf(stderr, "tycho mkmodel: writing %s: %s\n", hf ? hf : out, ty_strerror(rc));
        return TY_CLI_EXIT_FAIL;
    }
    return TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_mkmodel = {
    "mkmodel",
    "write a random-weight GGUF (llama, qwen2, qwen3, qwen3moe, mixtral, gpt-oss, deepseek2) of "
    "a given shape",
    run_mkmodel};
