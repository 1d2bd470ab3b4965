/* Decode tokens/s of a model on the CUDA backend at several batch sizes (issue 7: a ~1B random
 * model from `tycho mkmodel --preset 1b`, batches 1, 16 and 64). Per batch size: b sequences
 * prefill a PROMPT-token prompt together, WARM decode steps run untimed (the second sight of a
 * shape captures its CUDA graph), then STEPS decode steps are timed; each step is one forward
 * of b single-token sequences including the logits download and a host argmax (what a decode
 * node does per step). Prints "RESULT decode_<tag>_b<b>_tok_s <v> tok/s" lines, the same
 * counting only the time inside ty_engine_forward ("..._forward_tok_s": the engine without the
 * host argmax), plus the graphs-off figures with --compare-graphs. Then the same steps with the
 * picks made on the device (struct ty_batch.ids: only the ids come back, what a batcher step
 * of greedy requests does): "RESULT decode_<tag>_b<b>_ids_tok_s" and their ratio to the
 * logits-download steps of the same run ("..._ids_vs_rows"). Then sampled decoding
 * (temperature 0.8, top-p 0.95, repetition penalty 1.1 over the last 64 tokens, the top 5
 * log-probabilities) two ways: drawn on the device (struct ty_batch.draws, what a batcher step
 * of such requests does: "..._draws_tok_s") and with the rows downloaded and drawn on the host
 * by ty_sampler_sample ("..._hostdraw_tok_s"), and their ratio ("..._draws_vs_host"). Exit 77
 * without a GPU.
 *
 * usage: bench_gpu_decode MODEL.gguf [--batches 1,16,64] [--prompt 128] [--steps 64]
 *        [--tag 1b] [--weights auto|f32|f16|bf16] [--compare-graphs] */
#include "tycho/clock.h"
#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/sampling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WARM 4
#define MAX_B 256

struct args {
    const char *model, *tag, *weights, *batches;
    uint32_t prompt, steps;
    bool compare_graphs;
};

static uint32_t argmax(const float *l, uint32_t n)
{
    uint32_t best = 0;
    float bv = l[0];
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > bv)
            bv = l[i], best = i;
    return best;
}

static uint64_t g_forward_ns; /* time inside ty_engine_forward during timed steps */

/* How a step's next tokens are made: host argmax of the downloaded rows, greedy picks on the
 * device, sampled draws on the device, or the rows downloaded and sampled on the host. */
enum mode { ROWS, IDS, DRAWS, HOSTDRAW };

#define HIST 64 /* the penalties' window: the last tokens of each sequence */
static ty_sampler_t *g_samp[MAX_B];
static uint32_t g_hist[MAX_B][HIST];
static uint64_t g_n_hist;

static int samplers_new(uint32_t b, uint32_t V)
{
    struct ty_sampling_params p = {.temperature = 0.8f, .top_p = 0.95f, .seed = 1,
                                   .repetition_penalty = 1.1f, .penalty_last_n = HIST,
                                   .n_logprobs = 5};
    for (uint32_t i = 0; i < b; i++) {
        p.seed = i + 1;
        int rc = ty_sampler_new(&g_samp[i], &p, V);
        if (rc)
            return rc;
        memset(g_hist[i], 0, sizeof(g_hist[i]));
    }
    g_n_hist = 0;
    return 0;
}

