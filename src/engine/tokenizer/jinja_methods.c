/* Jinja builtins, part 2: Python methods of str/dict/list (and loop.cycle), the globals range,
 * dict, namespace, raise_exception and strftime_now, and `%` string formatting. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja-impl.h"

#define JJ_METHOD_MAP(XX)                                                                         \
    XX(STRIP, "strip") XX(LSTRIP, "lstrip") XX(RSTRIP, "rstrip") XX(SPLIT, "split")              \
    XX(RSPLIT, "rsplit") XX(STARTSWITH, "startswith") XX(ENDSWITH, "endswith")                   \
    XX(UPPER, "upper") XX(LOWER, "lower") XX(TITLE, "title") XX(CAPITALIZE, "capitalize")        \
    XX(REPLACE, "replace") XX(FIND, "find") XX(RFIND, "rfind") XX(INDEX, "index")                \
    XX(COUNT, "count") XX(JOIN, "join") XX(FORMAT, "format") XX(ISDIGIT, "isdigit")              \
    XX(ISALPHA, "isalpha") XX(ISALNUM, "isalnum") XX(ISSPACE, "isspace") XX(ISUPPER, "isupper")  \
    XX(ISLOWER, "islower") XX(SPLITLINES, "splitlines") XX(ITEMS, "items") XX(KEYS, "keys")      \
    XX(VALUES, "values") XX(GET, "get") XX(CYCLE, "cycle") XX(APPEND, "append") XX(POP, "pop")   \
    XX(INSERT, "insert") XX(EXTEND, "extend") XX(REMOVE, "remove") XX(UPDATE, "update")          \
    XX(CLEAR, "clear") XX(SETDEFAULT, "setdefault")
enum {
#define XX(id, name) JM_##id,
    JJ_METHOD_MAP(XX)
#undef XX
    JM__COUNT
};
static const char *const method_names[JM__COUNT] = {
#define XX(id, name) name,
    JJ_METHOD_MAP(XX)
#undef XX
};

int ty__jinja_method_id(const char *name, size_t n)
{
    for (int i = 0; i < JM__COUNT; i++)
        if (strlen(method_names[i]) == n && memcmp(method_names[i], name, n) == 0)
            return i;
    return -1;
}

static jv J_INT(int64_t i) { jv v = {.t = JV_INT}; v.i = i; return v; }
static jv J_BOOL(bool b) { jv v = {.t = JV_BOOL}; v.b = b; return v; }
static jv J_SUB(jv s, size_t b, size_t e) { s.s.p += b, s.s.n = e - b; return s; }

static const jv *arg(const struct jj_args *fa, size_t pos, const char *name)
{
    return ty__jinja_arg(fa, pos, name);
}

static int str_arg(struct jj_ctx *c, int line, const struct jj_args *fa, size_t pos,
                   const char *name, jv *out, bool *given)
{
    const jv *v = arg(fa, pos, name);
    *given = v && v->t != JV_NONE;
    if (!*given)
        return 0;
    if (v->t != JV_STR)
        return ty__jinja_fail(c, TY_EINVAL, line, "%s: argument must be str, not %s",
                              name ? name : "method", ty__jinja_typename(*v));
    *out = *v;
    return 0;
}

static bool in_set(char ch, jv chars, bool given)
{
    return given ? memchr(chars.s.p, ch, chars.s.n) != NULL : isspace((unsigned char)ch);
}

static int m_strip(struct jj_ctx *c, int line, int id, jv s, const struct jj_args *fa, jv *out)
{
    jv chars = {0};
    bool given;
    TRY(str_arg(c, line, fa, 0, "chars", &chars, &given));
    size_t b = 0, e = s.s.n;
    if (id != JM_RSTRIP)
        while (b < e && in_set(s.s.p[b], chars, given))
            b++;
    if (id != JM_LSTRIP)
        while (e > b && in_set(s.s.p[e - 1], chars, given))
            e--;
    *out = J_SUB(s, b, e);
    return 0;
}

static const char *find_sub(jv s, size_t from, jv sub, bool rev)
{
    if (sub.s.n > s.s.n)
        return NULL;
    if (!rev) {
        for (size_t i = from; i + sub.s.n <= s.s.n; i++)
            if (memcmp(s.s.p + i, sub.s.p, sub.s.n) == 0)
                return s.s.p + i;
        return NULL;
    }
    for (size_t i = s.s.n - sub.s.n + 1; i-- > from;)
        if (memcmp(s.s.p + i, sub.s.p, sub.s.n) == 0)
            return s.s.p + i;
    return NULL;
}

static int m_split(struct jj_ctx *c, int line, int id, jv s, const struct jj_args *fa, jv *out)
{
    jv sep = {0};
    bool given;
    int64_t max = -1;
    TRY(str_arg(c, line, fa, 0, "sep", &sep, &given));
    const jv *mv = arg(fa, 1, "maxsplit");
    if (mv && mv->t == JV_INT)
        max = mv->i;
    if (given && sep.s.n == 0)
        return ty__jinja_fail(c, TY_EINVAL, line, "empty separator");
    struct jlist *l = ty__jinja_list_new(c, 0);
    if (!l)
        return ty__jinja_nomem(c, line);
    bool rev = id == JM_RSPLIT;
    size_t b = 0, e = s.s.n;
    int64_t done = 0;
    for (;;) {
        if (!given) {
            while (b < e && isspace((unsigned char)s.s.p[rev ? e - 1 : b]))
                rev ? e-- : b++;
            if (b >= e)
                break;
        }
        size_t ps, pe; /* the separator found, [ps, pe) */
        bool hit = false;
        if (max < 0 || done < max) {
            if (given) {
                const char *h = find_sub(J_SUB(s, 0, e), b, sep, rev);
                if (h)
                    hit = true, ps = (size_t)(h - s.s.p), pe = ps + sep.s.n;
            } else if (!rev) {
                for (ps = b; ps < e && !isspace((unsigned char)s.s.p[ps]); ps++)
                    ;
                hit = ps < e, pe = ps + 1;
            } else {
                for (pe = e; pe > b && !isspace((unsigned char)s.s.p[pe - 1]); pe--)
                    ;
                hit = pe > b, ps = pe - 1;
            }
        }
        jv piece = hit ? (rev ? J_SUB(s, pe, e) : J_SUB(s, b, ps)) : J_SUB(s, b, e);
        if (!given && !hit) {
            size_t pb = b, pe2 = e;
            while (pe2 > pb && isspace((unsigned char)s.s.p[pe2 - 1]))
                pe2--;
            piece = J_SUB(s, pb, pe2);
        }
        if (ty__jinja_list_push(c, l, piece))
            return ty__jinja_nomem(c, line);
        if (!hit)
            break;
        done++;
        if (rev)
            e = ps;
        else
            b = pe;
    }
    if (rev) /* pieces were found right to left */
        for (size_t i = 0; i < l->n / 2; i++) {
            jv t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i], l->v[l->n - 1 - i] = t;
        }
    out->t = JV_LIST, out->l = l;
    return 0;
}

