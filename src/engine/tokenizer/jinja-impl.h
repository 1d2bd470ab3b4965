/* Private to the Jinja interpreter (jinja_*.c): value model, AST, render context.
 *
 * Memory: the AST of a template lives in the template's arena; every value made while rendering
 * lives in the render's arena (capped, freed at once when the render ends), so values never
 * need reference counts. Lists and dicts are immutable once built, except namespaces.
 */
#ifndef TY_JINJA_IMPL_H
#define TY_JINJA_IMPL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tycho/errors.h"
#include "tycho/jinja.h"

/* ---- arena ---- */
struct jj_chunk;
struct jj_arena {
    struct jj_chunk *head;
    size_t total; /* bytes taken from malloc */
    size_t cap;   /* 0: unlimited */
};
void *ty__jinja_alloc(struct jj_arena *a, size_t n); /* zeroed; NULL when over cap or no memory */
void ty__jinja_arena_free(struct jj_arena *a);

/* Return a non-zero code at once (every jinja_*.c) */
#define TRY(x)                                                                                    \
    do {                                                                                          \
        int rc_ = (x);                                                                            \
        if (rc_)                                                                                  \
            return rc_;                                                                           \
    } while (0)

/* ---- values ---- */
enum jv_type {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_NS,    /* namespace(): a mutable dict */
    JV_MACRO, /* m: the JN_MACRO node */
    JV_FUNC,  /* fn: enum jj_func */
    JV_LOOP,  /* loop: the running for loop */
};
struct jlist {
    size_t n, cap;
    struct jv *v;
};
struct jdict {
    size_t n, cap;
    struct jv *k, *v;
};
struct jloop;
struct jnode;
typedef struct jv {
    uint8_t t;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p; /* JV_STR: UTF-8 bytes; JV_UNDEF: the missing name (may be NULL) */
            size_t n;
        } s;
        struct jlist *l;
        struct jdict *d; /* JV_DICT, JV_NS */
        const struct jnode *m;
        int fn;
        struct jloop *loop;
    };
} jv;

enum jj_func { JJ_FN_RANGE, JJ_FN_DICT, JJ_FN_NAMESPACE, JJ_FN_RAISE, JJ_FN_STRFTIME, JJ_FN_COUNT };

/* ---- AST ---- */
enum jn_kind {
    /* expressions */
    JN_LIT, JN_NAME, JN_LIST, JN_TUPLE, JN_DICT, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER,
    JN_TEST, JN_UNARY, JN_BIN, JN_AND, JN_OR, JN_NOT, JN_COND, JN_CMP,
    /* statements */
    JN_BODY, JN_TEXT, JN_OUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_FILTERBLOCK,
    JN_WITH, JN_BREAK, JN_CONTINUE,
};
struct jnode {
    uint8_t kind;
    int op; /* operator char, filter/test/method id (-1: not a method call) */
    int line;
    jv lit;           /* JN_LIT, JN_TEXT */
    const char *name; /* JN_NAME, JN_ATTR, JN_MACRO */
    size_t nlen;
    struct jnode *a, *b, *c, *d, *e;
    struct jnode **args;    /* list items, call/filter args, body statements, macro defaults */
    const char **argnames;  /* keyword names (NULL: positional), dict keys are args in pairs */
    size_t *argnlens;
    size_t nargs;
};

/* ---- lexer ---- */
enum jt_kind { JT_EOF, JT_TEXT, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END, JT_NAME,
               JT_STRING, JT_INT, JT_FLOAT, JT_OP };
struct jtok {
    uint8_t kind;
    int op; /* JT_OP: char or a two-char code (see jinja_lex.c) */
    int line;
    const char *p; /* JT_TEXT, JT_NAME, JT_STRING (decoded, in the arena) */
    size_t n;
    int64_t i;
    double f;
};
enum { JJ_OP_EQ = 256, JJ_OP_NE, JJ_OP_LE, JJ_OP_GE, JJ_OP_FLOORDIV, JJ_OP_POW };
/* Tokenize the whole template into the arena; 0 or TY_EPARSE/TY_ENOMEM with err filled. */
int ty__jinja_lex(struct jj_arena *a, const char *src, size_t len, struct jtok **toks,
                  size_t *ntoks, struct ty_jinja_error *err);