/* One decode step for b sequences. */
static int step(ty_engine_t *e, ty_kvseq_t **seqs, uint32_t *tok, uint32_t b, float *logits,
                uint32_t V, enum mode mode)
{
    struct ty_batch_seq bs[MAX_B];
    uint32_t next[MAX_B];
    static struct ty_row_draw draws[MAX_B];
    static struct ty_sample samples[MAX_B];
    static struct ty_logit_adj adj[MAX_B * HIST];
    for (uint32_t i = 0; i < b; i++)
        bs[i] = (struct ty_batch_seq){seqs[i], &tok[i], 1, false};
    struct ty_batch batch = {.seqs = bs, .n_seqs = b, .ids = mode == IDS ? next : NULL};
    uint32_t nh = g_n_hist < HIST ? (uint32_t)g_n_hist : HIST, used = 0;
    if (mode == DRAWS) { /* prepared on the host as a batcher step does */
        for (uint32_t i = 0; i < b; i++) {
            uint32_t n_adj = 0;
            int rc = ty_sampler_prepare(g_samp[i], g_hist[i], nh, &draws[i], adj + used, HIST,
                                        &n_adj);
            if (rc)
                return rc;
            draws[i].adj_begin = used;
            used += n_adj;
        }
        batch.draws = draws;
        batch.adj = adj;
        batch.samples = samples;
    }
    uint64_t t0 = ty_clock_ns();
    int rc = ty_engine_forward(e, &batch, logits);
    g_forward_ns += ty_clock_ns() - t0;
    for (uint32_t i = 0; !rc && i < b; i++) {
        if (mode == HOSTDRAW)
            rc = ty_sampler_sample(g_samp[i], logits + (size_t)i * V, g_hist[i], nh, &samples[i]);
        tok[i] = mode == IDS     ? next[i]
                 : mode == ROWS ? argmax(logits + (size_t)i * V, V)
                                : samples[i].id;
        g_hist[i][g_n_hist % HIST] = tok[i]; /* (a ring: the window's order does not matter) */
    }
    g_n_hist++;
    return rc;
}

static int prefill(ty_engine_t *e, ty_kvseq_t **seqs, uint32_t b, uint32_t P, float *logits)
{
    uint32_t *prompt = malloc((size_t)P * sizeof(uint32_t));
    struct ty_batch_seq bs[MAX_B];
    int rc = prompt ? 0 : TY_ENOMEM;
    for (uint32_t i = 0; !rc && i < P; i++)
        prompt[i] = i == 0 ? 1 : 100 + (i * 7919u) % 20000u;
    for (uint32_t i = 0; !rc && i < b; i++) {
        rc = ty_kvpool_seq_new(ty_engine_pool(e), &seqs[i]);
        bs[i] = (struct ty_batch_seq){seqs[i], prompt, P, false};
    }
    struct ty_batch batch = {.seqs = bs, .n_seqs = b};
    if (!rc)
        rc = ty_engine_forward(e, &batch, logits);
    free(prompt);
    return rc;
}

/* tokens/s at batch b, or a negative TY_E*. */
static double run_batch(ty_engine_t *e, uint32_t b, const struct args *a, uint32_t V,
                        bool graphs, enum mode ids)
{
    ty_kvseq_t *seqs[MAX_B] = {0};
    uint32_t tok[MAX_B];
    float *logits = malloc((size_t)b * V * sizeof(float));
    int rc = logits ? prefill(e, seqs, b, a->prompt, logits) : TY_ENOMEM;
    if (!rc && ids >= DRAWS)
        rc = samplers_new(b, V);
    for (uint32_t i = 0; !rc && i < b; i++)
        tok[i] = argmax(logits + (size_t)i * V, V);
    for (int i = 0; !rc && i < WARM; i++)
        rc = step(e, seqs, tok, b, logits, V, ids);
    uint64_t t0 = ty_clock_ns();
    g_forward_ns = 0;
    for (uint32_t i = 0; !rc && i < a->steps; i++)
        rc = step(e, seqs, tok, b, logits, V, ids);
    double s = (double)(ty_clock_ns() - t0) / 1e9;
    if (!rc && ids == ROWS) {
        printf("# batch %u: %.3f ms per step, %.3f ms of it in ty_engine_forward (the rest: "
               "host argmax over %u x %u logits)\n",
               b, s * 1e3 / a->steps, g_forward_ns / 1e6 / a->steps, b, V);
        printf("RESULT decode_%s_b%u%s_forward_tok_s %.1f tok/s\n", a->tag, b,
               graphs ? "" : "_nograph", (double)b * a->steps / (g_forward_ns / 1e9));
    }
    for (uint32_t i = 0; i < b; i++) {
        ty_kvpool_seq_free(ty_engine_pool(e), seqs[i]);
        ty_sampler_free(g_samp[i]);
        g_samp[i] = NULL;
    }
    free(logits);
    return rc ? rc : (double)b * a->steps / s;
}

