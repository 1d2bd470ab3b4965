/* Sliding-window attention on the real stories260K weights: the HF directory with a
 * `sliding_window` added to its config.json (symlinks to the real safetensors), B = 16,
 * window 24.
 *   - config: Mistral's sliding_window slides every layer; use_sliding_window false is no
 *     window; Qwen2's max_window_layers leaves the first layers full (so no page may go);
 *     a window of at least the context or null is none;
 *   - two prompts longer than the window generated together by ty_engine_generate in a pool
 *     of 24 pages (the two would need 22 + 24 without releasing; the context stays capped at
 *     the pool's tokens) hold at most 8 at any token, and give the ids of each prompt run alone through ty_engine_forward in a
 *     large pool that releases nothing (the mask alone hides old keys): releasing pages
 *     changes nothing; run again in the small pool (whose prefix cache now holds released
 *     blocks), the same ids; the batcher with trim_window (as `tycho serve` runs it) in the
 *     same pool, the same ids and bound; and the window matters: the full-attention model
 *     differs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/batcher.h"
#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/kvpool.h"
#include "tycho/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define B 16
#define W 24
#define N_OUT 300
static char src[512], tmpdir[256], cfg_text[8192];

/* tmpdir/NAME: stories260K-hf's config.json with `extra` (JSON members) added, and a link to
 * its weights. Returns the directory. */
static const char *mk_dir(const char *name, const char *extra)
{
    static char dir[512];
    char path[600], target[600];
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    mkdir(dir, 0755);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    snprintf(target, sizeof(target), "%s/model.safetensors", src);
    unlink(path);
    assert_int_equal(symlink(target, path), 0);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    const char *end = strrchr(cfg_text, '}');
    assert_non_null(end);
    fprintf(f, "%.*s, %s}\n", (int)(end - cfg_text), cfg_text, extra);
    fclose(f);
    return dir;
}

static ty_model_t *load(const char *dir)
{
    ty_model_t *m;
    char err[256];
    int rc = ty_model_load(&m, dir, err, sizeof(err));
    if (rc)
        fail_msg("%s: %s", dir, err);
    return m;
}

