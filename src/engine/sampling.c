/* Sampling. Candidates are ordered only as far as needed: top-k narrows the set by a partial
 * selection (then only the k survivors are sorted), top-p and min-p sort what is left, and a
 * draw with none of the three walks the vocabulary in index order without sorting (a full
 * sort of a 32k-128k vocabulary per token cost milliseconds per sequence per step). The
 * log-probabilities (one pass of exp over the vocabulary) are computed only when asked for. */
#include "tycho/sampling.h"

#include "tycho/errors.h"

#include <math.h>
#include <stdbool.h>
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
    uint32_t *counts;  /* (n_vocab) occurrences in the penalty window */
};

int ty_sampler_new(ty_sampler_t **out, const struct ty_sampling_params *p, uint32_t n_vocab)
{
    *out = NULL;
    if (!n_vocab || p->n_logprobs > TY_SAMPLE_MAX_LOGPROBS || p->repetition_penalty < 0 ||
        !isfinite(p->temperature) || !isfinite(p->top_p) || !isfinite(p->min_p) ||
        p->min_p > 1)
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
    free(s->counts);
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

static void apply_penalties(ty_sampler_t *s, float *logits, const uint32_t *h, size_t n)
{
    const struct ty_sampling_params *p = &s->p;
    bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1;
    if (!rep && p->presence_penalty == 0 && p->frequency_penalty == 0)
        return;
    size_t from = p->penalty_last_n && n > p->penalty_last_n ? n - p->penalty_last_n : 0;
    for (size_t i = from; i < n; i++)
        if (h[i] < s->n_vocab)
            s->counts[h[i]]++;
    for (size_t i = from; i < n; i++) {
        uint32_t id = h[i];
        if (id >= s->n_vocab || !s->counts[id])
            continue;
        float l = logits[id];
        if (rep)
            l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)s->counts[id];
        logits[id] = l;
        s->counts[id] = 0; /* each distinct token once; also resets the table */
    }
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

/* Log-softmax statistics: max and log-sum-exp of the full row. */
static void row_lse(const float *l, uint32_t n, float *mx, double *lse)
{
    float m = -INFINITY;
    for (uint32_t i = 0; i < n; i++)
        m = l[i] > m ? l[i] : m;
    double sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += exp((double)l[i] - m);
    *mx = m;
    *lse = log(sum);
}

static void fill_logprobs(ty_sampler_t *s, const float *logits, struct ty_sample *out)
{
    float mx;
    double lse;
    row_lse(logits, s->n_vocab, &mx, &lse);
    out->logprob = (float)((double)logits[out->id] - mx - lse);
    /* one pass keeping the best n in descending order (insertion) */
    uint32_t k = s->p.n_logprobs < s->n_vocab ? s->p.n_logprobs : s->n_vocab, n = 0;
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

static uint32_t argmax(const float *l, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

/* top-k, temperature, softmax, top-p, min-p over the candidates; returns the kept count. */
static uint32_t filter(ty_sampler_t *s, const float *logits)
{
    const struct ty_sampling_params *p = &s->p;
    uint32_t n = s->n_vocab;
    for (uint32_t i = 0; i < n; i++)
        s->c[i] = (struct cand){i, logits[i], 0};
    bool sorted = true;
    if (p->top_k && p->top_k < n) {
        select_top(s->c, n, p->top_k);
        n = p->top_k;
        qsort(s->c, n, sizeof(*s->c), cmp_logit_desc);
    } else if ((p->top_p > 0 && p->top_p < 1) || p->min_p > 0) {
        qsort(s->c, n, sizeof(*s->c), cmp_logit_desc);
    } else {
        sorted = false; /* no filter needs the order: the draw walks index order */
    }
    float mx = s->c[0].logit; /* the largest when sorted */
    for (uint32_t i = 1; !sorted && i < n; i++)
        mx = s->c[i].logit > mx ? s->c[i].logit : mx;
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        s->c[i].p = expf((s->c[i].logit - mx) / p->temperature);
        sum += s->c[i].p;
    }
    for (uint32_t i = 0; i < n; i++)
        s->c[i].p = (float)(s->c[i].p / sum);
    if (p->top_p > 0 && p->top_p < 1) {
        double cum = 0;
        for (uint32_t i = 0; i < n; i++) {
            cum += s->c[i].p;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        float thr = s->c[0].p * p->min_p;
        uint32_t k = 1;
        while (k < n && s->c[k].p >= thr)
            k++;
        n = k;
    }
    return n;
}

int ty_sampler_sample(ty_sampler_t *s, float *logits, const uint32_t *history, size_t n_history,
                      struct ty_sample *out)
{
    memset(out, 0, sizeof(*out));
    apply_penalties(s, logits, history, n_history);
    if (s->p.temperature <= 0) {
        out->id = argmax(logits, s->n_vocab);
    } else {
        uint32_t n = filter(s, logits);
        double sum = 0;
        for (uint32_t i = 0; i < n; i++)
            sum += s->c[i].p;
        double r = rng_next(s) * sum, acc = 0;
        out->id = s->c[n - 1].id;
        for (uint32_t i = 0; i < n; i++) {
            acc += s->c[i].p;
            if (r < acc) {
                out->id = s->c[i].id;
                break;
            }
        }
    }
    if (s->p.logprobs || s->p.n_logprobs)
        fill_logprobs(s, logits, out);
    return 0;
}
