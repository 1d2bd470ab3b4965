/* Hugging Face directory loader: config.json (LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM,
 * GptOssForCausalLM with BF16/F16/F32 experts, DeepseekV3ForCausalLM), model.safetensors or
 * model.safetensors.index.json shards, and the
 * tokenizer through ty_tokenizer_load_json(). Safetensors (huggingface/safetensors README):
 * u64 LE header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}},
 * then the data; offsets are relative to the end of the header. */
#include "model-impl.h"

#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/tokenizer.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u << 20)

struct hf_ctx {
    struct ty_model *m;
    json_t *index[TY_MODEL_MAX_MAPS]; /* parsed header of each mapped shard */
    const unsigned char *data[TY_MODEL_MAX_MAPS];
    uint64_t data_len[TY_MODEL_MAX_MAPS];
    char *errbuf;
    size_t errlen;
};

static int map_shard(struct hf_ctx *h, const char *path)
{
    struct stat st;
    uint64_t hlen;
    struct ty_model *m = h->m;
    if (m->n_maps >= TY_MODEL_MAX_MAPS) {
        snprintf(h->errbuf, h->errlen, "too many safetensors shards");
        return TY_EFORMAT;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(h->errbuf, h->errlen, "%s: %s", path, strerror(errno));
        return -errno;
    }
    if (fstat(fd, &st) != 0 || st.st_size < 8) {
        close(fd);
        snprintf(h->errbuf, h->errlen, "%s: truncated safetensors file", path);
        return TY_EFORMAT;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(h->errbuf, h->errlen, "%s: mmap: %s", path, strerror(errno));
        return TY_EIO;
    }
    uint32_t i = m->n_maps++;
    m->maps[i] = (struct ty_mapping){p, (size_t)st.st_size};
    memcpy(&hlen, p, 8);
    if (hlen > ST_MAX_HEADER || hlen > (uint64_t)st.st_size - 8) {
        snprintf(h->errbuf, h->errlen, "%s: safetensors header length %llu out of range", path,
                 (unsigned long long)hlen);
        return TY_EFORMAT;
    }
    json_error_t je;
    h->index[i] = json_loadb((const char *)p + 8, hlen, 0, &je);
    if (!json_is_object(h->index[i])) {
        snprintf(h->errbuf, h->errlen, "%s: bad safetensors header: %s", path, je.text);
        return TY_EFORMAT;
    }
    h->data[i] = (const unsigned char *)p + 8 + hlen;
    h->data_len[i] = (uint64_t)st.st_size - 8 - hlen;
    return 0;
}

static int st_dtype(const char *s, uint32_t *type)
{
    if (!s)
        return TY_EFORMAT;
    if (strcmp(s, "F32") == 0)
        *type = TY_GGML_F32;
    else if (strcmp(s, "F16") == 0)
        *type = TY_GGML_F16;
    else if (strcmp(s, "BF16") == 0)
        *type = TY_GGML_BF16;
    else
        return TY_ENOTSUP;
    return 0;
}

/* Find `name` in any shard and make a weight view of it, validating dtype, shape and range;
 * with n_experts != NULL a 3-D tensor too: *n_experts matrices (shape [E, rows, cols]) back
 * to back, w the first (1 for a matrix or vector). */
