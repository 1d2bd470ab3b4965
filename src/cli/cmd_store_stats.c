/* `tycho store-stats`: what the KV pool's master knows (objects, nodes, DRAM use, evictions),
 * as a table or JSON, for operators and scripts. */
#include "cli.h"

#include "tycho/auth.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/store.h"
#include "tycho/store_meta.h"

#include <getopt.h>
#include <stdio.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: tycho store-stats --master=HOST:PORT[,HOST:PORT...] [--json] "
                    "[--timeout-ms=N]\n"
                    "Print the KV pool master's counters: committed blocks, uncommitted puts, "
                    "live pool nodes,\nDRAM capacity and use, evictions, SSD offloads, expired "
                    "puts, dead nodes.\n");
}

static int run_store_stats(int argc, char **argv)
{
    static const struct option lo[] = {{"master", 1, 0, 'm'}, {"json", 0, 0, 'j'},
                                       {"timeout-ms", 1, 0, 't'}, {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    const char *master = NULL;
    bool json = false;
    unsigned timeout_ms = 3000;
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'm':
            master = optarg;
            break;
        case 'j':
            json = true;
            break;
        case 't':
            if (sscanf(optarg, "%u", &timeout_ms) != 1 || !timeout_ms) {
                fprintf(stderr, "store-stats: bad --timeout-ms %s\n", optarg);
                return TY_CLI_EXIT_USAGE;
            }
            break;
        case 'h':
            usage(stdout);
            return TY_CLI_EXIT_OK;
        default:
            usage(stderr);
            return TY_CLI_EXIT_USAGE;
        }
    }
    if (!master || optind < argc) {
        usage(stderr);
        return TY_CLI_EXIT_USAGE;
    }
    ty_log_set_level(TY_LOG_LEVEL_WARN); /* the client's engine start-up is not news here */
    struct ty_store_client_opts co = {.master = master, .transport = "tcp",
                                      .auth = ty_auth_from_env(),
                                      .timeout_ms = timeout_ms, .staging_bytes = 1u << 20};
    ty_store_client_t *c;
    int rc = ty_store_client_new(&c, &co);
    struct ty_store_meta_stats st = {0};
    uint64_t epoch = 0;
    if (!rc) {
        rc = ty_store_client_master_stats(c, &st, &epoch);
        ty_store_client_free(c);
    }
    if (rc) {
        fprintf(stderr, "store-stats: master %s: %s\n", master, ty_strerror(rc));
        return TY_CLI_EXIT_FAIL;
    }
    if (json) {
        printf("{\"master\": \"%s\", \"epoch\": %llu, \"objects\": %llu, \"pending_puts\": %llu, "
               "\"nodes_alive\": %llu, \"dram_bytes\": %llu, \"dram_used\": %llu, "
               "\"evictions\": %llu, \"offloads\": %llu, \"expired_puts\": %llu, "
               "\"dead_nodes\": %llu, \"hot_blocks\": %llu, \"replications_started\": %llu, "
               "\"replications_done\": %llu, \"replications_failed\": %llu, "
               "\"cold_evictions\": %llu}\n",
               master, (unsigned long long)epoch, (unsigned long long)st.objects,
               (unsigned long long)st.pending_puts, (unsigned long long)st.nodes_alive,
               (unsigned long long)st.dram_bytes, (unsigned long long)st.dram_used,
               (unsigned long long)st.evictions, (unsigned long long)st.offloads,
               (unsigned long long)st.expired_puts, (unsigned long long)st.dead_nodes,
               (unsigned long long)st.hot_blocks, (unsigned long long)st.replications_started,
               (unsigned long long)st.replications_done,
               (unsigned long long)st.replications_failed, (unsigned long long)st.cold_evictions);
        return TY_CLI_EXIT_OK;
    }
    double used = st.dram_bytes ? 100.0 * (double)st.dram_used / (double)st.dram_bytes : 0;
    printf("master         %s (epoch %llu)\n", master, (unsigned long long)epoch);
    printf("objects        %llu committed, %llu puts pending\n",
           (unsigned long long)st.objects, (unsigned long long)st.pending_puts);
    printf("pool nodes     %llu alive, %llu lost\n", (unsigned long long)st.nodes_alive,
           (unsigned long long)st.dead_nodes);
    printf("DRAM           %.1f of %.1f MiB used (%.1f %%)\n", (double)st.dram_used / 1048576.0,
           (double)st.dram_bytes / 1048576.0, used);
    printf("evictions      %llu (%llu offloaded to SSD)\n", (unsigned long long)st.evictions,
           (unsigned long long)st.offloads);
    printf("expired puts   %llu\n", (unsigned long long)st.expired_puts);
    printf("hot blocks     %llu now; replications %llu started, %llu done, %llu failed; "
           "%llu cold replicas evicted\n",
           (unsigned long long)st.hot_blocks, (unsigned long long)st.replications_started,
           (unsigned long long)st.replications_done, (unsigned long long)st.replications_failed,
           (unsigned long long)st.cold_evictions);
    return TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_store_stats = {
    "store-stats", "what the KV pool's master holds: blocks, nodes, DRAM use, evictions",
    run_store_stats};
