/* `tycho plan`: size a disaggregated cluster for a workload. From a trace (or an arrival rate
 * and prompt/answer lengths), SLOs and a node budget it searches, by effective request
 * capacity in the simulator (sim_capacity.h), the P:D split and prefill chunk size, then the
 * prefill nodes' cache size, then the admission mode; prints each stage's ranking (why the
 * choice won) and writes the cluster's YAML (conductor, prefill, decode) for check-config. */
#include "cli.h"
#include "sim_capacity.h"

#include "tycho/errors.h"
#include "tycho/hash.h"
#include "tycho/sim.h"
#include "tycho/sim_config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct range {
    uint32_t lo, hi;
};

struct plan_args {
    const char *trace, *config, *out, *secret, *model, *conductor;
    double rate, ttft_s, tbt_ms, target;
    unsigned nodes, requests, shared_prefix;
    struct range in, outlen;
    uint64_t seed;
    char chunks[512], caches[512];
    int json, jobs;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tycho plan --nodes N --ttft-slo S --tbt-slo MS (--trace FILE | --rate R\n"
            "                  --input TOKENS[-TOKENS] --output TOKENS[-TOKENS]) [options]\n"
            "\n"
            "Recommends, by effective request capacity in the simulator, the prefill:decode\n"
            "split of N nodes, the prefill chunk size, the cache per prefill node and the\n"
            "admission mode; prints the runner-ups of each choice; writes the cluster's YAML.\n"
            "\n"
            "  --trace FILE          Mooncake-format trace (its rate is the workload's)\n"
            "  --rate R              or a workload: R requests/s (Poisson arrivals) ...\n"
            "  --requests N          ... N of them (default 2000; more, up to 40000, when that\n"
            "                        lasts under 5 request lifetimes at the capacity found)\n"
            "  --input A[-B]         ... prompt tokens, uniform in [A, B] ...\n"
            "  --output A[-B]        ... answer tokens, uniform in [A, B] ...\n"
            "  --shared-prefix T     ... the first T prompt tokens shared by all (default 0)\n"
            "  --seed N              workload seed (default 1)\n"
            "  --config FILE         sim spec (configs/sim/*.yaml): cost model, policy, base\n"
            "                        admission; --section.key=value overrides it\n"
            "  --nodes N             node budget (2..256)\n"
            "  --ttft-slo S          TTFT SLO, seconds\n"
            "  --tbt-slo MS          TBT SLO, milliseconds\n"
            "  --target X            share of requests that meet both SLOs (default 0.9)\n"
            "  --chunks LIST         prefill chunk tokens to try (default 0,512,2048,8192;\n"
            "                        0: one whole prompt per forward call)\n"
            "  --cache-blocks LIST   cache blocks per prefill node to try (default: 1/8, 1/4,\n"
            "                        1/2 and all of what the workload's blocks need)\n"
            "  --out DIR             write conductor.yaml, prefill.yaml, decode.yaml there\n"
            "  --secret-file PATH    cluster_secret_file in them (default\n"
            "                        /etc/tycho/cluster.secret)\n"
            "  --model PATH          model_path in them (default\n"
            "                        /var/lib/tycho/models/model.gguf)\n"
            "  --conductor HOST:PORT the nodes' conductor_address (default\n"
            "                        conductor.internal:9000)\n"
            "  --jobs N              searches in parallel (default 2)\n"
            "  --json                JSON instead of tables\n");
}

static int parse_range(const char *s, struct range *r)
{
    char *end;
    errno = 0;
    unsigned long a = strtoul(s, &end, 10), b = a;
    if (*end == '-')
        b = strtoul(end + 1, &end, 10);
    if (errno || *end || s[0] == '-' || !a || b < a || b > (1u << 24))
        return TY_EINVAL;
    r->lo = (uint32_t)a;
    r->hi = (uint32_t)b;
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return errno || *end || end == s || !(*out >= lo && *out <= hi) ? TY_EINVAL : 0;
}

