/* The grammar's pushdown matcher over bytes (grammar-impl.h). A step offers the byte to the top
 * frame of each stack; a frame that may end is also popped and the byte offered to the frame
 * below (a number ends where a ',' begins). A frame that needs a value pushes the value's
 * start frames (one per union alternative) and lets them take the byte. Frames are appended
 * to a pool and never changed, so the vocabulary walk truncates the pool to backtrack. */
#include "grammar-impl.h"

#include "tycho/errors.h"

#include <stdlib.h>
#include <string.h>

enum { O_START, O_OPEN, O_COMMA, O_KEY, O_COLON, O_VALUE, O_DONE };
enum { A_START, A_OPEN, A_ITEM, A_COMMA, A_DONE };
enum { S_START, S_IN, S_ESC, S_U, S_DONE };
#define OBJ_ADD 0xFFFFu  /* O_KEY/O_COLON aux: an additional property */
#define MAX_INT_DIGITS 15 /* jansson refuses integers beyond int64 */
#define MAX_EXP_DIGITS 2
#define MAX_FRAMES (2 * TY_GRAMMAR_MAX_DEPTH + 8)
#define MAX_UNIONS 128 /* unions one expansion visits */

static bool is_ws(uint8_t c)
{
    return c == ' ' || c == '\n' || c == '\t';
}

static int pool_add(struct gpool *p, const struct gframe *f, uint32_t *idx)
{
    if (p->n == p->cap) {
        uint32_t cap = p->cap ? p->cap * 2 : 256;
        struct gframe *nf = realloc(p->f, cap * sizeof(*nf));
        if (!nf)
            return TY_ENOMEM;
        p->f = nf;
        p->cap = cap;
    }
    p->f[p->n] = *f;
    *idx = p->n++;
    return 0;
}

static bool frame_eq(const struct gframe *a, const struct gframe *b)
{
    return a->parent == b->parent && a->node == b->node && a->cnt == b->cnt && a->st == b->st &&
           a->ws == b->ws && a->aux == b->aux;
}

/* Add frame f (a new top) to out unless an equal one is there. */
static int emit(struct gpool *p, const struct gframe *f, struct gstate *out)
{
    for (uint32_t i = 0; i < out->n; i++)
        if (frame_eq(&p->f[out->top[i]], f))
            return 0;
    if (out->n == G_MAX_STACKS)
        return 0; /* beyond the bound: this reading is dropped */
    uint32_t idx;
    int rc = pool_add(p, f, &idx);
    if (!rc)
        out->top[out->n++] = idx;
    return rc;
}

/* Unions met by one expansion: each is expanded once (the frames it gives depend only on the
 * parent, the same throughout), so unions that refer to each other or share members cost
 * their size, not the number of paths through them. */
struct uvisit {
    uint32_t ids[MAX_UNIONS];
    uint32_t n;
};

/* Start frames of `node` on top of frame `parent` (one per union alternative) into out. */
static int expand(const ty_grammar_t *g, struct gpool *p, uint32_t parent, uint32_t node,
                  struct gstate *out, struct uvisit *seen)
{
    const struct gnode *n = &g->nodes[node];
    if (n->kind == GN_UNION) {
        for (uint32_t i = 0; i < seen->n; i++)
            if (seen->ids[i] == node)
                return 0;
        if (seen->n == MAX_UNIONS)
            return 0; /* beyond the bound: these readings are dropped */
        seen->ids[seen->n++] = node;
        int rc = 0;
        for (uint32_t i = 0; i < n->n_kids && !rc; i++)
            rc = expand(g, p, parent, n->kids[i], out, seen);
        return rc;
    }
    uint16_t depth = parent == G_NONE ? 0 : (uint16_t)(p->f[parent].depth + 1);
    if (depth >= MAX_FRAMES)
        return 0;
    struct gframe f = {.parent = parent, .node = node, .depth = depth};
    return emit(p, &f, out);
}

static int step_frame(const ty_grammar_t *g, struct gpool *p, uint32_t t, uint8_t c,
                      struct gstate *out);

