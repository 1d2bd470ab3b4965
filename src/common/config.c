/* Config objects: the libcyaml schema derived from a settings table, and the layers
 * (defaults, file, environment, flags) applied to the caller's struct.
 *
 * The libcyaml data for a struct has the C struct's layout followed by "shadow" slots, one
 * pointer per size, duration and section field: sizes and durations are read by libcyaml as
 * strings (it has no such types) and converted here; sections are loaded as pointers so each
 * has room for its own shadow slots. One thread owns a ty_config_t.
 */
#include "config-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Copy `s` with control characters written as \n, \t or \xNN, so a message stays one line
 * whatever the user's value holds. */
static void escape_into(char *dst, size_t cap, const char *s)
{
    size_t n = 0;
    for (; *s && n + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != 0x7f)
            dst[n++] = (char)c;
        else if (c == '\n' || c == '\t')
            n += (size_t)snprintf(dst + n, cap - n, "\\%c", c == '\n' ? 'n' : 't');
        else
            n += (size_t)snprintf(dst + n, cap - n, "\\x%02x", c);
    }
    dst[n] = '\0';
}

void ty__cfg_error(struct ty_config_error *err, const char *origin, int line, int col,
                   const char *field, const char *fmt, ...)
{
    if (!err)
        return;
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    char raw[400];
    snprintf(raw, sizeof(raw), "%s", what);
    escape_into(what, sizeof(what), raw);
    escape_into(err->origin, sizeof(err->origin), origin ? origin : "");
    escape_into(err->field, sizeof(err->field), field ? field : "");
    err->line = line;
    err->col = col;
    char where[288];
    if (line > 0)
        snprintf(where, sizeof(where), "%s:%d:%d", err->origin, line, col);
    else
        snprintf(where, sizeof(where), "%s", err->origin);
    int n = err->field[0] ? snprintf(err->msg, sizeof(err->msg), "%s: %s: %s", where, err->field,
                                     what)
                          : snprintf(err->msg, sizeof(err->msg), "%s: %s", where, what);
    (void)n; /* a message longer than msg is cut; it still names place and field first */
}

/* ---- the libcyaml schema ------------------------------------------------------------------ */

static void *schema_alloc(ty_config_t *cfg, size_t size)
{
    if (cfg->n_schema_allocs == cfg->cap_schema_allocs) {
        cfg->cap_schema_allocs = cfg->cap_schema_allocs ? cfg->cap_schema_allocs * 2 : 16;
        cfg->schema_allocs = realloc(cfg->schema_allocs,
                                     cfg->cap_schema_allocs * sizeof(*cfg->schema_allocs));
        TY_ASSERT(cfg->schema_allocs);
    }
    void *p = calloc(1, size);
    TY_ASSERT(p);
    cfg->schema_allocs[cfg->n_schema_allocs++] = p;
    return p;
}

static bool has_shadow(const struct ty_config_field *f)
{
    return f->type == TY_CONFIG_SIZE || f->type == TY_CONFIG_DURATION ||
           f->type == TY_CONFIG_SECTION;
}

/* Offset of field `idx`'s shadow slot in the libcyaml data of `s`. */
static size_t shadow_offset(const struct ty_config_struct *s, size_t idx)
{
    size_t off = (s->size + 7) & ~(size_t)7;
    for (size_t i = 0; i < idx; i++)
        off += has_shadow(&s->fields[i]) ? sizeof(void *) : 0;
    return off;
}

static size_t cyaml_size(const struct ty_config_struct *s)
{
    return shadow_offset(s, s->n_fields);
}

static void schema_mapping(ty_config_t *cfg, const struct ty_config_struct *s,
                           cyaml_schema_value_t *out, enum cyaml_flag flags);

