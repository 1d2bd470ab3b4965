/* A loaded model: its configuration, mmapped weights, tokenizer and end-of-generation ids.
 *
 * Sources: a GGUF file, or a Hugging Face directory (config.json + model.safetensors or a
 * sharded model.safetensors.index.json, tokenizer.json, generation_config.json). Architectures:
 * the Llama family (Llama 2/3 with llama3 rope scaling, Mistral, TinyLlama, SmolLM), Qwen2
 * (q/k/v bias), Qwen3 dense (per-head q/k RMSNorm, head_dim free of dim/heads), and the
 * mixtures of experts Qwen3-MoE, Mixtral (GGUF llama with experts) and gpt-oss (GGUF:
 * attention sinks, alternating sliding/full layers, YaRN, biased MXFP4 experts), DeepSeek-V2/V3
 * (MLA, shared + routed experts; GGUF deepseek2, HF deepseek_v3); tied or untied output; GQA.
 * Weights stay in the file mappings (F32/F16/BF16/Q8_0/Q4_0/Q4_K/Q5_K/Q6_K/MXFP4), but for HF
 * gpt_oss's fused experts, re-laid at load into one anonymous mapping.
 * A ty_model_t is immutable after ty_model_load() and may be shared by any threads; it must
 * outlive every engine, pool or backend that uses it.
 */
#ifndef TYCHO_MODEL_H
#define TYCHO_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ty_model ty_model_t;
struct ty_tokenizer;

enum ty_model_arch {
    TY_MODEL_ARCH_LLAMA = 0, /* also Mistral, TinyLlama, SmolLM */
    TY_MODEL_ARCH_QWEN2 = 1,
    TY_MODEL_ARCH_QWEN3 = 2,
    TY_MODEL_ARCH_QWEN3MOE = 3, /* Qwen3 attention, mixture-of-experts FFN */
    TY_MODEL_ARCH_GPTOSS = 4,   /* gpt-oss: attention sinks, biased experts, SwiGLU-OAI */
    TY_MODEL_ARCH_DEEPSEEK2 = 5, /* DeepSeek-V2/V3: MLA attention, shared + routed experts */
};

enum ty_rope_kind {
    TY_ROPE_NORM = 0, /* rotate pairs (2i, 2i+1): llama.cpp / llama2.c layout */
    TY_ROPE_NEOX = 1, /* rotate pairs (i, i + head_dim/2): HF rotate_half layout */
};

