/* GGUF v3 reader. The whole file is mapped read-only; the header, every metadata entry and the
 * tensor table are walked once with a bounds-checked cursor, so nothing read later can point
 * outside the mapping. Layout (ggml docs/gguf.md): magic "GGUF", u32 version, u64 n_tensors,
 * u64 n_kv, n_kv entries (string key, u32 type, value), n_tensors infos (string name,
 * u32 n_dims, u64 ne[n_dims], u32 type, u64 offset), padding to general.alignment, data.
 */
#include "tycho/gguf.h"

#include "tycho/errors.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Sanity caps: far above any real model, low enough that a hostile count cannot make us
 * allocate or loop absurdly. */
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_TENSORS (1u << 20)
#define GGUF_MAX_KEY 65535u
#define GGUF_MAX_DIMS 4u
#define GGUF_DEFAULT_ALIGN 32u

struct gguf_kv {
    char *key;
    enum ty_gguf_vtype type;
    const unsigned char *raw; /* start of the serialised entry */
    uint64_t raw_len;
    const unsigned char *val; /* scalar value, string (u64 len + bytes) or array payload */
    enum ty_gguf_vtype elem;  /* arrays */
    uint64_t n;               /* arrays */
    uint64_t *str_off;        /* string arrays: offset of each element from val */
};

struct ty_gguf {
    const unsigned char *map;
    size_t size;
    uint32_t version;
    uint64_t n_kv;
    struct gguf_kv *kv;
    uint64_t n_tensors;
    struct ty_gguf_tensor *tensors;
    char *names; /* NUL-terminated tensor names, one block */
};

struct cursor {
    const unsigned char *base;
    size_t size;
    size_t off;
    char *err;
    size_t errlen;
};

__attribute__((format(printf, 2, 3))) static int fail(struct cursor *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (c->err && c->errlen)
        vsnprintf(c->err, c->errlen, fmt, ap);
    va_end(ap);
    return TY_EFORMAT;
}

static int need(struct cursor *c, uint64_t n, const char *what)
{
    if (n > c->size - c->off)
        return fail(c, "truncated file: %s at offset %zu needs %llu bytes, %zu left", what, c->off,
                    (unsigned long long)n, c->size - c->off);
    return 0;
}

static int rd_u32(struct cursor *c, uint32_t *v, const char *what)
{
    int rc = need(c, 4, what);
    if (rc)
        return rc;
    memcpy(v, c->base + c->off, 4);
    c->off += 4;
    return 0;
}

static int rd_u64(struct cursor *c, uint64_t *v, const char *what)
{
    int rc = need(c, 8, what);
    if (rc)
        return rc;
    memcpy(v, c->base + c->off, 8);
    c->off += 8;
    return 0;
}

/* A GGUF string: u64 length then bytes. Returns a pointer into the map. */
static int rd_str(struct cursor *c, const char **s, uint64_t *len, const char *what)
{
    int rc = rd_u64(c, len, what);
    if (rc)
        return rc;
    if ((rc = need(c, *len, what)))
        return rc;
    *s = (const char *)c->base + c->off;
    c->off += *len;
    return 0;
}

