/* tycho-store: a KV pool node, the pool's master, or both (docs/arch/store.md). */
#include "tycho/daemon.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/store.h"
#include "tycho/store_config.h"
#include "tycho/store_elect.h"

#include "store-metrics.h"

#include <stdlib.h>

#include <stdio.h>
#include <string.h>

struct app {
    struct ty_store_config cfg;
    struct ty_auth auth; /* the cluster secret (cluster_secret_file) */
    ty_daemon_t *d;
    ty_store_master_t *master;
    ty_store_node_t *node;
    ty_store_elect_t *elect;
    ty_store_metrics_t *metrics;
    uv_loop_t *loop;
    int open;
};

static void on_closed(void *arg)
{
    struct app *a = arg;
    if (--a->open == 0)
        ty_daemon_stop(a->d);
}

static void on_drain(ty_daemon_t *d, void *arg)
{
    struct app *a = arg;
    ty_store_elect_free(a->elect); /* a leader revokes its lease: a standby takes over now */
    a->elect = NULL;
    ty__store_metrics_close(a->metrics);
    a->metrics = NULL;
    a->open = (a->master != NULL) + (a->node != NULL);
    if (a->open == 0) {
        ty_daemon_stop(d);
        return;
    }
    if (a->node)
        ty_store_node_close(a->node, on_closed, a);
    if (a->master)
        ty_store_master_close(a->master, on_closed, a);
}

static int master_start(struct app *a)
{
    const struct ty_store_config *c = &a->cfg;
    struct ty_store_master_opts mo = {.loop = a->loop,
                                      .auth = &a->auth,
                                      .host = c->listen_host,
                                      .port = c->listen_port,
                                      .meta = {.policy = (enum ty_store_policy)c->eviction,
                                               .high_watermark = c->high_watermark,
                                               .low_watermark = c->low_watermark,
                                               .put_timeout_ms = c->put_timeout_ns / 1000000,
                                               .lease_ms = c->lease_ns / 1000000,
                                               .node_timeout_ms = c->node_timeout_ns / 1000000,
                                               .default_replicas = c->replicas,
                                               .hot_reads_per_s = c->hot_reads_per_s,
                                               .hot_replicas = c->hot_replicas,
                                               .hot_max = c->hot_blocks_max,
                                               .hot_half_life_ms = c->hot_half_life_ns / 1000000}};
    return ty_store_master_new(&a->master, &mo);
}

static void on_leader(void *arg)
{
    struct app *a = arg;
    int rc = master_start(a);
    if (rc != 0) {
        fprintf(stderr, "tycho-store: elected but cannot serve: %s\n", ty_strerror(rc));
        exit(1);
    }
}

static void on_lost(void *arg)
{
    /* Another master may lead now: stop serving at once rather than answer with stale state. */
    fprintf(stderr, "tycho-store: master lease lost: exiting\n");
    exit(1);
}

static int start(struct app *a, uv_loop_t *loop)
{
    const struct ty_store_config *c = &a->cfg;
    int rc = 0;
    a->loop = loop;
    if (c->master && c->etcd) {
        if (c->listen_port == 0) {
            fprintf(stderr, "tycho-store: --etcd needs a fixed --listen_port\n");
            return TY_ECONFIG;
        }
        char me[300];
        snprintf(me, sizeof(me), "%s:%u", c->listen_host, c->listen_port);
        struct ty_store_elect_opts eo = {.loop = loop,
                                         .endpoint = c->etcd,
                                         .key = c->etcd_key,
                                         .value = me,
                                         .ttl_s = c->etcd_ttl_s,
                                         .on_leader = on_leader,
                                         .on_lost = on_lost,
                                         .arg = a};
        if ((rc = ty_store_elect_new(&a->elect, &eo)) != 0)
            return rc;
    } else if (c->master && (rc = master_start(a)) != 0) {
        return rc;
    }
    char addr[300];
    snprintf(addr, sizeof(addr), "%s:%u", c->listen_host,
             a->master ? ty_store_master_port(a->master) : c->listen_port);
    if (c->dram_bytes > 0) {
        struct ty_store_node_opts no = {.loop = loop,
                                        .auth = &a->auth,
                                        .name = c->name,
                                        .host = c->listen_host,
                                        .rpc_port = c->rpc_port,
                                        .xfer_port = c->xfer_port,
                                        .master = c->master && !c->etcd ? addr : c->master_address,
                                        .dram_bytes = c->dram_bytes,
                                        .ssd_dir = c->ssd_path,
                                        .ssd_bytes = c->ssd_bytes,
                                        .ssd_direct = (enum ty_store_ssd_direct)c->ssd_direct,
                                        .heartbeat_ms =
                                            (uint32_t)(c->heartbeat_interval_ns / 1000000),
                                        .xfer_checksum = c->xfer_checksum};
        if ((rc = ty_store_node_new(&a->node, &no)) != 0)
            return rc;
    }
    rc = ty__store_metrics_new(&a->metrics, loop, c->listen_host, c->metrics_port,
                               c->master ? &a->master : NULL, a->node ? &a->node : NULL);
    if (rc != 0)
        return rc;
    if (c->port_file) {
        FILE *f = fopen(c->port_file, "w");
        if (!f)
            return ty_errno();
        fprintf(f, "master=%u node=%u segment=%s metrics=%u\n",
                a->master   ? ty_store_master_port(a->master)
                : c->master ? c->listen_port
                            : 0,
                a->node ? ty_store_node_rpc_port(a->node) : 0,
                a->node ? ty_store_node_segment(a->node) : "-",
                ty__store_metrics_port(a->metrics));
        fclose(f);
    }
    return 0;
}

int main(int argc, char **argv)
{
    static struct app a;
    int code = 0;
    struct ty_daemon_opts o = {.name = "tycho-store",
                               .summary = "KV pool node and/or master (Mooncake Store design)",
                               .table = &ty_store_config_table,
                               .config = &a.cfg,
                               .drain = on_drain,
                               .arg = &a,
                               .drain_timeout_ms = 10000,
                               .auth = &a.auth};
    if (ty_daemon_new(&a.d, &o, argc, argv, &code) != 0)
        return code;
    ty_log_set_level((enum ty_log_level)a.cfg.log_level);
    ty_log_set_format((enum ty_log_format)a.cfg.log_format);
    if (!a.cfg.master && a.cfg.dram_bytes == 0) {
        fprintf(stderr, "tycho-store: nothing to run: set --master and/or --dram_bytes\n");
        ty_daemon_free(a.d);
        return 2;
    }
    uv_loop_t *loop = uv_default_loop();
    int rc = start(&a, loop);
    if (rc != 0) {
        fprintf(stderr, "tycho-store: %s\n", ty_strerror(rc));
        ty_daemon_free(a.d);
        return 1;
    }
    ty_daemon_start(a.d, loop);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_run(loop, UV_RUN_NOWAIT);
    ty_daemon_free(a.d);
    return 0;
}
