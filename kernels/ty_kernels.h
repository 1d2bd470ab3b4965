/* C entry points of the CUDA kernels. Every launcher enqueues on the given stream and returns
 * 0, TY_EINVAL (bad shape or argument, checked on the host before anything is enqueued) or
 * TY_ECUDA (the launch error is logged with its call site); it never synchronizes and never
 * allocates. Pointers are device pointers unless a comment says otherwise. Callers own all
 * buffers. Launchers may be called from any thread; work on one stream runs in order.
 *
 * Conventions shared by every kernel:
 * - activations are f32, row-major; "(a, b)" below is a shape with b the fastest dimension;
 * - KV page pool, per layer (DESIGN.md §4): K and V arrays (n_pages, n_kv_heads, page_tokens,
 *   head_dim) of one element type (enum ty_cuda_dtype); a sequence's block table lists its page
 *   ids in order, token p of the sequence lives in page table[p / page_tokens] at slot
 *   p % page_tokens;
 * - query head h reads KV head h / (n_heads / n_kv_heads) (grouped-query attention);
 * - accumulation is always f32.
 */
#ifndef TYCHO_KERNELS_H
#define TYCHO_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *ty_cuda_stream_t;
typedef struct cublasContext *ty_cublas_t;

enum ty_cuda_dtype {
    TY_CUDA_F32 = 0,
    TY_CUDA_F16 = 1,
    TY_CUDA_BF16 = 2,
};

/* Bytes per element of `dt` (0 for an unknown value). */
size_t ty_cuda_dtype_size(enum ty_cuda_dtype dt);

/* ---- norms, elementwise (rmsnorm.cu, elementwise.cu) ------------------------------------- */

/* out[r][i] = x[r][i] * w[i] / sqrt(mean_i(x[r][i]^2) + eps)
 * x, out: (n_rows, dim) row-major f32; w: (dim) f32. out may alias x. */
int ty_cuda_rmsnorm_f32(float *out, const float *x, const float *w, int n_rows, int dim, float eps,
                        ty_cuda_stream_t stream);

/* x[i] += y[i] for i < n (the residual connection). */
int ty_cuda_add_f32(float *x, const float *y, size_t n, ty_cuda_stream_t stream);

/* SiLU-gated MLP activation (Shazeer 2020, SwiGLU):
 * out[r][i] = silu(gate[r*ld_in + i]) * up[r*ld_in + i], silu(g) = g / (1 + exp(-g)).
 * out: (n_rows, n_cols) dense; gate and up rows are ld_in floats apart (ld_in >= n_cols), so a
 * fused (n_rows, 2*n_cols) [gate | up] GEMM output is passed as gate=buf, up=buf+n_cols,
 * ld_in=2*n_cols. out may alias gate when ld_in == n_cols. */
int ty_cuda_silu_mul_f32(float *out, const float *gate, const float *up, int n_rows, int n_cols,
                         int ld_in, ty_cuda_stream_t stream);

/* gpt-oss's expert activation (ggml's swiglu_oai, alpha 1.702, limit 7; the CPU backend's
 * swiglu_oai): g = min(gate, 7), u = clamp(up, -7, 7), out = g / (1 + exp(1.702 * -g)) *
 * (u + 1). Layout as ty_cuda_silu_mul_f32. */
int ty_cuda_swiglu_oai_f32(float *out, const float *gate, const float *up, int n_rows,
                           int n_cols, int ld_in, ty_cuda_stream_t stream);

/* y[r][:] += bias[:] for each of n_rows rows of n_cols (a projection's bias). */
int ty_cuda_add_bias_f32(float *y, const float *bias, int n_rows, int n_cols,
                         ty_cuda_stream_t stream);

/* Element type conversion of n elements: f32 -> f16/bf16 (round to nearest even), f16/bf16 ->
 * f32, or a plain copy when the types are equal. */
int ty_cuda_convert(void *dst, enum ty_cuda_dtype dst_type, const void *src,
                    enum ty_cuda_dtype src_type, size_t n, ty_cuda_stream_t stream);

/* Embedding lookup: out[t][:] = table[ids[t]][:] as f32. table: (vocab, dim) of `type`;
 * ids: (n_tokens) int32; ids outside [0, vocab) give a row of NaN (the host validates ids
 * before upload; the NaNs make a missed check visible). */
