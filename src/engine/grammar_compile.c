/* JSON schema -> grammar nodes (tycho/grammar.h). The schema is parsed with jansson and walked
 * once; $refs become node indices (a placeholder union per ref, so recursion is a cycle); then
 * every node's shortest text is found by a fixpoint (for the token budget, and to refuse a
 * schema no finite document satisfies). */
#include "grammar-impl.h"

#include "tycho/errors.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SCHEMA_DEPTH 64
#define MAX_NODES 100000

struct gref {
    char *ref;
    uint32_t node;
};

struct gctx {
    ty_grammar_t *g;
    json_t *root;
    char *err;
    size_t errlen;
    struct gref *refs;
    uint32_t n_refs, any, depth;
};

static int fail(struct gctx *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct gctx *c, int rc, const char *fmt, ...)
{
    if (c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static int node_new(struct gctx *c, enum gnode_kind kind, uint32_t *out)
{
    ty_grammar_t *g = c->g;
    if (g->n_nodes >= MAX_NODES)
        return fail(c, TY_EINVAL, "schema too large");
    if (g->n_nodes == g->cap_nodes) {
        uint32_t cap = g->cap_nodes ? g->cap_nodes * 2 : 16;
        struct gnode *n = realloc(g->nodes, cap * sizeof(*n));
        if (!n)
            return TY_ENOMEM;
        g->nodes = n;
        g->cap_nodes = cap;
    }
    struct gnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof(*n));
    n->kind = kind;
    n->items = n->additional = n->key_node = G_NONE;
    n->max = UINT32_MAX;
    n->min_len = G_INF;
    *out = g->n_nodes++;
    return 0;
}

static int kid_add(struct gctx *c, uint32_t node, uint32_t kid)
{
    struct gnode *n = &c->g->nodes[node];
    uint32_t *k = realloc(n->kids, (n->n_kids + 1) * sizeof(*k));
    if (!k)
        return TY_ENOMEM;
    k[n->n_kids++] = kid;
    n->kids = k;
    return 0;
}

static int literal_new(struct gctx *c, const char *text, size_t len, uint32_t *out)
{
    int rc = node_new(c, GN_LITERAL, out);
    if (rc)
        return rc;
    char *s = malloc(len + 1);
    if (!s)
        return TY_ENOMEM;
    memcpy(s, text, len);
    s[len] = 0;
    c->g->nodes[*out].lit = s;
    c->g->nodes[*out].lit_len = (uint32_t)len;
    return 0;
}

static int literal_json(struct gctx *c, const json_t *v, uint32_t *out)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s)
        return TY_ENOMEM;
    int rc = literal_new(c, s, strlen(s), out);
    free(s);
    return rc;
}

uint32_t ty__grammar_key_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* The any-JSON-value node (made once). */
static int any_node(struct gctx *c, uint32_t *out)
{
    if (c->any != G_NONE) {
        *out = c->any;
        return 0;
    }
    uint32_t any = 0, obj, arr, str, num, key, lit;
    int rc = node_new(c, GN_UNION, &any);
    if (!rc)
        c->any = any;
    rc = rc ? rc : node_new(c, GN_OBJECT, &obj);
    rc = rc ? rc : node_new(c, GN_KEY, &key);
    rc = rc ? rc : node_new(c, GN_ARRAY, &arr);
    rc = rc ? rc : node_new(c, GN_STRING, &str);
    rc = rc ? rc : node_new(c, GN_NUMBER, &num);
    if (rc)
        return rc;
    c->g->nodes[obj].additional = any;
    c->g->nodes[obj].key_node = key;
    c->g->nodes[arr].items = any;
    uint32_t kids[] = {obj, arr, str, num};
    for (size_t i = 0; i < 4 && !rc; i++)
        rc = kid_add(c, any, kids[i]);
    static const char *const lits[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3 && !rc; i++)
        if (!(rc = literal_new(c, lits[i], strlen(lits[i]), &lit)))
            rc = kid_add(c, any, lit);
    *out = any;
    return rc;
}

