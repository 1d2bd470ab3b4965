/* `tycho sim`: replay a Mooncake trace through the real scheduler against simulated prefill
 * nodes, decode nodes and KV caches, one run per policy x admission mode (or a sweep grid),
 * on up to --jobs threads. Prints a table (or --json) and can write gnuplot PNGs. */
#include "cli.h"
#include "tycho/errors.h"
#include "tycho/sim.h"
#include "tycho/sim_config.h"
#include "sim_capacity.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_LIST 64 /* items per grid list; more is a usage error */
#define MAX_OVERRIDES 64

struct job {
    struct ty_sim_opts o;
    char label[96];
    struct ty_sim_result r;
    int rc;
};

struct pool {
    const struct ty_sim_trace *t;
    struct job *jobs;
    size_t n;
    atomic_size_t next, done;
    bool tty;
};

struct args {
    const char *trace, *config, *plot;
    char policies[1024], admissions[128], ratios[1024], caps[1024], ttfts[1024], tbts[1024];
    char chunks[1024];
    double speed, target, judge_ttft_ms, judge_tbt_ms;
    size_t limit;
    unsigned nodes;
    int json, sweep, jobs, dump, capacity;
    char *overrides[MAX_OVERRIDES];
    size_t n_overrides;
    const ty_sim_spec_t *spec; /* class names for the report */
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tycho sim --trace FILE [--config FILE] [options] [--section.key=value ...]\n"
            "\n"
            "  --trace FILE        Mooncake-format trace (JSON lines)\n"
            "  --config FILE       cluster spec (configs/sim/*.yaml); flags override it\n"
            "  --policy LIST       random,round_robin,load_balance,cache_aware,kvcache_centric\n"
            "                      or 'all' (default: the config's)\n"
            "  --admission LIST    baseline,early,predicted or 'all' (default: the config's)\n"
            "  --speed X           replay speed (default: the config's, 1)\n"
            "  --limit N           first N requests only\n"
            "  --sweep             grid: policies x admissions x ratios x capacities x SLOs\n"
            "  --capacity          effective request capacity: for each TBT SLO, the highest\n"
            "                      arrival rate at which --target of the requests meet both\n"
            "                      SLOs, disaggregated (best P:D split of --nodes) against\n"
            "                      colocated (--nodes nodes, best of --chunks)\n"
            "  --nodes N           node budget for --capacity (default 16)\n"
            "  --chunks LIST       colocated tokens per step to try (default 256,512,1024,2048)\n"
            "  --target X          SLO attainment the capacity holds (default 0.9)\n"
            "  --goodput ttft:MS,tbt:MS  judge SLO attainment by these thresholds (as `tycho\n"
            "                      bench serve --goodput`), not the classes' (admission keeps them)\n"
            "  --ratios LIST       prefill:decode node counts, e.g. 8:8,10:6\n"
            "  --capacities LIST   cache blocks per prefill node (0: unlimited)\n"
            "  --ttft-slos LIST    TTFT SLOs in seconds for class 0 (--capacity: one, default\n"
            "                      the config's, else 30)\n"
            "  --tbt-slos LIST     TBT SLOs in milliseconds for class 0 (--capacity default:\n"
            "                      100,200,300)\n"
            "  --jobs N            simulations in parallel (default 2)\n"
            "  --plot DIR          write TTFT CDF and load-over-time PNGs (gnuplot) to DIR;\n"
            "                      --capacity: SLO attainment against rate, per TBT SLO\n"
            "  --json              JSON instead of a table\n"
            "  --dump-config       print the effective spec as YAML and exit\n");
}

/* Copy a list option; a list too long for the buffer is a usage error, never cut. */
static int copy_list(char *dst, size_t size, const char *src)
{
    size_t n = strlen(src);
    if (n >= size) {
        fprintf(stderr, "tycho sim: list option longer than %zu characters\n", size - 1);
        return TY_EINVAL;
    }
    memcpy(dst, src, n + 1);
    return 0;
}

