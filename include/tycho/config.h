/* Configuration: YAML files, environment and command-line flags into typed C structs.
 *
 * A component describes its settings once, in a table of `struct ty_config_field` (key, type,
 * place in the component's struct, default, range, enum names, help). From that one table this
 * module derives the libcyaml schema, the defaults, `--section.key=value` flags, `TYCHO_<KEY>`
 * environment overrides, validation, `--help` text and `--dump-config` YAML. Layers apply in
 * the order defaults < file < environment < flags. Every error names its origin (file:line:col,
 * the environment variable or the flag) and the field, in one line:
 *
 *     conductor.yaml:7:3: slo.ttft_ms: value -5 is below the minimum 1
 *
 * Threading: a ty_config_t and the struct it fills belong to one thread at a time (load at
 * startup, reload on the thread that owns the config); tables are immutable and shareable.
 * Ownership: the caller owns the struct it passes as `data`; strings and lists inside it are
 * allocated by this module and released by ty_config_free() (or ty_config_values_free()).
 *
 * Writing a table:
 *
 *     struct my_slo { uint32_t ttft_ms; double tbt_ms; };
 *     struct my_cfg { char *host; uint16_t port; struct my_slo slo;
 *                     char **api_keys; uint32_t n_api_keys; uint64_t cache_bytes; };
 *
 *     static const struct ty_config_field slo_fields[] = {
 *         {.key = "ttft_ms", .type = TY_CONFIG_UINT, TY_CONFIG_AT(struct my_slo, ttft_ms),
 *          .def = "2000", .min = "1", .help = "time-to-first-token SLO",
 *          .flags = TY_CONFIG_RELOADABLE},
 *         ...
 *     };
 *     static const struct ty_config_struct slo_struct =
 *         TY_CONFIG_STRUCT("slo", struct my_slo, slo_fields);
 *     static const struct ty_config_field my_fields[] = {
 *         {.key = "host", .type = TY_CONFIG_STRING, TY_CONFIG_AT(struct my_cfg, host),
 *          .def = "127.0.0.1", .help = "listen address"},
 *         {.key = "port", .type = TY_CONFIG_UINT, TY_CONFIG_AT(struct my_cfg, port),
 *          .def = "8000", .min = "1", .max = "65535", .help = "listen port"},
 *         {.key = "slo", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(struct my_cfg, slo),
 *          .sub = &slo_struct, .help = "service-level objectives"},
 *         {.key = "api_keys", .type = TY_CONFIG_LIST, .elem = TY_CONFIG_STRING,
 *          TY_CONFIG_LIST_AT(struct my_cfg, api_keys, n_api_keys), .help = "accepted keys"},
 *         {.key = "cache_bytes", .type = TY_CONFIG_SIZE, TY_CONFIG_AT(struct my_cfg, cache_bytes),
 *          .def = "4G", .help = "DRAM cache size"},
 *     };
 *
 * Defaults, minimum and maximum are written as text in the field's own syntax ("4G", "10s",
 * "info") and parsed by the same code that reads the file; ty_config_new() rejects a table
 * whose defaults do not parse or fall out of range, so table bugs surface in the first test.
 *
 * Value syntax: bool: true/false/yes/no (any case). int/uint: decimal or 0x hex, no leading
 * zeros. double: a finite decimal number. enum: one of the names, exactly. size: bytes with
 * an optional suffix K, M, G, T (powers of 1024; "KiB", "MB" etc. also read as powers of 1024).
 * duration: a number with a unit ns, us, ms, s, m, h ("250ms", "1.5s"); stored as nanoseconds.
 * Lists on the command line or in the environment are YAML flow sequences: `--api_keys=[a, b]`.
 */
#ifndef TYCHO_CONFIG_H
#define TYCHO_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum ty_config_type {
    TY_CONFIG_BOOL,     /* bool */
    TY_CONFIG_INT,      /* int8_t .. int64_t */
    TY_CONFIG_UINT,     /* uint8_t .. uint64_t (at most INT64_MAX) */
    TY_CONFIG_DOUBLE,   /* double */
    TY_CONFIG_STRING,   /* char *, NUL-terminated, owned by the config */
    TY_CONFIG_ENUM,     /* an int-sized enum; value = index in enum_names */
    TY_CONFIG_SIZE,     /* uint64_t bytes, "64M" */
    TY_CONFIG_DURATION, /* uint64_t nanoseconds, "250ms" */
    TY_CONFIG_SECTION,  /* an embedded struct described by .sub */
    TY_CONFIG_LIST,     /* pointer + uint32_t count; entries of type .elem (scalar) or .sub */
};

