/* Config output and value lifetime: --dump-config YAML (libyaml emitter), --help text, SIGHUP
 * reload of the reloadable fields, deep compare and free of loaded values.
 * Same threading as the config object: the owning thread only.
 */
#include "config-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* ---- freeing and comparing ------------------------------------------------------------------ */

void ty__cfg_field_free(const struct ty_config_field *f, void *base)
{
    char *dst = (char *)base + f->offset;
    if (f->type == TY_CONFIG_STRING) {
        free(*(char **)dst);
        *(char **)dst = NULL;
    } else if (f->type == TY_CONFIG_SECTION) {
        ty_config_values_free(f->sub, dst);
    } else if (f->type == TY_CONFIG_LIST) {
        char *arr = *(char **)dst;
        uint32_t n = *(uint32_t *)((char *)base + f->count_offset);
        for (uint32_t i = 0; arr && i < n; i++) {
            if (f->sub)
                ty_config_values_free(f->sub, arr + i * f->size);
            else if (f->elem == TY_CONFIG_STRING)
                free(*(char **)(arr + i * f->size));
        }
        free(arr);
        *(char **)dst = NULL;
        *(uint32_t *)((char *)base + f->count_offset) = 0;
    }
}

void ty_config_values_free(const struct ty_config_struct *root, void *data)
{
    for (size_t i = 0; i < root->n_fields; i++)
        ty__cfg_field_free(&root->fields[i], data);
}

static bool scalar_equal(enum ty_config_type t, size_t size, const void *a, const void *b)
{
    if (t == TY_CONFIG_STRING) {
        const char *sa = *(const char *const *)a, *sb = *(const char *const *)b;
        return sa == sb || (sa && sb && strcmp(sa, sb) == 0);
    }
    return memcmp(a, b, size) == 0;
}

static bool struct_equal(const struct ty_config_struct *s, const void *a, const void *b)
{
    for (size_t i = 0; i < s->n_fields; i++)
        if (!ty__cfg_values_equal(&s->fields[i], a, b))
            return false;
    return true;
}

/* Compare field `f` of the structs at `a` and `b`. */
bool ty__cfg_values_equal(const struct ty_config_field *f, const void *a, const void *b)
{
    const char *pa = (const char *)a + f->offset, *pb = (const char *)b + f->offset;
    if (f->type == TY_CONFIG_SECTION)
        return struct_equal(f->sub, pa, pb);
    if (f->type != TY_CONFIG_LIST)
        return scalar_equal(f->type, f->size, pa, pb);
    uint32_t na = *(const uint32_t *)((const char *)a + f->count_offset);
    uint32_t nb = *(const uint32_t *)((const char *)b + f->count_offset);
    if (na != nb)
        return false;
    const char *arr_a = *(const char *const *)pa, *arr_b = *(const char *const *)pb;
    for (uint32_t i = 0; i < na; i++) {
        const char *ea = arr_a + i * f->size, *eb = arr_b + i * f->size;
        if (f->sub ? !struct_equal(f->sub, ea, eb) : !scalar_equal(f->elem, f->size, ea, eb))
            return false;
    }
    return true;
}

/* ---- dump ----------------------------------------------------------------------------------- */

static int emit(yaml_emitter_t *em, yaml_event_t *ev, int ok)
{
    if (!ok || !yaml_emitter_emit(em, ev))
        return TY_EIO;
    return 0;
}

static int emit_scalar(yaml_emitter_t *em, const char *text, bool quoted)
{
    yaml_event_t ev;
    int ok = yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)text, (int)strlen(text),
                                          1, 1,
                                          quoted ? YAML_DOUBLE_QUOTED_SCALAR_STYLE
                                                 : YAML_PLAIN_SCALAR_STYLE);
    return emit(em, &ev, ok);
}

static int emit_value(yaml_emitter_t *em, const struct ty_config_field *f, enum ty_config_type t,
                      const void *src)
{
    if (t == TY_CONFIG_STRING) {
        const char *s = *(const char *const *)src;
        return s ? emit_scalar(em, s, true) : emit_scalar(em, "~", false);
    }
    char buf[128];
    ty__cfg_format(f, t, ty__cfg_load(t, f->size, src), buf, sizeof(buf));
    return emit_scalar(em, buf, false);
}

static int emit_struct(yaml_emitter_t *em, const struct ty_config_struct *s, const char *base);

static int emit_list(yaml_emitter_t *em, const struct ty_config_field *f, const char *base)
{
    yaml_event_t ev;
    const char *arr = *(const char *const *)(base + f->offset);
    uint32_t n = *(const uint32_t *)(base + f->count_offset);
    int rc = emit(em, &ev,
                  yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
                                                       n ? YAML_BLOCK_SEQUENCE_STYLE
                                                         : YAML_FLOW_SEQUENCE_STYLE));
    for (uint32_t i = 0; rc == 0 && i < n; i++)
        rc = f->sub ? emit_struct(em, f->sub, arr + i * f->size)
                    : emit_value(em, f, f->elem, arr + i * f->size);
    if (rc == 0)
        rc = emit(em, &ev, yaml_sequence_end_event_initialize(&ev));
    return rc;
}

