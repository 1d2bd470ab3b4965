/* Internals shared by the store's services (master.c, node.c, client.c): short names for the
 * generated protobuf-c types and small helpers. */
#ifndef TYCHO_STORE_IMPL_H
#define TYCHO_STORE_IMPL_H

#include "store.pb-c.h"
#include "tycho/store.h"

#define PB(x)      Tycho__Store__V1__##x
#define PB_FN(x)   tycho__store__v1__##x
#define PB_INIT(x) TYCHO__STORE__V1__##x##__INIT

#define SM_PUT_START      TYCHO__STORE__V1__METHOD__METHOD_PUT_START
#define SM_PUT_COMMIT     TYCHO__STORE__V1__METHOD__METHOD_PUT_COMMIT
#define SM_GET            TYCHO__STORE__V1__METHOD__METHOD_GET
#define SM_KEYS           TYCHO__STORE__V1__METHOD__METHOD_KEYS
#define SM_SUBSCRIBE      TYCHO__STORE__V1__METHOD__METHOD_SUBSCRIBE
#define SM_STATS          TYCHO__STORE__V1__METHOD__METHOD_STATS
#define SM_NODE_REGISTER  TYCHO__STORE__V1__METHOD__METHOD_NODE_REGISTER
#define SM_NODE_HEARTBEAT TYCHO__STORE__V1__METHOD__METHOD_NODE_HEARTBEAT
#define SM_NODE_JOB       TYCHO__STORE__V1__METHOD__METHOD_NODE_JOB
#define SM_NODE_INDEX     TYCHO__STORE__V1__METHOD__METHOD_NODE_INDEX

/* Split "host:port" into host (cap bytes) and *port. Returns 0 or TY_EINVAL. */

#endif
