/* `tycho bench serve`: drive an OpenAI-compatible server like vLLM's `bench serve` and print
 * its result block (same labels). Requests are streamed completions (token-id prompts,
 * ignore_eos, max_tokens = the wanted output length) sent at a Poisson or fixed rate, or at
 * the Mooncake trace's timestamps, with at most --max-concurrency in flight. One thread per
 * request in flight, blocking sockets, HTTP/1.0 so the stream ends at the connection's close.
 * --count-only makes the client cheap enough for many streams to measure the server: token
 * events are counted and timed without parsing their JSON (only the usage event is parsed).
 */
#include "cli.h"

#include "tycho/clock.h"
#include "tycho/errors.h"

#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct breq {
    uint32_t *ids;
    uint32_t n_in, n_out_want;
    bool need_tokens; /* ignore_eos: an answer without tokens failed (with EOS it may be empty) */
    double arrival_s;
    /* results */
    bool ok;
    uint32_t n_out;
    double ttft, e2e, *itl;
    size_t n_itl;
};

struct bench {
    char host[256], port[16], endpoint[256], model[128];
    const char *dataset, *trace, *json_out;
    uint32_t n, in_len, out_len, vocab, max_conc;
    uint32_t trace_block; /* prompt tokens per trace hash id (the trace's own: 512) */
    uint32_t max_tokens; /* != 0: every request asks for up to this many, ending at EOS */
    json_t *extra;       /* --extra-body: members merged into every request (NULL: none) */
    double rate, goodput_ttft, goodput_tpot;
    double temperature, top_p; /* sent with every request (top_p 1: not sent) */
    bool count_only;           /* token events timed without parsing their JSON */
    uint64_t seed;
    struct breq *reqs;
    sem_t slots;
};

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s)
{
    return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

static int connect_to(const struct bench *b)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(b->host, b->port, &hints, &ai))
        return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

