/* Writes the seed corpus of fuzz_gguf with the project's own GGUF writer (gguf_write.c):
 *   llama_spm_f32.gguf   1-layer Llama, F32, tied output, SentencePiece tokenizer metadata
 *   qwen2_bpe_f16.gguf   1-layer Qwen2, F16 matrices, q/k/v biases, untied output,
 *                        rope_freqs, GPT-2 BPE tokenizer with merges, chat template
 *   llama_q8_0.gguf      1-layer Llama with Q8_0 matrices (dim 32), linear rope scaling
 *   llama_q4_0.gguf      the same with Q4_0 matrices
 *   qwen3moe_q8_0.gguf   1-layer Qwen3-MoE (q/k norms, head_dim 16), an F32 router over 4
 *                        experts, 2 used, 3-D Q8_0 expert tensors (ffn_{gate,up,down}_exps)
 *   all_types.gguf       one metadata entry of every GGUF value type and array element type,
 *                        tensors of 1 to 4 dimensions in F32/F16/BF16/Q8_0/Q4_0/Q4_K/Q5_K/Q6_K/MXFP4,
 *                        no model keys
 * Usage: gen_gguf_seeds OUT_DIR. Tensor bytes are a fixed pseudo-random pattern (F32/F16/BF16
 * values kept finite and small). Every file stays well under 64 KiB. */
#include "tycho/gguf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tdesc {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
};

static int fill(void *arg, uint64_t index, uint64_t offset, void *buf, size_t len)
{
    (void)arg;
    unsigned char *p = buf;
    for (size_t i = 0; i < len; i++) {
        uint64_t k = index * 7919u + offset + i;
        /* little-endian halves 0x3c.. / 0x3f.. keep F16, BF16 and F32 values near 1 */
        p[i] = (k % 2) ? (unsigned char)(0x3c + k % 3) : (unsigned char)(k * 37u);
    }
    return 0;
}

static int add_tensors(ty_gguf_writer_t *w, const struct tdesc *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ty_gguf_writer_tensor(w, t[i].name, t[i].type, t[i].n_dims, t[i].ne))
            return -1;
    return 0;
}

/* Raw metadata entry: key, type, payload. */
static void raw_kv(ty_gguf_writer_t *w, const char *key, uint32_t type, const void *v, size_t n)
{
    unsigned char buf[512];
    uint64_t kl = strlen(key);
    memcpy(buf, &kl, 8);
    memcpy(buf + 8, key, kl);
    memcpy(buf + 8 + kl, &type, 4);
    memcpy(buf + 12 + kl, v, n);
    ty_gguf_writer_kv_raw(w, buf, 12 + kl + n);
}

/* String array entry from NUL-terminated strings. */
static void str_arr(ty_gguf_writer_t *w, const char *key, const char *const *s, size_t n)
{
    unsigned char buf[1024];
    uint32_t et = TY_GGUF_STRING;
    uint64_t cnt = n;
    size_t off = 0;
    memcpy(buf, &et, 4);
    memcpy(buf + 4, &cnt, 8);
    off = 12;
    for (size_t i = 0; i < n; i++) {
        uint64_t l = strlen(s[i]);
        memcpy(buf + off, &l, 8);
        memcpy(buf + off + 8, s[i], l);
        off += 8 + l;
    }
    raw_kv(w, key, TY_GGUF_ARRAY, buf, off);
}

/* Numeric array entry. */
static void num_arr(ty_gguf_writer_t *w, const char *key, uint32_t et, const void *v, size_t n,
                    size_t es)
{
    unsigned char buf[512];
    uint64_t cnt = n;
    memcpy(buf, &et, 4);
    memcpy(buf + 4, &cnt, 8);
    memcpy(buf + 12, v, n * es);
    raw_kv(w, key, TY_GGUF_ARRAY, buf, 12 + n * es);
}

