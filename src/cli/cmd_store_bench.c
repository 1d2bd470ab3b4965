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

static void usage(void)
{
    fprintf(stderr, "usage: tycho store-bench [--master=HOST:PORT] [--sizes=64K,256K,1M,4M] "
                    "[--clients=N]\n"
                    "       [--bytes=256M] [--dram=1G] [--transport=auto|tcp|local] "
                    "[--listen-host=ADDR]\n"
                    "       [--no-redis] [--no-memcached] [--json]\n"
                    "Without --master an embedded master and pool node run in this process.\n");
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

static int run_store_bench(int argc, char **argv)
{
    struct ty_store_bench_opts o = {.redis = true, .memcached = true};
    static const struct option lo[] = {
        {"master", 1, 0, 'm'},      {"sizes", 1, 0, 's'},    {"clients", 1, 0, 'c'},
        {"bytes", 1, 0, 'b'},       {"dram", 1, 0, 'd'},     {"transport", 1, 0, 't'},
        {"listen-host", 1, 0, 'l'}, {"no-redis", 0, 0, 'R'}, {"no-memcached", 0, 0, 'M'},
        {"json", 0, 0, 'j'},        {"help", 0, 0, 'h'},     {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'm':
            o.master = optarg;
            break;
        case 's':
            if (parse_sizes(&o, optarg) != 0) {
                fprintf(stderr, "store-bench: bad --sizes\n");
                return TY_CLI_EXIT_USAGE;
            }
            break;
        case 'c':
            o.clients = (uint32_t)atoi(optarg);
            break;
        case 'b':
            o.bytes = parse_size(optarg);
            break;
        case 'd':
            o.dram_bytes = parse_size(optarg);
            break;
        case 't':
            o.transport = optarg;
            break;
        case 'l':
            o.listen_host = optarg;
            break;
        case 'R':
            o.redis = false;
            break;
        case 'M':
            o.memcached = false;
            break;
        case 'j':
            o.json = true;
            break;
        case 'h':
            usage();
            return TY_CLI_EXIT_OK;
        default:
            usage();
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
