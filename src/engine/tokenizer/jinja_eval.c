/* Jinja evaluation: expressions, statements, macros and the render entry point. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja-impl.h"

static bool frame_get(const struct jj_frame *f, const char *name, size_t n, jv *out)
{
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->nlens[i] == n && memcmp(f->names[i], name, n) == 0) {
                *out = f->vals[i];
                return true;
            }
    return false;
}

static int frame_set(struct jj_ctx *c, struct jj_frame *f, const char *name, size_t n, jv v)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->nlens[i] == n && memcmp(f->names[i], name, n) == 0) {
            f->vals[i] = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 8;
        const char **nn = ty__jinja_alloc(&c->ar, nc * sizeof(*nn));
        size_t *nl = ty__jinja_alloc(&c->ar, nc * sizeof(*nl));
        jv *nv = ty__jinja_alloc(&c->ar, nc * sizeof(*nv));
        if (!nn || !nl || !nv)
            return ty__jinja_nomem(c, 0);
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof(*nn));
            memcpy(nl, f->nlens, f->n * sizeof(*nl));
            memcpy(nv, f->vals, f->n * sizeof(*nv));
        }
        f->names = nn, f->nlens = nl, f->vals = nv, f->cap = nc;
    }
    f->names[f->n] = name;
    f->nlens[f->n] = n;
    f->vals[f->n] = v;
    f->n++;
    return 0;
}

static int undef_err(struct jj_ctx *c, int line, jv u)
{
    if (u.s.p)
        return ty__jinja_fail(c, TY_EINVAL, line, "'%.*s' is undefined",
                              (int)(u.s.n > 80 ? 80 : u.s.n), u.s.p);
    return ty__jinja_fail(c, TY_EINVAL, line, "undefined value used");
}

static jv undef_named(const char *name, size_t n)
{
    jv u = {.t = JV_UNDEF};
    u.s.p = name, u.s.n = n;
    return u;
}

static int loop_attr(struct jj_ctx *c, int line, struct jloop *l, const char *name, size_t n,
                     jv *out)
{
    size_t len = l->items->n, i = l->idx;
#define NAME(s) (n == strlen(s) && memcmp(name, s, n) == 0)
    jv v = {.t = JV_INT};
    if (NAME("index"))
        v.i = (int64_t)i + 1;
    else if (NAME("index0"))
        v.i = (int64_t)i;
    else if (NAME("revindex"))
        v.i = (int64_t)(len - i);
    else if (NAME("revindex0"))
        v.i = (int64_t)(len - i - 1);
    else if (NAME("length"))
        v.i = (int64_t)len;
    else if (NAME("depth"))
        v.i = 1;
    else if (NAME("depth0"))
        v.i = 0;
    else if (NAME("first"))
        v.t = JV_BOOL, v.b = i == 0;
    else if (NAME("last"))
        v.t = JV_BOOL, v.b = i + 1 == len;
    else if (NAME("previtem"))
        v = i > 0 ? l->items->v[i - 1] : undef_named("previtem", 8);
    else if (NAME("nextitem"))
        v = i + 1 < len ? l->items->v[i + 1] : undef_named("nextitem", 8);
    else
        return ty__jinja_fail(c, TY_EINVAL, line, "loop has no attribute '%.*s'",
                              (int)(n > 60 ? 60 : n), name);
#undef NAME
    *out = v;
    return 0;
}

int ty__jinja_getattr(struct jj_ctx *c, int line, jv obj, const char *name, size_t n, jv *out)
{
    switch (obj.t) {
    case JV_UNDEF: return undef_err(c, line, obj);
    case JV_DICT:
    case JV_NS:
        if (!ty__jinja_dict_gets(obj.d, name, n, out))
            *out = undef_named(name, n);
        return 0;
    case JV_LOOP: return loop_attr(c, line, obj.loop, name, n, out);
    default: *out = undef_named(name, n); return 0;
    }
}

static int py_index(struct jj_ctx *c, int line, jv ix, size_t len, int64_t *out)
{
    if (ix.t != JV_INT && ix.t != JV_BOOL)
        return ty__jinja_fail(c, TY_EINVAL, line, "indices must be integers, not %s",
                              ty__jinja_typename(ix));
    int64_t i = ix.t == JV_INT ? ix.i : ix.b;
    if (i < 0)
        i += (int64_t)len;
    *out = i;
    return 0;
}

static int getitem(struct jj_ctx *c, int line, jv obj, jv ix, jv *out)
{
    int64_t i = 0;
    *out = undef_named(NULL, 0);
    if (ix.t == JV_STR)
        *out = undef_named(ix.s.p, ix.s.n);
    switch (obj.t) {
    case JV_UNDEF: return undef_err(c, line, obj);
    case JV_DICT:
    case JV_NS: ty__jinja_dict_get(obj.d, ix, out); return 0;
    case JV_LIST:
        if (ix.t != JV_INT && ix.t != JV_BOOL)
            return 0;
        TRY(py_index(c, line, ix, obj.l->n, &i));
        if (i >= 0 && (uint64_t)i < obj.l->n)
            *out = obj.l->v[i];
        return 0;
    case JV_STR: {
        if (ix.t != JV_INT && ix.t != JV_BOOL)
            return 0;
        TRY(py_index(c, line, ix, ty__jinja_utf8_len(obj.s.p, obj.s.n), &i));
        if (i < 0 || (uint64_t)i >= ty__jinja_utf8_len(obj.s.p, obj.s.n))
            return 0;
        size_t b = ty__jinja_utf8_off(obj.s.p, obj.s.n, (size_t)i);
        size_t e = ty__jinja_utf8_off(obj.s.p, obj.s.n, (size_t)i + 1);
        out->t = JV_STR, out->s.p = obj.s.p + b, out->s.n = e - b;
        return 0;
    }
    case JV_LOOP:
        if (ix.t == JV_STR)
            return loop_attr(c, line, obj.loop, ix.s.p, ix.s.n, out);
        return 0;
    default: return 0;
    }
}

static int slice_bound(struct jj_ctx *c, int line, jv v, int64_t len, int64_t step, bool start,
                       int64_t *out)
{
    if (v.t == JV_UNDEF || v.t == JV_NONE) {
        *out = step > 0 ? (start ? 0 : len) : (start ? len - 1 : -1);
        return 0;
    }
    int64_t i = 0;
    TRY(py_index(c, line, v, (size_t)len, &i));
    if (i < 0)
        i = step > 0 ? 0 : -1;
    if (i >= len)
        i = step > 0 ? len : len - 1;
    *out = i;
    return 0;
}

static int do_slice(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv *out)
{
    jv obj, parts[3] = {{.t = JV_NONE}, {.t = JV_NONE}, {.t = JV_NONE}};
    TRY(ty__jinja_eval(c, f, n->a, &obj));
    const struct jnode *pn[3] = {n->b, n->c, n->d};
    for (int k = 0; k < 3; k++)
        if (pn[k])
            TRY(ty__jinja_eval(c, f, pn[k], &parts[k]));
    int64_t step = 1;
    if (parts[2].t == JV_INT)
        step = parts[2].i;
    if (step == 0)
        return ty__jinja_fail(c, TY_EINVAL, n->line, "slice step cannot be zero");
    if (obj.t == JV_UNDEF)
        return undef_err(c, n->line, obj);
    struct jlist *src;
    if (obj.t == JV_STR || obj.t == JV_LIST)
        TRY(ty__jinja_iter(c, n->line, obj, &src));
    else
        return ty__jinja_fail(c, TY_EINVAL, n->line, "'%s' object is not subscriptable",
                              ty__jinja_typename(obj));
    int64_t len = (int64_t)src->n, b, e;
    TRY(slice_bound(c, n->line, parts[0], len, step, true, &b));
    TRY(slice_bound(c, n->line, parts[1], len, step, false, &e));
    struct jlist *l = ty__jinja_list_new(c, 0);
    if (!l)
        return ty__jinja_nomem(c, n->line);
    for (int64_t i = b; step > 0 ? i < e : i > e; i += step)
        if (ty__jinja_list_push(c, l, src->v[i]))
            return ty__jinja_nomem(c, n->line);
    if (obj.t == JV_LIST) {
        out->t = JV_LIST, out->l = l;
        return 0;
    }
    size_t tot = 0;
    for (size_t i = 0; i < l->n; i++)
        tot += l->v[i].s.n;
    char *s = ty__jinja_alloc(&c->ar, tot + 1);
    if (!s)
        return ty__jinja_nomem(c, n->line);
    size_t o = 0;
    for (size_t i = 0; i < l->n; i++)
        memcpy(s + o, l->v[i].s.p, l->v[i].s.n), o += l->v[i].s.n;
    out->t = JV_STR, out->s.p = s, out->s.n = tot;
    return 0;
}

static int arith_err(struct jj_ctx *c, int line, int op, jv a, jv b)
{
    if (a.t == JV_UNDEF)
        return undef_err(c, line, a);
    if (b.t == JV_UNDEF)
        return undef_err(c, line, b);
    char o[3] = {(char)op, 0, 0};
    if (op == JJ_OP_FLOORDIV)
        o[0] = o[1] = '/';
    if (op == JJ_OP_POW)
        o[0] = o[1] = '*';
    return ty__jinja_fail(c, TY_EINVAL, line, "unsupported operand type(s) for %s: '%s' and '%s'",
                          o, ty__jinja_typename(a), ty__jinja_typename(b));
}

static int concat(struct jj_ctx *c, int line, jv a, jv b, jv *out)
{
    if (a.t == JV_STR && b.t == JV_STR) {
        char *s = ty__jinja_alloc(&c->ar, a.s.n + b.s.n + 1);
        if (!s)
            return ty__jinja_nomem(c, line);
        memcpy(s, a.s.p, a.s.n);
        memcpy(s + a.s.n, b.s.p, b.s.n);
        out->t = JV_STR, out->s.p = s, out->s.n = a.s.n + b.s.n;
        return 0;
    }
    struct jlist *l = ty__jinja_list_new(c, a.l->n + b.l->n);
    if (!l)
        return ty__jinja_nomem(c, line);
    memcpy(l->v, a.l->v, a.l->n * sizeof(jv));
    memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof(jv));
    l->n = a.l->n + b.l->n;
    out->t = JV_LIST, out->l = l;
    return 0;
}

static int repeat(struct jj_ctx *c, int line, jv s, int64_t k, jv *out)
{
    if (k < 0)
        k = 0;
    size_t unit = s.t == JV_STR ? s.s.n : s.l->n * sizeof(jv);
    if (unit && (uint64_t)k > c->lim.max_out / unit)
        return ty__jinja_fail(c, TY_ERANGE, line, "repeated sequence too large");
    size_t bytes = unit * (size_t)k;
    char *p = ty__jinja_alloc(&c->ar, bytes + 1);
    struct jlist *l = s.t == JV_LIST ? ty__jinja_alloc(&c->ar, sizeof(*l)) : NULL;
    if (!p || (s.t == JV_LIST && !l))
        return ty__jinja_nomem(c, line);
    for (int64_t i = 0; i < k && unit; i++)
        memcpy(p + (size_t)i * unit, s.t == JV_STR ? (const void *)s.s.p : (const void *)s.l->v,
               unit);
    *out = s;
    if (s.t == JV_STR) {
        out->s.p = p, out->s.n = bytes;
    } else {
        l->v = (jv *)(void *)p, l->n = l->cap = s.l->n * (size_t)k;
        out->l = l;
    }
    return 0;
}

static bool is_int(jv v) { return v.t == JV_INT || v.t == JV_BOOL; }
static int64_t iv(jv v) { return v.t == JV_INT ? v.i : v.b; }
static double fv(jv v) { return v.t == JV_FLOAT ? v.f : (double)iv(v); }

static int int_arith(struct jj_ctx *c, int line, int op, int64_t x, int64_t y, jv *out)
{
    int64_t r = 0;
    bool ovf = false;
    out->t = JV_INT;
    switch (op) {
    case '+': ovf = __builtin_add_overflow(x, y, &r); break;
    case '-': ovf = __builtin_sub_overflow(x, y, &r); break;
    case '*': ovf = __builtin_mul_overflow(x, y, &r); break;
    case JJ_OP_FLOORDIV:
    case '%':
        if (y == 0)
            return ty__jinja_fail(c, TY_EINVAL, line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
            ovf = op == JJ_OP_FLOORDIV;
            break;
        }
        r = op == '%' ? x % y : x / y;
        if (op == '%' && r != 0 && ((r < 0) != (y < 0)))
            r += y;
        else if (op == JJ_OP_FLOORDIV && (x % y != 0) && ((x < 0) != (y < 0)))
            r -= 1;
        break;
    case JJ_OP_POW:
        if (y < 0) {
            out->t = JV_FLOAT, out->f = pow((double)x, (double)y);
            return 0;
        }
        r = 1;
        for (int64_t i = 0; i < y && !ovf; i++)
            ovf = __builtin_mul_overflow(r, x, &r);
        if (x == 0 || x == 1 || x == -1)
            ovf = false, r = y == 0 ? 1 : (x == -1 ? ((y & 1) ? -1 : 1) : x);
        break;
    }
    if (ovf)
        return ty__jinja_fail(c, TY_ERANGE, line, "integer overflow");
    out->i = r;
    return 0;
}

static int arith(struct jj_ctx *c, int line, int op, jv a, jv b, jv *out)
{
    if (op == '~') {
        jv sa, sb;
        TRY(ty__jinja_tostr(c, a, &sa));
        TRY(ty__jinja_tostr(c, b, &sb));
        return concat(c, line, sa, sb, out);
    }
    bool na = a.t == JV_INT || a.t == JV_BOOL || a.t == JV_FLOAT;
    bool nb = b.t == JV_INT || b.t == JV_BOOL || b.t == JV_FLOAT;
    if (op == '+' && a.t == b.t && (a.t == JV_STR || a.t == JV_LIST))
        return concat(c, line, a, b, out);
    if (op == '*' && (a.t == JV_STR || a.t == JV_LIST) && is_int(b))
        return repeat(c, line, a, iv(b), out);
    if (op == '*' && (b.t == JV_STR || b.t == JV_LIST) && is_int(a))
        return repeat(c, line, b, iv(a), out);
    if (op == '%' && a.t == JV_STR)
        return ty__jinja_pyformat(c, line, a, b, out);
    if (!na || !nb)
        return arith_err(c, line, op, a, b);
    if (is_int(a) && is_int(b) && op != '/')
        return int_arith(c, line, op, iv(a), iv(b), out);
    double x = fv(a), y = fv(b), r = 0;
    if ((op == '/' || op == JJ_OP_FLOORDIV || op == '%') && y == 0)
        return ty__jinja_fail(c, TY_EINVAL, line, "division by zero");
    switch (op) {
    case '+': r = x + y; break;
    case '-': r = x - y; break;
    case '*': r = x * y; break;
    case '/': r = x / y; break;
    case JJ_OP_FLOORDIV: r = floor(x / y); break;
    case '%':
        r = fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0)))
            r += y;
        break;
    case JJ_OP_POW: r = pow(x, y); break;
    }
    out->t = JV_FLOAT, out->f = r;
    return 0;
}

static int contains(struct jj_ctx *c, int line, jv item, jv seq, bool *out)
{
    *out = false;
    switch (seq.t) {
    case JV_UNDEF: return 0;
    case JV_STR:
        if (item.t != JV_STR)
            return ty__jinja_fail(c, TY_EINVAL, line, "'in <string>' requires string as left "
                                  "operand, not %s", ty__jinja_typename(item));
        if (item.s.n == 0)
            *out = true;
        for (size_t i = 0; !*out && i + item.s.n <= seq.s.n; i++)
            *out = memcmp(seq.s.p + i, item.s.p, item.s.n) == 0;
        return 0;
    case JV_LIST:
        for (size_t i = 0; i < seq.l->n && !*out; i++)
            *out = ty__jinja_eq(item, seq.l->v[i]);
        return 0;
    case JV_DICT:
    case JV_NS: {
        jv o;
        *out = ty__jinja_dict_get(seq.d, item, &o);
        return 0;
    }
    default:
        return ty__jinja_fail(c, TY_EINVAL, line, "argument of type '%s' is not iterable",
                              ty__jinja_typename(seq));
    }
}

static int compare(struct jj_ctx *c, int line, int op, jv a, jv b, bool *res)
{
    int r;
    switch (op) {
    case JJ_OP_EQ: *res = ty__jinja_eq(a, b); return 0;
    case JJ_OP_NE: *res = !ty__jinja_eq(a, b); return 0;
    case 'I': return contains(c, line, a, b, res);
    case 'O': TRY(contains(c, line, a, b, res)); *res = !*res; return 0;
    }
    if (a.t == JV_UNDEF)
        return undef_err(c, line, a);
    if (b.t == JV_UNDEF)
        return undef_err(c, line, b);
    TRY(ty__jinja_cmp(c, line, a, b, &r));
    *res = op == '<' ? r < 0 : op == '>' ? r > 0 : op == JJ_OP_LE ? r <= 0 : r >= 0;
    return 0;
}

static int eval_call(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv *out)
{
    jv fn;
    if (n->op >= 0) {
        jv obj;
        TRY(ty__jinja_eval(c, f, n->a->a, &obj));
        return ty__jinja_method(c, f, n, obj, out);
    }
    TRY(ty__jinja_eval(c, f, n->a, &fn));
    if (fn.t == JV_FUNC)
        return ty__jinja_func(c, f, n, fn.fn, out);
    if (fn.t == JV_UNDEF)
        return undef_err(c, n->line, fn);
    if (fn.t != JV_MACRO)
        return ty__jinja_fail(c, TY_EINVAL, n->line, "'%s' object is not callable",
                              ty__jinja_typename(fn));
    jv *args = ty__jinja_alloc(&c->ar, (n->nargs + 1) * sizeof(jv));
    if (!args)
        return ty__jinja_nomem(c, n->line);
    for (size_t i = 0; i < n->nargs; i++)
        TRY(ty__jinja_eval(c, f, n->args[i], &args[i]));
    return ty__jinja_call_macro(c, n->line, fn, args, n->argnames, n->argnlens, n->nargs, out);
}

static int eval_container(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv *out)
{
    if (n->kind == JN_DICT) {
        struct jdict *d = ty__jinja_dict_new(c, n->nargs / 2);
        if (!d)
            return ty__jinja_nomem(c, n->line);
        for (size_t i = 0; i + 1 < n->nargs; i += 2) {
            jv k, v;
            TRY(ty__jinja_eval(c, f, n->args[i], &k));
            TRY(ty__jinja_eval(c, f, n->args[i + 1], &v));
            if (ty__jinja_dict_set(c, d, k, v))
                return ty__jinja_nomem(c, n->line);
        }
        out->t = JV_DICT, out->d = d;
        return 0;
    }
    struct jlist *l = ty__jinja_list_new(c, n->nargs);
    if (!l)
        return ty__jinja_nomem(c, n->line);
    for (size_t i = 0; i < n->nargs; i++)
        TRY(ty__jinja_eval(c, f, n->args[i], &l->v[i]));
    l->n = n->nargs;
    out->t = JV_LIST, out->l = l;
    return 0;
}

static int eval_name(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv *out)
{
    static const char *const globals[JJ_FN_COUNT] = {"range", "dict", "namespace",
                                                     "raise_exception", "strftime_now"};
    (void)c;
    if (frame_get(f, n->name, n->nlen, out))
        return 0;
    for (int k = 0; k < JJ_FN_COUNT; k++)
        if (n->nlen == strlen(globals[k]) && memcmp(n->name, globals[k], n->nlen) == 0) {
            out->t = JV_FUNC, out->fn = k;
            return 0;
        }
    *out = undef_named(n->name, n->nlen);
    return 0;
}

static int eval_ops(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv *out)
{
    jv a, b;
    bool r;
    switch (n->kind) {
    case JN_UNARY:
        TRY(ty__jinja_eval(c, f, n->a, &a));
        if (a.t == JV_FLOAT) {
            *out = a;
            out->f = n->op == '-' ? -a.f : a.f;
            return 0;
        }
        if (!is_int(a) || (n->op == '-' && iv(a) == INT64_MIN))
            return a.t == JV_UNDEF ? undef_err(c, n->line, a)
                                   : ty__jinja_fail(c, TY_EINVAL, n->line,
                                                    "bad operand type for unary %c: '%s'", n->op,
                                                    ty__jinja_typename(a));
        out->t = JV_INT, out->i = n->op == '-' ? -iv(a) : iv(a);
        return 0;
    case JN_BIN:
        TRY(ty__jinja_eval(c, f, n->a, &a));
        TRY(ty__jinja_eval(c, f, n->b, &b));
        return arith(c, n->line, n->op, a, b, out);
    case JN_AND:
    case JN_OR:
        TRY(ty__jinja_eval(c, f, n->a, &a));
        if (ty__jinja_truthy(a) == (n->kind == JN_OR)) {
            *out = a;
            return 0;
        }
        return ty__jinja_eval(c, f, n->b, out);
    case JN_NOT:
        TRY(ty__jinja_eval(c, f, n->a, &a));
        out->t = JV_BOOL, out->b = !ty__jinja_truthy(a);
        return 0;
    case JN_COND:
        TRY(ty__jinja_eval(c, f, n->a, &a));
        if (ty__jinja_truthy(a))
            return ty__jinja_eval(c, f, n->b, out);
        if (n->c)
            return ty__jinja_eval(c, f, n->c, out);
        *out = undef_named(NULL, 0);
        return 0;
    case JN_CMP:
        TRY(ty__jinja_eval(c, f, n->a, &a));
        TRY(ty__jinja_eval(c, f, n->b, &b));
        TRY(compare(c, n->line, n->op, a, b, &r));
        out->t = JV_BOOL, out->b = r;
        return 0;
    }
    return ty__jinja_fail(c, TY_EINVAL, n->line, "bad expression node");
}

int ty__jinja_eval(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv *out)
{
    jv a, b;
    switch (n->kind) {
    case JN_LIT: *out = n->lit; return 0;
    case JN_NAME: return eval_name(c, f, n, out);
    case JN_LIST:
    case JN_TUPLE:
    case JN_DICT: return eval_container(c, f, n, out);
    case JN_ATTR:
        TRY(ty__jinja_eval(c, f, n->a, &a));
        return ty__jinja_getattr(c, n->line, a, n->name, n->nlen, out);
    case JN_ITEM:
        TRY(ty__jinja_eval(c, f, n->a, &a));
        TRY(ty__jinja_eval(c, f, n->b, &b));
        return getitem(c, n->line, a, b, out);
    case JN_SLICE: return do_slice(c, f, n, out);
    case JN_CALL: return eval_call(c, f, n, out);
    case JN_FILTER:
        if (n->a)
            TRY(ty__jinja_eval(c, f, n->a, &a));
        else
            a = c->block_in;
        return ty__jinja_filter(c, f, n, a, out);
    case JN_TEST: {
        bool r;
        TRY(ty__jinja_eval(c, f, n->a, &a));
        TRY(ty__jinja_test(c, f, n, a, &r));
        out->t = JV_BOOL, out->b = r;
        return 0;
    }
    default: return eval_ops(c, f, n, out);
    }
}

/* ---- statements ---- */

