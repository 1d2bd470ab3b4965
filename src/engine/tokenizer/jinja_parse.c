/* Jinja parser: tokens -> AST. Unknown tags, filters, tests and methods are refused here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja-impl.h"

#define JJ_PARSE_DEPTH 200

struct parser {
    struct jj_arena *a;
    struct jtok *t;
    size_t n, pos;
    struct ty_jinja_error *err;
    int depth;
    int loops; /* enclosing for loops, for break/continue */
};

struct nvec {
    struct jnode **v;
    const char **names;
    size_t *nl;
    size_t n, cap;
};

void ty__jinja_seterr(struct ty_jinja_error *err, int line, const char *fmt, ...)
{
    if (!err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    err->line = line;
}

static struct jtok *cur(struct parser *p) { return &p->t[p->pos]; }
static struct jtok *adv(struct parser *p)
{
    struct jtok *t = &p->t[p->pos];
    if (t->kind != JT_EOF)
        p->pos++;
    return t;
}
static bool is_op(struct parser *p, int op) { return cur(p)->kind == JT_OP && cur(p)->op == op; }
static bool is_name(struct parser *p, const char *s)
{
    struct jtok *t = cur(p);
    return t->kind == JT_NAME && t->n == strlen(s) && memcmp(t->p, s, t->n) == 0;
}
static bool skip_op(struct parser *p, int op) { return is_op(p, op) ? (adv(p), true) : false; }
static bool skip_name(struct parser *p, const char *s)
{
    return is_name(p, s) ? (adv(p), true) : false;
}

static int unexpected(struct parser *p, const char *what)
{
    struct jtok *t = cur(p);
    char d[48];
    switch (t->kind) {
    case JT_EOF: snprintf(d, sizeof(d), "end of template"); break;
    case JT_NAME: snprintf(d, sizeof(d), "'%.*s'", (int)(t->n > 30 ? 30 : t->n), t->p); break;
    case JT_OP:
        if (t->op < 256)
            snprintf(d, sizeof(d), "'%c'", t->op);
        else
            snprintf(d, sizeof(d), "operator");
        break;
    case JT_BLOCK_END: snprintf(d, sizeof(d), "end of statement block"); break;
    case JT_VAR_END: snprintf(d, sizeof(d), "end of print statement"); break;
    default: snprintf(d, sizeof(d), "token"); break;
    }
    ty__jinja_seterr(p->err, t->line, "unexpected %s, expected %s at line %d", d, what, t->line);
    return TY_EPARSE;
}

static int notsup(struct parser *p, const char *kind, const char *name, size_t n, int line)
{
    ty__jinja_seterr(p->err, line, "unsupported %s '%.*s' at line %d", kind,
                     (int)(n > 60 ? 60 : n), name, line);
    return TY_ENOTSUP;
}

static struct jnode *nn(struct parser *p, int kind, int line)
{
    struct jnode *n = ty__jinja_alloc(p->a, sizeof(*n));
    if (n) {
        n->kind = (uint8_t)kind;
        n->line = line;
        n->op = -1;
    }
    return n;
}

static int nv_push(struct parser *p, struct nvec *v, struct jnode *x, const char *nm, size_t nl)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 4;
        struct jnode **nv = ty__jinja_alloc(p->a, nc * sizeof(*nv));
        const char **nn2 = ty__jinja_alloc(p->a, nc * sizeof(*nn2));
        size_t *nl2 = ty__jinja_alloc(p->a, nc * sizeof(*nl2));
        if (!nv || !nn2 || !nl2)
            return TY_ENOMEM;
        if (v->n) {
            memcpy(nv, v->v, v->n * sizeof(*nv));
            memcpy(nn2, v->names, v->n * sizeof(*nn2));
            memcpy(nl2, v->nl, v->n * sizeof(*nl2));
        }
        v->v = nv, v->names = nn2, v->nl = nl2, v->cap = nc;
    }
    v->v[v->n] = x;
    v->names[v->n] = nm;
    v->nl[v->n] = nl;
    v->n++;
    return 0;
}

static void nv_attach(struct jnode *n, struct nvec *v)
{
    n->args = v->v;
    n->argnames = v->names;
    n->argnlens = v->nl;
    n->nargs = v->n;
}

static int p_expr(struct parser *p, bool cond, struct jnode **out);
static int p_unary(struct parser *p, bool filt, struct jnode **out);

