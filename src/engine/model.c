/* Model loading front: picks the loader by path kind, validates the configuration and every
 * weight's shape against it, and computes the rope frequency table. */
#include "model-impl.h"

#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/tokenizer.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define LW(m) offsetof(struct ty_layer_weights, m)
const struct ty__layer_tensor ty__layer_tensors[] = {
    {"attn_norm.weight", "input_layernorm.weight", LW(attn_norm)},
    {"attn_q.weight", "self_attn.q_proj.weight", LW(wq)},
    {"attn_k.weight", "self_attn.k_proj.weight", LW(wk)},
    {"attn_v.weight", "self_attn.v_proj.weight", LW(wv)},
    {"attn_output.weight", "self_attn.o_proj.weight", LW(wo)},
    {"attn_q.bias", "self_attn.q_proj.bias", LW(bq)},
    {"attn_k.bias", "self_attn.k_proj.bias", LW(bk)},
    {"attn_v.bias", "self_attn.v_proj.bias", LW(bv)},
    {"attn_q_norm.weight", "self_attn.q_norm.weight", LW(q_norm)},
    {"attn_k_norm.weight", "self_attn.k_norm.weight", LW(k_norm)},
    {"ffn_norm.weight", "post_attention_layernorm.weight", LW(ffn_norm)},
    {"ffn_gate.weight", "mlp.gate_proj.weight", LW(w_gate)},
    {"ffn_up.weight", "mlp.up_proj.weight", LW(w_up)},
    {"ffn_down.weight", "mlp.down_proj.weight", LW(w_down)},
    {"ffn_gate_inp.weight", NULL, LW(router)}, /* HF: the architecture's hf_router */
    /* gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE); its pre-FFN norm and the experts' biases are
     * the GGUF loader's own (load_gptoss) */
    {"attn_output.bias", "self_attn.o_proj.bias", LW(bo)},
    {"attn_sinks.weight", "self_attn.sinks", LW(sinks)},
    {"ffn_gate_inp.bias", NULL, LW(router_b)},
    /* DeepSeek-V2/V3: GGUF's 3-D attn_k_b/attn_v_b are the GGUF loader's own; HF keeps
     * kv_b_proj whole (no GGUF name: llama.cpp's converter splits it) */
    {"attn_q_a.weight", "self_attn.q_a_proj.weight", LW(wq_a)},
    {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", LW(q_a_norm)},
    {"attn_q_b.weight", "self_attn.q_b_proj.weight", LW(wq_b)},
    {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight", LW(wkv_a)},
    {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", LW(kv_a_norm)},
    {NULL, "self_attn.kv_b_proj.weight", LW(wkv_b)},
    {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias", LW(exp_probs_b)},
    {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight", LW(sh_gate)},
    {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight", LW(sh_up)},
    {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight", LW(sh_down)},
};
#undef LW
const size_t ty__n_layer_tensors = sizeof(ty__layer_tensors) / sizeof(ty__layer_tensors[0]);

/* llama.cpp's rope type per architecture (llama_model_rope_type): NORM for the Llama family,
 * NEOX for Qwen2 and Qwen3, whose converters keep HF's rotate_half row order. qwen3moe is
 * llama.cpp's GGUF name, qwen3_moe and mixtral transformers' model_type (Mixtral's GGUF is
 * llama with experts). */
#define QWEN3MOE_HF "mlp.gate.weight", \
    {"mlp.experts.%u.gate_proj.weight", "mlp.experts.%u.up_proj.weight", \
     "mlp.experts.%u.down_proj.weight"}
#define MIXTRAL_HF "block_sparse_moe.gate.weight", \
    {"block_sparse_moe.experts.%u.w1.weight", "block_sparse_moe.experts.%u.w3.weight", \
     "block_sparse_moe.experts.%u.w2.weight"}
static const struct ty__arch arches[] = {
    {"llama", TY_MODEL_ARCH_LLAMA, TY_ROPE_NORM, false, false, false, NULL, {NULL}},
    {"mistral", TY_MODEL_ARCH_LLAMA, TY_ROPE_NORM, false, false, false, NULL, {NULL}},
    {"qwen2", TY_MODEL_ARCH_QWEN2, TY_ROPE_NEOX, true, false, false, NULL, {NULL}},
    {"qwen3", TY_MODEL_ARCH_QWEN3, TY_ROPE_NEOX, false, true, false, NULL, {NULL}},
    {"qwen3moe", TY_MODEL_ARCH_QWEN3MOE, TY_ROPE_NEOX, false, true, true, QWEN3MOE_HF},
    {"qwen3_moe", TY_MODEL_ARCH_QWEN3MOE, TY_ROPE_NEOX, false, true, true, QWEN3MOE_HF},
    {"mixtral", TY_MODEL_ARCH_LLAMA, TY_ROPE_NORM, false, false, true, MIXTRAL_HF},
    /* llama.cpp's LLM_ARCH_OPENAI_MOE (NEOX rope), transformers' gpt_oss (its experts are
     * model_hf.c's own) */
    {"gpt-oss", TY_MODEL_ARCH_GPTOSS, TY_ROPE_NEOX, true, false, true, NULL, {NULL}},
    {"gpt_oss", TY_MODEL_ARCH_GPTOSS, TY_ROPE_NEOX, true, false, true, NULL, {NULL}},
    /* llama.cpp's deepseek2: NORM rope on the rope part only (llama_model_rope_type) */
    {"deepseek2", TY_MODEL_ARCH_DEEPSEEK2, TY_ROPE_NORM, false, false, true, NULL, {NULL}},
    {"deepseek_v3", TY_MODEL_ARCH_DEEPSEEK2, TY_ROPE_NORM, false, false, true, QWEN3MOE_HF},
};
#undef QWEN3MOE_HF
#undef MIXTRAL_HF

const struct ty__arch *ty__model_arch_find(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof(arches) / sizeof(arches[0]); i++)
        if (strlen(arches[i].name) == len && memcmp(arches[i].name, name, len) == 0)
            return &arches[i];
    return NULL;
}

const char *ty__model_arch_list(void)
{
    return "llama (with or without experts), mistral, mixtral, qwen2, qwen3, qwen3moe, "
           "qwen3_moe, gpt-oss, gpt_oss, deepseek2, deepseek_v3";
}

int ty__model_alloc_experts(struct ty_model *m)
{
    uint32_t E = m->cfg.n_experts;
    m->experts = calloc((size_t)m->cfg.n_layers * 3 * E, sizeof(*m->experts));
    if (!m->experts)
        return TY_ENOMEM;
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        struct ty_weight *w = m->experts + (size_t)l * 3 * E;
        m->layers[l].exp_gate = w;
        m->layers[l].exp_up = w + E;
        m->layers[l].exp_down = w + 2 * E;
    }
    return 0;
}

static const char *arch_name(enum ty_model_arch a)
{
    for (size_t i = 0; i < sizeof(arches) / sizeof(arches[0]); i++)
        if (arches[i].arch == a)
            return arches[i].name;
    return "?";
}

#define MAX_DIM (1u << 16)
#define MAX_LAYERS 512u
#define MAX_VOCAB (1u << 20)

static int check_w(const struct ty_weight *w, const char *what, uint32_t layer, uint64_t rows,
                   uint64_t cols, bool optional, char *errbuf, size_t errlen)
{
    if (!w->data) {
        if (optional)
            return 0;
        snprintf(errbuf, errlen, "missing tensor: %s of layer %u", what, layer);
        return TY_EFORMAT;
    }
    if (w->rows != rows || w->cols != cols) {
        snprintf(errbuf, errlen, "tensor %s (layer %u) has shape [%llu, %llu], expected [%llu, %llu]",
                 what, layer, (unsigned long long)w->rows, (unsigned long long)w->cols,
                 (unsigned long long)rows, (unsigned long long)cols);
        return TY_EFORMAT;
    }
    return 0;
}

static int check_config(const struct ty_model_config *c, char *errbuf, size_t errlen)
{
    if (c->dim == 0 || c->dim > MAX_DIM || c->n_layers == 0 || c->n_layers > MAX_LAYERS ||
        c->n_heads == 0 || c->n_heads > c->dim || c->n_kv_heads == 0 ||
        c->n_heads % c->n_kv_heads || c->head_dim == 0 || c->head_dim % 2 ||
        c->head_dim > 1024 || c->ffn_dim == 0 || c->ffn_dim > 8 * MAX_DIM || c->n_vocab == 0 ||
        c->n_vocab > MAX_VOCAB) {
        snprintf(errbuf, errlen,
                 "invalid model dimensions: dim %u layers %u heads %u kv_heads %u head_dim %u "
                 "ffn %u vocab %u",
                 c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim,
                 c->n_vocab);
        return TY_EFORMAT;
    }
    if (c->n_experts > TY_MODEL_MAX_EXPERTS ||
        (c->n_experts && (c->n_experts_used == 0 || c->n_experts_used > c->n_experts ||
                          c->n_experts_used > TY_MODEL_MAX_EXPERTS_USED))) {
        snprintf(errbuf, errlen, "unsupported mixture of experts: %u experts, %u used per token "
                 "(at most %u experts and %u used)", c->n_experts, c->n_experts_used,
                 TY_MODEL_MAX_EXPERTS, TY_MODEL_MAX_EXPERTS_USED);
        return TY_ENOTSUP;
    }
    if (!(c->rms_eps > 0 && c->rms_eps < 1) || !(c->rope_theta > 0) || !isfinite(c->rope_theta)) {
        snprintf(errbuf, errlen, "invalid rms_eps %g or rope_theta %g", c->rms_eps,
                 c->rope_theta);
        return TY_EFORMAT;
    }
    return 0;
}

static int check_experts(const struct ty_model *m, uint32_t l, char *errbuf, size_t errlen);

/* A dense FFN, or (n_experts > 0) the router and every expert, and not the other kind. */
/* A SwiGLU FFN of `width`: gate and up (width, dim), down (dim, width), named ffn_gate<sfx>,
 * ffn_up<sfx>, ffn_down<sfx>. */
static int check_swiglu(const struct ty_weight *gate, const struct ty_weight *up,
                        const struct ty_weight *down, const char *sfx, uint32_t l, uint64_t width,
                        uint64_t dim, char *errbuf, size_t errlen)
{
    char g[32], u[32], d[32];
    snprintf(g, sizeof(g), "ffn_gate%s", sfx);
    snprintf(u, sizeof(u), "ffn_up%s", sfx);
    snprintf(d, sizeof(d), "ffn_down%s", sfx);
    int rc;
    if ((rc = check_w(gate, g, l, width, dim, false, errbuf, errlen)) ||
        (rc = check_w(up, u, l, width, dim, false, errbuf, errlen)))
        return rc;
    return check_w(down, d, l, dim, width, false, errbuf, errlen);
}

/* Norms and biases (each absent or F32): the forward pass reads them as f32. */
static int check_f32(const struct ty_weight *const *w, size_t n, uint32_t l, char *errbuf,
                     size_t errlen)
{
    for (size_t i = 0; i < n; i++)
        if (w[i]->data && w[i]->type != TY_GGML_F32) {
            snprintf(errbuf, errlen, "layer %u: norm and bias tensors must be F32 (got %s)", l,
                     ty_ggml_type_name(w[i]->type));
            return TY_ENOTSUP;
        }
    return 0;
}

static int check_ffn(const struct ty_model *m, uint32_t l, char *errbuf, size_t errlen)
{
    const struct ty_model_config *c = &m->cfg;
    const struct ty_layer_weights *L = &m->layers[l];
    if (!c->n_experts) {
        if (L->router.data) {
            snprintf(errbuf, errlen, "layer %u: an expert router (ffn_gate_inp) in a model "
                     "without expert_count", l);
            return TY_EFORMAT;
        }
        return check_swiglu(&L->w_gate, &L->w_up, &L->w_down, "", l, c->ffn_dim, c->dim, errbuf,
                            errlen);
    }
    if (L->w_gate.data || L->w_up.data || L->w_down.data) {
        snprintf(errbuf, errlen, "layer %u: a dense FFN in a mixture-of-experts model (dense "
                 "layers among expert layers are not supported)", l);
        return TY_ENOTSUP;
    }
    return check_experts(m, l, errbuf, errlen);
}

/* The router and every expert's matrices of layer l. */
static int check_experts(const struct ty_model *m, uint32_t l, char *errbuf, size_t errlen)
{
    const struct ty_model_config *c = &m->cfg;
    const struct ty_layer_weights *L = &m->layers[l];
    int rc;
    if ((rc = check_w(&L->router, "ffn_gate_inp (expert router)", l, c->n_experts, c->dim,
                      false, errbuf, errlen)))
        return rc;
    for (uint32_t e = 0; e < c->n_experts; e++) {
        char what[3][48];
        snprintf(what[0], sizeof(what[0]), "ffn_gate of expert %u", e);
        snprintf(what[1], sizeof(what[1]), "ffn_up of expert %u", e);
        snprintf(what[2], sizeof(what[2]), "ffn_down of expert %u", e);
        if ((rc = check_w(&L->exp_gate[e], what[0], l, c->ffn_dim, c->dim, false, errbuf,
                          errlen)) ||
            (rc = check_w(&L->exp_up[e], what[1], l, c->ffn_dim, c->dim, false, errbuf, errlen)) ||
            (rc = check_w(&L->exp_down[e], what[2], l, c->dim, c->ffn_dim, false, errbuf, errlen)))
            return rc;
    }
    return 0;
}

/* gpt-oss's own tensors: required in a gpt-oss model (a file without them computes another
 * model), refused elsewhere (the forward pass would apply them to an architecture that has
 * none). */
static int check_gptoss(const struct ty_model *m, uint32_t l, char *errbuf, size_t errlen)
{
    const struct ty_model_config *c = &m->cfg;
    const struct ty_layer_weights *L = &m->layers[l];
    bool need = c->arch == TY_MODEL_ARCH_GPTOSS;
    int rc;
    if (!need) {
        if (L->sinks.data || L->bo.data || L->router_b.data || L->exp_b_gate.data ||
            L->exp_b_up.data || L->exp_b_down.data) {
            snprintf(errbuf, errlen, "layer %u: attention sinks, an attention output bias or "
                     "expert biases in a %s model, which has none", l, arch_name(c->arch));
            return TY_ENOTSUP;
        }
        return 0;
    }
    if ((rc = check_w(&L->bo, "attn_output.bias", l, 1, c->dim, false, errbuf, errlen)) ||
        (rc = check_w(&L->sinks, "attn_sinks (attention sinks)", l, 1, c->n_heads, false, errbuf,
                      errlen)) ||
        (rc = check_w(&L->router_b, "ffn_gate_inp.bias", l, 1, c->n_experts, false, errbuf,
                      errlen)) ||
        (rc = check_w(&L->exp_b_gate, "ffn_gate_exps.bias", l, c->n_experts, c->ffn_dim, false,
                      errbuf, errlen)) ||
        (rc = check_w(&L->exp_b_up, "ffn_up_exps.bias", l, c->n_experts, c->ffn_dim, false,
                      errbuf, errlen)))
        return rc;
    return check_w(&L->exp_b_down, "ffn_down_exps.bias", l, c->n_experts, c->dim, false, errbuf,
                   errlen);
}

/* DeepSeek-V2/V3's FFN: a dense one in the first n_dense_lead layers (dense_ffn_dim), else
 * the routed experts (with an optional selection bias) and the shared expert. */
static int check_ffn_deepseek(const struct ty_model *m, uint32_t l, char *errbuf, size_t errlen)
{
    const struct ty_model_config *c = &m->cfg;
    const struct ty_layer_weights *L = &m->layers[l];
    int rc;
    if (l < c->n_dense_lead)
        return check_swiglu(&L->w_gate, &L->w_up, &L->w_down, "", l, c->dense_ffn_dim, c->dim,
                            errbuf, errlen);
    if (L->w_gate.data || L->w_up.data || L->w_down.data) {
        snprintf(errbuf, errlen, "layer %u: a dense FFN after the %u leading dense layers "
                 "(leading_dense_block_count)", l, c->n_dense_lead);
        return TY_EFORMAT;
    }
    if ((rc = check_experts(m, l, errbuf, errlen)) ||
        (rc = check_w(&L->exp_probs_b, "exp_probs_b", l, 1, c->n_experts, true, errbuf,
                      errlen)))
        return rc;
    if (!c->shared_ffn_dim)
        return 0;
    return check_swiglu(&L->sh_gate, &L->sh_up, &L->sh_down, "_shexp", l, c->shared_ffn_dim,
                        c->dim, errbuf, errlen);
}

/* Multi-head latent attention's tensors (cfg.kv_lora_rank > 0), GGUF names. */
static int check_layer_mla(const struct ty_model *m, uint32_t l, char *errbuf, size_t errlen)
{
    const struct ty_model_config *c = &m->cfg;
    const struct ty_layer_weights *L = &m->layers[l];
    uint64_t H = c->n_heads, qk = c->qk_nope_dim + c->rope_dim, R = c->kv_lora_rank;
    int rc;
    if (c->q_lora_rank) {
        if ((rc = check_w(&L->wq_a, "attn_q_a", l, c->q_lora_rank, c->dim, false, errbuf,
                          errlen)) ||
            (rc = check_w(&L->q_a_norm, "attn_q_a_norm", l, 1, c->q_lora_rank, false, errbuf,
                          errlen)) ||
            (rc = check_w(&L->wq_b, "attn_q_b", l, H * qk, c->q_lora_rank, false, errbuf,
                          errlen)))
            return rc;
    } else if ((rc = check_w(&L->wq, "attn_q", l, H * qk, c->dim, false, errbuf, errlen))) {
        return rc;
    }
    if ((rc = check_w(&L->attn_norm, "attn_norm", l, 1, c->dim, false, errbuf, errlen)) ||
        (rc = check_w(&L->wkv_a, "attn_kv_a_mqa", l, R + c->rope_dim, c->dim, false, errbuf,
                      errlen)) ||
        (rc = check_w(&L->kv_a_norm, "attn_kv_a_norm", l, 1, R, false, errbuf, errlen)) ||
        (rc = check_w(&L->wk_b, "attn_k_b", l, H * R, c->qk_nope_dim, L->wkv_b.data != NULL,
                      errbuf, errlen)) ||
        (rc = check_w(&L->wv_b, "attn_v_b", l, H * c->v_head_dim, R, L->wkv_b.data != NULL,
                      errbuf, errlen)) ||
        (rc = check_w(&L->wkv_b, "kv_b_proj", l, H * (c->qk_nope_dim + c->v_head_dim), R, true,
                      errbuf, errlen)) ||
        (rc = check_w(&L->wo, "attn_output", l, c->dim, H * c->v_head_dim, false, errbuf,
                      errlen)) ||
        (rc = check_w(&L->ffn_norm, "ffn_norm", l, 1, c->dim, false, errbuf, errlen)) ||
        (rc = check_ffn_deepseek(m, l, errbuf, errlen)))
        return rc;
    if (L->wk.data || L->wv.data || L->bq.data || L->q_norm.data) {
        snprintf(errbuf, errlen, "layer %u: attn_k/attn_v/bias/q-norm tensors in a deepseek2 "
                 "(MLA) model", l);
        return TY_EFORMAT;
    }
    const struct ty_weight *norms[] = {&L->attn_norm, &L->ffn_norm, &L->q_a_norm,
                                       &L->kv_a_norm, &L->exp_probs_b};
    return check_f32(norms, sizeof(norms) / sizeof(norms[0]), l, errbuf, errlen);
}

static int check_layer(const struct ty_model *m, uint32_t l, char *errbuf, size_t errlen)
{
    const struct ty_model_config *c = &m->cfg;
    const struct ty_layer_weights *L = &m->layers[l];
    uint64_t q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim;
    int rc;
    if (c->kv_lora_rank)
        return check_layer_mla(m, l, errbuf, errlen);
    if (L->wkv_a.data || L->wq_a.data || L->sh_gate.data || L->exp_probs_b.data) {
        snprintf(errbuf, errlen, "layer %u: MLA, shared-expert or expert-bias tensors in a %s "
                 "model, which has none", l, arch_name(c->arch));
        return TY_EFORMAT;
    }
    if ((rc = check_w(&L->attn_norm, "attn_norm", l, 1, c->dim, false, errbuf, errlen)) ||
        (rc = check_w(&L->wq, "attn_q", l, q, c->dim, false, errbuf, errlen)) ||
        (rc = check_w(&L->wk, "attn_k", l, kv, c->dim, false, errbuf, errlen)) ||
        (rc = check_w(&L->wv, "attn_v", l, kv, c->dim, false, errbuf, errlen)) ||
        (rc = check_w(&L->wo, "attn_output", l, c->dim, q, false, errbuf, errlen)) ||
        (rc = check_w(&L->ffn_norm, "ffn_norm", l, 1, c->dim, false, errbuf, errlen)) ||
        (rc = check_ffn(m, l, errbuf, errlen)))
        return rc;
    bool need_bias = c->qkv_bias;
    if ((rc = check_w(&L->bq, "attn_q.bias", l, 1, q, !need_bias, errbuf, errlen)) ||
        (rc = check_w(&L->bk, "attn_k.bias", l, 1, kv, !need_bias, errbuf, errlen)) ||
        (rc = check_w(&L->bv, "attn_v.bias", l, 1, kv, !need_bias, errbuf, errlen)))
        return rc;
    /* A q/k norm in a file whose architecture has none would be ignored by the forward pass,
     * computing another model than the file's: refused. */
    if (c->qk_norm) {
        if ((rc = check_w(&L->q_norm, "attn_q_norm", l, 1, c->head_dim, false, errbuf, errlen)) ||
            (rc = check_w(&L->k_norm, "attn_k_norm", l, 1, c->head_dim, false, errbuf, errlen)))
            return rc;
    } else if (L->q_norm.data || L->k_norm.data) {
        snprintf(errbuf, errlen, "layer %u: q/k norm tensors in a %s model, which has none", l,
                 arch_name(c->arch));
        return TY_EFORMAT;
    }
    if ((rc = check_gptoss(m, l, errbuf, errlen)))
        return rc;
    const struct ty_weight *norms[] = {&L->attn_norm, &L->ffn_norm, &L->bq, &L->bk, &L->bv,
                                       &L->q_norm, &L->k_norm, &L->bo, &L->sinks, &L->router_b,
                                       &L->exp_b_gate, &L->exp_b_up, &L->exp_b_down};
    return check_f32(norms, sizeof(norms) / sizeof(norms[0]), l, errbuf, errlen);
}

/* YaRN's per-pair mix and magnitude, in ggml's float arithmetic (ggml_rope_yarn_corr_dims,
 * rope_yarn_ramp with ext_factor 1, and llama.cpp's yarn_attn_factor: get_mscale(factor, 1),
 * its cancel 1 / (1 + 0.1 ln factor), times rope.scaling.attn_factor, then rope_yarn's own
 * 1 + 0.1 ln(1 / freq_scale)). Pairs below the fast corner keep their frequency (mix 1), those
 * above the slow one are interpolated by 1 / factor (mix 0), a linear ramp between. */
static int make_yarn(struct ty_model *m)
{
    uint32_t half = m->cfg.rope_dim / 2;
    float n_dims = (float)m->cfg.rope_dim, base = m->cfg.rope_theta, orig = (float)m->rope_orig_ctx;
    float fast = m->rope_beta_fast > 0 ? m->rope_beta_fast : 32.0f;
    float slow = m->rope_beta_slow > 0 ? m->rope_beta_slow : 1.0f;
    float start = floorf(n_dims * logf(orig / (fast * 2 * (float)M_PI)) / (2 * logf(base)));
    float end = ceilf(n_dims * logf(orig / (slow * 2 * (float)M_PI)) / (2 * logf(base)));
    float lo = start > 0 ? start : 0, hi = end < n_dims - 1 ? end : n_dims - 1;
    m->rope_mix = malloc(half * sizeof(float));
    if (!m->rope_mix)
        return TY_ENOMEM;
    for (uint32_t i = 0; i < half; i++) {
        float y = ((float)i - lo) / (hi - lo > 0.001f ? hi - lo : 0.001f);
        m->rope_mix[i] = 1 - (y < 0 ? 0 : y > 1 ? 1 : y);
    }
    float f = m->rope_factor;
    m->rope_freq_scale = 1.0f / f;
    if (m->rope_attention_factor > 0) {
        m->rope_mscale = m->rope_attention_factor;
    } else {
        float a = f <= 1.0f ? 1.0f : 0.1f * logf(f) + 1.0f;
        float L = m->rope_yarn_log_mul;
        if (L != 0) { /* llama.cpp's yarn_attn_factor: mscale assumed L for V2, else 1 */
            float ms = L != 1.0f ? L : 1.0f;
            a = (f <= 1.0f ? 1.0f : 0.1f * ms * logf(f) + 1.0f) /
                (f <= 1.0f ? 1.0f : 0.1f * L * logf(f) + 1.0f);
        }
        a *= 1.0f / (1.0f + 0.1f * logf(f));
        a *= m->rope_attn_factor > 0 ? m->rope_attn_factor : 1.0f;
        m->rope_mscale = a * (1.0f + 0.1f * logf(1.0f / m->rope_freq_scale));
    }
    return 0;
}

/* Rope frequency divisors per pair i. llama3 scaling as in Meta's reference (apply_scaling
 * in llama/model.py) and HF's _compute_llama3_parameters: long wavelengths are divided by
 * `factor`, short ones kept, the band between interpolated. */
static int make_rope(struct ty_model *m)
{
    uint32_t half = m->cfg.rope_dim / 2;
    m->rope_theta_scale = powf(m->cfg.rope_theta, -2.0f / (float)m->cfg.rope_dim);
    m->rope_div = malloc(half * sizeof(float));
    if (!m->rope_div)
        return TY_ENOMEM;
    for (uint32_t i = 0; i < half; i++) {
        double f = pow((double)m->cfg.rope_theta, -2.0 * i / m->cfg.rope_dim), nf = f;
        if (m->rope_freqs) {
            m->rope_div[i] = m->rope_freqs[i];
            continue;
        }
        if (m->rope_scaling == 1) {
            nf = f / m->rope_factor;
        } else if (m->rope_scaling == 2) {
            double lo_wl = m->rope_orig_ctx / m->rope_low_freq;
            double hi_wl = m->rope_orig_ctx / m->rope_high_freq;
            double wl = 2 * M_PI / f;
            if (wl > lo_wl) {
                nf = f / m->rope_factor;
            } else if (wl >= hi_wl) {
                double s = (m->rope_orig_ctx / wl - m->rope_low_freq) /
                           (m->rope_high_freq - m->rope_low_freq);
                nf = (1 - s) * f / m->rope_factor + s * f;
            }
        }
        m->rope_div[i] = (float)(f / nf);
    }
    return m->rope_scaling == 3 ? make_yarn(m) : 0;
}

/* Each layer's window from the loader's description (swa_first_layer on, or gpt-oss's
 * swa_period pattern); kv_window = the widest window when every layer slides (a window of at
 * least the context is no window). */
static void set_windows(struct ty_model *m)
{
    struct ty_model_config *c = &m->cfg;
    uint32_t w = m->swa_window < c->ctx_len || !c->ctx_len ? m->swa_window : 0;
    uint32_t p = m->swa_period;
    bool all = true;
    c->sliding_window = c->kv_window = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        bool slides = p ? l % p < p - 1 : l >= m->swa_first_layer;
        m->layers[l].window = slides ? w : 0;
        all = all && slides;
        c->sliding_window = m->layers[l].window ? w : c->sliding_window;
    }
    if (all)
        c->kv_window = c->sliding_window; /* every layer slides */
}

int ty__model_finish(struct ty_model *m, char *errbuf, size_t errlen)
{
    struct ty_model_config *c = &m->cfg;
    int rc;
    if (!c->rope_dim)
        c->rope_dim = c->head_dim; /* rope over whole heads (all but MLA) */
    if ((rc = check_config(c, errbuf, errlen)))
        return rc;
    if ((rc = check_w(&m->tok_embd, "token_embd", 0, c->n_vocab, c->dim, false, errbuf, errlen)) ||
        (rc = check_w(&m->out_norm, "output_norm", 0, 1, c->dim, false, errbuf, errlen)) ||
        (rc = check_w(&m->output, "output", 0, c->n_vocab, c->dim, false, errbuf, errlen)))
        return rc;
    if (m->out_norm.type != TY_GGML_F32) {
        snprintf(errbuf, errlen, "output_norm must be F32");
        return TY_ENOTSUP;
    }
    for (uint32_t l = 0; l < c->n_layers; l++)
        if ((rc = check_layer(m, l, errbuf, errlen)))
            return rc;
    if (m->rope_scaling == 2 && !(m->rope_factor > 0 && m->rope_low_freq > 0 &&
                                  m->rope_high_freq > m->rope_low_freq && m->rope_orig_ctx > 0)) {
        snprintf(errbuf, errlen, "invalid llama3 rope scaling parameters");
        return TY_EFORMAT;
    }
    if (m->rope_scaling == 1 && !(m->rope_factor > 0)) {
        snprintf(errbuf, errlen, "invalid linear rope scaling factor");
        return TY_EFORMAT;
    }
    if (m->rope_scaling == 3 &&
        !(m->rope_factor >= 1 && m->rope_factor <= 1024 && m->rope_orig_ctx >= 1 &&
          m->rope_beta_fast >= 0 && m->rope_beta_slow >= 0 && m->rope_attn_factor >= 0 &&
          m->rope_attention_factor >= 0 && isfinite(m->rope_attention_factor))) {
        snprintf(errbuf, errlen, "invalid yarn rope scaling: factor %g (1 to 1024), original "
                 "context %u", m->rope_factor, m->rope_orig_ctx);
        return TY_EFORMAT;
    }
    uint32_t G = c->n_expert_groups;
    if (G > 1 && (c->n_experts % G || !c->n_group_used || c->n_group_used > G ||
                  c->n_experts_used > c->n_group_used * (c->n_experts / G))) {
        snprintf(errbuf, errlen, "invalid expert groups: %u experts in %u groups, %u groups "
                 "kept, %u experts used", c->n_experts, G, c->n_group_used, c->n_experts_used);
        return TY_EFORMAT;
    }
    if (c->kv_lora_rank && m->rope_scaling && m->rope_scaling != 3) {
        snprintf(errbuf, errlen, "%s rope scaling in a deepseek2 (MLA) model is not supported "
                 "(only yarn)", m->rope_scaling == 1 ? "linear" : "llama3");
        return TY_ENOTSUP;
    }
    if ((rc = make_rope(m)))
        return rc;
    if (c->kv_lora_rank && m->rope_scaling == 3) {
        /* llama.cpp's deepseek2 graph: the cos/sin scale (attn_factor_org) times
         * 1 + 0.1 mscale_all_dim ln(factor), squared, pre-scales the scores */
        float ms = m->rope_mscale *
                   (1.0f + 0.1f * m->rope_yarn_log_mul * logf(1.0f / m->rope_freq_scale));
        c->kq_scale = ms * ms / sqrtf((float)(c->qk_nope_dim + c->rope_dim));
    }
    set_windows(m);
    if (c->kv_lora_rank && c->sliding_window) { /* mla.c attends to every position */
        snprintf(errbuf, errlen, "sliding-window attention in a deepseek2 (MLA) model is not "
                 "supported");
        return TY_ENOTSUP;
    }
    c->weight_type = c->kv_lora_rank ? m->layers[0].wkv_a.type : m->layers[0].wq.type;
    char swa[24] = "", moe[24] = "";
    if (c->sliding_window)
        snprintf(swa, sizeof(swa), " swa%u", c->sliding_window);
    if (c->n_experts)
        snprintf(moe, sizeof(moe), " e%u/%u", c->n_experts_used, c->n_experts);
    snprintf(m->desc, sizeof(m->desc), "%s %uL d%u h%u/%u hd%u ff%u%s v%u %s%s%s",
             arch_name(c->arch), c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim,
             c->ffn_dim, moe, c->n_vocab, ty_ggml_type_name(c->weight_type),
             c->tied_output ? " tied" : "", swa);
    return 0;
}

void ty__model_add_eog(struct ty_model *m, int64_t id)
{
    if (id < 0 || id >= (int64_t)m->cfg.n_vocab || m->n_eog >= TY_MODEL_MAX_EOG)
        return;
    for (uint32_t i = 0; i < m->n_eog; i++)
        if (m->eog[i] == (uint32_t)id)
            return;
    m->eog[m->n_eog++] = (uint32_t)id;
}

int ty_model_load(ty_model_t **out, const char *path, char *errbuf, size_t errlen)
{
    struct stat st;
    *out = NULL;
    if (stat(path, &st) != 0) {
        snprintf(errbuf, errlen, "%s: %s", path, strerror(errno));
        return -errno;
    }
    struct ty_model *m = calloc(1, sizeof(*m));
    if (!m)
        return TY_ENOMEM;
    int rc = S_ISDIR(st.st_mode) ? ty__model_load_hf(m, path, errbuf, errlen)
                                 : ty__model_load_gguf(m, path, errbuf, errlen);
    if (!rc)
        rc = ty__model_finish(m, errbuf, errlen);
    if (rc) {
        ty_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void ty_model_free(ty_model_t *m)
{
    if (!m)
        return;
#ifdef TY_HAVE_TOKENIZER
    ty_tokenizer_free(m->tok);
#endif
    free(m->layers);
    free(m->experts);
    free(m->rope_div);
    free(m->rope_mix);
    free(m->chat_template);
    ty_gguf_close(m->gguf);
    for (uint32_t i = 0; i < m->n_maps; i++)
        munmap(m->maps[i].addr, m->maps[i].len);
    free(m);
}

const struct ty_model_config *ty_model_config(const ty_model_t *m)
{
    return &m->cfg;
}

const struct ty_tokenizer *ty_model_tokenizer(const ty_model_t *m)
{
    return m->tok;
}

bool ty_model_is_eog(const ty_model_t *m, uint32_t id)
{
    for (uint32_t i = 0; i < m->n_eog; i++)
        if (m->eog[i] == id)
            return true;
#ifdef TY_HAVE_TOKENIZER
    if (m->tok && id < ty_tokenizer_n_vocab(m->tok))
        return ty_tokenizer_is_eog(m->tok, id);
#endif
    return false;
}

size_t ty_model_eog_list(const ty_model_t *m, uint32_t *out, size_t cap)
{
    size_t n = 0;
    for (uint32_t id = 0; id < m->cfg.n_vocab; id++)
        if (ty_model_is_eog(m, id)) {
            if (n < cap)
                out[n] = id;
            n++;
        }
    return n;
}

const char *ty_model_chat_template(const ty_model_t *m)
{
    return m->chat_template;
}

static uint64_t wbytes(const struct ty_weight *w)
{
    return w->data ? ty_ggml_type_nbytes(w->type, w->rows * w->cols) : 0;
}

uint64_t ty_model_weight_bytes(const ty_model_t *m)
{
    uint64_t b = wbytes(&m->out_norm) + wbytes(&m->output);
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        const struct ty_layer_weights *L = &m->layers[l];
        b += wbytes(&L->attn_norm) + wbytes(&L->wq) + wbytes(&L->wk) + wbytes(&L->wv) +
             wbytes(&L->wo) + wbytes(&L->bq) + wbytes(&L->bk) + wbytes(&L->bv) +
             wbytes(&L->q_norm) + wbytes(&L->k_norm) +
             wbytes(&L->ffn_norm) + wbytes(&L->w_gate) + wbytes(&L->w_up) + wbytes(&L->w_down) +
             wbytes(&L->bo) + wbytes(&L->sinks) + wbytes(&L->router_b);
        b += wbytes(&L->wq_a) + wbytes(&L->q_a_norm) + wbytes(&L->wq_b) + wbytes(&L->wkv_a) +
             wbytes(&L->kv_a_norm) + wbytes(&L->wk_b) + wbytes(&L->wv_b) +
             wbytes(&L->exp_probs_b) + wbytes(&L->sh_gate) + wbytes(&L->sh_up) +
             wbytes(&L->sh_down); /* MLA and DeepSeek's shared expert */
        if (m->cfg.n_experts && L->exp_gate[0].data) /* experts are alike: the first stands
                                                      * for each used one */
            b += wbytes(&L->router) + m->cfg.n_experts_used * (wbytes(&L->exp_gate[0]) +
                                                               wbytes(&L->exp_up[0]) +
                                                               wbytes(&L->exp_down[0]));
    }
    return b;
}

const char *ty_model_desc(const ty_model_t *m)
{
    return m->desc;
}
