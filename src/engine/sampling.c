/* Sampling. Candidates are ordered only as far as needed: top-k narrows the set by a partial
 * selection (then only the k survivors are sorted), top-p and min-p sort what is left, and a
 * draw with none of the three walks the vocabulary in index order without sorting (a full
 * sort of a 32k-128k vocabulary per token cost milliseconds per sequence per step). The
 * log-probabilities (one pass of exp over the vocabulary) are computed only when asked for. */
#include "tycho/sampling.h"

#include "tycho/errors.h"

#include <math.h>
#include <stdbool.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

struct cand {
    uint32_t id;
    float logit;
    float p;
};

struct ty_sampler {
    struct ty_sampling_params p;
    uint32_t n_vocab;
    uint64_t rng;
    struct cand *c;    /* (n_vocab) */
    struct cand *tmp;  /* (n_vocab) the radix sort's other buffer, made on first use */
    uint32_t *counts;  /* (n_vocab) occurrences in the penalty window; 0 between calls */
    uint32_t ban[TY_SAMPLE_MAX_BAN], n_ban; /* for the next draw only */
    struct ty_logit_adj *adj; /* ty_sampler_sample's adjustments (grown on demand) */
    uint32_t adj_cap;
};

int ty_sampler_new(ty_sampler_t **out, const struct ty_sampling_params *p, uint32_t n_vocab)
{
    *out = NULL;
    if (!n_vocab || p->n_logprobs > TY_SAMPLE_MAX_LOGPROBS || p->repetition_penalty < 0 ||
        !isfinite(p->temperature) || !isfinite(p->top_p) || !isfinite(p->min_p) ||
        p->min_p > 1 || p->n_logit_bias > TY_SAMPLE_MAX_LOGIT_BIAS)
        return TY_EINVAL;
    for (uint32_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].id >= n_vocab || !isfinite(p->logit_bias[i].bias))
            return TY_EINVAL;
    ty_sampler_t *s = calloc(1, sizeof(*s));
    if (!s)
        return TY_ENOMEM;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed ^ 0x9e3779b97f4a7c15ull;
    s->c = malloc(n_vocab * sizeof(*s->c));
    s->counts = calloc(n_vocab, sizeof(uint32_t));
    if (!s->c || !s->counts) {
        ty_sampler_free(s);
        return TY_ENOMEM;
    }
    *out = s;
    return 0;
}

void ty_sampler_free(ty_sampler_t *s)
{
    if (!s)
        return;
    free(s->c);
    free(s->tmp);
    free(s->counts);
    free(s->adj);
    free(s);
}

