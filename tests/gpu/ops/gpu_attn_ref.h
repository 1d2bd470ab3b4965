/* The paged-attention reference shared by the GPU attention tests (test_gpu_attention.c,
 * test_gpu_attn_sm90.c): a pool of random K/V on random pages, and a double-precision
 * softmax(q k^T * scale) v written from the definition that reads the pool through the block
 * table. Single-threaded test code. */
#ifndef TYCHO_GPU_ATTN_REF_H
#define TYCHO_GPU_ATTN_REF_H

#include "gpu_test_util.h"

struct pool {
    struct ty_cuda_kv_layout l;
    float *k, *v;    /* host copies, already rounded to the pool type */
    void *dk, *dv;   /* device pool arrays */
    int32_t *tables; /* (n_seqs, max_pages) */
    int32_t *dtables;
    int max_pages;
};

/* A pool with enough pages for `lens`, filled with random K/V, and random distinct pages per
 * sequence; with `first` (may be NULL), the pages of sequence i wholly before position
 * first[i] are all one page of NaNs (what the engine's released pages are to a kernel). */
static inline void pool_make(struct pool *p, enum ty_cuda_dtype dt, int n_kv, int B, int hd,
                             const int *lens, const int *first, int n_seqs, uint64_t *s)
{
    int total = 0, maxp = 1;
    for (int i = 0; i < n_seqs; i++) {
        int np = (lens[i] + B - 1) / B;
        total += np;
        maxp = np > maxp ? np : maxp;
    }
    total += 3; /* pages nobody owns */
    p->l = (struct ty_cuda_kv_layout){dt, n_kv, B, hd, total};
    p->max_pages = maxp;
    size_t n = (size_t)total * n_kv * B * hd, es = gt_dtype_size(dt), page = n / total;
    p->k = malloc(n * 4), p->v = malloc(n * 4);
    gt_fill(p->k, n, s, -1, 1);
    gt_fill(p->v, n, s, -1, 1);
    int32_t *perm = malloc(total * 4);
    for (int i = 0; i < total; i++)
        perm[i] = i;
    for (int i = total - 1; i > 0; i--) {
        int j = gt_randint(s, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    const int nan_page = perm[total - 1]; /* owned by no sequence */
    for (size_t i = 0; first && i < page; i++)
        p->k[nan_page * page + i] = p->v[nan_page * page + i] = NAN;
    p->tables = malloc((size_t)n_seqs * maxp * 4);
    for (int i = 0, next = 0; i < n_seqs; i++)
        for (int j = 0; j < maxp; j++) {
            int pg = j < (lens[i] + B - 1) / B ? perm[next++] : -1;
            p->tables[i * maxp + j] = first && (j + 1) * B <= first[i] ? nan_page : pg;
        }
    p->dtables = gt_upload(p->tables, (size_t)n_seqs * maxp * 4);
    free(perm);
    void *enc = malloc(n * 4);
    gt_encode(enc, p->k, n, dt);
    p->dk = gt_upload(enc, n * es);
    gt_encode(enc, p->v, n, dt);
    p->dv = gt_upload(enc, n * es);
    free(enc);
}

/* First position a query at `pos` sees through a window of w (0: all), llama.cpp's mask. */
static inline int win_first(int pos, int w)
{
    return w && pos >= w ? pos - w + 1 : 0;
}

static inline void pool_free(struct pool *p)
{
    cudaFree(p->dk), cudaFree(p->dv), cudaFree(p->dtables);
    free(p->k), free(p->v), free(p->tables);
}

static inline const float *ref_row(const struct pool *p, const float *arr, int seq, int pos, int kh)
{
    const struct ty_cuda_kv_layout *l = &p->l;
    int page = p->tables[seq * p->max_pages + pos / l->page_tokens];
    return arr + (((size_t)page * l->n_kv_heads + kh) * l->page_tokens + pos % l->page_tokens) *
                     l->head_dim;
}

/* out[d] = sum_{lo <= pos < n_vis} softmax_pos(scale * q.k_pos) v_pos[d] for one query
 * head. */
static inline void ref_attend(const struct pool *p, int seq, int kh, const float *q, int lo,
                              int n_vis, float scale, double *out, double *sc)
{
    const int hd = p->l.head_dim;
    double m = -INFINITY, z = 0;
    for (int pos = lo; pos < n_vis; pos++) {
        const float *k = ref_row(p, p->k, seq, pos, kh);
        double a = 0;
        for (int d = 0; d < hd; d++)
            a += (double)q[d] * k[d];
        sc[pos] = a * scale;
        m = sc[pos] > m ? sc[pos] : m;
    }
    for (int d = 0; d < hd; d++)
        out[d] = 0;
    for (int pos = lo; pos < n_vis; pos++) {
        double w = exp(sc[pos] - m);
        z += w;
        const float *v = ref_row(p, p->v, seq, pos, kh);
        for (int d = 0; d < hd; d++)
            out[d] += w * v[d];
    }
    for (int d = 0; d < hd; d++)
        out[d] /= z;
}

#endif