static int compile(struct gctx *c, json_t *s, const char *path, uint32_t *out);

static bool is_annotation(const char *k)
{
    static const char *const ann[] = {"title",    "description", "default", "examples",
                                      "$schema",  "$id",         "$comment", "format",
                                      "strict",   "$defs",       "definitions", "readOnly",
                                      "writeOnly", "deprecated", "name",    NULL};
    for (size_t i = 0; ann[i]; i++)
        if (!strcmp(k, ann[i]))
            return true;
    return false;
}

static bool is_supported(const char *k)
{
    static const char *const kw[] = {"type",     "properties", "required", "additionalProperties",
                                     "items",    "prefixItems", "minItems", "maxItems",
                                     "enum",     "const",      "anyOf",    "oneOf",
                                     "allOf",    "$ref",       "minLength", "maxLength",
                                     "nullable", NULL};
    for (size_t i = 0; kw[i]; i++)
        if (!strcmp(k, kw[i]))
            return true;
    return is_annotation(k);
}

/* Resolve "#", "#/$defs/x", "#/definitions/x" (any JSON pointer into the document). */
static json_t *ref_target(struct gctx *c, const char *ref)
{
    if (ref[0] != '#' || (ref[1] && ref[1] != '/'))
        return NULL;
    json_t *v = c->root;
    const char *p = ref + 1;
    char seg[256];
    while (*p == '/' && v) {
        p++;
        size_t n = 0;
        for (; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1'))
                ch = *++p == '0' ? '~' : '/';
            if (n + 1 >= sizeof(seg))
                return NULL;
            seg[n++] = ch;
        }
        seg[n] = 0;
        if (json_is_object(v)) {
            v = json_object_get(v, seg);
        } else if (json_is_array(v)) {
            char *end;
            unsigned long i = strtoul(seg, &end, 10);
            v = *end || !n ? NULL : json_array_get(v, i);
        } else {
            v = NULL;
        }
    }
    return v;
}

static int compile_ref(struct gctx *c, json_t *s, const char *path, uint32_t *out)
{
    const char *ref = json_string_value(json_object_get(s, "$ref"));
    if (!ref)
        return fail(c, TY_EINVAL, "'$ref' must be a string at %s", path);
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
        if (strcmp(k, "$ref") && !is_annotation(k))
            return fail(c, TY_ENOTSUP, "unsupported JSON schema keyword '%s' beside '$ref' at %s",
                        k, path);
    for (uint32_t i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) {
            *out = c->refs[i].node;
            return 0;
        }
    json_t *t = ref_target(c, ref);
    if (!t)
        return fail(c, strncmp(ref, "#", 1) ? TY_ENOTSUP : TY_EINVAL,
                    "cannot resolve '$ref' \"%s\" at %s (only local references)", ref, path);
    uint32_t node, kid;
    int rc = node_new(c, GN_UNION, &node);
    if (rc)
        return rc;
    struct gref *r = realloc(c->refs, (c->n_refs + 1) * sizeof(*r));
    if (!r)
        return TY_ENOMEM;
    c->refs = r;
    if (!(r[c->n_refs].ref = strdup(ref)))
        return TY_ENOMEM;
    r[c->n_refs++].node = node;
    char sub[512];
    snprintf(sub, sizeof(sub), "%s", ref + 1);
    if ((rc = compile(c, t, sub[0] ? sub : "/", &kid)))
        return rc;
    *out = node;
    return kid_add(c, node, kid);
}

static int compile_union(struct gctx *c, json_t *list, const char *kw, const char *path,
                         uint32_t *out)
{
    if (!json_is_array(list) || !json_array_size(list))
        return fail(c, TY_EINVAL, "'%s' must be a non-empty array at %s", kw, path);
    int rc = node_new(c, GN_UNION, out);
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        char sub[512];
        uint32_t kid;
        snprintf(sub, sizeof(sub), "%s/%s/%zu", path, kw, i);
        rc = rc ? rc : compile(c, v, sub, &kid);
        rc = rc ? rc : kid_add(c, *out, kid);
    }
    return rc;
}

