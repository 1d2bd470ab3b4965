/* libFuzzer target for the OpenAI request validator (src/api/api_parse.c).
 *
 * The first input byte picks the request kind (bit 0: chat or completion) and the parse (bit 1:
 * into one arena shared by every input and reset after each, as the API's per-request arena
 * is used, or into the request's own); the rest is the request body. Checked on every input: an accepted request obeys every range the validator
 * promises (tycho/api.h, OpenAI API reference), a rejected one carries a 400/500 error with a
 * message whose JSON rendering parses back, and a rejected request holds no allocations. */
#include "tycho/api.h"
#include "tycho/arena.h"
#include "tycho/errors.h"
#include "tycho/sampling.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A failed check names itself before aborting, so a crash report says which promise broke. */
#define check(cond) ((cond) ? (void)0 : check_failed(__LINE__, #cond))
static void check_failed(int line, const char *what)
{
    fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, line, what);
    abort();
}

static void check_accepted(const struct ty_api_request *r, enum ty_api_kind kind)
{
    check(r->kind == kind);
    if (kind == TY_API_CHAT) {
        check(r->n_msgs >= 1 && r->n_msgs <= TY_API_MAX_MESSAGES && r->msgs);
        for (size_t i = 0; i < r->n_msgs; i++) {
            const char *role = r->msgs[i].role;
            check(role && r->msgs[i].content);
            check(!strcmp(role, "system") || !strcmp(role, "user") ||
                  !strcmp(role, "assistant") || !strcmp(role, "tool"));
        }
        check(!r->prompts && !r->n_prompts && !r->echo);
    } else {
        check(!r->msgs && !r->n_msgs);
        check(r->n_prompts >= 1 && r->n_prompts <= TY_API_MAX_CHOICES && r->prompts);
        for (size_t i = 0; i < r->n_prompts; i++) {
            const struct ty_api_prompt *p = &r->prompts[i];
            check((p->text != NULL) != (p->ids != NULL));
            check(p->text ? p->text[0] != 0 : p->n_ids >= 1);
        }
        check(r->n_prompts * r->n <= TY_API_MAX_CHOICES);
        check(!(r->echo && r->logprobs));
    }
    check(r->n >= 1 && r->n <= TY_API_MAX_N);
    check(r->max_tokens == -1 || (r->max_tokens >= 1 && r->max_tokens <= INT32_MAX));
    check(r->temperature >= 0 && r->temperature <= 2);
    check(r->top_p > 0 && r->top_p <= 1);
    check(r->min_p >= 0 && r->min_p <= 1);
    check(r->presence_penalty >= -2 && r->presence_penalty <= 2);
    check(r->frequency_penalty >= -2 && r->frequency_penalty <= 2);
    check(r->repetition_penalty >= 0.01f && r->repetition_penalty <= 10);
    check(r->top_k >= -1 && r->top_k <= (1 << 20));
    check(r->top_logprobs <= TY_SAMPLE_MAX_LOGPROBS);
    check(r->n_stop <= TY_SERVE_MAX_STOP);
    for (size_t i = 0; i < r->n_stop; i++)
        check(r->stop[i] && r->stop[i][0]);
    check(!r->include_usage || r->stream);
    check(r->n_logit_bias <= TY_SAMPLE_MAX_LOGIT_BIAS);
    for (uint32_t i = 0; i < r->n_logit_bias; i++)
        check(r->logit_bias[i].bias >= -100 && r->logit_bias[i].bias <= 100);
    check(r->n_stop_ids <= TY_GEN_MAX_STOP_IDS);
    check(r->max_tokens == -1 || r->min_tokens <= r->max_tokens);
    check(strlen(r->slo_class) < sizeof(r->slo_class));
}

static void check_rejected(const struct ty_api_request *r, const struct ty_api_error *e)
{
    /* nothing left for the caller to free */
    check(!r->msgs && !r->n_msgs && !r->model && !r->prompts && !r->n_prompts &&
          !r->n_stop);
    check(e->status == 400 || e->status == 500);
    check(e->message[0] != 0 && e->type[0] != 0);
    char *js = ty_api_error_json(e);
    check(js != NULL);
    json_error_t je;
    json_t *o = json_loads(js, 0, &je);
    check(json_is_object(json_object_get(o, "error")));
    json_decref(o);
    free(js);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum ty_api_kind kind = (data[0] & 1) ? TY_API_COMPLETION : TY_API_CHAT;
    /* A heap copy exactly `size - 1` long, so that reads past the body are caught. */
    char *body = malloc(size - 1 ? size - 1 : 1);
    check(body != NULL);
    memcpy(body, data + 1, size - 1);
    struct ty_api_request r;
    struct ty_api_error e;
    memset(&e, 0, sizeof(e));
    static ty_arena_t *arena;
    if (!arena)
        arena = ty_arena_new(0);
    bool shared = data[0] & 2;
    int rc = shared ? ty_api_parse_request_in(arena, body, size - 1, kind, &r, &e)
                    : ty_api_parse_request(body, size - 1, kind, &r, &e);
    check(rc == 0 || rc == TY_EINVAL || rc == TY_ENOMEM);
    if (rc == 0) {
        check_accepted(&r, kind);
        ty_api_request_clear(&r);
    } else {
        check_rejected(&r, &e);
    }
    check(!shared || ty_arena_used(arena) || rc);
    ty_arena_reset(arena);
    free(body);
    return 0;
}