#define NEW(var, kind, line)                                                                      \
    do {                                                                                          \
        if (!((var) = nn(p, (kind), (line))))                                                     \
            return TY_ENOMEM;                                                                     \
    } while (0)

/* Arguments of a call after its '(': positional and name=value. */
static int p_args(struct parser *p, struct nvec *v)
{
    while (!skip_op(p, ')')) {
        if (v->n && !skip_op(p, ','))
            return unexpected(p, "',' or ')'");
        if (skip_op(p, ')'))
            break;
        if (is_op(p, '*'))
            return notsup(p, "syntax", "*args", 5, cur(p)->line);
        const char *nm = NULL;
        size_t nl = 0;
        if (cur(p)->kind == JT_NAME && p->t[p->pos + 1].kind == JT_OP && p->t[p->pos + 1].op == '=') {
            nm = cur(p)->p, nl = cur(p)->n;
            p->pos += 2;
        }
        struct jnode *x;
        TRY(p_expr(p, true, &x));
        TRY(nv_push(p, v, x, nm, nl));
    }
    return 0;
}

/* '(' ... : a parenthesized expression or a tuple. */
static int p_paren(struct parser *p, int line, struct jnode **out)
{
    struct nvec v = {0};
    bool tuple = false;
    while (!skip_op(p, ')')) {
        if (v.n) {
            if (!skip_op(p, ','))
                return unexpected(p, "',' or ')'");
            tuple = true;
            if (skip_op(p, ')'))
                break;
        }
        struct jnode *x;
        TRY(p_expr(p, true, &x));
        TRY(nv_push(p, &v, x, NULL, 0));
    }
    if (v.n == 1 && !tuple) {
        *out = v.v[0];
        return 0;
    }
    NEW(*out, JN_TUPLE, line);
    nv_attach(*out, &v);
    return 0;
}

static int p_list_or_dict(struct parser *p, bool dict, int line, struct jnode **out)
{
    struct nvec v = {0};
    int close = dict ? '}' : ']';
    while (!skip_op(p, close)) {
        if (v.n && !skip_op(p, ','))
            return unexpected(p, dict ? "',' or '}'" : "',' or ']'");
        if (skip_op(p, close))
            break;
        struct jnode *x;
        TRY(p_expr(p, true, &x));
        TRY(nv_push(p, &v, x, NULL, 0));
        if (dict) {
            if (!skip_op(p, ':'))
                return unexpected(p, "':'");
            TRY(p_expr(p, true, &x));
            TRY(nv_push(p, &v, x, NULL, 0));
        }
    }
    NEW(*out, dict ? JN_DICT : JN_LIST, line);
    nv_attach(*out, &v);
    return 0;
}

static int p_primary(struct parser *p, struct jnode **out)
{
    struct jtok *t = adv(p);
    struct jnode *n;
    switch (t->kind) {
    case JT_NAME: {
        static const char *const lits[] = {"true", "True", "false", "False", "none", "None"};
        for (int k = 0; k < 6; k++)
            if (t->n == strlen(lits[k]) && memcmp(t->p, lits[k], t->n) == 0) {
                NEW(n, JN_LIT, t->line);
                n->lit.t = k < 4 ? JV_BOOL : JV_NONE;
                n->lit.b = k < 2;
                *out = n;
                return 0;
            }
        NEW(n, JN_NAME, t->line);
        n->name = t->p, n->nlen = t->n;
        *out = n;
        return 0;
    }
    case JT_STRING: {
        size_t len = t->n;
        for (size_t k = p->pos; p->t[k].kind == JT_STRING; k++)
            len += p->t[k].n;
        char *s = ty__jinja_alloc(p->a, len + 1);
        if (!s)
            return TY_ENOMEM;
        memcpy(s, t->p, t->n);
        size_t o = t->n;
        while (cur(p)->kind == JT_STRING) {
            memcpy(s + o, cur(p)->p, cur(p)->n);
            o += adv(p)->n;
        }
        NEW(n, JN_LIT, t->line);
        n->lit.t = JV_STR, n->lit.s.p = s, n->lit.s.n = len;
        *out = n;
        return 0;
    }
    case JT_INT:
    case JT_FLOAT:
        NEW(n, JN_LIT, t->line);
        if (t->kind == JT_INT)
            n->lit.t = JV_INT, n->lit.i = t->i;
        else
            n->lit.t = JV_FLOAT, n->lit.f = t->f;
        *out = n;
        return 0;
    case JT_OP:
        if (t->op == '(')
            return p_paren(p, t->line, out);
        if (t->op == '[' || t->op == '{')
            return p_list_or_dict(p, t->op == '{', t->line, out);
        break;
    default: break;
    }
    p->pos--;
    if (t->kind == JT_EOF)
        p->pos = p->n - 1;
    return unexpected(p, "an expression");
}