static int get_count(struct gctx *c, json_t *s, const char *kw, const char *path, uint32_t *v)
{
    json_t *j = json_object_get(s, kw);
    if (!j)
        return 0;
    if (!json_is_integer(j) || json_integer_value(j) < 0 || json_integer_value(j) > 1000000)
        return fail(c, TY_EINVAL, "'%s' must be a non-negative integer at %s", kw, path);
    *v = (uint32_t)json_integer_value(j);
    return 0;
}

static int add_prop(struct gctx *c, uint32_t obj, const char *name, uint32_t child, bool req)
{
    json_t *js = json_string(name);
    char *key = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
    json_decref(js);
    if (!key)
        return TY_ENOMEM;
    struct gnode *n = &c->g->nodes[obj];
    struct gprop *p = realloc(n->props, (n->n_props + 1) * sizeof(*p));
    if (!p) {
        free(key);
        return TY_ENOMEM;
    }
    n->props = p;
    size_t len = strlen(key);
    p[n->n_props] = (struct gprop){.key = key, .key_len = (uint32_t)len,
                                   .hash = ty__grammar_key_hash(key + 1, len - 2),
                                   .child = child, .required = req};
    if (n->n_props >= 60000)
        return fail(c, TY_EINVAL, "too many properties");
    n->n_props++;
    uint32_t lit;
    int rc = literal_new(c, key, len, &lit);
    if (!rc)
        c->g->nodes[obj].props[c->g->nodes[obj].n_props - 1].key_lit = lit;
    return rc;
}

static bool in_required(json_t *req, const char *name)
{
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v)
        if (json_is_string(v) && !strcmp(json_string_value(v), name))
            return true;
    return false;
}

static int compile_object(struct gctx *c, json_t *s, const char *path, uint32_t *out)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(c, TY_EINVAL, "'properties' must be an object at %s", path);
    if (req && !json_is_array(req))
        return fail(c, TY_EINVAL, "'required' must be an array at %s", path);
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v)
        if (!json_is_string(v) || !json_object_get(props, json_string_value(v)))
            return fail(c, TY_EINVAL, "'required' names a property not in 'properties' at %s",
                        path);
    uint32_t obj, kid;
    int rc = node_new(c, GN_OBJECT, &obj);
    const char *k;
    json_object_foreach(props, k, v) {
        char sub[512];
        snprintf(sub, sizeof(sub), "%s/properties/%s", path, k);
        rc = rc ? rc : compile(c, v, sub, &kid);
        rc = rc ? rc : add_prop(c, obj, k, kid, in_required(req, k));
    }
    if (!rc && (!add || json_is_true(add) || json_is_object(add))) {
        char sub[512];
        snprintf(sub, sizeof(sub), "%s/additionalProperties", path);
        rc = add && json_is_object(add) ? compile(c, add, sub, &kid) : any_node(c, &kid);
        uint32_t key;
        rc = rc ? rc : node_new(c, GN_KEY, &key);
        if (!rc) {
            c->g->nodes[obj].additional = kid;
            c->g->nodes[obj].key_node = key;
        }
    } else if (!rc && !json_is_false(add)) {
        rc = fail(c, TY_EINVAL, "'additionalProperties' must be a boolean or a schema at %s",
                  path);
    }
    *out = obj;
    return rc;
}