static uint64_t scalar_size(enum ty_gguf_vtype t)
{
    switch (t) {
    case TY_GGUF_UINT8:
    case TY_GGUF_INT8:
    case TY_GGUF_BOOL:
        return 1;
    case TY_GGUF_UINT16:
    case TY_GGUF_INT16:
        return 2;
    case TY_GGUF_UINT32:
    case TY_GGUF_INT32:
    case TY_GGUF_FLOAT32:
        return 4;
    case TY_GGUF_UINT64:
    case TY_GGUF_INT64:
    case TY_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static int parse_array(struct cursor *c, struct gguf_kv *kv)
{
    uint32_t et;
    int rc;
    if ((rc = rd_u32(c, &et, "array element type")) || (rc = rd_u64(c, &kv->n, "array count")))
        return rc;
    kv->elem = (enum ty_gguf_vtype)et;
    kv->val = c->base + c->off;
    if (et == TY_GGUF_STRING) {
        /* each element takes at least its 8-byte length */
        if (kv->n > (c->size - c->off) / 8)
            return fail(c, "metadata '%s': string array count %llu exceeds the file", kv->key,
                        (unsigned long long)kv->n);
        kv->str_off = malloc((kv->n ? kv->n : 1) * sizeof(uint64_t));
        if (!kv->str_off)
            return TY_ENOMEM;
        for (uint64_t i = 0; i < kv->n; i++) {
            const char *s;
            uint64_t len;
            kv->str_off[i] = (uint64_t)(c->base + c->off - kv->val);
            if ((rc = rd_str(c, &s, &len, "array string")))
                return rc;
        }
        return 0;
    }
    uint64_t es = scalar_size((enum ty_gguf_vtype)et);
    if (es == 0)
        return fail(c, "metadata '%s': unsupported array element type %u", kv->key, et);
    if (kv->n > (c->size - c->off) / es)
        return fail(c, "metadata '%s': array of %llu elements exceeds the file", kv->key,
                    (unsigned long long)kv->n);
    c->off += kv->n * es;
    return 0;
}

static int parse_kv(struct cursor *c, struct gguf_kv *kv)
{
    const char *key;
    uint64_t klen;
    uint32_t t;
    int rc;
    kv->raw = c->base + c->off;
    if ((rc = rd_str(c, &key, &klen, "metadata key")))
        return rc;
    if (klen == 0 || klen > GGUF_MAX_KEY)
        return fail(c, "metadata key of absurd length %llu", (unsigned long long)klen);
    if (memchr(key, 0, klen)) /* the NUL-terminated copy would name another key */
        return fail(c, "metadata key with a NUL byte");
    kv->key = strndup(key, klen);
    if (!kv->key)
        return TY_ENOMEM;
    if ((rc = rd_u32(c, &t, "metadata type")))
        return rc;
    kv->type = (enum ty_gguf_vtype)t;
    kv->val = c->base + c->off;
    if (t == TY_GGUF_STRING) {
        const char *s;
        uint64_t len;
        rc = rd_str(c, &s, &len, "metadata string");
    } else if (t == TY_GGUF_ARRAY) {
        rc = parse_array(c, kv);
    } else if (scalar_size(kv->type)) {
        rc = need(c, scalar_size(kv->type), "metadata value");
        c->off += rc ? 0 : scalar_size(kv->type);
    } else {
        rc = fail(c, "metadata '%s': unknown value type %u", kv->key, t);
    }
    kv->raw_len = (uint64_t)(c->base + c->off - kv->raw);
    return rc;
}

/* The types this reader accepts: ggml's name, elements per block, bytes per block
 * (ggml-common.h: block_q4_0 = f16 d + 16 bytes of nibbles, block_q8_0 = f16 d + 32 int8,
 * block_q4_K = f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles,
 * block_q5_K = the same + 32 bytes of fifth bits, block_q6_K = 128 + 64 bytes of low/high
 * bits, 16 int8 scales, f16 d, block_mxfp4 = an E8M0 exponent byte + 16 bytes of FP4
 * nibbles). */
static const struct {
    uint32_t type;
    const char *name;
    uint32_t block, bytes;
} ggml_types[] = {
    {TY_GGML_F32, "F32", 1, 4},       {TY_GGML_F16, "F16", 1, 2},
    {TY_GGML_BF16, "BF16", 1, 2},     {TY_GGML_Q8_0, "Q8_0", 32, 34},
    {TY_GGML_Q4_0, "Q4_0", 32, 18},   {TY_GGML_Q4_K, "Q4_K", 256, 144},
    {TY_GGML_Q5_K, "Q5_K", 256, 176}, {TY_GGML_Q6_K, "Q6_K", 256, 210},
    {TY_GGML_MXFP4, "MXFP4", 32, 17},
};

static int type_index(uint32_t type)
{
    for (size_t i = 0; i < sizeof(ggml_types) / sizeof(ggml_types[0]); i++)
        if (ggml_types[i].type == type)
            return (int)i;
    return -1;
}

uint64_t ty_ggml_type_nbytes(uint32_t type, uint64_t n)
{
    int i = type_index(type);
    if (i < 0 || n % ggml_types[i].block)
        return 0;
    return n / ggml_types[i].block * ggml_types[i].bytes;
}

uint32_t ty_ggml_type_block(uint32_t type)
{
    int i = type_index(type);
    return i < 0 ? 0 : ggml_types[i].block;
}

const char *ty_ggml_type_name(uint32_t type)
{
    int i = type_index(type);
    return i < 0 ? "unknown" : ggml_types[i].name;
}

/* ggml's names of the types this reader refuses (ggml.h enum ggml_type), so that the refusal
 * says which quantization a file uses. */
static const char *unsupported_type_name(uint32_t type)
{
    static const char *const names[] = {
        [3] = "Q4_1",   [6] = "Q5_0",    [7] = "Q5_1",    [9] = "Q8_1",    [10] = "Q2_K",
        [11] = "Q3_K",  [15] = "Q8_K",  [16] = "IQ2_XXS", [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S",
        [20] = "IQ4_NL", [21] = "IQ3_S", [22] = "IQ2_S",  [23] = "IQ4_XS", [24] = "I8",
        [25] = "I16",   [26] = "I32",    [27] = "I64",    [28] = "F64",    [29] = "IQ1_M",
        [34] = "TQ1_0", [35] = "TQ2_0",
    };
    return type < sizeof(names) / sizeof(names[0]) && names[type] ? names[type] : "unknown";
}

static int parse_tensor_info(struct cursor *c, struct ty_gguf_tensor *t, uint64_t *rel_off,
                             const char **name, uint64_t *nlen)
{
    int rc;
    if ((rc = rd_str(c, name, nlen, "tensor name")))
        return rc;
    if (*nlen == 0 || *nlen > GGUF_MAX_KEY)
        return fail(c, "tensor name of absurd length %llu", (unsigned long long)*nlen);
    if (memchr(*name, 0, *nlen)) /* the NUL-terminated copy would name another tensor */
        return fail(c, "tensor name with a NUL byte");
    if ((rc = rd_u32(c, &t->n_dims, "tensor n_dims")))
        return rc;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return fail(c, "tensor '%.*s': %u dimensions (1..4 allowed)", (int)*nlen, *name,
                    t->n_dims);
    uint64_t count = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d < t->n_dims && (rc = rd_u64(c, &t->ne[d], "tensor shape")))
            return rc;
        if (t->ne[d] == 0 || t->ne[d] > (1ull << 40) || count > (UINT64_MAX >> 24) / t->ne[d])
            return fail(c, "tensor '%.*s': dimension %u is %llu (out of range)", (int)*nlen,
                        *name, d, (unsigned long long)t->ne[d]);
        count *= t->ne[d];
    }
    if ((rc = rd_u32(c, &t->type, "tensor type")) || (rc = rd_u64(c, rel_off, "tensor offset")))
        return rc;
    uint32_t block = ty_ggml_type_block(t->type);
    if (block == 0)
        return fail(c, "tensor '%.*s': unsupported ggml type %u (%s; supported: F32, F16, BF16, "
                       "Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, MXFP4)", (int)*nlen, *name, t->type,
                    unsupported_type_name(t->type));
    /* blocks never straddle rows: readers index a row as row * (ne[0] / block) blocks */
    if (t->ne[0] % block)
        return fail(c, "tensor '%.*s': %s row length %llu is not a multiple of %u", (int)*nlen,
                    *name, ty_ggml_type_name(t->type), (unsigned long long)t->ne[0], block);
    t->nbytes = ty_ggml_type_nbytes(t->type, count);
    return 0;
}

static const struct gguf_kv *find_kv(const ty_gguf_t *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0)
            return &g->kv[i];
    return NULL;
}

