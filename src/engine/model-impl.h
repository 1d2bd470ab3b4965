/* Private model layout shared by the loaders (model_gguf.c, model_hf.c) and the backends.
 * Every weight is a row-major matrix view into a file mapping: `rows` outputs of `cols` inputs
 * (GGUF ne = {cols, rows}; safetensors shape = [rows, cols]). */
#ifndef TYCHO_ENGINE_MODEL_IMPL_H
#define TYCHO_ENGINE_MODEL_IMPL_H

#include "tycho/model.h"

#include <stdint.h>

struct ty_weight {
    const void *data; /* NULL when absent (optional biases) */
    uint32_t type;    /* enum ty_ggml_type */
    uint64_t rows, cols;
};

struct ty_layer_weights {
    struct ty_weight attn_norm;      /* (dim) */
    struct ty_weight wq, wk, wv, wo; /* (n_heads*hd, dim) (n_kv*hd, dim) x2 (dim, n_heads*hd) */
    struct ty_weight bq, bk, bv;     /* Qwen2 biases, (n_heads*hd) (n_kv*hd) x2 */
    struct ty_weight q_norm, k_norm; /* Qwen3 per-head RMSNorm weights, (hd) each */
    struct ty_weight ffn_norm;       /* (dim) */
    struct ty_weight w_gate, w_up;   /* (ffn, dim) */
    struct ty_weight w_down;         /* (dim, ffn) */
    /* Mixture of experts (cfg.n_experts > 0) instead of w_gate/w_up/w_down: the router and
     * each expert's matrices, n_experts of each (views into the model's `experts` array; GGUF's
     * 3-D blk.N.ffn_*_exps tensors sliced per expert, HF's per-expert tensors). */
    struct ty_weight router;         /* (n_experts, dim) */
    struct ty_weight *exp_gate, *exp_up, *exp_down; /* (ffn, dim) x2, (dim, ffn) */
    uint32_t window;                 /* sliding-window attention: keys a query sees, 0 = all */
    /* gpt-oss: the attention output's bias (dim); attention sinks (n_heads: one logit per
     * head that joins each query's softmax denominator, as llama.cpp's soft_max with sinks);
     * the router's bias (n_experts); the experts' biases, a row per expert: gate and up
     * (n_experts, ffn), down (n_experts, dim). Absent (data NULL) elsewhere. */
    struct ty_weight bo, sinks, router_b, exp_b_gate, exp_b_up, exp_b_down;
    /* DeepSeek-V2/V3 multi-head latent attention (cfg.kv_lora_rank > 0) instead of wq/wk/wv;
     * R = kv_lora_rank, P = rope_dim, N = qk_nope_dim, H = n_heads. */
    /* low-rank q: (q_lora, dim), (q_lora), (H*(N+P), q_lora) */
    struct ty_weight wq_a, q_a_norm, wq_b;
    struct ty_weight wkv_a;          /* (R + P, dim): the latent, then the shared rope key */
    struct ty_weight kv_a_norm;      /* (R) */
    struct ty_weight wk_b;           /* (H*R, N): per head h rows h*R.. map q_nope to the latent */
    struct ty_weight wv_b;           /* (H*V, R): per head the latent to the value (V = v_head) */
    struct ty_weight wkv_b;          /* HF kv_b_proj instead of wk_b/wv_b: (H*(N+V), R), per head
                                      * N rows of k (k_b transposed) then V rows of v */
    struct ty_weight exp_probs_b;    /* (n_experts) expert selection bias (DeepSeek-V3) */
    struct ty_weight sh_gate, sh_up, sh_down; /* shared expert (shared_ffn, dim) x2, (dim, .) */
};

/* A layer's tensors by file format: the name after "blk.N." (GGUF) and after
 * "model.layers.N." (Hugging Face safetensors; NULL where the architecture names it, as the
 * expert router; NULL where a format has no such tensor), and the member of ty_layer_weights
 * it fills. The experts' 3-D tensors are
 * the GGUF loader's own (one view per expert). */
struct ty__layer_tensor {
    const char *gguf, *hf;
    size_t off;
};
extern const struct ty__layer_tensor ty__layer_tensors[];
extern const size_t ty__n_layer_tensors;

/* What an architecture name (GGUF general.architecture, HF config.json model_type) means to
 * the forward pass. One table serves both loaders. */
