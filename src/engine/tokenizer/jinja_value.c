/* Jinja values: arena, containers, Python truthiness/equality/ordering, str()/repr(),
 * HF's tojson (json.dumps with ensure_ascii=False) and conversion from jansson. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja-impl.h"

struct jj_chunk {
    struct jj_chunk *next;
    size_t used, size;
    max_align_t data[];
};

#define JJ_CHUNK 65536

void *ty__jinja_alloc(struct jj_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    struct jj_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t sz = n > JJ_CHUNK / 4 ? n : JJ_CHUNK;
        if (a->cap && a->total + sz > a->cap)
            return NULL;
        c = malloc(sizeof(*c) + sz);
        if (!c)
            return NULL;
        a->total += sz;
        c->size = sz;
        c->used = 0;
        if (n > JJ_CHUNK / 4 && a->head) { /* keep the partly used chunk in front */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void ty__jinja_arena_free(struct jj_arena *a)
{
    struct jj_chunk *c = a->head;
    while (c) {
        struct jj_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->total = 0;
}

int ty__jinja_fail(struct jj_ctx *c, int rc, int line, const char *fmt, ...)
{
    if (c->failed)
        return rc;
    c->failed = true;
    if (c->err) {
        char m[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m, sizeof(m), fmt, ap);
        va_end(ap);
        if (line > 0)
            snprintf(c->err->msg, sizeof(c->err->msg), "%s at line %d", m, line);
        else
            snprintf(c->err->msg, sizeof(c->err->msg), "%s", m);
        c->err->line = line;
    }
    return rc;
}

int ty__jinja_nomem(struct jj_ctx *c, int line)
{
    if (c->ar.cap && c->ar.total + JJ_CHUNK > c->ar.cap)
        return ty__jinja_fail(c, TY_ERANGE, line, "render memory limit exceeded");
    return ty__jinja_fail(c, TY_ENOMEM, line, "out of memory");
}

jv ty__jinja_str(struct jj_ctx *c, const char *p, size_t n, bool *ok)
{
    jv v = {.t = JV_STR};
    char *s = ty__jinja_alloc(&c->ar, n + 1);
    if (!s) {
        *ok = false;
        return v;
    }
    if (n)
        memcpy(s, p, n);
    v.s.p = s, v.s.n = n;
    return v;
}

struct jlist *ty__jinja_list_new(struct jj_ctx *c, size_t cap)
{
    struct jlist *l = ty__jinja_alloc(&c->ar, sizeof(*l));
    if (l && cap) {
        l->v = ty__jinja_alloc(&c->ar, cap * sizeof(jv));
        if (!l->v)
            return NULL;
        l->cap = cap;
    }
    return l;
}

int ty__jinja_list_push(struct jj_ctx *c, struct jlist *l, jv v)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        jv *nv = ty__jinja_alloc(&c->ar, nc * sizeof(jv));
        if (!nv)
            return TY_ENOMEM;
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv, l->cap = nc;
    }
    l->v[l->n++] = v;
    return 0;
}

struct jdict *ty__jinja_dict_new(struct jj_ctx *c, size_t cap)
{
    struct jdict *d = ty__jinja_alloc(&c->ar, sizeof(*d));
    if (d && cap) {
        d->k = ty__jinja_alloc(&c->ar, cap * sizeof(jv));
        d->v = ty__jinja_alloc(&c->ar, cap * sizeof(jv));
        if (!d->k || !d->v)
            return NULL;
        d->cap = cap;
    }
    return d;
}

static bool key_eq(jv a, jv b)
{
    if (a.t == JV_STR && b.t == JV_STR)
        return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
    return ty__jinja_eq(a, b);
}

bool ty__jinja_dict_get(const struct jdict *d, jv k, jv *out)
{
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(d->k[i], k)) {
            *out = d->v[i];
            return true;
        }
    return false;
}

bool ty__jinja_dict_gets(const struct jdict *d, const char *k, size_t n, jv *out)
{
    jv key = {.t = JV_STR};
    key.s.p = k, key.s.n = n;
    return ty__jinja_dict_get(d, key, out);
}

int ty__jinja_dict_set(struct jj_ctx *c, struct jdict *d, jv k, jv v)
{
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(d->k[i], k)) {
            d->v[i] = v;
            return 0;
        }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jv *nk = ty__jinja_alloc(&c->ar, nc * sizeof(jv));
        jv *nv = ty__jinja_alloc(&c->ar, nc * sizeof(jv));
        if (!nk || !nv)
            return TY_ENOMEM;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(jv));
            memcpy(nv, d->v, d->n * sizeof(jv));
        }
        d->k = nk, d->v = nv, d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

