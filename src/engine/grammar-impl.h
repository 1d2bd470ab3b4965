/* Private: the compiled grammar's nodes, the matcher's frames and the vocabulary trie
 * (tycho/grammar.h). A grammar is an array of nodes referring to each other by index (so
 * recursive $refs are cycles); a matcher's state is a set of stacks of frames kept in one pool
 * as parent-linked lists, so stacks forked by anyOf share their common bottom. */
#ifndef TYCHO_GRAMMAR_IMPL_H
#define TYCHO_GRAMMAR_IMPL_H

#include "tycho/grammar.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define G_NONE UINT32_MAX
#define G_INF (UINT32_MAX / 4) /* a min_len that is not (yet) finite */
#define G_MAX_STACKS 128

enum gnode_kind {
    GN_UNION,   /* kids: one of them */
    GN_OBJECT,  /* props in order, additional (G_NONE: none) */
    GN_ARRAY,   /* kids: prefixItems, items (G_NONE: none beyond), min/max items */
    GN_STRING,  /* min/max length in code points */
    GN_KEY,     /* an object key other than the declared names (a string) */
    GN_NUMBER,
    GN_INTEGER,
    GN_LITERAL, /* exact bytes (const, enum members, true/false/null) */
};

struct gprop {
    char *key;      /* the key as written: quoted, JSON-escaped */
    uint32_t key_len, hash; /* hash of the key's bytes between the quotes */
    uint32_t child, key_lit; /* the value's node; a LITERAL node of `key` */
    bool required;
};

struct gnode {
    enum gnode_kind kind;
    uint32_t *kids, n_kids; /* UNION: alternatives; ARRAY: prefixItems */
    struct gprop *props;    /* OBJECT */
    uint32_t n_props;
    uint32_t items, additional, key_node; /* ARRAY items; OBJECT additional value, its key */
    uint32_t min, max;      /* STRING length, ARRAY items (max UINT32_MAX: none) */
    char *lit;              /* LITERAL */
    uint32_t lit_len;
    uint32_t min_len;       /* shortest text of a value, in bytes */
    uint32_t *req_rest;     /* OBJECT: [i] = bytes of the required members from i on,
                             * each with its comma, (n_props + 1) */
    uint32_t *n_req_rest;   /* OBJECT: required members from i on */
};

struct ty_grammar {
    struct gnode *nodes;
    uint32_t n_nodes, cap_nodes, root;
};

/* One frame: a node being matched and where in it. Frames are immutable once made: a step
 * makes new ones. */
struct gframe {
    uint32_t parent; /* frame index in the pool, G_NONE: bottom */
    uint32_t node;
    uint32_t cnt;    /* object: next property; array: items done; string: code points (or
                      * the key's hash); number/literal: bytes */
    uint8_t st;      /* the kind's state */
    uint8_t ws;      /* whitespace bytes in the current run */
    uint16_t aux;    /* string UTF-8/escape detail, object member, exponent digits */
    uint16_t depth;  /* frames below */
};

struct gpool {
    struct gframe *f;
    uint32_t n, cap;
};

/* A state: the tops of its stacks (G_NONE: an emptied stack, the document complete). */
struct gstate {
    uint32_t top[G_MAX_STACKS];
    uint32_t n;
};

uint32_t ty__grammar_key_hash(const char *s, size_t n);
/* UTF-8 inside a JSON string: advance `*aux` (pending continuation bytes and their range) over
 * byte c, which is not '"' or '\\'. Returns false when c cannot come here. */
bool ty__grammar_utf8_step(uint16_t *aux, uint8_t c);

/* Matching (grammar_match.c). */
int ty__grammar_start(const ty_grammar_t *g, struct gpool *p, struct gstate *out);
/* Step every stack of `in` over byte c into `out` (deduplicated). Returns 0 or TY_ENOMEM;
 * out->n == 0: c is not admitted. */
int ty__grammar_step(const ty_grammar_t *g, struct gpool *p, const struct gstate *in,
                     uint8_t c, struct gstate *out);
bool ty__grammar_complete(const ty_grammar_t *g, const struct gpool *p, const struct gstate *s);
/* Shortest completion in bytes over the stacks. */
uint32_t ty__grammar_min_close(const ty_grammar_t *g, const struct gpool *p,
                               const struct gstate *s);
/* Whether every stack is inside a string between characters (the tokens that stay in it are
 * the vocabulary's string-safe set); *chars: the characters every one may still take
 * (UINT32_MAX: no limit). */
bool ty__grammar_in_plain_string(const ty_grammar_t *g, const struct gpool *p,
                                 const struct gstate *s, uint32_t *chars);
uint64_t ty__grammar_state_hash(const struct gpool *p, const struct gstate *s);
/* Copy the frames s reaches into a fresh pool (compaction). */
int ty__grammar_state_compact(struct gpool *p, struct gstate *s);

#endif