static int parse_tensors(ty_gguf_t *g, struct cursor *c)
{
    const char **names = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*names));
    uint64_t *lens = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*lens));
    uint64_t *offs = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*offs));
    uint64_t total = 0;
    int rc = TY_ENOMEM;
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
    if (!names || !lens || !offs || !g->tensors)
        goto out;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if ((rc = parse_tensor_info(c, &g->tensors[i], &offs[i], &names[i], &lens[i])))
            goto out;
        total += lens[i] + 1;
    }
    uint32_t align = GGUF_DEFAULT_ALIGN;
    const struct gguf_kv *ak = find_kv(g, "general.alignment");
    /* The GGUF spec requires a multiple of 8, which also keeps f32/f16 tensor data aligned. */
    if (ak && (!ty_gguf_get_u32(g, "general.alignment", &align) || align < 8 ||
               (align & (align - 1)) || align > (1u << 20))) {
        rc = fail(c, "general.alignment must be a power of two >= 8 (got %u)", align);
        goto out;
    }
    uint64_t data_off = (c->off + align - 1) / align * align;
    if (data_off > c->size && g->n_tensors) {
        rc = fail(c, "truncated file: tensor data section starts past the end");
        goto out;
    }
    rc = TY_ENOMEM;
    if (!(g->names = malloc(total ? total : 1)))
        goto out;
    char *p = g->names;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct ty_gguf_tensor *t = &g->tensors[i];
        memcpy(p, names[i], lens[i]);
        p[lens[i]] = 0;
        t->name = p;
        p += lens[i] + 1;
        if (offs[i] % align || offs[i] > c->size || data_off > c->size - offs[i] ||
            t->nbytes > c->size - data_off - offs[i]) {
            rc = fail(c, "tensor '%s': data [%llu, +%llu) lies outside the file (%zu bytes)",
                      t->name, (unsigned long long)(data_off + offs[i]),
                      (unsigned long long)t->nbytes, c->size);
            goto out;
        }
        t->data = c->base + data_off + offs[i];
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(g->tensors[j].name, t->name) == 0) {
                rc = fail(c, "duplicate tensor name '%s'", t->name);
                goto out;
            }
    }
    rc = 0;
