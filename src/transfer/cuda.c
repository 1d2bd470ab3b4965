/* CUDA support for the transfer engine (built only when TYCHO_HAVE_CUDA).
 * - tcp: device memory registered as "cuda:N" is staged through pinned host buffers (one per
 *   connection, grown on demand), with cudaMemcpy in the connection's own thread.
 * - CUDA IPC: a cuda:N region lying inside one cudaMalloc allocation is exported as an
 *   IPC handle and an offset; a same-host peer opens the handle (the local transport) and copies
 *   with cudaMemcpyAsync on its own stream, device to device.
 * - copy queues: the local transport's device copies go onto one stream per peer; a batch's
 *   tasks are completed together by one host function after its last copy (flush).
 * GPUDirect RDMA registration belongs to the rdma transport. Thread-safe: CUDA runtime calls may
 * come from any thread; each staging buffer is owned by one connection, each queue locks. */
#include "xfer-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <cuda.h> /* CUdeviceptr, CUresult: the driver's types only, nothing linked */
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define TY_XFER_CUDA_CHECK(call)                                                                   \
    do {                                                                                           \
        cudaError_t ty__ce = (call);                                                               \
        if (ty__ce != cudaSuccess) {                                                               \
            TY_LOG_ERROR(TY_XFER_SUBSYS, "%s failed at %s:%d: %s", #call, __FILE__, __LINE__,      \
                         cudaGetErrorString(ty__ce));                                              \
            return TY_ECUDA;                                                                       \
        }                                                                                          \
    } while (0)

int ty__xfer_cuda_stage_reserve(struct ty__xfer_stage *s, size_t len)
{
    if (s->cap >= len)
        return 0;
    if (s->ptr)
        cudaFreeHost(s->ptr);
    s->ptr = NULL;
    s->cap = 0;
    TY_XFER_CUDA_CHECK(cudaHostAlloc(&s->ptr, len, cudaHostAllocDefault));
    s->cap = len;
    return 0;
}

void ty__xfer_cuda_stage_free(struct ty__xfer_stage *s)
{
    if (s->ptr)
        cudaFreeHost(s->ptr);
    s->ptr = NULL;
    s->cap = 0;
}

int ty__xfer_cuda_copy(void *dst, const void *src, size_t len)
{
    TY_XFER_CUDA_CHECK(cudaMemcpy(dst, src, len, cudaMemcpyDefault));
    return 0;
}

/* ---- CUDA IPC: device regions reached by same-host peers (the local transport) ------------- */

_Static_assert(sizeof(cudaIpcMemHandle_t) == TY__XFER_IPC_HANDLE,
               "the wire carries CUDA IPC handles as 64 bytes");

typedef CUresult (*addr_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);

static addr_range_fn g_addr_range;
static int g_devices = -1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void cuda_once(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        n = 0;
    g_devices = n;
    /* cuMemGetAddressRange through the runtime: the allocation holding a registered pointer,
     * without linking libcuda (absent on machines without a driver) */
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (n > 0 && cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                  cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        g_addr_range = (addr_range_fn)fn;
    cudaGetLastError();
}

bool ty__xfer_cuda_ipc_usable(void)
{
    pthread_once(&g_once, cuda_once);
    return g_devices > 0;
}

int ty__xfer_cuda_ipc_export(const void *ptr, uint64_t len, uint8_t handle[TY__XFER_IPC_HANDLE],
                             uint64_t *offset)
{
    pthread_once(&g_once, cuda_once);
    if (g_devices <= 0 || !g_addr_range)
        return TY_ENOTSUP;
    CUdeviceptr base = 0;
    size_t size = 0;
    if (g_addr_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS ||
        (uintptr_t)ptr - base + len > size)
        return TY_ENOTSUP; /* not one cudaMalloc allocation */
    cudaIpcMemHandle_t h;
    if (cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base) != cudaSuccess) {
        cudaGetLastError();
        return TY_ENOTSUP;
    }
    memcpy(handle, &h, sizeof(h));
    *offset = (uintptr_t)ptr - base;
    return 0;
}