/* Frame `parent_f` (a parent's next state) goes on the pool, `node` on top of it takes c. */
static int enter(const ty_grammar_t *g, struct gpool *p, const struct gframe *parent_f,
                 uint32_t node, uint8_t c, struct gstate *out)
{
    uint32_t pi;
    struct gstate tmp;
    tmp.n = 0;
    int rc = pool_add(p, parent_f, &pi);
    struct uvisit seen;
    seen.n = 0;
    rc = rc ? rc : expand(g, p, pi, node, &tmp, &seen);
    for (uint32_t i = 0; i < tmp.n && !rc; i++)
        rc = step_frame(g, p, tmp.top[i], c, out);
    return rc;
}

static int ws_or(struct gpool *p, const struct gframe *f, uint8_t c, struct gstate *out,
                 bool *took)
{
    *took = is_ws(c);
    if (!*took || f->ws >= TY_GRAMMAR_MAX_WS)
        return 0;
    struct gframe n = *f;
    n.ws++;
    return emit(p, &n, out);
}

static uint32_t first_required(const struct gnode *n, uint32_t from)
{
    for (uint32_t i = from; i < n->n_props; i++)
        if (n->props[i].required)
            return i;
    return n->n_props;
}

/* A key begins: one reading per property that may come next, and one for an extra one. */
static int object_key(const ty_grammar_t *g, struct gpool *p, const struct gframe *f,
                      const struct gnode *n, uint8_t c, struct gstate *out)
{
    uint32_t last = first_required(n, f->cnt);
    int rc = 0;
    for (uint32_t i = f->cnt; i <= last && i < n->n_props && !rc; i++) {
        struct gframe k = *f;
        k.st = O_KEY, k.ws = 0, k.aux = (uint16_t)i, k.cnt = i + 1;
        rc = enter(g, p, &k, n->props[i].key_lit, c, out);
    }
    if (!rc && n->additional != G_NONE) {
        struct gframe k = *f;
        k.st = O_KEY, k.ws = 0, k.aux = OBJ_ADD;
        rc = enter(g, p, &k, n->key_node, c, out);
    }
    return rc;
}

static bool object_more(const struct gnode *n, uint32_t cnt)
{
    return cnt < n->n_props || n->additional != G_NONE;
}

static int object_step(const ty_grammar_t *g, struct gpool *p, const struct gframe *f,
                       uint8_t c, struct gstate *out)
{
    const struct gnode *n = &g->nodes[f->node];
    struct gframe x = *f;
    bool took;
    int rc;
    switch (f->st) {
    case O_START:
        x.st = O_OPEN;
        return c == '{' ? emit(p, &x, out) : 0;
    case O_OPEN:
    case O_COMMA:
        if ((rc = ws_or(p, f, c, out, &took)) || took)
            return rc;
        if (c == '}' && f->st == O_OPEN && !n->n_req_rest[f->cnt]) {
            x.st = O_DONE;
            return emit(p, &x, out);
        }
        return c == '"' ? object_key(g, p, f, n, c, out) : 0;
    case O_KEY:
        if ((rc = ws_or(p, f, c, out, &took)) || took)
            return rc;
        x.st = O_COLON, x.ws = 0;
        return c == ':' ? emit(p, &x, out) : 0;
    case O_COLON:
        if ((rc = ws_or(p, f, c, out, &took)) || took)
            return rc;
        x.st = O_VALUE, x.ws = 0;
        return enter(g, p, &x, f->aux == OBJ_ADD ? n->additional : n->props[f->aux].child, c,
                     out);
    case O_VALUE:
        if ((rc = ws_or(p, f, c, out, &took)) || took)
            return rc;
        x.ws = 0;
        if (c == ',' && object_more(n, f->cnt)) {
            x.st = O_COMMA;
            return emit(p, &x, out);
        }
        x.st = O_DONE;
        return c == '}' && !n->n_req_rest[f->cnt] ? emit(p, &x, out) : 0;
    }
    return 0;
}