static char *request_body(const struct bench *b, const struct breq *r)
{
    json_t *ids = json_array();
    for (uint32_t i = 0; i < r->n_in; i++)
        json_array_append_new(ids, json_integer(r->ids[i]));
    json_t *o = json_pack("{s:o,s:i,s:b,s:b,s:f,s:{s:b}}", "prompt", ids, "max_tokens",
                          (json_int_t)r->n_out_want, "ignore_eos", !b->max_tokens, "stream", 1,
                          "temperature", b->temperature, "stream_options", "include_usage", 1);
    if (b->top_p < 1)
        json_object_set_new(o, "top_p", json_real(b->top_p));
    if (b->model[0])
        json_object_set_new(o, "model", json_string(b->model));
    json_t *x = b->extra ? json_deep_copy(b->extra) : NULL; /* threads share b->extra */
    if (x)
        json_object_update(o, x);
    json_decref(x);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Account one SSE event: a token chunk (times) or the usage chunk. count_only: every event
 * but the usage one is a token (with ignore_eos and no stop strings each chunk carries one). */
static void on_sse(struct breq *r, const char *ev, double t, double *last, bool count_only)
{
    if (!strcmp(ev, "[DONE]")) {
        r->ok = r->n_out > 0 || r->n_out_want == 0 || !r->need_tokens;
        return;
    }
    if (count_only && !strstr(ev, "\"usage\":{")) {
        if (*last == 0)
            r->ttft = t;
        else
            r->itl[r->n_itl < r->n_out_want ? r->n_itl++ : r->n_itl - 1] = t - *last;
        *last = t;
        return;
    }
    json_t *o = json_loads(ev, 0, NULL);
    json_t *u = json_object_get(o, "usage");
    if (json_is_object(u))
        r->n_out = (uint32_t)json_integer_value(json_object_get(u, "completion_tokens"));
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    const char *text = json_string_value(json_object_get(ch, "text"));
    if (ch && text && *text) {
        if (*last == 0)
            r->ttft = t;
        else
            r->itl[r->n_itl < r->n_out_want ? r->n_itl++ : r->n_itl - 1] = t - *last;
        *last = t;
    }
    json_decref(o);
}

static void run_one(const struct bench *b, struct breq *r)
{
    double t0 = (double)ty_clock_ns() / 1e9, last = 0;
    char *body = request_body(b, r), head[512], buf[65536], *acc = NULL;
    size_t n_acc = 0;
    int fd = body ? connect_to(b) : -1;
    r->itl = calloc(r->n_out_want + 1, sizeof(double));
    if (fd < 0 || !r->itl)
        goto out;
    int hn = snprintf(head, sizeof(head), "POST %s HTTP/1.0\r\nHost: %s\r\nContent-Type: "
                      "application/json\r\nContent-Length: %zu\r\n\r\n", b->endpoint, b->host,
                      strlen(body));
    if (write(fd, head, (size_t)hn) != hn || write(fd, body, strlen(body)) != (ssize_t)strlen(body))
        goto out;
    bool in_body = false;
    ssize_t k;
    while ((k = read(fd, buf, sizeof(buf))) > 0) {
        double t = (double)ty_clock_ns() / 1e9 - t0;
        acc = realloc(acc, n_acc + (size_t)k + 1);
        memcpy(acc + n_acc, buf, (size_t)k);
        n_acc += (size_t)k;
        acc[n_acc] = 0;
        char *p = acc, *e;
        if (!in_body) {
            if (!(e = strstr(p, "\r\n\r\n")))
                continue;
            if (strncmp(p, "HTTP/1.1 200", 12) && strncmp(p, "HTTP/1.0 200", 12))
                goto out;
            in_body = true;
            p = e + 4;
        }
        while ((e = strstr(p, "\n\n"))) {
            *e = 0;
            if (!strncmp(p, "data: ", 6))
                on_sse(r, p + 6, t, &last, b->count_only);
            p = e + 2;
        }
        n_acc -= (size_t)(p - acc);
        memmove(acc, p, n_acc + 1);
    }
    r->e2e = (double)ty_clock_ns() / 1e9 - t0;
out:
    if (fd >= 0)
        close(fd);
    free(acc);
    free(body);
}

struct job {
    struct bench *b;
    struct breq *r;
};

static void *job_main(void *arg)
{
    struct job *j = arg;
    run_one(j->b, j->r);
    sem_post(&j->b->slots);
    free(j);
    return NULL;
}

/* Prompts: random ids in [100, vocab), or from a Mooncake trace (timestamp ms, input_length,
 * output_length, hash_ids: ids derived from the block hashes so shared prefixes repeat). */
static int make_requests(struct bench *b)
{
    uint64_t s = b->seed;
    FILE *f = b->trace ? fopen(b->trace, "r") : NULL;
    char line[1 << 16];
    if (b->trace && !f) {
        fprintf(stderr, "tycho bench serve: cannot open %s\n", b->trace);
        return TY_ENOENT;
    }
    b->reqs = calloc(b->n, sizeof(*b->reqs));
    double t = 0;
    uint32_t span = b->vocab > 100 ? b->vocab - 100 : 1;
    for (uint32_t i = 0; i < b->n; i++) {
        struct breq *r = &b->reqs[i];
        json_t *o = NULL;
        if (f) {
            if (!fgets(line, sizeof(line), f) || !(o = json_loads(line, 0, NULL))) {
                b->n = i;
                break;
            }
            r->arrival_s = json_number_value(json_object_get(o, "timestamp")) / 1e3;
            r->n_in = (uint32_t)json_integer_value(json_object_get(o, "input_length"));
            r->n_out_want = (uint32_t)json_integer_value(json_object_get(o, "output_length"));
            if (b->in_len && r->n_in > b->in_len)
                r->n_in = b->in_len; /* cap to the served model's context */
            if (b->out_len && r->n_out_want > b->out_len)
                r->n_out_want = b->out_len;
        } else {
            r->n_in = b->in_len;
            r->n_out_want = b->out_len;
            if (b->rate > 0)
                t += b->dataset && !strcmp(b->dataset, "fixed") ? 1.0 / b->rate
                                                               : -log(rng_unit(&s)) / b->rate;
            r->arrival_s = b->rate > 0 ? t : 0;
        }
        if (b->max_tokens)
            r->n_out_want = b->max_tokens;
        r->need_tokens = !b->max_tokens;
        r->ids = malloc((r->n_in + 1) * sizeof(uint32_t));
        json_t *h = json_object_get(o, "hash_ids");
        for (uint32_t k = 0; k < r->n_in; k++) {
            /* a trace prompt's token k: a hash of (its block's hash id, k), so two prompts
             * have the same tokens exactly where they have the same hash ids */
            uint64_t id = (uint64_t)json_integer_value(json_array_get(h, k / b->trace_block));
            uint64_t key = (id << 20) ^ k;
            uint64_t v = json_is_array(h) ? rng_next(&key) : rng_next(&s);
            r->ids[k] = 100 + (uint32_t)(v % span);
        }
        json_decref(o);
    }
    if (f)
        fclose(f);
    return b->n ? 0 : TY_EINVAL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct dist {
    double mean, median, p90, p99;
};

/* numpy's percentile (linear) of sorted v[0..n), n > 0 */
static double pct_linear(const double *v, size_t n, double q)
{
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)pos;
    return lo + 1 < n ? v[lo] + (v[lo + 1] - v[lo]) * (pos - (double)lo) : v[lo];
}

static struct dist dist_of(double *v, size_t n)
{
    struct dist d = {0};
    if (!n)
        return d;
    qsort(v, n, sizeof(double), cmp_d);
    for (size_t i = 0; i < n; i++)
        d.mean += v[i];
    d.mean /= (double)n;
    d.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    d.p90 = pct_linear(v, n, 0.90);
    d.p99 = pct_linear(v, n, 0.99);
    return d;
}

#define ROW_I(label, v) printf("%-40s %-10u\n", label, (unsigned)(v))
#define ROW_F(label, v) printf("%-40s %-10.2f\n", label, (double)(v))

static void section(const char *title, const char *key, struct dist d, json_t *j, const char *jk)
{
    char l[64];
    printf("%s\n", title);
    snprintf(l, sizeof(l), "Mean %s (ms):", key);
    ROW_F(l, d.mean * 1e3);
    snprintf(l, sizeof(l), "Median %s (ms):", key);
    ROW_F(l, d.median * 1e3);
    snprintf(l, sizeof(l), "P99 %s (ms):", key);
    ROW_F(l, d.p99 * 1e3);
    char k[64];
    snprintf(k, sizeof(k), "mean_%s_ms", jk);
    json_object_set_new(j, k, json_real(d.mean * 1e3));
    snprintf(k, sizeof(k), "median_%s_ms", jk);
    json_object_set_new(j, k, json_real(d.median * 1e3));
    snprintf(k, sizeof(k), "p90_%s_ms", jk); /* (JSON only: vLLM's block has no P90 row) */
    json_object_set_new(j, k, json_real(d.p90 * 1e3));
    snprintf(k, sizeof(k), "p99_%s_ms", jk);
    json_object_set_new(j, k, json_real(d.p99 * 1e3));
}

static void report(struct bench *b, double dur)
{
    size_t ok = 0, n_itl = 0, good = 0;
    uint64_t in = 0, out = 0;
    double *ttft = calloc(b->n, sizeof(double)), *tpot = calloc(b->n, sizeof(double)),
           *e2e = calloc(b->n, sizeof(double)), *itl;
    for (uint32_t i = 0; i < b->n; i++)
        n_itl += b->reqs[i].ok ? b->reqs[i].n_itl : 0;
    itl = calloc(n_itl + 1, sizeof(double));
    size_t n_tpot = 0;
    n_itl = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        struct breq *r = &b->reqs[i];
        if (!r->ok)
            continue;
        ttft[ok] = r->ttft;
        e2e[ok++] = r->e2e;
        in += r->n_in;
        out += r->n_out;
        double tp = r->n_out > 1 ? (r->e2e - r->ttft) / (r->n_out - 1) : 0;
        if (r->n_out > 1)
            tpot[n_tpot++] = tp;
        memcpy(itl + n_itl, r->itl, r->n_itl * sizeof(double));
        n_itl += r->n_itl;
        if ((!b->goodput_ttft || r->ttft * 1e3 <= b->goodput_ttft) &&
            (!b->goodput_tpot || tp * 1e3 <= b->goodput_tpot))
            good++;
    }
    json_t *j = json_pack("{s:f,s:i,s:i,s:I,s:I,s:f,s:f,s:f}", "duration", dur, "completed",
                          (json_int_t)ok, "failed", (json_int_t)(b->n - ok), "total_input_tokens",
                          (json_int_t)in, "total_output_tokens", (json_int_t)out,
                          "request_throughput", ok / dur, "output_throughput", out / dur,
                          "total_token_throughput", (in + out) / dur);
    printf("============ Serving Benchmark Result ============\n");
    ROW_I("Successful requests:", ok);
    ROW_I("Failed requests:", b->n - ok);
    if (b->max_conc)
        ROW_I("Maximum request concurrency:", b->max_conc);
    ROW_F("Benchmark duration (s):", dur);
    ROW_I("Total input tokens:", in);
    ROW_I("Total generated tokens:", out);
    ROW_F("Request throughput (req/s):", ok / dur);
    if (b->goodput_ttft || b->goodput_tpot) {
        ROW_F("Request goodput (req/s):", good / dur);
        json_object_set_new(j, "request_goodput", json_real(good / dur));
        /* the share of all requests sent (a failed one is a miss) that met the goodput SLOs */
        json_object_set_new(j, "slo_attainment", json_real(b->n ? (double)good / b->n : 0));
    }
    ROW_F("Output token throughput (tok/s):", out / dur);
    ROW_F("Total Token throughput (tok/s):", (in + out) / dur);
    section("---------------Time to First Token----------------", "TTFT", dist_of(ttft, ok), j,
            "ttft");
    section("-----Time per Output Token (excl. 1st token)------", "TPOT",
            dist_of(tpot, n_tpot), j, "tpot");
    section("---------------Inter-token Latency----------------", "ITL", dist_of(itl, n_itl), j,
            "itl");
    section("----------------End-to-end Latency----------------", "E2EL", dist_of(e2e, ok), j,
            "e2el");
    printf("==================================================\n");
    if (b->json_out) {
        FILE *f = strcmp(b->json_out, "-") ? fopen(b->json_out, "w") : stdout;
        if (f) {
            json_dumpf(j, f, JSON_INDENT(2));
            fputc('\n', f);
            if (f != stdout)
                fclose(f);
        }
    }
    json_decref(j);
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tycho bench serve [--base-url http://127.0.0.1:8000] [--endpoint "
               "/v1/completions]\n"
               "         [--model NAME] [--num-prompts N] [--request-rate R|inf] "
               "[--fixed-rate]\n"
               "         [--max-concurrency C] [--random-input-len N] [--random-output-len N]\n"
               "         [--random-vocab V] [--dataset-path MOONCAKE.jsonl] [--seed S]\n"
               "         [--goodput ttft:MS tpot:MS] [--temperature T] [--top-p P] [--json FILE|-]\n"
               "         [--max-tokens N] [--extra-body JSON] [--count-only]\n"
               "         [--trace-block-tokens T]\n"
               "  Random prompts are token ids in [100, V); a trace's lengths are capped by\n"
               "  --random-input-len/--random-output-len when given, and each of its hash ids\n"
               "  stands for T prompt tokens (default 512, the Mooncake traces' block; T = the\n"
               "  cluster's kv_block_tokens makes one hash id one KV block). Requests are greedy\n"
               "  (temperature 0) unless --temperature says otherwise. Answers have the wanted\n"
               "  length (ignore_eos); with --max-tokens N every request asks for up to N\n"
               "  tokens instead and ends at the model's EOS, as a chat client's would.\n"
               "  --extra-body: a JSON object merged into every request (e.g. logit_bias).\n"
               "  --count-only: time token events without parsing their JSON (a client cheap\n"
               "  enough for many streams to measure the server; needs answers without EOS).\n");
}

