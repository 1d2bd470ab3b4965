/* The CUDA backend object: creation on a device, the error checks with the sticky-failure
 * flag, the KV pool's device storage hooks, and buffer helpers. The forward pass is in
 * forward_cuda.c, weight upload in weights_cuda.c. */
#include "cuda-impl.h"

#include "tycho/errors.h"
#include "tycho/kvpool.h"
#include "tycho/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLAS_WORKSPACE (32u << 20) /* fixed cuBLAS workspace: nothing allocated in a capture */

int ty__cuda_check(struct cuda_ctx *c, cudaError_t e, const char *call, const char *file,
                   int line)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls report their own */
    TY_LOG_ERROR("cuda", "%s failed: %s (%s) at %s:%d", call, cudaGetErrorName(e),
                 cudaGetErrorString(e), file, line);
    if (e == cudaErrorMemoryAllocation)
        return TY_ENOMEM;
    if (c && !c->failed && !c->capturing) {
        c->failed = true;
        TY_LOG_ERROR("cuda", "%s: device error, backend marked unhealthy", c->name);
    }
    return TY_ECUDA;
}

void ty__cuda_quiet(cudaError_t e, const char *call, const char *file, int line)
{
    if (e == cudaSuccess)
        return;
    (void)cudaGetLastError();
    TY_LOG_WARN("cuda", "%s failed: %s (%s) at %s:%d", call, cudaGetErrorName(e),
                cudaGetErrorString(e), file, line);
}

int ty__cublas_check(struct cuda_ctx *c, cublasStatus_t s, const char *call, const char *file,
                     int line)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    TY_LOG_ERROR("cuda", "%s failed: %s at %s:%d", call, cublasGetStatusString(s), file, line);
    if (s == CUBLAS_STATUS_ALLOC_FAILED)
        return TY_ENOMEM;
    if (c && !c->capturing)
        c->failed = true;
    return TY_ECUDA;
}

int ty__cuda_kernel_check(struct cuda_ctx *c, int rc, const char *call, const char *file,
                          int line)
{
    if (rc == 0)
        return 0;
    TY_LOG_ERROR("cuda", "%s returned %s at %s:%d", call, ty_err_name(rc), file, line);
    if (rc == TY_ECUDA && c && !c->capturing)
        c->failed = true;
    return rc;
}

int ty__cuda_grow(struct cuda_ctx *c, void **p, size_t *cap, size_t bytes)
{
    if (bytes <= *cap && *p)
        return 0;
    if (*p)
        TY_CU(c, cudaFree(*p));
    *p = NULL;
    *cap = 0;
    ty__cuda_graphs_reset(c);
    int rc = TY_CU(c, cudaMalloc(p, bytes ? bytes : 16));
    if (rc) {
        *p = NULL;
        return rc;
    }
    *cap = bytes;
    return 0;
}

void ty__cuda_graphs_reset(struct cuda_ctx *c)
{
    for (int i = 0; i < TY_CUDA_MAX_GRAPHS; i++) {
        if (c->graph[i].exec) /* NULL for a shape seen once: nothing captured yet */
            TY_CU_QUIET(cudaGraphExecDestroy(c->graph[i].exec));
        memset(&c->graph[i], 0, sizeof(c->graph[i]));
    }
}

/* ---- KV pool storage in device memory ----------------------------------------------------- */

static void *kv_alloc(void *ctx, size_t bytes)
{
    struct cuda_ctx *c = ctx;
    void *p = NULL;
    if (TY_CU(c, cudaSetDevice(c->device)) || TY_CU(c, cudaMalloc(&p, bytes)))
        return NULL;
    if (TY_CU(c, cudaMemsetAsync(p, 0, bytes, c->stream)) ||
        TY_CU(c, cudaStreamSynchronize(c->stream))) {
        TY_CU_QUIET(cudaFree(p));
        return NULL;
    }
    return p;
}

static void kv_free(void *ctx, void *ptr)
{
    struct cuda_ctx *c = ctx;
    TY_CU(c, cudaFree(ptr));
}

static int kv_copy(void *ctx, void *dst, const void *src, size_t bytes, bool to_pool)
{
    struct cuda_ctx *c = ctx;
    int rc = TY_CU(c, cudaMemcpyAsync(dst, src, bytes,
                                      to_pool ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                      c->stream));
    return rc ? rc : TY_CU(c, cudaStreamSynchronize(c->stream));
}

static int cuda_kv_storage(ty_backend_t *b, struct ty_kvpool_storage *out)
{
    struct cuda_ctx *c = b->context;
    *out = (struct ty_kvpool_storage){
        .ctx = c, .alloc = kv_alloc, .free = kv_free, .copy = kv_copy, .name = c->name};
    return 0;
}

/* ---- the object ------------------------------------------------------------------------- */

static const char *cuda_name(const ty_backend_t *b)
{
    return "cuda";
}

static bool cuda_healthy(const ty_backend_t *b)
{
    const struct cuda_ctx *c = b->context;
    return !c->failed;
}

