/* GGUF model loader: llama-style tensor names (blk.N.attn_q.weight, ...), hyper-parameters
 * from <arch>.* keys (head_dim from <arch>.attention.key_length where given, as Qwen3's), tokenizer from tokenizer.ggml.* keys (llama.cpp's conventions). Mixtures of experts
 * (qwen3moe, llama with expert_count, deepseek2) keep each layer's experts in 3-D tensors;
 * deepseek2's MLA keys and 3-D attn_k_b / attn_v_b are read by read_mla / load_mla_b. */
#include "model-impl.h"

#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int weight_from(struct ty_weight *w, const struct ty_gguf_tensor *t, char *errbuf,
                       size_t errlen)
{
    if (!t)
        return 0;
    if (t->n_dims > 2) {
        snprintf(errbuf, errlen, "tensor '%s' has %u dimensions, expected a matrix or vector",
                 t->name, t->n_dims);
        return TY_EFORMAT;
    }
    w->data = t->data;
    w->type = t->type;
    w->cols = t->ne[0];
    w->rows = t->ne[1];
    return 0;
}

static int get_w(const ty_gguf_t *g, struct ty_weight *w, const char *name, char *errbuf,
                 size_t errlen)
{
    return weight_from(w, ty_gguf_find_tensor(g, name), errbuf, errlen);
}

/* blk.l.ffn_{gate,up,down}_exps.weight (ne {cols, rows, n_experts}, experts back to back)
 * as one view per expert; a shared expert (blk.l.ffn_*_shexp) is refused. */
/* blk.l.<what>.weight as a 3-D tensor of n matrices (the model's `count` key), in *t; NULL
 * when absent (the shape checks name what is missing), TY_EFORMAT for another shape. */
static int find_3d(const struct ty_model *m, uint32_t l, const char *what, uint32_t n,
                   const char *count, const struct ty_gguf_tensor **t, char *errbuf,
                   size_t errlen)
{
    char name[96];
    snprintf(name, sizeof(name), "blk.%u.%s.weight", l, what);
    *t = ty_gguf_find_tensor(m->gguf, name);
    if (*t && (!n || (*t)->n_dims != 3 || (*t)->ne[2] != n)) {
        snprintf(errbuf, errlen, "tensor '%s' must have 3 dimensions, the last %u (the model's "
                 "%s)", name, n, count);
        return TY_EFORMAT;
    }
    return 0;
}

static int load_experts(struct ty_model *m, uint32_t l, char *errbuf, size_t errlen)
{
    static const char *const names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    struct ty_layer_weights *L = &m->layers[l];
    struct ty_weight *out[3] = {L->exp_gate, L->exp_up, L->exp_down};
    char name[96];
    uint32_t E = m->cfg.n_experts;
    snprintf(name, sizeof(name), "blk.%u.ffn_gate_inp_shexp.weight", l);
    if (ty_gguf_find_tensor(m->gguf, name)) {
        snprintf(errbuf, errlen, "layer %u: shared experts (%s) are not supported", l, name);
        return TY_ENOTSUP;
    }
    for (int i = 0; i < 3; i++) {
        const struct ty_gguf_tensor *t;
        int rc = find_3d(m, l, names[i], E, "expert_count", &t, errbuf, errlen);
        if (rc)
            return rc;
        if (!t)
            continue; /* the shape check names what is missing */
        uint64_t bytes = ty_ggml_type_nbytes(t->type, t->ne[0] * t->ne[1]);
        for (uint32_t e = 0; e < E; e++)
            out[i][e] = (struct ty_weight){(const unsigned char *)t->data + e * bytes, t->type,
                                           t->ne[1], t->ne[0]};
    }
    return 0;
}

/* gpt-oss's layer tensors beyond the shared table: blk.l.post_attention_norm (llama.cpp's
 * LLM_TENSOR_ATTN_POST_NORM, which openai-moe applies before the experts: the FFN norm) and
 * the experts' 2-D biases blk.l.ffn_{gate,up,down}_exps.bias (ne {n, n_experts}). */