static int parse_args(int argc, char **argv, struct args *a)
{
    static const struct option lo[] = {
        {"trace", required_argument, NULL, 't'},     {"config", required_argument, NULL, 'c'},
        {"policy", required_argument, NULL, 'p'},    {"admission", required_argument, NULL, 'a'},
        {"speed", required_argument, NULL, 's'},     {"limit", required_argument, NULL, 'l'},
        {"sweep", no_argument, NULL, 'S'},           {"ratios", required_argument, NULL, 'r'},
        {"capacities", required_argument, NULL, 'C'}, {"ttft-slos", required_argument, NULL, 'T'},
        {"tbt-slos", required_argument, NULL, 'B'},  {"capacity", no_argument, NULL, 'K'},
        {"nodes", required_argument, NULL, 'N'},     {"chunks", required_argument, NULL, 'k'},
        {"target", required_argument, NULL, 'g'},    {"goodput", required_argument, NULL, 'G'},
        {"jobs", required_argument, NULL, 'j'},      {"plot", required_argument, NULL, 'P'},
        {"json", no_argument, NULL, 'J'},            {"dump-config", no_argument, NULL, 'D'},
        {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0}};
    memset(a, 0, sizeof(*a));
    a->jobs = 2;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+", lo, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 't': a->trace = optarg; break;
        case 'c': a->config = optarg; break;
        case 'p':
            if (copy_list(a->policies, sizeof(a->policies), optarg))
                return TY_EINVAL;
            break;
        case 'a':
            if (copy_list(a->admissions, sizeof(a->admissions), optarg))
                return TY_EINVAL;
            break;
        case 'r':
            if (copy_list(a->ratios, sizeof(a->ratios), optarg))
                return TY_EINVAL;
            break;
        case 'C':
            if (copy_list(a->caps, sizeof(a->caps), optarg))
                return TY_EINVAL;
            break;
        case 'T':
            if (copy_list(a->ttfts, sizeof(a->ttfts), optarg))
                return TY_EINVAL;
            break;
        case 'B':
            if (copy_list(a->tbts, sizeof(a->tbts), optarg))
                return TY_EINVAL;
            break;
        case 'P': a->plot = optarg; break;
        case 'K': a->capacity = 1; break;
        case 'G': {
            char tmp[128], *save = NULL;
            snprintf(tmp, sizeof(tmp), "%s", optarg);
            for (char *w = strtok_r(tmp, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
                double *dst = !strncmp(w, "ttft:", 5) ? &a->judge_ttft_ms
                              : !strncmp(w, "tbt:", 4) ? &a->judge_tbt_ms : NULL;
                if (!dst || (*dst = strtod(strchr(w, ':') + 1, &end), *end) || !(*dst > 0))
                    return TY_EINVAL;
            }
            break;
        }
        case 'k':
            if (copy_list(a->chunks, sizeof(a->chunks), optarg))
                return TY_EINVAL;
            break;
        case 'N':
            a->nodes = (unsigned)strtoul(optarg, &end, 10);
            if (*end || a->nodes < 2 || a->nodes > 256)
                return TY_EINVAL;
            break;
        case 'g':
            a->target = strtod(optarg, &end);
            if (*end || !(a->target > 0 && a->target <= 1))
                return TY_EINVAL;
            break;
        case 'J': a->json = 1; break;
        case 'S': a->sweep = 1; break;
        case 'D': a->dump = 1; break;
        case 's':
            a->speed = strtod(optarg, &end);
            if (*end || !(a->speed > 0))
                return TY_EINVAL;
            break;
        case 'l':
            a->limit = strtoul(optarg, &end, 10);
            if (*end || optarg[0] == '-')
                return TY_EINVAL;
            break;
        case 'j':
            a->jobs = (int)strtol(optarg, &end, 10);
            if (*end || a->jobs < 1 || a->jobs > 64)
                return TY_EINVAL;
            break;
        case 'h': return 1;
        default: {
            const char *arg = argv[optind - 1];
            /* --section.key=value goes to the spec */
            if (strncmp(arg, "--", 2) == 0 && (strchr(arg, '.') || strchr(arg, '=')) &&
                a->n_overrides < MAX_OVERRIDES) {
                a->overrides[a->n_overrides++] = (char *)arg;
                break;
            }
            fprintf(stderr, "tycho sim: unknown option '%s'\n", arg);
            return TY_EINVAL;
        }
        }
    }
    return optind == argc ? 0 : TY_EINVAL;
}

/* Split a comma list into at most MAX_LIST items (modifies s); 0 when there are more, which
 * every caller turns into a usage error (a grid is never cut short silently). */
static size_t split(char *s, char **items)
{
    size_t n = 0;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        if (n == MAX_LIST) {
            fprintf(stderr, "tycho sim: a list holds more than %d items\n", MAX_LIST);
            return 0;
        }
        items[n++] = tok;
    }
    return n;
}