struct ty__arch {
    const char *name;
    enum ty_model_arch arch;
    enum ty_rope_kind rope; /* as llama.cpp applies it to the GGUF layout */
    bool qkv_bias, qk_norm;
    /* Mixture of experts: required (qwen3moe, mixtral), else optional (GGUF llama with
     * <arch>.expert_count, as llama.cpp writes Mixtral). HF tensor names after
     * "model.layers.N.": the router, and each expert's gate, up and down (%u = expert). */
    bool moe;
    const char *hf_router, *hf_expert[3];
};
/* The entry named by the len bytes at `name`, or NULL when the architecture is not supported. */
const struct ty__arch *ty__model_arch_find(const char *name, size_t len);
/* "llama, mistral, qwen2, qwen3": for messages refusing an architecture. */
const char *ty__model_arch_list(void);
/* Experts a model may have, and may use per token. */
#define TY_MODEL_MAX_EXPERTS 256u
#define TY_MODEL_MAX_EXPERTS_USED 16u
/* Point every layer's exp_gate/exp_up/exp_down at its part of m->experts (allocated here for
 * cfg.n_layers x cfg.n_experts); 0 or TY_ENOMEM. */
int ty__model_alloc_experts(struct ty_model *m);

struct ty_mapping {
    void *addr;
    size_t len;
};

#define TY_MODEL_MAX_EOG 8
#define TY_MODEL_MAX_MAPS 64

struct ty_model {
    struct ty_model_config cfg;
    struct ty_weight tok_embd; /* (n_vocab, dim) */
    struct ty_weight out_norm; /* (dim) */
    struct ty_weight output;   /* (n_vocab, dim); == tok_embd when tied */
    struct ty_layer_weights *layers;
    struct ty_weight *experts; /* (n_layers, 3, n_experts): the layers' expert matrices */
    /* rope, computed as llama.cpp does (ggml_rope_cache_init): theta_0 = pos,
     * theta_{i+1} = theta_i * rope_theta_scale in float, each divided by rope_div[i] */
    float rope_theta_scale; /* rope_theta^(-2/head_dim) */
    float *rope_div;        /* (head_dim/2) frequency divisors from scaling; 1 = none */
    /* YaRN (rope_scaling 3), as ggml's rope_yarn: t_extrap = theta_i / rope_div[i],
     * t = rope_freq_scale * t_extrap * (1 - rope_mix[i]) + t_extrap * rope_mix[i], and cos/sin
     * times rope_mscale; rope_mix is NULL without YaRN */
    float *rope_mix;
    float rope_freq_scale, rope_mscale;
    /* rope scaling as read from the file, turned into inv_freq by ty__model_finish() */
    int rope_scaling;          /* 0 none, 1 linear, 2 llama3, 3 yarn */
    float rope_factor, rope_low_freq, rope_high_freq;
    float rope_beta_fast, rope_beta_slow; /* YaRN's ramp corners (0: 32 and 1) */
    float rope_attn_factor;               /* YaRN: GGUF rope.scaling.attn_factor (0: 1) */
    float rope_attention_factor;          /* YaRN: HF attention_factor, the cos/sin scale as is
                                           * (0: from the factor, as llama.cpp computes it) */
    uint32_t rope_orig_ctx;
    /* DeepSeek's YaRN (deepseek2 only): mscale_all_dim (GGUF rope.scaling.yarn_log_multiplier
     * / 0.1, llama.cpp's hparams.rope_yarn_log_mul); 0 = none */
    float rope_yarn_log_mul;
    const float *rope_freqs;   /* GGUF rope_freqs.weight (head_dim/2), divides frequencies */
    /* sliding window as read from the file: layers swa_first_layer.. slide over swa_window
     * tokens (HF Qwen2's max_window_layers; 0 for Mistral); ty__model_finish() sets each
     * layer's window and cfg.kv_window */
    uint32_t swa_window, swa_first_layer;
    /* gpt-oss's pattern instead (llama.cpp's set_swa_pattern(n)): layer l slides when
     * l % swa_period < swa_period - 1 (period 2: even layers slide); 0 = swa_first_layer's */
    uint32_t swa_period;
    struct ty_tokenizer *tok;
    uint32_t eog[TY_MODEL_MAX_EOG];
    uint32_t n_eog;
    char *chat_template;
    char desc[128];
    /* owners of the memory the weights point into */
    struct ty_gguf *gguf;
    struct ty_mapping maps[TY_MODEL_MAX_MAPS];
    uint32_t n_maps;
};

/* Loaders fill `m` (zeroed by the caller); on error they write errbuf and return TY_E*;
 * ty_model_free() releases whatever was filled. */
int ty__model_load_gguf(struct ty_model *m, const char *path, char *errbuf, size_t errlen);
int ty__model_load_hf(struct ty_model *m, const char *dir, char *errbuf, size_t errlen);
/* Shared checks after a loader filled cfg and weights: shapes, dims, rope table. */
int ty__model_finish(struct ty_model *m, char *errbuf, size_t errlen);
void ty__model_add_eog(struct ty_model *m, int64_t id);

#endif
