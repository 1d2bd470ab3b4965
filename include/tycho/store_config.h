/* Settings of the tycho-store daemon (src/store/config.c): a pool node, the master, or both.
 * Filled by ty_daemon_new() on the main thread; read-only afterwards. Strings are owned by the
 * config object that filled the struct. */
#ifndef TYCHO_STORE_CONFIG_H
#define TYCHO_STORE_CONFIG_H

#include "tycho/auth.h"
#include "tycho/config.h"

#include <stdbool.h>
#include <stdint.h>

struct ty_store_config {
    bool master;          /* run the master in this process */
    char *master_address; /* host:port[,host:port...] of the master(s) */
    char *name;           /* pool node name */
    char *listen_host;
    uint16_t listen_port; /* master RPC port */
    uint16_t rpc_port;    /* pool node job service */
    uint16_t xfer_port;   /* pool node transfer engine */
    uint64_t dram_bytes;  /* 0: no pool node here (master only) */
    char *ssd_path;
    uint64_t ssd_bytes;
    int ssd_direct; /* enum ty_store_ssd_direct */
    uint64_t heartbeat_interval_ns;
    int eviction; /* enum ty_store_policy */
    double high_watermark, low_watermark;
    uint64_t lease_ns, put_timeout_ns, node_timeout_ns;
    uint32_t replicas;
    double hot_reads_per_s; /* hot blocks (store_meta.h); 0: off */
    uint32_t hot_replicas, hot_blocks_max;
    uint64_t hot_half_life_ns;
    bool xfer_checksum;
    int log_level;
    int log_format; /* enum ty_log_format */
    char *etcd; /* etcd endpoint: the master campaigns for leadership there */
    char *etcd_key;
    uint32_t etcd_ttl_s;
    char *port_file; /* written "master=PORT node=PORT segment=S metrics=PORT\n" once serving */
    uint16_t metrics_port; /* /metrics, /health, /ready over HTTP on listen_host; 0: ephemeral */
    struct ty_auth_config cluster; /* cluster_secret_file / insecure (tycho/auth.h) */
};

extern const struct ty_config_struct ty_store_config_table;

#endif
