/* libFuzzer target for the GGUF reader (src/engine/gguf.c) and the model loader on top of it
 * (model.c, model_gguf.c and the tokenizer built from tokenizer.ggml.* metadata).
 *
 * Each input is the whole file. It lives in a memfd opened by path (/proc/self/fd/N), so the
 * reader and the loader take their usual path: open, fstat, mmap. Checked on every input:
 *  - everything ty_gguf_open accepts can be read back through every accessor: every tensor's
 *    bytes (first and last touched; a block-quantized tensor's first and last rows
 *    widened through tycho/quant.h, which reads exactly the bytes of its blocks), every
 *    metadata entry's raw bytes, every string of every
 *    string array; scalar getters agree with each other on integers;
 *  - an accepted file written again with the project's writer (gguf_write.c: raw metadata,
 *    same tensors and bytes) reads back identically (reader and writer agree);
 *  - ty_model_load either fails with a message or gives a model whose config passes the
 *    documented bounds; its tokenizer, if any, encodes and decodes a short text. */
#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/model.h"
#include "tycho/quant.h"
#include "tycho/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A failed check names itself before aborting, so a crash report says which promise broke. */
#define check(cond) ((cond) ? (void)0 : check_failed(__LINE__, #cond))
static void check_failed(int line, const char *what)
{
    fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, line, what);
    abort();
}

static int g_in = -1, g_out = -1;
static char g_in_path[64], g_out_path[64];
static volatile unsigned char g_sink;

static void put_file(int fd, const uint8_t *data, size_t size)
{
    check(ftruncate(fd, 0) == 0);
    size_t off = 0;
    while (off < size) {
        ssize_t n = pwrite(fd, data + off, size - off, (off_t)off);
        check(n > 0);
        off += (size_t)n;
    }
}

/* The first and last rows of a block-quantized tensor as f32: a row is whole blocks (the
 * reader checks ne[0]), so the last row ends at the tensor's last byte. */
static void read_rows(const struct ty_gguf_tensor *t, uint64_t count)
{
    uint64_t n = t->ne[0], rows = count / n, rb = ty_ggml_type_nbytes(t->type, n);
    check(rb > 0 && rows * rb == t->nbytes);
    float *row = malloc(n * sizeof(float));
    check(row != NULL);
    check(ty_quant_row_dequantize(t->type, t->data, row, n) == 0);
    check(ty_quant_row_dequantize(t->type, (const unsigned char *)t->data + (rows - 1) * rb, row,
                                  n) == 0);
    g_sink ^= (unsigned char)(row[0] != row[n - 1]);
    free(row);
}

static void read_everything(const ty_gguf_t *g)
{
    for (uint64_t i = 0; i < ty_gguf_n_tensors(g); i++) {
        const struct ty_gguf_tensor *t = ty_gguf_tensor_at(g, i);
        check(t && t->name && t->n_dims >= 1 && t->n_dims <= 4 && t->nbytes > 0);
        uint64_t count = 1;
        for (uint32_t d = 0; d < 4; d++)
            count *= t->ne[d];
        check(t->nbytes == ty_ggml_type_nbytes(t->type, count));
        const unsigned char *p = t->data;
        g_sink ^= p[0] ^ p[t->nbytes - 1];
        if (ty_quant_is_block(t->type))
            read_rows(t, count);
        check(ty_gguf_find_tensor(g, t->name) == t); /* names are unique */
    }
    for (uint64_t i = 0; i < ty_gguf_n_kv(g); i++) {
        const char *key;
        enum ty_gguf_vtype type;
        const void *raw;
        uint64_t raw_len;
        check(ty_gguf_kv_at(g, i, &key, &type, &raw, &raw_len));
        check(key && raw && raw_len >= 12);
        g_sink ^= ((const unsigned char *)raw)[raw_len - 1];
        int64_t i64;
        uint32_t u32;
        if (ty_gguf_get_u32(g, key, &u32) && ty_gguf_get_i64(g, key, &i64))
            check(i64 == (int64_t)u32);
        float f;
        bool b;
        ty_gguf_get_f32(g, key, &f);
        ty_gguf_get_bool(g, key, &b);
        const char *s;
        uint64_t len;
        if (ty_gguf_get_str(g, key, &s, &len) && len)
            g_sink ^= (unsigned char)(s[0] ^ s[len - 1]);
        enum ty_gguf_vtype et;
        uint64_t n;
        const void *ad;
        if (ty_gguf_get_arr(g, key, &et, &n, &ad) && et == TY_GGUF_STRING)
            for (uint64_t k = 0; k < n; k++) {
                check(ty_gguf_get_arr_str(g, key, k, &s, &len));
                if (len)
                    g_sink ^= (unsigned char)(s[0] ^ s[len - 1]);
            }
        if (ty_gguf_get_arr(g, key, &et, &n, &ad))
            check(!ty_gguf_get_arr_str(g, key, n, &s, &len)); /* one past the end */
    }
}

static int copy_tensor(void *arg, uint64_t index, uint64_t offset, void *buf, size_t len)
{
    const struct ty_gguf_tensor *t = ty_gguf_tensor_at(arg, index);
    check(t && offset + len <= t->nbytes);
    memcpy(buf, (const unsigned char *)t->data + offset, len);
    return 0;
}

/* Write `g` again and compare what reads back. Files with another alignment than the
 * writer's 32 bytes are skipped: the writer always aligns to 32 and does not rewrite keys. */