static int p_subscript(struct parser *p, struct jnode *obj, int line, struct jnode **out)
{
    struct jnode *parts[3] = {0};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (!is_op(p, ':') && !is_op(p, ']'))
            TRY(p_expr(p, true, &parts[k]));
        if (skip_op(p, ']'))
            break;
        if (!skip_op(p, ':') || k == 2)
            return unexpected(p, "']'");
        slice = true;
        k++;
    }
    if (!slice && !parts[0])
        return unexpected(p, "a subscript");
    struct jnode *n;
    NEW(n, slice ? JN_SLICE : JN_ITEM, line);
    n->a = obj, n->b = parts[0], n->c = parts[1], n->d = parts[2];
    *out = n;
    return 0;
}

static int p_call(struct parser *p, struct jnode *callee, int line, struct jnode **out)
{
    struct jnode *n;
    NEW(n, JN_CALL, line);
    n->a = callee;
    if (callee->kind == JN_ATTR) {
        n->op = ty__jinja_method_id(callee->name, callee->nlen);
        if (n->op < 0)
            return notsup(p, "method", callee->name, callee->nlen, line);
    }
    struct nvec v = {0};
    TRY(p_args(p, &v));
    nv_attach(n, &v);
    *out = n;
    return 0;
}

static int p_postfix(struct parser *p, struct jnode **node)
{
    for (;;) {
        int line = cur(p)->line;
        if (skip_op(p, '.')) {
            struct jtok *t = adv(p);
            struct jnode *n;
            if (t->kind == JT_INT) {
                struct jnode *ix;
                NEW(ix, JN_LIT, line);
                ix->lit.t = JV_INT, ix->lit.i = t->i;
                NEW(n, JN_ITEM, line);
                n->a = *node, n->b = ix;
            } else if (t->kind == JT_NAME) {
                NEW(n, JN_ATTR, line);
                n->a = *node, n->name = t->p, n->nlen = t->n;
            } else {
                p->pos--;
                return unexpected(p, "an attribute name");
            }
            *node = n;
        } else if (skip_op(p, '[')) {
            TRY(p_subscript(p, *node, line, node));
        } else if (skip_op(p, '(')) {
            TRY(p_call(p, *node, line, node));
        } else {
            return 0;
        }
    }
}

/* `| name(args)`; `in` is the filtered value (NULL for a filter block). */
static int p_filter(struct parser *p, struct jnode *in, struct jnode **out)
{
    struct jtok *t = adv(p);
    if (t->kind != JT_NAME) {
        p->pos--;
        return unexpected(p, "a filter name");
    }
    struct jnode *n;
    NEW(n, JN_FILTER, t->line);
    n->a = in;
    n->name = t->p, n->nlen = t->n;
    n->op = ty__jinja_filter_id(t->p, t->n);
    if (n->op < 0)
        return notsup(p, "filter", t->p, t->n, t->line);
    struct nvec v = {0};
    if (skip_op(p, '('))
        TRY(p_args(p, &v));
    nv_attach(n, &v);
    *out = n;
    return 0;
}

static int p_test(struct parser *p, struct jnode *in, struct jnode **out)
{
    bool neg = skip_name(p, "not");
    struct jtok *t = adv(p);
    if (t->kind != JT_NAME) {
        p->pos--;
        return unexpected(p, "a test name");
    }
    struct jnode *n;
    NEW(n, JN_TEST, t->line);
    n->a = in;
    n->name = t->p, n->nlen = t->n;
    n->op = ty__jinja_test_id(t->p, t->n);
    if (n->op < 0)
        return notsup(p, "test", t->p, t->n, t->line);
    struct nvec v = {0};
    struct jtok *c = cur(p);
    if (skip_op(p, '(')) {
        TRY(p_args(p, &v));
    } else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT ||
                c->kind == JT_FLOAT || (c->kind == JT_OP && (c->op == '[' || c->op == '{'))) &&
               !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and") &&
               !is_name(p, "is") && !is_name(p, "if") && !is_name(p, "not") &&
               !is_name(p, "in")) {
        struct jnode *x;
        TRY(p_primary(p, &x));
        TRY(p_postfix(p, &x));
        TRY(nv_push(p, &v, x, NULL, 0));
    }
    nv_attach(n, &v);
    if (neg) {
        struct jnode *m;
        NEW(m, JN_NOT, t->line);
        m->a = n;
        n = m;
    }
    *out = n;
    return 0;
}