static void hparams(ty_gguf_writer_t *w, const char *arch, uint32_t dim, uint32_t heads,
                    uint32_t kv, uint32_t ffn, uint32_t vocab)
{
    char k[96];
    ty_gguf_writer_kv_str(w, "general.architecture", arch);
    ty_gguf_writer_kv_u32(w, "general.alignment", 32);
#define KV(name, v) (snprintf(k, sizeof(k), "%s." name, arch), ty_gguf_writer_kv_u32(w, k, v))
    KV("embedding_length", dim);
    KV("block_count", 1);
    KV("attention.head_count", heads);
    KV("attention.head_count_kv", kv);
    KV("feed_forward_length", ffn);
    KV("context_length", 64);
    KV("vocab_size", vocab);
#undef KV
    snprintf(k, sizeof(k), "%s.attention.layer_norm_rms_epsilon", arch);
    ty_gguf_writer_kv_f32(w, k, 1e-5f);
    snprintf(k, sizeof(k), "%s.rope.freq_base", arch);
    ty_gguf_writer_kv_f32(w, k, 10000.0f);
}

/* The tensors of a one-layer model; mt = type of the matrices. */
static int layer_tensors(ty_gguf_writer_t *w, uint32_t mt, uint64_t dim, uint64_t q, uint64_t kv,
                         uint64_t ffn, uint64_t vocab, int bias, int untied)
{
    struct tdesc t[] = {
        {"token_embd.weight", mt, 2, {dim, vocab}},
        {"output_norm.weight", TY_GGML_F32, 1, {dim}},
        {"blk.0.attn_norm.weight", TY_GGML_F32, 1, {dim}},
        {"blk.0.attn_q.weight", mt, 2, {dim, q}},
        {"blk.0.attn_k.weight", mt, 2, {dim, kv}},
        {"blk.0.attn_v.weight", mt, 2, {dim, kv}},
        {"blk.0.attn_output.weight", mt, 2, {q, dim}},
        {"blk.0.ffn_norm.weight", TY_GGML_F32, 1, {dim}},
        {"blk.0.ffn_gate.weight", mt, 2, {dim, ffn}},
        {"blk.0.ffn_up.weight", mt, 2, {dim, ffn}},
        {"blk.0.ffn_down.weight", mt, 2, {ffn, dim}},
        {"blk.0.attn_q.bias", TY_GGML_F32, 1, {q}},
        {"blk.0.attn_k.bias", TY_GGML_F32, 1, {kv}},
        {"blk.0.attn_v.bias", TY_GGML_F32, 1, {kv}},
        {"output.weight", mt, 2, {dim, vocab}},
    };
    if (add_tensors(w, t, 11) || (bias && add_tensors(w, t + 11, 3)) ||
        (untied && add_tensors(w, t + 14, 1)))
        return -1;
    return 0;
}

static int write_seed(ty_gguf_writer_t *w, const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int rc = ty_gguf_writer_write(w, path, fill, NULL);
    ty_gguf_writer_free(w);
    if (rc)
        fprintf(stderr, "gen_gguf_seeds: %s: error %d\n", path, rc);
    return rc;
}

static int llama_spm(const char *dir)
{
    ty_gguf_writer_t *w;
    if (ty_gguf_writer_new(&w))
        return -1;
    hparams(w, "llama", 8, 2, 1, 16, 8);
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "<0x41>",
                                       "\xe2\x96\x81", "a", "\xe2\x96\x81\x61", "b"};
    float scores[8] = {0, 0, 0, 0, -1, -2, -1.5f, -3};
    int32_t types[8] = {2, 3, 3, 6, 1, 1, 1, 1};
    ty_gguf_writer_kv_str(w, "tokenizer.ggml.model", "llama");
    str_arr(w, "tokenizer.ggml.tokens", toks, 8);
    num_arr(w, "tokenizer.ggml.scores", TY_GGUF_FLOAT32, scores, 8, 4);
    num_arr(w, "tokenizer.ggml.token_type", TY_GGUF_INT32, types, 8, 4);
    ty_gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", 1);
    ty_gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
    ty_gguf_writer_kv_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (layer_tensors(w, TY_GGML_F32, 8, 8, 4, 16, 8, 0, 0))
        return -1;
    return write_seed(w, dir, "llama_spm_f32.gguf");
}

