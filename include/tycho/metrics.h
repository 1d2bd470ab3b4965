/* Metrics registry: counters, gauges and histograms with labels, rendered in the Prometheus
 * text exposition format 0.0.4.
 *
 * A family (name, help, label names, and for histograms the bucket bounds fixed at creation)
 * has one child per distinct tuple of label values. Look a child up once (ty_metrics_*_child,
 * which takes the family's mutex) and keep the pointer: updates on a child are lock-free
 * atomics, safe from any thread. Rendering takes each family's mutex only to walk its child
 * list, never blocking updates. Families and children live until ty_metrics_registry_free();
 * the registry owns them, callers borrow the pointers. Families render in registration order,
 * children in creation order.
 *
 *     ty_metrics_registry_t *reg;
 *     ty_metrics_registry_new(&reg);
 *     ty_metrics_family_t *req;
 *     const char *labels[] = {"code"};
 *     ty_metrics_counter_new(reg, &req, "tycho_http_requests_total", "HTTP requests.", labels, 1);
 *     ty_metrics_child_t *ok;
 *     const char *v[] = {"200"};
 *     ty_metrics_child_get(req, v, &ok);
 *     ty_metrics_counter_inc(ok);
 */
#ifndef TYCHO_METRICS_H
#define TYCHO_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ty_metrics_registry ty_metrics_registry_t;
typedef struct ty_metrics_family ty_metrics_family_t;
typedef struct ty_metrics_child ty_metrics_child_t;

#define TY_METRICS_MAX_LABELS 8
#define TY_METRICS_MAX_BUCKETS 64

int ty_metrics_registry_new(ty_metrics_registry_t **out);
void ty_metrics_registry_free(ty_metrics_registry_t *reg);

/* Register a family. `name` matches [a-zA-Z_:][a-zA-Z0-9_:]* ("vllm:num_requests_running" is
 * fine); label names match [a-zA-Z_][a-zA-Z0-9_]*, do not start with "__", and a histogram may
 * not use "le". Returns 0, TY_EINVAL (bad name, too many labels) or TY_EEXIST (name taken).
 * Strings are copied. Any thread. */
int ty_metrics_counter_new(ty_metrics_registry_t *reg, ty_metrics_family_t **out,
                           const char *name, const char *help, const char *const *label_names,
                           size_t n_labels);
int ty_metrics_gauge_new(ty_metrics_registry_t *reg, ty_metrics_family_t **out, const char *name,
                         const char *help, const char *const *label_names, size_t n_labels);
/* `bounds`: the upper bounds of the buckets, strictly increasing, finite; +Inf is added. */
int ty_metrics_histogram_new(ty_metrics_registry_t *reg, ty_metrics_family_t **out,
                             const char *name, const char *help, const char *const *label_names,
                             size_t n_labels, const double *bounds, size_t n_bounds);

/* The child for these label values (as many as the family has label names; NULL for none),
 * created on first use. Values may hold any UTF-8 (escaped on output). Any thread. */
int ty_metrics_child_get(ty_metrics_family_t *fam, const char *const *label_values,
                         ty_metrics_child_t **out);

/* Remove a child (its series leaves the output) and free it: e.g. the series of a node that is
 * gone for good. Nothing may use `c` afterwards, on any thread; a later child_get with the
 * same values makes a new one, from zero. NULL is a no-op. */
void ty_metrics_child_remove(ty_metrics_child_t *c);

/* Hot path: lock-free, any thread. Counters only go up: negative `v` is ignored. */
void ty_metrics_counter_inc(ty_metrics_child_t *c);
void ty_metrics_counter_add(ty_metrics_child_t *c, double v);
/* Counter c follows a cumulative figure counted elsewhere (a node's, a library's): it grows by
 * what `now` gained over *seen, then *seen = now. A smaller `now` (the counting side started
 * again) adds nothing. c may be NULL (only *seen moves). */
void ty_metrics_counter_follow(ty_metrics_child_t *c, uint64_t now, uint64_t *seen);
void ty_metrics_gauge_set(ty_metrics_child_t *c, double v);
void ty_metrics_gauge_add(ty_metrics_child_t *c, double v);
void ty_metrics_histogram_observe(ty_metrics_child_t *c, double v);

/* Current value of a counter or gauge (for tests and status pages). */
double ty_metrics_child_value(const ty_metrics_child_t *c);

/* Render everything in text format 0.0.4 into a malloc'd NUL-terminated buffer the caller
 * frees. Returns 0 or TY_ENOMEM. Any thread. */
int ty_metrics_render(ty_metrics_registry_t *reg, char **out, size_t *len);

/* Content-Type for the /metrics response. */
#define TY_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
