/* `tycho generate`: load a model, tokenize a prompt (or take ids), generate on the engine
 * (CPU or CUDA backend), print the text or one JSON object. */
#include "cli.h"

#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/tokenizer.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STOP 8

struct gen_args {
    const char *model, *prompt, *prompt_ids;
    struct ty_gen_params gp;
    struct ty_engine_opts eo;
    const char *stop[MAX_STOP];
    bool chat, json, raw, stream;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tycho generate --model PATH (--prompt TEXT | --prompt-ids 1,2,3|@FILE) [-n N]\n"
            "         [--temp T] [--seed S] [--top-k K] [--top-p P] [--min-p P]\n"
            "         [--repeat-penalty R] [--presence-penalty P] [--frequency-penalty F]\n"
            "         [--stop STR]... [--logprobs N] [--ignore-eos] [--chat] [--json] [--raw]\n"
            "         [--threads N] [--kv-block B] [--kv-dtype auto|f32|f16|bf16] [--batch-tokens N]\n"
            "         [--backend cpu|cuda] [--device N] [--weights auto|f32|f16|bf16]\n"
            "         [--no-graphs] [--logit-bias ID:BIAS]... [--stop-token-id ID]...\n"
            "         [--min-tokens N]\n"
            "  PATH is a .gguf file or a Hugging Face model directory.\n"
            "  --backend cuda runs on GPU N (--device) with weights of the given type.\n"
            "  --kv-dtype: KV cache elements (auto: f16 for a 16-bit or quantized model).\n"
            "  --raw: do not add BOS; --ignore-eos: always generate N tokens.\n"
            "  --logit-bias: add BIAS (-100..100) to token ID's logit (OpenAI's logit_bias);\n"
            "  --stop-token-id: end at token ID like at EOS (vLLM's stop_token_ids);\n"
            "  --min-tokens: neither EOS nor a stop token before N output tokens.\n");
}

static bool parse_float(const char *s, float *out)
{
    char *end;
    *out = strtof(s, &end);
    return *s && !*end;
}

static bool parse_u32(const char *s, uint32_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || v > UINT32_MAX || *s == '-')
        return false;
    *out = (uint32_t)v;
    return true;
}

/* --backend, --device, --weights, --no-graphs: 0 or TY_EINVAL; 1 when `c` is none of them. */
static int parse_backend_opt(struct gen_args *a, int c, const char *arg)
{
    uint32_t d;
    switch (c) {
    case 'K':
        a->eo.backend = arg;
        return !strcmp(arg, "cpu") || !strcmp(arg, "cuda") ? 0 : TY_EINVAL;
    case 'D':
        if (!parse_u32(arg, &d) || d > 255)
            return TY_EINVAL;
        a->eo.cuda_device = (int)d;
        return 0;
    case 'W':
        a->eo.cuda_weights = arg;
        return !strcmp(arg, "auto") || !strcmp(arg, "f32") || !strcmp(arg, "f16") ||
                       !strcmp(arg, "bf16")
                   ? 0
                   : TY_EINVAL;
    case 'G':
        a->eo.cuda_no_graphs = true;
        return 0;
    default:
        return 1;
    }
}