static int list_policies(char *s, enum ty_sched_policy dflt, enum ty_sched_policy *out, size_t *n)
{
    char *it[MAX_LIST];
    if (!s[0]) {
        out[0] = dflt;
        *n = 1;
        return 0;
    }
    if (strcmp(s, "all") == 0) {
        for (int i = 0; i < TY_SCHED_POLICY_COUNT_; i++)
            out[i] = (enum ty_sched_policy)i;
        *n = TY_SCHED_POLICY_COUNT_;
        return 0;
    }
    *n = split(s, it);
    for (size_t i = 0; i < *n; i++)
        if (ty_sched_policy_parse(it[i], &out[i]) < 0)
            return TY_EINVAL;
    return *n ? 0 : TY_EINVAL;
}

static int list_admissions(char *s, enum ty_sched_admission dflt, enum ty_sched_admission *out,
                           size_t *n)
{
    char *it[MAX_LIST];
    if (!s[0]) {
        out[0] = dflt;
        *n = 1;
        return 0;
    }
    if (strcmp(s, "all") == 0) {
        for (int i = 0; i < TY_SCHED_ADMIT_COUNT_; i++)
            out[i] = (enum ty_sched_admission)i;
        *n = TY_SCHED_ADMIT_COUNT_;
        return 0;
    }
    *n = split(s, it);
    for (size_t i = 0; i < *n; i++)
        if (ty_sched_admission_parse(it[i], &out[i]) < 0)
            return TY_EINVAL;
    return *n ? 0 : TY_EINVAL;
}

/* Numeric lists: ratios "P:D", capacities, TTFT seconds. Empty: one default entry. */
static int list_ratios(char *s, const struct ty_sim_opts *o, uint32_t (*out)[2], size_t *n)
{
    char *it[MAX_LIST];
    if (!s[0]) {
        out[0][0] = o->n_prefill;
        out[0][1] = o->n_decode;
        *n = 1;
        return 0;
    }
    *n = split(s, it);
    for (size_t i = 0; i < *n; i++) {
        unsigned p, d;
        char extra;
        if (sscanf(it[i], "%u:%u%c", &p, &d, &extra) != 2 || !p || !d || p + d > 256)
            return TY_EINVAL;
        out[i][0] = p;
        out[i][1] = d;
    }
    return *n ? 0 : TY_EINVAL;
}

static int list_doubles(char *s, double dflt, double *out, size_t *n)
{
    char *it[MAX_LIST];
    if (!s[0]) {
        out[0] = dflt;
        *n = 1;
        return 0;
    }
    *n = split(s, it);
    for (size_t i = 0; i < *n; i++) {
        char *end;
        errno = 0;
        out[i] = strtod(it[i], &end);
        if (errno || *end || end == it[i] || out[i] < 0)
            return TY_EINVAL;
    }
    return *n ? 0 : TY_EINVAL;
}

struct grid {
    enum ty_sched_policy pol[MAX_LIST];
    enum ty_sched_admission adm[MAX_LIST];
    uint32_t ratio[MAX_LIST][2];
    double cap[MAX_LIST], ttft[MAX_LIST], tbt[MAX_LIST];
    size_t np, na, nr, nc, nt, nb;
};

static int grid_build(struct args *a, const struct ty_sim_opts *base, struct grid *g)
{
    if (!a->sweep && (a->ratios[0] || a->caps[0] || a->ttfts[0] || a->tbts[0]))
        return TY_EINVAL; /* grid lists only with --sweep (or --capacity) */
    int rc = list_policies(a->policies, base->sched.policy, g->pol, &g->np);
    if (rc == 0)
        rc = list_admissions(a->admissions, base->sched.admission, g->adm, &g->na);
    if (rc == 0)
        rc = list_ratios(a->ratios, base, g->ratio, &g->nr);
    if (rc == 0)
        rc = list_doubles(a->caps, (double)base->cache_blocks, g->cap, &g->nc);
    if (rc == 0)
        rc = list_doubles(a->ttfts, (double)base->sched.slo[0].ttft_us / 1e6, g->ttft, &g->nt);
    if (rc == 0)
        rc = list_doubles(a->tbts, (double)base->sched.slo[0].tbt_us / 1e3, g->tbt, &g->nb);
    return rc;
}