/* ---- parse ---- */
struct ty_jinja {
    struct jj_arena arena;
    struct jnode *root;
};
void ty__jinja_seterr(struct ty_jinja_error *err, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- builtin tables (jinja_filters.c) ---- */
int ty__jinja_filter_id(const char *name, size_t n);  /* -1: unknown */
int ty__jinja_test_id(const char *name, size_t n);    /* -1: unknown */
int ty__jinja_method_id(const char *name, size_t n);  /* -1: unknown */

/* ---- render context ---- */
struct jj_buf {
    char *p;
    size_t n, cap;
};
struct jj_frame {
    struct jj_frame *parent;
    size_t n, cap;
    const char **names;
    size_t *nlens;
    jv *vals;
};
struct jj_limits {
    size_t max_out;    /* bytes of output */
    size_t max_mem;    /* bytes of render arena */
    uint64_t max_iter; /* loop iterations, all loops together */
    int max_depth;     /* nested macro calls and expression depth */
};
struct jj_ctx {
    struct jj_arena ar;
    struct ty_jinja_error *err;
    struct jj_buf *out;
    struct jj_frame *root;
    struct jj_limits lim;
    uint64_t iters;
    int depth;
    bool failed;
    jv block_in; /* the body text a {% filter %} block applies its filters to */
};
struct jloop {
    struct jlist *items;
    size_t idx;
    int line;
};
enum { JJ_BREAK = 1, JJ_CONTINUE = 2 }; /* positive statement results */

/* Render with explicit limits (tests and fuzzing). */
int ty__jinja_render_ex(const ty_jinja_t *t, const json_t *vars, const struct jj_limits *lim,
                        char **out, size_t *out_len, struct ty_jinja_error *err);

int ty__jinja_fail(struct jj_ctx *c, int rc, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int ty__jinja_nomem(struct jj_ctx *c, int line);

/* values (jinja_value.c) */
jv ty__jinja_str(struct jj_ctx *c, const char *p, size_t n, bool *ok); /* copies */
struct jlist *ty__jinja_list_new(struct jj_ctx *c, size_t cap);
int ty__jinja_list_push(struct jj_ctx *c, struct jlist *l, jv v);
struct jdict *ty__jinja_dict_new(struct jj_ctx *c, size_t cap);
int ty__jinja_dict_set(struct jj_ctx *c, struct jdict *d, jv k, jv v);
bool ty__jinja_dict_get(const struct jdict *d, jv k, jv *out);
bool ty__jinja_dict_gets(const struct jdict *d, const char *k, size_t n, jv *out);
bool ty__jinja_truthy(jv v);
bool ty__jinja_eq(jv a, jv b);
int ty__jinja_cmp(struct jj_ctx *c, int line, jv a, jv b, int *res); /* <0,0,>0 */
const char *ty__jinja_typename(jv v);
int ty__jinja_buf_put(struct jj_ctx *c, struct jj_buf *b, const char *p, size_t n);
int ty__jinja_buf_str(struct jj_ctx *c, struct jj_buf *b, jv v);  /* Python str() */
int ty__jinja_buf_repr(struct jj_ctx *c, struct jj_buf *b, jv v); /* Python repr() */
int ty__jinja_tostr(struct jj_ctx *c, jv v, jv *out);             /* str() as a value */
int ty__jinja_tojson(struct jj_ctx *c, int line, struct jj_buf *b, jv v, int indent,
                     const char *isep, const char *ksep, bool sort, int level);
void ty__jinja_fmt_float(double f, char *buf, size_t cap); /* Python repr of a float */
int ty__jinja_from_json(struct jj_ctx *c, const json_t *j, jv *out, int depth);
size_t ty__jinja_utf8_len(const char *p, size_t n);
size_t ty__jinja_utf8_off(const char *p, size_t n, size_t cp); /* byte offset of code point */
int ty__jinja_iter(struct jj_ctx *c, int line, jv v, struct jlist **out); /* items to iterate */

/* evaluation (jinja_eval.c) */
int ty__jinja_eval(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv *out);
int ty__jinja_getattr(struct jj_ctx *c, int line, jv obj, const char *name, size_t n, jv *out);
int ty__jinja_call_macro(struct jj_ctx *c, int line, jv m, const jv *args, const char **names,
                         const size_t *nlens, size_t nargs, jv *out);

/* builtins (jinja_filters.c); args[0] is the input value */
int ty__jinja_filter(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv in, jv *out);
int ty__jinja_test(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv in, bool *out);
int ty__jinja_method(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, jv obj,
                     jv *out);
int ty__jinja_pyformat(struct jj_ctx *c, int line, jv fmt, jv args, jv *out); /* "%s" % x */
int ty__jinja_func(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, int fn, jv *out);

/* ---- builtin tables ---- */
#define JJ_FILTER_MAP(XX)                                                                         \
    XX(ABS, "abs") XX(ATTR, "attr") XX(BATCH, "batch") XX(CAPITALIZE, "capitalize")              \
    XX(CENTER, "center") XX(COUNT, "count") XX(D, "d") XX(DEFAULT, "default")                    \
    XX(DICTSORT, "dictsort") XX(E, "e") XX(ESCAPE, "escape") XX(FIRST, "first")                  \
    XX(FLOAT, "float") XX(FORMAT, "format") XX(INDENT, "indent") XX(INT, "int")                  \
    XX(ITEMS, "items") XX(JOIN, "join") XX(LAST, "last") XX(LENGTH, "length") XX(LIST, "list")   \
    XX(LOWER, "lower") XX(MAP, "map") XX(MAX, "max") XX(MIN, "min") XX(REJECT, "reject")         \
    XX(REJECTATTR, "rejectattr") XX(REPLACE, "replace") XX(REVERSE, "reverse")                   \
    XX(ROUND, "round") XX(SAFE, "safe") XX(SELECT, "select") XX(SELECTATTR, "selectattr")        \
    XX(SORT, "sort") XX(STRING, "string") XX(STRIPTAGS, "striptags") XX(SUM, "sum")              \
    XX(TITLE, "title") XX(TOJSON, "tojson") XX(TRIM, "trim") XX(TRUNCATE, "truncate")            \
    XX(UNIQUE, "unique") XX(UPPER, "upper") XX(WORDCOUNT, "wordcount")
enum {
#define XX(id, name) JF_##id,
    JJ_FILTER_MAP(XX)
#undef XX
    JF__COUNT
};
#define JJ_TEST_MAP(XX)                                                                           \
    XX(BOOLEAN, "boolean") XX(CALLABLE, "callable") XX(DEFINED, "defined")                       \
    XX(DIVISIBLEBY, "divisibleby") XX(EQ, "eq") XX(EQUALTO, "equalto") XX(EVEN, "even")          \
    XX(FALSE, "false") XX(FLOAT, "float") XX(GE, "ge") XX(GT, "gt") XX(IN, "in")                 \
    XX(INTEGER, "integer") XX(ITERABLE, "iterable") XX(LE, "le") XX(LT, "lt")                    \
    XX(LOWER, "lower") XX(MAPPING, "mapping") XX(NE, "ne") XX(NONE, "none") XX(NUMBER, "number") \
    XX(ODD, "odd") XX(SAMEAS, "sameas") XX(SEQUENCE, "sequence") XX(STRING, "string")            \
    XX(TRUE, "true") XX(UNDEFINED, "undefined") XX(UPPER, "upper") XX(GREATERTHAN, "greaterthan") \
    XX(LESSTHAN, "lessthan")
enum {
#define XX(id, name) JTS_##id,
    JJ_TEST_MAP(XX)
#undef XX
    JTS__COUNT
};

/* Evaluated call arguments: positional (names[i] == NULL) and keyword. */
#define JJ_MAX_ARGS 16
struct jj_args {
    jv v[JJ_MAX_ARGS];
    const char *names[JJ_MAX_ARGS];
    size_t nl[JJ_MAX_ARGS];
    size_t n;
};
int ty__jinja_args_eval(struct jj_ctx *c, struct jj_frame *f, const struct jnode *n, size_t skip,
                        struct jj_args *fa);
const jv *ty__jinja_arg(const struct jj_args *fa, size_t pos, const char *name);
int ty__jinja_need_str(struct jj_ctx *c, int line, jv v, const char *what, jv *out);
int ty__jinja_items(struct jj_ctx *c, int line, jv d, jv *out);
int ty__jinja_replace(struct jj_ctx *c, int line, jv s, jv old, jv new, int64_t count, jv *out);
int ty__jinja_apply_test(struct jj_ctx *c, int line, int id, jv x, const jv *args, size_t nargs,
                         bool *out);

#endif /* TY_JINJA_IMPL_H */
