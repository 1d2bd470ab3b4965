/* A model's own Jinja chat template, rendered as Hugging Face transformers' apply_chat_template
 * renders it: the template chosen by HF's rules, the special tokens as variables, tools=None when
 * no tools are given, chat_template_kwargs merged in. A ty_chat_tpl_t is immutable once made and
 * may be rendered from any number of threads at once; it borrows its tokenizer, which must
 * outlive it. Strings passed in are borrowed; rendered prompts are malloc'd for the caller.
 */
#ifndef TYCHO_CHAT_TEMPLATE_H
#define TYCHO_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "tycho/tokenizer.h"

typedef struct ty_chat_tpl ty_chat_tpl_t;

/* The chat template of a tokenizer: `override_path` (a --chat-template file; NULL: none) or the
 * tokenizer's own (tokenizer_config.json `chat_template` — a string, or a list of {name, template}
 * where "default" is used and "tool_use" when tools are given —, chat_template.jinja beside it, or
 * GGUF tokenizer.chat_template). Parses it now: a template using an unsupported construct fails
 * here with the message naming it and its line (TY_ENOTSUP/TY_EPARSE). TY_ENOENT when there is no
 * template at all. Borrowed tok must outlive the result. */
int ty_chat_tpl_new(ty_chat_tpl_t **out, const ty_tokenizer_t *tok, const char *override_path,
                    char *err, size_t errlen);
/* Free; NULL is a no-op. */
void ty_chat_tpl_free(ty_chat_tpl_t *t);

/* Render a chat request. `req` (borrowed) is a JSON object: "messages" (array, required),
 * optional "tools" (array), "add_generation_prompt" (default true), "chat_template_kwargs"
 * (object whose members become top-level variables and override the special tokens and
 * add_generation_prompt; "messages", "tools" and "documents" cannot be overridden), "documents".
 * The template sees bos_token, eos_token, ... as transformers' special_tokens_map gives them, and
 * `tools`/`documents` as none when not given (HF passes tools=None). Returns 0 with *out malloc'd
 * (NUL-terminated, *out_len bytes), or TY_EINVAL with err (bad request, raise_exception text,
 * runtime error with its line), TY_ERANGE, TY_ENOMEM. Any thread. */
int ty_chat_tpl_render(const ty_chat_tpl_t *t, const json_t *req, char **out, size_t *out_len,
                       char *err, size_t errlen);

/* The template source text (the "default" one of a named list); lives as long as t. */
const char *ty_chat_tpl_source(const ty_chat_tpl_t *t);

/* Tokenize a rendered prompt as apply_chat_template(tokenize=True) does: special tokens in the
 * text are recognised, no BOS/EOS added (the template writes them). Returns the count needed (may
 * exceed max_ids: call again) or a negative TY_E*, like ty_tokenizer_encode. Any thread. */
int ty_chat_tpl_encode(const ty_chat_tpl_t *t, const char *text, size_t len, uint32_t *ids,
                       size_t max_ids);

#endif /* TYCHO_CHAT_TEMPLATE_H */
