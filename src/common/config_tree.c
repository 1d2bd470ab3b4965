/* The libyaml pass: YAML text -> node tree with line and column of every node.
 *
 * libcyaml 1.3 reports neither line nor column, so this pass exists to place every error.
 * It also refuses what a config never needs and an attacker could abuse: aliases, more than one
 * document, non-scalar keys, nesting deeper than TY__CFG_MAX_DEPTH, more than TY__CFG_MAX_NODES
 * nodes. Nodes live in the document's arena. One thread per document.
 */
#include "config-impl.h"

#include "tycho/errors.h"

#include <stdio.h>
#include <string.h>
#include <yaml.h>

struct builder {
    struct ty__cfg_doc *doc;
    yaml_parser_t parser;
    char path[256]; /* dotted path of the value being read, for syntax errors */
};

static int syntax_error(struct builder *b)
{
    const yaml_parser_t *p = &b->parser;
    const yaml_mark_t *m = p->problem ? &p->problem_mark : &p->mark;
    char what[256];
    /* An unterminated quote or flow collection is best shown where it starts. */
    bool at_start = p->context && p->problem && strstr(p->problem, "end of stream");
    if (at_start)
        m = &p->context_mark;
    if (p->context)
        snprintf(what, sizeof(what), "YAML syntax error: %s %s", p->problem ? p->problem : "error",
                 p->context);
    else
        snprintf(what, sizeof(what), "YAML syntax error: %s", p->problem ? p->problem : "error");
    ty__cfg_error(b->doc->err, b->doc->origin, (int)m->line + 1, (int)m->column + 1, b->path,
                  "%s", what);
    return TY_EPARSE;
}

static int next_event(struct builder *b, yaml_event_t *ev)
{
    if (!yaml_parser_parse(&b->parser, ev))
        return syntax_error(b);
    return 0;
}

static int fail_at(struct builder *b, const yaml_event_t *ev, const char *what)
{
    ty__cfg_error(b->doc->err, b->doc->origin, (int)ev->start_mark.line + 1,
                  (int)ev->start_mark.column + 1, b->path, "%s", what);
    return TY_ECONFIG;
}

static struct ty__cfg_node *node_new(struct builder *b, enum ty__cfg_node_kind kind,
                                     const yaml_event_t *ev)
{
    struct ty__cfg_node *n = ty_arena_calloc(b->doc->arena, 1, sizeof(*n));
    n->kind = kind;
    n->line = (int)ev->start_mark.line + 1;
    n->col = (int)ev->start_mark.column + 1;
    b->doc->n_nodes++;
    return n;
}

static void node_push(struct builder *b, struct ty__cfg_node *parent, size_t *cap,
                      struct ty__cfg_node *child)
{
    if (parent->n_items == *cap) {
        size_t ncap = *cap ? *cap * 2 : 8;
        struct ty__cfg_node **items = ty_arena_alloc(b->doc->arena, ncap * sizeof(*items));
        if (parent->n_items)
            memcpy(items, parent->items, parent->n_items * sizeof(*items));
        parent->items = items;
        *cap = ncap;
    }
    parent->items[parent->n_items++] = child;
}

static int build_node(struct builder *b, yaml_event_t *ev, int depth, struct ty__cfg_node **out);

/* Read the children of a map or sequence whose start event was `start` until its end event. */
static int build_children(struct builder *b, struct ty__cfg_node *n, int depth)
{
    size_t cap = 0, plen = strlen(b->path);
    yaml_event_type_t end = n->kind == TY__CFG_NODE_MAP ? YAML_MAPPING_END_EVENT
                                                        : YAML_SEQUENCE_END_EVENT;
    for (;;) {
        b->path[plen] = '\0';
        if (n->kind == TY__CFG_NODE_SEQ)
            snprintf(b->path + plen, sizeof(b->path) - plen, "[%zu]", n->n_items);
        else if (n->n_items > 0) /* a value, or the key after it: errors there are near it */
            snprintf(b->path + plen, sizeof(b->path) - plen, "%s%s", plen ? "." : "",
                     n->items[(n->n_items - 1) & ~(size_t)1]->text);
        yaml_event_t ev;
        int rc = next_event(b, &ev);
        if (rc != 0)
            return rc;
        if (ev.type == end) {
            yaml_event_delete(&ev);
            break;
        }
        bool is_key = n->kind == TY__CFG_NODE_MAP && n->n_items % 2 == 0;
        if (is_key && ev.type != YAML_SCALAR_EVENT) {
            rc = fail_at(b, &ev, "a key must be a plain name, not a list or a mapping");
            yaml_event_delete(&ev);
            return rc;
        }
        struct ty__cfg_node *child = NULL;
        rc = build_node(b, &ev, depth + 1, &child); /* consumes ev */
        if (rc != 0)
            return rc;
        node_push(b, n, &cap, child);
    }
    b->path[plen] = '\0';
    return 0;
}

