/* `tycho transfer-bench`: throughput and latency of the transfer engine, in the spirit of
 * Mooncake's transfer_engine_bench. A target process registers a buffer and serves; an
 * initiator process moves batches of blocks to or from it and prints GB/s and batch latency
 * percentiles (or JSON). `--role memcpy` measures a plain memcpy of the same sizes as baseline.
 * `--location cuda:N` (CUDA builds) puts every buffer in device memory: the target's is then
 * reached over tcp through pinned staging or, on one host, by CUDA IPC (`--transport local`),
 * and the baseline is cudaMemcpyAsync device to device.
 */
#include "cli.h"

#include "tycho/auth.h"
#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/transfer.h"

#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if TY_BUILD_CUDA
#include <cuda_runtime_api.h>
#endif

struct bench_opts {
    const char *role, *target, *listen, *transport;
    const char *location; /* "cpu" or "cuda:N" */
    int device;           /* N of cuda:N; -1: host memory */
    bool write, json, checksum;
    uint64_t block, buffer_mb;
    uint32_t batch, threads, conns;
    double duration;
};

struct bench_thread {
    const struct bench_opts *o;
    ty_xfer_engine_t *e;
    ty_xfer_segment_t *seg;
    uint8_t *local; /* batch * block bytes of this thread */
    uint64_t remote, remote_len;
    uint32_t index;
    uint64_t bytes;
    double *lat_ms; /* one per batch */
    size_t n_lat, cap_lat;
    int err;
};

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    g_stop = 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tycho transfer-bench --role target [--listen HOST:PORT] [--buffer-mb N]\n"
            "       tycho transfer-bench --role initiator --target HOST:PORT\n"
            "            [--transport tcp|local|rdma] [--op read|write] [--block-size BYTES] "
            "[--batch-size N] [--threads N]\n"
            "            [--duration S] [--conns N] [--checksum] [--json]\n"
            "       tycho transfer-bench --role memcpy [same sizing options]   (baseline)\n"
            "every role: [--location cpu|cuda:N] (where the buffers live; cuda in CUDA builds)\n");
}

/* ---- buffers at --location -------------------------------------------------------------- */

/* len bytes filled with `byte`: host memory from malloc, or device memory on o->device. */
static void *buf_alloc(const struct bench_opts *o, size_t len, int byte)
{
    if (o->device < 0) {
        void *p = malloc(len);
        if (p)
            memset(p, byte, len);
        return p;
    }
#if TY_BUILD_CUDA
    void *p = NULL;
    if (cudaSetDevice(o->device) != cudaSuccess || cudaMalloc(&p, len) != cudaSuccess ||
        cudaMemset(p, byte, len) != cudaSuccess) {
        fprintf(stderr, "transfer-bench: %zu bytes on cuda:%d: %s\n", len, o->device,
                cudaGetErrorString(cudaGetLastError()));
        if (p)
            cudaFree(p);
        return NULL;
    }
    return p;
#else
    return NULL;
#endif
}

static void buf_free(const struct bench_opts *o, void *p)
{
    if (o->device < 0)
        free(p);
#if TY_BUILD_CUDA
    else if (p)
        cudaFree(p);
#endif
}

/* A buffer registered with e at --location (host memory: shared memfd pages, so the local
 * transport reaches it). */
static int buf_register(const struct bench_opts *o, ty_xfer_engine_t *e, size_t len, int byte,
                        void **out)
{
    if (o->device < 0) {
        int rc = ty_xfer_mem_alloc(e, len, out);
        if (rc == 0)
            memset(*out, byte, len); /* fault pages in, as the memcpy baseline does */
        return rc;
    }
    if (!(*out = buf_alloc(o, len, byte)))
        return TY_ENOMEM;
    int rc = ty_xfer_mem_register(e, *out, len, o->location);
    if (rc) {
        buf_free(o, *out);
        *out = NULL;
    }
    return rc;
}

static void buf_unregister(const struct bench_opts *o, ty_xfer_engine_t *e, void *p)
{
    if (o->device < 0) {
        ty_xfer_mem_release(e, p);
    } else {
        ty_xfer_mem_unregister(e, p);
        buf_free(o, p);
    }
}