/* splitmix64 (Steele, Lea, Flood 2014): a uniform double in [0, 1). */
static double rng_next(ty_sampler_t *s)
{
    uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static bool penalties_on(const struct ty_sampling_params *p)
{
    bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1;
    return rep || p->presence_penalty != 0 || p->frequency_penalty != 0;
}

uint32_t ty_sampler_adj_count(const ty_sampler_t *s, size_t n)
{
    const struct ty_sampling_params *p = &s->p;
    size_t win = !penalties_on(p)                                 ? 0
                 : p->penalty_last_n && n > p->penalty_last_n ? p->penalty_last_n
                                                                  : n;
    size_t c = win + p->n_logit_bias + s->n_ban;
    return c > s->n_vocab ? s->n_vocab : (uint32_t)c;
}

#define ADJ_MARK 0x80000000u /* counts[id] = ADJ_MARK | entry: id has an entry already */

/* The entry of token id in adj[0..*k), made (rep 1, sub 0, bias 0) when id has none. */
static struct ty_logit_adj *adj_entry(ty_sampler_t *s, struct ty_logit_adj *adj, uint32_t *k,
                                      uint32_t id)
{
    if (s->counts[id] & ADJ_MARK)
        return &adj[s->counts[id] & ~ADJ_MARK];
    s->counts[id] = ADJ_MARK | *k;
    adj[*k] = (struct ty_logit_adj){id, 1.0f, 0.0f, 0.0f};
    return &adj[(*k)++];
}

int ty_sampler_prepare(ty_sampler_t *s, const uint32_t *h, size_t n, struct ty_row_draw *d,
                       struct ty_logit_adj *adj, uint32_t cap, uint32_t *n_adj)
{
    const struct ty_sampling_params *p = &s->p;
    if (cap < ty_sampler_adj_count(s, n))
        return TY_ENOSPC;
    uint32_t k = 0;
    if (penalties_on(p)) { /* one entry per distinct token of the window */
        bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1;
        size_t from = p->penalty_last_n && n > p->penalty_last_n ? n - p->penalty_last_n : 0;
        for (size_t i = from; i < n; i++)
            if (h[i] < s->n_vocab)
                s->counts[h[i]]++;
        for (size_t i = from; i < n; i++) {
            uint32_t id = h[i];
            if (id >= s->n_vocab || (s->counts[id] & ADJ_MARK))
                continue;
            float sub = p->presence_penalty + p->frequency_penalty * (float)s->counts[id];
            s->counts[id] = ADJ_MARK | k;
            adj[k++] = (struct ty_logit_adj){id, rep ? p->repetition_penalty : 1.0f, sub, 0.0f};
        }
    }
    for (uint32_t i = 0; i < p->n_logit_bias; i++)
        adj_entry(s, adj, &k, p->logit_bias[i].id)->bias += p->logit_bias[i].bias;
    for (uint32_t i = 0; i < s->n_ban; i++)
        adj_entry(s, adj, &k, s->ban[i])->bias = -INFINITY;
    for (uint32_t i = 0; i < k; i++)
        s->counts[adj[i].id] = 0;
    s->n_ban = 0;
    *d = (struct ty_row_draw){.temperature = p->temperature, .top_p = p->top_p,
                              .min_p = p->min_p, .top_k = p->top_k, .n_adj = k,
                              .n_logprobs = p->n_logprobs,
                              .logprobs = p->logprobs || p->n_logprobs};
    if (p->temperature > 0)
        d->u = rng_next(s);
    *n_adj = k;
    return 0;
}

static int cmp_logit_desc(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static bool before(const struct cand *x, const struct cand *y)
{
    return x->logit > y->logit || (x->logit == y->logit && x->id < y->id);
}

/* The candidate's place in cmp_logit_desc order as one unsigned key: the logit's bits made
 * monotonic (negative floats reversed) and inverted (larger logits first) above the id. */
static uint64_t order_key(const struct cand *x)
{
    uint32_t u;
    memcpy(&u, &x->logit, sizeof(u));
    u = u & 0x80000000u ? ~u : u | 0x80000000u; /* ascending with the float */
    return (uint64_t)~u << 32 | x->id;
}

/* Sorts c[0..n) in cmp_logit_desc order: qsort for short runs, else a least-significant-digit
 * radix sort on order_key (11-bit digits, a pass skipped where every key has the same digit,
 * as the id's high bits do) through the sampler's second buffer (made here, once; without
 * memory for it, qsort). */
static void sort_desc(ty_sampler_t *s, struct cand *c, uint32_t n)
{
    enum { BITS = 11, PASSES = 6, BUCKETS = 1 << BITS };
    if (n >= 2048 && !s->tmp)
        s->tmp = malloc(s->n_vocab * sizeof(*s->tmp));
    if (n < 2048 || !s->tmp) {
        qsort(c, n, sizeof(*c), cmp_logit_desc);
        return;
    }
    struct cand *tmp = s->tmp;
    static _Thread_local uint32_t hist[PASSES][BUCKETS];
    memset(hist, 0, sizeof(hist));
    for (uint32_t i = 0; i < n; i++) {
        uint64_t k = order_key(&c[i]);
        for (int d = 0; d < PASSES; d++)
            hist[d][(k >> (d * BITS)) & (BUCKETS - 1)]++;
    }
    struct cand *src = c, *dst = tmp;
    for (int d = 0; d < PASSES; d++) {
        uint32_t *h = hist[d], sum = 0;
        if (h[(order_key(&src[0]) >> (d * BITS)) & (BUCKETS - 1)] == n)
            continue; /* one digit for all: nothing moves */
        for (uint32_t b = 0; b < BUCKETS; b++) {
            uint32_t t = h[b];
            h[b] = sum;
            sum += t;
        }
        for (uint32_t i = 0; i < n; i++)
            dst[h[(order_key(&src[i]) >> (d * BITS)) & (BUCKETS - 1)]++] = src[i];
        struct cand *t = src;
        src = dst, dst = t;
    }
    if (src != c)
        memcpy(c, src, n * sizeof(*c));
}

/* Moves the k first candidates in cmp_logit_desc order (a strict order: ids are unique) into
 * c[0..k), in no particular order (quickselect; k < n). */
static void select_top(struct cand *c, uint32_t n, uint32_t k)
{
    uint32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        struct cand pivot = c[lo + (hi - lo) / 2];
        uint32_t i = lo, j = hi;
        while (i <= j) {
            while (before(&c[i], &pivot))
                i++;
            while (before(&pivot, &c[j]))
                j--;
            if (i <= j) {
                struct cand t = c[i];
                c[i] = c[j], c[j] = t;
                i++;
                if (j == 0)
                    break;
                j--;
            }
        }
        /* now c[lo..j] come before c[i..hi]; the element at k - 1 decides the side */
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            return;
    }
}

/* row_max and first_equal are the two passes of greedy decoding over a row of logits, at the
 * speed of reading the row (SSE2 registers, no loop-carried compare-and-branch).
 * row_max: the largest of l[0..n), -inf when empty or all NaN (MAXPS returns its second
 * operand when the first is NaN, so NaNs never win). */
static float row_max(const float *l, uint32_t n)
{
    uint32_t i = 0;
    float m = -INFINITY;
#if defined(__SSE2__)
    __m128 a = _mm_set1_ps(-INFINITY), b = a, c = a, d = a;
    for (; i + 16 <= n; i += 16) {
        a = _mm_max_ps(_mm_loadu_ps(l + i), a);
        b = _mm_max_ps(_mm_loadu_ps(l + i + 4), b);
        c = _mm_max_ps(_mm_loadu_ps(l + i + 8), c);
        d = _mm_max_ps(_mm_loadu_ps(l + i + 12), d);
    }
    float lane[4];
    _mm_storeu_ps(lane, _mm_max_ps(_mm_max_ps(a, b), _mm_max_ps(c, d)));
    for (int k = 0; k < 4; k++)
        m = lane[k] > m ? lane[k] : m;
#endif
    for (; i < n; i++)
        m = l[i] > m ? l[i] : m;
    return m;
}

/* The first index holding v (0 when none does). */
static uint32_t first_equal(const float *l, uint32_t n, float v)
{
    uint32_t i = 0;
#if defined(__SSE2__)
    __m128 vv = _mm_set1_ps(v);
    for (; i + 4 <= n; i += 4)
        if (_mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(l + i), vv)))
            break;