static struct job *jobs_make(const struct grid *g, const struct ty_sim_opts *base, size_t *n)
{
    *n = g->np * g->na * g->nr * g->nc * g->nt * g->nb;
    struct job *jobs = calloc(*n, sizeof(*jobs));
    if (!jobs)
        return NULL;
    size_t k = 0;
    for (size_t r = 0; r < g->nr; r++)
        for (size_t c = 0; c < g->nc; c++)
            for (size_t t = 0; t < g->nt * g->nb; t++)
                for (size_t a = 0; a < g->na; a++)
                    for (size_t p = 0; p < g->np; p++) {
                        struct job *j = &jobs[k++];
                        j->o = *base;
                        j->o.sched.policy = g->pol[p];
                        j->o.sched.admission = g->adm[a];
                        j->o.n_prefill = g->ratio[r][0];
                        j->o.n_decode = g->ratio[r][1];
                        j->o.cache_blocks = (uint64_t)g->cap[c];
                        j->o.sched.slo[0].ttft_us = (uint64_t)(g->ttft[t / g->nb] * 1e6);
                        j->o.sched.slo[0].tbt_us = (uint64_t)(g->tbt[t % g->nb] * 1e3);
                        snprintf(j->label, sizeof(j->label), "%s/%s/%u:%u/%llu/%gs/%gms",
                                 ty_sched_policy_name(g->pol[p]), ty_sched_admission_name(g->adm[a]),
                                 g->ratio[r][0], g->ratio[r][1], (unsigned long long)g->cap[c],
                                 g->ttft[t / g->nb], g->tbt[t % g->nb]);
                    }
    return jobs;
}

static void progress(void *arg, size_t done, size_t total)
{
    fprintf(stderr, "\rtycho sim: %s %zu/%zu requests   ", (const char *)arg, done, total);
}

static void *worker(void *arg)
{
    struct pool *p = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n)
            return NULL;
        struct job *j = &p->jobs[i];
        if (p->tty && p->n == 1) {
            j->o.progress = progress;
            j->o.progress_arg = j->label;
        }
        j->rc = ty_sim_run(p->t, &j->o, &j->r);
        size_t d = atomic_fetch_add(&p->done, 1) + 1;
        fprintf(stderr, "%stycho sim: [%zu/%zu] %s: %s (%.2f s)\n", p->tty && p->n == 1 ? "\r" : "",
                d, p->n, j->label, j->rc < 0 ? ty_strerror(j->rc) : "done", j->r.wall_s);
    }
}

static int run_jobs(const struct ty_sim_trace *t, struct job *jobs, size_t n, int n_threads)
{
    struct pool p = {.t = t, .jobs = jobs, .n = n, .tty = isatty(2)};
    atomic_init(&p.next, 0);
    atomic_init(&p.done, 0);
    pthread_t th[64];
    int started = 0;
    if ((size_t)n_threads > n)
        n_threads = (int)n;
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&th[started], NULL, worker, &p) == 0)
            started++;
    worker(&p);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    for (size_t i = 0; i < n; i++)
        if (jobs[i].rc < 0)
            return jobs[i].rc;
    return 0;
}

/* Per class, when the trace was split over several (class_mix): requests, served, SLO%. */
static void print_class_table(const struct job *jobs, size_t n, const ty_sim_spec_t *spec)
{
    if (!n || jobs[0].o.n_class_mix < 2)
        return;
    printf("\n%-44s %-12s %8s %8s %6s %6s\n", "run", "class", "requests", "served", "slo%",
           "ttft");
    for (size_t i = 0; i < n; i++) {
        const struct ty_sim_result *r = &jobs[i].r;
        for (uint32_t k = 0; k < r->n_classes; k++) {
            const char *name = ty_sim_spec_class(spec, k);
            printf("%-44s %-12.12s %8zu %8zu %6.1f %5gs\n", k ? "" : jobs[i].label,
                   name ? name : "default", r->class_n[k], r->class_served[k],
                   r->class_n[k] ? 100.0 * (double)r->class_slo_met[k] / (double)r->class_n[k]
                                 : 0.0,
                   (double)jobs[i].o.sched.slo[k].ttft_us / 1e6);
        }
    }
}