static int get_w3(struct hf_ctx *h, struct ty_weight *w, const char *name, uint64_t *n_experts)
{
    for (uint32_t i = 0; i < h->m->n_maps; i++) {
        json_t *t = json_object_get(h->index[i], name);
        if (!t)
            continue;
        json_t *shape = json_object_get(t, "shape"), *offs = json_object_get(t, "data_offsets");
        int rc = st_dtype(json_string_value(json_object_get(t, "dtype")), &w->type);
        size_t nd = json_array_size(shape), x = nd == 3;
        if (rc || nd < 1 || nd > (n_experts ? 3u : 2u) || json_array_size(offs) != 2) {
            snprintf(h->errbuf, h->errlen, "tensor '%s': unsupported dtype or bad shape", name);
            return rc ? rc : TY_EFORMAT;
        }
        json_int_t d0 = json_integer_value(json_array_get(shape, x));
        json_int_t d1 = nd >= 2 ? json_integer_value(json_array_get(shape, x + 1)) : 1;
        json_int_t ne = x ? json_integer_value(json_array_get(shape, 0)) : 1;
        json_int_t b = json_integer_value(json_array_get(offs, 0));
        json_int_t e = json_integer_value(json_array_get(offs, 1));
        w->rows = nd >= 2 ? (uint64_t)d0 : 1;
        w->cols = nd >= 2 ? (uint64_t)d1 : (uint64_t)d0;
        if (d0 <= 0 || d1 <= 0 || d0 > (1 << 24) || d1 > (1 << 24) || ne <= 0 || ne > 4096 ||
            b < 0 || e < b || (uint64_t)e > h->data_len[i] ||
            (uint64_t)(e - b) != (uint64_t)ne * ty_ggml_type_nbytes(w->type, w->rows * w->cols)) {
            snprintf(h->errbuf, h->errlen, "tensor '%s': shape or data_offsets out of range",
                     name);
            return TY_EFORMAT;
        }
        if (n_experts)
            *n_experts = (uint64_t)ne;
        w->data = h->data[i] + b;
        if ((uintptr_t)w->data % (w->type == TY_GGML_F32 ? 4 : 2)) {
            snprintf(h->errbuf, h->errlen, "tensor '%s': data not aligned to its element size",
                     name);
            return TY_ENOTSUP;
        }
        return 0;
    }
    return 0; /* absent: the shape check reports missing required tensors */
}

static int get_w(struct hf_ctx *h, struct ty_weight *w, const char *name)
{
    return get_w3(h, w, name, NULL);
}

/* transformers' GptOssExperts, laid out as llama.cpp's converter (conversion/gpt_oss.py)
 * writes the GGUF: gate_up_proj [E, D, 2F] (input-major, gate at even and up at odd output
 * columns) into per-expert (F, D) gate and up matrices, down_proj [E, F, D] into (D, F); the
 * biases gate_up_proj_bias [E, 2F] split the same way (F32). The matrices keep their dtype,
 * copied into one anonymous mapping of the model (m->maps) for all layers. */
