/* libFuzzer target for the Hugging Face directory loader (src/engine/model_hf.c): config.json,
 * the safetensors header (u64 LE length + JSON table of dtype/shape/data_offsets), sharded
 * model.safetensors.index.json, generation_config.json and tokenizer_config.json; then the
 * shared checks of model.c.
 *
 * Input: one flag byte, then sections separated by "\n@@\n":
 *   0 config.json, 1 model.safetensors (or, with flag bit 0, model.safetensors.index.json),
 *   2 generation_config.json, 3 tokenizer_config.json, 4 a.safetensors, 5 b.safetensors.
 * Missing sections are files that do not exist. The files go to a private temporary folder
 * (tmpfs when there is one) that ty_model_load reads as a model directory; tokenizer.json is
 * never written (the tokenizer has its own target).
 *
 * Checked: a failed load returns a TY_E* / -errno code with a message; a loaded model obeys
 * the documented bounds, and every weight it points at lies inside one of its file mappings
 * (first and last byte touched). */
#include "model-impl.h"
#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/model.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A failed check names itself before aborting, so a crash report says which promise broke. */
#define check(cond) ((cond) ? (void)0 : check_failed(__LINE__, #cond))
static void check_failed(int line, const char *what)
{
    fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, line, what);
    abort();
}

static const char *const g_files[] = {"config.json",           "model.safetensors",
                                      "generation_config.json", "tokenizer_config.json",
                                      "a.safetensors",          "b.safetensors",
                                      "model.safetensors.index.json"};
#define N_FILES (sizeof(g_files) / sizeof(g_files[0]))
static char g_dir[256];
static volatile unsigned char g_sink;

static void path_of(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static void put(const char *name, const uint8_t *p, size_t n)
{
    char path[512];
    path_of(name, path, sizeof(path));
    FILE *f = fopen(path, "wb");
    check(f != NULL);
    check(fwrite(p, 1, n, f) == n || n == 0);
    check(fclose(f) == 0);
}

static void clear_dir(void);

static void remove_dir(void)
{
    clear_dir();
    rmdir(g_dir);
}

static void setup(void)
{
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/fuzz-st-XXXXXX", base ? base : "/tmp");
    check(mkdtemp(g_dir) != NULL);
    atexit(remove_dir);
}

static void clear_dir(void)
{
    char path[512];
    for (size_t i = 0; i < N_FILES; i++) {
        path_of(g_files[i], path, sizeof(path));
        unlink(path);
    }
}

static const uint8_t *find_sep(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i + 4 <= n; i++)
        if (!memcmp(p + i, "\n@@\n", 4))
            return p + i;
    return NULL;
}

static void check_weight(const struct ty_model *m, const struct ty_weight *w)
{
    if (!w->data)
        return;
    uint64_t nb = ty_ggml_type_nbytes(w->type, w->rows * w->cols);
    check(nb > 0);
    const unsigned char *p = w->data;
    bool inside = false;
    for (uint32_t i = 0; i < m->n_maps && !inside; i++) {
        const unsigned char *a = m->maps[i].addr;
        inside = p >= a && nb <= m->maps[i].len && (size_t)(p - a) <= m->maps[i].len - nb;
    }
    check(inside);
    g_sink ^= p[0] ^ p[nb - 1];
}

static void use_model(const ty_model_t *pub)
{
    const struct ty_model *m = (const struct ty_model *)pub;
    const struct ty_model_config *c = ty_model_config(pub);
    check(c->dim >= 1 && c->n_layers >= 1 && c->n_layers <= 512 && c->n_heads >= 1);
    check(c->n_kv_heads >= 1 && c->n_heads % c->n_kv_heads == 0 && c->head_dim % 2 == 0);
    check(c->n_vocab >= 1 && ty_model_desc(pub)[0] != 0);
    check_weight(m, &m->tok_embd);
    check_weight(m, &m->out_norm);
    check_weight(m, &m->output);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const struct ty_weight *ws = (const struct ty_weight *)&m->layers[l];
        for (size_t k = 0; k < sizeof(m->layers[l]) / sizeof(*ws); k++)
            check_weight(m, &ws[k]);
    }
    for (uint32_t id = 0; id < 8; id++)
        ty_model_is_eog(pub, id);
    const char *t = ty_model_chat_template(pub);
    if (t)
        g_sink ^= (unsigned char)strlen(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_dir[0])
        setup();
    if (size < 1)
        return 0;
    bool sharded = data[0] & 1;
    const uint8_t *p = data + 1, *end = data + size;
    clear_dir();
    for (size_t sec = 0; sec < 6 && p <= end; sec++) {
        const uint8_t *sep = find_sep(p, (size_t)(end - p));
        size_t n = sep ? (size_t)(sep - p) : (size_t)(end - p);
        const char *name = sec == 1 && sharded ? "model.safetensors.index.json" : g_files[sec];
        put(name, p, n);
        if (!sep)
            break;
        p = sep + 4;
    }
    ty_model_t *m;
    char err[512] = "";
    int rc = ty_model_load(&m, g_dir, err, sizeof(err));
    if (rc == 0) {
        use_model(m);
        ty_model_free(m);
    } else {
        check(rc < 0);
        if (!err[0]) {
            fprintf(stderr, "ty_model_load failed (%s) without a message\n", ty_err_name(rc));
            abort();
        }
    }
    return 0;
}