static void print_table(const struct job *jobs, size_t n, const ty_sim_spec_t *spec)
{
    printf("%-44s %6s %6s %6s %8s %8s %8s %8s %7s %7s %6s %6s %6s %6s %6s %6s\n", "run",
           "served", "reject", "@dec", "ttft_avg", "ttft_p50", "ttft_p90", "ttft_p99", "tbt_avg",
           "tbt_p99", "slo%", "good/s", "hit%", "saved%", "pbusy%", "derr%");
    printf("%-44s %6s %6s %6s %8s %8s %8s %8s %7s %7s %6s %6s %6s %6s %6s %6s\n", "", "", "",
           "", "s", "s", "s", "s", "ms", "ms", "", "", "", "", "", "");
    for (size_t i = 0; i < n; i++) {
        const struct ty_sim_result *r = &jobs[i].r;
        double busy = r->duration_s > 0 && jobs[i].o.n_prefill
                          ? r->prefill_busy_s / ((double)jobs[i].o.n_prefill * r->duration_s)
                          : 0.0;
        /* derr%: the admission's picture of the decode batch, mean absolute error against
         * the batch the request found, in % of that batch ("-": nothing judged at arrival) */
        char derr[16] = "-";
        if (r->judged && r->landed_batch_mean > 0)
            snprintf(derr, sizeof(derr), "%.1f", 100 * r->judged_batch_err / r->landed_batch_mean);
        printf("%-44s %6zu %6zu %6zu %8.2f %8.2f %8.2f %8.2f %7.1f %7.1f %6.1f %6.2f %6.1f "
               "%6.1f %6.1f %6s\n",
               jobs[i].label, r->served, r->rejected, r->rejected_at_decode, r->ttft_mean,
               r->ttft_p50, r->ttft_p90, r->ttft_p99, r->tbt_mean * 1e3, r->tbt_p99 * 1e3,
               100 * r->slo_attainment, r->goodput_rps, 100 * r->cache_hit_rate,
               100 * r->compute_saved, 100 * busy, derr);
    }
    print_class_table(jobs, n, spec);
}

/* s as a JSON string (the trace path, class names from the config file). */
static void json_str(const char *s)
{
    putchar('"');
    for (const char *c = s; *c; c++)
        printf((*c == '"' || *c == '\\') ? "\\%c" : ((unsigned char)*c < 0x20 ? "?" : "%c"), *c);
    putchar('"');
}

/* Requests, served and SLO attainment of each class, when the trace was split over several. */
static void print_json_classes(const struct job *j, const ty_sim_spec_t *spec)
{
    const struct ty_sim_result *r = &j->r;
    printf("\"classes\": [");
    for (uint32_t k = 0; k < r->n_classes; k++) {
        const char *name = ty_sim_spec_class(spec, k);
        printf("%s{\"class\": ", k ? ", " : "");
        json_str(name ? name : "default");
        printf(", \"ttft_slo_s\": %g, \"tbt_slo_s\": %g, \"requests\": %zu, \"served\": %zu, "
               "\"slo_attainment\": %.4f}",
               (double)j->o.sched.slo[k].ttft_us / 1e6, (double)j->o.sched.slo[k].tbt_us / 1e6,
               r->class_n[k], r->class_served[k],
               r->class_n[k] ? (double)r->class_slo_met[k] / (double)r->class_n[k] : 0.0);
    }
    printf("], ");
}