static int load_gptoss_hf(struct hf_ctx *h, uint32_t l, unsigned char **arena)
{
    struct ty_model *m = h->m;
    struct ty_layer_weights *L = &m->layers[l];
    uint64_t E = m->cfg.n_experts, D = m->cfg.dim, F = m->cfg.ffn_dim, ne = 0, ne2 = 0;
    struct ty_weight gu = {0}, gub = {0}, dn = {0};
    char name[160];
    int rc;
#define HFN(s) (snprintf(name, sizeof(name), "model.layers.%u.%s", l, s), name)
    bool blocks = false;
    HFN("mlp.experts.gate_up_proj_blocks");
    for (uint32_t i = 0; i < m->n_maps; i++)
        blocks |= json_object_get(h->index[i], name) != NULL;
    if (blocks) {
        snprintf(h->errbuf, h->errlen, "gpt_oss experts in MXFP4 blocks (%s) are not supported "
                 "from a Hugging Face directory: convert it to GGUF, or use a BF16/F32 "
                 "checkpoint", name);
        return TY_ENOTSUP;
    }
    if ((rc = get_w(h, &L->router, HFN("mlp.router.weight"))) ||
        (rc = get_w(h, &L->router_b, HFN("mlp.router.bias"))) ||
        (rc = get_w3(h, &gu, HFN("mlp.experts.gate_up_proj"), &ne)) ||
        (rc = get_w3(h, &dn, HFN("mlp.experts.down_proj"), &ne2)) ||
        (rc = get_w(h, &gub, HFN("mlp.experts.gate_up_proj_bias"))) ||
        (rc = get_w(h, &L->exp_b_down, HFN("mlp.experts.down_proj_bias"))))
        return rc;
#undef HFN
    if (!gu.data || !dn.data || !gub.data || ne != E || ne2 != E || gu.rows != D ||
        gu.cols != 2 * F || dn.rows != F || dn.cols != D || dn.type != gu.type ||
        gub.rows != E || gub.cols != 2 * F || gub.type != TY_GGML_F32) {
        snprintf(h->errbuf, h->errlen, "layer %u: gpt_oss experts must be mlp.experts."
                 "gate_up_proj [%llu, %llu, %llu] and down_proj [%llu, %llu, %llu] of one "
                 "dtype, gate_up_proj_bias F32 [%llu, %llu]", l, (unsigned long long)E,
                 (unsigned long long)D, (unsigned long long)(2 * F), (unsigned long long)E,
                 (unsigned long long)F, (unsigned long long)D, (unsigned long long)E,
                 (unsigned long long)(2 * F));
        return TY_EFORMAT;
    }
    size_t esz = gu.type == TY_GGML_F32 ? 4 : 2, mat = (size_t)F * D * esz;
    if (!*arena) {
        size_t len = (size_t)m->cfg.n_layers * (3 * E * mat + 2 * E * F * 4);
        if (m->n_maps >= TY_MODEL_MAX_MAPS)
            return TY_ENOMEM;
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return TY_ENOMEM;
        m->maps[m->n_maps++] = (struct ty_mapping){p, len};
        *arena = p;
    }
    unsigned char *out = *arena + (size_t)l * (3 * E * mat + 2 * E * F * 4);
    const unsigned char *gsrc = gu.data, *dsrc = dn.data;
    for (uint64_t e = 0; e < E; e++) {
        unsigned char *g = out + (3 * e) * mat, *u = g + mat, *d = u + mat;
        for (uint64_t f = 0; f < F; f++)
            for (uint64_t i = 0; i < D; i++) {
                const unsigned char *row = gsrc + ((e * D + i) * 2 * F) * esz;
                memcpy(g + (f * D + i) * esz, row + 2 * f * esz, esz);
                memcpy(u + (f * D + i) * esz, row + (2 * f + 1) * esz, esz);
            }
        for (uint64_t i = 0; i < D; i++)
            for (uint64_t f = 0; f < F; f++)
                memcpy(d + (i * F + f) * esz, dsrc + ((e * F + f) * D + i) * esz, esz);
        L->exp_gate[e] = (struct ty_weight){g, gu.type, F, D};
        L->exp_up[e] = (struct ty_weight){u, gu.type, F, D};
        L->exp_down[e] = (struct ty_weight){d, gu.type, D, F};
    }
    float *gb = (float *)(out + 3 * E * mat), *ub = gb + E * F;
    const float *bsrc = gub.data;
    for (uint64_t i = 0; i < E * F; i++) {
        gb[i] = bsrc[2 * i];
        ub[i] = bsrc[2 * i + 1];
    }
    L->exp_b_gate = (struct ty_weight){gb, TY_GGML_F32, E, F};
    L->exp_b_up = (struct ty_weight){ub, TY_GGML_F32, E, F};
    return 0;
}

/* Layer l's router and experts, by the architecture's names. */
static int load_experts(struct hf_ctx *h, const struct ty__arch *ai, uint32_t l)
{
    struct ty_layer_weights *L = &h->m->layers[l];
    struct ty_weight *out[3] = {L->exp_gate, L->exp_up, L->exp_down};
    char name[160], fmt[128];
    snprintf(name, sizeof(name), "model.layers.%u.%s", l, ai->hf_router);
    int rc = get_w(h, &L->router, name);
    for (uint32_t e = 0; e < h->m->cfg.n_experts && !rc; e++)
        for (int i = 0; i < 3 && !rc; i++) {
            snprintf(fmt, sizeof(fmt), "model.layers.%%u.%s", ai->hf_expert[i]);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral" /* the arch table's own formats */
            snprintf(name, sizeof(name), fmt, l, e);
#pragma GCC diagnostic pop
            rc = get_w(h, &out[i][e], name);
        }
    return rc;
}

