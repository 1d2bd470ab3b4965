/* Internals of the config module (config*.c), not for other components.
 *
 * A document (file text, or the one-key YAML made from an environment variable or a flag) is
 * read in three steps: a libyaml pass builds a node tree that keeps each node's line and column
 * (config_tree.c); the tree is checked against the settings table, so every error can name its
 * place (config_check.c); then libcyaml loads the same text through the schema derived from the
 * table, and the loaded values are merged into the caller's struct (config.c). All of it runs
 * on the thread that owns the ty_config_t.
 */
#ifndef TYCHO_CONFIG_IMPL_H
#define TYCHO_CONFIG_IMPL_H

#include "tycho/arena.h"
#include "tycho/config.h"

#include <cyaml/cyaml.h>
#include <stdarg.h>

#define TY__CFG_MAX_DEPTH 64
#define TY__CFG_MAX_NODES 200000
#define TY__CFG_MAX_BYTES (4u << 20)

enum ty__cfg_node_kind {
    TY__CFG_NODE_SCALAR,
    TY__CFG_NODE_MAP,
    TY__CFG_NODE_SEQ,
};

struct ty__cfg_node {
    enum ty__cfg_node_kind kind;
    int line, col;       /* 1-based, of the node's first character */
    const char *text;    /* scalars: NUL-terminated value (arena) */
    bool plain;          /* scalars: plain style (so "null", "~" and "" mean no value) */
    struct ty__cfg_node **items; /* maps: key, value, key, value...; sequences: entries */
    size_t n_items;
};

/* One document being applied. */
struct ty__cfg_doc {
    const char *origin;  /* file name, env variable or flag */
    bool positions;      /* line:col are meaningful (files, not env/flags) */
    ty_arena_t *arena;
    struct ty__cfg_node *root; /* NULL for an empty document */
    size_t n_nodes;
    struct ty_config_error *err;
};

/* A flattened setting: a scalar or list field anywhere below the root, outside lists. */
struct ty__cfg_leaf {
    const struct ty_config_field *field;
    size_t offset;       /* from the start of the root struct */
    char path[160];      /* "slo.ttft_ms" */
    char env[192];       /* "TYCHO_SLO_TTFT_MS" */
    bool set;            /* some layer set it (for TY_CONFIG_REQUIRED) */
};

union ty__cfg_val {
    bool b;
    int64_t i;
    uint64_t u;
    double d;
};

struct ty_config {
    const struct ty_config_struct *root;
    void *data;
    char env_prefix[32];
    char *path;               /* last file loaded */
    struct ty__cfg_leaf *leaves;
    size_t n_leaves;
    cyaml_schema_value_t top; /* libcyaml schema of the root */
    void **schema_allocs;     /* everything allocated for the libcyaml schema */
    size_t n_schema_allocs, cap_schema_allocs;
    char cyaml_log[512];      /* last libcyaml error text, for the rare error it alone finds */
};

/* config_tree.c */
int ty__cfg_tree_build(struct ty__cfg_doc *doc, const char *text, size_t len);

/* config_check.c: check the whole tree against the table; 0 or TY_ECONFIG with doc->err. */
int ty__cfg_check_doc(const struct ty__cfg_doc *doc, const struct ty_config_struct *root);
bool ty__cfg_node_is_null(const struct ty__cfg_node *n);
const struct ty_config_field *ty__cfg_field_find(const struct ty_config_struct *s,
                                                 const char *key);

/* config_value.c */
int ty__cfg_parse(const struct ty_config_field *f, enum ty_config_type t, const char *text,
                  union ty__cfg_val *out, char *why, size_t why_len);
int ty__cfg_parse_checked(const struct ty_config_field *f, enum ty_config_type t,
                          const char *text, union ty__cfg_val *out, char *why, size_t why_len);
void ty__cfg_store(enum ty_config_type t, size_t size, void *dst, union ty__cfg_val v);
union ty__cfg_val ty__cfg_load(enum ty_config_type t, size_t size, const void *src);
void ty__cfg_format(const struct ty_config_field *f, enum ty_config_type t, union ty__cfg_val v,
                    char *buf, size_t len);
const char *ty__cfg_type_name(const struct ty_config_field *f, enum ty_config_type t);
bool ty__cfg_is_scalar(enum ty_config_type t);
size_t ty__cfg_edit_distance(const char *a, const char *b);
void ty__cfg_suggest(const char *word, const char *const *cands, size_t n, char *buf,
                     size_t len);

/* config.c */
void ty__cfg_error(struct ty_config_error *err, const char *origin, int line, int col,
                   const char *field, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void ty__cfg_entry_defaults(const struct ty_config_struct *s, void *base);

/* config_dump.c */
bool ty__cfg_values_equal(const struct ty_config_field *f, const void *a, const void *b);
void ty__cfg_field_free(const struct ty_config_field *f, void *base);

#endif