static int build_node(struct builder *b, yaml_event_t *ev, int depth, struct ty__cfg_node **out)
{
    int rc = 0;
    if (depth > TY__CFG_MAX_DEPTH || b->doc->n_nodes >= TY__CFG_MAX_NODES) {
        rc = fail_at(b, ev, depth > TY__CFG_MAX_DEPTH ? "nesting is too deep"
                                                      : "document has too many nodes");
        goto out;
    }
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        *out = node_new(b, TY__CFG_NODE_SCALAR, ev);
        (*out)->text = ty_arena_strndup(b->doc->arena, (const char *)ev->data.scalar.value,
                                        ev->data.scalar.length);
        (*out)->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        if (strlen((*out)->text) != ev->data.scalar.length)
            rc = fail_at(b, ev, "a value contains a NUL character");
        break;
    case YAML_MAPPING_START_EVENT:
    case YAML_SEQUENCE_START_EVENT:
        *out = node_new(b, ev->type == YAML_MAPPING_START_EVENT ? TY__CFG_NODE_MAP
                                                                : TY__CFG_NODE_SEQ,
                        ev);
        yaml_event_delete(ev);
        return build_children(b, *out, depth);
    case YAML_ALIAS_EVENT:
        rc = fail_at(b, ev, "YAML aliases (*name) are not supported in configuration files");
        break;
    default:
        rc = fail_at(b, ev, "unexpected YAML structure");
        break;
    }
out:
    yaml_event_delete(ev);
    return rc;
}

/* Skip to the first document's content, or find that the stream is empty. */
static int read_document(struct builder *b)
{
    yaml_event_t ev;
    int rc;
    for (;;) {
        if ((rc = next_event(b, &ev)) != 0)
            return rc;
        yaml_event_type_t t = ev.type;
        if (t == YAML_STREAM_START_EVENT || t == YAML_DOCUMENT_START_EVENT) {
            yaml_event_delete(&ev);
            continue;
        }
        if (t == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            return 0; /* empty stream: no settings */
        }
        break;
    }
    if ((rc = build_node(b, &ev, 0, &b->doc->root)) != 0)
        return rc;
    if ((rc = next_event(b, &ev)) != 0) /* DOCUMENT_END */
        return rc;
    yaml_event_delete(&ev);
    if ((rc = next_event(b, &ev)) != 0)
        return rc;
    if (ev.type != YAML_STREAM_END_EVENT) {
        rc = fail_at(b, &ev, "only one YAML document is allowed (found a second '---')");
        yaml_event_delete(&ev);
        return rc;
    }
    yaml_event_delete(&ev);
    return 0;
}

int ty__cfg_tree_build(struct ty__cfg_doc *doc, const char *text, size_t len)
{
    struct builder b = {.doc = doc};
    if (!yaml_parser_initialize(&b.parser))
        return TY_ENOMEM;
    yaml_parser_set_input_string(&b.parser, (const unsigned char *)text, len);
    int rc = read_document(&b);
    yaml_parser_delete(&b.parser);
    if (rc == 0 && doc->root && doc->root->kind != TY__CFG_NODE_MAP &&
        !ty__cfg_node_is_null(doc->root)) {
        ty__cfg_error(doc->err, doc->origin, doc->root->line, doc->root->col, "",
                      "the top level must be a mapping of settings (key: value lines)");
        rc = TY_ECONFIG;
    }
    if (rc == 0 && doc->root && doc->root->kind != TY__CFG_NODE_MAP)
        doc->root = NULL; /* a document holding only "~" or "" */
    return rc;
}