#endif
    for (; i < n; i++)
        if (l[i] == v)
            return i;
    return 0; /* not there (every logit NaN): the first */
}

/* The first index of the largest logit (NaNs never win). */
uint32_t ty_logits_argmax(const float *l, uint32_t n)
{
    return first_equal(l, n, row_max(l, n));
}

bool ty_sampler_plain_greedy(const ty_sampler_t *s)
{
    const struct ty_sampling_params *p = &s->p;
    bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1;
    return p->temperature <= 0 && !rep && p->presence_penalty == 0 && p->frequency_penalty == 0 &&
           !p->n_logit_bias && !s->n_ban && !p->logprobs && !p->n_logprobs;
}

/* Log-softmax statistics: max and log-sum-exp of the full row. */
static void row_lse(const float *l, uint32_t n, float *mx, double *lse)
{
    float m = row_max(l, n);
    double sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += exp((double)l[i] - m);
    *mx = m;
    *lse = log(sum);
}

static void fill_logprobs(ty_sampler_t *s, const float *logits, uint32_t n_logprobs,
                          struct ty_sample *out)
{
    float mx;
    double lse;
    row_lse(logits, s->n_vocab, &mx, &lse);
    out->logprob = (float)((double)logits[out->id] - mx - lse);
    /* one pass keeping the best n in descending order (insertion) */
    uint32_t k = n_logprobs < s->n_vocab ? n_logprobs : s->n_vocab, n = 0;
    for (uint32_t i = 0; i < s->n_vocab && k; i++) {
        if (n == k && logits[i] <= logits[out->top[n - 1].id])
            continue;
        uint32_t j = n < k ? n++ : k - 1;
        while (j > 0 && logits[out->top[j - 1].id] < logits[i]) {
            out->top[j] = out->top[j - 1];
            j--;
        }
        out->top[j].id = i;
    }
    for (uint32_t j = 0; j < n; j++)
        out->top[j].logprob = (float)((double)logits[out->top[j].id] - mx - lse);
    out->n_top = n;
}

/* Sorts the candidates c[0..n) in cmp_logit_desc order only as far as the top-p and min-p
 * cuts need (their probabilities are set), and returns the count kept: the shortest sorted
 * prefix whose mass reaches top_p, cut further to the tokens with p >= min_p x the largest
 * (at least one). A trained model's nucleus is a few hundred tokens of a vocabulary of 150k,
 * so instead of sorting the vocabulary for every token:
 * - only the candidates that can be kept take part (moved to the front): min-p keeps
 *   p >= p_max x min_p, and the nucleus lies within the tokens with p >= (1 - top_p) / 2n,
 *   since all the others together hold less than half of the mass top-p drops;
 * - of those, the best 256 are selected in linear time and sorted; only when they do not
 *   reach the mass are the others sorted too (a radix sort when there are many). */
