/* A Jinja2 template interpreter for Hugging Face chat templates.
 *
 * Semantics follow Python jinja2 3.1 as transformers' apply_chat_template configures it:
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with loop controls, the
 * `generation` block, HF's tojson (ensure_ascii=False) and the globals raise_exception and
 * strftime_now. Anything the interpreter does not implement is refused at parse time.
 * A parsed template is immutable: many threads may render it at once.
 */
#ifndef TYCHO_JINJA_H
#define TYCHO_JINJA_H

#include <stddef.h>

#include <jansson.h>

typedef struct ty_jinja ty_jinja_t;

struct ty_jinja_error {
    int line;      /* 1-based line in the template source, 0 when not known */
    char msg[256]; /* "unsupported filter 'wordwrap' at line 12", "raise_exception: ..." */
};

/* Parse a template. Returns 0, TY_EPARSE (syntax error) or TY_ENOTSUP (a construct, filter, test,
 * tag or method this interpreter does not implement: the message names it and its line),
 * TY_ENOMEM. `err` may be NULL. */
int ty_jinja_parse(ty_jinja_t **out, const char *src, size_t len, struct ty_jinja_error *err);

/* Free a parsed template; NULL is a no-op. */
void ty_jinja_free(ty_jinja_t *t);

/* Render with top-level variables from `vars` (a JSON object, borrowed, may be NULL). *out is
 * malloc'd, NUL-terminated, of length *out_len. Returns 0, TY_EINVAL (raise_exception or a runtime
 * error: err->msg says which, with its line), TY_ERANGE (output over 16 MiB, or a loop, recursion
 * or memory limit exceeded), TY_ENOMEM. strftime_now uses env TYCHO_FIXED_NOW (ISO 8601, e.g.
 * "2026-01-02T03:04:05Z") when set, else the local time. */
int ty_jinja_render(const ty_jinja_t *t, const json_t *vars, char **out, size_t *out_len,
                    struct ty_jinja_error *err);

#endif /* TYCHO_JINJA_H */
