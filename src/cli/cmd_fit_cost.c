/* `tycho fit-cost`: the scheduler's cost model (tycho/sched.h) fitted from this machine's own
 * engine timings, in one command. Prefill calls of a range of prompt lengths (with and
 * without a cached half) and decode steps of a range of batch sizes and contexts run on the
 * engine as a node runs them (same threads, same chunk size); the non-negative least-squares
 * refit the live Conductor uses turns them into coefficients, printed with how well they
 * predict each sample, as a table or JSON, and written as a `cost:` section that `tycho sim
 * --config`, `tycho plan --config` and the Conductor's config accept. */
#include "cli.h"

#include "tycho/clock.h"
#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/kvpool.h"
#include "tycho/log.h"
#include "tycho/model.h"
#include "tycho/sched.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fit_args {
    const char *model, *out, *kv_dtype;
    uint32_t threads, max_prompt, max_batch, chunk, repeat, block_tokens;
    int json;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tycho fit-cost --model PATH [--threads N] [--max-prompt T] [--max-batch B]\n"
            "                      [--chunk-tokens C] [--repeat R] [--block-tokens K]\n"
            "                      [--kv-dtype auto|f32|f16|bf16] [--out FILE] [--json]\n"
            "\n"
            "Times prefill calls (16 tokens .. --max-prompt, whole and with half cached) and\n"
            "decode steps (1 .. --max-batch sequences at three contexts) on this machine's\n"
            "engine and fits the scheduler's cost model to them:\n"
            "  prefill(L, P) = c0 + c1 (L - P) + c2 (L^2 - P^2)      microseconds\n"
            "  step(B, C)    = d0 + d1 B + d2 C                       (C: context tokens)\n"
            "\n"
            "  --model PATH        GGUF file or Hugging Face directory\n"
            "  --threads N         engine threads, as the node will run (default 1)\n"
            "  --max-prompt T      longest prompt timed (default 1024, at most the context)\n"
            "  --max-batch B       largest decode batch timed (default 16)\n"
            "  --chunk-tokens C    tokens per forward call, as the node's chunk_tokens (512)\n"
            "  --repeat R          timings per point (default 2)\n"
            "  --block-tokens K    prefix-hash block of the traces to simulate (default 512)\n"
            "  --kv-dtype D        KV cache type, as the node's kv_cache_dtype (default auto)\n"
            "  --out FILE          write the `cost:` section (a sim spec) to FILE\n"
            "  --json              JSON instead of tables\n");
}

static int parse_args(int argc, char **argv, struct fit_args *a)
{
    static const struct option lo[] = {
        {"model", required_argument, NULL, 'm'},      {"threads", required_argument, NULL, 't'},
        {"max-prompt", required_argument, NULL, 'p'}, {"max-batch", required_argument, NULL, 'b'},
        {"chunk-tokens", required_argument, NULL, 'c'}, {"repeat", required_argument, NULL, 'r'},
        {"block-tokens", required_argument, NULL, 'k'}, {"kv-dtype", required_argument, NULL, 'd'},
        {"out", required_argument, NULL, 'o'},        {"json", no_argument, NULL, 'J'},
        {"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0}};
    *a = (struct fit_args){.threads = 1, .max_prompt = 1024, .max_batch = 16, .chunk = 512,
                           .repeat = 2, .block_tokens = 512};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "+", lo, NULL)) != -1) {
        char *end = NULL;
        unsigned long v = 0;
        if (c != 'm' && c != 'o' && c != 'd' && c != 'J' && c != 'h' && c != '?') {
            errno = 0;
            v = strtoul(optarg, &end, 10);
            if (errno || *end || optarg[0] == '-' || v == 0 || v > (1u << 20)) {
                fprintf(stderr, "tycho fit-cost: bad value '%s'\n", optarg);
                return TY_EINVAL;
            }
        }
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'o': a->out = optarg; break;
        case 'd': a->kv_dtype = optarg; break;
        case 'J': a->json = 1; break;
        case 't': a->threads = (uint32_t)(v < 256 ? v : 256); break;
        case 'p': a->max_prompt = (uint32_t)v; break;
        case 'b': a->max_batch = (uint32_t)(v < 256 ? v : 256); break;
        case 'c': a->chunk = (uint32_t)v; break;
        case 'r': a->repeat = (uint32_t)(v < 100 ? v : 100); break;
        case 'k': a->block_tokens = (uint32_t)(v < 65536 ? v : 65536); break;
        case 'h': return 1;
        default:
            fprintf(stderr, "tycho fit-cost: unknown option '%s'\n", argv[optind - 1]);
            return TY_EINVAL;
        }
    }
    if (optind != argc || !a->model || a->max_prompt < 32) {
        fprintf(stderr, "tycho fit-cost: needs --model (and --max-prompt of at least 32)\n");
        return TY_EINVAL;
    }
    return 0;
}