static int run_all(const ty_model_t *m, const struct args *a, bool graphs)
{
    uint32_t bmax = 0, V = ty_model_config(m)->n_vocab;
    char list[256];
    snprintf(list, sizeof(list), "%s", a->batches);
    for (char *t = strtok(list, ","); t; t = strtok(NULL, ","))
        bmax = (uint32_t)atoi(t) > bmax ? (uint32_t)atoi(t) : bmax;
    uint32_t ctx = a->prompt + WARM + a->steps + 1;
    struct ty_engine_opts o = {.max_seqs = bmax, .max_ctx = ctx, .max_batch_tokens = 2048,
                               .backend = "cuda", .cuda_weights = a->weights,
                               .cuda_no_graphs = !graphs, .no_prefix_sharing = true};
    ty_engine_t *e;
    int rc = ty_engine_new(&e, m, &o);
    if (rc) {
        fprintf(stderr, "bench_gpu_decode: engine: %s\n", ty_strerror(rc));
        return rc;
    }
    snprintf(list, sizeof(list), "%s", a->batches);
    for (char *t = strtok(list, ","); t && !rc; t = strtok(NULL, ",")) {
        uint32_t b = (uint32_t)atoi(t);
        double v = run_batch(e, b, a, V, graphs, ROWS);
        double w = v < 0 || !graphs ? 0 : run_batch(e, b, a, V, graphs, IDS);
        double dv = v < 0 || w < 0 || !graphs ? 0 : run_batch(e, b, a, V, graphs, DRAWS);
        double hv = v < 0 || w < 0 || dv < 0 || !graphs ? 0
                                                         : run_batch(e, b, a, V, graphs, HOSTDRAW);
        double bad = v < 0 ? v : w < 0 ? w : dv < 0 ? dv : hv < 0 ? hv : 0;
        if (bad < 0) {
            fprintf(stderr, "bench_gpu_decode: batch %u: %s\n", b, ty_strerror((int)bad));
            rc = (int)bad;
            break;
        }
        printf("RESULT decode_%s_b%u%s_tok_s %.1f tok/s\n", a->tag, b, graphs ? "" : "_nograph",
               v);
        if (graphs) {
            printf("RESULT decode_%s_b%u_ids_tok_s %.1f tok/s\n", a->tag, b, w);
            printf("RESULT decode_%s_b%u_ids_vs_rows %.3f ratio\n", a->tag, b, w / v);
            printf("RESULT decode_%s_b%u_draws_tok_s %.1f tok/s\n", a->tag, b, dv);
            printf("RESULT decode_%s_b%u_hostdraw_tok_s %.1f tok/s\n", a->tag, b, hv);
            printf("RESULT decode_%s_b%u_draws_vs_host %.3f ratio\n", a->tag, b, dv / hv);
        }
        fflush(stdout);
    }
    ty_engine_free(e);
    return rc;
}

static int parse(struct args *a, int argc, char **argv)
{
    *a = (struct args){.tag = "1b", .batches = "1,16,64", .prompt = 128, .steps = 64};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--compare-graphs"))
            a->compare_graphs = true;
        else if (v && !strcmp(argv[i], "--batches") && ++i)
            a->batches = v;
        else if (v && !strcmp(argv[i], "--prompt") && ++i)
            a->prompt = (uint32_t)atoi(v);
        else if (v && !strcmp(argv[i], "--steps") && ++i)
            a->steps = (uint32_t)atoi(v);
        else if (v && !strcmp(argv[i], "--tag") && ++i)
            a->tag = v;
        else if (v && !strcmp(argv[i], "--weights") && ++i)
            a->weights = v;
        else if (argv[i][0] != '-' && !a->model)
            a->model = argv[i];
        else
            return TY_EINVAL;
    }
    return a->model && a->prompt > 0 && a->steps > 0 ? 0 : TY_EINVAL;
}

int main(int argc, char **argv)
{
    struct args a;
    if (parse(&a, argc, argv)) {
        fprintf(stderr, "usage: bench_gpu_decode MODEL.gguf [--batches 1,16,64] [--prompt N] "
                        "[--steps N] [--tag T] [--weights W] [--compare-graphs]\n");
        return 2;
    }
    char err[256];
    ty_model_t *m;
    if (ty_model_load(&m, a.model, err, sizeof(err))) {
        fprintf(stderr, "bench_gpu_decode: %s\n", err);
        return 1;
    }
    printf("# %s, prompt %u, %u timed steps\n", ty_model_desc(m), a.prompt, a.steps);
    int rc = run_all(m, &a, true);
    if (!rc && a.compare_graphs)
        rc = run_all(m, &a, false);
    ty_model_free(m);
    return rc == TY_ENODEV ? 77 : rc ? 1 : 0;
}
