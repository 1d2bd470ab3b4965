/* Metrics registry and Prometheus text format 0.0.4 rendering (see metrics.h).
 *
 * Values are doubles kept as their bit patterns in _Atomic uint64_t and updated with CAS, so
 * updates never lock. Children are appended to a per-family list under the family mutex; the
 * renderer walks that list under the same mutex, which child lookups take but updates never
 * do. Histogram buckets count per bucket; cumulative counts are summed
 * while rendering, and _count is the sum of all buckets, so _count always equals the +Inf
 * bucket even under concurrent updates.
 */
#include "tycho/metrics.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum kind { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM };

struct ty_metrics_child {
    struct ty_metrics_child *next; /* creation order is kept by appending */
    char **label_values;
    _Atomic uint64_t value;        /* double bits: counter/gauge value, histogram sum */
    _Atomic uint64_t *buckets;     /* histograms: n_bounds + 1 counts (last is +Inf) */
    const struct ty_metrics_family *fam;
};

struct ty_metrics_family {
    struct ty_metrics_family *next;
    enum kind kind;
    char *name, *help;
    char *label_names[TY_METRICS_MAX_LABELS];
    size_t n_labels;
    double *bounds;
    size_t n_bounds;
    pthread_mutex_t lock;
    struct ty_metrics_child *head, *tail;
};

struct ty_metrics_registry {
    pthread_mutex_t lock;
    struct ty_metrics_family *head, *tail;
};

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

static double bitsd(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

static char *xstrdup(const char *s)
{
    char *p = strdup(s ? s : "");
    TY_ASSERT(p);
    return p;
}

int ty_metrics_registry_new(ty_metrics_registry_t **out)
{
    ty_metrics_registry_t *reg = calloc(1, sizeof(*reg));
    TY_ASSERT(reg);
    pthread_mutex_init(&reg->lock, NULL);
    *out = reg;
    return 0;
}

static void child_free(struct ty_metrics_child *c, size_t n_labels)
{
    for (size_t i = 0; i < n_labels; i++)
        free(c->label_values[i]);
    free(c->label_values);
    free(c->buckets);
    free(c);
}

static void family_free(struct ty_metrics_family *f)
{
    for (struct ty_metrics_child *c = f->head, *n; c; c = n) {
        n = c->next;
        child_free(c, f->n_labels);
    }
    for (size_t i = 0; i < f->n_labels; i++)
        free(f->label_names[i]);
    pthread_mutex_destroy(&f->lock);
    free(f->bounds);
    free(f->name);
    free(f->help);
    free(f);
}

void ty_metrics_registry_free(ty_metrics_registry_t *reg)
{
    if (!reg)
        return;
    for (struct ty_metrics_family *f = reg->head, *n; f; f = n) {
        n = f->next;
        family_free(f);
    }
    pthread_mutex_destroy(&reg->lock);
    free(reg);
}

/* ---- registration ------------------------------------------------------------------------- */

static bool name_ok(const char *s, bool colon)
{
    if (!s || !*s)
        return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                     (colon && c == ':');
        if (!alpha && !(p != s && c >= '0' && c <= '9'))
            return false;
    }
    return true;
}

static int check_family(ty_metrics_registry_t *reg, enum kind kind, const char *name,
                        const char *const *labels, size_t n_labels)
{
    if (!name_ok(name, true) || n_labels > TY_METRICS_MAX_LABELS || (n_labels && !labels))
        return TY_EINVAL;
    for (size_t i = 0; i < n_labels; i++) {
        if (!name_ok(labels[i], false) || !strncmp(labels[i], "__", 2) ||
            (kind == KIND_HISTOGRAM && !strcmp(labels[i], "le")))
            return TY_EINVAL;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(labels[i], labels[j]))
                return TY_EINVAL;
    }
    for (struct ty_metrics_family *f = reg->head; f; f = f->next)
        if (!strcmp(f->name, name))
            return TY_EEXIST;
    return 0;
}

static int family_new(ty_metrics_registry_t *reg, ty_metrics_family_t **out, enum kind kind,
                      const char *name, const char *help, const char *const *labels,
                      size_t n_labels, const double *bounds, size_t n_bounds)
{
    pthread_mutex_lock(&reg->lock);
    int rc = check_family(reg, kind, name, labels, n_labels);
    if (rc != 0) {
        pthread_mutex_unlock(&reg->lock);
        return rc;
    }
    struct ty_metrics_family *f = calloc(1, sizeof(*f));
    TY_ASSERT(f);
    f->kind = kind;
    f->name = xstrdup(name);
    f->help = xstrdup(help);
    f->n_labels = n_labels;
    for (size_t i = 0; i < n_labels; i++)
        f->label_names[i] = xstrdup(labels[i]);
    if (n_bounds) {
        f->bounds = malloc(n_bounds * sizeof(*bounds));
        TY_ASSERT(f->bounds);
        memcpy(f->bounds, bounds, n_bounds * sizeof(*bounds));
    }
    f->n_bounds = n_bounds;
    pthread_mutex_init(&f->lock, NULL);
    if (reg->tail)
        reg->tail->next = f;
    else
        reg->head = f;
    reg->tail = f;
    pthread_mutex_unlock(&reg->lock);
    *out = f;
    return 0;
}

