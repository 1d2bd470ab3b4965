/* Check a node tree against a settings table, before libcyaml sees the text.
 *
 * Everything a user can get wrong is found here, with the node's position: unknown keys (with
 * the nearest known key), duplicate keys, a list where a value belongs and the reverse, values
 * that do not parse, values out of range, bad enum names, missing required fields in list
 * entries. Pure: reads the tree and the table, writes only the error. One thread.
 */
#include "config-impl.h"

#include "tycho/errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct checker {
    const struct ty__cfg_doc *doc;
    char path[256];
};

static const char *kind_name(const struct ty__cfg_node *n)
{
    if (ty__cfg_node_is_null(n))
        return "nothing";
    return n->kind == TY__CFG_NODE_MAP ? "a mapping" : n->kind == TY__CFG_NODE_SEQ ? "a list"
                                                                                   : "a value";
}

bool ty__cfg_node_is_null(const struct ty__cfg_node *n)
{
    if (!n || n->kind != TY__CFG_NODE_SCALAR || !n->plain)
        return false;
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL"};
    for (size_t i = 0; i < sizeof(nulls) / sizeof(nulls[0]); i++)
        if (strcmp(n->text, nulls[i]) == 0)
            return true;
    return false;
}

const struct ty_config_field *ty__cfg_field_find(const struct ty_config_struct *s,
                                                 const char *key)
{
    for (size_t i = 0; i < s->n_fields; i++)
        if (strcmp(s->fields[i].key, key) == 0)
            return &s->fields[i];
    return NULL;
}

static int fail(struct checker *c, const struct ty__cfg_node *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct checker *c, const struct ty__cfg_node *at, const char *fmt, ...)
{
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    ty__cfg_error(c->doc->err, c->doc->origin, c->doc->positions ? at->line : 0,
                  c->doc->positions ? at->col : 0, c->path, "%s", what);
    return TY_ECONFIG;
}

static int check_scalar(struct checker *c, const struct ty_config_field *f, enum ty_config_type t,
                        const struct ty__cfg_node *at, const struct ty__cfg_node *v)
{
    char why[512];
    union ty__cfg_val val;
    if (v->kind != TY__CFG_NODE_SCALAR) {
        snprintf(why, sizeof(why), "expected a single %s value, got %s", ty__cfg_type_name(f, t),
                 kind_name(v));
        return fail(c, at, "%s", why);
    }
    if (ty__cfg_node_is_null(v))
        return fail(c, at, "%s", t == TY_CONFIG_STRING
                                     ? "no value given (write \"\" for an empty string)"
                                     : "no value given");
    if (ty__cfg_parse_checked(f, t, v->text, &val, why, sizeof(why)) != 0)
        return fail(c, at, "%s", why);
    return 0;
}

static int check_map(struct checker *c, const struct ty__cfg_node *map,
                     const struct ty_config_struct *s, bool entry);

static int check_list(struct checker *c, const struct ty_config_field *f,
                      const struct ty__cfg_node *at, const struct ty__cfg_node *v)
{
    char why[256];
    if (v->kind != TY__CFG_NODE_SEQ) {
        snprintf(why, sizeof(why), "expected a list (- item lines or [a, b]), got %s",
                 kind_name(v));
        return fail(c, at, "%s", why);
    }
    union ty__cfg_val n = {.u = v->n_items}, b;
    if (f->min && ty__cfg_parse(f, TY_CONFIG_UINT, f->min, &b, why, sizeof(why)) == 0 &&
        n.u < b.u)
        return fail(c, at, "the list needs at least %s entries", f->min);
    if (f->max && ty__cfg_parse(f, TY_CONFIG_UINT, f->max, &b, why, sizeof(why)) == 0 &&
        n.u > b.u)
        return fail(c, at, "the list has more than %s entries", f->max);
    size_t plen = strlen(c->path);
    for (size_t i = 0; i < v->n_items; i++) {
        const struct ty__cfg_node *e = v->items[i];
        snprintf(c->path + plen, sizeof(c->path) - plen, "[%zu]", i);
        int rc;
        if (f->sub && e->kind != TY__CFG_NODE_MAP) {
            snprintf(why, sizeof(why), "each entry must be a mapping (%s), got %s", f->sub->name,
                     kind_name(e));
            rc = fail(c, e, "%s", why);
        } else if (f->sub) {
            rc = check_map(c, e, f->sub, true);
        } else {
            rc = check_scalar(c, f, f->elem, e, e);
        }
        if (rc != 0)
            return rc;
    }
    c->path[plen] = '\0';
    return 0;
}

static int check_value(struct checker *c, const struct ty_config_field *f,
                       const struct ty__cfg_node *key, const struct ty__cfg_node *v)
{
    switch (f->type) {
    case TY_CONFIG_SECTION:
        if (v->kind != TY__CFG_NODE_MAP)
            return fail(c, key, "expected a mapping of settings, got %s", kind_name(v));
        return check_map(c, v, f->sub, false);
    case TY_CONFIG_LIST:
        return check_list(c, f, key, v);
    default:
        return check_scalar(c, f, f->type, key, v);
    }
}

static int unknown_key(struct checker *c, const struct ty__cfg_node *key,
                       const struct ty_config_struct *s)
{
    const char *cands[128];
    size_t n = s->n_fields < 128 ? s->n_fields : 128;
    for (size_t i = 0; i < n; i++)
        cands[i] = s->fields[i].key;
    char hint[128], what[512];
    ty__cfg_suggest(key->text, cands, n, hint, sizeof(hint));
    snprintf(what, sizeof(what), "unknown key '%s'%s", key->text, hint);
    return fail(c, key, "%s", what);
}

/* Required fields of a list entry must be in the entry itself. */
static int check_required(struct checker *c, const struct ty__cfg_node *map,
                          const struct ty_config_struct *s)
{
    for (size_t i = 0; i < s->n_fields; i++) {
        const struct ty_config_field *f = &s->fields[i];
        if (!(f->flags & TY_CONFIG_REQUIRED))
            continue;
        bool found = false;
        for (size_t k = 0; k + 1 < map->n_items && !found; k += 2)
            found = strcmp(map->items[k]->text, f->key) == 0;
        if (!found)
            return fail(c, map, "required key '%s' is missing in this entry", f->key);
    }
    return 0;
}

static int check_map(struct checker *c, const struct ty__cfg_node *map,
                     const struct ty_config_struct *s, bool entry)
{
    size_t plen = strlen(c->path);
    for (size_t k = 0; k + 1 < map->n_items; k += 2) {
        const struct ty__cfg_node *key = map->items[k], *v = map->items[k + 1];
        snprintf(c->path + plen, sizeof(c->path) - plen, "%s%s", plen ? "." : "", key->text);
        const struct ty_config_field *f = ty__cfg_field_find(s, key->text);
        if (!f)
            return unknown_key(c, key, s);
        for (size_t j = 0; j < k; j += 2) {
            if (strcmp(map->items[j]->text, key->text) == 0) {
                return fail(c, key, "duplicate key (first set at line %d)", map->items[j]->line);
            }
        }
        int rc = check_value(c, f, key, v);
        if (rc != 0)
            return rc;
    }
    c->path[plen] = '\0';
    return entry ? check_required(c, map, s) : 0;
}

int ty__cfg_check_doc(const struct ty__cfg_doc *doc, const struct ty_config_struct *root)
{
    struct checker c = {.doc = doc};
    if (!doc->root)
        return 0;
    return check_map(&c, doc->root, root, false);
}