static void schema_scalar(ty_config_t *cfg, const struct ty_config_field *f, enum ty_config_type t,
                          size_t size, cyaml_schema_value_t *v)
{
    v->flags = CYAML_FLAG_DEFAULT;
    v->data_size = (uint32_t)size;
    switch (t) {
    case TY_CONFIG_BOOL:
        v->type = CYAML_BOOL;
        break;
    case TY_CONFIG_INT:
        v->type = CYAML_INT;
        break;
    case TY_CONFIG_UINT:
        v->type = CYAML_UINT;
        break;
    case TY_CONFIG_DOUBLE:
        v->type = CYAML_FLOAT;
        break;
    case TY_CONFIG_ENUM: {
        size_t n = 0;
        while (f->enum_names && f->enum_names[n])
            n++;
        cyaml_strval_t *sv = schema_alloc(cfg, (n + 1) * sizeof(*sv));
        for (size_t i = 0; i < n; i++)
            sv[i] = (cyaml_strval_t){.str = f->enum_names[i], .val = (int64_t)i};
        v->type = CYAML_ENUM;
        v->flags = CYAML_FLAG_STRICT;
        v->enumeration.strings = sv;
        v->enumeration.count = (uint32_t)n;
        break;
    }
    default: /* strings, and sizes and durations read as strings */
        v->type = CYAML_STRING;
        v->flags = CYAML_FLAG_POINTER;
        v->data_size = 1;
        v->string.min = 0;
        v->string.max = UINT32_MAX;
        break;
    }
}

static void schema_field(ty_config_t *cfg, const struct ty_config_struct *s, size_t idx,
                         cyaml_schema_field_t *out)
{
    const struct ty_config_field *f = &s->fields[idx];
    out->key = f->key;
    out->data_offset = (uint32_t)(has_shadow(f) ? shadow_offset(s, idx) : f->offset);
    if (f->type == TY_CONFIG_SECTION) {
        schema_mapping(cfg, f->sub, &out->value, CYAML_FLAG_POINTER);
    } else if (f->type == TY_CONFIG_LIST) {
        cyaml_schema_value_t *entry = schema_alloc(cfg, sizeof(*entry));
        if (f->sub)
            schema_mapping(cfg, f->sub, entry, CYAML_FLAG_DEFAULT);
        else
            schema_scalar(cfg, f, f->elem, f->size, entry);
        out->value.type = CYAML_SEQUENCE;
        out->value.flags = CYAML_FLAG_POINTER;
        out->value.data_size = entry->type == CYAML_MAPPING ? entry->data_size
                               : entry->flags & CYAML_FLAG_POINTER ? sizeof(char *)
                                                                   : entry->data_size;
        out->value.sequence.entry = entry;
        out->value.sequence.min = 0;
        out->value.sequence.max = CYAML_UNLIMITED;
        out->count_offset = (uint32_t)f->count_offset;
        out->count_size = sizeof(uint32_t);
    } else {
        schema_scalar(cfg, f, f->type, f->size, &out->value);
    }
    out->value.flags |= CYAML_FLAG_OPTIONAL;
}

static void schema_mapping(ty_config_t *cfg, const struct ty_config_struct *s,
                           cyaml_schema_value_t *out, enum cyaml_flag flags)
{
    cyaml_schema_field_t *fields = schema_alloc(cfg, (s->n_fields + 1) * sizeof(*fields));
    for (size_t i = 0; i < s->n_fields; i++)
        schema_field(cfg, s, i, &fields[i]);
    out->type = CYAML_MAPPING;
    out->flags = flags;
    out->data_size = (uint32_t)cyaml_size(s);
    out->mapping.fields = fields;
}

/* ---- table checks and leaves ------------------------------------------------------------- */