static int m_affix(struct jj_ctx *c, int line, bool start, jv s, const struct jj_args *fa,
                   jv *out)
{
    const jv *p = arg(fa, 0, NULL);
    if (!p)
        return ty__jinja_fail(c, TY_EINVAL, line, "startswith/endswith need an argument");
    size_t n = p->t == JV_LIST ? p->l->n : 1;
    *out = J_BOOL(false);
    for (size_t i = 0; i < n; i++) {
        jv x = p->t == JV_LIST ? p->l->v[i] : *p;
        if (x.t != JV_STR)
            return ty__jinja_fail(c, TY_EINVAL, line, "startswith/endswith first arg must be str "
                                  "or a tuple of str, not %s", ty__jinja_typename(x));
        if (x.s.n <= s.s.n &&
            memcmp(start ? s.s.p : s.s.p + s.s.n - x.s.n, x.s.p, x.s.n) == 0)
            out->b = true;
    }
    return 0;
}

static int m_find(struct jj_ctx *c, int line, int id, jv s, const struct jj_args *fa, jv *out)
{
    jv sub = {0};
    bool given;
    TRY(str_arg(c, line, fa, 0, NULL, &sub, &given));
    if (!given)
        return ty__jinja_fail(c, TY_EINVAL, line, "find/index/count need a string argument");
    if (id == JM_COUNT) {
        int64_t n = 0;
        if (sub.s.n == 0) {
            *out = J_INT((int64_t)ty__jinja_utf8_len(s.s.p, s.s.n) + 1);
            return 0;
        }
        for (const char *h = find_sub(s, 0, sub, false); h;
             h = find_sub(s, (size_t)(h - s.s.p) + sub.s.n, sub, false))
            n++;
        *out = J_INT(n);
        return 0;
    }
    const char *h = find_sub(s, 0, sub, id == JM_RFIND);
    if (!h && id == JM_INDEX)
        return ty__jinja_fail(c, TY_EINVAL, line, "substring not found");
    *out = J_INT(h ? (int64_t)ty__jinja_utf8_len(s.s.p, (size_t)(h - s.s.p)) : -1);
    return 0;
}

