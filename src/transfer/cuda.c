/* CUDA support for the transfer engine (built only when TYCHO_HAVE_CUDA): device memory can be
 * registered as "cuda:N" and is moved over tcp through pinned host staging buffers (one per
 * connection, grown on demand), with cudaMemcpy in the connection's own thread. GPUDirect RDMA
 * registration belongs to the rdma transport, which has no data path yet. Thread-safe: CUDA
 * runtime calls may come from any thread; each staging buffer is owned by one connection. */
#include "xfer-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <cuda_runtime_api.h>

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