int ty_metrics_counter_new(ty_metrics_registry_t *reg, ty_metrics_family_t **out,
                           const char *name, const char *help, const char *const *label_names,
                           size_t n_labels)
{
    return family_new(reg, out, KIND_COUNTER, name, help, label_names, n_labels, NULL, 0);
}

int ty_metrics_gauge_new(ty_metrics_registry_t *reg, ty_metrics_family_t **out, const char *name,
                         const char *help, const char *const *label_names, size_t n_labels)
{
    return family_new(reg, out, KIND_GAUGE, name, help, label_names, n_labels, NULL, 0);
}

int ty_metrics_histogram_new(ty_metrics_registry_t *reg, ty_metrics_family_t **out,
                             const char *name, const char *help, const char *const *label_names,
                             size_t n_labels, const double *bounds, size_t n_bounds)
{
    if (n_bounds > TY_METRICS_MAX_BUCKETS || (n_bounds && !bounds))
        return TY_EINVAL;
    for (size_t i = 0; i < n_bounds; i++)
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
            return TY_EINVAL;
    return family_new(reg, out, KIND_HISTOGRAM, name, help, label_names, n_labels, bounds,
                      n_bounds);
}

/* ---- children ----------------------------------------------------------------------------- */

static bool labels_match(const struct ty_metrics_child *c, const char *const *values, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(c->label_values[i], values[i] ? values[i] : "") != 0)
            return false;
    return true;
}

int ty_metrics_child_get(ty_metrics_family_t *fam, const char *const *label_values,
                         ty_metrics_child_t **out)
{
    if (fam->n_labels && !label_values)
        return TY_EINVAL;
    pthread_mutex_lock(&fam->lock);
    for (struct ty_metrics_child *c = fam->head; c; c = c->next) {
        if (labels_match(c, label_values, fam->n_labels)) {
            pthread_mutex_unlock(&fam->lock);
            *out = c;
            return 0;
        }
    }
    struct ty_metrics_child *c = calloc(1, sizeof(*c));
    TY_ASSERT(c);
    c->fam = fam;
    c->label_values = calloc(fam->n_labels ? fam->n_labels : 1, sizeof(char *));
    TY_ASSERT(c->label_values);
    for (size_t i = 0; i < fam->n_labels; i++)
        c->label_values[i] = xstrdup(label_values[i]);
    if (fam->kind == KIND_HISTOGRAM) {
        c->buckets = calloc(fam->n_bounds + 1, sizeof(*c->buckets));
        TY_ASSERT(c->buckets);
    }
    atomic_init(&c->value, dbits(0.0));
    if (fam->tail)
        fam->tail->next = c;
    else
        fam->head = c;
    fam->tail = c;
    pthread_mutex_unlock(&fam->lock);
    *out = c;
    return 0;
}

void ty_metrics_child_remove(ty_metrics_child_t *c)
{
    if (!c)
        return;
    struct ty_metrics_family *fam = (struct ty_metrics_family *)c->fam;
    pthread_mutex_lock(&fam->lock);
    struct ty_metrics_child *prev = NULL, *it = fam->head;
    while (it && it != c) {
        prev = it;
        it = it->next;
    }
    TY_ASSERT(it); /* a child of this family */
    if (prev)
        prev->next = c->next;
    else
        fam->head = c->next;
    if (fam->tail == c)
        fam->tail = prev;
    pthread_mutex_unlock(&fam->lock);
    child_free(c, fam->n_labels);
}