static int load_gptoss(struct ty_model *m, uint32_t l, char *errbuf, size_t errlen)
{
    static const char *const names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    struct ty_layer_weights *L = &m->layers[l];
    struct ty_weight *out[3] = {&L->exp_b_gate, &L->exp_b_up, &L->exp_b_down};
    char name[96];
    int rc;
    if (L->ffn_norm.data) {
        snprintf(errbuf, errlen, "layer %u: a gpt-oss model with ffn_norm (its FFN norm is "
                 "blk.%u.post_attention_norm)", l, l);
        return TY_EFORMAT;
    }
    snprintf(name, sizeof(name), "blk.%u.post_attention_norm.weight", l);
    if ((rc = get_w(m->gguf, &L->ffn_norm, name, errbuf, errlen)))
        return rc;
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof(name), "blk.%u.%s.bias", l, names[i]);
        if ((rc = get_w(m->gguf, out[i], name, errbuf, errlen)))
            return rc;
    }
    return 0;
}

/* blk.l.attn_k_b.weight (ne {qk_nope, kv_lora_rank, n_heads}) and attn_v_b.weight (ne
 * {kv_lora_rank, v_head, n_heads}), llama.cpp's converter's split of HF kv_b_proj, as 2-D
 * views of every head's matrices back to back; the unsplit attn_kv_b is refused. */
static int load_mla_b(struct ty_model *m, uint32_t l, char *errbuf, size_t errlen)
{
    static const char *const names[2] = {"attn_k_b", "attn_v_b"};
    struct ty_weight *out[2] = {&m->layers[l].wk_b, &m->layers[l].wv_b};
    char name[96];
    snprintf(name, sizeof(name), "blk.%u.attn_kv_b.weight", l);
    if (ty_gguf_find_tensor(m->gguf, name)) {
        snprintf(errbuf, errlen, "%s: the unsplit MLA kv_b form is not supported (convert with "
                 "a llama.cpp that writes attn_k_b and attn_v_b)", name);
        return TY_ENOTSUP;
    }
    for (int i = 0; i < 2; i++) {
        const struct ty_gguf_tensor *t;
        int rc = find_3d(m, l, names[i], m->cfg.n_heads, "head_count", &t, errbuf, errlen);
        if (rc)
            return rc;
        if (!t)
            continue; /* the shape check names what is missing */
        *out[i] = (struct ty_weight){t->data, t->type, t->ne[1] * t->ne[2], t->ne[0]};
    }
    return 0;
}

static int load_layer(struct ty_model *m, uint32_t l, char *errbuf, size_t errlen)
{
    char name[96];
    for (size_t i = 0; i < ty__n_layer_tensors; i++) {
        const struct ty__layer_tensor *t = &ty__layer_tensors[i];
        if (!t->gguf)
            continue; /* HF only (kv_b_proj) */
        snprintf(name, sizeof(name), "blk.%u.%s", l, t->gguf);
        struct ty_weight *w = (struct ty_weight *)((char *)&m->layers[l] + t->off);
        int rc = get_w(m->gguf, w, name, errbuf, errlen);
        if (rc)
            return rc;
    }
    int rc = m->cfg.kv_lora_rank ? load_mla_b(m, l, errbuf, errlen) : 0;
    if (!rc)
        rc = load_experts(m, l, errbuf, errlen);
    if (!rc && m->cfg.arch == TY_MODEL_ARCH_GPTOSS)
        rc = load_gptoss(m, l, errbuf, errlen);
    return rc;
}

static bool key_u32(const ty_gguf_t *g, const char *arch, const char *key, uint32_t *v)
{
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    return ty_gguf_get_u32(g, full, v);
}

static bool key_f32(const ty_gguf_t *g, const char *arch, const char *key, float *v)
{
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    return ty_gguf_get_f32(g, full, v);
}

