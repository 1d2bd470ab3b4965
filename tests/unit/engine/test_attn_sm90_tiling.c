/* The index arithmetic of the Hopper prefill attention kernel (kernels/attn_prefill_sm90.cu),
 * run on the CPU: a plain-C model walks the kernel's grid with the kernel's own functions
 * (kernels/attn_sm90_tiling.h) — CTA and warpgroup rows, KV tile loop bounds, TMA boxes looked
 * up through the page table, their places in a 128B-swizzled shared-memory stage, the zeroed
 * tail of the last tile, the wgmma operand addresses implied by the descriptors' start offsets,
 * LBO and SBO, the accumulator / A-fragment coordinates of every lane's registers, the causal
 * mask and the per-tile online softmax — and its output is compared with a naive attention.
 * Pools are random, page tables scrambled, chunks have cached prefixes (q_off > 0), lengths
 * that are not multiples of the tile, last pages partly filled, GQA ratios 1..8, head_dim 64
 * and 128, page sizes 8..256. It also asserts that no warpgroup visits a tile in which all of
 * its scores are masked, that every visible key of every row is scored exactly once, that no
 * box reads a page-table entry past the chunk's pages or a slot past its page, and that the
 * boxes of a tile fill its stage without overlap (the expect_tx byte count).
 * What the model cannot check is the hardware's reading of the descriptors and of the swizzle:
 * it encodes the PTX ISA's description, which only a run on an H100/H200 confirms. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "attn_sm90_tiling.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double u01(void)
{
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static int randint(int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(u01() * (hi - lo + 1));
}

struct tcase {
    int n_heads, n_kv, hd, page_tokens, n_chunks;
    int q_lens[4], kv_lens[4];
};

/* A paged pool as kv.cu lays it out: (page, kv_head, slot, d), f32 here. */
struct model_pool {
    int n_pages, n_kv, pt, hd, max_pages;
    float *k, *v;
    int32_t *tables; /* (n_chunks, max_pages), scrambled; -1 past a chunk's pages */
    int *n_own;      /* pages each chunk owns */
};

static float *pool_row(const struct model_pool *p, float *arr, int page, int kh, int slot)
{
    return arr + (((size_t)page * p->n_kv + kh) * p->pt + slot) * p->hd;
}