static void free_buffers(struct cuda_ctx *c)
{
    void *bufs[] = {c->buf.x,  c->buf.xb, c->buf.qkv, c->buf.q,      c->buf.att, c->buf.gu,
                    c->buf.hb, c->buf.xg, c->buf.logits, c->buf.xh, c->meta_d, c->ws,
                    c->blas_ws, c->buf.ys, c->buf.rlog, c->buf.rw, c->buf.re,
                    c->buf.grp_d, c->ids_d, c->draw_d};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i])
            TY_CU_QUIET(cudaFree(bufs[i]));
    if (c->meta_h)
        TY_CU_QUIET(cudaFreeHost(c->meta_h));
    if (c->logits_h)
        TY_CU_QUIET(cudaFreeHost(c->logits_h));
    if (c->ids_h)
        TY_CU_QUIET(cudaFreeHost(c->ids_h));
    if (c->draw_h)
        TY_CU_QUIET(cudaFreeHost(c->draw_h));
    if (c->buf.grp_h)
        TY_CU_QUIET(cudaFreeHost(c->buf.grp_h));
}

static void cuda_free(ty_backend_t *b)
{
    struct cuda_ctx *c = b->context;
    TY_LOG_DEBUG("cuda", "%s: %llu graph captures, %llu graph launches", c->name,
                 (unsigned long long)c->n_graph_captures,
                 (unsigned long long)c->n_graph_launches);
    TY_CU_QUIET(cudaSetDevice(c->device));
    if (c->stream)
        TY_CU_QUIET(cudaStreamSynchronize(c->stream));
    ty__cuda_graphs_reset(c);
    ty__cuda_model_free(c);
    free_buffers(c);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->stream)
        TY_CU_QUIET(cudaStreamDestroy(c->stream));
    free(c);
    free(b);
}

static const struct ty_backend_i cuda_iface = {
    .name = cuda_name,
    .free = cuda_free,
    .forward = ty__cuda_forward,
    .kv_storage = cuda_kv_storage,
    .healthy = cuda_healthy,
    .kv_dtypes = 1u << TY_KV_F32 | 1u << TY_KV_F16 | 1u << TY_KV_BF16, /* every page type */
    .greedy_ids = true, /* argmax on the device: 4 bytes a row come back, not the row */
    .draws = true,      /* whole draws on the device: ~170 bytes a row come back */
};

static int parse_weights(struct cuda_ctx *c, const char *w)
{
    static const struct {
        const char *name;
        enum ty_cuda_dtype t;
    } types[] = {{"f32", TY_CUDA_F32}, {"f16", TY_CUDA_F16}, {"bf16", TY_CUDA_BF16}};
    if (!w || !strcmp(w, "auto"))
        return 0;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (!strcmp(w, types[i].name)) {
            c->have_forced = true;
            c->forced = types[i].t;
            return 0;
        }
    TY_LOG_ERROR("cuda", "unknown weight type '%s' (want auto, f32, f16 or bf16)", w);
    return TY_EINVAL;
}

/* Device, stream, cuBLAS bound to the stream with a fixed workspace. */
static int open_device(struct cuda_ctx *c)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= c->device) {
        (void)cudaGetLastError();
        TY_LOG_ERROR("cuda", "no CUDA device %d (%s)", c->device,
                     e != cudaSuccess ? cudaGetErrorString(e) : "not that many devices");
        return TY_ENODEV;
    }
    int rc = TY_CU(c, cudaSetDevice(c->device));
    if (!rc)
        rc = TY_CU(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (!rc)
        rc = TY_CUBLAS(c, cublasCreate(&c->blas));
    if (!rc)
        rc = TY_CUBLAS(c, cublasSetStream(c->blas, c->stream));
    if (!rc)
        rc = TY_CU(c, cudaMalloc(&c->blas_ws, BLAS_WORKSPACE));
    if (!rc)
        rc = TY_CUBLAS(c, cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WORKSPACE));
    return rc;
}

int ty_backend_cuda_new(ty_backend_t **out, const struct ty_backend_cuda_opts *opts)
{
    struct ty_backend_cuda_opts o = opts ? *opts : (struct ty_backend_cuda_opts){0};
    *out = NULL;
    if (o.device < 0 || o.device > 255)
        return TY_EINVAL;
    ty_backend_t *b = calloc(1, sizeof(*b));
    struct cuda_ctx *c = calloc(1, sizeof(*c));
    if (!b || !c) {
        free(b);
        free(c);
        return TY_ENOMEM;
    }
    c->device = o.device;
    snprintf(c->name, sizeof(c->name), "cuda:%d", o.device);
    const char *env = getenv("TYCHO_CUDA_GRAPHS");
    c->graphs = !o.no_graphs && !(env && !strcmp(env, "0"));
    b->iface = &cuda_iface;
    b->context = c;
    int rc = parse_weights(c, o.weights);
    if (!rc)
        rc = open_device(c);
    if (rc) {
        cuda_free(b);
        return rc;
    }
    *out = b;
    return 0;
}