static void print_json_job(const struct job *j, const ty_sim_spec_t *spec)
{
    const struct ty_sim_result *r = &j->r;
    const struct ty_sim_opts *o = &j->o;
    printf("{\"policy\": \"%s\", \"admission\": \"%s\", \"prefill_nodes\": %u, "
           "\"decode_nodes\": %u, \"cache_blocks_per_node\": %llu, \"ttft_slo_s\": %g, "
           "\"tbt_slo_s\": %g, \"speed\": %g, \"requests\": %zu, \"served\": %zu, "
           "\"rejected\": %zu, \"rejected_at_decode\": %zu, \"rejected_ttft\": %zu, "
           "\"rejected_tbt\": %zu, \"rejected_decode_full\": %zu, ",
           ty_sched_policy_name(o->sched.policy), ty_sched_admission_name(o->sched.admission),
           o->n_prefill, o->n_decode, (unsigned long long)o->cache_blocks,
           (double)o->sched.slo[0].ttft_us / 1e6, (double)o->sched.slo[0].tbt_us / 1e6, o->speed,
           r->n, r->served, r->rejected, r->rejected_at_decode,
           r->rejected_by[TY_SCHED_REJECT_TTFT], r->rejected_by[TY_SCHED_REJECT_TBT],
           r->rejected_by[TY_SCHED_REJECT_DECODE_FULL]);
    printf("\"ttft_s\": {\"mean\": %.4f, \"p50\": %.4f, \"p90\": %.4f, \"p99\": %.4f}, "
           "\"tbt_s\": {\"mean\": %.5f, \"p50\": %.5f, \"p90\": %.5f, \"p99\": %.5f}, "
           "\"slo_attainment\": %.4f, \"goodput_rps\": %.4f, \"cache_hit_rate\": %.4f, "
           "\"prefill_compute_saved\": %.4f, \"wasted_prefill_s\": %.2f, "
           "\"prefill_busy_s\": %.2f, \"prefill_utilization\": %.4f, "
           "\"simulated_s\": %.1f, \"wall_s\": %.3f, \"cpp_stages\": %u, "
           "\"cpp_threshold\": %llu, \"pipelined\": %zu, ",
           r->ttft_mean, r->ttft_p50, r->ttft_p90, r->ttft_p99, r->tbt_mean, r->tbt_p50,
           r->tbt_p90, r->tbt_p99, r->slo_attainment, r->goodput_rps, r->cache_hit_rate,
           r->compute_saved, r->wasted_prefill_s, r->prefill_busy_s,
           r->duration_s > 0 && o->n_prefill
               ? r->prefill_busy_s / ((double)o->n_prefill * r->duration_s)
               : 0.0,
           r->duration_s, r->wall_s, o->cpp.stages, (unsigned long long)r->cpp_threshold,
           r->pipelined);
    print_json_classes(j, spec);
    printf("\"decode_judged\": {\"requests\": %zu, \"batch_bias\": %.3f, \"batch_err\": %.3f, "
           "\"ctx_bias\": %.1f, \"ctx_err\": %.1f, \"landed_batch\": %.3f}}",
           r->judged, r->judged_batch_bias, r->judged_batch_err, r->judged_ctx_bias,
           r->judged_ctx_err, r->landed_batch_mean);
}