static int parse_opt(struct gen_args *a, int c, const char *arg)
{
    int brc = parse_backend_opt(a, c, arg);
    if (brc != 1)
        return brc;
    struct ty_sampling_params *sp = &a->gp.sampling;
    bool ok = true;
    switch (c) {
    case 'm': a->model = arg; break;
    case 'p': a->prompt = arg; break;
    case 'I': a->prompt_ids = arg; break;
    case 'n': ok = parse_u32(arg, &a->gp.max_tokens); break;
    case 't': ok = parse_float(arg, &sp->temperature); break;
    case 's': {
        char *end;
        sp->seed = strtoull(arg, &end, 10);
        ok = *arg && !*end;
        break;
    }
    case 'k': ok = parse_u32(arg, &sp->top_k); break;
    case 'P': ok = parse_float(arg, &sp->top_p); break;
    case 'M': ok = parse_float(arg, &sp->min_p); break;
    case 'r': ok = parse_float(arg, &sp->repetition_penalty); break;
    case 'e': ok = parse_float(arg, &sp->presence_penalty); break;
    case 'f': ok = parse_float(arg, &sp->frequency_penalty); break;
    case 'L': ok = parse_u32(arg, &sp->n_logprobs) && sp->n_logprobs <= TY_SAMPLE_MAX_LOGPROBS;
        break;
    case 'S':
        ok = a->gp.n_stop < MAX_STOP;
        if (ok)
            a->stop[a->gp.n_stop++] = arg;
        break;
    case 'T': ok = parse_u32(arg, &a->eo.n_threads) && a->eo.n_threads <= 64; break;
    case 'B': ok = parse_u32(arg, &a->eo.kv_block_tokens) && a->eo.kv_block_tokens; break;
    case 'b': ok = parse_u32(arg, &a->eo.max_batch_tokens) && a->eo.max_batch_tokens; break;
    case 'X': {
        enum ty_kv_dtype dt;
        ok = !strcmp(arg, "auto") || !ty_kv_dtype_parse(arg, &dt);
        a->eo.kv_dtype = arg;
        break;
    }
    case 'l': {
        struct ty_sampling_params *q = &a->gp.sampling;
        char *end;
        unsigned long id = strtoul(arg, &end, 10);
        float bias = 0;
        ok = end != arg && *end == ':' && arg[0] != '-' && id <= UINT32_MAX &&
             parse_float(end + 1, &bias) && bias >= -100 && bias <= 100 &&
             q->n_logit_bias < TY_SAMPLE_MAX_LOGIT_BIAS;
        if (ok)
            q->logit_bias[q->n_logit_bias++] = (struct ty_logit_bias){(uint32_t)id, bias};
        break;
    }
    case 'i':
        ok = a->gp.n_stop_ids < TY_GEN_MAX_STOP_IDS &&
             parse_u32(arg, &a->gp.stop_ids[a->gp.n_stop_ids]);
        a->gp.n_stop_ids += ok;
        break;
    case 'N': ok = parse_u32(arg, &a->gp.min_tokens); break;
    case 'E': a->gp.ignore_eos = true; break;
    case 'c': a->chat = true; break;
    case 'j': a->json = true; break;
    case 'R': a->raw = true; break;
    default: return TY_EINVAL;
    }
    return ok ? 0 : TY_EINVAL;
}

static int parse_args(struct gen_args *a, int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"prompt", 1, 0, 'p'}, {"prompt-ids", 1, 0, 'I'},
        {"temp", 1, 0, 't'}, {"seed", 1, 0, 's'}, {"top-k", 1, 0, 'k'}, {"top-p", 1, 0, 'P'},
        {"min-p", 1, 0, 'M'}, {"repeat-penalty", 1, 0, 'r'}, {"presence-penalty", 1, 0, 'e'},
        {"frequency-penalty", 1, 0, 'f'}, {"logprobs", 1, 0, 'L'}, {"stop", 1, 0, 'S'},
        {"threads", 1, 0, 'T'}, {"kv-block", 1, 0, 'B'}, {"batch-tokens", 1, 0, 'b'},
        {"kv-dtype", 1, 0, 'X'}, {"backend", 1, 0, 'K'}, {"device", 1, 0, 'D'},
        {"weights", 1, 0, 'W'},
        {"no-graphs", 0, 0, 'G'}, {"ignore-eos", 0, 0, 'E'}, {"chat", 0, 0, 'c'},
        {"json", 0, 0, 'j'}, {"raw", 0, 0, 'R'}, {"logit-bias", 1, 0, 'l'},
        {"stop-token-id", 1, 0, 'i'}, {"min-tokens", 1, 0, 'N'},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    a->gp.max_tokens = 128;
    a->gp.stop = a->stop;
    a->gp.sampling.repetition_penalty = 1.0f;
    a->eo.max_seqs = 1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:s:h", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 1;
        }
        if (parse_opt(a, c, optarg)) {
            char name[40];
            snprintf(name, sizeof(name), "-%c", c); /* a short option */
            for (size_t k = 0; opts[k].name; k++)
                if (opts[k].val == c)
                    snprintf(name, sizeof(name), "--%s", opts[k].name);
            if (optarg)
                fprintf(stderr, "tycho generate: bad value '%s' for %s\n", optarg, name);
            return TY_EINVAL;
        }
    }
    if (!a->model || (!a->prompt == !a->prompt_ids) || optind != argc) {
        usage(stderr);
        return TY_EINVAL;
    }
    return 0;
}

static int parse_ids(const char *s, uint32_t **ids, size_t *n)
{
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof(uint32_t));
    while (*ids && *s) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v > UINT32_MAX)
            return TY_EINVAL;
        if (*n == cap && !(*ids = realloc(*ids, (cap *= 2) * sizeof(uint32_t))))
            return TY_ENOMEM;
        (*ids)[(*n)++] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return TY_EINVAL;
    }
    return *ids ? 0 : TY_ENOMEM;
}