static uint32_t array_item(const struct gnode *n, uint32_t k)
{
    return k < n->n_kids ? n->kids[k] : n->items;
}

static int array_step(const ty_grammar_t *g, struct gpool *p, const struct gframe *f,
                      uint8_t c, struct gstate *out)
{
    const struct gnode *n = &g->nodes[f->node];
    struct gframe x = *f;
    bool took;
    int rc;
    if (f->st == A_START) {
        x.st = A_OPEN;
        return c == '[' ? emit(p, &x, out) : 0;
    }
    if (f->st == A_DONE)
        return 0;
    if ((rc = ws_or(p, f, c, out, &took)) || took)
        return rc;
    x.ws = 0;
    if (c == ']' && f->st != A_COMMA && f->cnt >= n->min) {
        x.st = A_DONE;
        return emit(p, &x, out);
    }
    if (f->st == A_ITEM) {
        x.st = A_COMMA;
        bool more = f->cnt < n->max && array_item(n, f->cnt) != G_NONE;
        return c == ',' && more ? emit(p, &x, out) : 0;
    }
    if (f->cnt >= n->max || array_item(n, f->cnt) == G_NONE)
        return 0;
    x.st = A_ITEM;
    x.cnt = f->cnt + 1;
    return enter(g, p, &x, array_item(n, f->cnt), c, out);
}

bool ty__grammar_utf8_step(uint16_t *aux, uint8_t c)
{
    static const uint8_t lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80};
    static const uint8_t hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
    unsigned pending = *aux & 3, cls = (*aux >> 2) & 7;
    if (pending) {
        if (c < lo[cls] || c > hi[cls])
            return false;
        *aux = (uint16_t)(pending - 1);
        return true;
    }
    if (c < 0x20)
        return false;
    if (c < 0x80)
        return true;
    if (c >= 0xC2 && c <= 0xDF)
        *aux = 1;
    else if (c >= 0xE0 && c <= 0xEF)
        *aux = (uint16_t)(2 | (c == 0xE0 ? 1 << 2 : c == 0xED ? 2 << 2 : 0));
    else if (c >= 0xF0 && c <= 0xF4)
        *aux = (uint16_t)(3 | (c == 0xF0 ? 3 << 2 : c == 0xF4 ? 4 << 2 : 0));
    else
        return false;
    return true;
}

static bool key_declared(const ty_grammar_t *g, const struct gpool *p, const struct gframe *f)
{
    if (f->parent == G_NONE)
        return false;
    const struct gnode *o = &g->nodes[p->f[f->parent].node];
    for (uint32_t i = 0; i < o->n_props; i++)
        if (o->props[i].hash == f->cnt)
            return true;
    return false;
}

