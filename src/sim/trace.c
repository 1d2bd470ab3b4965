/* Mooncake trace reader: one JSON object per line (tycho/sim.h). Every rejected line is named
 * by file and line; nothing in the input can make the reader crash or assert. */
#include "tycho/errors.h"
#include "tycho/sim.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BLOCKS_PER_REQUEST (1u << 20)

struct builder {
    struct ty_sim_trace *t;
    size_t cap_reqs, cap_blocks;
    size_t *offsets; /* block offset per request, fixed up into pointers at the end */
};

static void set_err(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t len, const char *fmt, ...)
{
    if (!err || !len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

static int get_uint(json_t *obj, const char *key, uint64_t max, uint64_t *out, const char **why)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        *why = "missing";
        return TY_EPARSE;
    }
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < 0 || (uint64_t)x > max) {
            *why = "out of range";
            return TY_EPARSE;
        }
        *out = (uint64_t)x;
        return 0;
    }
    *why = "not an integer";
    return TY_EPARSE;
}

static int reserve(struct builder *b, size_t more_blocks)
{
    struct ty_sim_trace *t = b->t;
    if (t->n == b->cap_reqs) {
        size_t cap = b->cap_reqs ? b->cap_reqs * 2 : 1024;
        struct ty_sim_request *r = realloc(t->reqs, cap * sizeof(*r));
        size_t *o = realloc(b->offsets, cap * sizeof(*o));
        if (r)
            t->reqs = r;
        if (o)
            b->offsets = o;
        if (!r || !o)
            return TY_ENOMEM;
        b->cap_reqs = cap;
    }
    if (t->n_blocks + more_blocks > b->cap_blocks) {
        size_t cap = b->cap_blocks ? b->cap_blocks : 4096;
        while (cap < t->n_blocks + more_blocks)
            cap *= 2;
        uint64_t *nb = realloc(t->blocks, cap * sizeof(*nb));
        if (!nb)
            return TY_ENOMEM;
        t->blocks = nb;
        b->cap_blocks = cap;
    }
    return 0;
}

static int parse_fields(struct builder *b, json_t *o, const char **field, const char **why)
{
    uint64_t ts = 0, in = 0, outl = 0;
    json_t *tsv = json_object_get(o, "timestamp");
    *field = "timestamp";
    if (tsv && json_is_real(tsv)) {
        double d = json_real_value(tsv);
        if (!(d >= 0 && d < 1e15)) {
            *why = "out of range";
            return TY_EPARSE;
        }
        ts = (uint64_t)(d * 1000.0);
    } else if (get_uint(o, "timestamp", UINT64_MAX / 1000, &ts, why) == 0) {
        ts *= 1000;
    } else {
        return TY_EPARSE;
    }
    *field = "input_length";
    if (get_uint(o, "input_length", UINT32_MAX, &in, why) < 0)
        return TY_EPARSE;
    if (in == 0) {
        *why = "must be at least 1";
        return TY_EPARSE;
    }
    *field = "output_length";
    if (get_uint(o, "output_length", UINT32_MAX, &outl, why) < 0)
        return TY_EPARSE;
    *field = "hash_ids";
    json_t *h = json_object_get(o, "hash_ids");
    if (!h || !json_is_array(h)) {
        *why = h ? "not an array" : "missing";
        return TY_EPARSE;
    }
    size_t n = json_array_size(h);
    if (n > MAX_BLOCKS_PER_REQUEST) {
        *why = "too many blocks";
        return TY_EPARSE;
    }
    if (reserve(b, n) < 0)
        return TY_ENOMEM;
    struct ty_sim_trace *t = b->t;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(h, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0) {
            *why = "element is not a non-negative integer";
            return TY_EPARSE;
        }
        t->blocks[t->n_blocks + i] = (uint64_t)json_integer_value(e);
    }
    struct ty_sim_request *r = &t->reqs[t->n];
    r->arrival_us = ts;
    r->input_tokens = (uint32_t)in;
    r->output_tokens = (uint32_t)outl;
    r->n_blocks = (uint32_t)n;
    b->offsets[t->n] = t->n_blocks;
    t->n_blocks += n;
    t->n++;
    return 0;
}

static int parse_line(struct builder *b, const char *line, size_t len, const char *name,
                      size_t lineno, char *err, size_t err_len)
{
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        set_err(err, err_len, "%s:%zu: invalid JSON (column %d): %s", name, lineno, je.column,
                je.text);
        return TY_EPARSE;
    }
    int rc = TY_EPARSE;
    const char *field = "", *why = "";
    if (!json_is_object(o)) {
        set_err(err, err_len, "%s:%zu: expected a JSON object", name, lineno);
        goto out;
    }
    rc = parse_fields(b, o, &field, &why);
    if (rc == TY_EPARSE)
        set_err(err, err_len, "%s:%zu: field '%s': %s", name, lineno, field, why);
    else if (rc < 0)
        set_err(err, err_len, "%s:%zu: %s", name, lineno, ty_strerror(rc));
out:
    json_decref(o);
    return rc;
}

static int cmp_arrival(const void *a, const void *b)
{
    const struct ty_sim_request *x = a, *y = b;
    if (x->arrival_us != y->arrival_us)
        return x->arrival_us < y->arrival_us ? -1 : 1;
    /* stable: the blocks pointer still holds the original index here */
    return x->blocks < y->blocks ? -1 : x->blocks > y->blocks;
}

static void finish(struct builder *b)
{
    struct ty_sim_trace *t = b->t;
    for (size_t i = 0; i < t->n; i++)
        t->reqs[i].blocks = (const uint64_t *)(uintptr_t)(i + 1); /* order key */
    qsort(t->reqs, t->n, sizeof(*t->reqs), cmp_arrival);
    for (size_t i = 0; i < t->n; i++) {
        size_t orig = (size_t)(uintptr_t)t->reqs[i].blocks - 1;
        t->reqs[i].blocks = t->blocks + b->offsets[orig];
    }
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

int ty_sim_trace_parse(struct ty_sim_trace **out, const char *name, const char *buf, size_t len,
                       char *err, size_t err_len)
{
    struct builder b = {0};
    b.t = calloc(1, sizeof(*b.t));
    if (!b.t)
        return TY_ENOMEM;
    int rc = 0;
    size_t lineno = 0, pos = 0;
    while (pos < len) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len;
        lineno++;
        if (!blank(buf + pos, end - pos)) {
            rc = parse_line(&b, buf + pos, end - pos, name, lineno, err, err_len);
            if (rc < 0)
                goto err_free;
        }
        pos = end + 1;
    }
    finish(&b);
    free(b.offsets);
    *out = b.t;
    return 0;
err_free:
    free(b.offsets);
    ty_sim_trace_free(b.t);
    return rc;
}

int ty_sim_trace_load(struct ty_sim_trace **out, const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int rc = ty_errno();
        set_err(err, err_len, "%s: %s", path, ty_strerror(rc));
        return rc;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 1 << 20;
            char *nb = realloc(buf, cap);
            if (!nb) {
                rc = TY_ENOMEM;
                goto out;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        rc = TY_EIO;
        set_err(err, err_len, "%s: read error", path);
        goto out;
    }
    rc = ty_sim_trace_parse(out, path, buf, len, err, err_len);
out:
    free(buf);
    fclose(f);
    return rc;
}

void ty_sim_trace_free(struct ty_sim_trace *t)
{
    if (!t)
        return;
    free(t->reqs);
    free(t->blocks);
    free(t);
}