static int compile_array(struct gctx *c, json_t *s, const char *path, uint32_t *out)
{
    json_t *items = json_object_get(s, "items"), *pre = json_object_get(s, "prefixItems");
    uint32_t arr, kid;
    int rc = node_new(c, GN_ARRAY, &arr);
    if (!rc && pre && !json_is_array(pre))
        rc = fail(c, TY_EINVAL, "'prefixItems' must be an array at %s", path);
    size_t i;
    json_t *v;
    json_array_foreach(pre, i, v) {
        char sub[512];
        snprintf(sub, sizeof(sub), "%s/prefixItems/%zu", path, i);
        rc = rc ? rc : compile(c, v, sub, &kid);
        rc = rc ? rc : kid_add(c, arr, kid);
    }
    uint32_t min = 0, max = UINT32_MAX;
    rc = rc ? rc : get_count(c, s, "minItems", path, &min);
    rc = rc ? rc : get_count(c, s, "maxItems", path, &max);
    if (!rc && min > max)
        rc = fail(c, TY_EINVAL, "'minItems' above 'maxItems' at %s", path);
    if (!rc && !json_is_false(items)) {
        char sub[512];
        snprintf(sub, sizeof(sub), "%s/items", path);
        rc = items && !json_is_true(items) ? compile(c, items, sub, &kid) : any_node(c, &kid);
        if (!rc)
            c->g->nodes[arr].items = kid;
    }
    if (!rc) {
        c->g->nodes[arr].min = min;
        c->g->nodes[arr].max = max;
    }
    *out = arr;
    return rc;
}

static int compile_type(struct gctx *c, json_t *s, const char *type, const char *path,
                        uint32_t *out)
{
    int rc = 0;
    if (!strcmp(type, "object"))
        return compile_object(c, s, path, out);
    if (!strcmp(type, "array"))
        return compile_array(c, s, path, out);
    if (!strcmp(type, "string")) {
        uint32_t min = 0, max = UINT32_MAX;
        rc = get_count(c, s, "minLength", path, &min);
        rc = rc ? rc : get_count(c, s, "maxLength", path, &max);
        if (!rc && min > max)
            rc = fail(c, TY_EINVAL, "'minLength' above 'maxLength' at %s", path);
        rc = rc ? rc : node_new(c, GN_STRING, out);
        if (!rc) {
            c->g->nodes[*out].min = min;
            c->g->nodes[*out].max = max;
        }
        return rc;
    }
    if (!strcmp(type, "number"))
        return node_new(c, GN_NUMBER, out);
    if (!strcmp(type, "integer"))
        return node_new(c, GN_INTEGER, out);
    if (!strcmp(type, "null"))
        return literal_new(c, "null", 4, out);
    if (!strcmp(type, "boolean")) {
        uint32_t t = 0, f = 0;
        rc = node_new(c, GN_UNION, out);
        rc = rc ? rc : literal_new(c, "true", 4, &t);
        rc = rc ? rc : literal_new(c, "false", 5, &f);
        rc = rc ? rc : kid_add(c, *out, t);
        return rc ? rc : kid_add(c, *out, f);
    }
    return fail(c, TY_EINVAL, "unknown type \"%s\" at %s", type, path);
}

static int compile_types(struct gctx *c, json_t *s, const char *path, uint32_t *out)
{
    json_t *t = json_object_get(s, "type");
    bool nullable = json_is_true(json_object_get(s, "nullable"));
    if (!t) {
        if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
            json_object_get(s, "required"))
            return compile_object(c, s, path, out);
        if (json_object_get(s, "items") || json_object_get(s, "prefixItems"))
            return compile_array(c, s, path, out);
        return any_node(c, out);
    }
    if (json_is_string(t) && !nullable)
        return compile_type(c, s, json_string_value(t), path, out);
    if (!json_is_string(t) && (!json_is_array(t) || !json_array_size(t)))
        return fail(c, TY_EINVAL, "'type' must be a string or a non-empty array at %s", path);
    int rc = node_new(c, GN_UNION, out);
    json_t *one = json_is_string(t) ? json_array() : json_incref(t);
    if (!one)
        return TY_ENOMEM;
    if (json_is_string(t))
        json_array_append(one, t);
    if (nullable)
        json_array_append_new(one, json_string("null"));
    size_t i;
    json_t *v;
    json_array_foreach(one, i, v) {
        uint32_t kid;
        if (!rc && !json_is_string(v))
            rc = fail(c, TY_EINVAL, "'type' entries must be strings at %s", path);
        rc = rc ? rc : compile_type(c, s, json_string_value(v), path, &kid);
        rc = rc ? rc : kid_add(c, *out, kid);
    }
    json_decref(one);
    return rc;
}