struct samples {
    struct ty_sched_sample *v;
    size_t n, cap;
};

static void add(struct samples *s, double x0, double x1, double us)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = realloc(s->v, s->cap * sizeof(*s->v));
        TY_ASSERT(s->v);
    }
    s->v[s->n++] = (struct ty_sched_sample){x0, x1, us};
}

struct bench {
    ty_engine_t *e;
    uint32_t *tokens; /* max_prompt + max_batch * 8 ids */
    float *logits;
    uint32_t vocab;
};

/* One forward call of seqs[i] taking n[i] new tokens each (ids from the bench's list, offset
 * by start[i]); microseconds. */
static int timed(struct bench *b, ty_kvseq_t **seqs, const uint32_t *start, const uint32_t *n,
                 uint32_t k, double *us)
{
    struct ty_batch_seq bs[256];
    for (uint32_t i = 0; i < k; i++)
        bs[i] = (struct ty_batch_seq){seqs[i], b->tokens + start[i], n[i], false};
    struct ty_batch batch = {.seqs = bs, .n_seqs = k};
    uint64_t t0 = ty_clock_ns();
    int rc = ty_engine_forward(b->e, &batch, b->logits);
    *us = (double)(ty_clock_ns() - t0) / 1e3;
    return rc;
}

static int free_all(struct bench *b, ty_kvseq_t **seqs, uint32_t k, int rc)
{
    for (uint32_t i = 0; i < k; i++)
        if (seqs[i])
            ty_kvpool_seq_free(ty_engine_pool(b->e), seqs[i]);
    return rc;
}

/* Prefill: a fresh sequence of L tokens; and L tokens after a cached L/2 (x0 = L/2). */
static int time_prefill(struct bench *b, const struct fit_args *a, struct samples *s)
{
    uint32_t lens[64], n = 0;
    for (uint32_t L = 16; L < a->max_prompt && n < 63; L = L * 3 / 2)
        lens[n++] = L; /* x1.5 steps, then max_prompt itself */
    lens[n++] = a->max_prompt;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t L = lens[k];
        for (uint32_t r = 0; r < a->repeat; r++) {
            for (int cached = 0; cached < 2; cached++) {
                ty_kvseq_t *q = NULL;
                int rc = ty_kvpool_seq_new(ty_engine_pool(b->e), &q);
                if (rc < 0)
                    return rc;
                uint32_t p = cached ? L / 2 : 0, zero = 0, len = L - p;
                double us;
                if (p && (rc = timed(b, &q, &zero, &p, 1, &us)) < 0)
                    return free_all(b, &q, 1, rc);
                if ((rc = timed(b, &q, &p, &len, 1, &us)) < 0)
                    return free_all(b, &q, 1, rc);
                add(s, (double)L - p, (double)L * L - (double)p * p, us);
                free_all(b, &q, 1, 0);
            }
        }
        if (isatty(2))
            fprintf(stderr, "\rtycho fit-cost: prefill %u tokens done   ", L);
    }
    if (isatty(2))
        fprintf(stderr, "\n");
    return 0;
}