static int load_layers(struct hf_ctx *h, const struct ty__arch *ai)
{
    char name[128];
    unsigned char *arena = NULL; /* gpt-oss's re-laid experts */
    for (uint32_t l = 0; l < h->m->cfg.n_layers; l++) {
        for (size_t i = 0; i < ty__n_layer_tensors; i++) {
            const struct ty__layer_tensor *t = &ty__layer_tensors[i];
            if (!t->hf)
                continue;
            snprintf(name, sizeof(name), "model.layers.%u.%s", l, t->hf);
            struct ty_weight *w = (struct ty_weight *)((char *)&h->m->layers[l] + t->off);
            int rc = get_w(h, w, name);
            if (rc)
                return rc;
        }
        int rc = ai->arch == TY_MODEL_ARCH_GPTOSS ? load_gptoss_hf(h, l, &arena)
                 : h->m->cfg.n_experts              ? load_experts(h, ai, l)
                                                    : 0;
        if (rc)
            return rc;
    }
    return 0;
}

static uint32_t cfg_u32(json_t *cfg, const char *key, uint32_t dflt)
{
    json_t *v = json_object_get(cfg, key);
    json_int_t i = json_integer_value(v);
    return json_is_integer(v) && i >= 0 && i <= UINT32_MAX ? (uint32_t)i : dflt;
}

static float cfg_f32(json_t *cfg, const char *key, float dflt)
{
    json_t *v = json_object_get(cfg, key);
    return json_is_number(v) ? (float)json_number_value(v) : dflt;
}

static int read_rope_scaling(struct ty_model *m, json_t *cfg, char *errbuf, size_t errlen)
{
    json_t *rs = json_object_get(cfg, "rope_scaling");
    if (!json_is_object(rs))
        return 0;
    const char *type = json_string_value(json_object_get(rs, "rope_type"));
    if (!type)
        type = json_string_value(json_object_get(rs, "type"));
    m->rope_factor = cfg_f32(rs, "factor", 0);
    if (type && strcmp(type, "llama3") == 0) {
        m->rope_scaling = 2;
        m->rope_low_freq = cfg_f32(rs, "low_freq_factor", 0);
        m->rope_high_freq = cfg_f32(rs, "high_freq_factor", 0);
        m->rope_orig_ctx = cfg_u32(rs, "original_max_position_embeddings", 0);
    } else if (type && strcmp(type, "linear") == 0) {
        m->rope_scaling = 1;
    } else if (type && strcmp(type, "yarn") == 0) {
        /* transformers' _compute_yarn_parameters: the same ramp and magnitude as llama.cpp's
         * unless attention_factor is given; mscale / mscale_all_dim (DeepSeek) are not */
        m->rope_scaling = 3;
        m->rope_orig_ctx = cfg_u32(rs, "original_max_position_embeddings", m->cfg.ctx_len);
        m->rope_beta_fast = cfg_f32(rs, "beta_fast", 0);
        m->rope_beta_slow = cfg_f32(rs, "beta_slow", 0);
        m->rope_attention_factor = cfg_f32(rs, "attention_factor", 0);
        json_t *msa = json_object_get(rs, "mscale_all_dim");
        if (m->cfg.arch == TY_MODEL_ARCH_DEEPSEEK2) {
            /* llama.cpp's reading of DeepSeek's YaRN (converter: yarn_log_multiplier =
             * 0.1 mscale_all_dim; mscale taken as mscale_all_dim when that is not 1, else 1) */
            float L = cfg_f32(rs, "mscale_all_dim", 0), ms = cfg_f32(rs, "mscale", 1.0f);
            if (!json_is_number(msa) || !(L > 0) || ms != (L != 1.0f ? L : 1.0f)) {
                snprintf(errbuf, errlen, "deepseek_v3 yarn rope_scaling needs mscale_all_dim "
                         "> 0 and mscale equal to it (or 1 with mscale_all_dim 1)");
                return TY_ENOTSUP;
            }
            m->rope_yarn_log_mul = L;
        } else if (json_object_get(rs, "mscale") || msa) {
            snprintf(errbuf, errlen, "yarn rope_scaling with mscale / mscale_all_dim "
                     "(DeepSeek's) is not supported");
            return TY_ENOTSUP;
        }
    } else if (!type || strcmp(type, "default") != 0) {
        snprintf(errbuf, errlen, "unsupported rope_scaling type '%s'", type ? type : "?");
        return TY_ENOTSUP;
    }
    return 0;
}