static void pool_make(struct model_pool *p, const struct tcase *c)
{
    int total = 0, maxp = 1;
    p->n_own = calloc(c->n_chunks, sizeof(int));
    for (int i = 0; i < c->n_chunks; i++) {
        p->n_own[i] = (c->kv_lens[i] + c->page_tokens - 1) / c->page_tokens;
        total += p->n_own[i];
        maxp = p->n_own[i] > maxp ? p->n_own[i] : maxp;
    }
    total += 2;
    p->n_pages = total, p->n_kv = c->n_kv, p->pt = c->page_tokens, p->hd = c->hd;
    p->max_pages = maxp + 1; /* a spare column of -1: reading past a chunk's pages fails */
    size_t n = (size_t)total * c->n_kv * c->page_tokens * c->hd;
    p->k = malloc(n * sizeof(float)), p->v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p->k[i] = (float)(2 * u01() - 1), p->v[i] = (float)(2 * u01() - 1);
    /* slots past each chunk's kv_len (and unowned pages) hold NaN: a kernel that lets them
     * into O fails */
    int *perm = malloc(total * sizeof(int));
    for (int i = 0; i < total; i++)
        perm[i] = i;
    for (int i = total - 1; i > 0; i--) {
        int j = randint(0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    p->tables = malloc((size_t)c->n_chunks * p->max_pages * sizeof(int32_t));
    for (int i = 0, next = 0; i < c->n_chunks; i++)
        for (int j = 0; j < p->max_pages; j++)
            p->tables[i * p->max_pages + j] = j < p->n_own[i] ? perm[next++] : -1;
    for (int i = 0; i < c->n_chunks; i++) {
        int last = p->tables[i * p->max_pages + p->n_own[i] - 1];
        for (int s = c->kv_lens[i] - (p->n_own[i] - 1) * p->pt; s < p->pt; s++)
            for (int kh = 0; kh < p->n_kv; kh++)
                for (int d = 0; d < p->hd; d++)
                    pool_row(p, p->k, last, kh, s)[d] = pool_row(p, p->v, last, kh, s)[d] = NAN;
    }
    free(perm);
}

static void pool_free(struct model_pool *p)
{
    free(p->k), free(p->v), free(p->tables), free(p->n_own);
}

/* One shared-memory stage: K and V tiles as 16-bit words addressed in bytes (f32 here, one
 * float per 2 bytes), written at the swizzled addresses the TMA uses. NaN = never written. */
struct stage {
    float k[TY_SM90_BN * 128], v[TY_SM90_BN * 128];
};

static float smem_read(const float *tile, uint32_t byte_off)
{
    return tile[ty_sm90_swizzle(byte_off) / 2];
}

/* The producer's work for tile t: boxes through the page table, then the zeroed tail. */
static void produce(struct stage *st, const struct model_pool *p, const int32_t *table, int n_own,
                    int kh, int t, int kv_end)
{
    const int hd = p->hd, box_rows = ty_sm90_box_rows(p->pt);
    for (size_t i = 0; i < sizeof(st->k) / sizeof(float); i++)
        st->k[i] = st->v[i] = NAN; /* stale: a read of an unwritten word shows */
    const int n_boxes = ty_sm90_tile_boxes(t, box_rows, kv_end);
    uint32_t written = 0;
    for (int j = 0; j < n_boxes; j++) {
        const int key = ty_sm90_box_key(t, j, box_rows);
        assert_true(key < kv_end);
        assert_true(key / p->pt < n_own); /* only the chunk's own table entries */
        for (int c = 0; c < hd / TY_SM90_COLS; c++) {
            struct ty_sm90_box b = ty_sm90_box_at(table, key, p->pt, c * TY_SM90_COLS, kh);
            assert_true(b.page >= 0 && b.page < p->n_pages);
            assert_true(b.slot + box_rows <= p->pt); /* a box never crosses its page */
            const uint32_t off = ty_sm90_smem_off(c, j * box_rows);
            assert_int_equal(off % 1024, 0); /* swizzle atoms aligned */
            for (int r = 0; r < box_rows; r++)
                for (int d = 0; d < TY_SM90_COLS; d++) {
                    const uint32_t a = ty_sm90_swizzle(off + r * 128 + d * 2) / 2;
                    assert_true(isnan(st->k[a]) && isnan(st->v[a])); /* no overlap */
                    st->k[a] = pool_row(p, p->k, b.page, kh, b.slot + r)[b.col + d];
                    st->v[a] = pool_row(p, p->v, b.page, kh, b.slot + r)[b.col + d];
                    if (isnan(st->k[a])) /* a NaN slot of the last page: mark as loaded */
                        st->k[a] = st->v[a] = INFINITY;
                    written += 4; /* K and V, 2 bytes each */
                }
        }
    }
    assert_int_equal(written, ty_sm90_tx_bytes(n_boxes, box_rows, hd));
    for (int r = ty_sm90_tail_row(t, kv_end); r < TY_SM90_BN; r++)
        for (int c = 0; c < hd / TY_SM90_COLS; c++)
            for (int d = 0; d < TY_SM90_COLS; d++) {
                const uint32_t a = ty_sm90_swizzle(ty_sm90_smem_off(c, r) + d * 2) / 2;
                st->k[a] = st->v[a] = 0.0f;
            }
    /* Put the pool's NaN slots back in: a loaded row past kv_len the tail did not zero
     * would poison O exactly as it would on the GPU. */
    for (size_t i = 0; i < sizeof(st->k) / sizeof(float); i++)
        if (isinf(st->k[i]))
            st->k[i] = st->v[i] = NAN;
}

/* wgmma B operand element (n, k) of k-step kk as the descriptor addresses it (PTX ISA matrix
 * descriptor, 128B swizzle): K-major (S = Q K^T: n a key, k a head_dim column) and MN-major
 * (O += P V: k a key, n a head_dim column). */
static float k_operand(const struct stage *st, int kk, int n, int k)
{
    const uint32_t a = ty_sm90_k_step_off(kk) + (n / 8) * TY_SM90_SBO + (n % 8) * 128 + k * 2;
    return smem_read(st->k, a);
}
static float v_operand(const struct stage *st, int kk, int k, int n)
{
    const uint32_t a = ty_sm90_v_step_off(kk) + (n / 64) * TY_SM90_V_LBO + (k / 8) * TY_SM90_SBO +
                       (k % 8) * 128 + (n % 64) * 2;
    return smem_read(st->v, a);
}

enum { FRAG_S = TY_SM90_BN / 2, FRAG_O_MAX = 64 };

/* One consumer warpgroup's registers: per warp and lane, S (BN/2), O (HD/2), m and l of the
 * two rows (g, g + 8). */
struct wg_regs {
    float s[4][32][FRAG_S], o[4][32][FRAG_O_MAX], m[4][32][2], l[4][32][2];
    float q[TY_SM90_WG_ROWS][128]; /* Q as gathered from the A fragments */
};

/* Runs one CTA (bx) of chunk ch, head h; writes its rows of out. visits counts scored
 * (row, key) pairs per chunk row. */
static void run_cta(const struct tcase *c, const struct model_pool *p, const float *q, float *out,
                    int *visits, int max_kv, int ch, int h, int bx, int nbx, int q_start,
                    struct stage *ring, struct wg_regs *wr)
{
    const int hd = c->hd, H = c->n_heads, q_len = c->q_lens[ch], kv_len = c->kv_lens[ch];
    const int kh = h / (H / c->n_kv);
    const int32_t *table = p->tables + (size_t)ch * p->max_pages;
    const int row0 = ty_sm90_cta_row0(bx, nbx), rows = ty_sm90_rows(row0, TY_SM90_BM, q_len);
    if (rows == 0)
        return;
    const int q_off = ty_sm90_q_off(q_len, kv_len);
    const int kv_end = ty_sm90_kv_end(q_off, row0, rows, kv_len);
    const int n_tiles = ty_sm90_n_tiles(kv_end);
    assert_true(kv_end <= kv_len && n_tiles * TY_SM90_BN >= kv_end);
    const float sl2 = (1.0f / sqrtf((float)hd)) * 1.4426950408889634f;

    for (int cw = 0; cw < TY_SM90_CONSUMERS; cw++) {
        const int wrow0 = cw * TY_SM90_WG_ROWS;
        const int wrows = ty_sm90_rows(wrow0, TY_SM90_WG_ROWS, rows);
        const int wkv_end = ty_sm90_kv_end(q_off, row0 + wrow0, wrows, kv_len);
        const int w_tiles = ty_sm90_n_tiles(wkv_end);
        assert_true(w_tiles <= n_tiles);
        /* Q through the A fragments: every element once */
        for (int r = 0; r < TY_SM90_WG_ROWS; r++)
            for (int d = 0; d < hd; d++)
                wr->q[r][d] = NAN;
        for (int w = 0; w < 4; w++)
            for (int lane = 0; lane < 32; lane++)
                for (int kk = 0; kk < hd / 16; kk++)
                    for (int i = 0; i < 4; i++)
                        for (int e = 0; e < 2; e++) {
                            const int r = ty_sm90_a_row(w, lane, i),
                                      d = ty_sm90_a_col(lane, kk, i, e);
                            assert_true(isnan(wr->q[r][d]));
                            wr->q[r][d] =
                                r < wrows
                                    ? q[((size_t)(q_start + row0 + wrow0 + r) * H + h) * hd + d]
                                    : 0.0f;
                        }
        for (int w = 0; w < 4; w++)
            for (int lane = 0; lane < 32; lane++) {
                wr->m[w][lane][0] = wr->m[w][lane][1] = -INFINITY;
                wr->l[w][lane][0] = wr->l[w][lane][1] = 0.0f;
                for (int i = 0; i < hd / 2; i++)
                    wr->o[w][lane][i] = 0.0f;
            }

        for (int t = 0; t < w_tiles; t++) {
            struct stage *st = &ring[ty_sm90_stage(t)];
            produce(st, p, table, p->n_own[ch], kh, t, kv_end);
            bool any_visible = false;
            for (int w = 0; w < 4; w++) {
                const int warp_min_pos = q_off + row0 + wrow0 + w * 16;
                const bool masked = ty_sm90_tile_masked(t, warp_min_pos, kv_end);
                for (int lane = 0; lane < 32; lane++)
                    for (int i = 0; i < FRAG_S; i++) {
                        const int r = ty_sm90_acc_row(w, lane, i), n = ty_sm90_acc_col(lane, i);
                        float s = 0.0f;
                        for (int kk = 0; kk < hd / 16; kk++)
                            for (int k = 0; k < 16; k++)
                                s += wr->q[r][kk * 16 + k] * k_operand(st, kk, n, k);
                        const int qpos = q_off + row0 + wrow0 + r, key = t * TY_SM90_BN + n;
                        const bool vis = ty_sm90_visible(qpos, key, kv_end);
                        if (!masked)
                            assert_true(vis); /* a tile the kernel leaves unmasked */
                        if (!vis)
                            s = -INFINITY;
                        else if (r < wrows) {
                            visits[(size_t)(row0 + wrow0 + r) * max_kv + key]++;
                            any_visible = true;
                        }
                        wr->s[w][lane][i] = s;
                    }
            }
            assert_true(any_visible); /* no tile of only masked scores */
            /* online softmax, the kernel's per-lane steps with the quad's max */
            float qmax[4][32][2]; /* the quad's row max (two shuffles), before any exp */
            for (int w = 0; w < 4; w++)
                for (int lane = 0; lane < 32; lane++)
                    for (int hf = 0; hf < 2; hf++) {
                        float mx = -INFINITY;
                        for (int l2 = lane & ~3; l2 < (lane & ~3) + 4; l2++)
                            for (int i = 0; i < FRAG_S; i++)
                                if (((i >> 1) & 1) == hf && wr->s[w][l2][i] > mx)
                                    mx = wr->s[w][l2][i];
                        qmax[w][lane][hf] = mx;
                    }
            for (int w = 0; w < 4; w++)
                for (int lane = 0; lane < 32; lane++)
                    for (int hf = 0; hf < 2; hf++) {
                        const float mx = qmax[w][lane][hf];
                        float *m = &wr->m[w][lane][hf];
                        const float mn = fmaxf(*m, mx * sl2), sub = mn == -INFINITY ? 0 : mn;
                        const float alpha = exp2f(*m - sub);
                        float rs = 0;
                        for (int i = 0; i < FRAG_S; i++)
                            if (((i >> 1) & 1) == hf)
                                wr->s[w][lane][i] = (wr->s[w][lane][i] == -INFINITY)
                                                        ? 0.0f
                                                        : exp2f(wr->s[w][lane][i] * sl2 - sub),
                                rs += wr->s[w][lane][i];
                        *m = mn;
                        wr->l[w][lane][hf] = wr->l[w][lane][hf] * alpha + rs;
                        for (int i = 0; i < hd / 2; i++)
                            if (((i >> 1) & 1) == hf)
                                wr->o[w][lane][i] *= alpha;
                    }
            /* O += P V: P's A fragment from S's registers (ty_sm90_p_src), V by descriptor */
            for (int w = 0; w < 4; w++)
                for (int lane = 0; lane < 32; lane++) {
                    float pa[TY_SM90_BN / 16][4][2];
                    for (int kk = 0; kk < TY_SM90_BN / 16; kk++)
                        for (int i = 0; i < 4; i++)
                            for (int e = 0; e < 2; e++) {
                                const int src = ty_sm90_p_src(kk, i, e);
                                assert_int_equal(ty_sm90_acc_row(w, lane, src),
                                                 ty_sm90_a_row(w, lane, i));
                                assert_int_equal(ty_sm90_acc_col(lane, src),
                                                 ty_sm90_a_col(lane, kk, i, e));
                                pa[kk][i][e] = wr->s[w][lane][src];
                            }
                    for (int i = 0; i < hd / 2; i++) {
                        const int r = ty_sm90_acc_row(w, lane, i), n = ty_sm90_acc_col(lane, i);
                        float acc = 0;
                        for (int kk = 0; kk < TY_SM90_BN / 16; kk++)
                            for (int k = 0; k < 16; k++) {
                                /* P[r][kk*16 + k] sits in the lane holding row r, column
                                 * kk*16 + k of the A fragment: find it in this warp */
                                const int lane2 = (r % 8) * 4 + (k % 8) / 2;
                                const int i2 = ((r % 16) >= 8) + 2 * (k >= 8), e2 = k & 1;
                                assert_int_equal(ty_sm90_a_row(w, lane2, i2), r);
                                assert_int_equal(ty_sm90_a_col(lane2, kk, i2, e2), kk * 16 + k);
                                float pv = lane2 == lane ? pa[kk][i2][e2] : NAN;
                                if (lane2 != lane)
                                    pv = wr->s[w][lane2][ty_sm90_p_src(kk, i2, e2)];
                                const float vv = v_operand(st, kk, k, n);
                                if (pv != 0.0f) /* the GPU multiplies 0 x V = 0 for V finite */
                                    acc += pv * vv;
                                else
                                    assert_false(isnan(vv)); /* a NaN V would poison O */
                            }
                        wr->o[w][lane][i] += acc;
                    }
                }
        }
        /* epilogue */
        for (int w = 0; w < 4; w++)
            for (int lane = 0; lane < 32; lane++)
                for (int hf = 0; hf < 2; hf++) {
                    float lv = 0;
                    for (int l2 = lane & ~3; l2 < (lane & ~3) + 4; l2++)
                        lv += wr->l[w][l2][hf];
                    const int r = ty_sm90_acc_row(w, lane, 2 * hf);
                    if (r >= wrows)
                        continue;
                    for (int i = 2 * hf; i < hd / 2; i += 4)
                        for (int e = 0; e < 2; e++)
                            out[((size_t)(q_start + row0 + wrow0 + r) * H + h) * hd +
                                ty_sm90_acc_col(lane, i + e)] = wr->o[w][lane][i + e] / lv;
                }
    }
}

/* softmax(q k^T / sqrt(hd)) v over keys [0, q_off + i], straight from the pool. */
static void naive(const struct tcase *c, const struct model_pool *p, const float *q, int ch,
                  int q_start, double *want)
{
    const int hd = c->hd, H = c->n_heads, q_off = c->kv_lens[ch] - c->q_lens[ch];
    double *sc = malloc((size_t)c->kv_lens[ch] * sizeof(double));
    for (int i = 0; i < c->q_lens[ch]; i++)
        for (int h = 0; h < H; h++) {
            const float *qr = q + ((size_t)(q_start + i) * H + h) * hd;
            const int kh = h / (H / c->n_kv), n_vis = q_off + i + 1;
            double mx = -INFINITY, z = 0;
            for (int key = 0; key < n_vis; key++) {
                const int page = p->tables[ch * p->max_pages + key / p->pt];
                const float *k = pool_row(p, p->k, page, kh, key % p->pt);
                double a = 0;
                for (int d = 0; d < hd; d++)
                    a += (double)qr[d] * k[d];
                sc[key] = a / sqrt((double)hd);
                mx = sc[key] > mx ? sc[key] : mx;
            }
            double *o = want + ((size_t)(q_start + i) * H + h) * hd;
            for (int d = 0; d < hd; d++)
                o[d] = 0;
            for (int key = 0; key < n_vis; key++) {
                const int page = p->tables[ch * p->max_pages + key / p->pt];
                const float *v = pool_row(p, p->v, page, kh, key % p->pt);
                const double w = exp(sc[key] - mx);
                z += w;
                for (int d = 0; d < hd; d++)
                    o[d] += w * v[d];
            }
            for (int d = 0; d < hd; d++)
                o[d] /= z;
        }
    free(sc);
}

static void check_case(const struct tcase *c)
{
    assert_true(ty_sm90_shape_ok(true, c->hd, c->page_tokens, 0));
    struct model_pool p;
    pool_make(&p, c);
    int rows = 0, max_q = 0, max_kv = 0, starts[4];
    for (int i = 0; i < c->n_chunks; i++) {
        starts[i] = rows;
        rows += c->q_lens[i];
        max_q = c->q_lens[i] > max_q ? c->q_lens[i] : max_q;
        max_kv = c->kv_lens[i] > max_kv ? c->kv_lens[i] : max_kv;
    }
    const size_t nq = (size_t)rows * c->n_heads * c->hd;
    float *q = malloc(nq * sizeof(float)), *got = malloc(nq * sizeof(float));
    double *want = malloc(nq * sizeof(double));
    for (size_t i = 0; i < nq; i++)
        q[i] = (float)(4 * u01() - 2), got[i] = NAN;
    struct stage *ring = malloc(TY_SM90_STAGES * sizeof(*ring));
    struct wg_regs *wr = malloc(sizeof(*wr));
    const int nbx = (max_q + TY_SM90_BM - 1) / TY_SM90_BM;
    for (int ch = 0; ch < c->n_chunks; ch++) {
        naive(c, &p, q, ch, starts[ch], want);
        for (int h = 0; h < c->n_heads; h++) {
            int *visits = calloc((size_t)c->q_lens[ch] * max_kv, sizeof(int));
            for (int bx = 0; bx < nbx; bx++)
                run_cta(c, &p, q, got, visits, max_kv, ch, h, bx, nbx, starts[ch], ring, wr);
            const int q_off = c->kv_lens[ch] - c->q_lens[ch];
            for (int i = 0; i < c->q_lens[ch]; i++)
                for (int key = 0; key < max_kv; key++)
                    if (visits[(size_t)i * max_kv + key] != (key <= q_off + i))
                        fail_msg("chunk %d head %d row %d key %d scored %d times", ch, h, i, key,
                                 visits[(size_t)i * max_kv + key]);
            free(visits);
        }
    }
    double err = 0;
    for (size_t i = 0; i < nq; i++) {
        const double e = fabs(got[i] - want[i]);
        if (!(e <= err)) /* NaN too */
            err = isnan(e) ? INFINITY : e;
    }
    if (!(err < 1e-4))
        fail_msg("H=%d kv=%d hd=%d B=%d: max |model - naive| = %g", c->n_heads, c->n_kv, c->hd,
                 c->page_tokens, err);
    free(q), free(got), free(want), free(ring), free(wr);
    pool_free(&p);
}

static void test_model_matches_naive(void **state)
{
    (void)state;
    static const struct tcase cases[] = {
        /* one tile, one short chunk, MHA, pages of 8 */
        {2, 2, 64, 8, 1, {5}, {5}},
        /* cached prefixes not a multiple of the tile, partial last pages, GQA 4 */
        {8, 2, 128, 16, 3, {200, 1, 129}, {333, 300, 129}},
        /* pages larger than the tile (a box is a tile), GQA 8, a 1-row CTA tail */
        {8, 1, 64, 256, 2, {257, 64}, {300, 700}},
        /* pages equal to the tile, GQA 2, rows that fill one warpgroup only */
        {4, 2, 128, 128, 2, {64, 65}, {64, 1000}},
        /* the benchmark's pages (64 tokens), GQA 4, a long prefix before a short chunk */
        {4, 1, 128, 64, 2, {300, 3}, {300, 1500}},
        /* pages of 32 (4 boxes per tile), q_off > 0 with q_len a tile multiple */
        {2, 1, 64, 32, 2, {256, 128}, {300, 128}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_case(&cases[i]);
}

/* The shapes the launcher routes here, and the loop-bound arithmetic on its edges. */
static void test_bounds_and_shapes(void **state)
{
    (void)state;
    assert_true(ty_sm90_shape_ok(true, 128, 16, 0));
    assert_true(ty_sm90_shape_ok(true, 64, 256, 0));
    assert_false(ty_sm90_shape_ok(false, 128, 16, 0)); /* f32 pool */
    assert_false(ty_sm90_shape_ok(true, 80, 16, 0));   /* head_dim */
    assert_false(ty_sm90_shape_ok(true, 128, 7, 0));   /* not whole swizzle atoms */
    assert_false(ty_sm90_shape_ok(true, 128, 48, 0));  /* does not divide the tile */
    assert_false(ty_sm90_shape_ok(true, 128, 192, 0)); /* not a multiple of it */
    assert_false(ty_sm90_shape_ok(true, 128, 16, 32)); /* sliding window */
    /* the last CTA of 300 rows starts first and holds 300 - 256 = 44 rows */
    assert_int_equal(ty_sm90_cta_row0(0, 3), 256);
    assert_int_equal(ty_sm90_rows(256, TY_SM90_BM, 300), 44);
    assert_int_equal(ty_sm90_rows(384, TY_SM90_BM, 300), 0);
    assert_int_equal(ty_sm90_kv_end(1000, 0, 1, 1001), 1001);
    assert_int_equal(ty_sm90_kv_end(10, 0, 0, 100), 0);
    assert_int_equal(ty_sm90_n_tiles(0), 0);
    assert_int_equal(ty_sm90_n_tiles(128), 1);
    assert_int_equal(ty_sm90_n_tiles(129), 2);
    assert_int_equal(ty_sm90_tail_row(0, 128), TY_SM90_BN);
    assert_int_equal(ty_sm90_tail_row(1, 129), 1);
    for (int t = 0; t < 8; t++) { /* the ring: stage t % S, parity flips once per round */
        assert_int_equal(ty_sm90_stage(t), t % TY_SM90_STAGES);
        assert_int_equal(ty_sm90_phase(t), (uint32_t)(t / TY_SM90_STAGES) & 1u);
    }
    /* descriptor fields: address, LBO, SBO >> 4 in 14-bit fields, 128B swizzle in 62-63 */
    const uint64_t d = ty_sm90_desc(0x1a400, TY_SM90_V_LBO, TY_SM90_SBO);
    assert_int_equal(d & 0x3fff, 0x1a40);
    assert_int_equal((d >> 16) & 0x3fff, TY_SM90_V_LBO >> 4);
    assert_int_equal((d >> 32) & 0x3fff, TY_SM90_SBO >> 4);
    assert_int_equal(d >> 62, 1);
    assert_int_equal((d >> 49) & 7, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds_and_shapes),
        cmocka_unit_test(test_model_matches_naive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
