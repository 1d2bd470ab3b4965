/* Jinja builtins: filters and tests (by id, resolved at parse), the global functions, and
 * `%` formatting. Python str/dict/list methods are in jinja_methods.c. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja-impl.h"


static const char *const filter_names[JF__COUNT] = {
#define XX(id, name) name,
    JJ_FILTER_MAP(XX)
#undef XX
};
static const char *const test_names[JTS__COUNT] = {
#define XX(id, name) name,
    JJ_TEST_MAP(XX)
#undef XX
};

static int lookup(const char *const *names, int count, const char *s, size_t n)
{
    for (int i = 0; i < count; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0)
            return i;
    return -1;
}

int ty__jinja_filter_id(const char *name, size_t n) { return lookup(filter_names, JF__COUNT, name, n); }
int ty__jinja_test_id(const char *name, size_t n) { return lookup(test_names, JTS__COUNT, name, n); }

/* ---- arguments ---- */

int ty__jinja_args_eval(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, size_t skip,
                        struct jj_args *fa)
{
    fa->n = 0;
    if (n->nargs > JJ_MAX_ARGS)
        return ty__jinja_fail(c, TY_EINVAL, n->line, "too many arguments");
    for (size_t i = skip; i < n->nargs; i++) {
        TRY(ty__jinja_eval(c, f, n->args[i], &fa->v[fa->n]));
        fa->names[fa->n] = n->argnames[i];
        fa->nl[fa->n] = n->argnlens[i];
        fa->n++;
    }
    return 0;
}

const jv *ty__jinja_arg(const struct jj_args *fa, size_t pos, const char *name)
{
    size_t k = 0;
    for (size_t i = 0; i < fa->n; i++) {
        if (!fa->names[i]) {
            if (k++ == pos)
                return &fa->v[i];
        } else if (name && fa->nl[i] == strlen(name) && memcmp(fa->names[i], name, fa->nl[i]) == 0) {
            return &fa->v[i];
        }
    }
    return NULL;
}

static jv arg_or(const struct jj_args *fa, size_t pos, const char *name, jv def)
{
    const jv *v = ty__jinja_arg(fa, pos, name);
    return v ? *v : def;
}

static jv J_INT(int64_t i) { jv v = {.t = JV_INT}; v.i = i; return v; }
static jv J_BOOL(bool b) { jv v = {.t = JV_BOOL}; v.b = b; return v; }
static jv J_STR(const char *s) { jv v = {.t = JV_STR}; v.s.p = s, v.s.n = strlen(s); return v; }
static const jv J_NONE = {.t = JV_NONE};

int ty__jinja_need_str(struct jj_ctx *c, int line, jv v, const char *what, jv *out)
{
    if (v.t == JV_UNDEF)
        return ty__jinja_tostr(c, v, out);
    if (v.t != JV_STR)
        return ty__jinja_fail(c, TY_EINVAL, line, "%s expects a string, not %s", what,
                              ty__jinja_typename(v));
    *out = v;
    return 0;
}

static int need_int(struct jj_ctx *c, int line, jv v, const char *what, int64_t *out)
{
    if (v.t == JV_INT || v.t == JV_BOOL) {
        *out = v.t == JV_INT ? v.i : v.b;
        return 0;
    }
    if (v.t == JV_FLOAT && isfinite(v.f) && fabs(v.f) < 9e18) {
        *out = (int64_t)v.f;
        return 0;
    }
    return ty__jinja_fail(c, TY_EINVAL, line, "%s expects an integer, not %s", what,
                          ty__jinja_typename(v));
}

/* ---- sorting and attribute helpers ---- */

static int attr_path(struct jj_ctx *c, int line, jv x, jv attr, jv *out)
{
    if (attr.t == JV_INT) {
        out->t = JV_UNDEF, out->s.p = NULL;
        if (x.t == JV_LIST && attr.i >= 0 && (uint64_t)attr.i < x.l->n)
            *out = x.l->v[attr.i];
        return 0;
    }
    if (attr.t != JV_STR)
        return ty__jinja_fail(c, TY_EINVAL, line, "attribute name must be a string");
    const char *p = attr.s.p, *e = p + attr.s.n;
    *out = x;
    while (p <= e) { /* dotted paths: "a.b" */
        const char *d = memchr(p, '.', (size_t)(e - p));
        if (!d)
            d = e;
        TRY(ty__jinja_getattr(c, line, *out, p, (size_t)(d - p), out));
        p = d + 1;
    }
    return 0;
}

static jv fold(struct jj_ctx *c, jv v, bool cs)
{
    if (cs || v.t != JV_STR)
        return v;
    char *s = ty__jinja_alloc(&c->ar, v.s.n + 1);
    if (!s)
        return v;
    for (size_t i = 0; i < v.s.n; i++)
        s[i] = (char)tolower((unsigned char)v.s.p[i]);
    v.s.p = s;
    return v;
}

/* Stable merge sort of `l` by keys[]. */
static int sort_by(struct jj_ctx *c, int line, jv *items, jv *keys, size_t n, bool rev)
{
    if (n < 2)
        return 0;
    size_t h = n / 2;
    TRY(sort_by(c, line, items, keys, h, rev));
    TRY(sort_by(c, line, items + h, keys + h, n - h, rev));
    jv *ti = ty__jinja_alloc(&c->ar, n * sizeof(jv)), *tk = ty__jinja_alloc(&c->ar, n * sizeof(jv));
    if (!ti || !tk)
        return ty__jinja_nomem(c, line);
    size_t i = 0, j = h, o = 0;
    while (i < h || j < n) {
        bool take_left = j >= n;
        if (!take_left && i < h) {
            int r;
            TRY(ty__jinja_cmp(c, line, keys[j], keys[i], &r));
            take_left = rev ? r <= 0 : r >= 0;
        }
        size_t s = take_left ? i++ : j++;
        ti[o] = items[s], tk[o] = keys[s], o++;
    }
    memcpy(items, ti, n * sizeof(jv));
    memcpy(keys, tk, n * sizeof(jv));
    return 0;
}