static uint32_t cut_sorted(ty_sampler_t *s, uint32_t n, float top_p, float min_p, float p_max)
{
    struct cand *c = s->c;
    bool nucleus = top_p > 0 && top_p < 1;
    float t = min_p > 0 ? p_max * min_p : 0;
    if (nucleus && (float)((1.0 - top_p) / (2.0 * n)) > t)
        t = (float)((1.0 - top_p) / (2.0 * n));
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (c[i].p >= t) {
            struct cand x = c[m];
            c[m++] = c[i];
            c[i] = x;
        }
    }
    if (!m) { /* only NaN probabilities are below every threshold: the best alone */
        if (n > 1)
            select_top(c, n, 1);
        return 1;
    }
    uint32_t done = 0, k = nucleus && m > 256 ? 256 : m;
    double cum = 0;
    for (;;) { /* c[0..done) sorted and the best; bring in the next k - done */
        if (k < m)
            select_top(c + done, m - done, k - done);
        sort_desc(s, c + done, k - done);
        if (!nucleus)
            return k;
        for (uint32_t i = done; i < k; i++) {
            cum += c[i].p;
            if (cum >= top_p)
                return i + 1;
        }
        if (k >= m)
            return k; /* the min-p cut comes first (or rounding kept the mass under top_p) */
        done = k;
        k = m;
    }
}

/* top-k, temperature, softmax, top-p, min-p over the candidates; returns the kept count. */
static uint32_t filter(ty_sampler_t *s, const float *logits, const struct ty_row_draw *p)
{
    uint32_t n = s->n_vocab;
    for (uint32_t i = 0; i < n; i++)
        s->c[i] = (struct cand){i, logits[i], 0};
    bool sorted = false; /* c[0..n) in order (top-k) */
    if (p->top_k && p->top_k < n) {
        select_top(s->c, n, p->top_k);
        n = p->top_k;
        sort_desc(s, s->c, n);
        sorted = true;
    }
    float mx = sorted ? s->c[0].logit : row_max(logits, n);
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        s->c[i].p = expf((s->c[i].logit - mx) / p->temperature);
        sum += s->c[i].p;
    }
    for (uint32_t i = 0; i < n; i++)
        s->c[i].p = (float)(s->c[i].p / sum);
    bool nucleus = p->top_p > 0 && p->top_p < 1;
    if (!nucleus && !(p->min_p > 0))
        return n; /* no cut needs the order: the draw walks the candidates as they are */
    return cut_sorted(s, n, nucleus ? p->top_p : 0, p->min_p, (float)(1.0 / sum));
}

void ty_sampler_ban_next(ty_sampler_t *s, const uint32_t *ids, size_t n)
{
    s->n_ban = 0;
    for (size_t i = 0; i < n && s->n_ban < TY_SAMPLE_MAX_BAN; i++)
        if (ids[i] < s->n_vocab)
            s->ban[s->n_ban++] = ids[i];
}

void ty_sampler_draw(ty_sampler_t *s, float *logits, const struct ty_row_draw *d,
                     const struct ty_logit_adj *adj, struct ty_sample *out)
{
    memset(out, 0, sizeof(*out));
    for (uint32_t i = 0; i < d->n_adj; i++) {
        const struct ty_logit_adj *a = &adj[i];
        if (a->id >= s->n_vocab)
            continue;
        float l = logits[a->id];
        if (a->rep != 1.0f)
            l = l > 0 ? l / a->rep : l * a->rep;
        l -= a->sub;
        l += a->bias;
        logits[a->id] = l;
    }
    if (d->temperature <= 0) {
        out->id = ty_logits_argmax(logits, s->n_vocab);
    } else {
        uint32_t n = filter(s, logits, d);
        double sum = 0;
        for (uint32_t i = 0; i < n; i++)
            sum += s->c[i].p;
        double r = d->u * sum, acc = 0;
        out->id = s->c[n - 1].id;
        for (uint32_t i = 0; i < n; i++) {
            acc += s->c[i].p;
            if (r < acc) {
                out->id = s->c[i].id;
                break;
            }
        }
    }
    if (d->logprobs || d->n_logprobs)
        fill_logprobs(s, logits, d->n_logprobs, out);
}

int ty_sampler_sample(ty_sampler_t *s, float *logits, const uint32_t *history, size_t n_history,
                      struct ty_sample *out)
{
    uint32_t need = ty_sampler_adj_count(s, n_history), n_adj;
    if (need > s->adj_cap) {
        struct ty_logit_adj *a = realloc(s->adj, need * sizeof(*a));
        if (!a)
            return TY_ENOMEM;
        s->adj = a;
        s->adj_cap = need;
    }
    struct ty_row_draw d;
    int rc = ty_sampler_prepare(s, history, n_history, &d, s->adj, s->adj_cap, &n_adj);
    if (rc)
        return rc;
    ty_sampler_draw(s, logits, &d, s->adj, out);
    return 0;
}