int ty_cuda_embed(float *out, const void *table, enum ty_cuda_dtype type, const int32_t *ids,
                  int n_tokens, int dim, int vocab, ty_cuda_stream_t stream);

/* ---- rotary position embedding (rope.cu) -------------------------------------------------- */

struct ty_cuda_rope {
    int head_dim;  /* elements per head (even) */
    int rot_dim;   /* leading elements of each head that rotate (even, <= head_dim); 0 = head_dim */
    float theta;   /* base, e.g. 10000 or 500000 */
    int neox;      /* 0: pairs (2i, 2i+1) (GPT-J / GGUF llama); 1: pairs (i, i + rot_dim/2)
                    * (GPT-NeoX / Hugging Face llama) */
    /* llama3 frequency scaling (Meta's Llama 3.1 reference, apply_scaling): on when factor > 0 */
    float llama3_factor;
    float llama3_low_freq_factor;
    float llama3_high_freq_factor;
    int llama3_orig_max_pos;
};

/* Rotates x in place: x (n_tokens, n_heads, head_dim) f32, pos (n_tokens) int32 positions.
 * Pair j (j < rot_dim/2) rotates by angle pos * inv_freq_j, inv_freq_j = theta^(-2j/rot_dim)
 * (then llama3-scaled). Called once for q and once for k. */
int ty_cuda_rope_f32(float *x, const int32_t *pos, int n_tokens, int n_heads,
                     const struct ty_cuda_rope *rope, ty_cuda_stream_t stream);

/* ---- mixture of experts (moe.cu) ---------------------------------------------------------- */

/* Routing as the CPU backend's moe_route for softmax gating (Qwen3-MoE, Mixtral): each row of
 * logits (n_tokens, n_experts) becomes its softmax (max subtracted, double sum; overwritten and
 * then used as scratch), the n_used most probable experts (ties to the lower index, most
 * probable first) go to sel (n_tokens, n_used) and their probabilities to w (n_tokens,
 * n_used), divided by their sum (at least 2^-14) when norm_topk. One thread per token. */
int ty_cuda_moe_route(int32_t *sel, float *w, float *logits, int n_tokens, int n_experts,
                      int n_used, int norm_topk, ty_cuda_stream_t stream);

/* gpt-oss's routing (llama.cpp's SOFTMAX_WEIGHT gating; moe_topk_softmax in the CPU's
 * moe_route): logits plus bias (n_experts, or NULL), the n_used largest (ties to the lower
 * index), their softmax the weights (then divided by the picked logits' sum when norm_topk,
 * as the CPU does). logits are overwritten. */
int ty_cuda_moe_route_topk_softmax(int32_t *sel, float *w, float *logits, const float *bias,
                                   int n_tokens, int n_experts, int n_used, int norm_topk,
                                   ty_cuda_stream_t stream);

/* DeepSeek-V2/V3 routing (the CPU backend's route_deepseek, llama.cpp's build_moe_ffn for
 * deepseek2): p = sigmoid(logits) (sigmoid 1) or their softmax (0, max subtracted); selection
 * scores s = p + bias[e] (bias: device (n_experts) or NULL for 0); with n_groups > 1 and
 * n_groups_used < n_groups, only the n_groups_used groups (n_experts / n_groups consecutive
 * experts each) with the largest sums of their two best s (the best alone for one-expert
 * groups; ties to the lower group) stay eligible; the n_used largest eligible s (ties to the
 * lower index, best first) go to sel, their p to w, divided by the sum of those p (at least
 * 2^-14) when norm_topk, then times scale. logits (n_tokens, n_experts) are overwritten. */
int ty_cuda_moe_route_deepseek(int32_t *sel, float *w, float *logits, const float *bias,
                               int n_tokens, int n_experts, int n_used, int sigmoid,
                               int n_groups, int n_groups_used, int norm_topk, float scale,
                               ty_cuda_stream_t stream);

/* Per-slot expert product: y[s][:] (n_slots, rows) = W_{sel[s]} x[s / x_div], W the
 * (n_experts * rows, cols) row-major stack of every expert's (rows, cols) matrix of `type`,
 * x f32 rows of cols (x_div = n_used: each token's row for all its slots; 1: a row per slot).
 * sel: device int32 (n_slots), each in [0, n_experts) (the route kernel's output). */
int ty_cuda_moe_matvec(float *y, const float *x, int x_div, const void *w,
                       enum ty_cuda_dtype type, const int32_t *sel, int n_slots, int rows,
                       int cols, ty_cuda_stream_t stream);