static int m_join(struct jj_ctx *c, int line, jv sep, const struct jj_args *fa, jv *out)
{
    const jv *x = arg(fa, 0, NULL);
    struct jlist *l;
    if (!x)
        return ty__jinja_fail(c, TY_EINVAL, line, "join needs an argument");
    TRY(ty__jinja_iter(c, line, *x, &l));
    struct jj_buf b = {0};
    int rc = 0;
    for (size_t i = 0; i < l->n && !rc; i++) {
        if (l->v[i].t != JV_STR)
            rc = ty__jinja_fail(c, TY_EINVAL, line, "sequence item %zu: expected str instance, "
                                "%s found", i, ty__jinja_typename(l->v[i]));
        if (!rc && i)
            rc = ty__jinja_buf_put(c, &b, sep.s.p, sep.s.n);
        if (!rc)
            rc = ty__jinja_buf_put(c, &b, l->v[i].s.p, l->v[i].s.n);
    }
    bool ok = true;
    if (!rc)
        *out = ty__jinja_str(c, b.p ? b.p : "", b.n, &ok);
    free(b.p);
    return rc ? rc : ok ? 0 : ty__jinja_nomem(c, line);
}

/* str.format: {} {0} {name}; no format specs. */
static int m_format(struct jj_ctx *c, int line, jv s, const struct jj_args *fa, jv *out)
{
    struct jj_buf b = {0};
    int rc = 0;
    size_t autoi = 0;
    for (size_t i = 0; i < s.s.n && !rc; i++) {
        char ch = s.s.p[i];
        if ((ch == '{' || ch == '}') && i + 1 < s.s.n && s.s.p[i + 1] == ch) {
            rc = ty__jinja_buf_put(c, &b, &ch, 1);
            i++;
            continue;
        }
        if (ch != '{') {
            rc = ty__jinja_buf_put(c, &b, &ch, 1);
            continue;
        }
        const char *e = memchr(s.s.p + i, '}', s.s.n - i);
        if (!e) {
            rc = ty__jinja_fail(c, TY_EINVAL, line, "format: single '{' encountered");
            break;
        }
        const char *f = s.s.p + i + 1;
        size_t fl = (size_t)(e - f);
        const jv *v = NULL;
        if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '.', fl) || memchr(f, '[', fl))
            rc = ty__jinja_fail(c, TY_EINVAL, line, "format: conversion and format specs are not "
                                "supported");
        else if (fl == 0)
            v = arg(fa, autoi++, NULL);
        else if (isdigit((unsigned char)f[0]))
            v = arg(fa, (size_t)atoi(f), NULL);
        else
            for (size_t k = 0; k < fa->n && !v; k++)
                if (fa->names[k] && fa->nl[k] == fl && memcmp(fa->names[k], f, fl) == 0)
                    v = &fa->v[k];
        if (!rc && !v)
            rc = ty__jinja_fail(c, TY_EINVAL, line, "format: missing argument '%.*s'",
                                (int)(fl > 40 ? 40 : fl), f);
        if (!rc)
            rc = ty__jinja_buf_str(c, &b, *v);
        i = (size_t)(e - s.s.p);
    }
    bool ok = true;
    if (!rc)
        *out = ty__jinja_str(c, b.p ? b.p : "", b.n, &ok);
    free(b.p);
    return rc ? rc : ok ? 0 : ty__jinja_nomem(c, line);
}