enum ty_config_flag {
    TY_CONFIG_REQUIRED = 1u << 0,   /* must be set by a file, the environment or a flag */
    TY_CONFIG_RELOADABLE = 1u << 1, /* SIGHUP may change it in a running daemon */
    TY_CONFIG_SECRET = 1u << 2,     /* --dump-config prints "<redacted>" (api keys) */
};

struct ty_config_struct;

struct ty_config_field {
    const char *key;          /* YAML key: lower case, digits and '_' */
    enum ty_config_type type;
    size_t offset;            /* of the member in the enclosing struct (TY_CONFIG_AT) */
    size_t size;              /* sizeof the member (for lists: of one entry) */
    size_t count_offset;      /* lists only: offset of the uint32_t entry count */
    const char *def;          /* default in the field's syntax; NULL: zero / empty / NULL */
    const char *min, *max;    /* inclusive bounds in the field's syntax; NULL: none. For
                               * strings and lists they bound the length / entry count. */
    const char *const *enum_names; /* enum only: NULL-terminated */
    const struct ty_config_struct *sub; /* SECTION, and LIST of structs */
    enum ty_config_type elem; /* LIST of scalars: the entry type (when .sub is NULL) */
    unsigned flags;           /* enum ty_config_flag */
    const char *help;         /* one line for --help */
};

/* A check across the fields of a root struct, or of what they name outside the config (a file
 * that must hold a certificate): `data` is the filled struct. Returns 0, or TY_ECONFIG with
 * `field` (the dotted path at fault, field_cap bytes) and `why` (why_cap bytes) filled. */
typedef int (*ty_config_check_cb)(const void *data, char *field, size_t field_cap, char *why,
                                  size_t why_cap);

/* One struct type: a section, a list entry, or the root of a component's settings. */
struct ty_config_struct {
    const char *name;   /* for messages and the generated docs */
    size_t size;        /* sizeof the C struct */
    const struct ty_config_field *fields;
    size_t n_fields;
    ty_config_check_cb check; /* root only, may be NULL: run by ty_config_finish() */
};

#define TY_CONFIG_AT(type, member)                                                                \
    .offset = offsetof(type, member), .size = sizeof(((type *)0)->member)
#define TY_CONFIG_LIST_AT(type, member, count_member)                                             \
    .offset = offsetof(type, member), .size = sizeof(*((type *)0)->member),                       \
    .count_offset = offsetof(type, count_member)
#define TY_CONFIG_STRUCT(name_, type, fields_)                                                    \
    {                                                                                             \
        .name = (name_), .size = sizeof(type), .fields = (fields_),                               \
        .n_fields = sizeof(fields_) / sizeof((fields_)[0])                                        \
    }
/* The same with a ty_config_check_cb (a root table). */
#define TY_CONFIG_STRUCT_CHECKED(name_, type, fields_, check_)                                    \
    {                                                                                             \
        .name = (name_), .size = sizeof(type), .fields = (fields_),                               \
        .n_fields = sizeof(fields_) / sizeof((fields_)[0]), .check = (check_)                     \
    }

/* An error: `msg` is the whole line to print; the parts are there for tests and tools. */
struct ty_config_error {
    char msg[1024];   /* "conductor.yaml:7:3: slo.ttft_ms: value -5 is below the minimum 1" */
    char origin[256]; /* file name, "TYCHO_SLO_TTFT_MS" or "--slo.ttft_ms" */
    char field[256];  /* dotted path, list entries as "slo_classes[1].name"; may be empty */
    int line, col;    /* 1-based; 0 where unknown (environment, flags, missing field) */
};

typedef struct ty_config ty_config_t;

struct ty_config_opts {
    const struct ty_config_struct *root; /* the settings table (borrowed; must outlive cfg) */
    void *data;                          /* the struct to fill (borrowed; caller-owned) */
    const char *env_prefix;              /* "TYCHO_" if NULL */
};