static int check_default(const struct ty_config_field *f, const char *path,
                         struct ty_config_error *err)
{
    char why[512];
    union ty__cfg_val v;
    enum ty_config_type t = f->type == TY_CONFIG_LIST ? TY_CONFIG_UINT : f->type;
    const char *texts[] = {f->def, f->min, f->max};
    for (int i = 0; i < 3; i++) {
        if (!texts[i] || f->type == TY_CONFIG_SECTION)
            continue;
        enum ty_config_type tt = (f->type == TY_CONFIG_STRING && i > 0) ? TY_CONFIG_UINT : t;
        int rc = i == 0 ? ty__cfg_parse_checked(f, tt, texts[i], &v, why, sizeof(why))
                        : ty__cfg_parse(f, tt, texts[i], &v, why, sizeof(why));
        if (f->type == TY_CONFIG_LIST && i == 0)
            rc = 0; /* list defaults are YAML flow text, checked when applied */
        if (rc != 0) {
            ty__cfg_error(err, "settings table", 0, 0, path, "bad %s: %s",
                          i == 0 ? "default" : i == 1 ? "minimum" : "maximum", why);
            return TY_ECONFIG;
        }
    }
    return 0;
}

static int check_field(const struct ty_config_field *f, const char *path,
                       struct ty_config_error *err)
{
    bool key_ok = f->key && f->key[0];
    for (const char *p = f->key; key_ok && *p; p++)
        key_ok = islower((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '_';
    const char *why = !key_ok                                             ? "bad key"
                      : f->type == TY_CONFIG_SECTION && !f->sub           ? "section without .sub"
                      : f->type == TY_CONFIG_ENUM && !f->enum_names       ? "enum without names"
                      : f->type == TY_CONFIG_LIST && !f->sub && !ty__cfg_is_scalar(f->elem)
                          ? "list entry type"
                      : f->type == TY_CONFIG_STRING && f->size != sizeof(char *) ? "string size"
                      : (f->type == TY_CONFIG_SIZE || f->type == TY_CONFIG_DURATION) &&
                              f->size != sizeof(uint64_t)
                          ? "size/duration must be uint64_t"
                          : NULL;
    if (why) {
        ty__cfg_error(err, "settings table", 0, 0, path, "%s", why);
        return TY_ECONFIG;
    }
    return check_default(f, path, err);
}

static void leaf_add(ty_config_t *cfg, const struct ty_config_field *f, size_t offset,
                     const char *path)
{
    cfg->leaves = realloc(cfg->leaves, (cfg->n_leaves + 1) * sizeof(*cfg->leaves));
    TY_ASSERT(cfg->leaves);
    struct ty__cfg_leaf *l = &cfg->leaves[cfg->n_leaves++];
    memset(l, 0, sizeof(*l));
    l->field = f;
    l->offset = offset;
    snprintf(l->path, sizeof(l->path), "%s", path);
    int n = snprintf(l->env, sizeof(l->env), "%s", cfg->env_prefix);
    for (const char *p = path; *p && n < (int)sizeof(l->env) - 1; p++)
        l->env[n++] = *p == '.' ? '_' : (char)toupper((unsigned char)*p);
    l->env[n] = '\0';
}

/* Fields of list entries are checked but are not leaves (they are set only as whole lists). */
static int check_struct(const struct ty_config_struct *s, const char *prefix, int depth,
                        struct ty_config_error *err)
{
    if (depth > 8) {
        ty__cfg_error(err, "settings table", 0, 0, prefix, "sections nested too deep");
        return TY_ECONFIG;
    }
    for (size_t i = 0; i < s->n_fields; i++) {
        const struct ty_config_field *f = &s->fields[i];
        char path[160];
        int len = snprintf(path, sizeof(path), "%s.%s", prefix, f->key ? f->key : "");
        if (len < 0 || (size_t)len >= sizeof(path)) {
            ty__cfg_error(err, "settings table", 0, 0, prefix, "key path too long");
            return TY_ECONFIG;
        }
        int rc = check_field(f, path, err);
        if (rc == 0 && f->sub)
            rc = check_struct(f->sub, path, depth + 1, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int flatten(ty_config_t *cfg, const struct ty_config_struct *s, size_t base,
                   const char *prefix, int depth, struct ty_config_error *err)
{
    if (depth > 8) {
        ty__cfg_error(err, "settings table", 0, 0, prefix, "sections nested too deep");
        return TY_ECONFIG;
    }
    for (size_t i = 0; i < s->n_fields; i++) {
        const struct ty_config_field *f = &s->fields[i];
        char path[160];
        int len = snprintf(path, sizeof(path), "%s%s%s", prefix, prefix[0] ? "." : "",
                           f->key ? f->key : "");
        if (len < 0 || (size_t)len >= sizeof(path)) {
            ty__cfg_error(err, "settings table", 0, 0, prefix, "key path too long");
            return TY_ECONFIG;
        }
        int rc = check_field(f, path, err);
        if (rc == 0 && f->sub && f->type == TY_CONFIG_LIST)
            rc = check_struct(f->sub, path, depth + 1, err);
        if (rc == 0 && f->type == TY_CONFIG_SECTION)
            rc = flatten(cfg, f->sub, base + f->offset, path, depth + 1, err);
        else if (rc == 0)
            leaf_add(cfg, f, base + f->offset, path);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- defaults ------------------------------------------------------------------------------ */

void ty__cfg_entry_defaults(const struct ty_config_struct *s, void *base)
{
    memset(base, 0, s->size);
    for (size_t i = 0; i < s->n_fields; i++) {
        const struct ty_config_field *f = &s->fields[i];
        char *dst = (char *)base + f->offset, why[256];
        union ty__cfg_val v;
        if (f->type == TY_CONFIG_SECTION) {
            ty__cfg_entry_defaults(f->sub, dst);
        } else if (f->type == TY_CONFIG_STRING) {
            if (f->def) {
                *(char **)dst = strdup(f->def);
                TY_ASSERT(*(char **)dst);
            }
        } else if (f->type != TY_CONFIG_LIST && f->def &&
                   ty__cfg_parse(f, f->type, f->def, &v, why, sizeof(why)) == 0) {
            ty__cfg_store(f->type, f->size, dst, v);
        }
    }
}

/* ---- merging what libcyaml loaded -------------------------------------------------------- */

enum merge_mode {
    MERGE_COMPARE, /* check that libcyaml read every value as the checker did */
    MERGE_APPLY,
};

struct merger {
    ty_config_t *cfg;
    struct ty__cfg_doc *doc;
    enum merge_mode mode;
};

static int merge_map(struct merger *m, const struct ty__cfg_node *map,
                     const struct ty_config_struct *s, const char *cy, char *user, long root_off);

static int mismatch(struct merger *m, const struct ty__cfg_node *at, const char *field)
{
    ty__cfg_error(m->doc->err, m->doc->origin, m->doc->positions ? at->line : 0,
                  m->doc->positions ? at->col : 0, field,
                  "value '%s' is read differently by libcyaml; please quote or rewrite it",
                  at->kind == TY__CFG_NODE_SCALAR ? at->text : "");
    return TY_ECONFIG;
}

/* One scalar: `cy` points at libcyaml's copy (the value, or a char * for strings, sizes and
 * durations), `dst` at the caller's member. */
static int merge_scalar(struct merger *m, const struct ty_config_field *f, enum ty_config_type t,
                        size_t size, const struct ty__cfg_node *v, const char *cy, char *dst)
{
    union ty__cfg_val val;
    char why[256], tmp[8] = {0};
    const char *cys = ty__cfg_is_scalar(t) && (t == TY_CONFIG_STRING || t == TY_CONFIG_SIZE ||
                                               t == TY_CONFIG_DURATION)
                          ? *(const char *const *)cy
                          : NULL;
    if (m->mode == MERGE_COMPARE) {
        if (cys)
            return cys && strcmp(cys, v->text) == 0 ? 0 : mismatch(m, v, "");
        if (cys == NULL && (t == TY_CONFIG_STRING || t == TY_CONFIG_SIZE ||
                            t == TY_CONFIG_DURATION))
            return mismatch(m, v, "");
        if (ty__cfg_parse(f, t, v->text, &val, why, sizeof(why)) != 0)
            return mismatch(m, v, "");
        ty__cfg_store(t, size, tmp, val);
        return memcmp(tmp, cy, size) == 0 ? 0 : mismatch(m, v, "");
    }
    if (t == TY_CONFIG_STRING) {
        free(*(char **)dst);
        *(char **)dst = strdup(cys);
        TY_ASSERT(*(char **)dst);
    } else if (t == TY_CONFIG_SIZE || t == TY_CONFIG_DURATION) {
        if (ty__cfg_parse(f, t, cys, &val, why, sizeof(why)) == 0)
            ty__cfg_store(t, size, dst, val);
    } else {
        memcpy(dst, cy, size);
    }
    return 0;
}

static size_t cy_entry_stride(const struct ty_config_field *f)
{
    if (f->sub)
        return cyaml_size(f->sub);
    if (f->elem == TY_CONFIG_STRING || f->elem == TY_CONFIG_SIZE || f->elem == TY_CONFIG_DURATION)
        return sizeof(char *);
    return f->size;
}

static int merge_list(struct merger *m, const struct ty_config_field *f,
                      const struct ty__cfg_node *v, const char *cy_base, char *user_base)
{
    const char *cy_arr = *(const char *const *)(cy_base + f->offset);
    uint32_t cy_n = *(const uint32_t *)(cy_base + f->count_offset);
    size_t stride = cy_entry_stride(f);
    if (cy_n != v->n_items || (cy_n && !cy_arr))
        return mismatch(m, v, "");
    char *arr = NULL;
    if (m->mode == MERGE_APPLY && v->n_items) {
        arr = calloc(v->n_items, f->size);
        TY_ASSERT(arr);
    }
    for (size_t i = 0; i < v->n_items; i++) {
        char *dst = arr ? arr + i * f->size : NULL;
        const char *cy = cy_arr + i * stride;
        int rc;
        if (f->sub) {
            if (dst)
                ty__cfg_entry_defaults(f->sub, dst);
            rc = merge_map(m, v->items[i], f->sub, cy, dst, -1);
        } else {
            rc = merge_scalar(m, f, f->elem, f->size, v->items[i], cy, dst);
        }
        if (rc != 0)
            return rc; /* only in MERGE_COMPARE, where arr is NULL */
    }
    if (m->mode == MERGE_APPLY) {
        ty__cfg_field_free(f, user_base);
        *(char **)(user_base + f->offset) = arr;
        *(uint32_t *)(user_base + f->count_offset) = (uint32_t)v->n_items;
    }
    return 0;
}

static void leaf_mark(ty_config_t *cfg, const struct ty_config_field *f, size_t off)
{
    for (size_t i = 0; i < cfg->n_leaves; i++)
        if (cfg->leaves[i].field == f && cfg->leaves[i].offset == off)
            cfg->leaves[i].set = true;
}

static int merge_map(struct merger *m, const struct ty__cfg_node *map,
                     const struct ty_config_struct *s, const char *cy, char *user, long root_off)
{
    for (size_t k = 0; k + 1 < map->n_items; k += 2) {
        const struct ty__cfg_node *v = map->items[k + 1];
        size_t idx = (size_t)(ty__cfg_field_find(s, map->items[k]->text) - s->fields);
        const struct ty_config_field *f = &s->fields[idx];
        char *dst = user ? user + f->offset : NULL;
        long off = root_off < 0 ? -1 : root_off + (long)f->offset;
        int rc;
        if (f->type == TY_CONFIG_SECTION) {
            const char *sub = *(const char *const *)(cy + shadow_offset(s, idx));
            rc = sub ? merge_map(m, v, f->sub, sub, dst, off) : mismatch(m, v, f->key);
        } else if (f->type == TY_CONFIG_LIST) {
            rc = merge_list(m, f, v, cy, user);
        } else {
            const char *src = has_shadow(f) ? cy + shadow_offset(s, idx) : cy + f->offset;
            rc = merge_scalar(m, f, f->type, f->size, v, src, dst);
        }
        if (rc != 0)
            return rc;
        if (m->mode == MERGE_APPLY && off >= 0 && f->type != TY_CONFIG_SECTION)
            leaf_mark(m->cfg, f, (size_t)off);
    }
    return 0;
}

/* ---- applying one document ----------------------------------------------------------------- */

static void cyaml_log_cb(cyaml_log_t level, void *ctx, const char *fmt, va_list args)
    __attribute__((format(printf, 3, 0)));

static void cyaml_log_cb(cyaml_log_t level, void *ctx, const char *fmt, va_list args)
{
    ty_config_t *cfg = ctx;
    if (level < CYAML_LOG_ERROR)
        return;
    size_t used = strlen(cfg->cyaml_log);
    if (used + 1 < sizeof(cfg->cyaml_log))
        vsnprintf(cfg->cyaml_log + used, sizeof(cfg->cyaml_log) - used, fmt, args);
    for (char *p = cfg->cyaml_log; *p; p++)
        if (*p == '\n')
            *p = ' ';
}

static int cyaml_merge(ty_config_t *cfg, struct ty__cfg_doc *doc, const char *text, size_t len)
{
    const cyaml_config_t cy_cfg = {
        .log_fn = cyaml_log_cb, .log_ctx = cfg, .mem_fn = cyaml_mem,
        .log_level = CYAML_LOG_ERROR, .flags = CYAML_CFG_NO_ALIAS,
    };
    cyaml_data_t *cy = NULL;
    cfg->cyaml_log[0] = '\0';
    cyaml_err_t cerr = cyaml_load_data((const uint8_t *)text, len, &cy_cfg, &cfg->top, &cy, NULL);
    if (cerr != CYAML_OK) {
        ty__cfg_error(doc->err, doc->origin, 0, 0, "", "libcyaml: %s %s", cyaml_strerror(cerr),
                      cfg->cyaml_log);
        return TY_ECONFIG;
    }
    struct merger m = {.cfg = cfg, .doc = doc, .mode = MERGE_COMPARE};
    int rc = merge_map(&m, doc->root, cfg->root, cy, NULL, 0);
    if (rc == 0) {
        m.mode = MERGE_APPLY;
        rc = merge_map(&m, doc->root, cfg->root, cy, cfg->data, 0);
    }
    cyaml_free(&cy_cfg, &cfg->top, cy, 0);
    return rc;
}

static int apply_doc(ty_config_t *cfg, const char *text, size_t len, const char *origin,
                     bool positions, struct ty_config_error *err)
{
    struct ty_config_error scratch;
    struct ty__cfg_doc doc = {
        .origin = origin, .positions = positions, .arena = ty_arena_new(0),
        .err = err ? err : &scratch,
    };
    if (len > TY__CFG_MAX_BYTES) {
        ty__cfg_error(doc.err, origin, 0, 0, "", "larger than %u bytes", TY__CFG_MAX_BYTES);
        ty_arena_free(doc.arena);
        return TY_ECONFIG;
    }
    int rc = ty__cfg_tree_build(&doc, text, len);
    if (rc == 0)
        rc = ty__cfg_check_doc(&doc, cfg->root);
    if (rc == 0 && doc.root && doc.root->n_items > 0)
        rc = cyaml_merge(cfg, &doc, text, len);
    ty_arena_free(doc.arena);
    return rc;
}

int ty_config_load_string(ty_config_t *cfg, const char *text, size_t len, const char *origin,
                          struct ty_config_error *err)
{
    return apply_doc(cfg, text, len, origin ? origin : "<string>", true, err);
}

int ty_config_load_file(ty_config_t *cfg, const char *path, struct ty_config_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int rc = ty_errno();
        ty__cfg_error(err, path, 0, 0, "", "cannot open: %s", ty_strerror(rc));
        return rc;
    }
    char *buf = malloc(TY__CFG_MAX_BYTES + 1);
    TY_ASSERT(buf);
    size_t len = fread(buf, 1, TY__CFG_MAX_BYTES + 1, f);
    int rc = ferror(f) ? TY_EIO : 0;
    fclose(f);
    if (rc != 0)
        ty__cfg_error(err, path, 0, 0, "", "read error");
    else
        rc = apply_doc(cfg, buf, len, path, true, err);
    free(buf);
    if (rc == 0) {
        free(cfg->path);
        cfg->path = strdup(path);
        TY_ASSERT(cfg->path);
    }
    return rc;
}

/* ---- environment and flags --------------------------------------------------------------- */

static const struct ty__cfg_leaf *leaf_find(const ty_config_t *cfg, const char *path)
{
    for (size_t i = 0; i < cfg->n_leaves; i++)
        if (strcmp(cfg->leaves[i].path, path) == 0)
            return &cfg->leaves[i];
    return NULL;
}

/* "{a: {b: {c: VALUE}}}" for path a.b.c; scalars double-quoted, lists as given (flow YAML). */
static char *value_doc(const struct ty__cfg_leaf *l, const char *value)
{
    size_t vlen = strlen(value), cap = strlen(l->path) * 2 + vlen * 4 + 64, n = 0;
    char *doc = malloc(cap);
    TY_ASSERT(doc);
    int depth = 1;
    doc[n++] = '{';
    for (const char *p = l->path; *p; p++) {
        if (*p == '.') {
            memcpy(doc + n, ": {", 3);
            n += 3;
            depth++;
        } else {
            doc[n++] = *p;
        }
    }
    doc[n++] = ':';
    doc[n++] = ' ';
    bool raw = l->field->type == TY_CONFIG_LIST;
    if (!raw)
        doc[n++] = '"';
    for (const char *p = value; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (raw)
            doc[n++] = (char)c;
        else if (c == '"' || c == '\\')
            n += (size_t)sprintf(doc + n, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            n += (size_t)sprintf(doc + n, "\\x%02x", c);
        else
            doc[n++] = (char)c;
    }
    if (!raw)
        doc[n++] = '"';
    while (depth-- > 0)
        doc[n++] = '}';
    doc[n] = '\0';
    return doc;
}

static int apply_leaf(ty_config_t *cfg, const struct ty__cfg_leaf *l, const char *value,
                      const char *origin, struct ty_config_error *err)
{
    char *doc = value_doc(l, value);
    int rc = apply_doc(cfg, doc, strlen(doc), origin, false, err);
    free(doc);
    return rc;
}

int ty_config_load_env(ty_config_t *cfg, struct ty_config_error *err)
{
    for (size_t i = 0; i < cfg->n_leaves; i++) {
        const char *v = getenv(cfg->leaves[i].env);
        if (!v)
            continue;
        int rc = apply_leaf(cfg, &cfg->leaves[i], v, cfg->leaves[i].env, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int unknown_setting(const ty_config_t *cfg, const char *key, const char *origin,
                           struct ty_config_error *err)
{
    const char **cands = malloc((cfg->n_leaves + 1) * sizeof(*cands));
    TY_ASSERT(cands);
    for (size_t i = 0; i < cfg->n_leaves; i++)
        cands[i] = cfg->leaves[i].path;
    char hint[200];
    ty__cfg_suggest(key, cands, cfg->n_leaves, hint, sizeof(hint));
    free(cands);
    ty__cfg_error(err, origin, 0, 0, key, "unknown setting%s", hint);
    return TY_ENOTFOUND;
}

int ty_config_set(ty_config_t *cfg, const char *key, const char *value, const char *origin,
                  struct ty_config_error *err)
{
    if (!origin)
        origin = "command line";
    const struct ty__cfg_leaf *l = leaf_find(cfg, key);
    if (!l) {
        unknown_setting(cfg, key, origin, err);
        return TY_ECONFIG;
    }
    return apply_leaf(cfg, l, value, origin, err);
}

int ty_config_set_arg(ty_config_t *cfg, const char *arg, struct ty_config_error *err)
{
    if (strncmp(arg, "--", 2) != 0 || !arg[2])
        return TY_ENOTFOUND;
    const char *eq = strchr(arg, '=');
    size_t klen = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    char key[160], origin[32];
    if (klen >= sizeof(key))
        klen = sizeof(key) - 1;
    memcpy(key, arg + 2, klen);
    key[klen] = '\0';
    for (char *p = key; *p; p++)
        *p = *p == '-' ? '_' : *p;
    snprintf(origin, sizeof(origin), "command line");
    const struct ty__cfg_leaf *l = leaf_find(cfg, key);
    if (!l)
        return unknown_setting(cfg, key, origin, err);
    if (!eq && l->field->type != TY_CONFIG_BOOL) {
        ty__cfg_error(err, origin, 0, 0, key, "needs a value: --%s=%s", key,
                      ty__cfg_type_name(l->field, l->field->type));
        return TY_ECONFIG;
    }
    return apply_leaf(cfg, l, eq ? eq + 1 : "true", origin, err);
}

int ty_config_finish(ty_config_t *cfg, struct ty_config_error *err)
{
    for (size_t i = 0; i < cfg->n_leaves; i++) {
        const struct ty__cfg_leaf *l = &cfg->leaves[i];
        if (!(l->field->flags & TY_CONFIG_REQUIRED) || l->set)
            continue;
        ty__cfg_error(err, cfg->path ? cfg->path : "configuration", 0, 0, l->path,
                      "required setting is missing (set it in the file, with %s or --%s)",
                      l->env, l->path);
        return TY_ECONFIG;
    }
    char field[256] = "", why[400] = "";
    if (cfg->root->check &&
        cfg->root->check(cfg->data, field, sizeof(field), why, sizeof(why)) != 0) {
        ty__cfg_error(err, cfg->path ? cfg->path : "configuration", 0, 0, field, "%s", why);
        return TY_ECONFIG;
    }
    return 0;
}

void *ty_config_lookup(const ty_config_t *cfg, const char *path, enum ty_config_type *type)
{
    const struct ty__cfg_leaf *l = leaf_find(cfg, path);
    if (!l)
        return NULL;
    if (type)
        *type = l->field->type;
    return (char *)cfg->data + l->offset;
}

const char *ty_config_path(const ty_config_t *cfg)
{
    return cfg->path;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

static int list_defaults(ty_config_t *cfg, struct ty_config_error *err)
{
    for (size_t i = 0; i < cfg->n_leaves; i++) {
        struct ty__cfg_leaf *l = &cfg->leaves[i];
        if (l->field->type != TY_CONFIG_LIST || !l->field->def)
            continue;
        int rc = apply_leaf(cfg, l, l->field->def, "settings table default", err);
        if (rc != 0)
            return rc;
        l->set = false;
    }
    return 0;
}

int ty_config_new(ty_config_t **out, const struct ty_config_opts *opts,
                  struct ty_config_error *err)
{
    if (!opts || !opts->root || !opts->data) {
        ty__cfg_error(err, "settings table", 0, 0, "", "no table or no data");
        return TY_EINVAL;
    }
    ty_config_t *cfg = calloc(1, sizeof(*cfg));
    TY_ASSERT(cfg);
    cfg->root = opts->root;
    cfg->data = opts->data;
    snprintf(cfg->env_prefix, sizeof(cfg->env_prefix), "%s",
             opts->env_prefix ? opts->env_prefix : "TYCHO_");
    int rc = flatten(cfg, cfg->root, 0, "", 0, err);
    if (rc != 0)
        goto err_free;
    schema_mapping(cfg, cfg->root, &cfg->top, CYAML_FLAG_POINTER);
    ty__cfg_entry_defaults(cfg->root, cfg->data);
    if ((rc = list_defaults(cfg, err)) != 0)
        goto err_free;
    *out = cfg;
    return 0;
err_free:
    ty_config_free(cfg);
    return rc;
}

void ty_config_free(ty_config_t *cfg)
{
    if (!cfg)
        return;
    if (cfg->top.type == CYAML_MAPPING) /* defaults were applied: the data is ours to free */
        ty_config_values_free(cfg->root, cfg->data);
    for (size_t i = 0; i < cfg->n_schema_allocs; i++)
        free(cfg->schema_allocs[i]);
    free(cfg->schema_allocs);
    free(cfg->leaves);
    free(cfg->path);
    free(cfg);
}