out:
    free(names);
    free(lens);
    free(offs);
    return rc;
}

static int parse_header(ty_gguf_t *g, struct cursor *c)
{
    uint32_t magic;
    int rc;
    if ((rc = rd_u32(c, &magic, "magic")))
        return rc;
    if (memcmp(&magic, "GGUF", 4) != 0)
        return fail(c, "not a GGUF file (bad magic)");
    if ((rc = rd_u32(c, &g->version, "version")))
        return rc;
    if (g->version != 3 && g->version != 2)
        return fail(c, "unsupported GGUF version %u (2 or 3 supported)", g->version);
    if ((rc = rd_u64(c, &g->n_tensors, "tensor count")) ||
        (rc = rd_u64(c, &g->n_kv, "metadata count")))
        return rc;
    if (g->n_tensors > GGUF_MAX_TENSORS || g->n_kv > GGUF_MAX_KV)
        return fail(c, "absurd counts: %llu tensors, %llu metadata entries",
                    (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv);
    /* each entry takes at least 12 bytes: a cheap early test of a hostile count */
    if (g->n_kv > c->size / 12 || g->n_tensors > c->size / 24)
        return fail(c, "truncated file: counts (%llu kv, %llu tensors) exceed its size",
                    (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors);
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
    if (!g->kv)
        return TY_ENOMEM;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((rc = parse_kv(c, &g->kv[i])))
            return rc;
    return parse_tensors(g, c);
}

int ty_gguf_open(ty_gguf_t **out, const char *path, char *errbuf, size_t errlen)
{
    struct stat st;
    int rc;
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        snprintf(errbuf, errlen, "%s: %s", path, strerror(errno));
        return rc;
    }
    ty_gguf_t *g = calloc(1, sizeof(*g));
    if (!g) {
        rc = TY_ENOMEM;
        goto err_close;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 24) {
        rc = TY_EFORMAT;
        snprintf(errbuf, errlen, "%s: not a regular file of at least 24 bytes", path);
        goto err_free;
    }
    g->size = (size_t)st.st_size;
    void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        rc = -errno;
        snprintf(errbuf, errlen, "%s: mmap: %s", path, strerror(errno));
        goto err_free;
    }
    g->map = m;
    struct cursor c = {g->map, g->size, 0, errbuf, errlen};
    if ((rc = parse_header(g, &c))) {
        if (rc == TY_ENOMEM)
            snprintf(errbuf, errlen, "out of memory reading %s", path);
        goto err_free;
    }
    close(fd);
    *out = g;
    return 0;
err_free:
    ty_gguf_close(g);
err_close:
    close(fd);
    return rc;
}