bool ty__jinja_truthy(jv v)
{
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0.0;
    case JV_STR: return v.s.n != 0;
    case JV_LIST: return v.l->n != 0;
    case JV_DICT: return v.d->n != 0;
    default: return true;
    }
}

static bool is_num(jv v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }
static double num_f(jv v) { return v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : v.b; }

bool ty__jinja_eq(jv a, jv b)
{
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT)
            return (a.t == JV_INT ? a.i : a.b) == (b.t == JV_INT ? b.i : b.b);
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
    case JV_LIST:
        if (a.l->n != b.l->n)
            return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!ty__jinja_eq(a.l->v[i], b.l->v[i]))
                return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n)
            return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jv o;
            if (!ty__jinja_dict_get(b.d, a.d->k[i], &o) || !ty__jinja_eq(a.d->v[i], o))
                return false;
        }
        return true;
    case JV_NS: return a.d == b.d;
    case JV_MACRO: return a.m == b.m;
    case JV_FUNC: return a.fn == b.fn;
    case JV_LOOP: return a.loop == b.loop;
    default: return false;
    }
}

const char *ty__jinja_typename(jv v)
{
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int",   "float",
                                        "str",       "list",     "dict", "Namespace", "Macro",
                                        "function",  "LoopContext"};
    return v.t < sizeof(names) / sizeof(names[0]) ? names[v.t] : "object";
}

int ty__jinja_cmp(struct jj_ctx *c, int line, jv a, jv b, int *res)
{
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = a.t == JV_INT ? a.i : a.b, y = b.t == JV_INT ? b.i : b.b;
            *res = (x > y) - (x < y);
        } else {
            double x = num_f(a), y = num_f(b);
            *res = (x > y) - (x < y);
        }
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int r = n ? memcmp(a.s.p, b.s.p, n) : 0;
        *res = r ? (r > 0 ? 1 : -1) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
        return 0;
    }
    if (a.t == JV_LIST && b.t == JV_LIST) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            int rc = ty__jinja_cmp(c, line, a.l->v[i], b.l->v[i], res);
            if (rc || *res)
                return rc;
        }
        *res = (a.l->n > b.l->n) - (a.l->n < b.l->n);
        return 0;
    }
    return ty__jinja_fail(c, TY_EINVAL, line, "cannot compare '%s' with '%s'",
                          ty__jinja_typename(a), ty__jinja_typename(b));
}

int ty__jinja_buf_put(struct jj_ctx *c, struct jj_buf *b, const char *p, size_t n)
{
    if (b->n + n > c->lim.max_out)
        return ty__jinja_fail(c, TY_ERANGE, 0, "output larger than %zu bytes", c->lim.max_out);
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np)
            return ty__jinja_fail(c, TY_ENOMEM, 0, "out of memory");
        b->p = np, b->cap = nc;
    }
    if (n)
        memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int put_s(struct jj_ctx *c, struct jj_buf *b, const char *s)
{
    return ty__jinja_buf_put(c, b, s, strlen(s));
}

/* Python float repr: the shortest digits that round-trip, fixed for 1e-4 <= |x| < 1e16. */
void ty__jinja_fmt_float(double f, char *buf, size_t cap)
{
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof(e), "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e: [-]d[.ddd]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *q = e;
    bool neg = *q == '-';
    q += neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.')
            digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    char *o = buf;
    size_t left = cap;
#define OUT(...)                                                                                  \
    do {                                                                                          \
        int w_ = snprintf(o, left, __VA_ARGS__);                                                  \
        if (w_ > 0 && (size_t)w_ < left)                                                          \
            o += w_, left -= (size_t)w_;                                                          \
    } while (0)
    if (neg)
        OUT("-");
    if (exp >= 16 || exp < -4) {
        OUT("%c", digits[0]);
        if (nd > 1)
            OUT(".%s", digits + 1);
        OUT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        OUT("0.");
        for (int k = -1; k > exp; k--)
            OUT("0");
        OUT("%s", digits);
    } else {
        for (int k = 0; k <= exp; k++)
            OUT("%c", (size_t)k < nd ? digits[k] : '0');
        OUT(".");
        if ((size_t)exp + 1 < nd)
            OUT("%s", digits + exp + 1);
        else
            OUT("0");
    }
#undef OUT
}