/* The same plus a per-expert bias: y[s][r] += bias[sel[s] * rows + r] (bias (n_experts,
 * rows) f32, added after the product as the CPU adds gpt-oss's expert biases). */
int ty_cuda_moe_matvec_bias(float *y, const float *x, int x_div, const void *w,
                            enum ty_cuda_dtype type, const float *bias, const int32_t *sel,
                            int n_slots, int rows, int cols, ty_cuda_stream_t stream);

/* x[t][:] += sum over k in order of w[t][k] * ys[t * n_used + k][:], each product rounded
 * first (the CPU backend's scaled slots summed in slot order). x (n_tokens, dim), ys
 * (n_tokens * n_used, dim), w (n_tokens, n_used). */
int ty_cuda_moe_combine(float *x, const float *ys, const float *w, int n_tokens, int n_used,
                        int dim, ty_cuda_stream_t stream);

/* The same with slot s's output at row rows[s] of ys (device int32 (n_tokens * n_used); the
 * slots grouped by expert, as per-expert GEMMs leave them). */
int ty_cuda_moe_combine_rows(float *x, const float *ys, const float *w, const int32_t *rows,
                             int n_tokens, int n_used, int dim, ty_cuda_stream_t stream);

/* ---- KV pages (kv.cu) --------------------------------------------------------------------- */

struct ty_cuda_kv_layout {
    enum ty_cuda_dtype type; /* element type of the pool */
    int n_kv_heads;
    int page_tokens; /* B */
    int head_dim;
    int n_pages; /* pages in the pool (bounds for page ids) */
};

/* Bytes of one page of one of K or V in one layer: n_kv_heads * page_tokens * head_dim * elem. */
size_t ty_cuda_kv_page_bytes(const struct ty_cuda_kv_layout *l);

/* Writes new tokens' K and V (f32, (n_tokens, n_kv_heads, head_dim)) into the pool arrays
 * k_pool/v_pool at slots[t] = page * page_tokens + offset (int32). A negative slot skips the
 * token (padding). Slots must lie inside the pool; the host checks that. */
int ty_cuda_kv_write(void *k_pool, void *v_pool, const struct ty_cuda_kv_layout *l,
                     const float *k_new, const float *v_new, const int32_t *slots, int n_tokens,
                     ty_cuda_stream_t stream);

/* Gather (to_pool = 0): contig[i] = pool[pages[i]] for i < n; scatter (to_pool = 1): the
 * reverse. One "page" is ty_cuda_kv_page_bytes() bytes; contig is n such pages back to back.
 * This is how one layer's K (or V) of one request is moved to and from the transfer engine's
 * contiguous buffers. pages: device int32 ids. */
int ty_cuda_kv_copy_pages(void *pool, void *contig, const int32_t *pages, int n, size_t page_bytes,
                          int to_pool, ty_cuda_stream_t stream);

/* ---- fused q|k|v post-processing (qkv.cu) ------------------------------------------------ */

struct ty_cuda_qkv {
    int n_heads, n_kv_heads, head_dim;
    int neox;              /* rope pairs: 0 (2i, 2i+1) (GGUF llama), 1 (i, i + head_dim/2) */
    int hf_order;          /* q/k rows come in HF rotate_half order: projection elements i and
                            * head_dim/2 + i hold what the interleaved layout keeps at 2i, 2i+1
                            * (reordered before rotating, as the CPU backend does) */
    float theta_scale;     /* rope_theta^(-2/head_dim) */
    const float *freq_div; /* device (head_dim/2): per-pair divisors (1 = no scaling) */
    /* Qwen3's per-head RMSNorm of q and k before rope: device (head_dim) weights each, both
     * NULL for none; applied after the bias and before any reordering (the weights follow
     * the projection's row order) */
    const float *q_norm, *k_norm;
    float norm_eps;
    /* YaRN (ggml's rope_yarn, the CPU backend's ty__cpu_rope): device (head_dim/2) per-pair
     * mix, the host's table (model.c make_yarn) as is, or NULL for none. With it pair i's
     * angle t = theta_i / freq_div[i] becomes t' = ((yarn_freq_scale * t) * (1 - mix[i])) +
     * t * mix[i], and cos/sin are multiplied by yarn_mscale. */
    const float *yarn_mix;
    float yarn_freq_scale, yarn_mscale;
};

