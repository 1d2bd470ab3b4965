/* Scalar values of the config module: parse, range-check, store, format, suggest.
 *
 * The syntax accepted here is a subset of what libcyaml reads (it is stricter: no trailing
 * garbage, no "maybe" as true), so a value that passes here loads to the same bits there.
 * Pure functions; thread-safe.
 */
#include "config-impl.h"

#include "tycho/errors.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *const ty_config_log_level_names[] = {"error", "warn", "info", "debug", "trace", NULL};
const char *const ty_config_log_format_names[] = {"text", "json", NULL}; /* enum ty_log_format */

bool ty__cfg_is_scalar(enum ty_config_type t)
{
    return t != TY_CONFIG_SECTION && t != TY_CONFIG_LIST;
}

const char *ty__cfg_type_name(const struct ty_config_field *f, enum ty_config_type t)
{
    static const char *const names[] = {
        [TY_CONFIG_BOOL] = "bool",         [TY_CONFIG_INT] = "int",
        [TY_CONFIG_UINT] = "uint",         [TY_CONFIG_DOUBLE] = "number",
        [TY_CONFIG_STRING] = "string",     [TY_CONFIG_ENUM] = "enum",
        [TY_CONFIG_SIZE] = "size",         [TY_CONFIG_DURATION] = "duration",
        [TY_CONFIG_SECTION] = "section",   [TY_CONFIG_LIST] = "list",
    };
    (void)f;
    return (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}

/* Integers: optional sign, decimal without leading zeros, or 0x hex. */
static bool parse_i64(const char *s, bool allow_neg, int64_t *out, bool *overflow)
{
    const char *p = s;
    bool neg = false;
    *overflow = false;
    if (*p == '-' || *p == '+') {
        neg = *p == '-';
        if (neg && !allow_neg)
            return false;
        p++;
    }
    int base = 10;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        base = 16;
        p += 2;
        if (!isxdigit((unsigned char)*p))
            return false;
    } else if (!isdigit((unsigned char)*p) || (p[0] == '0' && p[1] != '\0')) {
        return false;
    }
    uint64_t v = 0;
    for (; *p; p++) {
        int d = isdigit((unsigned char)*p) ? *p - '0'
                : (base == 16 && isxdigit((unsigned char)*p)) ? tolower((unsigned char)*p) - 'a' + 10
                                                                : -1;
        if (d < 0)
            return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
            *overflow = true;
        else
            v = v * (uint64_t)base + (uint64_t)d;
    }
    if (v > (uint64_t)INT64_MAX + (neg ? 1u : 0u))
        *overflow = true;
    if (*overflow)
        return true;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

/* A decimal number ("1.5", "2", "3e2"): strtod, but the whole text, finite. */
static bool parse_number(const char *s, double *out)
{
    char *end = NULL;
    if (!*s || isspace((unsigned char)*s))
        return false;
    for (const char *p = s; *p; p++) /* no hex floats, inf, nan */
        if (!(isdigit((unsigned char)*p) || strchr("+-.eE", *p)))
            return false;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(v))
        return false;
    *out = v;
    return true;
}

struct unit {
    const char *name;
    uint64_t mult;
};

static const struct unit size_units[] = {
    {"", 1},
    {"B", 1},
    {"K", 1ull << 10}, {"KB", 1ull << 10}, {"KiB", 1ull << 10}, {"k", 1ull << 10},
    {"M", 1ull << 20}, {"MB", 1ull << 20}, {"MiB", 1ull << 20},
    {"G", 1ull << 30}, {"GB", 1ull << 30}, {"GiB", 1ull << 30},
    {"T", 1ull << 40}, {"TB", 1ull << 40}, {"TiB", 1ull << 40},
};
static const struct unit dur_units[] = {
    {"ns", 1ull}, {"us", 1000ull}, {"ms", 1000000ull}, {"s", 1000000000ull},
    {"m", 60000000000ull}, {"h", 3600000000000ull},
};

/* "<number><unit>" with a non-negative number, decimals allowed if the product is whole. */
static int parse_with_unit(const char *s, const struct unit *units, size_t n_units, bool need_unit,
                           uint64_t *out)
{
    size_t i = 0;
    while (isdigit((unsigned char)s[i]) || s[i] == '.')
        i++;
    if (i == 0 || i > 40)
        return TY_EINVAL;
    char num[48];
    memcpy(num, s, i);
    num[i] = '\0';
    const char *unit = s + i;
    for (size_t u = 0; u < n_units; u++) {
        if (strcmp(unit, units[u].name) != 0)
            continue;
        double v;
        if (!parse_number(num, &v))
            return TY_EINVAL;
        long double prod = (long double)v * (long double)units[u].mult;
        if (prod > (long double)INT64_MAX)
            return TY_ERANGE;
        uint64_t r = (uint64_t)prod;
        if ((long double)r != prod)
            return TY_EINVAL;
        *out = r;
        return 0;
    }
    if (need_unit && *unit == '\0' && strspn(num, "0.") == strlen(num)) {
        *out = 0; /* "0" needs no unit */
        return 0;
    }
    return need_unit && *unit == '\0' ? TY_ENODATA : TY_EINVAL;
}