static int read_rope_scaling(struct ty_model *m, const char *arch, char *errbuf, size_t errlen)
{
    char full[128];
    const char *s;
    uint64_t len;
    snprintf(full, sizeof(full), "%s.rope.scaling.type", arch);
    if (!ty_gguf_get_str(m->gguf, full, &s, &len) || (len == 4 && memcmp(s, "none", 4) == 0)) {
        /* no scaling */
    } else if ((len == 6 && memcmp(s, "linear", 6) == 0) || (len == 4 && memcmp(s, "yarn", 4) == 0)) {
        m->rope_scaling = len == 4 ? 3 : 1;
        if (!key_f32(m->gguf, arch, "rope.scaling.factor", &m->rope_factor)) {
            snprintf(errbuf, errlen, "%.*s rope scaling without %s.rope.scaling.factor", (int)len,
                     s, arch);
            return TY_EFORMAT;
        }
        if (m->rope_scaling == 3) {
            m->rope_orig_ctx = m->cfg.ctx_len; /* llama.cpp's n_ctx_orig_yarn default */
            key_u32(m->gguf, arch, "rope.scaling.original_context_length", &m->rope_orig_ctx);
            key_f32(m->gguf, arch, "rope.scaling.attn_factor", &m->rope_attn_factor);
            key_f32(m->gguf, arch, "rope.scaling.yarn_beta_fast", &m->rope_beta_fast);
            key_f32(m->gguf, arch, "rope.scaling.yarn_beta_slow", &m->rope_beta_slow);
            float mul = 0;
            key_f32(m->gguf, arch, "rope.scaling.yarn_log_multiplier", &mul);
            if (mul != 0 && m->cfg.arch == TY_MODEL_ARCH_DEEPSEEK2) {
                m->rope_yarn_log_mul = mul / 0.1f; /* llama.cpp cancels the converter's 0.1 */
            } else if (mul != 0) {
                snprintf(errbuf, errlen, "yarn rope scaling with %s.rope.scaling."
                         "yarn_log_multiplier (DeepSeek's mscale) is only supported for "
                         "deepseek2", arch);
                return TY_ENOTSUP;
            }
        }
    } else {
        snprintf(errbuf, errlen, "unsupported rope scaling type '%.*s' (%s; supported: none, "
                 "linear, yarn)", (int)(len > 32 ? 32 : len), s, full);
        return TY_ENOTSUP;
    }
    const struct ty_gguf_tensor *rf = ty_gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (rf) {
        uint32_t rd = m->cfg.rope_dim ? m->cfg.rope_dim : m->cfg.head_dim;
        if (rf->type != TY_GGML_F32 || rf->n_dims != 1 || rf->ne[0] != rd / 2) {
            snprintf(errbuf, errlen, "rope_freqs.weight must be F32 of %u elements",
                     rd / 2);
            return TY_EFORMAT;
        }
        m->rope_freqs = rf->data;
    }
    return 0;
}

/* <arch>.expert_count and friends (llama.cpp's LLM_KV_EXPERT_*): softmax gating over every
 * expert, the top expert_used_count renormalised (llama.cpp's build_moe_ffn for llama and
 * qwen3moe), no shared experts, no weight scale. */
static int read_experts(struct ty_model *m, const struct ty__arch *ai, const char *arch,
                        char *errbuf, size_t errlen)
{
    struct ty_model_config *c = &m->cfg;
    uint32_t v;
    float f;
    if (!key_u32(m->gguf, arch, "expert_count", &c->n_experts))
        c->n_experts = 0;
    if (ai->moe && !c->n_experts) {
        snprintf(errbuf, errlen, "%s model without %s.expert_count", arch, arch);
        return TY_EFORMAT;
    }
    if (!c->n_experts)
        return 0;
    c->moe_norm_topk = true;
    if (!key_u32(m->gguf, arch, "expert_used_count", &c->n_experts_used)) {
        snprintf(errbuf, errlen, "missing %s.expert_used_count", arch);
        return TY_EFORMAT;
    }
    if (key_u32(m->gguf, arch, "expert_feed_forward_length", &v))
        c->ffn_dim = v; /* qwen3moe: the experts' size; feed_forward_length a dense one's */
    if (ai->arch == TY_MODEL_ARCH_DEEPSEEK2)
        return 0; /* its shared experts, gating and scale: read_mla() */
    if (key_u32(m->gguf, arch, "expert_shared_count", &v) && v) {
        snprintf(errbuf, errlen, "%u shared experts (%s.expert_shared_count): not supported", v,
                 arch);
        return TY_ENOTSUP;
    }
    /* llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 1 softmax, 2 sigmoid, 3 softmax of top-k;
     * openai-moe reads no key: its gating is always the last (gptoss_params) */
    if (ai->arch != TY_MODEL_ARCH_GPTOSS && key_u32(m->gguf, arch, "expert_gating_func", &v) && v != 1) {
        snprintf(errbuf, errlen, "expert gating function %u (%s.expert_gating_func): only "
                 "softmax (1) is supported", v, arch);
        return TY_ENOTSUP;
    }
    if (key_f32(m->gguf, arch, "expert_weights_scale", &f) && f != 0.0f && f != 1.0f) {
        snprintf(errbuf, errlen, "expert weight scale %g (%s.expert_weights_scale): not "
                 "supported", (double)f, arch);
        return TY_ENOTSUP;
    }
    return 0;
}

