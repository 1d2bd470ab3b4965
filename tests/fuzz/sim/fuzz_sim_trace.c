/* libFuzzer target for the Mooncake trace reader (ty_sim_trace_parse): arbitrary bytes as a
 * trace file. Nothing may crash, leak or hang; a rejected input must say why; an accepted one
 * must hold what the reader promises (sorted arrivals, blocks inside the trace's array, at
 * least one prompt token), and its prefix hit rate at unlimited capacity must lie in [0, 1].
 * Run: fuzz_sim_trace -max_total_time=20 tests/fuzz/sim/corpus
 */
#include "tycho/errors.h"
#include "tycho/sim.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const struct ty_sim_trace *t)
{
    size_t blocks = 0;
    for (size_t i = 0; i < t->n; i++) {
        const struct ty_sim_request *r = &t->reqs[i];
        if (i && r->arrival_us < t->reqs[i - 1].arrival_us)
            abort(); /* not sorted */
        if (r->input_tokens == 0)
            abort();
        if (r->n_blocks && (r->blocks < t->blocks || r->blocks + r->n_blocks >
                                                         t->blocks + t->n_blocks))
            abort(); /* blocks outside the trace's array */
        blocks += r->n_blocks;
    }
    if (blocks != t->n_blocks)
        abort();
    struct ty_sim_cache_result cr;
    if (ty_sim_cache_run(t, 0, TY_SIM_EVICT_LRU, &cr) != 0 || cr.hit_blocks > cr.total_blocks ||
        cr.total_blocks != t->n_blocks)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ty_sim_trace *t = NULL;
    char err[256] = "";
    int rc = ty_sim_trace_parse(&t, "fuzz", (const char *)data, size, err, sizeof(err));
    if (rc == 0) {
        check(t);
        ty_sim_trace_free(t);
    } else if (rc == TY_EPARSE && err[0] == '\0') {
        abort(); /* a parse error must say where and why */
    }
    return 0;
}