/* Decode: B sequences of context c each (prefilled untimed), then timed steps. */
static int time_decode(struct bench *b, const struct fit_args *a, struct samples *s)
{
    /* contexts far apart, so that the per-sequence and per-context-token terms separate even
     * when the machine is noisy (B and B * C move together at one context) */
    uint32_t ctxs[3] = {16, a->max_prompt / 4 > 16 ? a->max_prompt / 4 : 16,
                        a->max_prompt >= 64 ? a->max_prompt - 32 : a->max_prompt};
    for (uint32_t B = 1; B <= a->max_batch; B = B < 4 ? B + 1 : B * 2) {
        for (int ci = 0; ci < 3; ci++) {
            ty_kvseq_t *q[256] = {0};
            uint32_t start[256], n[256];
            int rc = 0;
            for (uint32_t i = 0; i < B && rc == 0; i++) {
                rc = ty_kvpool_seq_new(ty_engine_pool(b->e), &q[i]);
                start[i] = i; /* different prompts: nothing shared */
                n[i] = ctxs[ci];
                double us;
                if (rc == 0)
                    rc = timed(b, &q[i], &start[i], &n[i], 1, &us);
            }
            for (uint32_t step = 0; step < 2 + 2 * a->repeat && rc == 0; step++) {
                for (uint32_t i = 0; i < B; i++) {
                    start[i] = ctxs[ci] + step + i;
                    n[i] = 1;
                }
                double us;
                rc = timed(b, q, start, n, B, &us);
                if (rc == 0 && step >= 2) /* the first two warm the batch's buffers */
                    add(s, B, (double)B * (ctxs[ci] + step), us);
            }
            free_all(b, q, B, 0);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* Mean |predicted - measured| / measured over the samples, and the worst. */
static void fit_error(const double k[3], const struct samples *s, double *mean, double *worst)
{
    *mean = *worst = 0;
    for (size_t i = 0; i < s->n; i++) {
        const struct ty_sched_sample *x = &s->v[i];
        double pred = k[0] + k[1] * x->x0 + k[2] * x->x1;
        double e = fabs(pred - x->us) / x->us;
        *mean += e / (double)s->n;
        *worst = fmax(*worst, e);
    }
}

static void write_cost(FILE *f, const struct ty_sched_cost *c, const struct fit_args *a)
{
    fprintf(f, "# tycho fit-cost --model %s --threads %u --chunk-tokens %u: this machine's engine\n"
               "cost:\n  prefill: [%.6g, %.6g, %.6g]\n  decode: [%.6g, %.6g, %.6g]\n"
               "  kv_bytes_per_token: %.0f\n  block_tokens: %u\n",
            a->model, a->threads, a->chunk, c->prefill[0], c->prefill[1], c->prefill[2],
            c->decode[0], c->decode[1], c->decode[2], c->kv_bytes_per_token, c->block_tokens);
}

static int run_fit_cost(int argc, char **argv)
{
    struct fit_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc == 1) {
        usage(stdout);
        return TY_CLI_EXIT_OK;
    }
    if (rc < 0) {
        usage(stderr);
        return TY_CLI_EXIT_USAGE;
    }
    char err[512];
    ty_model_t *m;
    if ((rc = ty_model_load(&m, a.model, err, sizeof(err))) < 0) {
        fprintf(stderr, "tycho fit-cost: %s\n", err);
        return TY_CLI_EXIT_FAIL;
    }
    const struct ty_model_config *mc = ty_model_config(m);
    if (mc->ctx_len && a.max_prompt + 64 > mc->ctx_len)
        a.max_prompt = mc->ctx_len > 96 ? mc->ctx_len - 64 : 32;
    struct ty_engine_opts eo = {.n_threads = a.threads, .max_seqs = a.max_batch,
                                .max_ctx = a.max_prompt + 64, .max_batch_tokens = a.chunk,
                                .no_prefix_sharing = true, .kv_dtype = a.kv_dtype};
    struct bench b = {.vocab = mc->n_vocab};
    int exit_code = TY_CLI_EXIT_FAIL;
    if ((rc = ty_engine_new(&b.e, m, &eo)) < 0) {
        fprintf(stderr, "tycho fit-cost: engine: %s\n", ty_strerror(rc));
        ty_model_free(m);
        return TY_CLI_EXIT_FAIL;
    }
    uint32_t nt = a.max_prompt + a.max_batch * 8 + 64;
    b.tokens = malloc(nt * sizeof(uint32_t));
    b.logits = malloc((size_t)b.vocab * a.max_batch * sizeof(float));
    struct samples ps = {0}, ds = {0};
    if (!b.tokens || !b.logits)
        goto out;
    for (uint32_t i = 0; i < nt; i++) /* ordinary ids, away from the special ones */
        b.tokens[i] = b.vocab > 300 ? 100 + (i * 7919u) % (b.vocab - 200) : i % b.vocab;
    fprintf(stderr, "tycho fit-cost: timing prefill (16 .. %u tokens) ...\n", a.max_prompt);
    if ((rc = time_prefill(&b, &a, &ps)) < 0)
        goto fail;
    fprintf(stderr, "tycho fit-cost: timing decode (1 .. %u sequences) ...\n", a.max_batch);
    if ((rc = time_decode(&b, &a, &ds)) < 0)
        goto fail;
    struct ty_sched_cost c = {0};
    c.block_tokens = a.block_tokens;
    ty_kvpool_t *pool = ty_engine_pool(b.e);
    c.kv_bytes_per_token =
        2.0 * mc->n_layers * (double)ty_kvpool_page_bytes(pool) / ty_kvpool_block_tokens(pool);
    c.net_bytes_per_us = 1e3; /* (not measured here: 1 GB/s, the Conductor's default) */
    if ((rc = ty_sched_cost_refit_prefill(&c, ps.v, ps.n)) < 0 ||
        (rc = ty_sched_cost_refit_decode(&c, ds.v, ds.n)) < 0)
        goto fail;
    double pm, pw, dm, dw;
    fit_error(c.prefill, &ps, &pm, &pw);
    fit_error(c.decode, &ds, &dm, &dw);
    if (a.json) {
        printf("{\"model\": \"%s\", \"threads\": %u, \"chunk_tokens\": %u, "
               "\"prefill\": [%.6g, %.6g, %.6g], \"decode\": [%.6g, %.6g, %.6g], "
               "\"kv_bytes_per_token\": %.0f, \"prefill_samples\": %zu, \"decode_samples\": %zu, "
               "\"prefill_error_mean\": %.4f, \"prefill_error_worst\": %.4f, "
               "\"decode_error_mean\": %.4f, \"decode_error_worst\": %.4f}\n",
               a.model, a.threads, a.chunk, c.prefill[0], c.prefill[1], c.prefill[2],
               c.decode[0], c.decode[1], c.decode[2], c.kv_bytes_per_token, ps.n, ds.n, pm, pw,
               dm, dw);
    } else {
        printf("%-8s %12s %14s %16s %8s %10s %10s\n", "", "fixed us", "us/token|seq",
               "us/token^2|ctx", "samples", "err mean", "err worst");
        printf("%-8s %12.1f %14.4f %16.6g %8zu %9.1f%% %9.1f%%\n", "prefill", c.prefill[0],
               c.prefill[1], c.prefill[2], ps.n, 100 * pm, 100 * pw);
        printf("%-8s %12.1f %14.4f %16.6g %8zu %9.1f%% %9.1f%%\n", "decode", c.decode[0],
               c.decode[1], c.decode[2], ds.n, 100 * dm, 100 * dw);
        printf("\n");
        write_cost(stdout, &c, &a);
    }
    if (a.out) {
        FILE *f = fopen(a.out, "w");
        if (!f || (write_cost(f, &c, &a), fclose(f)) != 0) {
            fprintf(stderr, "tycho fit-cost: cannot write %s: %s\n", a.out, strerror(errno));
            goto out;
        }
        fprintf(stderr, "tycho fit-cost: wrote %s\n", a.out);
    }
    exit_code = TY_CLI_EXIT_OK;
    goto out;
fail:
    fprintf(stderr, "tycho fit-cost: %s\n", ty_strerror(rc));
out:
    free(ps.v);
    free(ds.v);
    free(b.tokens);
    free(b.logits);
    ty_engine_free(b.e);
    ty_model_free(m);
    return exit_code;
}

const struct ty_cli_command ty_cli_cmd_fit_cost = {
    "fit-cost", "fit the scheduler's cost model to this machine's engine timings", run_fit_cost};