static void print_json(const char *trace, const struct job *jobs, size_t n,
                       const ty_sim_spec_t *spec)
{
    printf("{\"trace\": ");
    json_str(trace);
    printf(", \"runs\": [");
    for (size_t i = 0; i < n; i++) {
        printf(i ? ",\n  " : "\n  ");
        print_json_job(&jobs[i], spec);
    }
    printf("\n]}\n");
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* TTFT CDF data: one gnuplot index block per run ("s fraction"). */
static int write_cdf(const char *path, const struct job *jobs, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return ty_errno();
    for (size_t i = 0; i < n; i++) {
        const struct ty_sim_result *r = &jobs[i].r;
        double *v = malloc((r->n ? r->n : 1) * sizeof(*v));
        size_t m = 0;
        if (!v) {
            fclose(f);
            return TY_ENOMEM;
        }
        for (size_t k = 0; k < r->n; k++)
            if (!r->out[k].rejected)
                v[m++] = r->out[k].ttft_us / 1e6;
        qsort(v, m, sizeof(*v), cmp_d);
        fprintf(f, "# %s\n", jobs[i].label);
        size_t step = m > 2000 ? m / 2000 : 1;
        for (size_t k = 0; k < m; k += step)
            fprintf(f, "%.4f %.5f\n", v[k], (double)(k + 1) / (double)m);
        if (m)
            fprintf(f, "%.4f 1.0\n", v[m - 1]);
        fprintf(f, "\n\n");
        free(v);
    }
    return fclose(f) == 0 ? 0 : TY_EIO;
}

static int write_load(const char *path, const struct job *jobs, size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return ty_errno();
    for (size_t i = 0; i < n; i++) {
        const struct ty_sim_result *r = &jobs[i].r;
        fprintf(f, "# %s: t_s prefill_queue_s decode_batch in_flight\n", jobs[i].label);
        for (size_t k = 0; k < r->n_samples; k++)
            fprintf(f, "%.1f %.3f %.2f %u\n", r->samples[k].t_s, r->samples[k].prefill_queue_s,
                    r->samples[k].decode_batch, r->samples[k].in_flight);
        fprintf(f, "\n\n");
    }
    return fclose(f) == 0 ? 0 : TY_EIO;
}

static void gp_plot_list(FILE *g, const char *data, const struct job *jobs, size_t n,
                         const char *cols)
{
    fprintf(g, "plot ");
    for (size_t i = 0; i < n; i++)
        fprintf(g, "%s'%s' index %zu using %s with lines title '%s'", i ? ", " : "", data, i,
                cols, jobs[i].label);
    fprintf(g, "\n");
}

static int write_plots(const char *dir, const struct job *jobs, size_t n)
{
    char cdf[4096], load[4096], gp[4096], cmd[8192];
    snprintf(cdf, sizeof(cdf), "%s/ttft_cdf.dat", dir);
    snprintf(load, sizeof(load), "%s/load.dat", dir);
    snprintf(gp, sizeof(gp), "%s/plots.gp", dir);
    int rc = write_cdf(cdf, jobs, n);
    if (rc == 0)
        rc = write_load(load, jobs, n);
    FILE *g = rc == 0 ? fopen(gp, "w") : NULL;
    if (!g)
        return rc < 0 ? rc : ty_errno();
    fprintf(g, "set terminal pngcairo size 1000,600 noenhanced\nset key bottom right\n"
               "set grid\nset output '%s/ttft_cdf.png'\nset xlabel 'TTFT (s)'\n"
               "set ylabel 'fraction of served requests'\nset logscale x\n", dir);
    gp_plot_list(g, cdf, jobs, n, "1:2");
    fprintf(g, "unset logscale x\nset key top right\nset output '%s/prefill_load.png'\n"
               "set xlabel 'time (s)'\nset ylabel 'mean queued prefill work per node (s)'\n", dir);
    gp_plot_list(g, load, jobs, n, "1:2");
    fprintf(g, "set output '%s/decode_load.png'\nset ylabel 'mean decode batch per node'\n", dir);
    gp_plot_list(g, load, jobs, n, "1:3");
    fclose(g);
    snprintf(cmd, sizeof(cmd), "gnuplot '%s'", gp);
    if (system(cmd) != 0) {
        fprintf(stderr, "tycho sim: gnuplot failed; data and script are in %s\n", dir);
        return TY_EIO;
    }
    fprintf(stderr, "tycho sim: wrote %s/ttft_cdf.png, prefill_load.png, decode_load.png\n", dir);
    return 0;
}

static int simulate(struct args *a, const struct ty_sim_opts *base)
{
    struct grid g;
    if (grid_build(a, base, &g) < 0) {
        fprintf(stderr, "tycho sim: bad --policy/--admission/--ratios/--capacities/--ttft-slos "
                        "(grid lists need --sweep)\n");
        return TY_CLI_EXIT_USAGE;
    }
    char err[1024] = "";
    struct ty_sim_trace *t;
    int rc = ty_sim_trace_load(&t, a->trace, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "tycho sim: %s\n", err[0] ? err : ty_strerror(rc));
        return rc == TY_EPARSE ? TY_CLI_EXIT_USAGE : TY_CLI_EXIT_FAIL;
    }
    size_t n;
    struct job *jobs = jobs_make(&g, base, &n);
    int exit_code = TY_CLI_EXIT_FAIL;
    if (!jobs)
        goto out_trace;
    rc = run_jobs(t, jobs, n, a->jobs);
    if (rc < 0) {
        fprintf(stderr, "tycho sim: %s\n", ty_strerror(rc));
        goto out_jobs;
    }
    if (a->json)
        print_json(a->trace, jobs, n, a->spec);
    else
        print_table(jobs, n, a->spec);
    exit_code = TY_CLI_EXIT_OK;
    if (a->plot && write_plots(a->plot, jobs, n) < 0)
        exit_code = TY_CLI_EXIT_FAIL;
out_jobs:
    for (size_t i = 0; i < n; i++)
        ty_sim_result_fini(&jobs[i].r);
    free(jobs);
out_trace:
    ty_sim_trace_free(t);
    return exit_code;
}

/* Unsigned list items (chunk sizes), each in [1, 1 << 20]. */
static int list_uints(char *s, uint32_t *out, size_t *n)
{
    double v[MAX_LIST];
    if (list_doubles(s, 0, v, n) < 0)
        return TY_EINVAL;
    for (size_t i = 0; i < *n; i++) {
        if (!(v[i] >= 1 && v[i] <= (1 << 20)) || v[i] != (double)(uint32_t)v[i])
            return TY_EINVAL;
        out[i] = (uint32_t)v[i];
    }
    return 0;
}