static int parse_enum(const struct ty_config_field *f, const char *text, union ty__cfg_val *out,
                      char *why, size_t why_len)
{
    size_t n = 0;
    for (; f->enum_names && f->enum_names[n]; n++) {
        if (strcmp(text, f->enum_names[n]) == 0) {
            out->i = (int64_t)n;
            return 0;
        }
    }
    char list[256] = "", hint[96];
    for (size_t k = 0; k < n; k++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof(list) - used, "%s%s", k ? ", " : "", f->enum_names[k]);
    }
    ty__cfg_suggest(text, f->enum_names, n, hint, sizeof(hint));
    snprintf(why, why_len, "'%s' is not one of %s%s", text, list, hint);
    return TY_ECONFIG;
}

static int parse_integer(const struct ty_config_field *f, enum ty_config_type t, const char *text,
                         union ty__cfg_val *out, char *why, size_t why_len)
{
    bool overflow;
    int64_t v = 0;
    if (!parse_i64(text, true, &v, &overflow)) {
        snprintf(why, why_len, "'%s' is not %s", text,
                 t == TY_CONFIG_UINT ? "a non-negative integer" : "an integer");
        return TY_ECONFIG;
    }
    if (overflow) {
        snprintf(why, why_len, "value %s is out of the 64-bit range", text);
        return TY_ECONFIG;
    }
    if (t == TY_CONFIG_UINT && v < 0) {
        snprintf(why, why_len, "value %s is below the minimum %s", text,
                 f && f->min ? f->min : "0");
        return TY_ECONFIG;
    }
    if (t == TY_CONFIG_UINT)
        out->u = (uint64_t)v;
    else
        out->i = v;
    return 0;
}

int ty__cfg_parse(const struct ty_config_field *f, enum ty_config_type t, const char *text,
                  union ty__cfg_val *out, char *why, size_t why_len)
{
    int rc;
    memset(out, 0, sizeof(*out));
    switch (t) {
    case TY_CONFIG_BOOL:
        if (!strcasecmp(text, "true") || !strcasecmp(text, "yes")) {
            out->b = true;
            return 0;
        }
        if (!strcasecmp(text, "false") || !strcasecmp(text, "no"))
            return 0;
        snprintf(why, why_len, "'%s' is not a bool (true, false, yes or no)", text);
        return TY_ECONFIG;
    case TY_CONFIG_INT:
    case TY_CONFIG_UINT:
        return parse_integer(f, t, text, out, why, why_len);
    case TY_CONFIG_DOUBLE:
        if (parse_number(text, &out->d))
            return 0;
        snprintf(why, why_len, "'%s' is not a finite number", text);
        return TY_ECONFIG;
    case TY_CONFIG_ENUM:
        return parse_enum(f, text, out, why, why_len);
    case TY_CONFIG_SIZE:
        rc = parse_with_unit(text, size_units, sizeof(size_units) / sizeof(size_units[0]), false,
                             &out->u);
        if (rc == 0)
            return 0;
        snprintf(why, why_len, "'%s' is not a size (bytes, or a number with K, M, G or T)%s", text,
                 rc == TY_ERANGE ? ": too large" : "");
        return TY_ECONFIG;
    case TY_CONFIG_DURATION:
        rc = parse_with_unit(text, dur_units, sizeof(dur_units) / sizeof(dur_units[0]), true,
                             &out->u);
        if (rc == 0)
            return 0;
        snprintf(why, why_len, "'%s' is not a duration%s", text,
                 rc == TY_ENODATA   ? ": a unit is needed (ns, us, ms, s, m, h), e.g. '10s'"
                 : rc == TY_ERANGE ? ": too large"
                                   : " (a number with ns, us, ms, s, m or h)");
        return TY_ECONFIG;
    case TY_CONFIG_STRING:
        return 0;
    default:
        snprintf(why, why_len, "expected a single value");
        return TY_ECONFIG;
    }
}