/* Mistral: sliding_window (int, or null for none) on every layer. Qwen2-style configs add
 * use_sliding_window (false: no window) and max_window_layers (HF Qwen2 slides the layers from
 * that index on). */
static void read_sliding_window(struct ty_model *m, json_t *cfg)
{
    json_t *use = json_object_get(cfg, "use_sliding_window");
    m->swa_window = cfg_u32(cfg, "sliding_window", 0);
    if (use && !json_is_true(use))
        m->swa_window = 0;
    if (m->swa_window && use)
        m->swa_first_layer = cfg_u32(cfg, "max_window_layers", 0);
}

/* transformers' GptOssConfig as llama.cpp's converter reads it: num_local_experts,
 * num_experts_per_tok, experts of intermediate_size, top-k softmax gating, SwiGLU-OAI with
 * swiglu_limit 7, layer_types alternating sliding_attention (even layers) and
 * full_attention, which is the pattern llama.cpp applies to the GGUF. */
static int read_gptoss(struct ty_model *m, json_t *cfg, char *errbuf, size_t errlen)
{
    struct ty_model_config *c = &m->cfg;
    json_t *types = json_object_get(cfg, "layer_types"), *v;
    size_t i;
    c->n_experts = cfg_u32(cfg, "num_local_experts", 0);
    c->n_experts_used = cfg_u32(cfg, "num_experts_per_tok", 0);
    c->moe_topk_softmax = c->swiglu_oai = true;
    m->swa_period = 2;
    if (cfg_f32(cfg, "swiglu_limit", 7.0f) != 7.0f) {
        snprintf(errbuf, errlen, "config.json: gpt_oss swiglu_limit %g is not supported (7 only)",
                 (double)cfg_f32(cfg, "swiglu_limit", 7.0f));
        return TY_ENOTSUP;
    }
    if (!m->swa_window) {
        snprintf(errbuf, errlen, "config.json: gpt_oss without sliding_window");
        return TY_EFORMAT;
    }
    json_array_foreach(types, i, v) {
        const char *want = i % 2 == 0 ? "sliding_attention" : "full_attention";
        const char *got = json_string_value(v);
        if (!got || strcmp(got, want) != 0) {
            snprintf(errbuf, errlen, "config.json: layer_types[%zu] is '%s': only alternating "
                     "sliding_attention (even layers) and full_attention are supported", i,
                     got ? got : "?");
            return TY_ENOTSUP;
        }
    }
    return 0;
}

/* transformers' Qwen3MoeConfig (num_experts, num_experts_per_tok, moe_intermediate_size,
 * norm_topk_prob default false; every layer sparse unless decoder_sparse_step or
 * mlp_only_layers say otherwise) and MixtralConfig (num_local_experts default 8,
 * num_experts_per_tok default 2, experts of intermediate_size, always renormalised). */
static int read_moe(struct ty_model *m, const struct ty__arch *ai, json_t *cfg, char *errbuf,
                    size_t errlen)
{
    struct ty_model_config *c = &m->cfg;
    if (!ai->moe)
        return 0;
    if (ai->arch == TY_MODEL_ARCH_QWEN3MOE) {
        c->n_experts = cfg_u32(cfg, "num_experts", 0);
        c->n_experts_used = cfg_u32(cfg, "num_experts_per_tok", 0);
        c->ffn_dim = cfg_u32(cfg, "moe_intermediate_size", 0);
        c->moe_norm_topk = json_is_true(json_object_get(cfg, "norm_topk_prob"));
        json_t *dense = json_object_get(cfg, "mlp_only_layers");
        if (cfg_u32(cfg, "decoder_sparse_step", 1) != 1 || json_array_size(dense)) {
            snprintf(errbuf, errlen, "config.json: dense layers among expert layers "
                     "(decoder_sparse_step, mlp_only_layers) are not supported");
            return TY_ENOTSUP;
        }
    } else if (ai->arch == TY_MODEL_ARCH_GPTOSS) {
        int rc = read_gptoss(m, cfg, errbuf, errlen);
        if (rc)
            return rc;
    } else {
        c->n_experts = cfg_u32(cfg, "num_local_experts", 8);
        c->n_experts_used = cfg_u32(cfg, "num_experts_per_tok", 2);
        c->moe_norm_topk = true;
    }
    if (c->n_experts == 0 || c->n_experts > TY_MODEL_MAX_EXPERTS) {
        snprintf(errbuf, errlen, "config.json: %u experts out of range (1..%u)", c->n_experts,
                 TY_MODEL_MAX_EXPERTS);
        return c->n_experts ? TY_ENOTSUP : TY_EFORMAT;
    }
    return 0;
}