static int p_filter_expr(struct parser *p, struct jnode **node)
{
    for (;;) {
        int line = cur(p)->line;
        if (skip_op(p, '|'))
            TRY(p_filter(p, *node, node));
        else if (skip_name(p, "is"))
            TRY(p_test(p, *node, node));
        else if (skip_op(p, '('))
            TRY(p_call(p, *node, line, node));
        else
            return 0;
    }
}

static int p_unary(struct parser *p, bool filt, struct jnode **out)
{
    if (++p->depth > JJ_PARSE_DEPTH) {
        ty__jinja_seterr(p->err, cur(p)->line, "expression nested too deeply at line %d",
                         cur(p)->line);
        return TY_EPARSE;
    }
    int line = cur(p)->line;
    if (is_op(p, '-') || is_op(p, '+')) {
        int op = adv(p)->op;
        struct jnode *n;
        NEW(n, JN_UNARY, line);
        n->op = op;
        TRY(p_unary(p, false, &n->a));
        *out = n;
    } else {
        TRY(p_primary(p, out));
    }
    TRY(p_postfix(p, out));
    if (filt)
        TRY(p_filter_expr(p, out));
    p->depth--;
    return 0;
}

static int p_binop(struct parser *p, int level, struct jnode **out);

/* levels: 0 math1 (+ -), 1 concat (~), 2 math2 (* / // %), 3 pow (**) */
static int p_binop(struct parser *p, int level, struct jnode **out)
{
    static const int ops[4][5] = {{'+', '-', 0}, {'~', 0}, {'*', '/', JJ_OP_FLOORDIV, '%', 0},
                                  {JJ_OP_POW, 0}};
    if (level == 4)
        return p_unary(p, true, out);
    TRY(p_binop(p, level + 1, out));
    for (;;) {
        struct jtok *t = cur(p);
        int op = 0;
        for (int k = 0; t->kind == JT_OP && ops[level][k]; k++)
            if (t->op == ops[level][k])
                op = t->op;
        if (!op)
            return 0;
        adv(p);
        struct jnode *n;
        NEW(n, JN_BIN, t->line);
        n->op = op;
        n->a = *out;
        TRY(p_binop(p, level + 1, &n->b));
        *out = n;
    }
}

static int p_compare(struct parser *p, struct jnode **out)
{
    struct jnode *left;
    TRY(p_binop(p, 0, &left));
    struct jnode *acc = NULL;
    for (;;) {
        struct jtok *t = cur(p);
        int op = 0;
        if (t->kind == JT_OP && (t->op == JJ_OP_EQ || t->op == JJ_OP_NE || t->op == '<' ||
                                 t->op == '>' || t->op == JJ_OP_LE || t->op == JJ_OP_GE))
            op = t->op, adv(p);
        else if (skip_name(p, "in"))
            op = 'I';
        else if (is_name(p, "not") && p->t[p->pos + 1].kind == JT_NAME &&
                 p->t[p->pos + 1].n == 2 && memcmp(p->t[p->pos + 1].p, "in", 2) == 0)
            op = 'O', p->pos += 2;
        if (!op)
            break;
        struct jnode *n, *right;
        TRY(p_binop(p, 0, &right));
        NEW(n, JN_CMP, t->line);
        n->op = op, n->a = left, n->b = right;
        if (acc) {
            struct jnode *and;
            NEW(and, JN_AND, t->line);
            and->a = acc, and->b = n;
            acc = and;
        } else {
            acc = n;
        }
        left = right;
    }
    *out = acc ? acc : left;
    return 0;
}