/* One schema: the checks that apply to any, then its form (const, enum, combinators, $ref,
 * types). Siblings that would constrain a combinator are refused rather than ignored. */
static int compile(struct gctx *c, json_t *s, const char *path, uint32_t *out)
{
    if (json_is_true(s))
        return any_node(c, out);
    if (!json_is_object(s))
        return fail(c, TY_EINVAL, "a schema must be an object or true at %s", path);
    if (++c->depth > MAX_SCHEMA_DEPTH)
        return fail(c, TY_EINVAL, "schema nested too deeply at %s", path);
    const char *k;
    json_t *v;
    int rc = 0;
    json_object_foreach(s, k, v)
        if (!is_supported(k)) {
            c->depth--;
            return fail(c, TY_ENOTSUP, "unsupported JSON schema keyword '%s' at %s", k,
                        path[0] ? path : "/");
        }
    static const char *const forms[] = {"const", "enum", "anyOf", "oneOf", "allOf", "$ref"};
    const char *form = NULL;
    for (size_t i = 0; i < 6; i++)
        if (json_object_get(s, forms[i])) {
            if (form && strcmp(forms[i], "$ref")) {
                c->depth--;
                return fail(c, TY_ENOTSUP, "unsupported combination of '%s' and '%s' at %s",
                            form, forms[i], path);
            }
            form = form ? form : forms[i];
        }
    if (!form) {
        rc = compile_types(c, s, path, out);
    } else if (!strcmp(form, "const")) {
        rc = literal_json(c, json_object_get(s, "const"), out);
    } else if (!strcmp(form, "enum")) {
        json_t *e = json_object_get(s, "enum");
        if (!json_is_array(e) || !json_array_size(e))
            rc = fail(c, TY_EINVAL, "'enum' must be a non-empty array at %s", path);
        rc = rc ? rc : node_new(c, GN_UNION, out);
        size_t i;
        json_array_foreach(e, i, v) {
            uint32_t lit;
            rc = rc ? rc : literal_json(c, v, &lit);
            rc = rc ? rc : kid_add(c, *out, lit);
        }
    } else if (!strcmp(form, "allOf")) {
        json_t *a = json_object_get(s, "allOf");
        if (!json_is_array(a) || json_array_size(a) != 1)
            rc = fail(c, TY_ENOTSUP, "unsupported JSON schema keyword 'allOf' with other than "
                      "one member at %s", path);
        else
            rc = compile_union(c, a, "allOf", path, out);
    } else if (!strcmp(form, "$ref")) {
        rc = compile_ref(c, s, path, out);
    } else {
        rc = compile_union(c, json_object_get(s, form), form, path, out);
    }
    c->depth--;
    return rc;
}

/* ---- shortest texts ---------------------------------------------------------------------- */

static uint32_t sat(uint64_t v)
{
    return v >= G_INF ? G_INF : (uint32_t)v;
}

static uint32_t node_min_len(const ty_grammar_t *g, const struct gnode *n)
{
    uint64_t v = 0;
    switch (n->kind) {
    case GN_UNION:
        v = G_INF;
        for (uint32_t i = 0; i < n->n_kids; i++)
            v = g->nodes[n->kids[i]].min_len < v ? g->nodes[n->kids[i]].min_len : v;
        return (uint32_t)v;
    case GN_OBJECT: {
        uint32_t nreq = 0;
        for (uint32_t i = 0; i < n->n_props; i++)
            if (n->props[i].required) {
                v += n->props[i].key_len + 1 + (uint64_t)g->nodes[n->props[i].child].min_len;
                nreq++;
            }
        return sat(v + 2 + (nreq ? nreq - 1 : 0));
    }
    case GN_ARRAY:
        for (uint32_t k = 0; k < n->min; k++) {
            uint32_t it = k < n->n_kids ? n->kids[k] : n->items;
            v += it == G_NONE ? G_INF : (uint64_t)g->nodes[it].min_len + (k ? 1 : 0);
            if (v >= G_INF)
                break;
        }
        return sat(v + 2);
    case GN_STRING:
        return sat(2 + (uint64_t)n->min);
    case GN_KEY:
        return 3; /* one character: "" may be a declared name */
    case GN_NUMBER:
    case GN_INTEGER:
        return 1;
    case GN_LITERAL:
        return n->lit_len;
    }
    return G_INF;
}

