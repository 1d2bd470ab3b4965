/* Capacity studies (sim_capacity.h): the searches of `tycho sim --capacity` and `tycho plan`,
 * their tables, JSON and plots. */
#include "sim_capacity.h"

#include "tycho/errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void label(const struct ty_cap_run *r, char *buf, size_t len)
{
    if (r->colocated)
        snprintf(buf, len, "colocated x%u, chunk %u", r->o.n_colocated, r->chunk);
    else if (r->chunk)
        snprintf(buf, len, "disaggregated %u:%u, chunk %u", r->prefill, r->decode, r->chunk);
    else
        snprintf(buf, len, "disaggregated %u:%u", r->prefill, r->decode);
}

struct progress {
    const struct ty_cap_study *st;
    const struct ty_sim_capacity *out;
    size_t done;
};

/* A search ended (called under the pool's lock). */
static void on_done(void *arg, size_t i)
{
    struct progress *p = arg;
    const struct ty_cap_run *r = &p->st->runs[i];
    const struct ty_sim_capacity *c = &p->out[i];
    char l[96];
    label(r, l, sizeof(l));
    p->done++;
    if (!p->st->quiet)
        fprintf(stderr, "tycho: [%zu/%zu] TBT %g ms, %s: %.3f req/s (%zu runs, %.1f s)\n",
                p->done, p->st->n_runs, p->st->tbt_ms[r->tbt], l, c->rate_rps, c->n_points,
                c->wall_s);
}

static struct ty_cap_run *add_run(struct ty_cap_study *st, size_t *cap)
{
    if (st->n_runs == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        struct ty_cap_run *r = realloc(st->runs, *cap * sizeof(*r));
        if (!r)
            return NULL;
        st->runs = r;
    }
    struct ty_cap_run *r = &st->runs[st->n_runs++];
    memset(r, 0, sizeof(*r));
    return r;
}

int ty_cap_study_run(struct ty_cap_study *st, const struct ty_sim_trace *t,
                     const struct ty_sim_opts *base)
{
    if (!st->nodes || !st->n_tbt || st->nodes > TY_SCHED_MAX_NODES)
        return TY_EINVAL;
    if (!st->n_splits)
        for (uint32_t p = 1; p < st->nodes && st->n_splits < TY_CAP_MAX_LIST; p++) {
            st->splits[st->n_splits][0] = p;
            st->splits[st->n_splits++][1] = st->nodes - p;
        }
    if (!st->n_chunks)
        st->chunks[st->n_chunks++] = 512;
    uint32_t pchunks[TY_CAP_MAX_LIST];
    size_t n_pchunks = st->n_prefill_chunks;
    memcpy(pchunks, st->prefill_chunks, sizeof(pchunks));
    if (!n_pchunks)
        pchunks[n_pchunks++] = base->prefill_batch_tokens;
    uint64_t caches[TY_CAP_MAX_LIST];
    size_t n_caches = st->n_cache_blocks;
    memcpy(caches, st->cache_blocks, sizeof(caches));
    if (!n_caches)
        caches[n_caches++] = base->cache_blocks;
    size_t cap = 0;
    for (size_t k = 0; k < st->n_tbt; k++)
        for (size_t c = 0; c < n_caches; c++) {
            struct ty_sim_opts o = *base;
            o.progress = NULL;
            o.cache_blocks = caches[c];
            o.sched.slo[0].ttft_us = (uint64_t)(st->ttft_s * 1e6);
            o.sched.slo[0].tbt_us = (uint64_t)(st->tbt_ms[k] * 1e3);
            for (size_t i = 0; !st->no_colocated && i < st->n_chunks; i++) {
                struct ty_cap_run *r = add_run(st, &cap);
                if (!r)
                    return TY_ENOMEM;
                *r = (struct ty_cap_run){.tbt = k, .colocated = true, .chunk = st->chunks[i],
                                         .cache_blocks = caches[c], .o = o};
                r->o.n_colocated = st->nodes;
                r->o.chunk_tokens = st->chunks[i];
                r->o.prefill_interleave = false; /* (prefill nodes' settings) */
            }
            for (size_t i = 0; !st->no_disaggregated && i < st->n_splits; i++)
                for (size_t j = 0; j < n_pchunks; j++) {
                    struct ty_cap_run *r = add_run(st, &cap);
                    if (!r)
                        return TY_ENOMEM;
                    *r = (struct ty_cap_run){.tbt = k, .prefill = st->splits[i][0],
                                             .decode = st->splits[i][1], .chunk = pchunks[j],
                                             .cache_blocks = caches[c], .o = o};
                    r->o.n_colocated = 0;
                    r->o.n_prefill = st->splits[i][0];
                    r->o.n_decode = st->splits[i][1];
                    r->o.prefill_batch_tokens = pchunks[j];
                    if (r->o.prefill_interleave && pchunks[j] < 2)
                        r->o.prefill_interleave = false;
                    if (st->n_prefill_chunks && !pchunks[j])
                        r->o.prefill_batch = 1; /* a listed 0: one whole prompt per call */
                }
        }
    struct ty_sim_opts *opts = malloc(st->n_runs * sizeof(*opts));
    struct ty_sim_capacity *out = malloc(st->n_runs * sizeof(*out));
    int rc = TY_ENOMEM;
    if (opts && out) {
        for (size_t i = 0; i < st->n_runs; i++)
            opts[i] = st->runs[i].o;
        struct progress p = {.st = st, .out = out};
        rc = ty_sim_capacity_many(t, opts, &st->co, out, st->n_runs, st->jobs, on_done, &p);
        for (size_t i = 0; i < st->n_runs; i++)
            st->runs[i].cap = out[i];
    }
    free(opts);
    free(out);
    return rc;
}