/* Bounds implied by the C member's size. */
static void size_bounds(enum ty_config_type t, size_t size, int64_t *lo, uint64_t *hi)
{
    if (t == TY_CONFIG_INT) {
        int64_t m = size >= 8 ? INT64_MAX : (int64_t)((1ull << (size * 8 - 1)) - 1);
        *lo = -m - 1;
        *hi = (uint64_t)m;
    } else {
        *lo = 0;
        *hi = size >= 8 ? (uint64_t)INT64_MAX : (1ull << (size * 8)) - 1;
    }
}

static int cmp_val(enum ty_config_type t, union ty__cfg_val a, union ty__cfg_val b)
{
    switch (t) {
    case TY_CONFIG_INT:
        return a.i < b.i ? -1 : a.i > b.i;
    case TY_CONFIG_DOUBLE:
        return a.d < b.d ? -1 : a.d > b.d;
    default:
        return a.u < b.u ? -1 : a.u > b.u;
    }
}

static int check_bound(const struct ty_config_field *f, enum ty_config_type t, const char *text,
                       union ty__cfg_val v, const char *bound, bool is_min, char *why,
                       size_t why_len)
{
    union ty__cfg_val b;
    char tmp[128];
    if (!bound || ty__cfg_parse(f, t, bound, &b, tmp, sizeof(tmp)) != 0)
        return 0;
    int c = cmp_val(t, v, b);
    if ((is_min && c < 0) || (!is_min && c > 0)) {
        snprintf(why, why_len, "value %s is %s the %s %s", text, is_min ? "below" : "above",
                 is_min ? "minimum" : "maximum", bound);
        return TY_ECONFIG;
    }
    return 0;
}

int ty__cfg_parse_checked(const struct ty_config_field *f, enum ty_config_type t,
                          const char *text, union ty__cfg_val *out, char *why, size_t why_len)
{
    int rc = ty__cfg_parse(f, t, text, out, why, why_len);
    if (rc != 0)
        return rc;
    if (f->type == TY_CONFIG_LIST) /* an entry: the list's min/max bound its entry count */
        return 0;
    if (t == TY_CONFIG_STRING) {
        union ty__cfg_val len = {.u = strlen(text)}, b;
        char tmp[64];
        if (f->min && ty__cfg_parse(f, TY_CONFIG_UINT, f->min, &b, tmp, sizeof(tmp)) == 0 &&
            len.u < b.u) {
            snprintf(why, why_len, "'%s' is shorter than %s characters", text, f->min);
            return TY_ECONFIG;
        }
        if (f->max && ty__cfg_parse(f, TY_CONFIG_UINT, f->max, &b, tmp, sizeof(tmp)) == 0 &&
            len.u > b.u) {
            snprintf(why, why_len, "value is longer than %s characters", f->max);
            return TY_ECONFIG;
        }
        return 0;
    }
    if (t == TY_CONFIG_BOOL || t == TY_CONFIG_ENUM)
        return 0;
    rc = check_bound(f, t, text, *out, f->min, true, why, why_len);
    if (rc == 0)
        rc = check_bound(f, t, text, *out, f->max, false, why, why_len);
    if (rc != 0)
        return rc;
    if (t == TY_CONFIG_INT || t == TY_CONFIG_UINT) {
        int64_t lo;
        uint64_t hi;
        size_bounds(t, f->size, &lo, &hi);
        bool below = t == TY_CONFIG_INT ? out->i < lo : false;
        bool above = t == TY_CONFIG_INT ? (out->i > 0 && (uint64_t)out->i > hi) : out->u > hi;
        if (below || above) {
            snprintf(why, why_len, "value %s does not fit the setting (%" PRId64 "..%" PRIu64 ")",
                     text, lo, hi);
            return TY_ECONFIG;
        }
    }
    return 0;
}

void ty__cfg_store(enum ty_config_type t, size_t size, void *dst, union ty__cfg_val v)
{
    switch (t) {
    case TY_CONFIG_BOOL:
        *(bool *)dst = v.b;
        return;
    case TY_CONFIG_DOUBLE:
        if (size == sizeof(float))
            *(float *)dst = (float)v.d;
        else
            *(double *)dst = v.d;
        return;
    case TY_CONFIG_INT:
    case TY_CONFIG_ENUM: {
        int8_t i8 = (int8_t)v.i;
        int16_t i16 = (int16_t)v.i;
        int32_t i32 = (int32_t)v.i;
        memcpy(dst, size == 1 ? (void *)&i8 : size == 2 ? (void *)&i16 : size == 4 ? (void *)&i32
                                                                              : (void *)&v.i,
               size);
        return;
    }
    default: {
        uint8_t u8 = (uint8_t)v.u;
        uint16_t u16 = (uint16_t)v.u;
        uint32_t u32 = (uint32_t)v.u;
        memcpy(dst, size == 1 ? (void *)&u8 : size == 2 ? (void *)&u16 : size == 4 ? (void *)&u32
                                                                              : (void *)&v.u,
               size);
        return;
    }
    }
}