int ty__xfer_cuda_ipc_open(const uint8_t handle[TY__XFER_IPC_HANDLE], void **base)
{
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof(h));
    TY_XFER_CUDA_CHECK(cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess));
    return 0;
}

void ty__xfer_cuda_ipc_close(void *base)
{
    if (cudaIpcCloseMemHandle(base) != cudaSuccess)
        cudaGetLastError();
}

/* ---- a peer's copy queue: copies on one stream, completed in batches ----------------------- */

struct queued {
    struct ty__xfer_task *task;
    uint64_t len;
};

struct ty__xfer_cuda_q {
    cudaStream_t stream;
    pthread_mutex_t mu; /* guards the pending list and the order of work on the stream */
    size_t n, cap;
    struct queued *v;
};

struct done_list {
    size_t n;
    struct queued v[];
};

int ty__xfer_cuda_q_new(struct ty__xfer_cuda_q **out)
{
    struct ty__xfer_cuda_q *q = calloc(1, sizeof(*q));
    if (!q)
        abort();
    if (cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking) != cudaSuccess) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "cudaStreamCreate failed: %s",
                     cudaGetErrorString(cudaGetLastError()));
        free(q);
        return TY_ECUDA;
    }
    pthread_mutex_init(&q->mu, NULL);
    *out = q;
    return 0;
}

/* A host function on the stream: every copy queued before it has landed. No CUDA calls here. */
static void CUDART_CB complete(void *arg)
{
    struct done_list *d = arg;
    for (size_t i = 0; i < d->n; i++)
        ty__xfer_slice_done(d->v[i].task, d->v[i].len, 0);
    free(d);
}

int ty__xfer_cuda_q_copy(struct ty__xfer_cuda_q *q, void *dst, const void *src, uint64_t len,
                         struct ty__xfer_task *t)
{
    pthread_mutex_lock(&q->mu);
    cudaError_t ce = cudaMemcpyAsync(dst, src, (size_t)len, cudaMemcpyDefault, q->stream);
    if (ce == cudaSuccess) {
        if (q->n == q->cap) {
            q->cap = q->cap ? 2 * q->cap : 64;
            q->v = realloc(q->v, q->cap * sizeof(*q->v));
            if (!q->v)
                abort();
        }
        ty__xfer_task_start(t, 1);
        q->v[q->n++] = (struct queued){t, len};
    }
    pthread_mutex_unlock(&q->mu);
    if (ce != cudaSuccess) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "cudaMemcpyAsync of %" PRIu64 " bytes failed: %s", len,
                     cudaGetErrorString(ce));
        cudaGetLastError();
        return TY_ECUDA;
    }
    return 0;
}

void ty__xfer_cuda_q_flush(struct ty__xfer_cuda_q *q)
{
    pthread_mutex_lock(&q->mu);
    if (q->n == 0) {
        pthread_mutex_unlock(&q->mu);
        return;
    }
    struct done_list *d = malloc(sizeof(*d) + q->n * sizeof(d->v[0]));
    if (!d)
        abort();
    d->n = q->n;
    memcpy(d->v, q->v, q->n * sizeof(d->v[0]));
    q->n = 0;
    cudaError_t ce = cudaLaunchHostFunc(q->stream, complete, d);
    int err = 0;
    if (ce != cudaSuccess) { /* the copies may still run: wait for them, then fail the tasks */
        TY_LOG_ERROR(TY_XFER_SUBSYS, "cudaLaunchHostFunc failed: %s", cudaGetErrorString(ce));
        cudaStreamSynchronize(q->stream);
        cudaGetLastError();
        err = TY_ECUDA;
    }
    pthread_mutex_unlock(&q->mu);
    if (err) {
        for (size_t i = 0; i < d->n; i++)
            ty__xfer_slice_done(d->v[i].task, 0, err);
        free(d);
    }
}

void ty__xfer_cuda_q_free(struct ty__xfer_cuda_q *q)
{
    if (!q)
        return;
    ty__xfer_cuda_q_flush(q); /* nothing may stay pending: its batch would wait forever */
    cudaStreamSynchronize(q->stream);
    cudaStreamDestroy(q->stream);
    cudaGetLastError();
    pthread_mutex_destroy(&q->mu);
    free(q->v);
    free(q);
}