void ty_cap_study_fini(struct ty_cap_study *st)
{
    free(st->runs);
    st->runs = NULL;
    st->n_runs = 0;
}

const struct ty_cap_run *ty_cap_best(const struct ty_cap_study *st, size_t k, bool colocated,
                                     const struct ty_cap_run **second)
{
    const struct ty_cap_run *best = NULL, *next = NULL;
    for (size_t i = 0; i < st->n_runs; i++) {
        const struct ty_cap_run *r = &st->runs[i];
        if (r->tbt != k || r->colocated != colocated)
            continue;
        if (!best || r->cap.rate_rps > best->cap.rate_rps) {
            next = best;
            best = r;
        } else if (!next || r->cap.rate_rps > next->cap.rate_rps) {
            next = r;
        }
    }
    if (second)
        *second = next;
    return best;
}

static void gain(const struct ty_cap_run *d, const struct ty_cap_run *c, char *buf, size_t len)
{
    if (!d || !c)
        snprintf(buf, len, "-");
    else if (c->cap.rate_rps > 0)
        snprintf(buf, len, "%+.0f%%", 100 * (d->cap.rate_rps / c->cap.rate_rps - 1));
    else
        snprintf(buf, len, d->cap.rate_rps > 0 ? "inf" : "-");
}

void ty_cap_print_table(const struct ty_cap_study *st, FILE *f)
{
    fprintf(f, "Effective request capacity: the highest rate at which %.0f%% of requests meet "
               "TTFT <= %g s and the TBT SLO; %u nodes\n\n",
            100 * (st->co.target > 0 ? st->co.target : 0.9), st->ttft_s, st->nodes);
    fprintf(f, "%7s  %12s %-28s  %12s %-24s  %8s\n", "TBT", "disaggreg.", "best split",
            "colocated", "best chunk", "gain");
    fprintf(f, "%7s  %12s %-28s  %12s %-24s  %8s\n", "ms", "req/s", "", "req/s", "", "");
    for (size_t k = 0; k < st->n_tbt; k++) {
        const struct ty_cap_run *d = ty_cap_best(st, k, false, NULL);
        const struct ty_cap_run *c = ty_cap_best(st, k, true, NULL);
        char dl[96] = "-", cl[96] = "-", g[32];
        double dr = 0, cr = 0;
        if (d) {
            label(d, dl, sizeof(dl));
            dr = d->cap.rate_rps;
        }
        if (c) {
            snprintf(cl, sizeof(cl), "chunk %u", c->chunk);
            cr = c->cap.rate_rps;
        }
        gain(d, c, g, sizeof(g));
        fprintf(f, "%7g  %12.3f %-28s  %12.3f %-24s  %8s\n", st->tbt_ms[k], dr,
                d ? dl + strlen("disaggregated ") : "-", cr, cl, g);
    }
    fprintf(f, "\n%7s  %-36s %10s %8s %6s %9s %9s %5s\n", "TBT ms", "setup", "capacity", "speed",
            "slo%", "ttft_p90", "tbt_p90", "runs");
    fprintf(f, "%7s  %-36s %10s %8s %6s %9s %9s %5s\n", "", "", "req/s", "x", "", "s", "ms", "");
    for (size_t i = 0; i < st->n_runs; i++) {
        const struct ty_cap_run *r = &st->runs[i];
        char l[96];
        label(r, l, sizeof(l));
        fprintf(f, "%7g  %-36s %10.3f %8.3f %6.1f %9.2f %9.1f %5zu\n", st->tbt_ms[r->tbt], l,
                r->cap.rate_rps, r->cap.speed, 100 * r->cap.attainment, r->cap.ttft_p90,
                1e3 * r->cap.tbt_p90, r->cap.n_points);
    }
}