static bool hexdig(uint8_t c)
{
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

/* One character more in a string: counted when the string has limits, else cnt stays 0 so
 * that the states recur; a key hashes its bytes instead. */
static bool string_count(const struct gnode *n, struct gframe *x, uint8_t c)
{
    if (n->kind == GN_KEY) {
        x->cnt = (x->cnt ^ c) * 16777619u;
        return true;
    }
    if (n->min == 0 && n->max == UINT32_MAX)
        return true;
    if (x->cnt >= n->max)
        return false;
    x->cnt++;
    return true;
}

static int string_step(const ty_grammar_t *g, struct gpool *p, const struct gframe *f,
                       uint8_t c, struct gstate *out)
{
    const struct gnode *n = &g->nodes[f->node];
    struct gframe x = *f;
    bool key = n->kind == GN_KEY;
    switch (f->st) {
    case S_START:
        x.st = S_IN;
        x.cnt = key ? 2166136261u : 0;
        return c == '"' ? emit(p, &x, out) : 0;
    case S_IN:
        if (!(f->aux & 3) && c == '"') {
            x.st = S_DONE;
            bool ok = key ? !key_declared(g, p, f) : f->cnt >= n->min;
            return ok ? emit(p, &x, out) : 0;
        }
        if (!(f->aux & 3) && c == '\\') {
            x.st = S_ESC;
            return string_count(n, &x, c) ? emit(p, &x, out) : 0;
        }
        if (!ty__grammar_utf8_step(&x.aux, c))
            return 0;
        if (key || !(f->aux & 3))
            if (!string_count(n, &x, c))
                return 0;
        return emit(p, &x, out);
    case S_ESC:
        if (key)
            x.cnt = (x.cnt ^ c) * 16777619u;
        if (c == 'u') {
            x.st = S_U;
            x.aux = 8; /* digit 0, all zero so far */
            return emit(p, &x, out);
        }
        x.st = S_IN;
        return c && strchr("\"\\/bfnrt", c) ? emit(p, &x, out) : 0;
    case S_U: {
        unsigned idx = f->aux & 3;
        if (!hexdig(c) || (idx == 1 && (f->aux & 4) && c >= '8') || /* no surrogates */
            (idx == 3 && (f->aux & 8) && c == '0'))                /* no \u0000 */
            return 0;
        if (key)
            x.cnt = (x.cnt ^ c) * 16777619u;
        uint16_t a = (uint16_t)((f->aux & 12) | (idx + 1));
        if (idx == 0 && (c | 0x20) == 'd')
            a |= 4;
        if (c != '0')
            a &= (uint16_t)~8u;
        x.aux = idx == 3 ? 0 : a;
        x.st = idx == 3 ? S_IN : S_U;
        return emit(p, &x, out);
    }
    }
    return 0;
}

static int number_step(const ty_grammar_t *g, struct gpool *p, const struct gframe *f,
                       uint8_t c, struct gstate *out)
{
    bool real = g->nodes[f->node].kind == GN_NUMBER, dig = c >= '0' && c <= '9';
    bool e = real && (c == 'e' || c == 'E'), dot = real && c == '.';
    struct gframe x = *f;
    int to = -1;
    switch (f->st) {
    case 0:
        to = c == '-' ? 1 : c == '0' ? 2 : dig ? 3 : -1;
        x.cnt = 1;
        break;
    case 1:
        to = c == '0' ? 2 : dig ? 3 : -1;
        break;
    case 2:
    case 3:
        if (f->st == 3 && dig && f->cnt < MAX_INT_DIGITS) {
            to = 3;
            x.cnt++;
        } else {
            to = dot ? 4 : e ? 6 : -1;
            x.cnt = 0;
        }
        break;
    case 4:
    case 5:
        if (dig && f->cnt < MAX_INT_DIGITS) {
            to = 5;
            x.cnt++;
        } else if (f->st == 5 && e) {
            to = 6;
        }
        break;
    case 6:
        to = c == '+' || c == '-' ? 7 : dig ? 8 : -1;
        x.aux = dig ? 1 : 0;
        break;
    case 7:
    case 8:
        to = dig && f->aux < MAX_EXP_DIGITS ? 8 : -1;
        x.aux++;
        break;
    }
    if (to < 0)
        return 0;
    x.st = (uint8_t)to;
    return emit(p, &x, out);
}

static bool frame_can_end(const ty_grammar_t *g, const struct gframe *f)
{
    const struct gnode *n = &g->nodes[f->node];
    switch (n->kind) {
    case GN_OBJECT:
        return f->st == O_DONE;
    case GN_ARRAY:
        return f->st == A_DONE;
    case GN_STRING:
    case GN_KEY:
        return f->st == S_DONE;
    case GN_NUMBER:
    case GN_INTEGER:
        return f->st == 2 || f->st == 3 || f->st == 5 || f->st == 8;
    case GN_LITERAL:
        return f->cnt == n->lit_len;
    case GN_UNION:
        break;
    }
    return false;
}

static int step_frame(const ty_grammar_t *g, struct gpool *p, uint32_t t, uint8_t c,
                      struct gstate *out)
{
    if (t == G_NONE)
        return 0; /* the document is complete: nothing may follow */
    const struct gframe f = p->f[t]; /* a copy: the pool may move */
    const struct gnode *n = &g->nodes[f.node];
    int rc = 0;
    switch (n->kind) {
    case GN_OBJECT:
        rc = object_step(g, p, &f, c, out);
        break;
    case GN_ARRAY:
        rc = array_step(g, p, &f, c, out);
        break;
    case GN_STRING:
    case GN_KEY:
        rc = string_step(g, p, &f, c, out);
        break;
    case GN_NUMBER:
    case GN_INTEGER:
        rc = number_step(g, p, &f, c, out);
        break;
    case GN_LITERAL:
        if (f.cnt < n->lit_len && (uint8_t)n->lit[f.cnt] == c) {
            struct gframe x = f;
            x.cnt++;
            rc = emit(p, &x, out);
        }
        break;
    case GN_UNION:
        break;
    }
    if (!rc && frame_can_end(g, &f))
        rc = step_frame(g, p, f.parent, c, out);
    return rc;
}

int ty__grammar_step(const ty_grammar_t *g, struct gpool *p, const struct gstate *in,
                     uint8_t c, struct gstate *out)
{
    out->n = 0;
    int rc = 0;
    for (uint32_t i = 0; i < in->n && !rc; i++)
        rc = step_frame(g, p, in->top[i], c, out);
    return rc;
}

int ty__grammar_start(const ty_grammar_t *g, struct gpool *p, struct gstate *out)
{
    struct uvisit seen;
    out->n = 0;
    seen.n = 0;
    return expand(g, p, G_NONE, g->root, out, &seen);
}

bool ty__grammar_complete(const ty_grammar_t *g, const struct gpool *p, const struct gstate *s)
{
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t t = s->top[i];
        while (t != G_NONE && frame_can_end(g, &p->f[t]))
            t = p->f[t].parent;
        if (t == G_NONE)
            return true;
    }
    return false;
}

