/* `tycho mkmodel`: write a random-weight Llama GGUF of a given shape, with the tokenizer
 * metadata copied from an existing GGUF so the file loads in llama.cpp too. Used to measure
 * speed at real sizes against other engines on the very same file. */
#include "cli.h"

#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/hash.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dims {
    uint32_t dim, layers, heads, kv_heads, ffn, vocab, ctx;
    bool tied;
};

static const struct {
    const char *name;
    struct dims d;
} presets[] = {
    /* ~110M: llama2.c's stories110M shape, tied embeddings over the 32k Llama-2 vocab */
    {"110m", {768, 12, 12, 12, 2048, 32000, 1024, true}},
    /* ~1.1B: TinyLlama-1.1B shape (GQA 32/4) */
    {"1b", {2048, 22, 32, 4, 5632, 32000, 2048, false}},
    /* a small file for tests */
    {"tiny", {64, 2, 4, 2, 128, 32000, 256, true}},
};

struct fill_ctx {
    uint64_t seed;
    uint32_t type; /* of matrices */
    uint64_t *kinds; /* per tensor: 0 matrix (random), 1 norm (ones) */
    float scale;
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

static float rand_weight(const struct fill_ctx *c, uint64_t i, uint64_t e)
{
    uint64_t r = ty_hash_mix64(c->seed ^ (i << 40) ^ e * 0x9e3779b97f4a7c15ull);
    return ((float)(r >> 40) / (float)(1u << 24) * 2.0f - 1.0f) * c->scale;
}

/* Q8_0 bytes [off, off + len) of tensor i: blocks of 32 elements quantized as ggml does
 * (d = max |x| / 127 stored as f16, q = round(x / d)), each block made whole, then cut. */
static void fill_q8_0(const struct fill_ctx *c, uint64_t i, uint64_t off, unsigned char *buf,
                      size_t len)
{
    for (uint64_t b = off / 34; b * 34 < off + len; b++) {
        unsigned char blk[34];
        float x[32], amax = 0;
        for (int j = 0; j < 32; j++) {
            x[j] = rand_weight(c, i, b * 32 + (uint64_t)j);
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        }
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        uint16_t dh = float_to_half(d);
        memcpy(blk, &dh, 2);
        for (int j = 0; j < 32; j++)
            blk[2 + j] = (unsigned char)(int8_t)lrintf(x[j] * id);
        uint64_t from = off > b * 34 ? off - b * 34 : 0;
        uint64_t to = off + len < (b + 1) * 34 ? off + len - b * 34 : 34;
        memcpy(buf + (b * 34 + from - off), blk + from, to - from);
    }
}

/* Element e of tensor i: uniform in [-scale, scale] (std scale/sqrt 3), or 1 for norms. */
static int fill(void *arg, uint64_t i, uint64_t off, void *buf, size_t len)
{
    struct fill_ctx *c = arg;
    bool norm = c->kinds[i] == 1;
    if (!norm && c->type == TY_GGML_Q8_0) {
        fill_q8_0(c, i, off, buf, len);
        return 0;
    }
    size_t esz = norm || c->type == TY_GGML_F32 ? 4 : 2;
    uint64_t e0 = off / esz;
    for (size_t k = 0; k < len / esz; k++) {
        float v = norm ? 1.0f : rand_weight(c, i, e0 + k);
        if (esz == 4) {
            memcpy((char *)buf + k * 4, &v, 4);
        } else {
            uint16_t h = float_to_half(v);
            memcpy((char *)buf + k * 2, &h, 2);
        }
    }
    return 0;
}

static int add_kv(ty_gguf_writer_t *w, const struct dims *d, uint32_t type)
{
    int rc = 0;
    rc |= ty_gguf_writer_kv_str(w, "general.architecture", "llama");
    rc |= ty_gguf_writer_kv_str(w, "general.name", "tycho-mkmodel random");
    rc |= ty_gguf_writer_kv_u32(w, "general.file_type",
                                type == TY_GGML_F16 ? 1 : type == TY_GGML_Q8_0 ? 7 : 0);
    rc |= ty_gguf_writer_kv_u32(w, "llama.context_length", d->ctx);
    rc |= ty_gguf_writer_kv_u32(w, "llama.embedding_length", d->dim);
    rc |= ty_gguf_writer_kv_u32(w, "llama.block_count", d->layers);
    rc |= ty_gguf_writer_kv_u32(w, "llama.feed_forward_length", d->ffn);
    rc |= ty_gguf_writer_kv_u32(w, "llama.attention.head_count", d->heads);
    rc |= ty_gguf_writer_kv_u32(w, "llama.attention.head_count_kv", d->kv_heads);
    rc |= ty_gguf_writer_kv_u32(w, "llama.rope.dimension_count", d->dim / d->heads);
    rc |= ty_gguf_writer_kv_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    rc |= ty_gguf_writer_kv_f32(w, "llama.rope.freq_base", 10000.0f);
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

static int add_tensors(ty_gguf_writer_t *w, const struct dims *d, uint32_t type, uint64_t *kinds)
{
    uint32_t hd = d->dim / d->heads, kv = d->kv_heads * hd;
    uint64_t n = 0;
    int rc = 0;
#define T(name, ty, nd, a, b, kind)                                                               \
    do {                                                                                          \
        uint64_t ne[2] = {(a), (b)};                                                              \
        kinds[n++] = (kind);                                                                      \
        rc = rc ? rc : ty_gguf_writer_tensor(w, name, ty, nd, ne);                                \
    } while (0)
    T("token_embd.weight", type, 2, d->dim, d->vocab, 0);
    T("output_norm.weight", TY_GGML_F32, 1, d->dim, 1, 1);
    if (!d->tied)
        T("output.weight", type, 2, d->dim, d->vocab, 0);
    char nm[64];
    for (uint32_t l = 0; l < d->layers; l++) {
#define LT(suffix, ty, nd, a, b, kind)                                                            \
    snprintf(nm, sizeof(nm), "blk.%u.%s", l, suffix);                                             \
    T(nm, ty, nd, a, b, kind)
        LT("attn_norm.weight", TY_GGML_F32, 1, d->dim, 1, 1);
        LT("attn_q.weight", type, 2, d->dim, d->dim, 0);
        LT("attn_k.weight", type, 2, d->dim, kv, 0);
        LT("attn_v.weight", type, 2, d->dim, kv, 0);
        LT("attn_output.weight", type, 2, d->dim, d->dim, 0);
        LT("ffn_norm.weight", TY_GGML_F32, 1, d->dim, 1, 1);
        LT("ffn_gate.weight", type, 2, d->dim, d->ffn, 0);
        LT("ffn_down.weight", type, 2, d->ffn, d->dim, 0);
        LT("ffn_up.weight", type, 2, d->dim, d->ffn, 0);
#undef LT
    }
#undef T
    return rc;
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
               "         --vocab-from TOKENIZER.gguf|bytes --out FILE.gguf [--type f32|f16|q8_0] [--seed S]\n"
               "  --vocab-from bytes: a built-in 259-token byte-fallback vocabulary (no donor file)\n");
}

static int write_model(const struct dims *d, uint32_t type, const char *vocab, const char *out,
                       uint64_t seed)
{
    ty_gguf_writer_t *w;
    struct dims dd = *d;
    uint64_t *kinds = calloc(16 + 9 * (size_t)d->layers, sizeof(uint64_t));
    int rc = ty_gguf_writer_new(&w);
    if (rc || !kinds)
        goto out;
    rc = strcmp(vocab, "bytes") == 0 ? builtin_vocab(w, &dd.vocab) : copy_vocab(w, vocab, &dd.vocab);
    if (rc || (rc = add_kv(w, &dd, type)) ||
        (rc = add_tensors(w, &dd, type, kinds)))
        goto out;
    struct fill_ctx fc = {seed, type, kinds, 0.02f * sqrtf(3.0f)};
    rc = ty_gguf_writer_write(w, out, fill, &fc);
out:
    ty_gguf_writer_free(w);
    free(kinds);
    return rc ? rc : (kinds ? 0 : TY_ENOMEM);
}

static int run_mkmodel(int argc, char **argv)
{
    static const struct option opts[] = {{"preset", 1, 0, 'p'}, {"dims", 1, 0, 'd'},
                                         {"vocab-from", 1, 0, 'v'}, {"out", 1, 0, 'o'},
                                         {"type", 1, 0, 't'}, {"seed", 1, 0, 's'},
                                         {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    struct dims d = {0};
    const char *vocab = NULL, *out = NULL;
    uint32_t type = TY_GGML_F32;
    uint64_t seed = 1;
    bool have = false;
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
        case 't':
            if (strcmp(optarg, "f32") && strcmp(optarg, "f16") && strcmp(optarg, "q8_0")) {
                fprintf(stderr, "tycho mkmodel: --type is f32, f16 or q8_0\n");
                return TY_CLI_EXIT_USAGE;
            }
            type = strcmp(optarg, "f16") == 0    ? TY_GGML_F16
                   : strcmp(optarg, "q8_0") == 0 ? TY_GGML_Q8_0
                                                 : TY_GGML_F32;
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
    if (type == TY_GGML_Q8_0 && (d.dim % 32 || d.ffn % 32)) {
        fprintf(stderr, "tycho mkmodel: q8_0 needs dim and ffn to be multiples of 32\n");
        return TY_CLI_EXIT_USAGE;
    }
    int rc = write_model(&d, type, vocab, out, seed);
    if (rc) {
        fprintf(stderr, "tycho mkmodel: writing %s: %s\n", out, ty_strerror(rc));
        return TY_CLI_EXIT_FAIL;
    }
    return TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_mkmodel = {
    "mkmodel", "write a random-weight Llama GGUF of a given shape", run_mkmodel};