union ty__cfg_val ty__cfg_load(enum ty_config_type t, size_t size, const void *src)
{
    union ty__cfg_val v = {.u = 0};
    switch (t) {
    case TY_CONFIG_BOOL:
        v.b = *(const bool *)src;
        break;
    case TY_CONFIG_DOUBLE:
        v.d = size == sizeof(float) ? *(const float *)src : *(const double *)src;
        break;
    case TY_CONFIG_INT:
    case TY_CONFIG_ENUM:
        v.i = size == 1   ? *(const int8_t *)src
              : size == 2 ? *(const int16_t *)src
              : size == 4 ? *(const int32_t *)src
                          : *(const int64_t *)src;
        break;
    default:
        v.u = size == 1   ? *(const uint8_t *)src
              : size == 2 ? *(const uint16_t *)src
              : size == 4 ? *(const uint32_t *)src
                          : *(const uint64_t *)src;
        break;
    }
    return v;
}

/* Shortest "%g" text that reads back to the same double. */
static void format_double(double d, char *buf, size_t len)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    if (!strpbrk(buf, ".e") && strlen(buf) + 3 < len)
        strcat(buf, ".0");
}

static void format_units(uint64_t v, const struct unit *units, size_t n, char *buf, size_t len)
{
    for (size_t u = n; u-- > 0;) {
        if (units[u].name[0] && v % units[u].mult == 0 && (v != 0 || units[u].mult == 1)) {
            snprintf(buf, len, "%" PRIu64 "%s", v / units[u].mult, units[u].name);
            return;
        }
    }
    snprintf(buf, len, "%" PRIu64, v);
}

void ty__cfg_format(const struct ty_config_field *f, enum ty_config_type t, union ty__cfg_val v,
                    char *buf, size_t len)
{
    static const struct unit size_fmt[] = {{"", 1}, {"K", 1ull << 10}, {"M", 1ull << 20},
                                           {"G", 1ull << 30}, {"T", 1ull << 40}};
    switch (t) {
    case TY_CONFIG_BOOL:
        snprintf(buf, len, "%s", v.b ? "true" : "false");
        break;
    case TY_CONFIG_INT:
        snprintf(buf, len, "%" PRId64, v.i);
        break;
    case TY_CONFIG_DOUBLE:
        format_double(v.d, buf, len);
        break;
    case TY_CONFIG_ENUM: {
        size_t n = 0;
        while (f->enum_names && f->enum_names[n])
            n++;
        snprintf(buf, len, "%s", v.i >= 0 && (size_t)v.i < n ? f->enum_names[v.i] : "?");
        break;
    }
    case TY_CONFIG_SIZE:
        format_units(v.u, size_fmt, sizeof(size_fmt) / sizeof(size_fmt[0]), buf, len);
        break;
    case TY_CONFIG_DURATION:
        if (v.u == 0)
            snprintf(buf, len, "0s");
        else
            format_units(v.u, dur_units, sizeof(dur_units) / sizeof(dur_units[0]), buf, len);
        break;
    default:
        snprintf(buf, len, "%" PRIu64, v.u);
        break;
    }
}

size_t ty__cfg_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 1000;
    size_t row[65];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* "; did you mean 'x'?" when a candidate is close enough, else "". */
void ty__cfg_suggest(const char *word, const char *const *cands, size_t n, char *buf, size_t len)
{
    size_t best = (size_t)-1;
    const char *pick = NULL;
    for (size_t i = 0; i < n; i++) {
        size_t d = ty__cfg_edit_distance(word, cands[i]);
        if (d < best) {
            best = d;
            pick = cands[i];
        }
    }
    size_t limit = strlen(word) / 3 + 1;
    if (limit < 2)
        limit = 2;
    buf[0] = '\0';
    if (pick && best <= limit)
        snprintf(buf, len, "; did you mean '%s'?", pick);
}

int ty_config_split_hostport(const char *s, char *host, size_t cap, uint16_t *port)
{
    const char *colon = s ? strrchr(s, ':') : NULL;
    if (!colon || colon == s || (size_t)(colon - s) >= cap || !isdigit((unsigned char)colon[1]))
        return TY_EINVAL;
    char *end;
    unsigned long p = strtoul(colon + 1, &end, 10);
    if (*end || !p || p > 65535)
        return TY_EINVAL;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    *port = (uint16_t)p;
    return 0;
}