/* --capacity: the study of sim_capacity.h over the trace. */
static int capacity(struct args *a, const struct ty_sim_opts *base)
{
    struct ty_cap_study st = {.nodes = a->nodes ? a->nodes : 16, .jobs = a->jobs,
                              .co = {.target = a->target}};
    double ttft[MAX_LIST], caps[MAX_LIST];
    size_t nt = 0, nc = 0;
    char dflt_tbt[] = "100,200,300", dflt_chunks[] = "256,512,1024,2048";
    int rc = list_doubles(a->tbts[0] ? a->tbts : dflt_tbt, 0, st.tbt_ms, &st.n_tbt);
    if (rc == 0)
        rc = list_doubles(a->ttfts, (double)base->sched.slo[0].ttft_us / 1e6, ttft, &nt);
    if (rc == 0)
        rc = list_uints(a->chunks[0] ? a->chunks : dflt_chunks, st.chunks, &st.n_chunks);
    if (rc == 0 && a->ratios[0])
        rc = list_ratios(a->ratios, base, st.splits, &st.n_splits);
    if (rc == 0 && a->caps[0])
        rc = list_doubles(a->caps, 0, caps, &nc);
    for (size_t i = 0; rc == 0 && i < st.n_splits; i++)
        if (st.splits[i][0] + st.splits[i][1] != st.nodes)
            rc = TY_EINVAL;
    if (rc < 0 || nt != 1 || a->policies[0] || a->admissions[0] || base->n_class_mix > 1) {
        fprintf(stderr, "tycho sim: --capacity takes --tbt-slos LIST, one --ttft-slos, "
                        "--chunks LIST, --capacities LIST and --ratios P:D whose nodes add up to "
                        "--nodes (the policy and admission are the config's; one SLO class)\n");
        return TY_CLI_EXIT_USAGE;
    }
    st.ttft_s = ttft[0] > 0 ? ttft[0] : 30;
    for (size_t i = 0; i < nc; i++)
        st.cache_blocks[i] = (uint64_t)caps[i];
    st.n_cache_blocks = nc;
    char err[1024] = "";
    struct ty_sim_trace *t;
    rc = ty_sim_trace_load(&t, a->trace, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "tycho sim: %s\n", err[0] ? err : ty_strerror(rc));
        return rc == TY_EPARSE ? TY_CLI_EXIT_USAGE : TY_CLI_EXIT_FAIL;
    }
    int exit_code = TY_CLI_EXIT_FAIL;
    rc = ty_cap_study_run(&st, t, base);
    if (rc < 0) {
        fprintf(stderr, "tycho sim: %s\n", ty_strerror(rc));
    } else {
        if (a->json)
            ty_cap_print_json(&st, a->trace, stdout);
        else
            ty_cap_print_table(&st, stdout);
        exit_code = a->plot && ty_cap_plot(&st, a->plot) < 0 ? TY_CLI_EXIT_FAIL : TY_CLI_EXIT_OK;
    }
    ty_cap_study_fini(&st);
    ty_sim_trace_free(t);
    return exit_code;
}

static int run_sim(int argc, char **argv)
{
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc == 1) {
        usage(stdout);
        return TY_CLI_EXIT_OK;
    }
    if (rc < 0 || (!a.trace && !a.dump) || (a.plot && strchr(a.plot, '\''))) {
        usage(stderr);
        return TY_CLI_EXIT_USAGE;
    }
    char err[1024] = "";
    struct ty_sim_opts base;
    ty_sim_spec_t *spec;
    rc = ty_sim_spec_load(&spec, a.config, a.overrides, a.n_overrides, &base, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "tycho sim: %s\n", err[0] ? err : ty_strerror(rc));
        return TY_CLI_EXIT_USAGE;
    }
    if (a.dump) {
        ty_sim_spec_dump(spec, stdout);
        ty_sim_spec_free(spec);
        return TY_CLI_EXIT_OK;
    }
    if (a.speed > 0)
        base.speed = a.speed;
    base.limit = a.limit;
    base.judge.ttft_us = (uint64_t)(a.judge_ttft_ms * 1e3);
    base.judge.tbt_us = (uint64_t)(a.judge_tbt_ms * 1e3);
    a.spec = spec;
    rc = a.capacity ? capacity(&a, &base) : simulate(&a, &base);
    ty_sim_spec_free(spec);
    return rc;
}

const struct ty_cli_command ty_cli_cmd_sim = {
    "sim", "replay a trace through the scheduler on a simulated cluster", run_sim};