/* Check the table, derive the libcyaml schema and fill `data` with the defaults (any previous
 * content of `data` is overwritten, not freed). Returns 0, TY_ECONFIG (table bug; `err` says
 * which field) or TY_ENOMEM. `err` may be NULL. */
int ty_config_new(ty_config_t **out, const struct ty_config_opts *opts,
                  struct ty_config_error *err);

/* Free strings and lists inside `data`, then the config object. NULL is a no-op. */
void ty_config_free(ty_config_t *cfg);

/* Apply a YAML file on top of what is set. Returns 0, TY_ECONFIG (bad content), TY_EPARSE
 * (YAML syntax), or -errno if the file cannot be read; `err` explains. On error `data` keeps
 * the values it had before the call. */
int ty_config_load_file(ty_config_t *cfg, const char *path, struct ty_config_error *err);

/* Same for YAML text in memory; `origin` names it in messages ("<string>" if NULL). */
int ty_config_load_string(ty_config_t *cfg, const char *text, size_t len, const char *origin,
                          struct ty_config_error *err);

/* Apply every `<prefix><PATH>` variable present in the environment, PATH being the dotted key
 * upper-cased with '.' turned to '_' (slo.ttft_ms -> TYCHO_SLO_TTFT_MS). Unrelated variables
 * are ignored. */
int ty_config_load_env(ty_config_t *cfg, struct ty_config_error *err);

/* Set one dotted key from text, as a flag would (`origin` defaults to "command line"). */
int ty_config_set(ty_config_t *cfg, const char *key, const char *value, const char *origin,
                  struct ty_config_error *err);

/* Apply one "--key=value" argument (or "--key" for a bool, meaning true); '-' in the key reads
 * as '_' (--log-level=debug sets log_level). Returns 0,
 * TY_ENOTFOUND when `arg` names no setting (so callers can try their own flags), or an error. */
int ty_config_set_arg(ty_config_t *cfg, const char *arg, struct ty_config_error *err);

/* After all layers: check that required fields were set, then run the root table's check (if
 * any). Returns 0 or TY_ECONFIG. */
int ty_config_finish(ty_config_t *cfg, struct ty_config_error *err);

/* Write the effective settings as YAML that loads back to the same values. */
int ty_config_dump(const ty_config_t *cfg, FILE *out);

/* Write one line per setting: "--slo.ttft_ms=UINT  time-to-first-token SLO (default 2000)". */
void ty_config_help(const struct ty_config_struct *root, FILE *out);

/* Copy the fields flagged TY_CONFIG_RELOADABLE from `fresh` (same table, fully loaded) into
 * `live`, logging each change; fields that differ but are not reloadable are logged as
 * needing a restart and left as they are. `*n_changed` (may be NULL) gets the number copied. */
int ty_config_reload(ty_config_t *live, ty_config_t *fresh, unsigned *n_changed);

/* The member of a dotted setting ("limits.max_body_bytes") inside the config's data and its
 * type, or NULL when no such setting exists. Same thread as the config. */
void *ty_config_lookup(const ty_config_t *cfg, const char *path, enum ty_config_type *type);

/* The file of the last successful ty_config_load_file(), or NULL. */
const char *ty_config_path(const ty_config_t *cfg);

/* Free strings and lists inside a struct filled by a config of table `root`; zeroes them. */
void ty_config_values_free(const struct ty_config_struct *root, void *data);

/* Split a "host:port" setting (the last ':' separates them; port 1..65535) into host (NUL-
 * terminated, at most cap - 1 bytes) and *port. Returns 0 or TY_EINVAL. Any thread. */
int ty_config_split_hostport(const char *s, char *host, size_t cap, uint16_t *port);

/* Names for a TY_CONFIG_ENUM `log_level` setting, in enum ty_log_level order (NULL-terminated).
 * ty_daemon_new() sets the log threshold from such a setting. */
extern const char *const ty_config_log_level_names[];
extern const char *const ty_config_log_format_names[]; /* enum ty_log_format's */
#define TY_CONFIG_LOG_FORMAT_HELP                                                                 \
    "log lines on stderr: text, or json (one object per line: time, level, subsystem, "         \
    "process, message, and the request ids it names, for log collectors)"

#endif
