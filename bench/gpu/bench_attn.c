/* GPU attention benchmarks (issue 7 item 4).
 * decode: paged decode attention at batch 64 with 4k-token contexts (llama-3-8B heads: 32 query,
 * 8 KV, head_dim 128, bf16 pool, 64-token pages in shuffled order); achieved read bandwidth is
 * compared with a device-to-device cudaMemcpy of the same bytes in the same run (copy bandwidth
 * counted as read + write, as bandwidthTest does).
 * prefill: causal prefill attention, 4 sequences x 1024, 2048 and 4096 tokens, same heads (the
 * 16-bit pool takes the tensor-core path); TFLOP/s counted as
 * 4 * n_heads * L^2 * head_dim / 2 * 2 per sequence (causal half of QK^T and PV), the same
 * formula bench/gpu/sdpa_ref.py uses for PyTorch's scaled_dot_product_attention.
 * Prints "RESULT <name> <value> <unit>" lines. Exit 77 without a GPU. */
#include "ty_kernels.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__,          \
                    __LINE__);                                                                    \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

enum { H = 32, KVH = 8, HD = 128, B = 64 };

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)rng;
}

/* Pool of n_pages random bf16 pages (K and V) and per-sequence tables of shuffled pages. */
static void make_pool(int n_pages, void **dk, void **dv, size_t *bytes)
{
    *bytes = (size_t)n_pages * KVH * B * HD * 2;
    uint16_t *h = malloc(*bytes);
    for (size_t i = 0; i < *bytes / 2; i++)
        h[i] = (uint16_t)(0x3c00 + (next_u32() & 0x3ff)) ^ (next_u32() & 0x8000); /* small bf16 */
    CK(cudaMalloc(dk, *bytes));
    CK(cudaMalloc(dv, *bytes));
    CK(cudaMemcpy(*dk, h, *bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(*dv, h, *bytes, cudaMemcpyHostToDevice));
    free(h);
}

static int32_t *make_tables(int n_seqs, int pages_per_seq)
{
    int n = n_seqs * pages_per_seq;
    int32_t *t = malloc(n * 4);
    for (int i = 0; i < n; i++)
        t[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(next_u32() % (uint32_t)(i + 1)), x = t[i];
        t[i] = t[j], t[j] = x;
    }
    int32_t *d;
    CK(cudaMalloc((void **)&d, n * 4));
    CK(cudaMemcpy(d, t, n * 4, cudaMemcpyHostToDevice));
    free(t);
    return d;
}

static float *dev_f32(size_t n, float val)
{
    float *h = malloc(n * 4), *d;
    for (size_t i = 0; i < n; i++)
        h[i] = val * ((float)(next_u32() % 2001) / 1000.0f - 1.0f);
    CK(cudaMalloc((void **)&d, n * 4));
    CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static int32_t *dev_i32_const(int n, int v)
{
    int32_t *h = malloc(n * 4), *d;
    for (int i = 0; i < n; i++)
        h[i] = v;
    CK(cudaMalloc((void **)&d, n * 4));
    CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static double time_copy_ms(void *dst, const void *src, size_t bytes, int iters)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(a, 0));
    for (int i = 0; i < iters; i++)
        CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms / iters;
}

static int bench_decode(int n_seqs, int ctx)
{
    const int pps = ctx / B;
    void *dk, *dv;
    size_t bytes;
    make_pool(n_seqs * pps, &dk, &dv, &bytes);
    int32_t *tables = make_tables(n_seqs, pps), *lens = dev_i32_const(n_seqs, ctx);
    float *q = dev_f32((size_t)n_seqs * H * HD, 1.0f), *out;
    CK(cudaMalloc((void **)&out, (size_t)n_seqs * H * HD * 4));
    struct ty_cuda_kv_layout l = {TY_CUDA_BF16, KVH, B, HD, n_seqs * pps};
    struct ty_cuda_attn_shape s = {H, KVH, HD, 1.0f / sqrtf(HD), pps};
    size_t wsb = ty_cuda_attn_decode_workspace(&s, n_seqs, ctx);
    void *ws = NULL;
    if (wsb)
        CK(cudaMalloc(&ws, wsb));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int iters = 20;
    for (int i = 0; i < 3; i++)
        if (ty_cuda_attn_decode(out, q, dk, dv, &l, &s, tables, lens, n_seqs, ctx, ws, NULL))
            return 1;
    CK(cudaEventRecord(a, 0));
    for (int i = 0; i < iters; i++)
        ty_cuda_attn_decode(out, q, dk, dv, &l, &s, tables, lens, n_seqs, ctx, ws, NULL);
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    ms /= iters;
    double attn_gbs = 2.0 * bytes / (ms * 1e-3) / 1e9;
    double copy_ms = time_copy_ms(dv, dk, bytes, 10);
    double copy_gbs = 2.0 * bytes / (copy_ms * 1e-3) / 1e9;
    printf("decode attention: batch %d ctx %d, %.1f MiB KV read, %.3f ms, %.0f GB/s; "
           "D2D copy %.0f GB/s (read+write); ratio %.2f\n",
           n_seqs, ctx, 2.0 * bytes / 1048576.0, ms, attn_gbs, copy_gbs, attn_gbs / copy_gbs);
    printf("RESULT decode_attn_b%d_ctx%d_gbs %.1f GB/s\n", n_seqs, ctx, attn_gbs);
    printf("RESULT d2d_copy_gbs %.1f GB/s\n", copy_gbs);
    printf("RESULT decode_attn_b%d_ctx%d_vs_copy %.3f ratio\n", n_seqs, ctx, attn_gbs / copy_gbs);
    cudaFree(dk), cudaFree(dv), cudaFree(tables), cudaFree(lens), cudaFree(q), cudaFree(out);
    if (ws)
        cudaFree(ws);
    return 0;
}

static int bench_prefill(int n_seqs, int L)
{
    const int pps = L / B;
    void *dk, *dv;
    size_t bytes;
    make_pool(n_seqs * pps, &dk, &dv, &bytes);
    int32_t *tables = make_tables(n_seqs, pps), *lens = dev_i32_const(n_seqs, L);
    int32_t *starts_h = malloc(n_seqs * 4), *starts;
    for (int i = 0; i < n_seqs; i++)
        starts_h[i] = i * L;
    CK(cudaMalloc((void **)&starts, n_seqs * 4));
    CK(cudaMemcpy(starts, starts_h, n_seqs * 4, cudaMemcpyHostToDevice));
    free(starts_h);
    float *q = dev_f32((size_t)n_seqs * L * H * HD, 1.0f), *out;
    CK(cudaMalloc((void **)&out, (size_t)n_seqs * L * H * HD * 4));
    struct ty_cuda_kv_layout l = {TY_CUDA_BF16, KVH, B, HD, n_seqs * pps};
    struct ty_cuda_attn_shape s = {H, KVH, HD, 1.0f / sqrtf(HD), pps};
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int iters = 5;
    if (ty_cuda_attn_prefill(out, q, dk, dv, &l, &s, tables, starts, lens, lens, n_seqs, L, NULL))
        return 1;
    CK(cudaEventRecord(a, 0));
    for (int i = 0; i < iters; i++)
        ty_cuda_attn_prefill(out, q, dk, dv, &l, &s, tables, starts, lens, lens, n_seqs, L, NULL);
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    ms /= iters;
    double flops = (double)n_seqs * H * 4.0 * L * (double)L * HD / 2.0;
    double tflops = flops / (ms * 1e-3) / 1e12;
    printf("prefill attention: %d x %d tokens, causal, %.3f ms, %.1f TFLOP/s\n", n_seqs, L, ms,
           tflops);
    printf("RESULT prefill_attn_b%d_L%d_tflops %.2f TFLOP/s\n", n_seqs, L, tflops);
    cudaFree(dk), cudaFree(dv), cudaFree(tables), cudaFree(lens), cudaFree(starts);
    cudaFree(q), cudaFree(out);
    return 0;
}

int main(int argc, char **argv)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("bench_gpu_attn: no CUDA device (%s), skipping\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    const char *what = argc > 1 ? argv[1] : "all";
    int rc = 0;
    if (!strcmp(what, "all") || !strcmp(what, "decode")) {
        rc |= bench_decode(64, 4096);
        rc |= bench_decode(1, 32768); /* a long single context: the split path */
    }
    if (!strcmp(what, "all") || !strcmp(what, "prefill")) {
        rc |= bench_prefill(4, 1024);
        rc |= bench_prefill(4, 2048);
        rc |= bench_prefill(4, 4096);
    }
    return rc;
}