/* From the fused projection qkv (n_tokens, Q + 2*KV) f32, Q = n_heads*head_dim and KV =
 * n_kv_heads*head_dim, plus an optional bias (Q + 2*KV; NULL = none) and optional q/k norms:
 * writes q_out
 * (n_tokens, n_heads, head_dim) rotated, and K (rotated) and V into the pool arrays at
 * slots[t] (negative: skipped). Pair i of token t rotates by angle theta_i / freq_div[i] with
 * theta_0 = pos[t], theta_{i+1} = theta_i * theta_scale computed in f32 (ggml's recurrence, so
 * that results follow the CPU backend to the last bits of the angle), YaRN-mixed when
 * q->yarn_mix is set. */
int ty_cuda_qkv_rope_store(float *q_out, void *k_pool, void *v_pool,
                           const struct ty_cuda_kv_layout *l, const float *qkv, const float *bias,
                           const int32_t *pos, const int32_t *slots, int n_tokens,
                           const struct ty_cuda_qkv *q, ty_cuda_stream_t stream);

/* ---- attention (attn_decode.cu, attn_prefill.cu) ----------------------------------------- */

struct ty_cuda_attn_shape {
    int n_heads;
    int n_kv_heads;
    int head_dim;       /* multiple of 4, <= 256 */
    float scale;        /* usually 1/sqrt(head_dim) */
    int max_pages;      /* row length of block_tables */
    int window;         /* sliding window: a query at position p sees keys p - window + 1 .. p
                         * (llama.cpp's mask); 0 = all. Keys before it are never read, so their
                         * block-table entries may name any page. */
};

/* Decode attention (one new query token per sequence), split over the context for long
 * sequences (flash-decoding, Dao et al. 2023) and reduced in a second kernel.
 * q, out: (n_seqs, n_heads, head_dim) f32; block_tables: (n_seqs, max_pages) int32;
 * seq_lens: (n_seqs) int32, tokens in the KV cache including the current one (>= 1);
 * max_seq_len (host value) bounds seq_lens and sizes the split; workspace: at least
 * ty_cuda_attn_decode_workspace() bytes (may be NULL when that is 0). */
size_t ty_cuda_attn_decode_workspace(const struct ty_cuda_attn_shape *s, int n_seqs,
                                     int max_seq_len);
int ty_cuda_attn_decode(float *out, const float *q, const void *k_pool, const void *v_pool,
                        const struct ty_cuda_kv_layout *l, const struct ty_cuda_attn_shape *s,
                        const int32_t *block_tables, const int32_t *seq_lens, int n_seqs,
                        int max_seq_len, void *workspace, ty_cuda_stream_t stream);

/* Prefill attention, causal (and within s->window), over a batch of query chunks (FlashAttention-2 style online
 * softmax, Dao 2023). Chunk s has q_lens[s] query rows starting at row q_starts[s] of q/out and
 * attends to the first kv_lens[s] tokens of its sequence (which already include its own new
 * tokens): query row i of chunk s has position kv_lens[s] - q_lens[s] + i and sees positions
 * <= that. q, out: (total_rows, n_heads, head_dim) f32; block_tables (n_chunks, max_pages);
 * max_q_len (host) bounds q_lens. f16/bf16 pools with head_dim 64/128 and no window run on
 * tensor cores (wgmma on sm_90 for page sizes that tile when TYCHO_CUDA_SM90_PREFILL=1, else
 * mma.sync; q and the softmax
 * weights rounded to the pool type), everything else in f32 on CUDA cores. */
int ty_cuda_attn_prefill(float *out, const float *q, const void *k_pool, const void *v_pool,
                         const struct ty_cuda_kv_layout *l, const struct ty_cuda_attn_shape *s,
                         const int32_t *block_tables, const int32_t *q_starts,
                         const int32_t *q_lens, const int32_t *kv_lens, int n_chunks,
                         int max_q_len, ty_cuda_stream_t stream);

/* The key range of each row of a forward's q block, as the two attention kernels take them:
 * rows 0 .. n_decode-1 are single-token sequences (row i's block table at decode_tables + i *
 * decode_max_pages), the rest prefill chunks (chunk c's rows from chunk_q_starts[c], its
 * table at chunk_tables + c * chunk_max_pages; starts ascending). A row at position p sees
 * keys first .. p of its sequence (first: p - window + 1 for a sliding window, else 0). */