static int m_class(jv s, int id, jv *out)
{
    bool all = s.s.n > 0, cased = false;
    for (size_t i = 0; i < s.s.n; i++) {
        unsigned char ch = (unsigned char)s.s.p[i];
        bool ok = id == JM_ISDIGIT ? isdigit(ch) : id == JM_ISALPHA ? isalpha(ch)
                : id == JM_ISALNUM ? isalnum(ch) : id == JM_ISSPACE ? isspace(ch)
                : id == JM_ISUPPER ? !islower(ch) : !isupper(ch);
        cased = cased || isalpha(ch);
        all = all && ok;
    }
    if (id == JM_ISUPPER || id == JM_ISLOWER)
        all = all && cased;
    *out = J_BOOL(all);
    return 0;
}

static int m_str(struct jj_ctx *c, int line, int id, jv s, const struct jj_args *fa, jv *out)
{
    struct jj_args none = {0};
    switch (id) {
    case JM_STRIP:
    case JM_LSTRIP:
    case JM_RSTRIP: return m_strip(c, line, id, s, fa, out);
    case JM_SPLIT:
    case JM_RSPLIT: return m_split(c, line, id, s, fa, out);
    case JM_STARTSWITH:
    case JM_ENDSWITH: return m_affix(c, line, id == JM_STARTSWITH, s, fa, out);
    case JM_FIND:
    case JM_RFIND:
    case JM_INDEX:
    case JM_COUNT: return m_find(c, line, id, s, fa, out);
    case JM_JOIN: return m_join(c, line, s, fa, out);
    case JM_FORMAT: return m_format(c, line, s, fa, out);
    case JM_SPLITLINES: {
        jv nl = {.t = JV_STR};
        nl.s.p = "\n", nl.s.n = 1;
        struct jj_args a = {.n = 1};
        a.v[0] = nl;
        TRY(m_split(c, line, JM_SPLIT, s, &a, out));
        if (out->l->n && out->l->v[out->l->n - 1].s.n == 0)
            out->l->n--;
        return 0;
    }
    case JM_REPLACE: {
        jv o = {0}, n = {0};
        bool g1, g2;
        int64_t cnt = -1;
        TRY(str_arg(c, line, fa, 0, "old", &o, &g1));
        TRY(str_arg(c, line, fa, 1, "new", &n, &g2));
        const jv *cv = arg(fa, 2, "count");
        if (cv && cv->t == JV_INT)
            cnt = cv->i;
        if (!g1 || !g2)
            return ty__jinja_fail(c, TY_EINVAL, line, "replace needs two string arguments");
        return ty__jinja_replace(c, line, s, o, n, cnt, out);
    }
    case JM_UPPER:
    case JM_LOWER:
    case JM_TITLE:
    case JM_CAPITALIZE: {
        struct jnode fake = {.op = id == JM_UPPER ? JF_UPPER : id == JM_LOWER ? JF_LOWER
                                 : id == JM_TITLE ? JF_TITLE : JF_CAPITALIZE, .line = line};
        (void)none;
        return ty__jinja_filter(c, NULL, &fake, s, out);
    }
    case JM_ISDIGIT:
    case JM_ISALPHA:
    case JM_ISALNUM:
    case JM_ISSPACE:
    case JM_ISUPPER:
    case JM_ISLOWER: return m_class(s, id, out);
    }
    return ty__jinja_fail(c, TY_EINVAL, line, "'str' object has no attribute '%s'",
                          method_names[id]);
}