static int put_repr_str(struct jj_ctx *c, struct jj_buf *b, const char *p, size_t n)
{
    bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    int rc = ty__jinja_buf_put(c, b, &q, 1);
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char ch = (unsigned char)p[i];
        char t[8];
        if (ch == (unsigned char)q || ch == '\\')
            snprintf(t, sizeof(t), "\\%c", ch);
        else if (ch == '\n')
            snprintf(t, sizeof(t), "\\n");
        else if (ch == '\r')
            snprintf(t, sizeof(t), "\\r");
        else if (ch == '\t')
            snprintf(t, sizeof(t), "\\t");
        else if (ch < 0x20 || ch == 0x7f)
            snprintf(t, sizeof(t), "\\x%02x", ch);
        else
            t[0] = (char)ch, t[1] = 0;
        rc = put_s(c, b, t);
    }
    return rc ? rc : ty__jinja_buf_put(c, b, &q, 1);
}

static int put_scalar(struct jj_ctx *c, struct jj_buf *b, jv v, bool repr)
{
    char t[64];
    switch (v.t) {
    case JV_UNDEF: return 0;
    case JV_NONE: return put_s(c, b, "None");
    case JV_BOOL: return put_s(c, b, v.b ? "True" : "False");
    case JV_INT: snprintf(t, sizeof(t), "%lld", (long long)v.i); return put_s(c, b, t);
    case JV_FLOAT: ty__jinja_fmt_float(v.f, t, sizeof(t)); return put_s(c, b, t);
    case JV_STR:
        return repr ? put_repr_str(c, b, v.s.p, v.s.n) : ty__jinja_buf_put(c, b, v.s.p, v.s.n);
    case JV_NS: return put_s(c, b, "<Namespace>");
    case JV_MACRO: return put_s(c, b, "<Macro>");
    case JV_FUNC: return put_s(c, b, "<function>");
    case JV_LOOP: return put_s(c, b, "<LoopContext>");
    default: return 0;
    }
}

int ty__jinja_buf_repr(struct jj_ctx *c, struct jj_buf *b, jv v)
{
    int rc = 0;
    if (++c->depth > c->lim.max_depth)
        return ty__jinja_fail(c, TY_ERANGE, 0, "value nested too deeply");
    if (v.t == JV_LIST) {
        rc = put_s(c, b, "[");
        for (size_t i = 0; i < v.l->n && !rc; i++) {
            if (i)
                rc = put_s(c, b, ", ");
            if (!rc)
                rc = ty__jinja_buf_repr(c, b, v.l->v[i]);
        }
        if (!rc)
            rc = put_s(c, b, "]");
    } else if (v.t == JV_DICT) {
        rc = put_s(c, b, "{");
        for (size_t i = 0; i < v.d->n && !rc; i++) {
            if (i)
                rc = put_s(c, b, ", ");
            if (!rc)
                rc = ty__jinja_buf_repr(c, b, v.d->k[i]);
            if (!rc)
                rc = put_s(c, b, ": ");
            if (!rc)
                rc = ty__jinja_buf_repr(c, b, v.d->v[i]);
        }
        if (!rc)
            rc = put_s(c, b, "}");
    } else {
        rc = put_scalar(c, b, v, true);
    }
    c->depth--;
    return rc;
}

int ty__jinja_buf_str(struct jj_ctx *c, struct jj_buf *b, jv v)
{
    if (v.t == JV_LIST || v.t == JV_DICT)
        return ty__jinja_buf_repr(c, b, v);
    return put_scalar(c, b, v, false);
}

int ty__jinja_tostr(struct jj_ctx *c, jv v, jv *out)
{
    if (v.t == JV_STR) {
        *out = v;
        return 0;
    }
    struct jj_buf b = {0};
    int rc = ty__jinja_buf_str(c, &b, v);
    bool ok = true;
    if (!rc) {
        *out = ty__jinja_str(c, b.p ? b.p : "", b.n, &ok);
        if (!ok)
            rc = ty__jinja_nomem(c, 0);
    }
    free(b.p);
    return rc;
}