static int p_not(struct parser *p, struct jnode **out)
{
    int line = cur(p)->line;
    if (skip_name(p, "not")) {
        if (++p->depth > JJ_PARSE_DEPTH)
            return unexpected(p, "a shallower expression");
        struct jnode *n;
        NEW(n, JN_NOT, line);
        TRY(p_not(p, &n->a));
        p->depth--;
        *out = n;
        return 0;
    }
    return p_compare(p, out);
}

static int p_logic(struct parser *p, bool is_or, struct jnode **out)
{
    if (is_or)
        TRY(p_logic(p, false, out));
    else
        TRY(p_not(p, out));
    while (is_name(p, is_or ? "or" : "and")) {
        struct jnode *n;
        NEW(n, is_or ? JN_OR : JN_AND, adv(p)->line);
        n->a = *out;
        if (is_or)
            TRY(p_logic(p, false, &n->b));
        else
            TRY(p_not(p, &n->b));
        *out = n;
    }
    return 0;
}

static int p_expr(struct parser *p, bool cond, struct jnode **out)
{
    if (++p->depth > JJ_PARSE_DEPTH) {
        ty__jinja_seterr(p->err, cur(p)->line, "expression nested too deeply at line %d",
                         cur(p)->line);
        return TY_EPARSE;
    }
    TRY(p_logic(p, true, out));
    while (cond && is_name(p, "if")) {
        struct jnode *n;
        NEW(n, JN_COND, adv(p)->line);
        n->b = *out;
        TRY(p_logic(p, true, &n->a));
        if (skip_name(p, "else"))
            TRY(p_expr(p, true, &n->c));
        *out = n;
    }
    p->depth--;
    return 0;
}

/* ---- statements ---- */

static int p_body(struct parser *p, const char *const *stops, struct jnode **out, int *which);

static int expect_end(struct parser *p)
{
    if (cur(p)->kind != JT_BLOCK_END)
        return unexpected(p, "end of statement block");
    adv(p);
    return 0;
}

/* A name, or names separated by commas (a tuple target). */
static int p_target(struct parser *p, bool allow_attr, struct jnode **out)
{
    struct nvec v = {0};
    bool paren = skip_op(p, '(');
    int line = cur(p)->line;
    do {
        struct jtok *t = adv(p);
        if (t->kind != JT_NAME) {
            p->pos--;
            return unexpected(p, "a name");
        }
        struct jnode *n;
        NEW(n, JN_NAME, t->line);
        n->name = t->p, n->nlen = t->n;
        if (allow_attr && !v.n && is_op(p, '.')) {
            adv(p);
            struct jtok *a = adv(p);
            if (a->kind != JT_NAME) {
                p->pos--;
                return unexpected(p, "an attribute name");
            }
            struct jnode *at;
            NEW(at, JN_ATTR, a->line);
            at->a = n, at->name = a->p, at->nlen = a->n;
            *out = at;
            return 0;
        }
        TRY(nv_push(p, &v, n, NULL, 0));
    } while (skip_op(p, ','));
    if (paren && !skip_op(p, ')'))
        return unexpected(p, "')'");
    if (v.n == 1) {
        *out = v.v[0];
        return 0;
    }
    NEW(*out, JN_TUPLE, line);
    nv_attach(*out, &v);
    return 0;
}

static int p_if(struct parser *p, int line, struct jnode **out)
{
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    struct jnode *n;
    NEW(n, JN_IF, line);
    TRY(p_expr(p, true, &n->a));
    TRY(expect_end(p));
    int which;
    TRY(p_body(p, stops, &n->b, &which));
    if (which == 0) {
        TRY(p_if(p, cur(p)->line, &n->c));
    } else if (which == 1) {
        static const char *const s2[] = {"endif", NULL};
        TRY(expect_end(p));
        TRY(p_body(p, s2, &n->c, &which));
        TRY(expect_end(p));
    } else {
        TRY(expect_end(p));
    }
    *out = n;
    return 0;
}

static int p_for(struct parser *p, int line, struct jnode **out)
{
    static const char *const stops[] = {"else", "endfor", NULL};
    struct jnode *n;
    NEW(n, JN_FOR, line);
    TRY(p_target(p, false, &n->a));
    if (!skip_name(p, "in"))
        return unexpected(p, "'in'");
    TRY(p_expr(p, false, &n->b));
    if (skip_name(p, "if"))
        TRY(p_expr(p, false, &n->e));
    if (is_name(p, "recursive"))
        return notsup(p, "construct", "recursive loop", 14, cur(p)->line);
    TRY(expect_end(p));
    int which;
    p->loops++;
    TRY(p_body(p, stops, &n->c, &which));
    p->loops--;
    TRY(expect_end(p));
    if (which == 0) {
        static const char *const s2[] = {"endfor", NULL};
        TRY(p_body(p, s2, &n->d, &which));
        TRY(expect_end(p));
    }
    *out = n;
    return 0;
}

