/* GGUF v3 writer: metadata serialised into a growing buffer as it is added; tensor infos
 * declared up front; data streamed from a fill callback in 1 MiB chunks at write time. */
#include "tycho/gguf.h"

#include "tycho/errors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GW_ALIGN 32u
#define GW_CHUNK (1u << 20)

struct gw_tensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[4];
    uint64_t nbytes;
    uint64_t offset;
};

struct ty_gguf_writer {
    unsigned char *kv;
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    struct gw_tensor *t;
    uint64_t n_t, cap_t;
    uint64_t data_len;
};

int ty_gguf_writer_new(ty_gguf_writer_t **out)
{
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : TY_ENOMEM;
}

void ty_gguf_writer_free(ty_gguf_writer_t *w)
{
    if (!w)
        return;
    for (uint64_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->t);
    free(w->kv);
    free(w);
}

static int put(ty_gguf_writer_t *w, const void *p, size_t n)
{
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap < w->kv_len + n)
            cap *= 2;
        unsigned char *nb = realloc(w->kv, cap);
        if (!nb)
            return TY_ENOMEM;
        w->kv = nb;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int put_str(ty_gguf_writer_t *w, const char *s)
{
    uint64_t n = strlen(s);
    int rc = put(w, &n, 8);
    return rc ? rc : put(w, s, n);
}

static int put_head(ty_gguf_writer_t *w, const char *key, uint32_t type)
{
    int rc = put_str(w, key);
    if (!rc)
        rc = put(w, &type, 4);
    if (!rc)
        w->n_kv++;
    return rc;
}

int ty_gguf_writer_kv_u32(ty_gguf_writer_t *w, const char *key, uint32_t v)
{
    int rc = put_head(w, key, TY_GGUF_UINT32);
    return rc ? rc : put(w, &v, 4);
}

int ty_gguf_writer_kv_f32(ty_gguf_writer_t *w, const char *key, float v)
{
    int rc = put_head(w, key, TY_GGUF_FLOAT32);
    return rc ? rc : put(w, &v, 4);
}

int ty_gguf_writer_kv_bool(ty_gguf_writer_t *w, const char *key, bool v)
{
    uint8_t b = v;
    int rc = put_head(w, key, TY_GGUF_BOOL);
    return rc ? rc : put(w, &b, 1);
}

int ty_gguf_writer_kv_str(ty_gguf_writer_t *w, const char *key, const char *v)
{
    int rc = put_head(w, key, TY_GGUF_STRING);
    return rc ? rc : put_str(w, v);
}

int ty_gguf_writer_kv_raw(ty_gguf_writer_t *w, const void *raw, uint64_t raw_len)
{
    int rc = put(w, raw, raw_len);
    if (!rc)
        w->n_kv++;
    return rc;
}

int ty_gguf_writer_tensor(ty_gguf_writer_t *w, const char *name, uint32_t type, uint32_t n_dims,
                          const uint64_t *ne)
{
    if (n_dims == 0 || n_dims > 4)
        return TY_EINVAL;
    uint64_t count = 1;
    for (uint32_t d = 0; d < n_dims; d++)
        count *= ne[d];
    uint64_t nbytes = ty_ggml_type_nbytes(type, count);
    if (nbytes == 0)
        return TY_EINVAL;
    if (w->n_t == w->cap_t) {
        uint64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        struct gw_tensor *nt = realloc(w->t, cap * sizeof(*nt));
        if (!nt)
            return TY_ENOMEM;
        w->t = nt;
        w->cap_t = cap;
    }
    struct gw_tensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof(*t));
    if (!(t->name = strdup(name)))
        return TY_ENOMEM;
    t->type = type;
    t->n_dims = n_dims;
    memcpy(t->ne, ne, n_dims * sizeof(uint64_t));
    t->nbytes = nbytes;
    t->offset = w->data_len;
    w->data_len += (nbytes + GW_ALIGN - 1) / GW_ALIGN * GW_ALIGN;
    w->n_t++;
    return 0;
}

static int write_header(ty_gguf_writer_t *w, FILE *f)
{
    uint32_t ver = 3;
    int ok = fwrite("GGUF", 1, 4, f) == 4 && fwrite(&ver, 4, 1, f) == 1 &&
             fwrite(&w->n_t, 8, 1, f) == 1 && fwrite(&w->n_kv, 8, 1, f) == 1 &&
             fwrite(w->kv, 1, w->kv_len, f) == w->kv_len;
    for (uint64_t i = 0; ok && i < w->n_t; i++) {
        struct gw_tensor *t = &w->t[i];
        uint64_t nlen = strlen(t->name);
        ok = fwrite(&nlen, 8, 1, f) == 1 && fwrite(t->name, 1, nlen, f) == nlen &&
             fwrite(&t->n_dims, 4, 1, f) == 1 && fwrite(t->ne, 8, t->n_dims, f) == t->n_dims &&
             fwrite(&t->type, 4, 1, f) == 1 && fwrite(&t->offset, 8, 1, f) == 1;
    }
    long pos = ok ? ftell(f) : -1;
    static const unsigned char zeros[GW_ALIGN];
    if (pos < 0)
        return TY_EIO;
    size_t pad = (GW_ALIGN - (size_t)pos % GW_ALIGN) % GW_ALIGN;
    return fwrite(zeros, 1, pad, f) == pad ? 0 : TY_EIO;
}

static int write_data(ty_gguf_writer_t *w, FILE *f, ty_gguf_fill_cb fill, void *arg)
{
    unsigned char *buf = malloc(GW_CHUNK);
    int rc = 0;
    if (!buf)
        return TY_ENOMEM;
    for (uint64_t i = 0; i < w->n_t && !rc; i++) {
        struct gw_tensor *t = &w->t[i];
        uint64_t padded = (t->nbytes + GW_ALIGN - 1) / GW_ALIGN * GW_ALIGN;
        for (uint64_t off = 0; off < padded && !rc; off += GW_CHUNK) {
            size_t n = padded - off < GW_CHUNK ? (size_t)(padded - off) : GW_CHUNK;
            size_t real = off >= t->nbytes ? 0 : (size_t)(t->nbytes - off < n ? t->nbytes - off : n);
            memset(buf, 0, n);
            if (real)
                rc = fill(arg, i, off, buf, real);
            if (!rc && fwrite(buf, 1, n, f) != n)
                rc = TY_EIO;
        }
    }
    free(buf);
    return rc;
}

int ty_gguf_writer_write(ty_gguf_writer_t *w, const char *path, ty_gguf_fill_cb fill, void *arg)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -errno;
    int rc = write_header(w, f);
    if (!rc)
        rc = write_data(w, f, fill, arg);
    if (fclose(f) != 0 && !rc)
        rc = TY_EIO;
    return rc;
}