static int emit_struct(yaml_emitter_t *em, const struct ty_config_struct *s, const char *base)
{
    yaml_event_t ev;
    int rc = emit(em, &ev,
                  yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1,
                                                      s->n_fields ? YAML_BLOCK_MAPPING_STYLE
                                                                  : YAML_FLOW_MAPPING_STYLE));
    for (size_t i = 0; rc == 0 && i < s->n_fields; i++) {
        const struct ty_config_field *f = &s->fields[i];
        if (f->type == TY_CONFIG_STRING && !*(const char *const *)(base + f->offset))
            continue; /* unset string: leave it out, so it loads back unset */
        rc = emit_scalar(em, f->key, false);
        if (rc != 0)
            break;
        if (f->type == TY_CONFIG_SECTION)
            rc = emit_struct(em, f->sub, base + f->offset);
        else if (f->type == TY_CONFIG_LIST)
            rc = emit_list(em, f, base);
        else
            rc = emit_value(em, f, f->type, base + f->offset);
    }
    if (rc == 0)
        rc = emit(em, &ev, yaml_mapping_end_event_initialize(&ev));
    return rc;
}

int ty_config_dump(const ty_config_t *cfg, FILE *out)
{
    yaml_emitter_t em;
    yaml_event_t ev;
    if (!yaml_emitter_initialize(&em))
        return TY_ENOMEM;
    yaml_emitter_set_output_file(&em, out);
    yaml_emitter_set_unicode(&em, 1);
    yaml_emitter_set_width(&em, -1);
    int rc = emit(&em, &ev, yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING));
    if (rc == 0)
        rc = emit(&em, &ev, yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1));
    if (rc == 0)
        rc = emit_struct(&em, cfg->root, cfg->data);
    if (rc == 0)
        rc = emit(&em, &ev, yaml_document_end_event_initialize(&ev, 1));
    if (rc == 0)
        rc = emit(&em, &ev, yaml_stream_end_event_initialize(&ev));
    yaml_emitter_delete(&em);
    fflush(out);
    return rc;
}

/* ---- help ----------------------------------------------------------------------------------- */

static void help_struct(const struct ty_config_struct *s, const char *prefix, FILE *out)
{
    for (size_t i = 0; i < s->n_fields; i++) {
        const struct ty_config_field *f = &s->fields[i];
        char path[200], flag[240], type[200] = "";
        snprintf(path, sizeof(path), "%s%s%s", prefix, prefix[0] ? "." : "", f->key);
        if (f->type == TY_CONFIG_SECTION) {
            help_struct(f->sub, path, out);
            continue;
        }
        if (f->type == TY_CONFIG_ENUM) {
            for (size_t k = 0; f->enum_names[k]; k++) {
                size_t used = strlen(type);
                snprintf(type + used, sizeof(type) - used, "%s%s", k ? "|" : "", f->enum_names[k]);
            }
        } else if (f->type == TY_CONFIG_LIST) {
            snprintf(type, sizeof(type), "[%s,...]",
                     f->sub ? "{...}" : ty__cfg_type_name(f, f->elem));
        } else {
            snprintf(type, sizeof(type), "%s", ty__cfg_type_name(f, f->type));
        }
        /* A long path only shortens the help line; never an error. */
        if (snprintf(flag, sizeof(flag), "--%s=%s", path, type) >= (int)sizeof(flag))
            flag[sizeof(flag) - 1] = '\0';
        fprintf(out, "  %-34s %s", flag, f->help ? f->help : "");
        if (f->def)
            fprintf(out, " (default %s)", f->def);
        if (f->min || f->max)
            fprintf(out, " [%s..%s]", f->min ? f->min : "", f->max ? f->max : "");
        if (f->flags & TY_CONFIG_REQUIRED)
            fprintf(out, " (required)");
        if (f->flags & TY_CONFIG_RELOADABLE)
            fprintf(out, " (reloadable)");
        fputc('\n', out);
    }
}

void ty_config_help(const struct ty_config_struct *root, FILE *out)
{
    help_struct(root, "", out);
    fprintf(out, "  Each setting can also be given in the file (nested keys), or as TYCHO_<KEY>\n"
                 "  in the environment ('.' -> '_', upper case). Flags win over the environment,\n"
                 "  the environment over the file.\n");
}

/* ---- reload --------------------------------------------------------------------------------- */

static void swap_field(const struct ty_config_field *f, char *live, char *fresh)
{
    char tmp[sizeof(uint64_t)];
    size_t size = f->type == TY_CONFIG_LIST ? sizeof(void *) : f->size;
    memcpy(tmp, live + f->offset, size);
    memcpy(live + f->offset, fresh + f->offset, size);
    memcpy(fresh + f->offset, tmp, size);
    if (f->type == TY_CONFIG_LIST) {
        uint32_t n = *(uint32_t *)(live + f->count_offset);
        *(uint32_t *)(live + f->count_offset) = *(uint32_t *)(fresh + f->count_offset);
        *(uint32_t *)(fresh + f->count_offset) = n;
    }
}

int ty_config_reload(ty_config_t *live, ty_config_t *fresh, unsigned *n_changed)
{
    if (live->root != fresh->root)
        return TY_EINVAL;
    unsigned changed = 0;
    for (size_t i = 0; i < live->n_leaves; i++) {
        const struct ty__cfg_leaf *l = &live->leaves[i];
        const struct ty_config_field *f = l->field;
        char *lbase = (char *)live->data + l->offset - f->offset;
        char *fbase = (char *)fresh->data + l->offset - f->offset;
        if (ty__cfg_values_equal(f, lbase, fbase))
            continue;
        if (!(f->flags & TY_CONFIG_RELOADABLE)) {
            TY_LOG_WARN("config", "reload: %s changed but needs a restart; keeping the old value",
                        l->path);
            continue;
        }
        if (f->type == TY_CONFIG_STRING || f->type == TY_CONFIG_LIST || f->size <= 8)
            swap_field(f, lbase, fbase);
        TY_LOG_INFO("config", "reload: %s changed", l->path);
        changed++;
    }
    if (n_changed)
        *n_changed = changed;
    return 0;
}