/* gpt-oss as llama.cpp's openai-moe loads it: top-k softmax gating without renormalising,
 * SwiGLU-OAI experts, sliding layers by <arch>.attention.sliding_window_pattern (a period,
 * default 2: even layers slide), one rope base for both kinds of layer. */
static int gptoss_params(struct ty_model *m, const char *arch, char *errbuf, size_t errlen)
{
    struct ty_model_config *c = &m->cfg;
    char full[128];
    float base_swa;
    enum ty_gguf_vtype et;
    uint64_t n;
    const void *data;
    c->moe_norm_topk = false;
    c->moe_topk_softmax = c->swiglu_oai = true;
    if (!m->swa_window) {
        snprintf(errbuf, errlen, "gpt-oss model without %s.attention.sliding_window", arch);
        return TY_EFORMAT;
    }
    snprintf(full, sizeof(full), "%s.attention.sliding_window_pattern", arch);
    m->swa_period = 2;
    if (ty_gguf_get_arr(m->gguf, full, &et, &n, &data)) {
        snprintf(errbuf, errlen, "a per-layer sliding-window pattern (%s as an array) is not "
                 "supported (only a period)", full);
        return TY_ENOTSUP;
    }
    ty_gguf_get_u32(m->gguf, full, &m->swa_period); /* any integer type */
    if (m->swa_period == 0) {
        snprintf(errbuf, errlen, "unsupported sliding-window pattern 0 (%s)", full);
        return TY_ENOTSUP;
    }
    if (key_f32(m->gguf, arch, "rope.freq_base_swa", &base_swa) && base_swa != c->rope_theta) {
        snprintf(errbuf, errlen, "a separate rope base for sliding layers (%s.rope.freq_base_swa "
                 "%g, not %g) is not supported", arch, (double)base_swa, (double)c->rope_theta);
        return TY_ENOTSUP;
    }
    return 0;
}

/* DeepSeek-V2/V3 (llama.cpp's deepseek2 keys): MLA in the split form its converter writes
 * (attn_k_b / attn_v_b, with key_length_mla and value_length_mla), the routing of
 * build_moe_ffn. The pool row is the latent + the rope part: one kv head of that width. */