/* --prompt-ids @FILE: the comma-separated ids from FILE (a long prompt's list outgrows one
 * command-line argument, 128 KiB on Linux); trailing whitespace ignored. */
static int parse_ids_arg(const char *arg, uint32_t **ids, size_t *n)
{
    if (arg[0] != '@')
        return parse_ids(arg, ids, n);
    FILE *f = fopen(arg + 1, "rb");
    if (!f) {
        fprintf(stderr, "tycho generate: cannot read %s: %s\n", arg + 1, strerror(errno));
        return -errno;
    }
    size_t len = 0, cap = 1 << 16, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0)
        if ((len += got) == cap - 1 && !(buf = realloc(buf, cap *= 2)))
            break;
    fclose(f);
    if (!buf)
        return TY_ENOMEM;
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' ' || buf[len - 1] == '\r'))
        len--;
    buf[len] = 0;
    int rc = parse_ids(buf, ids, n);
    free(buf);
    return rc;
}

/* Prompt text to ids: chat template (--chat) then the model's tokenizer. */
static int tokenize_prompt(const struct gen_args *a, const ty_model_t *m, uint32_t **ids,
                           size_t *n)
{
#ifdef TY_HAVE_TOKENIZER
    const ty_tokenizer_t *tok = ty_model_tokenizer(m);
    char *text = NULL;
    if (!tok) {
        fprintf(stderr, "tycho generate: the model has no tokenizer; use --prompt-ids\n");
        return TY_ENOTSUP;
    }
    if (a->chat) {
#ifdef TY_HAVE_CHAT
        const char *tmpl = ty_model_chat_template(m);
        enum ty_chat_family fam = tmpl ? ty_chat_detect(tmpl) : TY_CHAT_NONE;
        struct ty_chat_msg msg = {"user", a->prompt};
        if (fam == TY_CHAT_NONE) {
            fprintf(stderr, "tycho generate: the model's chat template is missing or not "
                            "recognised\n");
            return TY_ENOTSUP;
        }
        if (!(text = ty_chat_render(fam, &msg, 1, true, NULL, NULL)))
            return TY_ENOMEM;
#else
        fprintf(stderr, "tycho generate: --chat needs chat templates, not in this build\n");
        return TY_ENOTSUP;
#endif
    }
    const char *src = text ? text : a->prompt;
    bool special = !a->raw;
    int k = ty_tokenizer_encode(tok, src, strlen(src), special, a->chat, NULL, 0);
    if (k >= 0 && !(*ids = malloc(((size_t)k + 1) * sizeof(uint32_t))))
        k = TY_ENOMEM;
    if (k >= 0)
        k = ty_tokenizer_encode(tok, src, strlen(src), special, a->chat, *ids, (size_t)k + 1);
    free(text);
    if (k < 0)
        return k;
    *n = (size_t)k;
    return 0;
#else
    fprintf(stderr, "tycho generate: built without tokenizers; use --prompt-ids\n");
    return TY_ENOTSUP;
#endif
}

