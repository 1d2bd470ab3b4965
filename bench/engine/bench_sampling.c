/* The sampler's cost per token on one row of logits, against one pass over the same row
 * (argmax: greedy decoding's whole cost, the floor of any sampler that looks at every logit),
 * for vocabulary sizes of real models and two shapes of distribution: "peaked" (logits with a
 * standard deviation of 4: a few hundred tokens hold 95 % of the mass, as a trained model's
 * next-token distribution mostly does) and "flat" (deviation 1: the nucleus is most of the
 * vocabulary, the worst case of top-p). Prints a table, then one JSON line per row.
 * usage: bench_sampling [REPS]   (REPS per cell, default 40; the median is reported) */
#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/sampling.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cfg {
    const char *name;
    float temperature, top_p, min_p;
    uint32_t top_k;
};

static const struct cfg CFGS[] = {
    {"greedy", 0, 0, 0, 0},
    {"temp 0.8", 0.8f, 0, 0, 0},
    {"top_k 40", 0.8f, 0, 0, 40},
    {"top_p 0.95", 0.8f, 0.95f, 0, 0},
    {"min_p 0.05", 0.8f, 0, 0.05f, 0},
    {"top_p 0.9 + min_p 0.05", 0.8f, 0.9f, 0.05f, 0},
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}

static float normal(void)
{
    return (float)(sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform()));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Median microseconds of `reps` samples (a fresh sampler per row as the engine makes one per
 * request; its creation is outside the timing). */
static double time_cfg(const struct cfg *c, float *logits, uint32_t V, int reps, uint32_t *kept)
{
    struct ty_sampling_params p = {0};
    p.temperature = c->temperature;
    p.top_p = c->top_p;
    p.min_p = c->min_p;
    p.top_k = c->top_k;
    p.seed = 7;
    ty_sampler_t *s;
    if (ty_sampler_new(&s, &p, V))
        return -1;
    uint64_t *t = malloc((size_t)reps * sizeof(*t));
    struct ty_sample out;
    uint32_t last = 0; /* the pick, so the call is not optimised away */
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = ty_clock_ns();
        ty_sampler_sample(s, logits, NULL, 0, &out);
        t[r] = ty_clock_ns() - t0;
        last = out.id;
    }
    qsort(t, (size_t)reps, sizeof(*t), cmp_u64);
    double med = (double)t[reps / 2] / 1e3;
    free(t);
    ty_sampler_free(s);
    *kept = last;
    return med;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 40;
    if (reps < 1) {
        fprintf(stderr, "usage: bench_sampling [REPS]\n");
        return 2;
    }
    const uint32_t vocab[] = {32000, 128256, 151936};
    const struct {
        const char *name;
        float sd;
    } dists[] = {{"peaked", 4}, {"flat", 1}};
    char json[64][256];
    int nj = 0;
    printf("%-7s %-6s %-24s %10s %10s %8s\n", "vocab", "dist", "sampler", "us/token", "argmax us",
           "ratio");
    for (size_t v = 0; v < sizeof(vocab) / sizeof(vocab[0]); v++) {
        uint32_t V = vocab[v];
        float *logits = malloc(V * sizeof(*logits));
        for (size_t d = 0; d < sizeof(dists) / sizeof(dists[0]); d++) {
            for (uint32_t i = 0; i < V; i++)
                logits[i] = dists[d].sd * normal();
            uint32_t id;
            double floor_us = time_cfg(&CFGS[0], logits, V, reps, &id);
            for (size_t c = 1; c < sizeof(CFGS) / sizeof(CFGS[0]); c++) {
                double us = time_cfg(&CFGS[c], logits, V, reps, &id);
                printf("%-7u %-6s %-24s %10.1f %10.1f %8.1f\n", V, dists[d].name, CFGS[c].name,
                       us, floor_us, us / floor_us);
                if (nj < 64)
                    snprintf(json[nj++], sizeof(json[0]),
                             "{\"vocab\":%u,\"dist\":\"%s\",\"sampler\":\"%s\",\"us\":%.2f,"
                             "\"argmax_us\":%.2f,\"ratio\":%.2f}",
                             V, dists[d].name, CFGS[c].name, us, floor_us, us / floor_us);
            }
        }
        free(logits);
    }
    for (int i = 0; i < nj; i++)
        puts(json[i]);
    return 0;
}
