/* Tycho CPU engine speed on one model: prefill and decode tokens/s per thread count, and this
 * machine's memory read bandwidth measured in the same run, printed as JSON lines.
 * usage: [BENCH_KV=auto|f32|f16] bench_engine MODEL [PROMPT_TOKENS] [GEN_TOKENS] [MAX_THREADS]
 * (BENCH_KV: the KV cache's element type, ty_engine_opts.kv_dtype) */
#include "tycho/clock.h"
#include "tycho/engine.h"
#include "tycho/errors.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BW_BYTES (1ull << 30)

struct bw_arg {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
};

static void *bw_read(void *a)
{
    struct bw_arg *b = a;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= b->n; i += 4) {
        s0 += b->p[i];
        s1 += b->p[i + 1];
        s2 += b->p[i + 2];
        s3 += b->p[i + 3];
    }
    b->sum = s0 + s1 + s2 + s3;
    return NULL;
}

/* Best of 5 passes reading a 1 GiB buffer split over `threads` threads, in GB/s. */
static double membw(const uint64_t *buf, uint32_t threads)
{
    double best = 0;
    size_t n = BW_BYTES / 8;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t t[8];
        struct bw_arg a[8];
        uint64_t t0 = ty_clock_ns();
        for (uint32_t i = 0; i < threads; i++) {
            a[i] = (struct bw_arg){buf + n / threads * i, n / threads, 0};
            pthread_create(&t[i], NULL, bw_read, &a[i]);
        }
        uint64_t sum = 0;
        for (uint32_t i = 0; i < threads; i++) {
            pthread_join(t[i], NULL);
            sum += a[i].sum;
        }
        double gbs = (double)BW_BYTES / (double)(ty_clock_ns() - t0);
        if (sum == 42)
            printf("#\n"); /* keeps the reads */
        best = gbs > best ? gbs : best;
    }
    return best;
}

static uint32_t argmax(const float *l, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        b = l[i] > l[b] ? i : b;
    return b;
}

static int run_engine(const ty_model_t *m, uint32_t threads, uint32_t P, uint32_t G)
{
    uint32_t V = ty_model_config(m)->n_vocab;
    struct ty_engine_opts o = {.n_threads = threads, .max_seqs = 1, .max_ctx = P + G + 8,
                               .max_batch_tokens = 512, .no_prefix_sharing = true,
                               .kv_dtype = getenv("BENCH_KV")};
    ty_engine_t *e;
    int rc = ty_engine_new(&e, m, &o);
    if (rc)
        return rc;
    uint32_t *t = malloc(P * sizeof(uint32_t));
    float *l = malloc(V * sizeof(float));
    for (uint32_t i = 0; i < P; i++)
        t[i] = 100 + (i * 7919u) % (V - 200);
    double best_pf = 0, best_dec = 0;
    for (int rep = 0; rep < 2 && !rc; rep++) {
        ty_kvseq_t *s;
        ty_kvpool_seq_new(ty_engine_pool(e), &s);
        struct ty_batch_seq bs = {s, t, P, false};
        struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
        uint64_t t0 = ty_clock_ns();
        rc = ty_engine_forward(e, &b, l);
        uint64_t t1 = ty_clock_ns();
        uint32_t next = argmax(l, V);
        for (uint32_t i = 0; i < G && !rc; i++) {
            bs = (struct ty_batch_seq){s, &next, 1, false};
            rc = ty_engine_forward(e, &b, l);
            next = argmax(l, V);
        }
        uint64_t t2 = ty_clock_ns();
        double pf = P / ((double)(t1 - t0) / 1e9), dec = G / ((double)(t2 - t1) / 1e9);
        best_pf = pf > best_pf ? pf : best_pf;
        best_dec = dec > best_dec ? dec : best_dec;
        ty_kvpool_seq_free(ty_engine_pool(e), s);
    }
    ty_kvpool_t *pool = ty_engine_pool(e);
    const struct ty_model_config *mc = ty_model_config(m);
    /* KV bytes one decode step reads at the mean context of the decode phase */
    double kv_tok = 2.0 * mc->n_layers * ty_kvpool_page_bytes(pool) / ty_kvpool_block_tokens(pool);
    printf("{\"engine\":\"tycho\",\"threads\":%u,\"prompt_tokens\":%u,\"gen_tokens\":%u,"
           "\"kv_dtype\":\"%s\",\"kv_bytes_per_token\":%.0f,\"kv_bytes_per_step\":%.0f,"
           "\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.3f}\n",
           threads, P, G, ty_kv_dtype_name(ty_kvpool_dtype(pool)), kv_tok,
           kv_tok * (P + G / 2.0), best_pf, best_dec);
    fflush(stdout);
    free(t);
    free(l);
    ty_engine_free(e);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_engine MODEL [PROMPT_TOKENS] [GEN_TOKENS] [MAX_THREADS]\n");
        return 2;
    }
    uint32_t P = argc > 2 ? (uint32_t)atoi(argv[2]) : 256, G = argc > 3 ? (uint32_t)atoi(argv[3]) : 64;
    uint32_t maxt = argc > 4 ? (uint32_t)atoi(argv[4]) : 2;
    char err[512];
    ty_model_t *m;
    int rc = ty_model_load(&m, argv[1], err, sizeof(err));
    if (rc) {
        fprintf(stderr, "bench_engine: %s\n", err);
        return 1;
    }
    uint64_t *buf = malloc(BW_BYTES);
    if (!buf)
        return 1;
    memset(buf, 1, BW_BYTES);
    for (uint32_t t = 1; t <= maxt && t <= 8; t++)
        printf("{\"membw_gbs\":%.3f,\"threads\":%u}\n", membw(buf, t), t);
    free(buf);
    printf("{\"model\":\"%s\",\"weight_bytes\":%llu}\n", ty_model_desc(m),
           (unsigned long long)ty_model_weight_bytes(m));
    for (uint32_t t = 1; t <= maxt && !rc; t++)
        rc = run_engine(m, t, P, G);
    ty_model_free(m);
    return rc ? 1 : 0;
}
