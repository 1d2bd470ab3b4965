/* tycho-store's /metrics, /health and /ready over HTTP (metrics.c): the master's metadata and
 * the pool node's DRAM, SSD and transfer figures, read when a scrape arrives. Loop thread. */
#ifndef TYCHO_STORE_METRICS_H
#define TYCHO_STORE_METRICS_H

#include "tycho/store.h"

typedef struct ty_store_metrics ty_store_metrics_t;

/* Listen on host:port (0: ephemeral). master / node point at the daemon's own pointers (NULL:
 * this process runs no such part; a pointer to NULL: not started yet, e.g. a standby master);
 * they are read at each scrape. /ready: 200 when the master serves and the node is
 * registered, else 503 with the reason. Returns 0 or the bind error (logged). */
int ty__store_metrics_new(ty_store_metrics_t **out, uv_loop_t *loop, const char *host,
                          uint16_t port, ty_store_master_t *const *master,
                          ty_store_node_t *const *node);
uint16_t ty__store_metrics_port(const ty_store_metrics_t *m);
/* Close the server; the metrics are freed once its handles are closed. NULL: nothing. */
void ty__store_metrics_close(ty_store_metrics_t *m);

#endif