/* transformers' DeepseekV3Config as llama.cpp's converter reads it: MLA sizes (q_lora_rank
 * null: a direct q_proj), routed experts of moe_intermediate_size with n_shared_experts of
 * them as the shared expert, first_k_dense_replace dense layers of intermediate_size,
 * scoring_func sigmoid or softmax, groups by the sum of their two best scores (topk_method
 * noaux_tc; group_limited_greedy, V2's group maximum, is refused), routed_scaling_factor.
 * Weights keep the interleaved rope order, as llama.cpp's converter leaves them. */
static int read_deepseek(struct ty_model *m, json_t *cfg, char *errbuf, size_t errlen)
{
    struct ty_model_config *c = &m->cfg;
    const char *sf = json_string_value(json_object_get(cfg, "scoring_func"));
    const char *tm = json_string_value(json_object_get(cfg, "topk_method"));
    c->qk_hf_order = false;
    c->q_lora_rank = cfg_u32(cfg, "q_lora_rank", 0);
    c->kv_lora_rank = cfg_u32(cfg, "kv_lora_rank", 0);
    c->qk_nope_dim = cfg_u32(cfg, "qk_nope_head_dim", 0);
    c->rope_dim = cfg_u32(cfg, "qk_rope_head_dim", 0);
    c->v_head_dim = cfg_u32(cfg, "v_head_dim", 0);
    c->n_experts = cfg_u32(cfg, "n_routed_experts", 0);
    c->n_experts_used = cfg_u32(cfg, "num_experts_per_tok", 0);
    c->dense_ffn_dim = c->ffn_dim;
    c->ffn_dim = cfg_u32(cfg, "moe_intermediate_size", 0);
    /* absent routing keys take DeepseekV3Config's defaults (the sizes are required) */
    c->shared_ffn_dim = cfg_u32(cfg, "n_shared_experts", 1) * c->ffn_dim;
    c->n_dense_lead = cfg_u32(cfg, "first_k_dense_replace", 3);
    c->n_expert_groups = cfg_u32(cfg, "n_group", 8);
    c->n_group_used = cfg_u32(cfg, "topk_group", 4);
    json_t *norm = json_object_get(cfg, "norm_topk_prob");
    c->moe_norm_topk = !norm || json_is_true(norm);
    c->expert_weights_scale = cfg_f32(cfg, "routed_scaling_factor", 2.5f);
    sf = sf ? sf : "sigmoid";
    c->moe_gating = strcmp(sf, "sigmoid") == 0;
    if ((!c->moe_gating && strcmp(sf, "softmax") != 0) ||
        (tm && strcmp(tm, "noaux_tc") && strcmp(tm, "greedy")) ||
        (c->n_expert_groups > 1 && tm && strcmp(tm, "noaux_tc"))) {
        snprintf(errbuf, errlen, "config.json: scoring_func '%s' / topk_method '%s' not "
                 "supported (sigmoid or softmax; noaux_tc, or greedy without groups)",
                 sf, tm ? tm : "-");
        return TY_ENOTSUP;
    }
    if (!c->kv_lora_rank || !c->rope_dim || c->rope_dim % 2 || !c->qk_nope_dim ||
        !c->v_head_dim || (c->kv_lora_rank + c->rope_dim) % 4 || !c->n_experts ||
        c->n_experts > TY_MODEL_MAX_EXPERTS) {
        snprintf(errbuf, errlen, "config.json: invalid deepseek_v3 sizes (kv_lora_rank %u, "
                 "qk_rope_head_dim %u, qk_nope_head_dim %u, v_head_dim %u, n_routed_experts %u)",
                 c->kv_lora_rank, c->rope_dim, c->qk_nope_dim, c->v_head_dim, c->n_experts);
        return TY_EFORMAT;
    }
    c->kq_scale = 1.0f / sqrtf((float)(c->qk_nope_dim + c->rope_dim));
    c->n_kv_heads = 1; /* the pool's K and V chunks hold a latent row's halves (cpu/mla.c) */
    c->head_dim = (c->kv_lora_rank + c->rope_dim) / 2;
    return 0;
}