static int read_mla(struct ty_model *m, const char *arch, char *errbuf, size_t errlen)
{
    struct ty_model_config *c = &m->cfg;
    uint32_t kl = 0, v = 0;
    bool norm = false;
    if (!key_u32(m->gguf, arch, "attention.kv_lora_rank", &c->kv_lora_rank) ||
        !key_u32(m->gguf, arch, "rope.dimension_count", &c->rope_dim)) {
        snprintf(errbuf, errlen, "missing %s.attention.kv_lora_rank or %s.rope.dimension_count",
                 arch, arch);
        return TY_EFORMAT;
    }
    if (!key_u32(m->gguf, arch, "attention.key_length_mla", &kl) ||
        !key_u32(m->gguf, arch, "attention.value_length_mla", &c->v_head_dim)) {
        snprintf(errbuf, errlen, "%s without %s.attention.key_length_mla/value_length_mla: the "
                 "unsplit attn_kv_b form (old converters) is not supported", arch, arch);
        return TY_ENOTSUP;
    }
    if (kl <= c->rope_dim || !c->kv_lora_rank || c->kv_lora_rank > 4096 || !c->v_head_dim ||
        c->v_head_dim > 1024 || c->rope_dim % 2) {
        snprintf(errbuf, errlen, "invalid %s MLA dimensions: kv_lora_rank %u key_length_mla %u "
                 "rope %u value_length_mla %u", arch, c->kv_lora_rank, kl, c->rope_dim,
                 c->v_head_dim);
        return TY_EFORMAT;
    }
    c->qk_nope_dim = kl - c->rope_dim;
    key_u32(m->gguf, arch, "attention.q_lora_rank", &c->q_lora_rank);
    c->kq_scale = 1.0f / sqrtf((float)kl);
    if (!key_u32(m->gguf, arch, "feed_forward_length", &c->dense_ffn_dim))
        c->dense_ffn_dim = c->ffn_dim;
    key_u32(m->gguf, arch, "leading_dense_block_count", &c->n_dense_lead);
    if (key_u32(m->gguf, arch, "expert_shared_count", &v))
        c->shared_ffn_dim = v * c->ffn_dim;
    char k[128];
    snprintf(k, sizeof(k), "%s.expert_weights_norm", arch);
    c->moe_norm_topk = ty_gguf_get_bool(m->gguf, k, &norm) && norm; /* llama.cpp: false */
    if (!key_f32(m->gguf, arch, "expert_weights_scale", &c->expert_weights_scale))
        c->expert_weights_scale = 0;
    /* llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 1 softmax (the default for old V2 files),
     * 2 sigmoid */
    if (key_u32(m->gguf, arch, "expert_gating_func", &v) && v != 1 && v != 2) {
        snprintf(errbuf, errlen, "expert gating function %u (%s.expert_gating_func): only "
                 "softmax (1) and sigmoid (2) are supported", v, arch);
        return TY_ENOTSUP;
    }
    c->moe_gating = v == 2;
    key_u32(m->gguf, arch, "expert_group_count", &c->n_expert_groups);
    key_u32(m->gguf, arch, "expert_group_used_count", &c->n_group_used);
    float f;
    if (key_f32(m->gguf, arch, "attention.temperature_scale", &f) && f != 0) {
        snprintf(errbuf, errlen, "%s.attention.temperature_scale (attention temperature "
                 "tuning) is not supported", arch);
        return TY_ENOTSUP;
    }
    if ((c->kv_lora_rank + c->rope_dim) % 4) {
        snprintf(errbuf, errlen, "%s: kv_lora_rank + rope dimension %u is not a multiple of 4 "
                 "(the pool stores each latent row as two even halves)", arch,
                 c->kv_lora_rank + c->rope_dim);
        return TY_ENOTSUP;
    }
    c->n_kv_heads = 1; /* the pool's K and V chunks hold a latent row's two halves (mla.c) */
    c->head_dim = (c->kv_lora_rank + c->rope_dim) / 2;
    return 0;
}

static int read_hparams(struct ty_model *m, char *errbuf, size_t errlen)
{
    const char *a;
    uint64_t alen;
    char arch[32];
    struct ty_model_config *c = &m->cfg;
    if (!ty_gguf_get_str(m->gguf, "general.architecture", &a, &alen)) {
        snprintf(errbuf, errlen, "missing general.architecture");
        return TY_EFORMAT;
    }
    const struct ty__arch *ai = ty__model_arch_find(a, alen);
    if (!ai) {
        snprintf(errbuf, errlen, "unsupported architecture '%.*s' (%s)",
                 (int)(alen > 64 ? 64 : alen), a, ty__model_arch_list());
        return TY_ENOTSUP;
    }
    memcpy(arch, a, alen); /* a table name: shorter than arch */
    arch[alen] = 0;
    c->arch = ai->arch;
    c->rope = ai->rope;
    c->qkv_bias = ai->qkv_bias;
    c->qk_norm = ai->qk_norm;
    if (!key_u32(m->gguf, arch, "embedding_length", &c->dim) ||
        !key_u32(m->gguf, arch, "block_count", &c->n_layers) ||
        !key_u32(m->gguf, arch, "attention.head_count", &c->n_heads) ||
        (!key_u32(m->gguf, arch, "feed_forward_length", &c->ffn_dim) &&
         !key_u32(m->gguf, arch, "expert_feed_forward_length", &c->ffn_dim))) {
        snprintf(errbuf, errlen, "missing %s.{embedding_length,block_count,attention.head_count,"
                                 "feed_forward_length}", arch);
        return TY_EFORMAT;
    }
    int rc = read_experts(m, ai, arch, errbuf, errlen);
    if (rc)
        return rc;
    if (!key_u32(m->gguf, arch, "attention.head_count_kv", &c->n_kv_heads))
        c->n_kv_heads = c->n_heads;
    if (!key_u32(m->gguf, arch, "attention.key_length", &c->head_dim))
        c->head_dim = c->n_heads ? c->dim / c->n_heads : 0;
    if (ai->arch == TY_MODEL_ARCH_DEEPSEEK2 && (rc = read_mla(m, arch, errbuf, errlen)))
        return rc;
    if (!key_u32(m->gguf, arch, "context_length", &c->ctx_len))
        c->ctx_len = 2048;
    if (!key_f32(m->gguf, arch, "attention.layer_norm_rms_epsilon", &c->rms_eps))
        c->rms_eps = 1e-5f;
    /* the key llama.cpp's converters write (LLM_KV_ATTENTION_SLIDING_WINDOW); every layer */
    if (!key_u32(m->gguf, arch, "attention.sliding_window", &m->swa_window))
        m->swa_window = 0;
    if (!key_f32(m->gguf, arch, "rope.freq_base", &c->rope_theta))
        c->rope_theta = 10000.0f;
    const struct ty_gguf_tensor *emb = ty_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!key_u32(m->gguf, arch, "vocab_size", &c->n_vocab))
        c->n_vocab = emb ? (uint32_t)emb->ne[1] : 0;
    if (ai->arch == TY_MODEL_ARCH_GPTOSS && (rc = gptoss_params(m, arch, errbuf, errlen)))
        return rc;
    return read_rope_scaling(m, arch, errbuf, errlen);
}