static int m_dict(struct jj_ctx *c, int line, int id, jv d, const struct jj_args *fa, jv *out)
{
    struct jlist *l;
    switch (id) {
    case JM_ITEMS: return ty__jinja_items(c, line, d, out);
    case JM_KEYS:
    case JM_VALUES:
        if (!(l = ty__jinja_list_new(c, d.d->n + 1)))
            return ty__jinja_nomem(c, line);
        memcpy(l->v, id == JM_KEYS ? d.d->k : d.d->v, d.d->n * sizeof(jv));
        l->n = d.d->n;
        out->t = JV_LIST, out->l = l;
        return 0;
    case JM_GET: {
        const jv *k = arg(fa, 0, NULL), *def = arg(fa, 1, NULL);
        if (!k)
            return ty__jinja_fail(c, TY_EINVAL, line, "get expected at least 1 argument");
        if (!ty__jinja_dict_get(d.d, *k, out))
            *out = def ? *def : (jv){.t = JV_NONE};
        return 0;
    }
    }
    return ty__jinja_fail(c, TY_EINVAL, line, "'dict' object has no attribute '%s'",
                          method_names[id]);
}

static int m_list(struct jj_ctx *c, int line, int id, jv l, const struct jj_args *fa, jv *out)
{
    const jv *x = arg(fa, 0, NULL);
    if ((id == JM_INDEX || id == JM_COUNT) && x) {
        int64_t n = 0;
        for (size_t i = 0; i < l.l->n; i++)
            if (ty__jinja_eq(l.l->v[i], *x)) {
                if (id == JM_INDEX) {
                    *out = J_INT((int64_t)i);
                    return 0;
                }
                n++;
            }
        if (id == JM_INDEX)
            return ty__jinja_fail(c, TY_EINVAL, line, "list.index(x): x not in list");
        *out = J_INT(n);
        return 0;
    }
    return ty__jinja_fail(c, TY_EINVAL, line, "'list' object has no attribute '%s'",
                          method_names[id]);
}

int ty__jinja_method(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv obj,
                     jv *out)
{
    int id = n->op, line = n->line;
    struct jj_args fa;
    if (obj.t == JV_UNDEF) {
        if (obj.s.p)
            return ty__jinja_fail(c, TY_EINVAL, line, "'%.*s' is undefined",
                                  (int)(obj.s.n > 80 ? 80 : obj.s.n), obj.s.p);
        return ty__jinja_fail(c, TY_EINVAL, line, "undefined value has no attribute '%s'",
                              method_names[id]);
    }
    if (id >= JM_APPEND && (obj.t == JV_LIST || obj.t == JV_DICT || obj.t == JV_NS))
        return ty__jinja_fail(c, TY_EINVAL, line, "SecurityError: access to attribute '%s' of "
                              "'%s' object is unsafe (templates are immutable)", method_names[id],
                              ty__jinja_typename(obj));
    TRY(ty__jinja_args_eval(c, f, n, 0, &fa));
    if (obj.t == JV_DICT && id != JM_ITEMS && id != JM_KEYS && id != JM_VALUES && id != JM_GET) {
        jv fn; /* a dict entry holding a macro: d.name(...) */
        if (ty__jinja_dict_gets(obj.d, method_names[id], strlen(method_names[id]), &fn) &&
            fn.t == JV_MACRO)
            return ty__jinja_call_macro(c, line, fn, fa.v, fa.names, fa.nl, fa.n, out);
    }
    switch (obj.t) {
    case JV_STR: return m_str(c, line, id, obj, &fa, out);
    case JV_DICT:
    case JV_NS: return m_dict(c, line, id, obj, &fa, out);
    case JV_LIST: return m_list(c, line, id, obj, &fa, out);
    case JV_LOOP:
        if (id == JM_CYCLE) {
            if (!fa.n)
                return ty__jinja_fail(c, TY_EINVAL, line, "no items for cycling given");
            *out = fa.v[obj.loop->idx % fa.n];
            return 0;
        }
        break;
    default: break;
    }
    return ty__jinja_fail(c, TY_EINVAL, line, "'%s' object has no attribute '%s'",
                          ty__jinja_typename(obj), method_names[id]);
}

/* ---- globals ---- */