static int exec(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n);

static int assign(struct jj_ctx *c, struct jj_frame *f, const struct jnode *t, jv v)
{
    if (t->kind == JN_NAME)
        return frame_set(c, f, t->name, t->nlen, v);
    if (t->kind == JN_ATTR) {
        jv ns;
        if (!frame_get(f, t->a->name, t->a->nlen, &ns) || ns.t != JV_NS)
            return ty__jinja_fail(c, TY_EINVAL, t->line, "cannot assign attribute on non-namespace"
                                  " object '%.*s'", (int)(t->a->nlen > 60 ? 60 : t->a->nlen),
                                  t->a->name);
        jv k = {.t = JV_STR};
        k.s.p = t->name, k.s.n = t->nlen;
        return ty__jinja_dict_set(c, ns.d, k, v) ? ty__jinja_nomem(c, t->line) : 0;
    }
    struct jlist *items;
    TRY(ty__jinja_iter(c, t->line, v, &items));
    if (items->n != t->nargs)
        return ty__jinja_fail(c, TY_EINVAL, t->line, "%s values to unpack (expected %zu, got %zu)",
                              items->n > t->nargs ? "too many" : "not enough", t->nargs,
                              items->n);
    for (size_t i = 0; i < t->nargs; i++)
        TRY(assign(c, f, t->args[i], items->v[i]));
    return 0;
}

