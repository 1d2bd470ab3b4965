/* The HTTP front alone: ty_api on a libuv loop over a fake serving backend whose "compute" is
 * nothing, so that streamed tokens per second measure the front (request handling, the events'
 * path to the API, the SSE chunks and their writes) and not an engine. bench/serve/front.sh
 * builds it against two builds' libraries (-DTY_FRONT_OLD for one whose API still takes events
 * through ty_api_backend_event, the session's start) and drives it with `tycho bench serve`.
 *
 * The backend runs on the loop, as the Conductor's remote backend does: every STEP_MS
 * milliseconds (a decode step) each running sequence gets one token (text " tok"), and after
 * its max_tokens a DONE. Steps keep their pace whether or not the loop keeps up, like decode
 * nodes on other machines: a loop turn that comes late delivers every step due since the last
 * (up to 64), as a Conductor that fell behind reads several TokenChunks per stream at once. Events reach the API the way the Conductor's did in that build: the
 * old one through ty_api_backend_event (its mailbox), the new one through the sink.
 *
 * usage: front_backend MODEL.gguf PORT [STEP_MS]   (runs until SIGTERM/SIGINT) */
#include "tycho/api.h"
#include "tycho/errors.h"
#include "tycho/metrics.h"
#include "tycho/model.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define MAX_SEQS 8192

struct seq {
    uint64_t id;
    uint32_t n_out, max;
    bool live;
};

static struct fake {
    ty_api_t *api;
    ty_serve_event_cb sink;
    void *sink_arg;
    struct seq s[MAX_SEQS];
    uint32_t n; /* slots in use at most */
    uint32_t n_live;
    uv_timer_t step;
    uint64_t step_ms, t0_ms, steps_done;
} fk;

static void deliver(const struct ty_serve_event *ev)
{
#ifdef TY_FRONT_OLD
    ty_api_backend_event(fk.api, ev);
#else
    if (fk.sink)
        fk.sink(fk.sink_arg, ev);
#endif
}

static void step_one(void)
{
    for (uint32_t i = 0; i < fk.n; i++) {
        struct seq *q = &fk.s[i];
        if (!q->live)
            continue;
        q->n_out++;
        struct ty_serve_event ev = {.id = q->id, .kind = TY_SERVE_EV_TOKEN, .text = " tok",
                                    .text_len = 4, .n_prompt = 16, .n_output = q->n_out};
        ev.sample.id = 300 + q->n_out % 100;
        deliver(&ev);
        if (q->n_out < q->max)
            continue;
        q->live = false;
        fk.n_live--;
        ev.kind = TY_SERVE_EV_DONE;
        ev.text = "";
        ev.text_len = 0;
        ev.finish = TY_FINISH_LENGTH;
        deliver(&ev);
    }
    while (fk.n && !fk.s[fk.n - 1].live)
        fk.n--;
}

static void on_step(uv_timer_t *t)
{
    uint64_t due = (uv_now(t->loop) - fk.t0_ms) / fk.step_ms;
    uint64_t k = due > fk.steps_done ? due - fk.steps_done : 1;
    fk.steps_done = due > fk.steps_done ? due : fk.steps_done + 1;
    for (uint64_t i = 0; i < k && i < 64; i++)
        step_one();
}

static int fake_submit(void *ctx, const struct ty_serve_request *r)
{
    (void)ctx;
    uint32_t i = 0;
    while (i < MAX_SEQS && fk.s[i].live)
        i++;
    if (i == MAX_SEQS)
        return TY_EREJECTED;
    fk.s[i] = (struct seq){.id = r->id, .max = r->gen.max_tokens ? r->gen.max_tokens : 16,
                           .live = true};
    if (i >= fk.n)
        fk.n = i + 1;
    fk.n_live++;
    return 0;
}

static int fake_cancel(void *ctx, uint64_t id)
{
    (void)ctx;
    for (uint32_t i = 0; i < fk.n; i++) {
        if (fk.s[i].live && fk.s[i].id == id) {
            fk.s[i].live = false;
            fk.n_live--;
            struct ty_serve_event ev = {.id = id, .kind = TY_SERVE_EV_ERROR, .text = "",
                                        .error = TY_ECANCELED};
            deliver(&ev);
        }
    }
    return 0;
}

static void fake_stats(void *ctx, struct ty_serve_stats *out)
{
    (void)ctx;
    memset(out, 0, sizeof(*out));
    out->running = fk.n_live;
    out->max_ctx = 2048;
}

#ifndef TY_FRONT_OLD
static void fake_set_sink(void *ctx, ty_serve_event_cb sink, void *arg)
{
    (void)ctx;
    fk.sink = sink;
    fk.sink_arg = arg;
}
#endif

static const struct ty_serve_backend_i fake_iface = {
    .submit = fake_submit,
    .cancel = fake_cancel,
    .stats = fake_stats,
#ifndef TY_FRONT_OLD
    .set_sink = fake_set_sink,
#endif
};

static void on_signal(uv_signal_t *h, int sig)
{
    (void)sig;
    uv_stop(h->loop);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PORT [STEP_MS]\n", argv[0]);
        return 2;
    }
    ty_model_t *model;
    ty_metrics_registry_t *reg;
    char err[256];
    if (ty_model_load(&model, argv[1], err, sizeof(err)) || ty_metrics_registry_new(&reg)) {
        fprintf(stderr, "front_backend: cannot load %s: %s\n", argv[1], err);
        return 1;
    }
    uint64_t ms = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
    uv_loop_t *loop = uv_default_loop();
    signal(SIGPIPE, SIG_IGN);
    struct ty_api_opts o = {.host = "127.0.0.1", .port = (uint16_t)atoi(argv[2]),
                            .model = model, .model_name = "front", .metrics = reg,
                            .backend = {&fake_iface, NULL}, .max_connections = 8192};
    int rc = ty_api_new(&fk.api, loop, &o);
    if (rc) {
        fprintf(stderr, "front_backend: %s\n", ty_strerror(rc));
        return 1;
    }
    uv_timer_init(loop, &fk.step);
    fk.step_ms = ms ? ms : 1;
    fk.t0_ms = uv_now(loop);
    uv_timer_start(&fk.step, on_step, fk.step_ms, fk.step_ms);
    uv_signal_t sig[2];
    uv_signal_init(loop, &sig[0]);
    uv_signal_init(loop, &sig[1]);
    uv_signal_start(&sig[0], on_signal, SIGTERM);
    uv_signal_start(&sig[1], on_signal, SIGINT);
    fprintf(stderr, "front_backend: http://127.0.0.1:%u, a step every %llu ms\n",
            ty_api_port(fk.api), (unsigned long long)ms);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&fk.step, NULL);
    uv_close((uv_handle_t *)&sig[0], NULL);
    uv_close((uv_handle_t *)&sig[1], NULL);
    ty_api_close(fk.api, NULL, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    ty_metrics_registry_free(reg);
    ty_model_free(model);
    return 0;
}