static int parse_args(int argc, char **argv, struct plan_args *a, char **overrides,
                      size_t *n_overrides)
{
    static const struct option lo[] = {
        {"trace", required_argument, NULL, 't'},   {"config", required_argument, NULL, 'c'},
        {"rate", required_argument, NULL, 'r'},    {"requests", required_argument, NULL, 'n'},
        {"input", required_argument, NULL, 'i'},   {"output", required_argument, NULL, 'o'},
        {"shared-prefix", required_argument, NULL, 'p'}, {"seed", required_argument, NULL, 's'},
        {"nodes", required_argument, NULL, 'N'},   {"ttft-slo", required_argument, NULL, 'T'},
        {"tbt-slo", required_argument, NULL, 'B'}, {"target", required_argument, NULL, 'g'},
        {"chunks", required_argument, NULL, 'k'},  {"cache-blocks", required_argument, NULL, 'C'},
        {"out", required_argument, NULL, 'O'},     {"secret-file", required_argument, NULL, 'S'},
        {"model", required_argument, NULL, 'm'},   {"conductor", required_argument, NULL, 'A'},
        {"jobs", required_argument, NULL, 'j'},    {"json", no_argument, NULL, 'J'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    memset(a, 0, sizeof(*a));
    a->requests = 2000;
    a->seed = 1;
    a->jobs = 2;
    a->target = 0.9;
    a->secret = "/etc/tycho/cluster.secret";
    a->model = "/var/lib/tycho/models/model.gguf";
    a->conductor = "conductor.internal:9000";
    optind = 1;
    opterr = 0;
    int c;
    double d;
    while ((c = getopt_long(argc, argv, "+", lo, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 't': a->trace = optarg; break;
        case 'c': a->config = optarg; break;
        case 'O': a->out = optarg; break;
        case 'S': a->secret = optarg; break;
        case 'm': a->model = optarg; break;
        case 'A': a->conductor = optarg; break;
        case 'J': a->json = 1; break;
        case 'r': rc = parse_double(optarg, 1e-6, 1e6, &a->rate); break;
        case 'T': rc = parse_double(optarg, 1e-3, 1e6, &a->ttft_s); break;
        case 'B': rc = parse_double(optarg, 1e-3, 1e6, &a->tbt_ms); break;
        case 'g': rc = parse_double(optarg, 0.01, 1, &a->target); break;
        case 'n':
            rc = parse_double(optarg, 1, 1e6, &d);
            a->requests = (unsigned)d;
            break;
        case 'N':
            rc = parse_double(optarg, 2, 256, &d);
            a->nodes = (unsigned)d;
            break;
        case 'p':
            rc = parse_double(optarg, 0, 1 << 24, &d);
            a->shared_prefix = (unsigned)d;
            break;
        case 's':
            rc = parse_double(optarg, 0, 1e18, &d);
            a->seed = (uint64_t)d;
            break;
        case 'j':
            rc = parse_double(optarg, 1, 64, &d);
            a->jobs = (int)d;
            break;
        case 'i': rc = parse_range(optarg, &a->in); break;
        case 'o': rc = parse_range(optarg, &a->outlen); break;
        case 'k':
        case 'C': {
            char *dst = c == 'k' ? a->chunks : a->caches;
            if (strlen(optarg) >= sizeof(a->chunks))
                rc = TY_EINVAL;
            else
                strcpy(dst, optarg);
            break;
        }
        case 'h': return 1;
        default: {
            const char *arg = argv[optind - 1];
            if (strncmp(arg, "--", 2) == 0 && strchr(arg, '.') && strchr(arg, '=') &&
                *n_overrides < 64) {
                overrides[(*n_overrides)++] = (char *)arg;
                break;
            }
            fprintf(stderr, "tycho plan: unknown option '%s'\n", arg);
            return TY_EINVAL;
        }
        }
        if (rc < 0) {
            fprintf(stderr, "tycho plan: bad value '%s'\n", optarg);
            return TY_EINVAL;
        }
    }
    if (optind != argc)
        return TY_EINVAL;
    bool workload = a->rate > 0 || a->in.lo || a->outlen.lo;
    if (!a->nodes || !(a->ttft_s > 0) || !(a->tbt_ms > 0) || (!a->trace == !workload) ||
        (workload && (!(a->rate > 0) || !a->in.lo || !a->outlen.lo))) {
        fprintf(stderr, "tycho plan: needs --nodes, --ttft-slo, --tbt-slo and either --trace or "
                        "--rate, --input and --output\n");
        return TY_EINVAL;
    }
    return 0;
}

/* A Mooncake-format trace of the described workload: Poisson arrivals, uniform lengths, the
 * shared prefix as the same leading block ids, every other block unique. */
static char *workload_trace(const struct plan_args *a, uint32_t block_tokens, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    uint64_t state = a->seed * 0x9e3779b97f4a7c15ull + 1, next_id = 1u << 20;
    double t_ms = 0;
    uint32_t shared = a->shared_prefix / block_tokens;
    for (unsigned i = 0; buf && i < a->requests; i++) {
        state = ty_hash_mix64(state + 1);
        double u = ((double)(state >> 11) + 0.5) / 9007199254740992.0;
        if (i)
            t_ms += -log(u) / a->rate * 1e3;
        state = ty_hash_mix64(state + 1);
        uint32_t in = a->in.lo + (uint32_t)(state % (a->in.hi - a->in.lo + 1));
        state = ty_hash_mix64(state + 1);
        uint32_t out = a->outlen.lo + (uint32_t)(state % (a->outlen.hi - a->outlen.lo + 1));
        uint32_t blocks = (in + block_tokens - 1) / block_tokens;
        for (;;) {
            size_t need = n + 128 + (size_t)blocks * 12;
            if (need <= cap)
                break;
            cap = need * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
        n += (size_t)sprintf(buf + n, "{\"timestamp\": %.3f, \"input_length\": %u, "
                                      "\"output_length\": %u, \"hash_ids\": [", t_ms, in, out);
        for (uint32_t b = 0; b < blocks; b++)
            n += (size_t)sprintf(buf + n, "%s%llu", b ? ", " : "",
                                 (unsigned long long)(b < shared && (b + 1) * block_tokens <= in
                                                          ? b
                                                          : next_id++));
        n += (size_t)sprintf(buf + n, "]}\n");
    }
    *len = n;
    return buf;
}

static int list_u64(const char *s, uint64_t *out, size_t *n, uint64_t lo)
{
    char tmp[512], *save = NULL;
    snprintf(tmp, sizeof(tmp), "%s", s);
    *n = 0;
    for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(tok, &end, 10);
        if (errno || *end || tok[0] == '-' || v < lo || *n == TY_CAP_MAX_LIST)
            return TY_EINVAL;
        out[(*n)++] = v;
    }
    return *n ? 0 : TY_EINVAL;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* Distinct blocks of the trace: what caches must hold for every reuse to hit. */
static uint64_t distinct_blocks(const struct ty_sim_trace *t)
{
    uint64_t *v = malloc((t->n_blocks ? t->n_blocks : 1) * sizeof(*v));
    if (!v)
        return 0;
    memcpy(v, t->blocks, t->n_blocks * sizeof(*v));
    qsort(v, t->n_blocks, sizeof(*v), cmp_u64);
    uint64_t n = 0;
    for (size_t i = 0; i < t->n_blocks; i++)
        n += !i || v[i] != v[i - 1];
    free(v);
    return n;
}

/* ---- the search ---------------------------------------------------------------------------- */

struct plan {
    struct plan_args a;
    const ty_sim_spec_t *spec;
    const struct ty_sim_trace *t;
    struct ty_sim_opts base;
    double workload_rps;
    uint64_t distinct;
    struct ty_cap_study split, cache, adm[TY_SCHED_ADMIT_COUNT_];
    const struct ty_cap_run *best_split, *colocated, *best_cache, *best;
    enum ty_sched_admission best_adm;
};

static void study_init(const struct plan *p, struct ty_cap_study *st)
{
    memset(st, 0, sizeof(*st));
    st->nodes = p->a.nodes;
    st->ttft_s = p->a.ttft_s;
    st->tbt_ms[0] = p->a.tbt_ms;
    st->n_tbt = 1;
    st->co.target = p->a.target;
    st->jobs = p->a.jobs;
}

static void study_one(const struct plan *p, struct ty_cap_study *st, const struct ty_cap_run *r)
{
    study_init(p, st);
    st->no_colocated = true;
    st->splits[0][0] = r->prefill;
    st->splits[0][1] = r->decode;
    st->n_splits = 1;
    st->prefill_chunks[0] = r->chunk;
    st->n_prefill_chunks = 1;
}

static int search(struct plan *p)
{
    /* 1: every split with every prefill chunk size (and the colocated baseline) */
    struct ty_cap_study *st = &p->split;
    study_init(p, st);
    uint64_t v[TY_CAP_MAX_LIST];
    size_t n;
    if (list_u64(p->a.chunks[0] ? p->a.chunks : "0,512,2048,8192", v, &n, 0) < 0) {
        fprintf(stderr, "tycho plan: --chunks: a list of token counts (0, or >= 2)\n");
        return TY_EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if (v[i] == 1) {
            fprintf(stderr, "tycho plan: --chunks: a list of token counts (0, or >= 2)\n");
            return TY_EINVAL;
        }
    for (size_t i = 0; i < n; i++)
        st->prefill_chunks[i] = (uint32_t)(v[i] < (1u << 20) ? v[i] : 1u << 20);
    st->n_prefill_chunks = n;
    static const uint32_t coloc_chunks[] = {256, 512, 1024, 2048};
    memcpy(st->chunks, coloc_chunks, sizeof(coloc_chunks));
    st->n_chunks = 4;
    int rc = ty_cap_study_run(st, p->t, &p->base);
    if (rc < 0)
        return rc;
    p->best_split = ty_cap_best(st, 0, false, NULL);
    p->colocated = ty_cap_best(st, 0, true, NULL);
    /* 2: the cache per prefill node, at that split */
    st = &p->cache;
    study_one(p, st, p->best_split);
    if (p->a.caches[0]) {
        if (list_u64(p->a.caches, st->cache_blocks, &st->n_cache_blocks, 0) < 0) {
            fprintf(stderr, "tycho plan: --cache-blocks: a list of block counts\n");
            return TY_EINVAL;
        }
    } else {
        uint64_t all = (p->distinct + p->best_split->prefill - 1) / p->best_split->prefill;
        all = all ? all : 1;
        for (int k = 3; k >= 0; k--)
            st->cache_blocks[st->n_cache_blocks++] = (all >> k) ? all >> k : 1;
    }
    if ((rc = ty_cap_study_run(st, p->t, &p->base)) < 0)
        return rc;
    /* the smallest cache within 2 % of the best: memory costs */
    const struct ty_cap_run *top = ty_cap_best(st, 0, false, NULL);
    p->best_cache = top;
    for (size_t i = 0; i < st->n_runs; i++) {
        const struct ty_cap_run *r = &st->runs[i];
        if (r->cap.rate_rps >= 0.98 * top->cap.rate_rps &&
            (r->cache_blocks ? r->cache_blocks : UINT64_MAX) <
                (p->best_cache->cache_blocks ? p->best_cache->cache_blocks : UINT64_MAX))
            p->best_cache = r;
    }
    /* 3: the admission mode, with all of that */
    p->best = p->best_cache;
    p->best_adm = p->base.sched.admission;
    for (int m = 0; m < TY_SCHED_ADMIT_COUNT_; m++) {
        st = &p->adm[m];
        study_one(p, st, p->best_cache);
        st->cache_blocks[0] = p->best_cache->cache_blocks;
        st->n_cache_blocks = 1;
        struct ty_sim_opts o = p->base;
        o.sched.admission = (enum ty_sched_admission)m;
        if ((rc = ty_cap_study_run(st, p->t, &o)) < 0)
            return rc;
        const struct ty_cap_run *r = &st->runs[0];
        if (r->cap.rate_rps > p->best->cap.rate_rps * 1.0001 ||
            (m == (int)p->base.sched.admission && r->cap.rate_rps >= p->best->cap.rate_rps)) {
            p->best = r;
            p->best_adm = (enum ty_sched_admission)m;
        }
    }
    return 0;
}

/* ---- reports ------------------------------------------------------------------------------- */

static double cache_gib(const struct plan *p, uint64_t blocks)
{
    return (double)blocks * p->base.truth.block_tokens * p->base.truth.kv_bytes_per_token /
           (1024.0 * 1024 * 1024);
}

static int by_capacity(const void *x, const void *y)
{
    const struct ty_cap_run *a = *(const struct ty_cap_run *const *)x;
    const struct ty_cap_run *b = *(const struct ty_cap_run *const *)y;
    return a->cap.rate_rps > b->cap.rate_rps ? -1 : a->cap.rate_rps < b->cap.rate_rps;
}

/* The disaggregated runs of a study, best first, in *out (malloc'd, the caller frees; NULL
 * and 0 when out of memory). */
static size_t ranked(const struct ty_cap_study *st, const struct ty_cap_run ***outp)
{
    size_t n = 0;
    const struct ty_cap_run **out = malloc((st->n_runs ? st->n_runs : 1) * sizeof(*out));
    *outp = out;
    if (!out)
        return 0;
    for (size_t i = 0; i < st->n_runs; i++)
        if (!st->runs[i].colocated)
            out[n++] = &st->runs[i];
    qsort(out, n, sizeof(*out), by_capacity);
    return n;
}

/* A prefill chunk as the tables show it (0: whole prompts). Static buffer: one at a time. */
static const char *chunk_name(uint32_t chunk)
{
    static char buf[16];
    if (!chunk)
        return "whole";
    snprintf(buf, sizeof(buf), "%u", chunk);
    return buf;
}

static void print_tables(const struct plan *p)
{
    const struct ty_cap_run *b = p->best;
    printf("Workload: %s, %zu requests, %.3f req/s; %.0f%% must meet TTFT <= %g s and TBT <= %g "
           "ms; %u nodes; cost profile %s\n\n",
           p->a.trace ? p->a.trace : "generated", p->t->n, p->workload_rps, 100 * p->a.target,
           p->a.ttft_s, p->a.tbt_ms, p->a.nodes, ty_sim_spec_profile(p->spec));
    char cache[64] = "unlimited";
    if (b->cache_blocks)
        snprintf(cache, sizeof(cache), "%llu blocks (%.1f GiB of KV)",
                 (unsigned long long)b->cache_blocks, cache_gib(p, b->cache_blocks));
    printf("Recommended: %u prefill + %u decode nodes, prefill chunk %s, cache %s per "
           "prefill node, admission %s\n",
           b->prefill, b->decode,
           b->chunk ? chunk_name(b->chunk) : "none (one whole prompt per call)", cache,
           ty_sched_admission_name(p->best_adm));
    printf("  capacity %.3f req/s = %.2fx the workload's rate%s; colocated on %u nodes (best "
           "chunk %u): %.3f req/s\n\n",
           b->cap.rate_rps, p->workload_rps > 0 ? b->cap.rate_rps / p->workload_rps : 0,
           b->cap.rate_rps < p->workload_rps ? " (TOO SMALL: more nodes or looser SLOs)" : "",
           p->a.nodes, p->colocated ? p->colocated->chunk : 0,
           p->colocated ? p->colocated->cap.rate_rps : 0);
    const struct ty_cap_run **r;
    size_t n = ranked(&p->split, &r);
    printf("1. split and prefill chunk (the best 8 of %zu)\n%4s  %-9s %7s %10s %7s\n", n, "rank",
           "P:D", "chunk", "req/s", "of best");
    for (size_t i = 0; i < n && i < 8; i++)
        printf("%4zu  %3u:%-5u %7s %10.3f %6.0f%%\n", i + 1, r[i]->prefill, r[i]->decode,
               chunk_name(r[i]->chunk), r[i]->cap.rate_rps,
               r[0]->cap.rate_rps > 0 ? 100 * r[i]->cap.rate_rps / r[0]->cap.rate_rps : 0);
    free(r);
    n = ranked(&p->cache, &r);
    printf("\n2. cache per prefill node (the smallest within 2%% of the best wins)\n"
           "%12s %9s %10s %7s\n", "blocks", "GiB", "req/s", "of best");
    for (size_t i = 0; i < n; i++)
        printf("%12llu %9.1f %10.3f %6.0f%%\n", (unsigned long long)r[i]->cache_blocks,
               cache_gib(p, r[i]->cache_blocks), r[i]->cap.rate_rps,
               r[0]->cap.rate_rps > 0 ? 100 * r[i]->cap.rate_rps / r[0]->cap.rate_rps : 0);
    free(r);
    printf("\n3. admission\n%-10s %10s %8s %9s %9s\n", "mode", "req/s", "slo%", "ttft_p90",
           "tbt_p90");
    for (int m = 0; m < TY_SCHED_ADMIT_COUNT_; m++) {
        const struct ty_cap_run *x = &p->adm[m].runs[0];
        printf("%-10s %10.3f %8.1f %8.2fs %7.1fms\n",
               ty_sched_admission_name((enum ty_sched_admission)m), x->cap.rate_rps,
               100 * x->cap.attainment, x->cap.ttft_p90, 1e3 * x->cap.tbt_p90);
    }
}

static void json_candidates(const struct ty_cap_study *st, const char *name, bool last)
{
    const struct ty_cap_run **r;
    size_t n = ranked(st, &r);
    printf("{\"stage\": \"%s\", \"candidates\": [", name);
    for (size_t i = 0; i < n; i++)
        printf("%s{\"prefill_nodes\": %u, \"decode_nodes\": %u, \"prefill_chunk_tokens\": %u, "
               "\"cache_blocks_per_node\": %llu, \"capacity_rps\": %.4f}",
               i ? ", " : "", r[i]->prefill, r[i]->decode, r[i]->chunk,
               (unsigned long long)r[i]->cache_blocks, r[i]->cap.rate_rps);
    free(r);
    printf("]}%s", last ? "" : ", ");
}

static void print_json(const struct plan *p)
{
    const struct ty_cap_run *b = p->best;
    printf("{\"workload\": {\"requests\": %zu, \"rate_rps\": %.4f}, \"nodes\": %u, "
           "\"ttft_slo_s\": %g, \"tbt_slo_ms\": %g, \"target\": %g, ",
           p->t->n, p->workload_rps, p->a.nodes, p->a.ttft_s, p->a.tbt_ms, p->a.target);
    printf("\"recommendation\": {\"prefill_nodes\": %u, \"decode_nodes\": %u, "
           "\"prefill_chunk_tokens\": %u, \"cache_blocks_per_node\": %llu, "
           "\"cache_gib_per_node\": %.3f, \"admission\": \"%s\", \"capacity_rps\": %.4f, "
           "\"headroom\": %.4f}, ",
           b->prefill, b->decode, b->chunk, (unsigned long long)b->cache_blocks,
           cache_gib(p, b->cache_blocks), ty_sched_admission_name(p->best_adm),
           b->cap.rate_rps, p->workload_rps > 0 ? b->cap.rate_rps / p->workload_rps : 0);
    printf("\"colocated\": {\"chunk_tokens\": %u, \"capacity_rps\": %.4f}, \"stages\": [",
           p->colocated ? p->colocated->chunk : 0, p->colocated ? p->colocated->cap.rate_rps : 0);
    json_candidates(&p->split, "split", false);
    json_candidates(&p->cache, "cache", false);
    printf("{\"stage\": \"admission\", \"candidates\": [");
    for (int m = 0; m < TY_SCHED_ADMIT_COUNT_; m++)
        printf("%s{\"admission\": \"%s\", \"capacity_rps\": %.4f}", m ? ", " : "",
               ty_sched_admission_name((enum ty_sched_admission)m),
               p->adm[m].runs[0].cap.rate_rps);
    printf("]}]}\n");
}

/* ---- the cluster's YAML ------------------------------------------------------------------- */

static FILE *open_yaml(const char *dir, const char *name, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "tycho plan: cannot write %s: %s\n", path, strerror(errno));
    return f;
}

static void yaml_coeffs(FILE *f, const char *key, const double *c)
{
    fprintf(f, "  %s: [%.6g, %.6g, %.6g]\n", key, c[0], c[1], c[2]);
}

static int write_yaml(const struct plan *p)
{
    const struct ty_cap_run *b = p->best;
    const struct ty_sched_cost *c = &p->base.sched.cost;
    char path[4096], summary[256];
    if (mkdir(p->a.out, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "tycho plan: cannot create %s: %s\n", p->a.out, strerror(errno));
        return TY_EIO;
    }
    snprintf(summary, sizeof(summary),
             "# written by tycho plan: %u prefill + %u decode nodes, capacity %.3f req/s at "
             "%.0f%% within TTFT %g s / TBT %g ms\n",
             b->prefill, b->decode, b->cap.rate_rps, 100 * p->a.target, p->a.ttft_s,
             p->a.tbt_ms);
    FILE *f = open_yaml(p->a.out, "conductor.yaml", path, sizeof(path));
    if (!f)
        return TY_EIO;
    const char *model = strrchr(p->a.model, '/') ? strrchr(p->a.model, '/') + 1 : p->a.model;
    fprintf(f, "# role: conductor\n%scluster_secret_file: %s\nlisten_host: 127.0.0.1\n"
               "listen_port: 8000\nrpc_host: 0.0.0.0\nrpc_port: 9000\nmodel_path: %s\n"
               "scheduler:\n  policy: %s\n  admission: %s\n  models:\n    - name: \"%.*s\"\n"
               "      slo:\n        - {class: default, ttft: %.0fms, tbt: %.0fus}\ncost:\n"
               "  profile: %s\n",
            summary, p->a.secret, p->a.model, ty_sched_policy_name(p->base.sched.policy),
            ty_sched_admission_name(p->best_adm),
            (int)(strchr(model, '.') ? (size_t)(strchr(model, '.') - model) : strlen(model)),
            model, p->a.ttft_s * 1e3, p->a.tbt_ms * 1e3, ty_sim_spec_profile(p->spec));
    yaml_coeffs(f, "prefill", c->prefill);
    yaml_coeffs(f, "decode", c->decode);
    fprintf(f, "  net_gbytes_per_s: %.6g\n", c->net_bytes_per_us / 1e3);
    if (fclose(f) != 0)
        return TY_EIO;
    fprintf(stderr, "tycho plan: wrote %s\n", path);
    if (!(f = open_yaml(p->a.out, "prefill.yaml", path, sizeof(path))))
        return TY_EIO;
    fprintf(f, "# role: prefill\n%s# one per prefill machine: %u of them (name: prefill-0 .. "
               "prefill-%u)\ncluster_secret_file: %s\nconductor_address: %s\nlisten_port: 9100\n"
               "transfer_port: 9101\nmetrics_port: 9102\nmodel_path: %s\n",
            summary, b->prefill, b->prefill - 1, p->a.secret, p->a.conductor, p->a.model);
    if (b->chunk)
        fprintf(f, "chunk_tokens: %u\n", b->chunk);
    else /* one whole prompt per call: no other prompt joins it */
        fprintf(f, "chunk_tokens: 8192\nprefill_batch: 1\n");
    if (b->cache_blocks)
        fprintf(f, "kv_cache_memory: %.0fM   # %llu blocks of %u tokens\n",
                ceil(cache_gib(p, b->cache_blocks) * 1024), (unsigned long long)b->cache_blocks,
                p->base.truth.block_tokens);
    if (fclose(f) != 0)
        return TY_EIO;
    fprintf(stderr, "tycho plan: wrote %s\n", path);
    if (!(f = open_yaml(p->a.out, "decode.yaml", path, sizeof(path))))
        return TY_EIO;
    fprintf(f, "# role: decode\n%s# one per decode machine: %u of them (name: decode-0 .. "
               "decode-%u)\ncluster_secret_file: %s\nconductor_address: %s\nlisten_port: 9200\n"
               "transfer_port: 9201\nmetrics_port: 9202\nmodel_path: %s\n",
            summary, b->decode, b->decode - 1, p->a.secret, p->a.conductor, p->a.model);
    if (p->base.decode_max_batch)
        fprintf(f, "max_batch_size: %u\n", p->base.decode_max_batch);
    if (fclose(f) != 0)
        return TY_EIO;
    fprintf(stderr, "tycho plan: wrote %s\n", path);
    return 0;
}

static int run_plan(int argc, char **argv)
{
    struct plan p = {0};
    char *overrides[64];
    size_t n_over = 0;
    int rc = parse_args(argc, argv, &p.a, overrides, &n_over);
    if (rc == 1) {
        usage(stdout);
        return TY_CLI_EXIT_OK;
    }
    if (rc < 0) {
        usage(stderr);
        return TY_CLI_EXIT_USAGE;
    }
    char err[1024] = "";
    ty_sim_spec_t *spec;
    if ((rc = ty_sim_spec_load(&spec, p.a.config, overrides, n_over, &p.base, err,
                               sizeof(err))) < 0) {
        fprintf(stderr, "tycho plan: %s\n", err[0] ? err : ty_strerror(rc));
        return TY_CLI_EXIT_USAGE;
    }
    p.spec = spec;
    struct ty_sim_trace *t = NULL;
    int exit_code = TY_CLI_EXIT_FAIL;
    p.base.n_class_mix = 0;
    p.base.sched.n_classes = 1;
    p.base.speed = 1;
    if (p.base.prefill_batch < 2)
        p.base.prefill_batch = 8; /* tycho-prefill's default */
    p.base.prefill_interleave = true;
    for (int pass = 0; pass < 2; pass++) {
        if (p.a.trace) {
            rc = ty_sim_trace_load(&t, p.a.trace, err, sizeof(err));
        } else {
            size_t len;
            char *text = workload_trace(&p.a, p.base.truth.block_tokens, &len);
            rc = text ? ty_sim_trace_parse(&t, "workload", text, len, err, sizeof(err))
                      : TY_ENOMEM;
            free(text);
        }
        if (rc < 0) {
            fprintf(stderr, "tycho plan: %s\n", err[0] ? err : ty_strerror(rc));
            exit_code = rc == TY_EPARSE ? TY_CLI_EXIT_USAGE : TY_CLI_EXIT_FAIL;
            goto out;
        }
        p.t = t;
        p.workload_rps = ty_sim_trace_rate(t, 0);
        p.distinct = distinct_blocks(t);
        if ((rc = search(&p)) < 0) {
            fprintf(stderr, "tycho plan: %s\n", ty_strerror(rc));
            exit_code = rc == TY_EINVAL ? TY_CLI_EXIT_USAGE : TY_CLI_EXIT_FAIL;
            goto out;
        }
        /* A capacity is a steady state only if the replay at that rate lasts many request
         * lifetimes (TTFT + answer at the TBT SLO: 5 of them here); otherwise it measures how
         * large a burst the cluster absorbs. A generated workload is made long enough and
         * searched again. */
        double life_s = p.a.ttft_s + p.a.tbt_ms / 1e3 * (p.a.outlen.lo + p.a.outlen.hi) / 2.0;
        double need = p.best->cap.rate_rps * 5 * life_s * 1.2;
        if (p.a.trace || pass || (double)t->n >= need || t->n >= 40000)
            break;
        p.a.requests = need < 40000 ? (unsigned)need : 40000;
        fprintf(stderr, "tycho plan: %zu requests last %.0f s at the %.3f req/s found, under 5 "
                        "request lifetimes (%.0f s each): again with %u\n",
                t->n, (double)t->n / p.best->cap.rate_rps, p.best->cap.rate_rps, life_s,
                p.a.requests);
        ty_sim_trace_free(t);
        t = NULL;
        ty_cap_study_fini(&p.split);
        ty_cap_study_fini(&p.cache);
        for (int m = 0; m < TY_SCHED_ADMIT_COUNT_; m++)
            ty_cap_study_fini(&p.adm[m]);
    }
    if (p.a.json)
        print_json(&p);
    else
        print_tables(&p);
    exit_code = p.a.out && write_yaml(&p) < 0 ? TY_CLI_EXIT_FAIL : TY_CLI_EXIT_OK;
out:
    ty_cap_study_fini(&p.split);
    ty_cap_study_fini(&p.cache);
    for (int m = 0; m < TY_SCHED_ADMIT_COUNT_; m++)
        ty_cap_study_fini(&p.adm[m]);
    ty_sim_trace_free(t);
    ty_sim_spec_free(spec);
    return exit_code;
}

const struct ty_cli_command ty_cli_cmd_plan = {
    "plan", "recommend a cluster's P:D split, chunk, cache and admission for a workload", run_plan};