static int f_sort(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, jv *out)
{
    struct jlist *src;
    TRY(ty__jinja_iter(c, line, in, &src));
    bool rev = ty__jinja_truthy(arg_or(fa, 0, "reverse", J_BOOL(false)));
    bool cs = ty__jinja_truthy(arg_or(fa, 1, "case_sensitive", J_BOOL(false)));
    const jv *attr = ty__jinja_arg(fa, 2, "attribute");
    struct jlist *l = ty__jinja_list_new(c, src->n + 1);
    jv *keys = ty__jinja_alloc(&c->ar, (src->n + 1) * sizeof(jv));
    if (!l || !keys)
        return ty__jinja_nomem(c, line);
    for (size_t i = 0; i < src->n; i++) {
        l->v[i] = keys[i] = src->v[i];
        if (attr)
            TRY(attr_path(c, line, src->v[i], *attr, &keys[i]));
        keys[i] = fold(c, keys[i], cs);
    }
    l->n = src->n;
    TRY(sort_by(c, line, l->v, keys, l->n, rev));
    out->t = JV_LIST, out->l = l;
    return 0;
}

static int pair(struct jj_ctx *c, int line, jv k, jv v, jv *out)
{
    struct jlist *p = ty__jinja_list_new(c, 2);
    if (!p)
        return ty__jinja_nomem(c, line);
    p->v[0] = k, p->v[1] = v, p->n = 2;
    out->t = JV_LIST, out->l = p;
    return 0;
}

int ty__jinja_items(struct jj_ctx *c, int line, jv d, jv *out)
{
    if (d.t == JV_UNDEF) {
        out->t = JV_LIST;
        return (out->l = ty__jinja_list_new(c, 0)) ? 0 : ty__jinja_nomem(c, line);
    }
    if (d.t != JV_DICT && d.t != JV_NS)
        return ty__jinja_fail(c, TY_EINVAL, line, "items() expects a mapping, not %s",
                              ty__jinja_typename(d));
    struct jlist *l = ty__jinja_list_new(c, d.d->n + 1);
    if (!l)
        return ty__jinja_nomem(c, line);
    for (size_t i = 0; i < d.d->n; i++)
        TRY(pair(c, line, d.d->k[i], d.d->v[i], &l->v[i]));
    l->n = d.d->n;
    out->t = JV_LIST, out->l = l;
    return 0;
}

static int f_dictsort(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, jv *out)
{
    jv items;
    TRY(ty__jinja_items(c, line, in, &items));
    bool cs = ty__jinja_truthy(arg_or(fa, 0, "case_sensitive", J_BOOL(false)));
    jv by = arg_or(fa, 1, "by", J_STR("key"));
    bool rev = ty__jinja_truthy(arg_or(fa, 2, "reverse", J_BOOL(false)));
    int pos = by.t == JV_STR && by.s.n == 5 && memcmp(by.s.p, "value", 5) == 0;
    size_t n = items.l->n;
    jv *keys = ty__jinja_alloc(&c->ar, (n + 1) * sizeof(jv));
    if (!keys)
        return ty__jinja_nomem(c, line);
    for (size_t i = 0; i < n; i++)
        keys[i] = fold(c, items.l->v[i].l->v[pos], cs);
    TRY(sort_by(c, line, items.l->v, keys, n, rev));
    *out = items;
    return 0;
}

/* ---- string helpers ---- */

static int mkstr(struct jj_ctx *c, int line, const char *p, size_t n, jv *out)
{
    bool ok = true;
    *out = ty__jinja_str(c, p, n, &ok);
    return ok ? 0 : ty__jinja_nomem(c, line);
}

/* Map bytes with fn; `mode` 0: all, 1: capitalize, 2: title. ASCII letters only. */
static int str_case(struct jj_ctx *c, int line, jv s, int mode, int (*fn)(int), jv *out)
{
    TRY(mkstr(c, line, s.s.p, s.s.n, out));
    char *p = (char *)out->s.p;
    bool start = true;
    for (size_t i = 0; i < s.s.n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (mode == 0)
            p[i] = (char)fn(ch);
        else if (mode == 1)
            p[i] = (char)(i == 0 ? toupper(ch) : tolower(ch));
        else {
            p[i] = (char)(start ? toupper(ch) : tolower(ch));
            start = strchr("-({[< \t\n\r\f\v", ch) != NULL && ch;
        }
    }
    return 0;
}