static int read_config(struct ty_model *m, json_t *cfg, const struct ty__arch **arch,
                       char *errbuf, size_t errlen)
{
    struct ty_model_config *c = &m->cfg;
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    const struct ty__arch *ai = mt ? ty__model_arch_find(mt, strlen(mt)) : NULL;
    if (!ai) {
        snprintf(errbuf, errlen, "unsupported model_type '%s' (%s)", mt ? mt : "(missing)",
                 ty__model_arch_list());
        return TY_ENOTSUP;
    }
    *arch = ai;
    c->arch = ai->arch;
    c->rope = ai->rope;
    /* HF keeps q/k rows in rotate_half order. The NEOX architectures rotate exactly that;
     * the llama family's rows were permuted from the interleaved original
     * (convert_llama_weights_to_hf.py permute()), which the engine undoes. */
    c->qk_hf_order = ai->rope == TY_ROPE_NORM;
    c->qk_norm = ai->qk_norm;
    c->dim = cfg_u32(cfg, "hidden_size", 0);
    c->n_layers = cfg_u32(cfg, "num_hidden_layers", 0);
    c->n_heads = cfg_u32(cfg, "num_attention_heads", 0);
    c->n_kv_heads = cfg_u32(cfg, "num_key_value_heads", c->n_heads);
    c->head_dim = cfg_u32(cfg, "head_dim", c->n_heads ? c->dim / c->n_heads : 0);
    c->ffn_dim = cfg_u32(cfg, "intermediate_size", 0);
    c->n_vocab = cfg_u32(cfg, "vocab_size", 0);
    c->ctx_len = cfg_u32(cfg, "max_position_embeddings", 2048);
    c->rms_eps = cfg_f32(cfg, "rms_norm_eps", 1e-6f);
    c->rope_theta = cfg_f32(cfg, "rope_theta", 10000.0f);
    c->qkv_bias = ai->qkv_bias || json_is_true(json_object_get(cfg, "attention_bias"));
    c->tied_output = json_is_true(json_object_get(cfg, "tie_word_embeddings"));
    if (c->n_layers == 0 || c->n_layers > 512) {
        snprintf(errbuf, errlen, "config.json: num_hidden_layers %u out of range", c->n_layers);
        return TY_EFORMAT;
    }
    read_sliding_window(m, cfg);
    int rc = ai->arch == TY_MODEL_ARCH_DEEPSEEK2 ? read_deepseek(m, cfg, errbuf, errlen)
                                                 : read_moe(m, ai, cfg, errbuf, errlen);
    return rc ? rc : read_rope_scaling(m, cfg, errbuf, errlen);
}

static void add_eos_json(struct ty_model *m, json_t *v)
{
    size_t i;
    json_t *e;
    if (json_is_integer(v))
        ty__model_add_eog(m, json_integer_value(v));
    json_array_foreach(v, i, e) ty__model_add_eog(m, json_integer_value(e));
}

static json_t *load_json(const char *dir, const char *file, char *errbuf, size_t errlen)
{
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    json_t *j = json_load_file(path, 0, &je);
    if (!j && errbuf)
        snprintf(errbuf, errlen, "%s: %s", path, je.text);
    return j;
}