static void json_run(const struct ty_cap_run *r, FILE *f)
{
    if (!r) {
        fprintf(f, "null");
        return;
    }
    fprintf(f, "{\"mode\": \"%s\", ", r->colocated ? "colocated" : "disaggregated");
    if (r->colocated)
        fprintf(f, "\"nodes\": %u, \"chunk_tokens\": %u, ", r->o.n_colocated, r->chunk);
    else
        fprintf(f, "\"prefill_nodes\": %u, \"decode_nodes\": %u, \"prefill_chunk_tokens\": %u, ",
                r->prefill, r->decode, r->chunk);
    fprintf(f, "\"cache_blocks_per_node\": %llu, \"capacity_rps\": %.4f, \"speed\": %.4f, "
               "\"slo_attainment\": %.4f, \"ttft_p90_s\": %.4f, \"tbt_p90_s\": %.5f, \"points\": [",
            (unsigned long long)r->cache_blocks, r->cap.rate_rps, r->cap.speed, r->cap.attainment,
            r->cap.ttft_p90, r->cap.tbt_p90);
    for (size_t k = 0; k < r->cap.n_points; k++) {
        const struct ty_sim_capacity_point *p = &r->cap.points[k];
        fprintf(f, "%s{\"rate_rps\": %.4f, \"speed\": %.4f, \"slo_attainment\": %.4f}",
                k ? ", " : "", p->rate_rps, p->speed, p->attainment);
    }
    fprintf(f, "]}");
}

