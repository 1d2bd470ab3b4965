/* RPC clients to other prefill nodes by address (peers-impl.h). */
#include "peers-impl.h"

#include "tycho/config.h"

#include <stdio.h>
#include <string.h>

ty_rpc_client_t *ty__peers_get(struct ty__peers *p, const char *addr)
{
    for (size_t i = 0; i < TY__PEERS_MAX; i++)
        if (p->slot[i].c && !strcmp(p->slot[i].addr, addr))
            return p->slot[i].c;
    char host[128];
    uint16_t port;
    if (ty_config_split_hostport(addr, host, sizeof(host), &port))
        return NULL;
    size_t k = p->rr++ % TY__PEERS_MAX;
    if (p->slot[k].c)
        ty_rpc_client_close(p->slot[k].c, NULL, NULL);
    p->slot[k].c = NULL;
    struct ty_rpc_client_opts co = {.loop = p->loop, .host = host, .port = port,
                                    .auth = p->auth, .connect_timeout_ms = p->connect_timeout_ms,
                                    .backoff_max_ms = 1000};
    if (ty_rpc_client_new(&p->slot[k].c, &co))
        return p->slot[k].c = NULL;
    snprintf(p->slot[k].addr, sizeof(p->slot[k].addr), "%s", addr);
    return p->slot[k].c;
}

void ty__peers_close(struct ty__peers *p)
{
    for (size_t i = 0; i < TY__PEERS_MAX; i++)
        if (p->slot[i].c) {
            ty_rpc_client_close(p->slot[i].c, NULL, NULL);
            p->slot[i].c = NULL;
        }
}