static void round_trip(const ty_gguf_t *g)
{
    uint32_t align;
    if (ty_gguf_get_u32(g, "general.alignment", &align) && align != 32)
        return;
    ty_gguf_writer_t *w;
    check(ty_gguf_writer_new(&w) == 0);
    for (uint64_t i = 0; i < ty_gguf_n_kv(g); i++) {
        const char *key;
        enum ty_gguf_vtype type;
        const void *raw;
        uint64_t raw_len;
        check(ty_gguf_kv_at(g, i, &key, &type, &raw, &raw_len));
        check(ty_gguf_writer_kv_raw(w, raw, raw_len) == 0);
    }
    for (uint64_t i = 0; i < ty_gguf_n_tensors(g); i++) {
        const struct ty_gguf_tensor *t = ty_gguf_tensor_at(g, i);
        check(ty_gguf_writer_tensor(w, t->name, t->type, t->n_dims, t->ne) == 0);
    }
    check(ftruncate(g_out, 0) == 0);
    check(ty_gguf_writer_write(w, g_out_path, copy_tensor, (void *)g) == 0);
    ty_gguf_writer_free(w);
    ty_gguf_t *h;
    char err[256];
    int rc = ty_gguf_open(&h, g_out_path, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "round trip rejected: %s\n", err);
        abort();
    }
    check(ty_gguf_n_kv(h) == ty_gguf_n_kv(g) && ty_gguf_n_tensors(h) == ty_gguf_n_tensors(g));
    for (uint64_t i = 0; i < ty_gguf_n_kv(g); i++) {
        const char *k1, *k2;
        enum ty_gguf_vtype t1, t2;
        const void *r1, *r2;
        uint64_t l1, l2;
        check(ty_gguf_kv_at(g, i, &k1, &t1, &r1, &l1) && ty_gguf_kv_at(h, i, &k2, &t2, &r2, &l2));
        check(!strcmp(k1, k2) && t1 == t2 && l1 == l2 && !memcmp(r1, r2, l1));
    }
    for (uint64_t i = 0; i < ty_gguf_n_tensors(g); i++) {
        const struct ty_gguf_tensor *a = ty_gguf_tensor_at(g, i), *b = ty_gguf_tensor_at(h, i);
        check(!strcmp(a->name, b->name) && a->type == b->type && a->n_dims == b->n_dims);
        check(!memcmp(a->ne, b->ne, sizeof(a->ne)) && a->nbytes == b->nbytes);
        check(!memcmp(a->data, b->data, a->nbytes));
    }
    ty_gguf_close(h);
}

static void use_model(const ty_model_t *m)
{
    const struct ty_model_config *c = ty_model_config(m);
    check(c->dim >= 1 && c->n_layers >= 1 && c->n_heads >= 1 && c->n_kv_heads >= 1);
    check(c->n_heads % c->n_kv_heads == 0 && c->head_dim % 2 == 0 && c->n_vocab >= 1);
    /* a mixture of experts uses at least one and at most all of its experts */
    check(c->n_experts == 0 ? c->n_experts_used == 0
                            : c->n_experts_used >= 1 && c->n_experts_used <= c->n_experts);
    check(ty_model_desc(m)[0] != 0 && ty_model_weight_bytes(m) > 0);
    for (uint32_t id = 0; id < c->n_vocab && id < 64; id++)
        ty_model_is_eog(m, id);
    const char *tmpl = ty_model_chat_template(m);
    if (tmpl)
        g_sink ^= (unsigned char)strlen(tmpl);
    const ty_tokenizer_t *tok = ty_model_tokenizer(m);
    if (!tok)
        return;
    check(ty_tokenizer_n_vocab(tok) <= c->n_vocab);
    static const char text[] = "ab a\xc3\xa9 <s>";
    uint32_t ids[64];
    int n = ty_tokenizer_encode(tok, text, sizeof(text) - 1, true, true, ids, 64);
    if (n > 0) {
        char out[512];
        for (int i = 0; i < n && i < 64; i++)
            check(ids[i] < ty_tokenizer_n_vocab(tok));
        ty_tokenizer_decode(tok, ids, n < 64 ? (size_t)n : 64, false, out, sizeof(out));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_in < 0) {
        g_in = memfd_create("fuzz-gguf-in", MFD_CLOEXEC);
        g_out = memfd_create("fuzz-gguf-out", MFD_CLOEXEC);
        check(g_in >= 0 && g_out >= 0);
        snprintf(g_in_path, sizeof(g_in_path), "/proc/self/fd/%d", g_in);
        snprintf(g_out_path, sizeof(g_out_path), "/proc/self/fd/%d", g_out);
    }
    put_file(g_in, data, size);
    char err[256] = "";
    ty_gguf_t *g;
    int rc = ty_gguf_open(&g, g_in_path, err, sizeof(err));
    if (rc == 0) {
        read_everything(g);
        round_trip(g);
        ty_gguf_close(g);
    } else {
        check(rc == TY_EFORMAT || rc == TY_ENOMEM);
        check(err[0] != 0);
    }
    ty_model_t *m;
    err[0] = 0;
    rc = ty_model_load(&m, g_in_path, err, sizeof(err));
    if (rc == 0) {
        use_model(m);
        ty_model_free(m);
    } else {
        check(rc == TY_EFORMAT || rc == TY_ENOTSUP || rc == TY_ENOMEM);
        check(err[0] != 0);
    }
    return 0;
}
