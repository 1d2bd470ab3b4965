/* The grammar crosses the cluster's RPC (proto/convert.c): the Conductor packs it into
 * SamplingParams, a node unpacks the same kind and schema bytes (NUL-terminated copy, for a
 * schema that was not); a message without it (from a Conductor that predates it) carries
 * none; an unknown kind is refused with a reason; a DecodeAssignReply from a node that
 * predates structured output says grammar = false, which is what the Conductor refuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/errors.h"
#include "tycho/proto.h"

#include <stdlib.h>
#include <string.h>

/* sp packed and unpacked again (what crosses the wire). */
static Tycho__V1__SamplingParams *round_trip(const struct ty_gen_params *g)
{
    static Tycho__V1__LogitBias bias[TY_SAMPLE_MAX_LOGIT_BIAS], *ptrs[TY_SAMPLE_MAX_LOGIT_BIAS];
    Tycho__V1__SamplingParams sp = TYCHO__V1__SAMPLING_PARAMS__INIT;
    ty_pb_sampling_pack(g, &sp, bias, ptrs);
    size_t n = tycho__v1__sampling_params__get_packed_size(&sp);
    uint8_t *buf = malloc(n ? n : 1);
    tycho__v1__sampling_params__pack(&sp, buf);
    Tycho__V1__SamplingParams *out = tycho__v1__sampling_params__unpack(NULL, n, buf);
    free(buf);
    assert_non_null(out);
    return out;
}

static void test_round_trip(void **state)
{
    (void)state;
    const char text[] = "{\"type\":\"integer\"}XXXX"; /* the schema is the first 18 bytes */
    struct ty_gen_grammar gg = {.kind = TY_GRAMMAR_JSON_SCHEMA, .schema = text, .schema_len = 18};
    struct ty_gen_params g = {.max_tokens = 5, .grammar = &gg};
    Tycho__V1__SamplingParams *sp = round_trip(&g);
    struct ty_gen_grammar got;
    char *schema, why[128];
    assert_int_equal(ty_pb_grammar_unpack(sp, &got, &schema, why, sizeof(why)), 0);
    assert_int_equal(got.kind, TY_GRAMMAR_JSON_SCHEMA);
    assert_int_equal(got.schema_len, 18);
    assert_string_equal(got.schema, "{\"type\":\"integer\"}");
    free(schema);
    tycho__v1__sampling_params__free_unpacked(sp, NULL);

    gg = (struct ty_gen_grammar){.kind = TY_GRAMMAR_JSON_OBJECT};
    sp = round_trip(&g);
    assert_int_equal(ty_pb_grammar_unpack(sp, &got, &schema, why, sizeof(why)), 0);
    assert_int_equal(got.kind, TY_GRAMMAR_JSON_OBJECT);
    free(schema);
    tycho__v1__sampling_params__free_unpacked(sp, NULL);

    g.grammar = NULL; /* also what an older Conductor's message gives */
    sp = round_trip(&g);
    assert_int_equal(ty_pb_grammar_unpack(sp, &got, &schema, why, sizeof(why)), 0);
    assert_int_equal(got.kind, 0);
    assert_null(schema);
    sp->grammar_kind = 7;
    assert_int_equal(ty_pb_grammar_unpack(sp, &got, &schema, why, sizeof(why)), TY_EINVAL);
    assert_non_null(strstr(why, "grammar_kind"));
    tycho__v1__sampling_params__free_unpacked(sp, NULL);
}

static void test_old_decode_reply(void **state)
{
    (void)state;
    Tycho__V1__DecodeAssignReply r = TYCHO__V1__DECODE_ASSIGN_REPLY__INIT;
    r.request_id = 9;
    r.accepted = true; /* an old node sets no field 5 */
    uint8_t buf[64];
    size_t n = tycho__v1__decode_assign_reply__pack(&r, buf);
    Tycho__V1__DecodeAssignReply *u = tycho__v1__decode_assign_reply__unpack(NULL, n, buf);
    assert_non_null(u);
    assert_true(u->accepted);
    assert_false(u->grammar);
    tycho__v1__decode_assign_reply__free_unpacked(u, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_old_decode_reply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