static int fn_range(struct jj_ctx *c, int line, const struct jj_args *fa, jv *out)
{
    int64_t a[3] = {0, 0, 1};
    size_t n = 0;
    for (size_t i = 0; i < fa->n; i++) {
        if (fa->names[i] || n == 3 || fa->v[i].t != JV_INT)
            return ty__jinja_fail(c, TY_EINVAL, line, "range() takes 1 to 3 integer arguments");
        a[n++] = fa->v[i].i;
    }
    if (n == 0)
        return ty__jinja_fail(c, TY_EINVAL, line, "range expected at least 1 argument");
    if (n == 1)
        a[1] = a[0], a[0] = 0;
    if (a[2] == 0)
        return ty__jinja_fail(c, TY_EINVAL, line, "range() arg 3 must not be zero");
    double cnt = ceil(((double)a[1] - (double)a[0]) / (double)a[2]);
    if (cnt > (double)c->lim.max_iter)
        return ty__jinja_fail(c, TY_ERANGE, line, "range too large");
    struct jlist *l = ty__jinja_list_new(c, cnt > 0 ? (size_t)cnt : 0);
    if (!l)
        return ty__jinja_nomem(c, line);
    for (int64_t i = a[0]; a[2] > 0 ? i < a[1] : i > a[1]; i += a[2]) {
        l->v[l->n++] = J_INT(i);
        if (__builtin_add_overflow(i, a[2], &i) || l->n == l->cap)
            break;
        i -= a[2];
    }
    out->t = JV_LIST, out->l = l;
    return 0;
}

static int fn_strftime(struct jj_ctx *c, int line, const struct jj_args *fa, jv *out)
{
    const jv *fmt = arg(fa, 0, NULL);
    if (!fmt || fmt->t != JV_STR || fmt->s.n > 200)
        return ty__jinja_fail(c, TY_EINVAL, line, "strftime_now needs a format string");
    struct tm tm;
    const char *fixed = getenv("TYCHO_FIXED_NOW");
    memset(&tm, 0, sizeof(tm));
    if (fixed && *fixed) {
        int Y, M, D, h = 0, m = 0, s = 0;
        if (sscanf(fixed, "%d-%d-%dT%d:%d:%d", &Y, &M, &D, &h, &m, &s) < 3)
            return ty__jinja_fail(c, TY_EINVAL, line, "TYCHO_FIXED_NOW is not an ISO 8601 time");
        tm.tm_year = Y - 1900, tm.tm_mon = M - 1, tm.tm_mday = D;
        tm.tm_hour = h, tm.tm_min = m, tm.tm_sec = s;
        time_t t = timegm(&tm);
        gmtime_r(&t, &tm); /* fills the weekday and day of year */
    } else {
        time_t t = time(NULL);
        localtime_r(&t, &tm);
    }
    char f[208], o[512];
    memcpy(f, fmt->s.p, fmt->s.n);
    f[fmt->s.n] = 0;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    size_t n = strftime(o, sizeof(o), f, &tm);
#pragma GCC diagnostic pop
    bool ok = true;
    *out = ty__jinja_str(c, o, n, &ok);
    return ok ? 0 : ty__jinja_nomem(c, line);
}

int ty__jinja_func(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, int fn, jv *out)
{
    struct jj_args fa;
    TRY(ty__jinja_args_eval(c, f, n, 0, &fa));
    switch (fn) {
    case JJ_FN_RANGE: return fn_range(c, n->line, &fa, out);
    case JJ_FN_STRFTIME: return fn_strftime(c, n->line, &fa, out);
    case JJ_FN_RAISE: {
        jv m = fa.n ? fa.v[0] : (jv){.t = JV_STR};
        TRY(ty__jinja_tostr(c, m, &m));
        if (!c->failed && c->err) {
            snprintf(c->err->msg, sizeof(c->err->msg), "raise_exception: %.*s",
                     (int)(m.s.n > 230 ? 230 : m.s.n), m.s.p);
            c->err->line = n->line;
        }
        c->failed = true;
        return TY_EINVAL;
    }
    case JJ_FN_DICT:
    case JJ_FN_NAMESPACE: {
        struct jdict *d = ty__jinja_dict_new(c, 0);
        if (!d)
            return ty__jinja_nomem(c, n->line);
        for (size_t i = 0; i < fa.n; i++) {
            if (!fa.names[i]) {
                if (fa.v[i].t != JV_DICT && fa.v[i].t != JV_NS)
                    return ty__jinja_fail(c, TY_EINVAL, n->line, "%s() positional argument must "
                                          "be a mapping", fn == JJ_FN_DICT ? "dict" : "namespace");
                for (size_t k = 0; k < fa.v[i].d->n; k++)
                    if (ty__jinja_dict_set(c, d, fa.v[i].d->k[k], fa.v[i].d->v[k]))
                        return ty__jinja_nomem(c, n->line);
                continue;
            }
            bool ok = true;
            jv k = ty__jinja_str(c, fa.names[i], fa.nl[i], &ok);
            if (!ok || ty__jinja_dict_set(c, d, k, fa.v[i]))
                return ty__jinja_nomem(c, n->line);
        }
        out->t = fn == JJ_FN_DICT ? JV_DICT : JV_NS, out->d = d;
        return 0;
    }
    }
    return ty__jinja_fail(c, TY_EINVAL, n->line, "bad function");
}