/* ---- shortest completions ---------------------------------------------------------------- */

static uint64_t items_min(const ty_grammar_t *g, const struct gnode *n, uint32_t from,
                          uint32_t to)
{
    uint64_t v = 0;
    for (uint32_t k = from; k < to && k < n->n_kids; k++)
        v += g->nodes[n->kids[k]].min_len;
    if (to > n->n_kids && to > from) {
        uint32_t k0 = from > n->n_kids ? from : n->n_kids;
        v += (uint64_t)(to - k0) * (n->items == G_NONE ? G_INF : g->nodes[n->items].min_len);
    }
    return v;
}

static uint64_t object_rest(const ty_grammar_t *g, const struct gframe *f, const struct gnode *n)
{
    uint64_t tail = (uint64_t)n->req_rest[f->cnt] + 1; /* after a member: the rest and '}' */
    switch (f->st) {
    case O_START:
        return n->min_len;
    case O_OPEN:
        return n->n_req_rest[f->cnt] ? n->req_rest[f->cnt] : 1;
    case O_COMMA: {
        if (n->n_req_rest[f->cnt])
            return n->req_rest[f->cnt];
        uint64_t best = n->additional != G_NONE ? 4 + (uint64_t)g->nodes[n->additional].min_len
                                                : G_INF;
        for (uint32_t i = f->cnt; i < n->n_props; i++) {
            uint64_t m = n->props[i].key_len + 1 + (uint64_t)g->nodes[n->props[i].child].min_len;
            best = m < best ? m : best;
        }
        return best + 1;
    }
    case O_KEY:
    case O_COLON: {
        uint32_t child = f->aux == OBJ_ADD ? n->additional : n->props[f->aux].child;
        return (f->st == O_KEY ? 1 : 0) + (uint64_t)g->nodes[child].min_len + tail;
    }
    case O_VALUE:
        return tail;
    }
    return 0;
}