static void read_eog_and_template(struct ty_model *m)
{
    static const char *keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                 "tokenizer.ggml.eom_token_id"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        uint32_t v;
        if (ty_gguf_get_u32(m->gguf, keys[i], &v))
            ty__model_add_eog(m, v);
    }
    const char *s;
    uint64_t len;
    if (ty_gguf_get_str(m->gguf, "tokenizer.chat_template", &s, &len) && len < (1u << 24))
        m->chat_template = strndup(s, len);
}

int ty__model_load_gguf(struct ty_model *m, const char *path, char *errbuf, size_t errlen)
{
    int rc = ty_gguf_open(&m->gguf, path, errbuf, errlen);
    if (rc)
        return rc;
    if ((rc = read_hparams(m, errbuf, errlen)))
        return rc;
    if (m->cfg.n_layers == 0 || m->cfg.n_layers > 512) {
        snprintf(errbuf, errlen, "absurd block_count %u", m->cfg.n_layers);
        return TY_EFORMAT;
    }
    m->layers = calloc(m->cfg.n_layers, sizeof(*m->layers));
    if (!m->layers)
        return TY_ENOMEM;
    if (m->cfg.n_experts > TY_MODEL_MAX_EXPERTS) {
        snprintf(errbuf, errlen, "unsupported mixture of experts: %u experts (at most %u)",
                 m->cfg.n_experts, TY_MODEL_MAX_EXPERTS);
        return TY_ENOTSUP;
    }
    if (m->cfg.n_experts && (rc = ty__model_alloc_experts(m)))
        return rc;
    if ((rc = get_w(m->gguf, &m->tok_embd, "token_embd.weight", errbuf, errlen)) ||
        (rc = get_w(m->gguf, &m->out_norm, "output_norm.weight", errbuf, errlen)) ||
        (rc = get_w(m->gguf, &m->output, "output.weight", errbuf, errlen)))
        return rc;
    if (!m->output.data) {
        m->output = m->tok_embd;
        m->cfg.tied_output = true;
    }
    for (uint32_t l = 0; l < m->cfg.n_layers; l++)
        if ((rc = load_layer(m, l, errbuf, errlen)))
            return rc;
    read_eog_and_template(m);
#ifdef TY_HAVE_TOKENIZER
    /* The tokenizer library maps tokenizer.ggml.* to its spec (llama.cpp's defaults), so
     * `tycho tokenize` and generation read a GGUF file identically. */
    const char *tm;
    uint64_t tl;
    if (ty_gguf_get_str(m->gguf, "tokenizer.ggml.model", &tm, &tl) &&
        (rc = ty_tokenizer_new_from_gguf(&m->tok, m->gguf, errbuf, errlen)))
        return rc;
    if (m->tok && ty_tokenizer_n_vocab(m->tok) > m->cfg.n_vocab) {
        snprintf(errbuf, errlen, "tokenizer has %u tokens, the model only %u",
                 ty_tokenizer_n_vocab(m->tok), m->cfg.n_vocab);
        return TY_EFORMAT;
    }
#endif
    return 0;
}