void ty_gguf_close(ty_gguf_t *g)
{
    if (!g)
        return;
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str_off);
    }
    free(g->kv);
    free(g->tensors);
    free(g->names);
    if (g->map)
        munmap((void *)g->map, g->size);
    free(g);
}

/* Read an integer-typed scalar widened to int64 (u64 values above INT64_MAX fail). */
static bool kv_int(const struct gguf_kv *kv, int64_t *v)
{
    const unsigned char *p = kv->val;
    switch (kv->type) {
    case TY_GGUF_UINT8: *v = *(const uint8_t *)p; return true;
    case TY_GGUF_INT8: *v = *(const int8_t *)p; return true;
    case TY_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); *v = x; return true; }
    case TY_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); *v = x; return true; }
    case TY_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); *v = x; return true; }
    case TY_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); *v = x; return true; }
    case TY_GGUF_INT64: { int64_t x; memcpy(&x, p, 8); *v = x; return true; }
    case TY_GGUF_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        if (x > (uint64_t)INT64_MAX)
            return false;
        *v = (int64_t)x;
        return true;
    }
    default: return false;
    }
}

bool ty_gguf_get_i64(const ty_gguf_t *g, const char *key, int64_t *out)
{
    const struct gguf_kv *kv = find_kv(g, key);
    return kv && kv_int(kv, out);
}

bool ty_gguf_get_u32(const ty_gguf_t *g, const char *key, uint32_t *out)
{
    int64_t v;
    if (!ty_gguf_get_i64(g, key, &v) || v < 0 || v > (int64_t)UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

bool ty_gguf_get_f32(const ty_gguf_t *g, const char *key, float *out)
{
    const struct gguf_kv *kv = find_kv(g, key);
    if (!kv)
        return false;
    if (kv->type == TY_GGUF_FLOAT32) {
        memcpy(out, kv->val, 4);
        return true;
    }
    if (kv->type == TY_GGUF_FLOAT64) {
        double d;
        memcpy(&d, kv->val, 8);
        *out = (float)d;
        return true;
    }
    int64_t v;
    if (!kv_int(kv, &v))
        return false;
    *out = (float)v;
    return true;
}

bool ty_gguf_get_bool(const ty_gguf_t *g, const char *key, bool *out)
{
    const struct gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != TY_GGUF_BOOL)
        return false;
    *out = kv->val[0] != 0;
    return true;
}

bool ty_gguf_get_str(const ty_gguf_t *g, const char *key, const char **s, uint64_t *len)
{
    const struct gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != TY_GGUF_STRING)
        return false;
    memcpy(len, kv->val, 8);
    *s = (const char *)kv->val + 8;
    return true;
}

bool ty_gguf_get_arr(const ty_gguf_t *g, const char *key, enum ty_gguf_vtype *elem, uint64_t *n,
                     const void **data)
{
    const struct gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != TY_GGUF_ARRAY)
        return false;
    *elem = kv->elem;
    *n = kv->n;
    *data = kv->val;
    return true;
}

bool ty_gguf_get_arr_str(const ty_gguf_t *g, const char *key, uint64_t i, const char **s,
                         uint64_t *len)
{
    const struct gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != TY_GGUF_ARRAY || kv->elem != TY_GGUF_STRING || i >= kv->n)
        return false;
    const unsigned char *p = kv->val + kv->str_off[i];
    memcpy(len, p, 8);
    *s = (const char *)p + 8;
    return true;
}

const struct ty_gguf_tensor *ty_gguf_find_tensor(const ty_gguf_t *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return &g->tensors[i];
    return NULL;
}

uint64_t ty_gguf_n_tensors(const ty_gguf_t *g)
{
    return g->n_tensors;
}

const struct ty_gguf_tensor *ty_gguf_tensor_at(const ty_gguf_t *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

uint64_t ty_gguf_n_kv(const ty_gguf_t *g)
{
    return g->n_kv;
}

bool ty_gguf_kv_at(const ty_gguf_t *g, uint64_t i, const char **key, enum ty_gguf_vtype *type,
                   const void **raw, uint64_t *raw_len)
{
    if (i >= g->n_kv)
        return false;
    *key = g->kv[i].key;
    *type = g->kv[i].type;
    *raw = g->kv[i].raw;
    *raw_len = g->kv[i].raw_len;
    return true;
}