static int parse(int argc, char **argv, struct bench_opts *o)
{
    static const struct option lo[] = {
        {"role", 1, 0, 'r'},       {"target", 1, 0, 't'},   {"listen", 1, 0, 'l'},
        {"transport", 1, 0, 'T'},  {"op", 1, 0, 'o'},       {"block-size", 1, 0, 'b'},
        {"batch-size", 1, 0, 'B'}, {"threads", 1, 0, 'j'},  {"duration", 1, 0, 'd'},
        {"json", 0, 0, 'J'},       {"checksum", 0, 0, 'c'}, {"conns", 1, 0, 'C'},
        {"buffer-mb", 1, 0, 'm'},  {"location", 1, 0, 'L'}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    *o = (struct bench_opts){.role = "initiator",
                             .transport = "tcp",
                             .write = true,
                             .block = 1 << 20,
                             .batch = 16,
                             .threads = 1,
                             .duration = 5,
                             .buffer_mb = 1024,
                             .listen = "127.0.0.1:0",
                             .location = "cpu",
                             .device = -1};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'r':
            o->role = optarg;
            break;
        case 't':
            o->target = optarg;
            break;
        case 'l':
            o->listen = optarg;
            break;
        case 'T':
            o->transport = optarg;
            break;
        case 'o':
            o->write = strcmp(optarg, "write") == 0;
            if (!o->write && strcmp(optarg, "read") != 0)
                return TY_EINVAL;
            break;
        case 'b':
            o->block = strtoull(optarg, NULL, 0);
            break;
        case 'B':
            o->batch = (uint32_t)strtoul(optarg, NULL, 0);
            break;
        case 'j':
            o->threads = (uint32_t)strtoul(optarg, NULL, 0);
            break;
        case 'd':
            o->duration = strtod(optarg, NULL);
            break;
        case 'J':
            o->json = true;
            break;
        case 'c':
            o->checksum = true;
            break;
        case 'C':
            o->conns = (uint32_t)strtoul(optarg, NULL, 0);
            break;
        case 'm':
            o->buffer_mb = strtoull(optarg, NULL, 0);
            break;
        case 'L': {
            char *end;
            o->location = optarg;
            if (strcmp(optarg, "cpu") == 0 || strcmp(optarg, "cpu:0") == 0) {
                o->device = -1;
                break;
            }
            if (strncmp(optarg, "cuda:", 5) != 0)
                return TY_EINVAL;
            long d = strtol(optarg + 5, &end, 10);
            if (end == optarg + 5 || *end || d < 0 || d > 255)
                return TY_EINVAL;
            if (!TY_BUILD_CUDA) {
                fprintf(stderr, "transfer-bench: --location %s: this build has no CUDA\n", optarg);
                return TY_EINVAL;
            }
            o->device = (int)d;
            break;
        }
        case 'h':
            return 1;
        default:
            return TY_EINVAL;
        }
    }
    if (o->block == 0 || o->block > (1ull << 30) || o->batch == 0 || o->batch > 4096 ||
        o->threads == 0 || o->threads > 256 || o->duration <= 0 || o->buffer_mb == 0)
        return TY_EINVAL;
    return 0;
}

static int run_target(const struct bench_opts *o)
{
    char host[64] = "127.0.0.1";
    const char *colon = strrchr(o->listen, ':');
    if (!colon || (size_t)(colon - o->listen) >= sizeof(host))
        return TY_CLI_EXIT_USAGE;
    memcpy(host, o->listen, (size_t)(colon - o->listen));
    host[colon - o->listen] = '\0';
    struct ty_xfer_engine_opts eo = {.auth = ty_auth_from_env(), .listen_host = host,
                                     .listen_port = (uint16_t)atoi(colon + 1)};
    ty_xfer_engine_t *e;
    void *buf;
    int rc = ty_xfer_engine_new(&e, &eo);
    if (rc == 0 && (rc = buf_register(o, e, o->buffer_mb << 20, 1, &buf)) != 0)
        ty_xfer_engine_free(e);
    if (rc) {
        fprintf(stderr, "transfer-bench: target: %s\n", ty_strerror(rc));
        return TY_CLI_EXIT_FAIL;
    }
    printf("segment %s buffer 0x%" PRIxPTR " size %" PRIu64 " location %s\n",
           ty_xfer_engine_name(e), (uintptr_t)buf, o->buffer_mb << 20, o->location);
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    while (!g_stop) /* serve until SIGINT / SIGTERM */
        ty_sleep_ns(50 * TY_NS_PER_MS);
    buf_unregister(o, e, buf);
    ty_xfer_engine_free(e);
    return TY_CLI_EXIT_OK;
}