struct ty_cuda_attn_rows {
    int n_decode;
    const int32_t *decode_tables;
    int decode_max_pages;
    int n_chunks;
    const int32_t *chunk_tables, *chunk_q_starts;
    int chunk_max_pages;
};

/* Attention sinks (gpt-oss; attn_sink.cu): out (n_rows, n_heads, head_dim), the sink-free
 * attention of q (same shape) over the pool, is rescaled in place by S / (S + exp(sinks[h]))
 * with S = sum over the row's keys of exp(q.k * scale): the softmax with the sink logit in
 * its denominator, as the CPU backend's softmax_row. pos: device (n_rows) positions; s:
 * n_heads, n_kv_heads, head_dim (multiple of 4, <= 256), scale and window as the attention
 * kernels took them (max_pages unused). */
int ty_cuda_attn_sinks(float *out, const float *q, const void *k_pool,
                       const struct ty_cuda_kv_layout *l, const struct ty_cuda_attn_shape *s,
                       const float *sinks, const int32_t *pos, int n_rows,
                       const struct ty_cuda_attn_rows *r, ty_cuda_stream_t stream);

/* ---- multi-head latent attention (mla.cu; DeepSeek-V2/V3, the CPU backend's cpu/mla.c) ---- */

/* Shapes: H = n_heads, R = kv_lora_rank, P = rope_dim (even), N = qk_nope_dim. The KV pool holds,
 * per token, one row of R + P values (the RMS-normed latent, then the roped shared key) cut in
 * halves of hh = (R + P) / 2: values 0..hh-1 in the page's K array, hh..2hh-1 in its V array,
 * i.e. a ty_cuda_kv_layout with n_kv_heads 1 and head_dim hh. Rope of the P dims as
 * ty_cuda_qkv's (ggml's angle recurrence theta_0 = pos, theta_{i+1} = theta_i * theta_scale in
 * f32, angle_i = theta_i / freq_div[i], YaRN-mixed when yarn_mix is set; pairs (2i, 2i+1), or
 * (i, i + P/2) when neox). */
struct ty_cuda_mla {
    int n_heads, kv_lora_rank, rope_dim, qk_nope_dim;
    float norm_eps;        /* the latent's RMSNorm epsilon */
    int neox;
    float theta_scale;     /* rope_theta^(-2/P) */
    const float *freq_div; /* device (P/2) */
    const float *yarn_mix; /* device (P/2) or NULL */
    float yarn_freq_scale, yarn_mscale;
};

/* The queries' rope part and the new latent rows. q (n_tokens, H, R + P): the first R values of
 * each head (the absorbed queries) are left as they are; values R..R+P-1 of head h become
 * rope(qf[t][h][N..N+P-1]) at pos[t], qf (n_tokens, H, N + P) the heads' full queries. kv
 * (n_tokens, R + P), wkv_a's output: its first R values RMS-normed with norm (device (R) f32
 * weights, x * rsqrt(mean(x^2) + eps) * w), its last P roped at pos[t], the row stored into the
 * pool at slots[t] (negative: skipped) rounded to the pool type; kv is left unchanged. */
int ty_cuda_mla_rope_store(float *q, const float *qf, const float *kv, const float *norm,
                           void *k_pool, void *v_pool, const struct ty_cuda_kv_layout *l,
                           const int32_t *pos, const int32_t *slots, int n_tokens,
                           const struct ty_cuda_mla *m, ty_cuda_stream_t stream);

/* Attention of the absorbed queries over the pool's latent rows (multi-query: one shared row per
 * key). Row i of q (n_rows, H, R + P), at position pos[i], head h: scores s_j = (q . row_j) *
 * scale for keys j = 0..pos[i] of the row's sequence (block tables as r gives them, see
 * ty_cuda_attn_rows; no window), softmax over j, and out[i][h][:] (n_rows, H, R) = sum_j p_j *
 * row_j[0..R-1] (the latent part of each row). f32 accumulation. */
int ty_cuda_mla_attn(float *out, const float *q, const void *k_pool, const void *v_pool,
                     const struct ty_cuda_kv_layout *l, const struct ty_cuda_mla *m, float scale,
                     const int32_t *pos, int n_rows, const struct ty_cuda_attn_rows *r,
                     ty_cuda_stream_t stream);

/* ---- sampling (sample.cu) ----------------------------------------------------------------- */