struct ty_model_config {
    enum ty_model_arch arch;
    uint32_t n_vocab;
    uint32_t dim;        /* hidden size */
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t n_kv_heads; /* GQA: n_heads % n_kv_heads == 0 */
    uint32_t head_dim;
    uint32_t ffn_dim;    /* intermediate size (of each expert in a mixture of experts) */
    /* Mixture of experts (Qwen3-MoE, Mixtral): every layer's FFN is n_experts SwiGLU experts
     * of ffn_dim, n_experts_used per token picked by a router: softmax over the router logits,
     * the top n_experts_used, their probabilities renormalised to sum 1 when moe_norm_topk
     * (Mixtral, Qwen3-MoE with norm_topk_prob; llama.cpp always), the experts' outputs summed
     * with those weights. 0 = a dense FFN. */
    uint32_t n_experts, n_experts_used;
    bool moe_norm_topk;
    /* gpt-oss (llama.cpp's SOFTMAX_WEIGHT gating and SWIGLU_OAI_MOE): the top n_experts_used
     * router logits picked first, the softmax over those k the weights; each expert's
     * activation min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1) of its gate g and
     * up u (instead of silu(g) * u). */
    bool moe_topk_softmax, swiglu_oai;
    uint32_t ctx_len;    /* trained context length */
    float rms_eps;
    float rope_theta;
    enum ty_rope_kind rope;
    /* HF llama checkpoints store q/k rows for rotate_half; the engine permutes q/k activations
     * to the interleaved layout so that KV bytes equal those of the GGUF of the same model. */
    bool qk_hf_order;
    bool qkv_bias;
    bool qk_norm; /* Qwen3: q and k RMS-normed per head (weights of head_dim) before rope */
    bool tied_output;
    /* Sliding-window attention (Mistral; GGUF <arch>.attention.sliding_window, HF
     * sliding_window): a query at position p of a sliding layer sees keys p - W + 1 .. p, as
     * llama.cpp masks (p - k >= W is masked). 0 = full attention everywhere. Which layers slide
     * is per layer in the model (all of them for Mistral). */
    uint32_t sliding_window;
    /* Keys older than kv_window - 1 positions are read by no layer (every layer slides, the
     * widest window): their KV pages may be released. 0 = some layer reads everything. */
    uint32_t kv_window;
    uint32_t weight_type; /* enum ty_ggml_type of the largest matrices (for display) */
    /* DeepSeek-V2/V3 (arch TY_MODEL_ARCH_DEEPSEEK2): multi-head latent attention. Each token's
     * KV is one row of kv_lora_rank (the RMS-normed latent) + rope_dim (the roped shared key
     * part), stored as two halves in a page's K and V chunks: so n_kv_heads is 1 and head_dim
     * is (kv_lora_rank + rope_dim) / 2, and the pool's bytes are the latent's. rope_dim is the
     * rope width (head_dim for every other architecture). A head's query is qk_nope_dim + rope_dim
     * wide (from wq, or wq_a/q_a_norm/wq_b when q_lora_rank), its no-rope part absorbed
     * through k_b into the latent; the value is the latent read back through v_b (v_head_dim
     * per head). Scores are scaled by kq_scale. The first n_dense_lead layers have a dense
     * FFN of dense_ffn_dim; the others n_experts routed experts (gating: 0 softmax, 1 sigmoid
     * with an optional selection bias, expert groups n_expert_groups of which n_group_used
     * are kept, weights times expert_weights_scale) plus a shared expert of shared_ffn_dim. */
    uint32_t q_lora_rank, kv_lora_rank, qk_nope_dim, v_head_dim, rope_dim;
    uint32_t n_dense_lead, dense_ffn_dim, shared_ffn_dim;
    uint32_t moe_gating, n_expert_groups, n_group_used;
    float expert_weights_scale, kq_scale;
};

/* Load `path` (a .gguf file or an HF directory). On error returns TY_ENOENT, TY_EFORMAT,
 * TY_ENOTSUP or TY_ENOMEM with a message naming the problem in errbuf. */
int ty_model_load(ty_model_t **out, const char *path, char *errbuf, size_t errlen);
void ty_model_free(ty_model_t *m);

const struct ty_model_config *ty_model_config(const ty_model_t *m);
/* The model's tokenizer, or NULL when the build has no tokenizer library or the file has
 * none (then only token ids can be used). Borrowed: lives as long as the model. */
const struct ty_tokenizer *ty_model_tokenizer(const ty_model_t *m);
/* True when `id` ends generation (the file's eos ids, generation_config.json eos list, and the
 * tokenizer's end-of-generation tokens). */
bool ty_model_is_eog(const ty_model_t *m, uint32_t id);
/* Every end-of-generation token id of the model (a scan of the vocabulary: call it once, not
 * per token), at most cap into out; returns how many there are. */
size_t ty_model_eog_list(const ty_model_t *m, uint32_t *out, size_t cap);
/* The Jinja chat template text from the model, or NULL. Borrowed. */
const char *ty_model_chat_template(const ty_model_t *m);
/* Bytes of weights the forward pass reads per token (all matrices and norms; of a mixture of
 * experts, the router and n_experts_used experts per layer). */
uint64_t ty_model_weight_bytes(const ty_model_t *m);
/* A short description: "llama 5L d64 h8/4 ff172 v512 F32". Borrowed. */
const char *ty_model_desc(const ty_model_t *m);

#endif