void ty_cap_print_json(const struct ty_cap_study *st, const char *trace, FILE *f)
{
    fprintf(f, "{\"trace\": \"");
    for (const char *c = trace; *c; c++)
        fprintf(f, (*c == '"' || *c == '\\') ? "\\%c" : ((unsigned char)*c < 0x20 ? "?" : "%c"),
                *c);
    fprintf(f, "\", \"nodes\": %u, \"target\": %g, \"ttft_slo_s\": %g, \"thresholds\": [",
            st->nodes, st->co.target > 0 ? st->co.target : 0.9, st->ttft_s);
    for (size_t k = 0; k < st->n_tbt; k++) {
        const struct ty_cap_run *d = ty_cap_best(st, k, false, NULL);
        const struct ty_cap_run *c = ty_cap_best(st, k, true, NULL);
        fprintf(f, "%s\n  {\"tbt_slo_ms\": %g, \"disaggregated\": ", k ? "," : "", st->tbt_ms[k]);
        json_run(d, f);
        fprintf(f, ", \"colocated\": ");
        json_run(c, f);
        if (d && c && c->cap.rate_rps > 0)
            fprintf(f, ", \"gain\": %.4f", d->cap.rate_rps / c->cap.rate_rps - 1);
        else
            fprintf(f, ", \"gain\": null");
        fprintf(f, ", \"searches\": [");
        bool first = true;
        for (size_t i = 0; i < st->n_runs; i++) {
            if (st->runs[i].tbt != k)
                continue;
            fprintf(f, first ? "\n    " : ",\n    ");
            first = false;
            json_run(&st->runs[i], f);
        }
        fprintf(f, "]}");
    }
    fprintf(f, "\n]}\n");
}

int ty_cap_plot(const struct ty_cap_study *st, const char *dir)
{
    char dat[4096], gp[4096], cmd[8192];
    snprintf(dat, sizeof(dat), "%s/capacity.dat", dir);
    snprintf(gp, sizeof(gp), "%s/capacity.gp", dir);
    FILE *f = fopen(dat, "w");
    if (!f)
        return ty_errno();
    /* per threshold: the best disaggregated and the best colocated search, one index each */
    for (size_t k = 0; k < st->n_tbt; k++)
        for (int m = 0; m < 2; m++) {
            const struct ty_cap_run *r = ty_cap_best(st, k, m == 1, NULL);
            char l[96] = "none";
            if (r)
                label(r, l, sizeof(l));
            fprintf(f, "# TBT %g ms, %s: rate_rps slo_attainment\n", st->tbt_ms[k], l);
            for (size_t i = 0; r && i < r->cap.n_points; i++)
                fprintf(f, "%.5f %.4f\n", r->cap.points[i].rate_rps,
                        100 * r->cap.points[i].attainment);
            if (!r || !r->cap.n_points)
                fprintf(f, "0 0\n");
            fprintf(f, "\n\n");
        }
    if (fclose(f) != 0)
        return TY_EIO;
    FILE *g = fopen(gp, "w");
    if (!g)
        return ty_errno();
    double target = 100 * (st->co.target > 0 ? st->co.target : 0.9);
    fprintf(g, "set terminal pngcairo size 1000,600 noenhanced\nset key bottom left\nset grid\n"
               "set xlabel 'arrival rate (requests/s)'\nset ylabel 'SLO attainment (%%)'\n"
               "set yrange [0:105]\nset logscale x\n");
    for (size_t k = 0; k < st->n_tbt; k++) {
        const struct ty_cap_run *d = ty_cap_best(st, k, false, NULL);
        const struct ty_cap_run *c = ty_cap_best(st, k, true, NULL);
        char dl[96] = "disaggregated", cl[96] = "colocated";
        if (d)
            label(d, dl, sizeof(dl));
        if (c)
            label(c, cl, sizeof(cl));
        fprintf(g, "set output '%s/capacity_tbt%g.png'\n"
                   "set title 'SLO attainment against arrival rate, TBT %g ms, TTFT %g s'\n"
                   "plot '%s' index %zu using 1:2 with linespoints title '%s', "
                   "'%s' index %zu using 1:2 with linespoints title '%s', "
                   "%g with lines dashtype 2 title 'target'\n",
                dir, st->tbt_ms[k], st->tbt_ms[k], st->ttft_s, dat, 2 * k, dl, dat, 2 * k + 1,
                cl, target);
    }
    fclose(g);
    snprintf(cmd, sizeof(cmd), "gnuplot '%s'", gp);
    if (system(cmd) != 0) {
        fprintf(stderr, "tycho: gnuplot failed; data and script are in %s\n", dir);
        return TY_EIO;
    }
    fprintf(stderr, "tycho: wrote %s/capacity_tbt*.png\n", dir);
    return 0;
}