static int json_str(struct jj_ctx *c, struct jj_buf *b, const char *p, size_t n)
{
    int rc = put_s(c, b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        rc = ty__jinja_buf_put(c, b, p + run, i - run);
        run = i + 1;
        char t[8];
        switch (ch) {
        case '"': snprintf(t, sizeof(t), "\\\""); break;
        case '\\': snprintf(t, sizeof(t), "\\\\"); break;
        case '\n': snprintf(t, sizeof(t), "\\n"); break;
        case '\r': snprintf(t, sizeof(t), "\\r"); break;
        case '\t': snprintf(t, sizeof(t), "\\t"); break;
        case '\b': snprintf(t, sizeof(t), "\\b"); break;
        case '\f': snprintf(t, sizeof(t), "\\f"); break;
        default: snprintf(t, sizeof(t), "\\u%04x", ch); break;
        }
        if (!rc)
            rc = put_s(c, b, t);
    }
    if (!rc)
        rc = ty__jinja_buf_put(c, b, p + run, n - run);
    return rc ? rc : put_s(c, b, "\"");
}

static int json_nl(struct jj_ctx *c, struct jj_buf *b, int indent, int level)
{
    int rc = put_s(c, b, "\n");
    for (int i = 0; i < indent * level && !rc; i++)
        rc = put_s(c, b, " ");
    return rc;
}

static int json_key(struct jj_ctx *c, int line, struct jj_buf *b, jv k)
{
    switch (k.t) {
    case JV_STR: return json_str(c, b, k.s.p, k.s.n);
    case JV_NONE: return put_s(c, b, "\"null\"");
    case JV_BOOL: return put_s(c, b, k.b ? "\"true\"" : "\"false\"");
    case JV_INT:
    case JV_FLOAT: {
        int rc = put_s(c, b, "\"");
        rc = rc ? rc : ty__jinja_tojson(c, line, b, k, -1, ", ", ": ", false, 0);
        return rc ? rc : put_s(c, b, "\"");
    }
    default:
        return ty__jinja_fail(c, TY_EINVAL, line, "tojson: keys must be str, int, float, bool "
                              "or None, not %s", ty__jinja_typename(k));
    }
}

static int json_dict(struct jj_ctx *c, int line, struct jj_buf *b, jv v, int indent,
                     const char *isep, const char *ksep, bool sort, int level)
{
    size_t n = v.d->n;
    size_t *ord = ty__jinja_alloc(&c->ar, (n ? n : 1) * sizeof(size_t));
    if (!ord)
        return ty__jinja_nomem(c, line);
    for (size_t i = 0; i < n; i++)
        ord[i] = i;
    for (size_t i = 1; sort && i < n; i++) /* insertion sort keeps it stable */
        for (size_t j = i; j > 0; j--) {
            int r;
            int rc = ty__jinja_cmp(c, line, v.d->k[ord[j - 1]], v.d->k[ord[j]], &r);
            if (rc)
                return rc;
            if (r <= 0)
                break;
            size_t t = ord[j];
            ord[j] = ord[j - 1], ord[j - 1] = t;
        }
    int rc = put_s(c, b, "{");
    for (size_t i = 0; i < n && !rc; i++) {
        if (i)
            rc = put_s(c, b, isep);
        if (!rc && indent >= 0)
            rc = json_nl(c, b, indent, level + 1);
        if (!rc)
            rc = json_key(c, line, b, v.d->k[ord[i]]);
        if (!rc)
            rc = put_s(c, b, ksep);
        if (!rc)
            rc = ty__jinja_tojson(c, line, b, v.d->v[ord[i]], indent, isep, ksep, sort, level + 1);
    }
    if (!rc && indent >= 0 && n)
        rc = json_nl(c, b, indent, level);
    return rc ? rc : put_s(c, b, "}");
}

int ty__jinja_tojson(struct jj_ctx *c, int line, struct jj_buf *b, jv v, int indent,
                     const char *isep, const char *ksep, bool sort, int level)
{
    char t[64];
    if (level > c->lim.max_depth)
        return ty__jinja_fail(c, TY_ERANGE, line, "tojson: value nested too deeply");
    switch (v.t) {
    case JV_NONE: return put_s(c, b, "null");
    case JV_BOOL: return put_s(c, b, v.b ? "true" : "false");
    case JV_INT: snprintf(t, sizeof(t), "%lld", (long long)v.i); return put_s(c, b, t);
    case JV_FLOAT:
        if (isnan(v.f))
            return put_s(c, b, "NaN");
        if (isinf(v.f))
            return put_s(c, b, v.f < 0 ? "-Infinity" : "Infinity");
        ty__jinja_fmt_float(v.f, t, sizeof(t));
        return put_s(c, b, t);
    case JV_STR: return json_str(c, b, v.s.p, v.s.n);
    case JV_LIST: {
        int rc = put_s(c, b, "[");
        for (size_t i = 0; i < v.l->n && !rc; i++) {
            if (i)
                rc = put_s(c, b, isep);
            if (!rc && indent >= 0)
                rc = json_nl(c, b, indent, level + 1);
            if (!rc)
                rc = ty__jinja_tojson(c, line, b, v.l->v[i], indent, isep, ksep, sort, level + 1);
        }
        if (!rc && indent >= 0 && v.l->n)
            rc = json_nl(c, b, indent, level);
        return rc ? rc : put_s(c, b, "]");
    }
    case JV_DICT: return json_dict(c, line, b, v, indent, isep, ksep, sort, level);
    default:
        return ty__jinja_fail(c, TY_EINVAL, line, "tojson: Object of type %s is not JSON "
                              "serializable", ty__jinja_typename(v));
    }
}