/* Render `body` into a fresh string. */
static int capture(struct jj_ctx *c, struct jj_frame *f, const struct jnode *body, jv *out)
{
    struct jj_buf b = {0}, *saved = c->out;
    c->out = &b;
    int rc = exec(c, f, body);
    c->out = saved;
    bool ok = true;
    if (rc == 0) {
        *out = ty__jinja_str(c, b.p ? b.p : "", b.n, &ok);
        if (!ok)
            rc = ty__jinja_nomem(c, body->line);
    }
    free(b.p);
    return rc < 0 ? rc : 0;
}

static int exec_for(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n)
{
    jv it;
    struct jlist *src, *items;
    TRY(ty__jinja_eval(c, f, n->b, &it));
    TRY(ty__jinja_iter(c, n->line, it, &src));
    struct jj_frame lf = {.parent = f};
    items = src;
    if (n->e) {
        if (!(items = ty__jinja_list_new(c, 0)))
            return ty__jinja_nomem(c, n->line);
        for (size_t i = 0; i < src->n; i++) {
            jv ok;
            TRY(assign(c, &lf, n->a, src->v[i]));
            TRY(ty__jinja_eval(c, &lf, n->e, &ok));
            if (ty__jinja_truthy(ok) && ty__jinja_list_push(c, items, src->v[i]))
                return ty__jinja_nomem(c, n->line);
        }
    }
    struct jloop loop = {.items = items, .line = n->line};
    jv lv = {.t = JV_LOOP};
    lv.loop = &loop;
    for (size_t i = 0; i < items->n; i++) {
        if (++c->iters > c->lim.max_iter)
            return ty__jinja_fail(c, TY_ERANGE, n->line, "loop iteration limit (%llu) exceeded",
                                  (unsigned long long)c->lim.max_iter);
        loop.idx = i;
        lf.n = 0;
        TRY(frame_set(c, &lf, "loop", 4, lv));
        TRY(assign(c, &lf, n->a, items->v[i]));
        int rc = exec(c, &lf, n->c);
        if (rc < 0)
            return rc;
        if (rc == JJ_BREAK)
            break;
    }
    if (items->n == 0 && n->d)
        return exec(c, f, n->d);
    return 0;
}