static uint64_t frame_rest(const ty_grammar_t *g, const struct gframe *f)
{
    const struct gnode *n = &g->nodes[f->node];
    static const uint8_t num_rest[] = {1, 1, 0, 0, 1, 0, 1, 1, 0};
    switch (n->kind) {
    case GN_OBJECT:
        return object_rest(g, f, n);
    case GN_ARRAY: {
        uint32_t need = n->min > f->cnt ? n->min - f->cnt : 0;
        if (f->st == A_START)
            return n->min_len;
        if (f->st == A_DONE)
            return 0;
        if (f->st == A_COMMA && !need)
            need = 1;
        uint64_t commas = f->st == A_ITEM ? need : need ? need - 1 : 0;
        return items_min(g, n, f->cnt, f->cnt + need) + commas + 1;
    }
    case GN_STRING:
    case GN_KEY: {
        uint64_t left = n->kind == GN_STRING && n->min > f->cnt ? n->min - f->cnt : 0;
        switch (f->st) {
        case S_START:
            return n->min_len;
        case S_IN:
            return (f->aux & 3) + left + 1;
        case S_ESC:
            return 1 + left + 1;
        case S_U:
            return (4 - (f->aux & 3)) + left + 1;
        }
        return 0;
    }
    case GN_NUMBER:
    case GN_INTEGER:
        return num_rest[f->st];
    case GN_LITERAL:
        return n->lit_len - f->cnt;
    case GN_UNION:
        break;
    }
    return G_INF;
}

uint32_t ty__grammar_min_close(const ty_grammar_t *g, const struct gpool *p,
                               const struct gstate *s)
{
    uint64_t best = G_INF;
    for (uint32_t i = 0; i < s->n; i++) {
        uint64_t v = 0;
        for (uint32_t t = s->top[i]; t != G_NONE && v < best; t = p->f[t].parent)
            v += frame_rest(g, &p->f[t]);
        best = v < best ? v : best;
    }
    return (uint32_t)best;
}

bool ty__grammar_in_plain_string(const ty_grammar_t *g, const struct gpool *p,
                                 const struct gstate *s, uint32_t *chars)
{
    *chars = UINT32_MAX;
    for (uint32_t i = 0; i < s->n; i++) {
        const struct gframe *f = &p->f[s->top[i]];
        const struct gnode *n = &g->nodes[f->node];
        if ((n->kind != GN_KEY && n->kind != GN_STRING) || f->st != S_IN || (f->aux & 3))
            return false;
        if (n->kind == GN_STRING && (n->min || n->max != UINT32_MAX)) {
            uint32_t left = n->max == UINT32_MAX ? UINT32_MAX - 1 : n->max - f->cnt;
            *chars = left < *chars ? left : *chars;
        }
    }
    return s->n > 0;
}

uint64_t ty__grammar_state_hash(const struct gpool *p, const struct gstate *s)
{
    uint64_t h = 1469598103934665603ull ^ s->n;
    for (uint32_t i = 0; i < s->n; i++) {
        for (uint32_t t = s->top[i]; t != G_NONE; t = p->f[t].parent) {
            const struct gframe *f = &p->f[t];
            uint64_t w[3] = {f->node, f->cnt, (uint64_t)f->st | (uint64_t)f->ws << 8 |
                                                  (uint64_t)f->aux << 16};
            for (int k = 0; k < 3; k++)
                h = (h ^ w[k]) * 1099511628211ull;
        }
        h = (h ^ 0xff) * 1099511628211ull;
    }
    return h;
}

static int copy_chain(const struct gpool *from, uint32_t t, struct gpool *to, uint32_t *out)
{
    if (t == G_NONE) {
        *out = G_NONE;
        return 0;
    }
    uint32_t parent;
    int rc = copy_chain(from, from->f[t].parent, to, &parent);
    struct gframe f = from->f[t];
    f.parent = parent;
    return rc ? rc : pool_add(to, &f, out);
}

int ty__grammar_state_compact(struct gpool *p, struct gstate *s)
{
    struct gpool np = {0};
    struct gstate ns = {.n = s->n};
    int rc = 0;
    for (uint32_t i = 0; i < s->n && !rc; i++)
        rc = copy_chain(p, s->top[i], &np, &ns.top[i]);
    if (rc) {
        free(np.f);
        return rc;
    }
    free(p->f);
    *p = np;
    *s = ns;
    return 0;
}