static void lat_push(struct bench_thread *t, double ms)
{
    if (t->n_lat == t->cap_lat) {
        t->cap_lat = t->cap_lat ? t->cap_lat * 2 : 1024;
        t->lat_ms = realloc(t->lat_ms, t->cap_lat * sizeof(double));
        if (!t->lat_ms)
            abort();
    }
    t->lat_ms[t->n_lat++] = ms;
}

static int one_batch(struct bench_thread *t, struct ty_xfer_request *reqs)
{
    ty_xfer_batch_t *b;
    int rc = ty_xfer_batch_new(t->e, t->o->batch, &b);
    if (rc)
        return rc;
    if ((rc = ty_xfer_batch_submit(b, reqs, t->o->batch)) == 0)
        rc = ty_xfer_batch_wait(b, 60000);
    while (ty_xfer_batch_free(b) == TY_EBUSY)
        ty_sleep_ns(TY_NS_PER_MS);
    return rc;
}

static void *xfer_thread(void *arg)
{
    struct bench_thread *t = arg;
    const struct bench_opts *o = t->o;
    uint64_t span = o->block * o->batch, slots = t->remote_len / span;
    struct ty_xfer_request *reqs = calloc(o->batch, sizeof(*reqs));
#if TY_BUILD_CUDA
    if (o->device >= 0) /* the local transport's copy queue is made on this thread's device */
        cudaSetDevice(o->device);
#endif
    uint64_t end = ty_clock_ns() + (uint64_t)(o->duration * 1e9);
    for (uint64_t iter = 0; !g_stop && ty_clock_ns() < end; iter++) {
        uint64_t base = t->remote + ((t->index + iter * o->threads) % slots) * span;
        for (uint32_t i = 0; i < o->batch; i++)
            reqs[i] = (struct ty_xfer_request){o->write ? TY_XFER_OP_WRITE : TY_XFER_OP_READ,
                                               t->local + i * o->block, t->seg, base + i * o->block,
                                               o->block};
        uint64_t t0 = ty_clock_ns();
        if ((t->err = one_batch(t, reqs)) != 0)
            break;
        lat_push(t, (double)(ty_clock_ns() - t0) / 1e6);
        t->bytes += span;
    }
    free(reqs);
    return NULL;
}

/* One batch of the baseline: host memcpy, or on a device cudaMemcpyAsync of each block on the
 * thread's stream and one synchronize (what the transfer engine's batch wait stands for). */
static int baseline_batch(struct bench_thread *t, uint8_t *base, void *stream)
{
    const struct bench_opts *o = t->o;
    for (uint32_t i = 0; i < o->batch; i++) {
        uint8_t *dst = o->write ? base + i * o->block : t->local + i * o->block;
        const uint8_t *src = o->write ? t->local + i * o->block : base + i * o->block;
        if (o->device < 0) {
            memcpy(dst, src, o->block);
            continue;
        }
#if TY_BUILD_CUDA
        if (cudaMemcpyAsync(dst, src, o->block, cudaMemcpyDefault, stream) != cudaSuccess)
            return TY_ECUDA;
#endif
    }
#if TY_BUILD_CUDA
    if (o->device >= 0 && cudaStreamSynchronize(stream) != cudaSuccess)
        return TY_ECUDA;
#endif
    (void)stream;
    return 0;
}

