/* GGUF tokenizer.ggml.* metadata to a tokenizer, through the accessors of gguf.h only (the
 * reader itself lives in ty_engine; binaries calling this link both). Key names and defaults
 * follow llama.cpp's llama-vocab.cpp. */
#include "tok-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tycho/errors.h"
#include "tycho/gguf.h"

static int32_t get_id(const ty_gguf_t *g, const char *key)
{
    uint32_t v;
    if (!ty_gguf_get_u32(g, key, &v) || v > INT32_MAX)
        return -1;
    return (int32_t)v;
}

static int gguf_arrays(const ty_gguf_t *g, struct ty_tokenizer_spec *sp, const char ***tok,
                       uint32_t **lens, const char ***merges, char *eb, size_t el)
{
    enum ty_gguf_vtype et;
    uint64_t n;
    const void *data;
    if (!ty_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data) || et != TY_GGUF_STRING ||
        n == 0 || n > (1u << 24)) {
        snprintf(eb, el, "gguf: tokenizer.ggml.tokens missing, empty or not a string array");
        return TY_EFORMAT;
    }
    sp->n_vocab = (uint32_t)n;
    *tok = calloc(n, sizeof(char *));
    *lens = calloc(n, sizeof(uint32_t));
    if (!*tok || !*lens)
        return TY_ENOMEM;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t l;
        if (!ty_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &(*tok)[i], &l) || l > 65536) {
            snprintf(eb, el, "gguf: tokenizer.ggml.tokens[%llu] unreadable", (unsigned long long)i);
            return TY_EFORMAT;
        }
        (*lens)[i] = (uint32_t)l;
    }
    sp->tokens = *tok;
    sp->token_lens = *lens;
    if (ty_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &data)) {
        if (et != TY_GGUF_FLOAT32 || n != sp->n_vocab) {
            snprintf(eb, el, "gguf: tokenizer.ggml.scores is not %u float32", sp->n_vocab);
            return TY_EFORMAT;
        }
        sp->scores = data;
    }
    if (ty_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &data)) {
        if ((et != TY_GGUF_INT32 && et != TY_GGUF_UINT32) || n != sp->n_vocab) {
            snprintf(eb, el, "gguf: tokenizer.ggml.token_type is not %u int32", sp->n_vocab);
            return TY_EFORMAT;
        }
        sp->token_types = data;
    }
    if (ty_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, &data)) {
        if (et != TY_GGUF_STRING || n > (1u << 24)) {
            snprintf(eb, el, "gguf: tokenizer.ggml.merges is not a string array");
            return TY_EFORMAT;
        }
        /* merges must be NUL-terminated for the spec: copy them */
        *merges = calloc(n + 1, sizeof(char *));
        if (!*merges)
            return TY_ENOMEM;
        for (uint64_t i = 0; i < n; i++) {
            const char *s;
            uint64_t l;
            if (!ty_gguf_get_arr_str(g, "tokenizer.ggml.merges", i, &s, &l) || l > 4096)
                return TY_EFORMAT;
            char *c = malloc(l + 1);
            if (!c)
                return TY_ENOMEM;
            memcpy(c, s, l);
            c[l] = 0;
            (*merges)[i] = c;
            sp->n_merges = (uint32_t)(i + 1);
        }
        sp->merges = *merges;
    }
    return 0;
}

static void gguf_flags(const ty_gguf_t *g, struct ty_tokenizer_spec *sp, char *pre, size_t pl)
{
    const char *s;
    uint64_t l;
    sp->bos_id = get_id(g, "tokenizer.ggml.bos_token_id");
    sp->eos_id = get_id(g, "tokenizer.ggml.eos_token_id");
    sp->unk_id = get_id(g, "tokenizer.ggml.unknown_token_id");
    sp->pad_id = get_id(g, "tokenizer.ggml.padding_token_id");
    for (int32_t *id = &sp->bos_id; id <= &sp->pad_id; id++)
        if (*id >= 0 && (uint32_t)*id >= sp->n_vocab)
            *id = -1; /* llama.cpp treats out-of-range ids as absent */
    pre[0] = 0;
    if (ty_gguf_get_str(g, "tokenizer.ggml.pre", &s, &l) && l < pl) {
        memcpy(pre, s, l);
        pre[l] = 0;
        sp->pre = pre;
    }
    bool spm = sp->model == TY_TOK_MODEL_SPM;
    bool llama3 = sp->pre && (!strcmp(sp->pre, "llama3") || !strcmp(sp->pre, "llama-bpe") ||
                              !strcmp(sp->pre, "llama-v3"));
    sp->add_bos = spm || llama3;
    sp->add_eos = false;
    sp->add_space_prefix = spm;
    sp->ignore_merges = llama3;
    bool b;
    if (ty_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b))
        sp->add_bos = b;
    if (ty_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b))
        sp->add_eos = b;
    if (ty_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b))
        sp->add_space_prefix = b;
    if (ty_gguf_get_str(g, "tokenizer.chat_template", &s, &l) && l > 0 && l < (1u << 24)) {
        sp->chat_template = s;
        sp->chat_template_len = (uint32_t)l;
    }
}

int ty_tokenizer_new_from_gguf(ty_tokenizer_t **out, const struct ty_gguf *g, char *eb,
                               size_t el)
{
    char dummy[8], pre[64], model[32] = "";
    const char **tok = NULL, **merges = NULL;
    uint32_t *lens = NULL;
    struct ty_tokenizer_spec sp = {0};
    const char *s;
    uint64_t l;
    int rc;
    if (!eb || !el) {
        eb = dummy;
        el = sizeof(dummy);
    }
    eb[0] = 0;
    *out = NULL;
    if (!ty_gguf_get_str(g, "tokenizer.ggml.model", &s, &l) || l >= sizeof(model)) {
        snprintf(eb, el, "gguf: no tokenizer.ggml.model");
        return TY_EFORMAT;
    }
    memcpy(model, s, l);
    if (!strcmp(model, "llama")) {
        sp.model = TY_TOK_MODEL_SPM;
    } else if (!strcmp(model, "gpt2")) {
        sp.model = TY_TOK_MODEL_BPE;
    } else {
        snprintf(eb, el, "gguf: tokenizer model \"%s\" is not supported (llama, gpt2)", model);
        return TY_ENOTSUP;
    }
    rc = gguf_arrays(g, &sp, &tok, &lens, &merges, eb, el);
    if (rc == 0 && sp.model == TY_TOK_MODEL_SPM && !sp.scores) {
        snprintf(eb, el, "gguf: llama tokenizer without tokenizer.ggml.scores");
        rc = TY_EFORMAT;
    }
    if (rc == 0 && sp.model == TY_TOK_MODEL_BPE && sp.n_merges == 0) {
        snprintf(eb, el, "gguf: gpt2 tokenizer without tokenizer.ggml.merges");
        rc = TY_EFORMAT;
    }
    if (rc == 0) {
        gguf_flags(g, &sp, pre, sizeof(pre));
        rc = ty_tokenizer_new(out, &sp, eb, el);
        if (rc == TY_EINVAL) /* the spec came from the file: a format error, as documented */
            rc = TY_EFORMAT;
    }
    if (rc == TY_ENOMEM && !eb[0])
        snprintf(eb, el, "out of memory");
    for (uint32_t i = 0; merges && i < sp.n_merges; i++)
        free((void *)merges[i]);
    free(merges);
    free(tok);
    free(lens);
    return rc;
}
