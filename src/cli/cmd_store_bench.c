/* `tycho store-bench`: KV pool put/get throughput and latency vs Redis, memcached and memcpy
 * (include/tycho/store_bench.h). */
#include "cli.h"

#include "tycho/errors.h"
#include "tycho/store_bench.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    uint64_t m = 1;
    if (*end == 'K' || *end == 'k')
        m = 1ull << 10;
    else if (*end == 'M' || *end == 'm')
        m = 1ull << 20;
    else if (*end == 'G' || *end == 'g')
        m = 1ull << 30;
    else if (*end != 0)
        return 0;
    return (uint64_t)(v * (double)m);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tycho store-bench [--master=HOST:PORT] [--sizes=64K,256K,1M,4M] "
                    "[--clients=N]\n"
                    "       [--batch=8] [--reps=3] [--bytes=256M] [--dram=1G] [--transport=auto|tcp|local] "
                    "[--listen-host=ADDR]\n"
                    "       [--streams=N] [--verify=auto|always|lease] [--xfer-checksum]\n"
                    "       [--no-redis] [--no-memcached] [--json]\n"
                    "Without --master an embedded master and pool node run in this process.\n"
                    "--batch: keys per tycho put/get call; --streams: TCP connections per pool "
                    "node;\n--reps: timed get passes (median/min/max); --verify: checksum policy of gets (include/tycho/store.h).\n");
}

static int parse_sizes(struct ty_store_bench_opts *o, char *list)
{
    for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
        uint64_t v = parse_size(t);
        if (v == 0 || o->n_sizes == TY_STORE_BENCH_SIZES_MAX)
            return -1;
        o->sizes[o->n_sizes++] = v;
    }
    return 0;
}

static int parse_verify(const char *s, enum ty_store_verify *out)
{
    static const char *const names[] = {"auto", "always", "lease"};
    for (int i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (enum ty_store_verify)i;
            return 0;
        }
    return -1;
}

/* Options without the sizes list; returns 0, or -1 for an unknown option or a bad value. */
static int parse_opt(struct ty_store_bench_opts *o, int ch, char *arg)
{
    switch (ch) {
    case 'm':
        o->master = arg;
        return 0;
    case 'c':
        o->clients = (uint32_t)atoi(arg);
        return 0;
    case 'B':
        o->batch = (uint32_t)atoi(arg);
        return o->batch >= 1 && o->batch <= 256 ? 0 : -1;
    case 'S':
        o->tcp_conns = (uint32_t)atoi(arg);
        return o->tcp_conns >= 1 && o->tcp_conns <= 64 ? 0 : -1;
    case 'V':
        return parse_verify(arg, &o->verify);
    case 'P':
        o->reps = (uint32_t)atoi(arg);
        return o->reps >= 1 && o->reps <= 32 ? 0 : -1;
    case 'X':
        o->xfer_checksum = true;
        return 0;
    case 'b':
        o->bytes = parse_size(arg);
        return 0;
    case 'd':
        o->dram_bytes = parse_size(arg);
        return 0;
    case 't':
        o->transport = arg;
        return 0;
    case 'l':
        o->listen_host = arg;
        return 0;
    case 'R':
        o->redis = false;
        return 0;
    case 'M':
        o->memcached = false;
        return 0;
    case 'j':
        o->json = true;
        return 0;
    default:
        return -1;
    }
}

static int run_store_bench(int argc, char **argv)
{
    struct ty_store_bench_opts o = {.redis = true, .memcached = true};
    static const struct option lo[] = {
        {"master", 1, 0, 'm'},      {"sizes", 1, 0, 's'},    {"clients", 1, 0, 'c'},
        {"bytes", 1, 0, 'b'},       {"dram", 1, 0, 'd'},     {"transport", 1, 0, 't'},
        {"listen-host", 1, 0, 'l'}, {"no-redis", 0, 0, 'R'}, {"no-memcached", 0, 0, 'M'},
        {"json", 0, 0, 'j'},        {"help", 0, 0, 'h'},     {"batch", 1, 0, 'B'},
        {"streams", 1, 0, 'S'},     {"verify", 1, 0, 'V'},   {"xfer-checksum", 0, 0, 'X'},
        {"reps", 1, 0, 'P'},        {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (ch == 'h') {
            usage(stdout);
            return TY_CLI_EXIT_OK;
        }
        if (ch == 's' ? parse_sizes(&o, optarg) != 0 : parse_opt(&o, ch, optarg) != 0) {
            fprintf(stderr, "store-bench: bad option or value\n");
            usage(stderr);
            return TY_CLI_EXIT_USAGE;
        }
    }
    if (o.clients > 256) {
        fprintf(stderr, "store-bench: --clients at most 256\n");
        return TY_CLI_EXIT_USAGE;
    }
    int rc = ty_store_bench_run(&o, stdout);
    if (rc != 0) {
        fprintf(stderr, "store-bench: %s\n", ty_strerror(rc));
        return TY_CLI_EXIT_FAIL;
    }
    return TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_store_bench = {
    "store-bench", "KV pool put/get throughput and latency vs Redis, memcached, memcpy",
    run_store_bench};