static int exec_misc(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n)
{
    jv v;
    switch (n->kind) {
    case JN_SETBLOCK: TRY(capture(c, f, n->b, &v)); return assign(c, f, n->a, v);
    case JN_MACRO:
        v.t = JV_MACRO, v.m = n;
        return frame_set(c, f, n->name, n->nlen, v);
    case JN_FILTERBLOCK: {
        jv saved = c->block_in;
        TRY(capture(c, f, n->b, &c->block_in));
        int rc = ty__jinja_eval(c, f, n->a, &v);
        c->block_in = saved;
        TRY(rc);
        return ty__jinja_buf_str(c, c->out, v);
    }
    case JN_WITH: {
        struct jj_frame wf = {.parent = f};
        for (size_t i = 0; i < n->nargs; i++) {
            TRY(ty__jinja_eval(c, f, n->args[i], &v));
            TRY(frame_set(c, &wf, n->argnames[i], n->argnlens[i], v));
        }
        return exec(c, &wf, n->b);
    }
    case JN_BREAK: return JJ_BREAK;
    case JN_CONTINUE: return JJ_CONTINUE;
    }
    return ty__jinja_fail(c, TY_EINVAL, n->line, "bad statement node");
}

static int exec(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n)
{
    jv v;
    switch (n->kind) {
    case JN_BODY:
        for (size_t i = 0; i < n->nargs; i++) {
            int rc = exec(c, f, n->args[i]);
            if (rc)
                return rc;
        }
        return 0;
    case JN_TEXT: return ty__jinja_buf_put(c, c->out, n->lit.s.p, n->lit.s.n);
    case JN_OUT:
        TRY(ty__jinja_eval(c, f, n->a, &v));
        return ty__jinja_buf_str(c, c->out, v);
    case JN_IF:
        TRY(ty__jinja_eval(c, f, n->a, &v));
        if (ty__jinja_truthy(v))
            return exec(c, f, n->b);
        return n->c ? exec(c, f, n->c) : 0;
    case JN_FOR: return exec_for(c, f, n);
    case JN_SET: TRY(ty__jinja_eval(c, f, n->b, &v)); return assign(c, f, n->a, v);
    default: return exec_misc(c, f, n);
    }
}