static int p_set(struct parser *p, int line, struct jnode **out)
{
    struct jnode *n;
    NEW(n, JN_SET, line);
    TRY(p_target(p, true, &n->a));
    if (skip_op(p, '=')) {
        struct jnode *v;
        TRY(p_expr(p, true, &v));
        if (is_op(p, ',')) { /* set a, b = x, y */
            struct nvec tv = {0};
            TRY(nv_push(p, &tv, v, NULL, 0));
            while (skip_op(p, ',')) {
                if (cur(p)->kind == JT_BLOCK_END)
                    break;
                TRY(p_expr(p, true, &v));
                TRY(nv_push(p, &tv, v, NULL, 0));
            }
            NEW(v, JN_TUPLE, line);
            nv_attach(v, &tv);
        }
        n->b = v;
        return *out = n, expect_end(p);
    }
    if (is_op(p, '|'))
        return notsup(p, "construct", "filtered set block", 18, line);
    static const char *const stops[] = {"endset", NULL};
    int which;
    n->kind = JN_SETBLOCK;
    TRY(expect_end(p));
    TRY(p_body(p, stops, &n->b, &which));
    *out = n;
    return expect_end(p);
}

static int p_macro(struct parser *p, int line, struct jnode **out)
{
    struct jnode *n;
    NEW(n, JN_MACRO, line);
    struct jtok *t = adv(p);
    if (t->kind != JT_NAME) {
        p->pos--;
        return unexpected(p, "a macro name");
    }
    n->name = t->p, n->nlen = t->n;
    if (!skip_op(p, '('))
        return unexpected(p, "'('");
    struct nvec v = {0};
    while (!skip_op(p, ')')) {
        if (v.n && !skip_op(p, ','))
            return unexpected(p, "',' or ')'");
        struct jtok *a = adv(p);
        if (a->kind != JT_NAME) {
            p->pos--;
            return unexpected(p, "a parameter name");
        }
        struct jnode *def = NULL;
        if (skip_op(p, '='))
            TRY(p_expr(p, true, &def));
        TRY(nv_push(p, &v, def, a->p, a->n));
    }
    nv_attach(n, &v);
    TRY(expect_end(p));
    static const char *const stops[] = {"endmacro", NULL};
    int which;
    int loops = p->loops;
    p->loops = 0;
    TRY(p_body(p, stops, &n->b, &which));
    p->loops = loops;
    if (cur(p)->kind == JT_NAME)
        adv(p);
    *out = n;
    return expect_end(p);
}

static int p_simple_block(struct parser *p, int kind, int line, const char *end,
                          struct jnode **out)
{
    struct jnode *n;
    NEW(n, kind, line);
    if (kind == JN_FILTERBLOCK) {
        struct jnode *f = NULL;
        do
            TRY(p_filter(p, f, &f));
        while (skip_op(p, '|'));
        n->a = f;
    } else if (kind == JN_WITH) {
        struct nvec v = {0};
        while (cur(p)->kind == JT_NAME) {
            struct jtok *a = adv(p);
            struct jnode *x;
            if (!skip_op(p, '='))
                return unexpected(p, "'='");
            TRY(p_expr(p, true, &x));
            TRY(nv_push(p, &v, x, a->p, a->n));
            if (!skip_op(p, ','))
                break;
        }
        nv_attach(n, &v);
    }
    TRY(expect_end(p));
    const char *const stops[] = {end, NULL};
    int which;
    TRY(p_body(p, stops, &n->b, &which));
    *out = kind == JN_BODY ? n->b : n;
    return expect_end(p);
}