/* Map model.safetensors, or every shard named by model.safetensors.index.json. */
static int map_weights(struct hf_ctx *h, const char *dir)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (access(path, R_OK) == 0)
        return map_shard(h, path);
    json_t *idx = load_json(dir, "model.safetensors.index.json", h->errbuf, h->errlen);
    json_t *wm = json_object_get(idx, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(idx);
        snprintf(h->errbuf, h->errlen, "%s: no model.safetensors or usable index", dir);
        return TY_ENOENT;
    }
    const char *key;
    json_t *v;
    int rc = 0;
    char seen[TY_MODEL_MAX_MAPS][256];
    uint32_t n_seen = 0;
    json_object_foreach(wm, key, v)
    {
        const char *f = json_string_value(v);
        bool dup = false;
        for (uint32_t i = 0; f && i < n_seen; i++)
            dup |= strcmp(seen[i], f) == 0;
        if (!f || dup || strchr(f, '/') || strlen(f) >= 256)
            continue;
        snprintf(seen[n_seen++ % TY_MODEL_MAX_MAPS], 256, "%s", f);
        snprintf(path, sizeof(path), "%s/%s", dir, f);
        if ((rc = map_shard(h, path)))
            break;
    }
    json_decref(idx);
    return rc;
}

static int load_weights(struct hf_ctx *h, const char *dir, const struct ty__arch *ai)
{
    struct ty_model *m = h->m;
    int rc = map_weights(h, dir);
    if (rc)
        return rc;
    if (!(m->layers = calloc(m->cfg.n_layers, sizeof(*m->layers))))
        return TY_ENOMEM;
    if (m->cfg.n_experts && (rc = ty__model_alloc_experts(m)))
        return rc;
    if ((rc = get_w(h, &m->tok_embd, "model.embed_tokens.weight")) ||
        (rc = get_w(h, &m->out_norm, "model.norm.weight")) ||
        (rc = get_w(h, &m->output, "lm_head.weight")) || (rc = load_layers(h, ai)))
        return rc;
    if (!m->output.data) {
        m->output = m->tok_embd;
        m->cfg.tied_output = true;
    }
    return 0;
}

static void read_tokenizer_side(struct ty_model *m, const char *dir, json_t *cfg)
{
    json_t *gen = load_json(dir, "generation_config.json", NULL, 0);
    add_eos_json(m, json_object_get(gen, "eos_token_id"));
    add_eos_json(m, json_object_get(cfg, "eos_token_id"));
    json_decref(gen);
    json_t *tc = load_json(dir, "tokenizer_config.json", NULL, 0);
    const char *tmpl = json_string_value(json_object_get(tc, "chat_template"));
    if (tmpl)
        m->chat_template = strdup(tmpl);
    json_decref(tc);
}

int ty__model_load_hf(struct ty_model *m, const char *dir, char *errbuf, size_t errlen)
{
    struct hf_ctx h = {.m = m, .errbuf = errbuf, .errlen = errlen};
    json_t *cfg = load_json(dir, "config.json", errbuf, errlen);
    int rc = TY_EFORMAT;
    if (!json_is_object(cfg)) {
        if (cfg) /* parsed, but not an object: load_json wrote no message */
            snprintf(errbuf, errlen, "%s/config.json: not a JSON object", dir);
        goto out;
    }
    const struct ty__arch *ai = NULL;
    if ((rc = read_config(m, cfg, &ai, errbuf, errlen)) || (rc = load_weights(&h, dir, ai)))
        goto out;
    read_tokenizer_side(m, dir, cfg);
#ifdef TY_HAVE_TOKENIZER
    char tpath[4096];
    snprintf(tpath, sizeof(tpath), "%s/tokenizer.json", dir);
    if (access(tpath, R_OK) == 0)
        rc = ty_tokenizer_load_json(&m->tok, dir, errbuf, errlen);
#endif
out:
    for (uint32_t i = 0; i < TY_MODEL_MAX_MAPS; i++)
        json_decref(h.index[i]);
    json_decref(cfg);
    return rc;
}