/* ---- "%s" % x ---- */

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
static int fmt_one(struct jj_ctx *c, int line, struct jj_buf *b, char conv, const char *spec,
                   jv v)
{
    char t[128], f[48];
    if (conv == 's')
        return ty__jinja_buf_str(c, b, v);
    if (conv == 'r')
        return ty__jinja_buf_repr(c, b, v);
    bool num = v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    if (!num)
        return ty__jinja_fail(c, TY_EINVAL, line, "%%%c format: a real number is required, not %s",
                              conv, ty__jinja_typename(v));
    double d = v.t == JV_FLOAT ? v.f : (double)(v.t == JV_INT ? v.i : v.b);
    if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
        long long i = v.t == JV_FLOAT ? (long long)d : (long long)(v.t == JV_INT ? v.i : v.b);
        snprintf(f, sizeof(f), "%%%sll%c", spec, conv == 'i' ? 'd' : conv);
        snprintf(t, sizeof(t), f, i);
    } else {
        snprintf(f, sizeof(f), "%%%s%c", spec, conv);
        snprintf(t, sizeof(t), f, d);
    }
    return ty__jinja_buf_put(c, b, t, strlen(t));
}
#pragma GCC diagnostic pop

int ty__jinja_pyformat(struct jj_ctx *c, int line, jv fmt, jv args, jv *out)
{
    struct jj_buf b = {0};
    size_t ai = 0, nargs = args.t == JV_LIST ? args.l->n : 1;
    int rc = 0;
    for (size_t i = 0; i < fmt.s.n && !rc; i++) {
        char ch = fmt.s.p[i];
        if (ch != '%') {
            rc = ty__jinja_buf_put(c, &b, &ch, 1);
            continue;
        }
        size_t k = i + 1, sl = 0;
        char spec[16];
        while (k < fmt.s.n && strchr("-+ 0#.0123456789", fmt.s.p[k]) && sl < sizeof(spec) - 1)
            spec[sl++] = fmt.s.p[k++];
        spec[sl] = 0;
        size_t run = 0;
        for (size_t q = 0; q < sl; q++) /* widths and precisions up to 99 */
            if ((run = isdigit((unsigned char)spec[q]) ? run + 1 : 0) > 2)
                return free(b.p), ty__jinja_fail(c, TY_EINVAL, line, "format width too large");
        char conv = k < fmt.s.n ? fmt.s.p[k] : 0;
        i = k;
        if (conv == '%') {
            rc = ty__jinja_buf_put(c, &b, "%", 1);
        } else if (!conv || !strchr("sdirfFeEgGxXo", conv)) {
            rc = ty__jinja_fail(c, TY_EINVAL, line, "unsupported format character");
        } else if (ai >= nargs) {
            rc = ty__jinja_fail(c, TY_EINVAL, line, "not enough arguments for format string");
        } else {
            jv v = args.t == JV_LIST ? args.l->v[ai] : args;
            ai++;
            rc = fmt_one(c, line, &b, conv, spec, v);
        }
    }
    if (!rc && ai < nargs && args.t == JV_LIST)
        rc = ty__jinja_fail(c, TY_EINVAL, line, "not all arguments converted during string "
                            "formatting");
    bool ok = true;
    if (!rc)
        *out = ty__jinja_str(c, b.p ? b.p : "", b.n, &ok);
    free(b.p);
    return rc ? rc : ok ? 0 : ty__jinja_nomem(c, line);
}