static json_t *ids_json(const uint32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *logprobs_json(const struct ty_gen_result *r)
{
    json_t *a = json_array();
    for (size_t i = 0; i < r->n_ids; i++) {
        json_t *top = json_array();
        for (uint32_t k = 0; k < r->samples[i].n_top; k++)
            json_array_append_new(top, json_pack("{s:i,s:f}", "id", r->samples[i].top[k].id,
                                                 "logprob", r->samples[i].top[k].logprob));
        json_array_append_new(a, json_pack("{s:i,s:f,s:o}", "id", r->ids[i], "logprob",
                                           r->samples[i].logprob, "top", top));
    }
    return a;
}

static void print_json(const struct gen_args *a, const ty_model_t *m, const uint32_t *pids,
                       size_t np, const struct ty_gen_result *r)
{
    const char *t = r->text ? r->text : "";
    size_t tl = r->text ? r->text_len : 0;
    json_t *txt = json_stringn(t, tl);
    json_t *o = json_pack("{s:o,s:o,s:o,s:s,s:s,s:i,s:i,s:f,s:f,s:f,s:f}", "prompt_ids",
                          ids_json(pids, np), "output_ids", ids_json(r->ids, r->n_ids), "text",
                          txt ? txt : json_stringn_nocheck(t, tl), "finish_reason",
                          ty_finish_name(r->finish), "model", ty_model_desc(m), "n_prompt",
                          (int)r->n_prompt, "n_cached", (int)r->n_cached, "prefill_ms",
                          r->prefill_ms, "decode_ms", r->decode_ms, "prefill_tok_s",
                          r->prefill_ms > 0 ? r->n_prompt / (r->prefill_ms / 1e3) : 0.0,
                          "decode_tok_s",
                          r->decode_ms > 0 && r->n_ids > 1
                              ? (double)(r->n_ids - 1) / (r->decode_ms / 1e3)
                              : 0.0);
    if (a->gp.sampling.n_logprobs)
        json_object_set_new(o, "logprobs", logprobs_json(r));
    char *s = json_dumps(o, JSON_COMPACT);
    printf("%s\n", s ? s : "{}");
    free(s);
    json_decref(o);
}

static int run_generate(int argc, char **argv)
{
    struct gen_args a = {0};
    int rc = parse_args(&a, argc, argv), ret = TY_CLI_EXIT_FAIL;
    if (rc)
        return rc > 0 ? TY_CLI_EXIT_OK : TY_CLI_EXIT_USAGE;
    char err[512] = "";
    ty_model_t *m = NULL;
    ty_engine_t *e = NULL;
    uint32_t *ids = NULL;
    size_t n = 0;
    struct ty_gen_result r = {0};
    if ((rc = ty_model_load(&m, a.model, err, sizeof(err)))) {
        fprintf(stderr, "tycho generate: cannot load model: %s (%s)\n", err, ty_err_name(rc));
        return TY_CLI_EXIT_FAIL;
    }
    uint32_t V = ty_model_config(m)->n_vocab;
    for (uint32_t i = 0; i < a.gp.sampling.n_logit_bias + a.gp.n_stop_ids; i++) {
        bool bias = i < a.gp.sampling.n_logit_bias;
        uint32_t id = bias ? a.gp.sampling.logit_bias[i].id
                           : a.gp.stop_ids[i - a.gp.sampling.n_logit_bias];
        if (id >= V) {
            fprintf(stderr, "tycho generate: %s %u is not a token of this model (vocabulary %u)\n",
                    bias ? "--logit-bias" : "--stop-token-id", id, V);
            goto out;
        }
    }
    rc = a.prompt_ids ? parse_ids_arg(a.prompt_ids, &ids, &n) : tokenize_prompt(&a, m, &ids, &n);
    if (rc || n == 0) {
        fprintf(stderr, "tycho generate: bad or empty prompt (%s)\n", ty_err_name(rc));
        goto out;
    }
    if ((rc = ty_engine_new(&e, m, &a.eo))) {
        if (rc == TY_ENOTSUP && a.eo.backend && !strcmp(a.eo.backend, "cuda"))
            fprintf(stderr, "tycho generate: --backend cuda: this build has no CUDA backend "
                            "(configured without CUDA) (ENOTSUP)\n");
        else
            fprintf(stderr, "tycho generate: engine (%s backend): %s (%s)\n",
                    a.eo.backend ? a.eo.backend : "cpu", ty_strerror(rc), ty_err_name(rc));
        goto out;
    }
    const uint32_t *pp = ids;
    uint32_t max_ctx = ty_engine_max_ctx(e);
    if (n >= max_ctx) {
        fprintf(stderr, "tycho generate: the prompt has %zu tokens; the context holds %u (the "
                        "model's is %u; the KV cache holds %u), which leaves no room for a "
                        "completion\n", n, max_ctx, ty_model_config(m)->ctx_len,
                ty_kvpool_pages_total(ty_engine_pool(e)) *
                    ty_kvpool_block_tokens(ty_engine_pool(e)));
        goto out;
    }
    if ((rc = ty_engine_generate(e, &pp, &n, 1, &a.gp, &r, NULL, NULL))) {
        fprintf(stderr, "tycho generate: %s\n", ty_strerror(rc));
        goto out;
    }
    if (a.json)
        print_json(&a, m, ids, n, &r);
    else {
        fputs(a.prompt ? a.prompt : "", stdout);
        fwrite(r.text ? r.text : "", 1, r.text ? r.text_len : 0, stdout);
        putchar('\n');
    }
    ret = TY_CLI_EXIT_OK;
out:
    ty_gen_result_clear(&r);
    free(ids);
    ty_engine_free(e);
    ty_model_free(m);
    return ret;
}

const struct ty_cli_command ty_cli_cmd_generate = {
    "generate", "generate text with a model (CPU or CUDA backend)", run_generate};