int ty__jinja_from_json(struct jj_ctx *c, const json_t *j, jv *out, int depth)
{
    jv v = {.t = JV_NONE};
    bool ok = true;
    if (depth > c->lim.max_depth)
        return ty__jinja_fail(c, TY_ERANGE, 0, "variables nested too deeply");
    switch (json_typeof(j)) {
    case JSON_TRUE:
    case JSON_FALSE: v.t = JV_BOOL, v.b = json_is_true(j); break;
    case JSON_INTEGER: v.t = JV_INT, v.i = json_integer_value(j); break;
    case JSON_REAL: v.t = JV_FLOAT, v.f = json_real_value(j); break;
    case JSON_STRING: v = ty__jinja_str(c, json_string_value(j), json_string_length(j), &ok); break;
    case JSON_ARRAY: {
        v.t = JV_LIST;
        if (!(v.l = ty__jinja_list_new(c, json_array_size(j))))
            return ty__jinja_nomem(c, 0);
        for (size_t i = 0; i < json_array_size(j); i++) {
            int rc = ty__jinja_from_json(c, json_array_get(j, i), &v.l->v[i], depth + 1);
            if (rc)
                return rc;
        }
        v.l->n = json_array_size(j);
        break;
    }
    case JSON_OBJECT: {
        v.t = JV_DICT;
        if (!(v.d = ty__jinja_dict_new(c, json_object_size(j))))
            return ty__jinja_nomem(c, 0);
        const char *k;
        json_t *x;
        size_t i = 0;
        json_object_foreach((json_t *)j, k, x) { /* jansson keeps insertion order */
            v.d->k[i] = ty__jinja_str(c, k, strlen(k), &ok);
            int rc = ty__jinja_from_json(c, x, &v.d->v[i], depth + 1);
            if (rc)
                return rc;
            i++;
        }
        v.d->n = i;
        break;
    }
    default: break;
    }
    if (!ok)
        return ty__jinja_nomem(c, 0);
    *out = v;
    return 0;
}

/* Code points, counting a stray continuation byte at the start as one (as ty__jinja_iter splits) */
size_t ty__jinja_utf8_len(const char *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += i == 0 || ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

size_t ty__jinja_utf8_off(const char *p, size_t n, size_t cp)
{
    size_t k = 0, i = 0;
    for (; i < n; i++) {
        if (i == 0 || ((unsigned char)p[i] & 0xC0) != 0x80) {
            if (k == cp)
                return i;
            k++;
        }
    }
    return n;
}

int ty__jinja_iter(struct jj_ctx *c, int line, jv v, struct jlist **out)
{
    static struct jlist empty;
    switch (v.t) {
    case JV_UNDEF: *out = &empty; return 0;
    case JV_LIST: *out = v.l; return 0;
    case JV_DICT:
    case JV_NS: {
        struct jlist *l = ty__jinja_alloc(&c->ar, sizeof(*l));
        if (!l)
            return ty__jinja_nomem(c, line);
        l->v = v.d->k, l->n = l->cap = v.d->n;
        *out = l;
        return 0;
    }
    case JV_STR: {
        struct jlist *l = ty__jinja_list_new(c, ty__jinja_utf8_len(v.s.p, v.s.n));
        if (!l)
            return ty__jinja_nomem(c, line);
        for (size_t i = 0; i < v.s.n;) {
            size_t j = i + 1;
            while (j < v.s.n && ((unsigned char)v.s.p[j] & 0xC0) == 0x80)
                j++;
            jv ch = {.t = JV_STR};
            ch.s.p = v.s.p + i, ch.s.n = j - i;
            l->v[l->n++] = ch;
            i = j;
        }
        *out = l;
        return 0;
    }
    default:
        return ty__jinja_fail(c, TY_EINVAL, line, "'%s' object is not iterable",
                              ty__jinja_typename(v));
    }
}