int ty__jinja_call_macro(struct jj_ctx *c, int line, jv m, const jv *args, const char **names,
                         const size_t *nlens, size_t nargs, jv *out)
{
    const struct jnode *mn = m.m;
    struct jj_frame mf = {.parent = c->root};
    size_t npos = 0;
    while (npos < nargs && !names[npos])
        npos++;
    if (npos > mn->nargs)
        return ty__jinja_fail(c, TY_EINVAL, line, "macro '%.*s' takes not more than %zu "
                              "argument(s)", (int)mn->nlen, mn->name, mn->nargs);
    if (c->depth + 1 > c->lim.max_depth)
        return ty__jinja_fail(c, TY_ERANGE, line, "macro recursion limit (%d) exceeded",
                              c->lim.max_depth);
    for (size_t p = 0; p < mn->nargs; p++) {
        jv v = undef_named(mn->argnames[p], mn->argnlens[p]);
        bool set = false;
        if (p < npos)
            v = args[p], set = true;
        for (size_t k = npos; k < nargs; k++)
            if (names[k] && nlens[k] == mn->argnlens[p] &&
                memcmp(names[k], mn->argnames[p], nlens[k]) == 0)
                v = args[k], set = true;
        if (!set && mn->args[p])
            TRY(ty__jinja_eval(c, &mf, mn->args[p], &v));
        TRY(frame_set(c, &mf, mn->argnames[p], mn->argnlens[p], v));
    }
    for (size_t k = npos; k < nargs; k++) {
        bool known = false;
        for (size_t p = 0; p < mn->nargs && !known; p++)
            known = names[k] && nlens[k] == mn->argnlens[p] &&
                    memcmp(names[k], mn->argnames[p], nlens[k]) == 0;
        if (!known)
            return ty__jinja_fail(c, TY_EINVAL, line, "macro '%.*s' takes no keyword argument "
                                  "'%.*s'", (int)mn->nlen, mn->name, (int)nlens[k], names[k]);
    }
    c->depth++;
    int rc = capture(c, &mf, mn->b, out);
    c->depth--;
    return rc;
}