static int parse_url(struct bench *b, const char *url)
{
    const char *p = strncmp(url, "http://", 7) ? url : url + 7;
    const char *colon = strchr(p, ':'), *slash = strchr(p, '/');
    size_t hl = colon ? (size_t)(colon - p) : slash ? (size_t)(slash - p) : strlen(p);
    if (!hl || hl >= sizeof(b->host))
        return TY_EINVAL;
    memcpy(b->host, p, hl);
    b->host[hl] = 0;
    snprintf(b->port, sizeof(b->port), "%.*s",
             colon ? (int)((slash ? slash : colon + strlen(colon)) - colon - 1) : 2,
             colon ? colon + 1 : "80");
    return 0;
}

static int parse_args(struct bench *b, int argc, char **argv)
{
    static const struct option opts[] = {
        {"base-url", 1, 0, 'u'}, {"endpoint", 1, 0, 'e'}, {"model", 1, 0, 'm'},
        {"num-prompts", 1, 0, 'n'}, {"request-rate", 1, 0, 'r'}, {"fixed-rate", 0, 0, 'F'},
        {"max-concurrency", 1, 0, 'c'}, {"random-input-len", 1, 0, 'i'},
        {"random-output-len", 1, 0, 'o'}, {"random-vocab", 1, 0, 'V'},
        {"dataset-path", 1, 0, 'd'}, {"seed", 1, 0, 's'}, {"goodput", 1, 0, 'g'},
        {"json", 1, 0, 'j'}, {"temperature", 1, 0, 'T'}, {"top-p", 1, 0, 'P'},
        {"max-tokens", 1, 0, 'M'}, {"extra-body", 1, 0, 'X'}, {"count-only", 0, 0, 'C'},
        {"trace-block-tokens", 1, 0, 'B'}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'u': if (parse_url(b, optarg)) return TY_EINVAL; break;
        case 'e': snprintf(b->endpoint, sizeof(b->endpoint), "%s", optarg); break;
        case 'm': snprintf(b->model, sizeof(b->model), "%s", optarg); break;
        case 'n': b->n = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'r': b->rate = strcmp(optarg, "inf") ? strtod(optarg, NULL) : 0; break;
        case 'F': b->dataset = "fixed"; break;
        case 'c': b->max_conc = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'i': b->in_len = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'o': b->out_len = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'V': b->vocab = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'd': b->trace = optarg; break;
        case 's': b->seed = strtoull(optarg, NULL, 10); break;
        case 'g': {
            /* one or more "ttft:MS" / "tpot:MS" words: this one and any that follow */
            for (int k = optind - 1; k < argc && strchr(argv[k], ':') && argv[k][0] != '-';
                 k++, optind = k) {
                double v = strtod(strchr(argv[k], ':') + 1, NULL);
                if (!strncmp(argv[k], "ttft:", 5))
                    b->goodput_ttft = v;
                else if (!strncmp(argv[k], "tpot:", 5))
                    b->goodput_tpot = v;
                else
                    return TY_EINVAL;
            }
            break;
        }
        case 'j': b->json_out = optarg; break;
        case 'T': b->temperature = strtod(optarg, NULL); break;
        case 'P': b->top_p = strtod(optarg, NULL); break;
        case 'M': b->max_tokens = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'X':
            json_decref(b->extra);
            b->extra = json_loads(optarg, 0, NULL);
            if (!json_is_object(b->extra)) {
                fprintf(stderr, "tycho bench serve: --extra-body is not a JSON object\n");
                return TY_EINVAL;
            }
            break;
        case 'C': b->count_only = true; break;
        case 'B': b->trace_block = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'h': usage(stdout); return 1;
        default: return TY_EINVAL;
        }
    }
    if (!(b->temperature >= 0 && b->temperature <= 2) || !(b->top_p > 0 && b->top_p <= 1))
        return TY_EINVAL;
    return b->n && b->vocab > 100 && b->trace_block && (b->trace || (b->in_len && b->out_len))
               ? 0
               : TY_EINVAL;
}