static int finish_lengths(struct gctx *c)
{
    ty_grammar_t *g = c->g;
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t i = 0; i < g->n_nodes; i++) {
            uint32_t v = node_min_len(g, &g->nodes[i]);
            if (v < g->nodes[i].min_len) {
                g->nodes[i].min_len = v;
                changed = true;
            }
        }
    }
    if (g->nodes[g->root].min_len >= G_INF)
        return fail(c, TY_EINVAL, "the schema admits no finite JSON document");
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        struct gnode *n = &g->nodes[i];
        if (n->kind != GN_OBJECT)
            continue;
        n->req_rest = calloc(n->n_props + 1, sizeof(uint32_t));
        n->n_req_rest = calloc(n->n_props + 1, sizeof(uint32_t));
        if (!n->req_rest || !n->n_req_rest)
            return TY_ENOMEM;
        for (uint32_t j = n->n_props; j-- > 0;) {
            const struct gprop *p = &n->props[j];
            uint64_t add = p->required ? 1 + p->key_len + 1 + (uint64_t)g->nodes[p->child].min_len : 0;
            n->req_rest[j] = sat(n->req_rest[j + 1] + add);
            n->n_req_rest[j] = n->n_req_rest[j + 1] + (p->required ? 1 : 0);
        }
    }
    return 0;
}

void ty_grammar_free(ty_grammar_t *g)
{
    if (!g)
        return;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        struct gnode *n = &g->nodes[i];
        for (uint32_t j = 0; j < n->n_props; j++)
            free(n->props[j].key);
        free(n->props);
        free(n->kids);
        free(n->lit);
        free(n->req_rest);
        free(n->n_req_rest);
    }
    free(g->nodes);
    free(g);
}

int ty_grammar_compile(ty_grammar_t **out, const struct ty_gen_grammar *spec, char *err,
                       size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    struct gctx c = {.err = err, .errlen = errlen, .any = G_NONE};
    if (!out || !spec)
        return fail(&c, TY_EINVAL, "no grammar");
    if (spec->kind != TY_GRAMMAR_JSON_OBJECT && spec->kind != TY_GRAMMAR_JSON_SCHEMA)
        return fail(&c, TY_EINVAL, "unknown grammar kind %d", (int)spec->kind);
    if (!(c.g = calloc(1, sizeof(*c.g))))
        return TY_ENOMEM;
    int rc = 0;
    if (spec->kind == TY_GRAMMAR_JSON_OBJECT) {
        uint32_t any;
        rc = any_node(&c, &any);
        c.g->root = rc ? 0 : c.g->nodes[any].kids[0]; /* the object alternative */
    } else {
        json_error_t je;
        c.root = spec->schema ? json_loadb(spec->schema, spec->schema_len, JSON_DECODE_ANY, &je)
                              : NULL;
        if (!c.root)
            rc = fail(&c, TY_EINVAL, "the schema is not valid JSON: %s",
                      spec->schema ? je.text : "none given");
        else
            rc = compile(&c, c.root, "", &c.g->root);
    }
    rc = rc ? rc : finish_lengths(&c);
    json_decref(c.root);
    for (uint32_t i = 0; i < c.n_refs; i++)
        free(c.refs[i].ref);
    free(c.refs);
    if (rc) {
        if (rc == TY_ENOMEM)
            fail(&c, rc, "out of memory");
        ty_grammar_free(c.g);
        return rc;
    }
    *out = c.g;
    return 0;
}
