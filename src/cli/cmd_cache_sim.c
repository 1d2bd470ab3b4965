/* `tycho cache-sim`: the cache question alone. Replays a trace's hash_ids into one KV pool of
 * a given capacity and eviction policy and prints the prefix hit rate (hits = leading blocks
 * of a request already cached; then all of its blocks are inserted or touched). */
#include "cli.h"
#include "tycho/errors.h"
#include "tycho/sim.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ITEMS 32

static void usage(FILE *f)
{
    fprintf(f, "usage: tycho cache-sim --trace FILE [--capacity N[,N...]] [--policy P[,P...]]\n"
               "                       [--json]\n\n"
               "  --trace FILE     Mooncake-format trace (JSON lines with hash_ids)\n"
               "  --capacity LIST  pool capacities in blocks; 0 or 'unlimited' = no limit\n"
               "                   (default: unlimited,1000,10000,30000,50000,100000)\n"
               "  --policy LIST    lru, lfu, length_aware (default: all three)\n"
               "  --json           one JSON object instead of a table\n");
}

static int parse_caps(char *s, uint64_t *caps, size_t *n)
{
    *n = 0;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == MAX_ITEMS)
            return TY_ERANGE;
        if (strcmp(tok, "unlimited") == 0) {
            caps[(*n)++] = 0;
            continue;
        }
        char *end;
        errno = 0;
        unsigned long long v = strtoull(tok, &end, 10);
        if (errno || *end || end == tok || tok[0] == '-')
            return TY_EINVAL;
        caps[(*n)++] = v;
    }
    return *n ? 0 : TY_EINVAL;
}

static int parse_policies(char *s, enum ty_sim_evict *pol, size_t *n)
{
    *n = 0;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == MAX_ITEMS || ty_sim_evict_parse(tok, &pol[*n]) < 0)
            return TY_EINVAL;
        (*n)++;
    }
    return *n ? 0 : TY_EINVAL;
}

static void print_cap(char *buf, size_t len, uint64_t cap)
{
    if (cap)
        snprintf(buf, len, "%llu", (unsigned long long)cap);
    else
        snprintf(buf, len, "unlimited");
}

static int report(const struct ty_sim_trace *t, const uint64_t *caps, size_t nc,
                  const enum ty_sim_evict *pol, size_t np, int json)
{
    if (json)
        printf("{\"requests\": %zu, \"blocks\": %zu, \"results\": [", t->n, t->n_blocks);
    else
        printf("%-12s %-14s %10s %12s %12s\n", "capacity", "policy", "hit_rate", "hit_blocks",
               "blocks");
    for (size_t c = 0; c < nc; c++) {
        for (size_t p = 0; p < np; p++) {
            struct ty_sim_cache_result r;
            int rc = ty_sim_cache_run(t, caps[c], pol[p], &r);
            if (rc < 0)
                return rc;
            char cap[32];
            print_cap(cap, sizeof(cap), caps[c]);
            if (json)
                printf("%s{\"capacity\": %llu, \"policy\": \"%s\", \"hit_rate\": %.6f, "
                       "\"hit_blocks\": %llu, \"blocks\": %llu}",
                       c || p ? ", " : "", (unsigned long long)caps[c], ty_sim_evict_name(pol[p]),
                       r.hit_rate, (unsigned long long)r.hit_blocks,
                       (unsigned long long)r.total_blocks);
            else
                printf("%-12s %-14s %10.4f %12llu %12llu\n", cap, ty_sim_evict_name(pol[p]),
                       r.hit_rate, (unsigned long long)r.hit_blocks,
                       (unsigned long long)r.total_blocks);
        }
    }
    if (json)
        printf("]}\n");
    return 0;
}

static int run_cache_sim(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"trace", required_argument, NULL, 't'}, {"capacity", required_argument, NULL, 'c'},
        {"policy", required_argument, NULL, 'p'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
    const char *trace = NULL;
    char caps_s[512] = "unlimited,1000,10000,30000,50000,100000";
    char pol_s[256] = "lru,lfu,length_aware";
    int json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "t:c:p:jh", longopts, NULL)) != -1) {
        switch (c) {
        case 't': trace = optarg; break;
        case 'c': snprintf(caps_s, sizeof(caps_s), "%s", optarg); break;
        case 'p': snprintf(pol_s, sizeof(pol_s), "%s", optarg); break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return TY_CLI_EXIT_OK;
        default: usage(stderr); return TY_CLI_EXIT_USAGE;
        }
    }
    uint64_t caps[MAX_ITEMS];
    enum ty_sim_evict pol[MAX_ITEMS];
    size_t nc, np;
    if (!trace || optind != argc) {
        usage(stderr);
        return TY_CLI_EXIT_USAGE;
    }
    if (parse_caps(caps_s, caps, &nc) < 0 || parse_policies(pol_s, pol, &np) < 0) {
        fprintf(stderr, "tycho cache-sim: bad --capacity or --policy (lru, lfu, length_aware)\n");
        return TY_CLI_EXIT_USAGE;
    }
    char err[512] = "";
    struct ty_sim_trace *t;
    int rc = ty_sim_trace_load(&t, trace, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "tycho cache-sim: %s\n", err[0] ? err : ty_strerror(rc));
        return rc == TY_EPARSE ? TY_CLI_EXIT_USAGE : TY_CLI_EXIT_FAIL;
    }
    rc = report(t, caps, nc, pol, np, json);
    ty_sim_trace_free(t);
    if (rc < 0) {
        fprintf(stderr, "tycho cache-sim: %s\n", ty_strerror(rc));
        return TY_CLI_EXIT_FAIL;
    }
    return TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_cache_sim = {
    "cache-sim", "replay a trace's block hashes into a KV pool and print the hit rate",
    run_cache_sim};