static int run_bench(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return TY_CLI_EXIT_OK;
    }
    if (argc < 2 || strcmp(argv[1], "serve")) {
        usage(stderr);
        return TY_CLI_EXIT_USAGE;
    }
    struct bench b = {.host = "127.0.0.1", .port = "8000", .endpoint = "/v1/completions",
                      .n = 100, .in_len = 128, .out_len = 128, .vocab = 512, .seed = 0,
                      .top_p = 1, .trace_block = 512};
    int rc = parse_args(&b, argc - 1, argv + 1);
    if (rc) {
        json_decref(b.extra);
        return rc > 0 ? TY_CLI_EXIT_OK : (usage(stderr), TY_CLI_EXIT_USAGE);
    }
    if (make_requests(&b)) {
        json_decref(b.extra);
        return TY_CLI_EXIT_FAIL;
    }
    sem_init(&b.slots, 0, b.max_conc ? b.max_conc : b.n);
    double t0 = (double)ty_clock_ns() / 1e9;
    pthread_t *th = calloc(b.n, sizeof(pthread_t));
    double first = b.reqs[0].arrival_s;
    for (uint32_t i = 0; i < b.n; i++) {
        double wait = b.reqs[i].arrival_s - first - ((double)ty_clock_ns() / 1e9 - t0);
        if (wait > 0)
            usleep((useconds_t)(wait * 1e6));
        sem_wait(&b.slots);
        struct job *j = malloc(sizeof(*j));
        *j = (struct job){&b, &b.reqs[i]};
        pthread_create(&th[i], NULL, job_main, j);
    }
    for (uint32_t i = 0; i < b.n; i++)
        pthread_join(th[i], NULL);
    report(&b, (double)ty_clock_ns() / 1e9 - t0);
    for (uint32_t i = 0; i < b.n; i++) {
        free(b.reqs[i].ids);
        free(b.reqs[i].itl);
    }
    free(b.reqs);
    free(th);
    json_decref(b.extra);
    sem_destroy(&b.slots);
    return TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_bench = {
    "bench", "benchmarks: `tycho bench serve` drives an OpenAI server like vLLM's bench serve",
    run_bench};