static int f_replace(struct jj_ctx *c, int line, jv s, jv old, jv new, int64_t count, jv *out)
{
    struct jj_buf b = {0};
    size_t i = 0;
    int rc = 0;
    int64_t done = 0;
    while (!rc && i <= s.s.n) {
        const char *hit = NULL;
        if (count < 0 || done < count) {
            if (old.s.n == 0)
                hit = s.s.p + i;
            else
                for (size_t k = i; k + old.s.n <= s.s.n && !hit; k++)
                    if (memcmp(s.s.p + k, old.s.p, old.s.n) == 0)
                        hit = s.s.p + k;
        }
        if (!hit) {
            rc = ty__jinja_buf_put(c, &b, s.s.p + i, s.s.n - i);
            break;
        }
        size_t at = (size_t)(hit - s.s.p);
        rc = ty__jinja_buf_put(c, &b, s.s.p + i, at - i);
        if (!rc)
            rc = ty__jinja_buf_put(c, &b, new.s.p, new.s.n);
        done++;
        if (old.s.n == 0) { /* "abc".replace("", "-") == "-a-b-c-" */
            if (at >= s.s.n)
                break;
            size_t nx = at + 1;
            while (nx < s.s.n && ((unsigned char)s.s.p[nx] & 0xC0) == 0x80)
                nx++;
            if (!rc)
                rc = ty__jinja_buf_put(c, &b, s.s.p + at, nx - at);
            i = nx;
            if (i == s.s.n && (count < 0 || done < count)) {
                if (!rc)
                    rc = ty__jinja_buf_put(c, &b, new.s.p, new.s.n);
                break;
            }
        } else {
            i = at + old.s.n;
        }
    }
    if (!rc)
        rc = mkstr(c, line, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

int ty__jinja_replace(struct jj_ctx *c, int line, jv s, jv old, jv new, int64_t count, jv *out)
{
    return f_replace(c, line, s, old, new, count, out);
}

static int f_indent(struct jj_ctx *c, int line, jv s, const struct jj_args *fa, jv *out)
{
    jv w = arg_or(fa, 0, "width", J_INT(4));
    bool first = ty__jinja_truthy(arg_or(fa, 1, "first", J_BOOL(false)));
    bool blank = ty__jinja_truthy(arg_or(fa, 2, "blank", J_BOOL(false)));
    char pad[256];
    size_t pn;
    if (w.t == JV_STR) {
        pn = w.s.n < sizeof(pad) ? w.s.n : sizeof(pad);
        memcpy(pad, w.s.p, pn);
    } else {
        int64_t k = 0;
        TRY(need_int(c, line, w, "indent", &k));
        pn = k < 0 ? 0 : k > 255 ? 255 : (size_t)k;
        memset(pad, ' ', pn);
    }
    struct jj_buf b = {0};
    int rc = first ? ty__jinja_buf_put(c, &b, pad, pn) : 0;
    /* s + "\n", split on line ends, each line after the first indented unless blank */
    size_t i = 0, ln = 0;
    while (!rc && i < s.s.n) {
        size_t e = i;
        while (e < s.s.n && s.s.p[e] != '\n')
            e++;
        if (ln > 0) {
            rc = ty__jinja_buf_put(c, &b, "\n", 1);
            if (!rc && (blank || e > i))
                rc = ty__jinja_buf_put(c, &b, pad, pn);
        }
        if (!rc)
            rc = ty__jinja_buf_put(c, &b, s.s.p + i, e - i);
        ln++;
        i = e + 1;
    }
    if (!rc)
        rc = mkstr(c, line, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

static int f_truncate(struct jj_ctx *c, int line, jv s, const struct jj_args *fa, jv *out)
{
    int64_t length = 0, leeway = 0;
    TRY(need_int(c, line, arg_or(fa, 0, "length", J_INT(255)), "truncate", &length));
    bool kill = ty__jinja_truthy(arg_or(fa, 1, "killwords", J_BOOL(false)));
    jv end = arg_or(fa, 2, "end", J_STR("..."));
    TRY(ty__jinja_need_str(c, line, end, "truncate", &end));
    TRY(need_int(c, line, arg_or(fa, 3, "leeway", J_INT(5)), "truncate", &leeway));
    int64_t n = (int64_t)ty__jinja_utf8_len(s.s.p, s.s.n);
    if (n <= length + leeway) {
        *out = s;
        return 0;
    }
    int64_t keep = length - (int64_t)ty__jinja_utf8_len(end.s.p, end.s.n);
    if (keep < 0)
        keep = n + keep < 0 ? 0 : n + keep; /* Python negative slice end */
    size_t cut = ty__jinja_utf8_off(s.s.p, s.s.n, (size_t)keep);
    if (!kill) {
        size_t sp = cut;
        while (sp > 0 && s.s.p[sp - 1] != ' ')
            sp--;
        if (sp > 0)
            cut = sp - 1;
    }
    char *o = ty__jinja_alloc(&c->ar, cut + end.s.n + 1);
    if (!o)
        return ty__jinja_nomem(c, line);
    memcpy(o, s.s.p, cut);
    memcpy(o + cut, end.s.p, end.s.n);
    out->t = JV_STR, out->s.p = o, out->s.n = cut + end.s.n;
    return 0;
}

static int f_escape(struct jj_ctx *c, int line, jv s, jv *out)
{
    struct jj_buf b = {0};
    int rc = 0;
    for (size_t i = 0; i < s.s.n && !rc; i++) {
        const char *r = NULL;
        switch (s.s.p[i]) {
        case '&': r = "&amp;"; break;
        case '<': r = "&lt;"; break;
        case '>': r = "&gt;"; break;
        case '"': r = "&#34;"; break;
        case '\'': r = "&#39;"; break;
        }
        rc = r ? ty__jinja_buf_put(c, &b, r, strlen(r)) : ty__jinja_buf_put(c, &b, s.s.p + i, 1);
    }
    if (!rc)
        rc = mkstr(c, line, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

static int f_striptags(struct jj_ctx *c, int line, jv s, jv *out)
{
    struct jj_buf b = {0};
    int rc = 0;
    bool in_tag = false, space = false;
    for (size_t i = 0; i < s.s.n && !rc; i++) {
        char ch = s.s.p[i];
        if (in_tag) {
            in_tag = ch != '>';
            continue;
        }
        if (ch == '<' && i + 1 < s.s.n && strchr(s.s.p + i + 1, '>')) {
            in_tag = true;
            continue;
        }
        if (isspace((unsigned char)ch)) {
            space = b.n > 0;
            continue;
        }
        if (space)
            rc = ty__jinja_buf_put(c, &b, " ", 1);
        space = false;
        if (!rc)
            rc = ty__jinja_buf_put(c, &b, &ch, 1);
    }
    if (!rc)
        rc = mkstr(c, line, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

static int f_center(struct jj_ctx *c, int line, jv s, const struct jj_args *fa, jv *out)
{
    int64_t w = 0;
    TRY(need_int(c, line, arg_or(fa, 0, "width", J_INT(80)), "center", &w));
    int64_t n = (int64_t)ty__jinja_utf8_len(s.s.p, s.s.n);
    if (w <= n || w > (int64_t)c->lim.max_out) {
        *out = s;
        return 0;
    }
    int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
    char *o = ty__jinja_alloc(&c->ar, s.s.n + (size_t)pad + 1);
    if (!o)
        return ty__jinja_nomem(c, line);
    memset(o, ' ', s.s.n + (size_t)pad);
    memcpy(o + left, s.s.p, s.s.n);
    out->t = JV_STR, out->s.p = o, out->s.n = s.s.n + (size_t)pad;
    return 0;
}

/* Python round(): correctly rounded via printf, half-even on exact ties. */
static double py_round(double x, int64_t p)
{
    if (!isfinite(x) || p > 300 || p < -300)
        return x;
    if (p >= 0) {
        char t[512];
        snprintf(t, sizeof(t), "%.*f", (int)p, x);
        return strtod(t, NULL);
    }
    double m = pow(10, (double)-p);
    return nearbyint(x / m) * m;
}

static int f_round(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, jv *out)
{
    int64_t p = 0;
    TRY(need_int(c, line, arg_or(fa, 0, "precision", J_INT(0)), "round", &p));
    jv m = arg_or(fa, 1, "method", J_STR("common"));
    if (in.t != JV_INT && in.t != JV_FLOAT && in.t != JV_BOOL)
        return ty__jinja_fail(c, TY_EINVAL, line, "round expects a number, not %s",
                              ty__jinja_typename(in));
    double x = in.t == JV_FLOAT ? in.f : in.t == JV_INT ? (double)in.i : in.b;
    double sc = pow(10, (double)p);
    out->t = JV_FLOAT;
    if (m.t == JV_STR && m.s.n == 4 && memcmp(m.s.p, "ceil", 4) == 0)
        out->f = ceil(x * sc) / sc;
    else if (m.t == JV_STR && m.s.n == 5 && memcmp(m.s.p, "floor", 5) == 0)
        out->f = floor(x * sc) / sc;
    else if (m.t == JV_STR && m.s.n == 6 && memcmp(m.s.p, "common", 6) == 0)
        out->f = py_round(x, p);
    else
        return ty__jinja_fail(c, TY_EINVAL, line, "round: method must be common, ceil or floor");
    return 0;
}

static int f_int(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, jv *out)
{
    jv def = arg_or(fa, 0, "default", J_INT(0));
    int64_t base = 10;
    TRY(need_int(c, line, arg_or(fa, 1, "base", J_INT(10)), "int", &base));
    if (in.t == JV_INT || in.t == JV_BOOL) {
        *out = J_INT(in.t == JV_INT ? in.i : in.b);
        return 0;
    }
    if (in.t == JV_FLOAT) {
        *out = isfinite(in.f) && fabs(in.f) < 9e18 ? J_INT((int64_t)in.f) : def;
        return 0;
    }
    *out = def;
    if (in.t != JV_STR || in.s.n > 64 || base < 2 || base > 36)
        return 0;
    char t[72], *e;
    memcpy(t, in.s.p, in.s.n);
    t[in.s.n] = 0;
    errno = 0;
    long long v = strtoll(t, &e, (int)base);
    while (*e && isspace((unsigned char)*e))
        e++;
    if (!errno && e != t && !*e) {
        *out = J_INT(v);
        return 0;
    }
    double d = strtod(t, &e);
    while (*e && isspace((unsigned char)*e))
        e++;
    if (e != t && !*e && isfinite(d) && fabs(d) < 9e18)
        *out = J_INT((int64_t)d);
    return 0;
}

static int f_float(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, jv *out)
{
    (void)c, (void)line;
    jv def = arg_or(fa, 0, "default", (jv){.t = JV_FLOAT});
    out->t = JV_FLOAT;
    if (in.t == JV_INT || in.t == JV_BOOL) {
        out->f = in.t == JV_INT ? (double)in.i : in.b;
        return 0;
    }
    if (in.t == JV_FLOAT) {
        *out = in;
        return 0;
    }
    *out = def;
    if (in.t != JV_STR || in.s.n > 64)
        return 0;
    char t[72], *e;
    memcpy(t, in.s.p, in.s.n);
    t[in.s.n] = 0;
    double d = strtod(t, &e);
    while (*e && isspace((unsigned char)*e))
        e++;
    if (e != t && !*e)
        out->t = JV_FLOAT, out->f = d;
    return 0;
}

/* ---- select / map ---- */

static int apply_filter(struct jj_ctx *c, int line, int id, jv in, const struct jj_args *fa,
                        jv *out);

/* args after the test name (positional from `from`) as a plain array */
static size_t rest_args(const struct jj_args *fa, size_t from, jv *out)
{
    size_t k = 0, n = 0;
    for (size_t i = 0; i < fa->n; i++)
        if (!fa->names[i] && k++ >= from)
            out[n++] = fa->v[i];
    return n;
}

static int f_select(struct jj_ctx *c, int line, int id, jv in, const struct jj_args *fa, jv *out)
{
    bool byattr = id == JF_SELECTATTR || id == JF_REJECTATTR;
    bool want = id == JF_SELECT || id == JF_SELECTATTR;
    struct jlist *src, *l;
    TRY(ty__jinja_iter(c, line, in, &src));
    if (!(l = ty__jinja_list_new(c, 0)))
        return ty__jinja_nomem(c, line);
    const jv *attr = byattr ? ty__jinja_arg(fa, 0, NULL) : NULL;
    if (byattr && !attr)
        return ty__jinja_fail(c, TY_EINVAL, line, "selectattr/rejectattr need an attribute");
    const jv *tname = ty__jinja_arg(fa, byattr ? 1 : 0, NULL);
    int tid = -1;
    if (tname) {
        if (tname->t != JV_STR || (tid = ty__jinja_test_id(tname->s.p, tname->s.n)) < 0)
            return ty__jinja_fail(c, TY_EINVAL, line, "unsupported test '%.*s'",
                                  tname->t == JV_STR ? (int)(tname->s.n > 60 ? 60 : tname->s.n)
                                                     : 1,
                                  tname->t == JV_STR ? tname->s.p : "?");
    }
    jv targs[JJ_MAX_ARGS];
    size_t nt = rest_args(fa, byattr ? 2 : 1, targs);
    for (size_t i = 0; i < src->n; i++) {
        jv x = src->v[i];
        bool r;
        if (attr)
            TRY(attr_path(c, line, x, *attr, &x));
        if (tid >= 0)
            TRY(ty__jinja_apply_test(c, line, tid, x, targs, nt, &r));
        else
            r = ty__jinja_truthy(x);
        if (r == want && ty__jinja_list_push(c, l, src->v[i]))
            return ty__jinja_nomem(c, line);
    }
    out->t = JV_LIST, out->l = l;
    return 0;
}

static int f_map(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, jv *out)
{
    struct jlist *src, *l;
    TRY(ty__jinja_iter(c, line, in, &src));
    if (!(l = ty__jinja_list_new(c, src->n + 1)))
        return ty__jinja_nomem(c, line);
    const jv *attr = ty__jinja_arg(fa, 99, "attribute");
    const jv *def = ty__jinja_arg(fa, 99, "default");
    const jv *fname = ty__jinja_arg(fa, 0, NULL);
    int fid = -1;
    struct jj_args sub = {0};
    if (!attr) {
        if (!fname || fname->t != JV_STR ||
            (fid = ty__jinja_filter_id(fname->s.p, fname->s.n)) < 0)
            return ty__jinja_fail(c, TY_EINVAL, line, "map: unsupported filter '%.*s'",
                                  fname && fname->t == JV_STR ? (int)(fname->s.n > 60 ? 60 : fname->s.n) : 1,
                                  fname && fname->t == JV_STR ? fname->s.p : "?");
        bool skipped = false;
        for (size_t i = 0; i < fa->n; i++) {
            if (!fa->names[i] && !skipped) {
                skipped = true;
                continue;
            }
            sub.v[sub.n] = fa->v[i], sub.names[sub.n] = fa->names[i], sub.nl[sub.n] = fa->nl[i];
            sub.n++;
        }
    }
    for (size_t i = 0; i < src->n; i++) {
        if (attr) {
            TRY(attr_path(c, line, src->v[i], *attr, &l->v[i]));
            if (def && l->v[i].t == JV_UNDEF)
                l->v[i] = *def;
        } else {
            TRY(apply_filter(c, line, fid, src->v[i], &sub, &l->v[i]));
        }
    }
    l->n = src->n;
    out->t = JV_LIST, out->l = l;
    return 0;
}

static int f_minmax(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, bool max,
                    jv *out)
{
    struct jlist *src;
    TRY(ty__jinja_iter(c, line, in, &src));
    bool cs = ty__jinja_truthy(arg_or(fa, 0, "case_sensitive", J_BOOL(false)));
    const jv *attr = ty__jinja_arg(fa, 1, "attribute");
    out->t = JV_UNDEF, out->s.p = NULL;
    jv best = {0};
    for (size_t i = 0; i < src->n; i++) {
        jv k = src->v[i];
        int r;
        if (attr)
            TRY(attr_path(c, line, k, *attr, &k));
        k = fold(c, k, cs);
        if (i > 0)
            TRY(ty__jinja_cmp(c, line, k, best, &r));
        if (i == 0 || (max ? r > 0 : r < 0))
            best = k, *out = src->v[i];
    }
    return 0;
}

static int f_unique(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, jv *out)
{
    struct jlist *src, *l, *seen;
    TRY(ty__jinja_iter(c, line, in, &src));
    bool cs = ty__jinja_truthy(arg_or(fa, 0, "case_sensitive", J_BOOL(false)));
    const jv *attr = ty__jinja_arg(fa, 1, "attribute");
    if (!(l = ty__jinja_list_new(c, 0)) || !(seen = ty__jinja_list_new(c, 0)))
        return ty__jinja_nomem(c, line);
    for (size_t i = 0; i < src->n; i++) {
        jv k = src->v[i];
        if (attr)
            TRY(attr_path(c, line, k, *attr, &k));
        k = fold(c, k, cs);
        bool dup = false;
        for (size_t j = 0; j < seen->n && !dup; j++)
            dup = ty__jinja_eq(seen->v[j], k);
        if (!dup && (ty__jinja_list_push(c, seen, k) || ty__jinja_list_push(c, l, src->v[i])))
            return ty__jinja_nomem(c, line);
    }
    out->t = JV_LIST, out->l = l;
    return 0;
}

static int f_join(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, jv *out)
{
    struct jlist *src;
    TRY(ty__jinja_iter(c, line, in, &src));
    jv sep = arg_or(fa, 0, "d", J_STR(""));
    const jv *attr = ty__jinja_arg(fa, 1, "attribute");
    TRY(ty__jinja_tostr(c, sep, &sep));
    struct jj_buf b = {0};
    int rc = 0;
    for (size_t i = 0; i < src->n && !rc; i++) {
        jv x = src->v[i];
        if (i)
            rc = ty__jinja_buf_put(c, &b, sep.s.p, sep.s.n);
        if (!rc && attr)
            rc = attr_path(c, line, x, *attr, &x);
        if (!rc)
            rc = ty__jinja_buf_str(c, &b, x);
    }
    if (!rc)
        rc = mkstr(c, line, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

static int f_sum(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, jv *out)
{
    struct jlist *src;
    TRY(ty__jinja_iter(c, line, in, &src));
    const jv *attr = ty__jinja_arg(fa, 0, "attribute");
    jv acc = arg_or(fa, 1, "start", J_INT(0));
    for (size_t i = 0; i < src->n; i++) {
        jv x = src->v[i];
        if (attr)
            TRY(attr_path(c, line, x, *attr, &x));
        bool xi = x.t == JV_INT || x.t == JV_BOOL, ai = acc.t == JV_INT || acc.t == JV_BOOL;
        if ((!xi && x.t != JV_FLOAT) || (!ai && acc.t != JV_FLOAT))
            return ty__jinja_fail(c, TY_EINVAL, line, "sum: unsupported operand type(s): '%s' "
                                  "and '%s'", ty__jinja_typename(acc), ty__jinja_typename(x));
        if (xi && ai) {
            int64_t r;
            if (__builtin_add_overflow(acc.t == JV_INT ? acc.i : acc.b, x.t == JV_INT ? x.i : x.b, &r))
                return ty__jinja_fail(c, TY_ERANGE, line, "integer overflow");
            acc = J_INT(r);
        } else {
            double a = acc.t == JV_FLOAT ? acc.f : (double)(acc.t == JV_INT ? acc.i : acc.b);
            double b = x.t == JV_FLOAT ? x.f : (double)(x.t == JV_INT ? x.i : x.b);
            acc.t = JV_FLOAT, acc.f = a + b;
        }
    }
    *out = acc;
    return 0;
}

static int f_batch(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, jv *out)
{
    struct jlist *src, *l, *cur = NULL;
    int64_t n = 0;
    TRY(ty__jinja_iter(c, line, in, &src));
    TRY(need_int(c, line, arg_or(fa, 0, "linecount", J_INT(1)), "batch", &n));
    const jv *fill = ty__jinja_arg(fa, 1, "fill_with");
    if (n <= 0)
        return ty__jinja_fail(c, TY_EINVAL, line, "batch: count must be positive");
    if (!(l = ty__jinja_list_new(c, 0)))
        return ty__jinja_nomem(c, line);
    for (size_t i = 0; i < src->n; i++) {
        if (!cur || (int64_t)cur->n == n) {
            jv v = {.t = JV_LIST};
            if (!(cur = v.l = ty__jinja_list_new(c, 0)) || ty__jinja_list_push(c, l, v))
                return ty__jinja_nomem(c, line);
        }
        if (ty__jinja_list_push(c, cur, src->v[i]))
            return ty__jinja_nomem(c, line);
    }
    while (fill && cur && (int64_t)cur->n < n)
        if (ty__jinja_list_push(c, cur, *fill))
            return ty__jinja_nomem(c, line);
    out->t = JV_LIST, out->l = l;
    return 0;
}

static int f_tojson(struct jj_ctx *c, int line, jv in, const struct jj_args *fa, jv *out)
{
    jv ind = arg_or(fa, 1, "indent", J_NONE);
    bool sort = ty__jinja_truthy(arg_or(fa, 3, "sort_keys", J_BOOL(false)));
    const jv *seps = ty__jinja_arg(fa, 2, "separators");
    int indent = -1;
    if (ind.t == JV_INT)
        indent = ind.i < 0 ? 0 : ind.i > 64 ? 64 : (int)ind.i;
    else if (ind.t != JV_NONE)
        return ty__jinja_fail(c, TY_EINVAL, line, "tojson: indent must be an integer");
    char isep[16] = ", ", ksep[16] = ": ";
    if (indent >= 0)
        strcpy(isep, ",");
    if (seps && seps->t == JV_LIST && seps->l->n == 2 && seps->l->v[0].t == JV_STR &&
        seps->l->v[1].t == JV_STR && seps->l->v[0].s.n < 16 && seps->l->v[1].s.n < 16) {
        memcpy(isep, seps->l->v[0].s.p, seps->l->v[0].s.n), isep[seps->l->v[0].s.n] = 0;
        memcpy(ksep, seps->l->v[1].s.p, seps->l->v[1].s.n), ksep[seps->l->v[1].s.n] = 0;
    } else if (seps && seps->t != JV_NONE) {
        return ty__jinja_fail(c, TY_EINVAL, line, "tojson: separators must be two strings");
    }
    struct jj_buf b = {0};
    int rc = ty__jinja_tojson(c, line, &b, in, indent, isep, ksep, sort, 0);
    if (!rc)
        rc = mkstr(c, line, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

static int f_length(struct jj_ctx *c, int line, jv in, jv *out)
{
    switch (in.t) {
    case JV_UNDEF: *out = J_INT(0); return 0;
    case JV_STR: *out = J_INT((int64_t)ty__jinja_utf8_len(in.s.p, in.s.n)); return 0;
    case JV_LIST: *out = J_INT((int64_t)in.l->n); return 0;
    case JV_DICT:
    case JV_NS: *out = J_INT((int64_t)in.d->n); return 0;
    default:
        return ty__jinja_fail(c, TY_EINVAL, line, "object of type '%s' has no len()",
                              ty__jinja_typename(in));
    }
}

static int f_firstlast(struct jj_ctx *c, int line, jv in, bool last, jv *out)
{
    struct jlist *l;
    TRY(ty__jinja_iter(c, line, in, &l));
    if (!l->n) {
        out->t = JV_UNDEF, out->s.p = NULL;
        return 0;
    }
    *out = l->v[last ? l->n - 1 : 0];
    return 0;
}

static int f_reverse(struct jj_ctx *c, int line, jv in, jv *out)
{
    struct jlist *src, *l;
    TRY(ty__jinja_iter(c, line, in, &src));
    if (!(l = ty__jinja_list_new(c, src->n + 1)))
        return ty__jinja_nomem(c, line);
    for (size_t i = 0; i < src->n; i++)
        l->v[i] = src->v[src->n - 1 - i];
    l->n = src->n;
    if (in.t != JV_STR) {
        out->t = JV_LIST, out->l = l;
        return 0;
    }
    char *s = ty__jinja_alloc(&c->ar, in.s.n + 1);
    if (!s)
        return ty__jinja_nomem(c, line);
    size_t o = 0;
    for (size_t i = 0; i < l->n; i++)
        memcpy(s + o, l->v[i].s.p, l->v[i].s.n), o += l->v[i].s.n;
    out->t = JV_STR, out->s.p = s, out->s.n = o;
    return 0;
}

static int f_wordcount(jv s, jv *out)
{
    int64_t n = 0;
    bool in = false;
    for (size_t i = 0; i < s.s.n; i++) {
        unsigned char ch = (unsigned char)s.s.p[i];
        bool w = isalnum(ch) || ch == '_' || ch >= 0x80;
        n += w && !in;
        in = w;
    }
    *out = J_INT(n);
    return 0;
}

static int f_string_filters(struct jj_ctx *c, int line, int id, jv in, const struct jj_args *fa,
                            jv *out)
{
    jv s;
    TRY(ty__jinja_tostr(c, in, &s));
    switch (id) {
    case JF_CAPITALIZE: return str_case(c, line, s, 1, NULL, out);
    case JF_TITLE: return str_case(c, line, s, 2, NULL, out);
    case JF_LOWER: return str_case(c, line, s, 0, tolower, out);
    case JF_UPPER: return str_case(c, line, s, 0, toupper, out);
    case JF_CENTER: return f_center(c, line, s, fa, out);
    case JF_E:
    case JF_ESCAPE: return f_escape(c, line, s, out);
    case JF_INDENT: return f_indent(c, line, s, fa, out);
    case JF_STRIPTAGS: return f_striptags(c, line, s, out);
    case JF_TRUNCATE: return f_truncate(c, line, s, fa, out);
    case JF_WORDCOUNT: return f_wordcount(s, out);
    case JF_FORMAT: {
        jv l = {.t = JV_LIST};
        if (!(l.l = ty__jinja_list_new(c, fa->n + 1)))
            return ty__jinja_nomem(c, line);
        l.l->n = rest_args(fa, 0, l.l->v);
        return ty__jinja_pyformat(c, line, s, l, out);
    }
    case JF_REPLACE: {
        jv old = arg_or(fa, 0, "old", J_STR("")), new = arg_or(fa, 1, "new", J_STR(""));
        int64_t cnt = -1;
        const jv *cv = ty__jinja_arg(fa, 2, "count");
        TRY(ty__jinja_tostr(c, old, &old));
        TRY(ty__jinja_tostr(c, new, &new));
        if (cv && cv->t != JV_NONE)
            TRY(need_int(c, line, *cv, "replace", &cnt));
        return f_replace(c, line, s, old, new, cnt, out);
    }
    case JF_TRIM: {
        size_t b = 0, e = s.s.n;
        const jv *chars = ty__jinja_arg(fa, 0, "chars");
        bool cs = chars && chars->t == JV_STR;
#define STRIPPABLE(ch) (cs ? memchr(chars->s.p, (ch), chars->s.n) != NULL : isspace((unsigned char)(ch)))
        while (b < e && STRIPPABLE(s.s.p[b]))
            b++;
        while (e > b && STRIPPABLE(s.s.p[e - 1]))
            e--;
#undef STRIPPABLE
        *out = s;
        out->s.p += b, out->s.n = e - b;
        return 0;
    }
    }
    return ty__jinja_fail(c, TY_EINVAL, line, "bad filter");
}

static int apply_filter(struct jj_ctx *c, int line, int id, jv in, const struct jj_args *fa,
                        jv *out)
{
    switch (id) {
    case JF_ABS:
        if (in.t == JV_INT && in.i != INT64_MIN)
            *out = J_INT(in.i < 0 ? -in.i : in.i);
        else if (in.t == JV_FLOAT)
            *out = in, out->f = fabs(in.f);
        else if (in.t == JV_BOOL)
            *out = J_INT(in.b);
        else
            return ty__jinja_fail(c, TY_EINVAL, line, "bad operand type for abs(): '%s'",
                                  ty__jinja_typename(in));
        return 0;
    case JF_ATTR: {
        jv name = arg_or(fa, 0, "name", J_STR(""));
        if (name.t != JV_STR)
            return ty__jinja_fail(c, TY_EINVAL, line, "attr: name must be a string");
        if (in.t == JV_DICT) { /* attr() is getattr(): no item lookup */
            out->t = JV_UNDEF, out->s.p = NULL;
            return 0;
        }
        return ty__jinja_getattr(c, line, in, name.s.p, name.s.n, out);
    }
    case JF_BATCH: return f_batch(c, line, in, fa, out);
    case JF_COUNT:
    case JF_LENGTH: return f_length(c, line, in, out);
    case JF_D:
    case JF_DEFAULT: {
        bool boolean = ty__jinja_truthy(arg_or(fa, 1, "boolean", J_BOOL(false)));
        bool use = in.t == JV_UNDEF || (boolean && !ty__jinja_truthy(in));
        *out = use ? arg_or(fa, 0, "default_value", J_STR("")) : in;
        return 0;
    }
    case JF_DICTSORT: return f_dictsort(c, line, in, fa, out);
    case JF_FIRST: return f_firstlast(c, line, in, false, out);
    case JF_LAST: return f_firstlast(c, line, in, true, out);
    case JF_FLOAT: return f_float(c, line, in, fa, out);
    case JF_INT: return f_int(c, line, in, fa, out);
    case JF_ITEMS: return ty__jinja_items(c, line, in, out);
    case JF_JOIN: return f_join(c, line, in, fa, out);
    case JF_LIST: {
        struct jlist *l;
        TRY(ty__jinja_iter(c, line, in, &l));
        out->t = JV_LIST, out->l = l;
        return 0;
    }
    case JF_MAP: return f_map(c, line, in, fa, out);
    case JF_MAX: return f_minmax(c, line, in, fa, true, out);
    case JF_MIN: return f_minmax(c, line, in, fa, false, out);
    case JF_REJECT:
    case JF_REJECTATTR:
    case JF_SELECT:
    case JF_SELECTATTR: return f_select(c, line, id, in, fa, out);
    case JF_REVERSE: return f_reverse(c, line, in, out);
    case JF_ROUND: return f_round(c, line, in, fa, out);
    case JF_SAFE: *out = in; return 0;
    case JF_SORT: return f_sort(c, line, in, fa, out);
    case JF_STRING: return ty__jinja_tostr(c, in, out);
    case JF_SUM: return f_sum(c, line, in, fa, out);
    case JF_TOJSON: return f_tojson(c, line, in, fa, out);
    case JF_UNIQUE: return f_unique(c, line, in, fa, out);
    default: return f_string_filters(c, line, id, in, fa, out);
    }
}

int ty__jinja_filter(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv in, jv *out)
{
    struct jj_args fa;
    TRY(ty__jinja_args_eval(c, f, n, 0, &fa));
    return apply_filter(c, n->line, n->op, in, &fa, out);
}

/* ---- tests ---- */

static bool str_cased(jv x, bool upper)
{
    bool any = false;
    for (size_t i = 0; i < x.s.n; i++) {
        unsigned char ch = (unsigned char)x.s.p[i];
        if (upper ? islower(ch) : isupper(ch))
            return false;
        any = any || isalpha(ch);
    }
    return any;
}

int ty__jinja_apply_test(struct jj_ctx *c, int line, int id, jv x, const jv *args, size_t nargs,
                         bool *out)
{
    jv a = nargs ? args[0] : (jv){.t = JV_UNDEF};
    int r;
    bool isint = x.t == JV_INT, num = x.t == JV_INT || x.t == JV_FLOAT || x.t == JV_BOOL;
    switch (id) {
    case JTS_BOOLEAN: *out = x.t == JV_BOOL; return 0;
    case JTS_CALLABLE: *out = x.t == JV_MACRO || x.t == JV_FUNC; return 0;
    case JTS_DEFINED: *out = x.t != JV_UNDEF; return 0;
    case JTS_UNDEFINED: *out = x.t == JV_UNDEF; return 0;
    case JTS_DIVISIBLEBY:
        if (!isint || a.t != JV_INT || a.i == 0)
            return ty__jinja_fail(c, TY_EINVAL, line, "divisibleby needs integers (non-zero)");
        *out = a.i == -1 || x.i % a.i == 0;
        return 0;
    case JTS_EQ:
    case JTS_EQUALTO: *out = ty__jinja_eq(x, a); return 0;
    case JTS_NE: *out = !ty__jinja_eq(x, a); return 0;
    case JTS_EVEN:
    case JTS_ODD:
        if (!isint && x.t != JV_BOOL)
            return ty__jinja_fail(c, TY_EINVAL, line, "even/odd need an integer, not %s",
                                  ty__jinja_typename(x));
        *out = (((isint ? x.i : x.b) & 1) != 0) == (id == JTS_ODD);
        return 0;
    case JTS_FALSE: *out = x.t == JV_BOOL && !x.b; return 0;
    case JTS_TRUE: *out = x.t == JV_BOOL && x.b; return 0;
    case JTS_FLOAT: *out = x.t == JV_FLOAT; return 0;
    case JTS_INTEGER: *out = isint; return 0;
    case JTS_NUMBER: *out = num; return 0;
    case JTS_NONE: *out = x.t == JV_NONE; return 0;
    case JTS_STRING: *out = x.t == JV_STR; return 0;
    case JTS_MAPPING: *out = x.t == JV_DICT; return 0;
    case JTS_ITERABLE:
    case JTS_SEQUENCE:
        *out = x.t == JV_STR || x.t == JV_LIST || x.t == JV_DICT || x.t == JV_UNDEF;
        return 0;
    case JTS_LOWER: *out = x.t == JV_STR && str_cased(x, false); return 0;
    case JTS_UPPER: *out = x.t == JV_STR && str_cased(x, true); return 0;
    case JTS_SAMEAS:
        *out = x.t == a.t && (x.t == JV_NONE || x.t == JV_UNDEF ||
                              (x.t == JV_BOOL && x.b == a.b) ||
                              (x.t == JV_LIST && x.l == a.l) || (x.t == JV_DICT && x.d == a.d) ||
                              (x.t == JV_INT && x.i == a.i && x.i >= -5 && x.i <= 256) ||
                              (x.t == JV_STR && x.s.p == a.s.p && x.s.n == a.s.n));
        return 0;
    case JTS_IN: {
        struct jlist *l;
        if (a.t == JV_STR && x.t == JV_STR) {
            *out = false;
            for (size_t i = 0; !*out && i + x.s.n <= a.s.n; i++)
                *out = memcmp(a.s.p + i, x.s.p, x.s.n) == 0;
            return 0;
        }
        TRY(ty__jinja_iter(c, line, a, &l));
        *out = false;
        for (size_t i = 0; i < l->n && !*out; i++)
            *out = ty__jinja_eq(x, l->v[i]);
        return 0;
    }
    case JTS_GE:
    case JTS_GT:
    case JTS_GREATERTHAN:
    case JTS_LE:
    case JTS_LT:
    case JTS_LESSTHAN:
        TRY(ty__jinja_cmp(c, line, x, a, &r));
        *out = id == JTS_GE ? r >= 0 : id == JTS_LE ? r <= 0 : (id == JTS_GT || id == JTS_GREATERTHAN) ? r > 0 : r < 0;
        return 0;
    }
    return ty__jinja_fail(c, TY_EINVAL, line, "bad test");
}

int ty__jinja_test(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv in, bool *out)
{
    struct jj_args fa;
    TRY(ty__jinja_args_eval(c, f, n, 0, &fa));
    return ty__jinja_apply_test(c, n->line, n->op, in, fa.v, fa.n, out);
}