static void *memcpy_thread(void *arg)
{
    struct bench_thread *t = arg;
    const struct bench_opts *o = t->o;
    uint64_t span = o->block * o->batch, slots = t->remote_len / span;
    uint8_t *remote = (uint8_t *)(uintptr_t)t->remote;
    void *stream = NULL;
#if TY_BUILD_CUDA
    if (o->device >= 0 && (cudaSetDevice(o->device) != cudaSuccess ||
                           cudaStreamCreateWithFlags((cudaStream_t *)&stream,
                                                     cudaStreamNonBlocking) != cudaSuccess)) {
        t->err = TY_ECUDA;
        return NULL;
    }
#endif
    uint64_t end = ty_clock_ns() + (uint64_t)(o->duration * 1e9);
    for (uint64_t iter = 0; !g_stop && ty_clock_ns() < end; iter++) {
        uint8_t *base = remote + ((t->index + iter * o->threads) % slots) * span;
        uint64_t t0 = ty_clock_ns();
        if ((t->err = baseline_batch(t, base, stream)) != 0)
            break;
        lat_push(t, (double)(ty_clock_ns() - t0) / 1e6);
        t->bytes += span;
    }
#if TY_BUILD_CUDA
    if (stream)
        cudaStreamDestroy((cudaStream_t)stream);
#endif
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const struct bench_opts *o, struct bench_thread *th, double secs)
{
    uint64_t bytes = 0;
    size_t n = 0;
    for (uint32_t i = 0; i < o->threads; i++)
        bytes += th[i].bytes, n += th[i].n_lat;
    double *all = calloc(n ? n : 1, sizeof(double));
    size_t k = 0;
    for (uint32_t i = 0; i < o->threads; i++)
        for (size_t j = 0; j < th[i].n_lat; j++)
            all[k++] = th[i].lat_ms[j];
    qsort(all, n, sizeof(double), cmp_double);
#define PCT(p) (n ? all[(size_t)((double)(n - 1) * (p))] : 0.0)
    double gbps = (double)bytes / 1e9 / secs;
    const char *tr = strcmp(o->role, "memcpy") == 0 ? "memcpy" : o->transport;
    if (o->json)
        printf("{\"transport\":\"%s\",\"location\":\"%s\",\"op\":\"%s\",\"block_size\":%" PRIu64
               ",\"batch_size\":%u,\"threads\":%u,\"seconds\":%.3f,\"bytes\":%" PRIu64
               ",\"gb_per_s\":%.3f,\"batches\":%zu,\"lat_ms\":{\"p50\":%.3f,\"p90\":%.3f,"
               "\"p99\":%.3f,\"max\":%.3f}}\n",
               tr, o->location, o->write ? "write" : "read", o->block, o->batch, o->threads, secs,
               bytes, gbps, n, PCT(0.5), PCT(0.9), PCT(0.99), PCT(1.0));
    else
        printf("%s %s (%s): block %" PRIu64 " B x batch %u x %u threads, %.2f s: %.3f GB/s; "
               "batch latency ms p50 %.3f p90 %.3f p99 %.3f max %.3f (%zu batches)\n",
               tr, o->write ? "write" : "read", o->location, o->block, o->batch, o->threads, secs,
               gbps, PCT(0.5), PCT(0.9), PCT(0.99), PCT(1.0), n);
#undef PCT
    free(all);
}

static int setup_initiator(const struct bench_opts *o, ty_xfer_engine_t **e,
                           ty_xfer_segment_t **seg, struct ty_xfer_region_info *reg)
{
    struct ty_xfer_engine_opts eo = {
        .auth = ty_auth_from_env(),
        .transport = o->transport, .tcp_conns = o->conns, .checksum = o->checksum};
    int rc = ty_xfer_engine_new(e, &eo);
    if (rc)
        return rc;
    size_t n = 0;
    if ((rc = ty_xfer_segment_open(*e, o->target, seg)) == 0 &&
        (rc = ty_xfer_segment_regions(*seg, reg, 1, &n)) == 0 && n == 0)
        rc = TY_ENOTFOUND;
    if (rc == 0 && reg->len < o->block * o->batch)
        rc = TY_ERANGE;
    return rc;
}