static int p_stmt(struct parser *p, struct jnode **out)
{
    struct jtok *t = adv(p);
    if (t->kind != JT_NAME) {
        p->pos--;
        return unexpected(p, "a tag name");
    }
    int line = t->line;
#define IS(s) (t->n == strlen(s) && memcmp(t->p, s, t->n) == 0)
    if (IS("if"))
        return p_if(p, line, out);
    if (IS("for"))
        return p_for(p, line, out);
    if (IS("set"))
        return p_set(p, line, out);
    if (IS("macro"))
        return p_macro(p, line, out);
    if (IS("filter"))
        return p_simple_block(p, JN_FILTERBLOCK, line, "endfilter", out);
    if (IS("with"))
        return p_simple_block(p, JN_WITH, line, "endwith", out);
    if (IS("generation"))
        return p_simple_block(p, JN_BODY, line, "endgeneration", out);
    if (IS("break") || IS("continue")) {
        if (!p->loops) {
            ty__jinja_seterr(p->err, line, "'%.*s' outside of a loop at line %d", (int)t->n,
                             t->p, line);
            return TY_EPARSE;
        }
        NEW(*out, IS("break") ? JN_BREAK : JN_CONTINUE, line);
        return expect_end(p);
    }
    if ((t->n > 3 && memcmp(t->p, "end", 3) == 0) || IS("else") || IS("elif")) {
        ty__jinja_seterr(p->err, line, "unexpected tag '%.*s' at line %d", (int)t->n, t->p,
                         line);
        return TY_EPARSE;
    }
#undef IS
    return notsup(p, "tag", t->p, t->n, line);
}

static int p_body(struct parser *p, const char *const *stops, struct jnode **out, int *which)
{
    struct nvec v = {0};
    int line = cur(p)->line;
    if (++p->depth > JJ_PARSE_DEPTH) {
        ty__jinja_seterr(p->err, line, "blocks nested too deeply at line %d", line);
        return TY_EPARSE;
    }
    for (;;) {
        struct jtok *t = cur(p);
        struct jnode *n = NULL;
        if (t->kind == JT_EOF) {
            if (stops && stops[0]) {
                ty__jinja_seterr(p->err, t->line,
                                 "unexpected end of template, expected '%s' at line %d", stops[0],
                                 t->line);
                return TY_EPARSE;
            }
            break;
        }
        if (t->kind == JT_TEXT) {
            NEW(n, JN_TEXT, t->line);
            n->lit.t = JV_STR, n->lit.s.p = t->p, n->lit.s.n = t->n;
            adv(p);
        } else if (t->kind == JT_VAR_BEGIN) {
            adv(p);
            NEW(n, JN_OUT, t->line);
            TRY(p_expr(p, true, &n->a));
            if (cur(p)->kind != JT_VAR_END)
                return unexpected(p, "end of print statement");
            adv(p);
        } else if (t->kind == JT_BLOCK_BEGIN) {
            struct jtok *nt = &p->t[p->pos + 1];
            for (int k = 0; stops && stops[k]; k++)
                if (nt->kind == JT_NAME && nt->n == strlen(stops[k]) &&
                    memcmp(nt->p, stops[k], nt->n) == 0) {
                    p->pos += 2;
                    *which = k;
                    goto done;
                }
            adv(p);
            TRY(p_stmt(p, &n));
        } else {
            return unexpected(p, "template text or a tag");
        }
        TRY(nv_push(p, &v, n, NULL, 0));
    }
done:
    NEW(*out, JN_BODY, line);
    nv_attach(*out, &v);
    p->depth--;
    return 0;
}

int ty_jinja_parse(ty_jinja_t **out, const char *src, size_t len, struct ty_jinja_error *err)
{
    if (err)
        err->line = 0, err->msg[0] = 0;
    *out = NULL;
    ty_jinja_t *t = calloc(1, sizeof(*t));
    if (!t)
        return TY_ENOMEM;
    struct jtok *toks;
    size_t nt;
    int rc = ty__jinja_lex(&t->arena, src ? src : "", src ? len : 0, &toks, &nt, err);
    if (rc == 0) {
        struct parser p = {.a = &t->arena, .t = toks, .n = nt, .err = err};
        int which;
        rc = p_body(&p, NULL, &t->root, &which);
        if (rc == 0 && cur(&p)->kind != JT_EOF)
            rc = unexpected(&p, "end of template");
    }
    if (rc == TY_ENOMEM)
        ty__jinja_seterr(err, 0, "out of memory");
    if (rc) {
        ty_jinja_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void ty_jinja_free(ty_jinja_t *t)
{
    if (!t)
        return;
    ty__jinja_arena_free(&t->arena);
    free(t);
}