static const struct jj_limits default_limits = {
    .max_out = 16u << 20, .max_mem = 512u << 20, .max_iter = 10000000, .max_depth = 100};

int ty__jinja_render_ex(const ty_jinja_t *t, const json_t *vars, const struct jj_limits *lim,
                        char **out, size_t *out_len, struct ty_jinja_error *err)
{
    if (err)
        err->line = 0, err->msg[0] = 0;
    *out = NULL;
    if (out_len)
        *out_len = 0;
    struct jj_buf b = {0};
    struct jj_frame root = {0};
    struct jj_ctx c = {.err = err, .out = &b, .root = &root, .lim = *lim};
    c.ar.cap = lim->max_mem;
    int rc = 0;
    if (vars && !json_is_object(vars))
        rc = ty__jinja_fail(&c, TY_EINVAL, 0, "template variables must be a JSON object");
    const char *k;
    json_t *x;
    if (vars && json_is_object(vars))
        json_object_foreach((json_t *)vars, k, x) {
            jv v;
            if ((rc = ty__jinja_from_json(&c, x, &v, 0)))
                break;
            size_t kl = strlen(k);
            char *kc = ty__jinja_alloc(&c.ar, kl + 1);
            if (!kc) {
                rc = ty__jinja_nomem(&c, 0);
                break;
            }
            memcpy(kc, k, kl);
            if ((rc = frame_set(&c, &root, kc, kl, v)))
                break;
        }
    if (!rc)
        rc = exec(&c, &root, t->root);
    if (rc > 0)
        rc = 0;
    if (!rc && !b.p)
        rc = ty__jinja_buf_put(&c, &b, "", 0);
    ty__jinja_arena_free(&c.ar);
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    if (out_len)
        *out_len = b.n;
    return 0;
}

int ty_jinja_render(const ty_jinja_t *t, const json_t *vars, char **out, size_t *out_len,
                    struct ty_jinja_error *err)
{
    return ty__jinja_render_ex(t, vars, &default_limits, out, out_len, err);
}