static int setup(void **state)
{
    const char *data = getenv("TYCHO_TEST_DATA");
    snprintf(src, sizeof(src), "%s/models/stories260K-hf", data ? data : "/work/shared");
    char path[600];
    snprintf(path, sizeof(path), "%s/config.json", src);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(cfg_text, 1, sizeof(cfg_text) - 1, f);
    fclose(f);
    cfg_text[n] = 0;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/tycho-swa-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void expect_window(const char *name, const char *extra, uint32_t sliding, uint32_t kv)
{
    ty_model_t *m = load(mk_dir(name, extra));
    assert_int_equal(ty_model_config(m)->sliding_window, sliding);
    assert_int_equal(ty_model_config(m)->kv_window, kv);
    ty_model_free(m);
}

static void test_config(void **state)
{
    expect_window("mistral", "\"sliding_window\": 24", 24, 24);
    expect_window("off", "\"sliding_window\": 24, \"use_sliding_window\": false", 0, 0);
    expect_window("qwen2", "\"sliding_window\": 24, \"use_sliding_window\": true, "
                           "\"max_window_layers\": 3", 24, 0);
    expect_window("none", "\"sliding_window\": 24, \"use_sliding_window\": true, "
                          "\"max_window_layers\": 5", 0, 0); /* all 5 layers full */
    expect_window("wide", "\"sliding_window\": 512", 0, 0);
    expect_window("null", "\"sliding_window\": null", 0, 0);
}

/* A deterministic prompt of `n` in-vocabulary ids starting with BOS. */
static void mk_prompt(uint32_t *p, size_t n, uint32_t salt)
{
    p[0] = 1;
    for (size_t i = 1; i < n; i++)
        p[i] = 259 + (uint32_t)((i * 37 + salt * 101) % 253);
}

static ty_engine_t *mk_engine(ty_model_t *m, uint32_t pages)
{
    struct ty_engine_opts o = {.kv_block_tokens = B, .kv_pages = pages, .max_ctx = 512,
                               .max_batch_tokens = 32};
    ty_engine_t *e;
    assert_int_equal(ty_engine_new(&e, m, &o), 0);
    return e;
}

/* Greedy ids of one prompt through ty_engine_forward alone, nothing released. */
static void greedy_alone(ty_engine_t *e, const uint32_t *prompt, size_t n, uint32_t *out)
{
    uint32_t V = ty_model_config(ty_engine_model(e))->n_vocab;
    ty_kvpool_t *pool = ty_engine_pool(e);
    ty_kvseq_t *s;
    uint32_t *hist = malloc((n + N_OUT) * sizeof(uint32_t));
    float *logits = malloc(V * sizeof(float));
    assert_int_equal(ty_kvpool_seq_new(pool, &s), 0);
    memcpy(hist, prompt, n * sizeof(uint32_t));
    for (uint32_t k = 0; k < N_OUT; k++) {
        size_t have = ty_kvseq_n_tokens(s), len = n + k;
        struct ty_batch_seq bs = {s, hist + have, (uint32_t)(len - have), false};
        struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
        assert_int_equal(ty_engine_forward(e, &b, logits), 0);
        uint32_t best = 0;
        for (uint32_t i = 1; i < V; i++)
            best = logits[i] > logits[best] ? i : best;
        out[k] = hist[len] = best;
    }
    assert_int_equal(ty_kvseq_n_released(s), 0);
    assert_int_equal(ty_kvseq_n_pages(s), (n + N_OUT - 1 + B - 1) / B);
    ty_kvpool_seq_free(pool, s);
    free(hist);
    free(logits);
}

struct watch {
    ty_kvpool_t *pool;
    uint32_t max_used;
};

static int on_token(void *arg, size_t seq, uint32_t id, const char *text)
{
    struct watch *w = arg;
    uint32_t used = ty_kvpool_pages_used(w->pool);
    w->max_used = used > w->max_used ? used : w->max_used;
    return 0;
}

static void generate(ty_engine_t *e, const uint32_t *const *prompts, const size_t *lens,
                     struct ty_gen_result *res, struct watch *w)
{
    struct ty_gen_params p = {.max_tokens = N_OUT, .ignore_eos = true};
    p.sampling.repetition_penalty = 1;
    memset(res, 0, 2 * sizeof(*res));
    assert_int_equal(ty_engine_generate(e, prompts, lens, 2, &p, res, on_token, w), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(res[i].n_ids, N_OUT);
}

struct bout {
    struct watch w;
    uint32_t ids[2][N_OUT];
    uint32_t n[2];
    int ended;
};

static int b_token(void *arg, ty_breq_t *r, const struct ty_sample *s, enum ty_finish fin)
{
    struct bout *o = arg;
    size_t i = ty_breq_id(r);
    if (o->n[i] < N_OUT)
        o->ids[i][o->n[i]++] = s->id;
    on_token(&o->w, i, s->id, "");
    return fin;
}

static void b_end(void *arg, ty_breq_t *r, enum ty_finish fin, int rc)
{
    struct bout *o = arg;
    assert_int_equal(rc, 0);
    o->ended++;
}

/* The two prompts through the batcher with trim_window; ids into o. */
static void run_batcher(ty_engine_t *e, const uint32_t *const *prompts, const size_t *lens,
                        struct bout *o)
{
    struct ty_gen_params p = {.max_tokens = N_OUT, .ignore_eos = true};
    p.sampling.repetition_penalty = 1;
    struct ty_batcher_opts bo = {.engine = e, .trim_window = true,
                                 .hooks = {.arg = o, .on_token = b_token, .on_end = b_end}};
    ty_batcher_t *b;
    assert_int_equal(ty_batcher_new(&b, &bo), 0);
    for (uint64_t i = 0; i < 2; i++) {
        struct ty_breq_opts ro = {.id = i, .prompt = prompts[i], .n_prompt = (uint32_t)lens[i],
                                  .gen = &p};
        assert_int_equal(ty_batcher_add(b, &ro, NULL), 0);
    }
    while (o->ended < 2)
        assert_true(ty_batcher_step(b) > 0);
    ty_batcher_free(b);
}

static void test_release_keeps_output(void **state)
{
    ty_model_t *m = load(mk_dir("w24", "\"sliding_window\": 24"));
    ty_model_t *full = load(src);
    uint32_t p0[40], p1[70], alone[2][N_OUT], unwindowed[N_OUT];
    mk_prompt(p0, 40, 1);
    mk_prompt(p1, 70, 2);
    const uint32_t *prompts[2] = {p0, p1};
    const size_t lens[2] = {40, 70};

    ty_engine_t *big = mk_engine(m, 0);
    for (int i = 0; i < 2; i++)
        greedy_alone(big, prompts[i], lens[i], alone[i]);
    ty_engine_free(big);

    ty_engine_t *small = mk_engine(m, 24);
    struct watch w = {ty_engine_pool(small), 0};
    struct ty_gen_result res[2];
    for (int round = 0; round < 2; round++) { /* the second finds released blocks cached */
        generate(small, prompts, lens, res, &w);
        for (int i = 0; i < 2; i++) {
            assert_memory_equal(res[i].ids, alone[i], N_OUT * sizeof(uint32_t));
            ty_gen_result_clear(&res[i]);
        }
        assert_true(w.max_used <= 8);
        assert_int_equal(ty_kvpool_pages_used(ty_engine_pool(small)), 0);
    }
    struct bout *o = calloc(1, sizeof(*o));
    o->w.pool = ty_engine_pool(small);
    run_batcher(small, prompts, lens, o);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(o->n[i], N_OUT);
        assert_memory_equal(o->ids[i], alone[i], N_OUT * sizeof(uint32_t));
    }
    assert_true(o->w.max_used <= 8);
    free(o);
    ty_engine_free(small);

    ty_engine_t *fe = mk_engine(full, 0);
    greedy_alone(fe, p1, 70, unwindowed);
    assert_memory_not_equal(unwindowed, alone[1], N_OUT * sizeof(uint32_t));
    ty_engine_free(fe);
    ty_model_free(full);
    ty_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_release_keeps_output),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
