/* `tycho serve`'s settings table (tycho/serve_local.h): the Conductor's front-door rows at the
 * root (TY_CONDUCTOR_CONFIG_ROWS, the same as tycho-conductor's) and the in-process engine in
 * `engine:` (TY_NODE_ENGINE_CONFIG_ROWS, the same as the nodes'). Immutable; any thread may read
 * it. */
#include "tycho/serve_local.h"

#include <stddef.h>

#define E struct ty_serve_engine_config
static const struct ty_config_field serve_engine_fields[] = {
    TY_NODE_ENGINE_CONFIG_ROWS(E),
    {.key = "step_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(E, step_tokens), .def = "256",
     .min = "1", .max = "1048576",
     .help = "token budget of one engine step (decodes plus prefill chunks)"},
};
static const struct ty_config_struct serve_engine =
    TY_CONFIG_STRUCT("engine", E, serve_engine_fields);
#undef E

#define S struct ty_serve_config
static const struct ty_config_field serve_fields[] = {
    TY_CONDUCTOR_CONFIG_ROWS(S, conductor.),
    {.key = "engine", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(S, engine), .sub = &serve_engine,
     .help = "the in-process engine that serves the requests"},
};
static int serve_check(const void *data, char *field, size_t field_cap, char *why,
                       size_t why_cap)
{
    const S *c = data;
    return ty_conductor_config_check(&c->conductor, field, field_cap, why, why_cap);
}

const struct ty_config_struct ty_serve_config_table =
    TY_CONFIG_STRUCT_CHECKED("serve", S, serve_fields, serve_check);
#undef S