static void atomic_add_double(_Atomic uint64_t *a, double v)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, dbits(bitsd(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

void ty_metrics_counter_inc(ty_metrics_child_t *c)
{
    atomic_add_double(&c->value, 1.0);
}

void ty_metrics_counter_add(ty_metrics_child_t *c, double v)
{
    if (v > 0)
        atomic_add_double(&c->value, v);
}

void ty_metrics_counter_follow(ty_metrics_child_t *c, uint64_t now, uint64_t *seen)
{
    if (c && now > *seen)
        ty_metrics_counter_add(c, (double)(now - *seen));
    *seen = now;
}

void ty_metrics_gauge_set(ty_metrics_child_t *c, double v)
{
    atomic_store_explicit(&c->value, dbits(v), memory_order_relaxed);
}

void ty_metrics_gauge_add(ty_metrics_child_t *c, double v)
{
    atomic_add_double(&c->value, v);
}

void ty_metrics_histogram_observe(ty_metrics_child_t *c, double v)
{
    const struct ty_metrics_family *f = c->fam;
    size_t lo = 0, hi = f->n_bounds; /* first bucket whose bound >= v; n_bounds is +Inf */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v <= f->bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    atomic_fetch_add_explicit(&c->buckets[lo], 1, memory_order_relaxed);
    atomic_add_double(&c->value, v);
}

double ty_metrics_child_value(const ty_metrics_child_t *c)
{
    return bitsd(atomic_load_explicit(&((ty_metrics_child_t *)c)->value, memory_order_relaxed));
}

/* ---- rendering ---------------------------------------------------------------------------- */

/* As Prometheus' Go clients print (strconv 'g', shortest): the fewest digits that read back,
 * in exponent form when the exponent is below -4 or at least 6. */
static void put_double(FILE *f, double v)
{
    if (isnan(v)) {
        fputs("NaN", f);
        return;
    }
    if (isinf(v)) {
        fputs(v > 0 ? "+Inf" : "-Inf", f);
        return;
    }
    char tmp[48];
    int digits = 1;
    for (; digits <= 17; digits++) {
        snprintf(tmp, sizeof(tmp), "%.*e", digits - 1, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    int exp = atoi(strchr(tmp, 'e') + 1);
    if (v == 0)
        exp = 0;
    if (exp >= -4 && exp < 6) {
        int decimals = digits - 1 - exp;
        snprintf(tmp, sizeof(tmp), "%.*f", decimals > 0 ? decimals : 0, v);
    }
    fputs(tmp, f);
}

/* HELP text escapes '\' and newline; label values also escape '"'. */
static void put_escaped(FILE *f, const char *s, bool quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\\\", f);
        else if (*s == '\n')
            fputs("\\n", f);
        else if (quote && *s == '"')
            fputs("\\\"", f);
        else
            fputc(*s, f);
    }
}

static void put_labels(FILE *f, const struct ty_metrics_family *fam,
                       const struct ty_metrics_child *c, const char *le)
{
    if (!fam->n_labels && !le)
        return;
    fputc('{', f);
    for (size_t i = 0; i < fam->n_labels; i++) {
        fprintf(f, "%s%s=\"", i ? "," : "", fam->label_names[i]);
        put_escaped(f, c->label_values[i], true);
        fputc('"', f);
    }
    if (le)
        fprintf(f, "%sle=\"%s\"", fam->n_labels ? "," : "", le);
    fputc('}', f);
}

static void render_histogram(FILE *f, const struct ty_metrics_family *fam,
                             struct ty_metrics_child *c)
{
    uint64_t cum = 0;
    for (size_t b = 0; b <= fam->n_bounds; b++) {
        char le[40];
        if (b == fam->n_bounds) {
            snprintf(le, sizeof(le), "+Inf");
        } else {
            FILE *m = fmemopen(le, sizeof(le), "w");
            put_double(m, fam->bounds[b]);
            fputc('\0', m);
            fclose(m);
        }
        cum += atomic_load_explicit(&c->buckets[b], memory_order_relaxed);
        fprintf(f, "%s_bucket", fam->name);
        put_labels(f, fam, c, le);
        fprintf(f, " %llu\n", (unsigned long long)cum);
    }
    fprintf(f, "%s_sum", fam->name);
    put_labels(f, fam, c, NULL);
    fputc(' ', f);
    put_double(f, ty_metrics_child_value(c));
    fprintf(f, "\n%s_count", fam->name);
    put_labels(f, fam, c, NULL);
    fprintf(f, " %llu\n", (unsigned long long)cum);
}

static void render_family(FILE *f, struct ty_metrics_family *fam)
{
    static const char *const types[] = {"counter", "gauge", "histogram"};
    fprintf(f, "# HELP %s ", fam->name);
    put_escaped(f, fam->help, false);
    fprintf(f, "\n# TYPE %s %s\n", fam->name, types[fam->kind]);
    pthread_mutex_lock(&fam->lock);
    for (struct ty_metrics_child *c = fam->head; c; c = c->next) {
        if (fam->kind == KIND_HISTOGRAM) {
            render_histogram(f, fam, c);
            continue;
        }
        fputs(fam->name, f);
        put_labels(f, fam, c, NULL);
        fputc(' ', f);
        put_double(f, ty_metrics_child_value(c));
        fputc('\n', f);
    }
    pthread_mutex_unlock(&fam->lock);
}

int ty_metrics_render(ty_metrics_registry_t *reg, char **out, size_t *len)
{
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f)
        return TY_ENOMEM;
    pthread_mutex_lock(&reg->lock);
    for (struct ty_metrics_family *fam = reg->head; fam; fam = fam->next)
        render_family(f, fam);
    pthread_mutex_unlock(&reg->lock);
    if (fclose(f) != 0) {
        free(text);
        return TY_ENOMEM;
    }
    *out = text;
    if (len)
        *len = n;
    return 0;
}