/* ids[r] = argmax_i logits[r][i] (the lowest index among equal maxima). logits (n_rows, vocab). */
int ty_cuda_sample_greedy(int32_t *ids, const float *logits, int n_rows, int vocab,
                          ty_cuda_stream_t stream);

/* Temperature + top-k + top-p sampling, one row per block. For row r with t = temp[r]:
 * t <= 0 is greedy; else x_i = logits_i / t, p_i ~ exp(x_i - max x). top_k[r] in [1, vocab)
 * keeps the tokens whose x is >= the k-th largest x (ties at the boundary all kept), others
 * keep all; top_p[r] < 1 then keeps the smallest set of most probable kept tokens whose mass
 * is >= top_p (ties at the boundary kept). The sample is the first index i, in index order,
 * where the running kept mass exceeds u[r] * (total kept mass), u[r] in [0, 1) drawn by the
 * caller (so a seed reproduces a run). All arrays device, length n_rows. */
int ty_cuda_sample_topkp(int32_t *ids, const float *logits, const float *temp,
                         const int32_t *top_k, const float *top_p, const float *u, int n_rows,
                         int vocab, ty_cuda_stream_t stream);

/* A whole draw per row (the engine's struct ty_row_draw, tycho/sampling.h): adjustments
 * adj[adj_begin .. adj_begin + n_adj) of the row, one per token id: l = (l > 0 ? l / rep :
 * l * rep) - sub + bias (bias -inf bans); then temperature <= 0 is the argmax, else top_k
 * (0: off), top_p (in (0, 1), else off) and min_p (> 0: keep p >= min_p x p_max) cut as in
 * ty_cuda_sample_topkp and the pick with u. logprob / n_top (<= TY_CUDA_MAX_TOP): the chosen
 * token's log-probability and the n_top best under the adjusted row at temperature 1. */
#define TY_CUDA_MAX_TOP 20
struct ty_cuda_draw {
    float temperature, top_p, min_p, u;
    int32_t top_k, adj_begin, n_adj, n_top, logprob;
};
struct ty_cuda_logit_adj {
    int32_t id;
    float rep, sub, bias;
};
struct ty_cuda_draw_out {
    int32_t id;
    float logprob;
    int32_t n_top;
    int32_t top_id[TY_CUDA_MAX_TOP];
    float top_lp[TY_CUDA_MAX_TOP];
};
/* logits (n_rows, vocab) are adjusted in place; draws, adj and out are device arrays. */
int ty_cuda_sample_draws(struct ty_cuda_draw_out *out, float *logits,
                         const struct ty_cuda_draw *draws, const struct ty_cuda_logit_adj *adj,
                         int n_rows, int vocab, ty_cuda_stream_t stream);

/* ---- projections (gemm.cu) ---------------------------------------------------------------- */

/* y = x W^T through cuBLAS: W (n_out, n_in) row-major of w_type (the GGUF/HF layout);
 * x (n_rows, n_in) of the same type as W (convert f32 activations with ty_cuda_convert first
 * when W is 16-bit); y (n_rows, n_out) f32, overwritten (beta = 0). f32 runs in full f32
 * (no TF32); f16/bf16 accumulate in f32. The handle must be bound to the caller's stream. */
int ty_cuda_gemm(ty_cublas_t h, float *y, const void *x, const void *w, enum ty_cuda_dtype w_type,
                 int n_rows, int n_in, int n_out);

/* One small product per head, through one strided batched cuBLAS call (MLA's per-head k_b and
 * v_b): for b < batch, y_b (n_rows, n_out) = x_b (n_rows, n_in) . W_b^T (trans_w 0: W_b
 * (n_out, n_in) row-major) or x_b . W_b (trans_w 1: W_b (n_in, n_out) row-major). x_b starts
 * at element b * x_head of x (of w_type) with rows ldx elements apart; W_b at element b * w_head
 * of w, rows ldw apart; y_b (f32, overwritten) at b * y_head of y, rows ldy apart. Accumulation
 * as ty_cuda_gemm. */
int ty_cuda_gemm_heads(ty_cublas_t h, float *y, int ldy, long long y_head, const void *x,
                       int ldx, long long x_head, const void *w, enum ty_cuda_dtype w_type,
                       int ldw, long long w_head, int trans_w, int n_rows, int n_in, int n_out,
                       int batch);

#ifdef __cplusplus
}
#endif

#endif