static int qwen2_bpe(const char *dir)
{
    ty_gguf_writer_t *w;
    if (ty_gguf_writer_new(&w))
        return -1;
    hparams(w, "qwen2", 8, 2, 2, 16, 8);
    static const char *const toks[] = {"a", "b", "\xc4\xa0", "ab", "\xc4\xa0\x61",
                                       "<|im_start|>", "<|im_end|>", "<|endoftext|>"};
    static const char *const merges[] = {"a b", "\xc4\xa0 a"};
    int32_t types[8] = {1, 1, 1, 1, 1, 3, 3, 3};
    ty_gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2");
    ty_gguf_writer_kv_str(w, "tokenizer.ggml.pre", "qwen2");
    str_arr(w, "tokenizer.ggml.tokens", toks, 8);
    num_arr(w, "tokenizer.ggml.token_type", TY_GGUF_INT32, types, 8, 4);
    str_arr(w, "tokenizer.ggml.merges", merges, 2);
    ty_gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", 6);
    ty_gguf_writer_kv_u32(w, "tokenizer.ggml.eot_token_id", 7);
    ty_gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", false);
    ty_gguf_writer_kv_str(w, "tokenizer.chat_template",
                          "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                          "<|im_end|>\n{% endfor %}<|im_start|>assistant\n");
    struct tdesc rf = {"rope_freqs.weight", TY_GGML_F32, 1, {2}};
    if (layer_tensors(w, TY_GGML_F16, 8, 8, 8, 16, 8, 1, 1) || add_tensors(w, &rf, 1))
        return -1;
    return write_seed(w, dir, "qwen2_bpe_f16.gguf");
}

static int llama_q8(const char *dir)
{
    ty_gguf_writer_t *w;
    if (ty_gguf_writer_new(&w))
        return -1;
    hparams(w, "llama", 32, 2, 1, 32, 4);
    ty_gguf_writer_kv_str(w, "llama.rope.scaling.type", "linear");
    ty_gguf_writer_kv_f32(w, "llama.rope.scaling.factor", 2.0f);
    if (layer_tensors(w, TY_GGML_Q8_0, 32, 32, 16, 32, 4, 0, 0))
        return -1;
    return write_seed(w, dir, "llama_q8_0.gguf");
}

static int llama_q4(const char *dir)
{
    ty_gguf_writer_t *w;
    if (ty_gguf_writer_new(&w))
        return -1;
    hparams(w, "llama", 32, 2, 1, 32, 4);
    if (layer_tensors(w, TY_GGML_Q4_0, 32, 32, 16, 32, 4, 0, 0))
        return -1;
    return write_seed(w, dir, "llama_q4_0.gguf");
}

static int qwen3moe_q8(const char *dir)
{
    ty_gguf_writer_t *w;
    if (ty_gguf_writer_new(&w))
        return -1;
    hparams(w, "qwen3moe", 32, 2, 1, 32, 4);
    ty_gguf_writer_kv_u32(w, "qwen3moe.attention.key_length", 16);
    ty_gguf_writer_kv_u32(w, "qwen3moe.expert_count", 4);
    ty_gguf_writer_kv_u32(w, "qwen3moe.expert_used_count", 2);
    ty_gguf_writer_kv_u32(w, "qwen3moe.expert_feed_forward_length", 32);
    struct tdesc t[] = {
        {"token_embd.weight", TY_GGML_Q8_0, 2, {32, 4}},
        {"output_norm.weight", TY_GGML_F32, 1, {32}},
        {"blk.0.attn_norm.weight", TY_GGML_F32, 1, {32}},
        {"blk.0.attn_q.weight", TY_GGML_Q8_0, 2, {32, 32}},
        {"blk.0.attn_k.weight", TY_GGML_Q8_0, 2, {32, 16}},
        {"blk.0.attn_v.weight", TY_GGML_Q8_0, 2, {32, 16}},
        {"blk.0.attn_output.weight", TY_GGML_Q8_0, 2, {32, 32}},
        {"blk.0.attn_q_norm.weight", TY_GGML_F32, 1, {16}},
        {"blk.0.attn_k_norm.weight", TY_GGML_F32, 1, {16}},
        {"blk.0.ffn_norm.weight", TY_GGML_F32, 1, {32}},
        {"blk.0.ffn_gate_inp.weight", TY_GGML_F32, 2, {32, 4}},
        {"blk.0.ffn_gate_exps.weight", TY_GGML_Q8_0, 3, {32, 32, 4}},
        {"blk.0.ffn_up_exps.weight", TY_GGML_Q8_0, 3, {32, 32, 4}},
        {"blk.0.ffn_down_exps.weight", TY_GGML_Q8_0, 3, {32, 32, 4}},
    };
    if (add_tensors(w, t, sizeof(t) / sizeof(t[0])))
        return -1;
    return write_seed(w, dir, "qwen3moe_q8_0.gguf");
}

static int all_types(const char *dir)
{
    ty_gguf_writer_t *w;
    if (ty_gguf_writer_new(&w))
        return -1;
    uint8_t u8 = 200;
    int8_t i8 = -5;
    uint16_t u16 = 60000;
    int16_t i16 = -300;
    uint32_t u32 = 4000000000u;
    int32_t i32 = -70000;
    float f32 = 0.5f;
    uint8_t b = 1;
    uint64_t u64 = 1ull << 40;
    int64_t i64 = -(1ll << 40);
    double f64 = 3.25;
    raw_kv(w, "t.u8", TY_GGUF_UINT8, &u8, 1);
    raw_kv(w, "t.i8", TY_GGUF_INT8, &i8, 1);
    raw_kv(w, "t.u16", TY_GGUF_UINT16, &u16, 2);
    raw_kv(w, "t.i16", TY_GGUF_INT16, &i16, 2);
    raw_kv(w, "t.u32", TY_GGUF_UINT32, &u32, 4);
    raw_kv(w, "t.i32", TY_GGUF_INT32, &i32, 4);
    raw_kv(w, "t.f32", TY_GGUF_FLOAT32, &f32, 4);
    raw_kv(w, "t.bool", TY_GGUF_BOOL, &b, 1);
    ty_gguf_writer_kv_str(w, "t.str", "h\xc3\xa9llo");
    ty_gguf_writer_kv_str(w, "t.empty", "");
    raw_kv(w, "t.u64", TY_GGUF_UINT64, &u64, 8);
    raw_kv(w, "t.i64", TY_GGUF_INT64, &i64, 8);
    raw_kv(w, "t.f64", TY_GGUF_FLOAT64, &f64, 8);
    uint8_t a8[3] = {1, 2, 3};
    int16_t a16[2] = {-1, 1};
    int32_t a32[2] = {-2, 2};
    float af[2] = {1.5f, -0.25f};
    uint64_t a64[2] = {0, UINT64_MAX};
    double ad[1] = {-1e300};
    num_arr(w, "a.u8", TY_GGUF_UINT8, a8, 3, 1);
    num_arr(w, "a.bool", TY_GGUF_BOOL, a8, 3, 1);
    num_arr(w, "a.i16", TY_GGUF_INT16, a16, 2, 2);
    num_arr(w, "a.i32", TY_GGUF_INT32, a32, 2, 4);
    num_arr(w, "a.f32", TY_GGUF_FLOAT32, af, 2, 4);
    num_arr(w, "a.u64", TY_GGUF_UINT64, a64, 2, 8);
    num_arr(w, "a.f64", TY_GGUF_FLOAT64, ad, 1, 8);
    num_arr(w, "a.empty", TY_GGUF_UINT32, a32, 0, 4);
    static const char *const strs[] = {"x", "", "yz"};
    str_arr(w, "a.str", strs, 3);
    struct tdesc t[] = {
        {"v1", TY_GGML_F32, 1, {3}},
        {"m2", TY_GGML_F16, 2, {4, 3}},
        {"c3", TY_GGML_BF16, 3, {2, 2, 2}},
        {"q4", TY_GGML_Q8_0, 4, {32, 1, 2, 1}},
        {"q40", TY_GGML_Q4_0, 2, {64, 2}},
        {"q4k", TY_GGML_Q4_K, 1, {256}},
        {"q5k", TY_GGML_Q5_K, 2, {256, 1}},
        {"q6k", TY_GGML_Q6_K, 3, {256, 1, 2}},
        {"mx4", TY_GGML_MXFP4, 2, {32, 3}},
    };
    if (add_tensors(w, t, 9))
        return -1;
    return write_seed(w, dir, "all_types.gguf");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_gguf_seeds OUT_DIR\n");
        return 2;
    }
    return llama_spm(argv[1]) || qwen2_bpe(argv[1]) || llama_q8(argv[1]) || llama_q4(argv[1]) ||
           qwen3moe_q8(argv[1]) || all_types(argv[1]);
}