static int run_transfers(const struct bench_opts *o)
{
    bool baseline = strcmp(o->role, "memcpy") == 0;
    ty_xfer_engine_t *e = NULL;
    ty_xfer_segment_t *seg = NULL;
    struct ty_xfer_region_info reg = {0};
    int rc = 0;
    void *baseline_buf = NULL;
    if (baseline) {
        reg.len = o->buffer_mb << 20;
        if (o->device < 0) {
            void *p = mmap(NULL, reg.len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                           0);
            if (p == MAP_FAILED)
                return TY_CLI_EXIT_FAIL;
            memset(p, 1, reg.len);
            reg.addr = (uintptr_t)p;
        } else if ((baseline_buf = buf_alloc(o, reg.len, 1)) != NULL) {
            reg.addr = (uintptr_t)baseline_buf;
        } else {
            return TY_CLI_EXIT_FAIL;
        }
    } else if (!o->target) {
        usage(stderr);
        return TY_CLI_EXIT_USAGE;
    } else if ((rc = setup_initiator(o, &e, &seg, &reg)) != 0) {
        fprintf(stderr, "transfer-bench: %s: %s\n", o->target, ty_strerror(rc));
        ty_xfer_engine_free(e);
        return TY_CLI_EXIT_FAIL;
    }
    struct bench_thread *th = calloc(o->threads, sizeof(*th));
    uint64_t span = o->block * o->batch;
    for (uint32_t i = 0; i < o->threads && rc == 0; i++) {
        th[i] = (struct bench_thread){o, e, seg, NULL, reg.addr, reg.len, i, 0, NULL, 0, 0, 0};
        if (e)
            rc = buf_register(o, e, span, 7, (void **)&th[i].local);
        else
            rc = (th[i].local = buf_alloc(o, span, 7)) ? 0 : TY_ENOMEM;
    }
    if (rc) {
        fprintf(stderr, "transfer-bench: allocating %" PRIu64 " bytes: %s\n", span,
                ty_strerror(rc));
        return TY_CLI_EXIT_FAIL;
    }
    pthread_t *tids = calloc(o->threads, sizeof(*tids));
    uint64_t t0 = ty_clock_ns();
    for (uint32_t i = 0; i < o->threads; i++)
        pthread_create(&tids[i], NULL, baseline ? memcpy_thread : xfer_thread, &th[i]);
    for (uint32_t i = 0; i < o->threads; i++) {
        pthread_join(tids[i], NULL);
        if (th[i].err && !rc)
            rc = th[i].err;
    }
    double secs = (double)(ty_clock_ns() - t0) / 1e9;
    if (rc)
        fprintf(stderr, "transfer-bench: transfer failed: %s\n", ty_strerror(rc));
    else
        report(o, th, secs);
    for (uint32_t i = 0; i < o->threads; i++) {
        free(th[i].lat_ms);
        if (!th[i].local)
            continue;
        if (e)
            buf_unregister(o, e, th[i].local);
        else
            buf_free(o, th[i].local);
    }
    buf_free(o, baseline_buf);
    free(th);
    free(tids);
    if (seg)
        ty_xfer_segment_close(e, seg);
    ty_xfer_engine_free(e);
    return rc ? TY_CLI_EXIT_FAIL : TY_CLI_EXIT_OK;
}

static int run_transfer_bench(int argc, char **argv)
{
    struct bench_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) {
        usage(rc > 0 ? stdout : stderr);
        return rc > 0 ? TY_CLI_EXIT_OK : TY_CLI_EXIT_USAGE;
    }
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(o.role, "target") == 0)
        return run_target(&o);
    if (strcmp(o.role, "initiator") == 0 || strcmp(o.role, "memcpy") == 0)
        return run_transfers(&o);
    usage(stderr);
    return TY_CLI_EXIT_USAGE;
}

const struct ty_cli_command ty_cli_cmd_transfer_bench = {
    "transfer-bench", "measure transfer engine throughput and latency (tcp, local, rdma, memcpy)",
    run_transfer_bench};
