/* Jinja lexer: template source -> token array, with HF's whitespace settings applied to text
 * (trim_blocks, lstrip_blocks, `-`/`+` markers, raw blocks, no trailing newline kept). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja-impl.h"

struct lexer {
    struct jj_arena *a;
    const char *s; /* normalized source */
    size_t n, pos;
    int line;
    struct jtok *t;
    size_t nt, capt;
    struct ty_jinja_error *err;
    bool strip_next; /* `-` closed the previous tag: drop leading whitespace of the next text */
    bool trim_next;  /* trim_blocks: drop one newline after the previous block tag */
};

static int lx_push(struct lexer *L, struct jtok tk)
{
    if (L->nt == L->capt) {
        size_t nc = L->capt ? L->capt * 2 : 64;
        struct jtok *nt = ty__jinja_alloc(L->a, nc * sizeof(*nt));
        if (!nt)
            return TY_ENOMEM;
        if (L->nt)
            memcpy(nt, L->t, L->nt * sizeof(*nt));
        L->t = nt;
        L->capt = nc;
    }
    L->t[L->nt++] = tk;
    return 0;
}

static int lx_line_of(const struct lexer *L, size_t from, size_t to, int line)
{
    for (size_t i = from; i < to && i < L->n; i++)
        line += L->s[i] == '\n';
    return line;
}

/* Emit the text s[b, e) with the pending strip flags and the strip the next tag asks for. */
static int lx_text(struct lexer *L, size_t b, size_t e, char tagc, char mark)
{
    if (L->strip_next)
        while (b < e && isspace((unsigned char)L->s[b]))
            b++;
    else if (L->trim_next && b < e && L->s[b] == '\n')
        b++;
    L->strip_next = L->trim_next = false;
    bool line_start = b == 0 || L->s[b - 1] == '\n';
    if (mark == '-') {
        while (e > b && isspace((unsigned char)L->s[e - 1]))
            e--;
    } else if (tagc != '{' && mark != '+') {
        size_t l = e;
        while (l > b && L->s[l - 1] != '\n')
            l--;
        bool ws = true;
        for (size_t i = l; i < e; i++)
            ws = ws && (L->s[i] == ' ' || L->s[i] == '\t');
        if (ws && (l > b || line_start))
            e = l;
    }
    if (e <= b)
        return 0;
    struct jtok tk = {.kind = JT_TEXT, .line = lx_line_of(L, 0, b, 1), .p = L->s + b, .n = e - b};
    return lx_push(L, tk);
}

static int lx_hex(const char *p, int n, uint32_t *cp)
{
    *cp = 0;
    for (int i = 0; i < n; i++) {
        int c = p[i], v = isdigit(c) ? c - '0' : isxdigit(c) ? (tolower(c) - 'a' + 10) : -1;
        if (v < 0)
            return -1;
        *cp = *cp * 16 + (uint32_t)v;
    }
    return 0;
}

static size_t lx_utf8(uint32_t cp, char *o)
{
    if (cp >= 0xD800 && cp < 0xE000)
        cp = 0xFFFD;
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp > 0x10FFFF)
        cp = 0xFFFD;
    if (cp < 0x10000)
        return lx_utf8(cp, o);
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string literal at L->pos (quote char included); decodes Python escapes. */
static int lx_string(struct lexer *L, struct jtok *tk)
{
    char q = L->s[L->pos];
    size_t i = L->pos + 1;
    char *o = ty__jinja_alloc(L->a, L->n - L->pos + 1);
    size_t on = 0;
    if (!o)
        return TY_ENOMEM;
    for (;;) {
        if (i >= L->n) {
            ty__jinja_seterr(L->err, L->line, "unterminated string at line %d", L->line);
            return TY_EPARSE;
        }
        char ch = L->s[i];
        if (ch == q)
            break;
        if (ch == '\n')
            L->line++;
        if (ch != '\\' || i + 1 >= L->n) {
            o[on++] = ch;
            i++;
            continue;
        }
        char e = L->s[i + 1];
        static const char map[] = "n\nt\tr\r\\\\''\"\"a\ab\bf\fv\v0\0";
        const char *m = NULL;
        for (const char *k = map; k + 1 < map + sizeof(map); k += 2)
            if (*k == e) {
                m = k;
                break;
            }
        int hl = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        uint32_t cp;
        if (m) {
            o[on++] = m[1];
            i += 2;
        } else if (e == '\n') {
            L->line++;
            i += 2;
        } else if (hl && i + 2 + (size_t)hl <= L->n && lx_hex(L->s + i + 2, hl, &cp) == 0) {
            on += lx_utf8(cp, o + on);
            i += 2 + (size_t)hl;
        } else {
            o[on++] = '\\';
            i++;
        }
    }
    tk->kind = JT_STRING;
    tk->p = o;
    tk->n = on;
    L->pos = i + 1;
    return 0;
}

static int lx_number(struct lexer *L, struct jtok *tk)
{
    char buf[128];
    size_t bn = 0, i = L->pos;
    bool isf = false;
    while (i < L->n && bn < sizeof(buf) - 1) {
        char ch = L->s[i];
        if (isdigit((unsigned char)ch)) {
            buf[bn++] = ch;
        } else if (ch == '_' && i + 1 < L->n && isdigit((unsigned char)L->s[i + 1])) {
            /* digit separator */
        } else if (ch == '.' && !isf && i + 1 < L->n && isdigit((unsigned char)L->s[i + 1])) {
            isf = true;
            buf[bn++] = ch;
        } else if ((ch == 'e' || ch == 'E') && i + 1 < L->n &&
                   (isdigit((unsigned char)L->s[i + 1]) ||
                    ((L->s[i + 1] == '-' || L->s[i + 1] == '+') && i + 2 < L->n &&
                     isdigit((unsigned char)L->s[i + 2])))) {
            isf = true;
            buf[bn++] = ch;
            buf[bn++] = L->s[++i];
        } else {
            break;
        }
        i++;
    }
    buf[bn] = 0;
    L->pos = i;
    if (isf) {
        tk->kind = JT_FLOAT;
        tk->f = strtod(buf, NULL);
    } else {
        tk->kind = JT_INT;
        errno = 0;
        unsigned long long v = strtoull(buf, NULL, 10);
        if (errno || v > INT64_MAX) {
            ty__jinja_seterr(L->err, L->line, "integer literal too large at line %d", L->line);
            return TY_EPARSE;
        }
        tk->i = (int64_t)v;
    }
    return 0;
}

static int lx_op(struct lexer *L, struct jtok *tk)
{
    static const struct {
        const char *s;
        int op;
    } two[] = {{"==", JJ_OP_EQ}, {"!=", JJ_OP_NE},       {"<=", JJ_OP_LE},
               {">=", JJ_OP_GE}, {"//", JJ_OP_FLOORDIV}, {"**", JJ_OP_POW}};
    tk->kind = JT_OP;
    if (L->pos + 1 < L->n)
        for (size_t k = 0; k < sizeof(two) / sizeof(two[0]); k++)
            if (L->s[L->pos] == two[k].s[0] && L->s[L->pos + 1] == two[k].s[1]) {
                tk->op = two[k].op;
                L->pos += 2;
                return 0;
            }
    char ch = L->s[L->pos];
    if (!strchr("+-*/%~<>()[]{},.:|=", ch) || ch == 0) {
        ty__jinja_seterr(L->err, L->line, "unexpected character '%c' at line %d",
                         isprint((unsigned char)ch) ? ch : '?', L->line);
        return TY_EPARSE;
    }
    tk->op = ch;
    L->pos++;
    return 0;
}

/* Tokens of one {{ }} or {% %} up to its end marker `end` ('}' or '%'). */
static int lx_expr(struct lexer *L, char end, int begin_line)
{
    int depth = 0, rc;
    for (;;) {
        while (L->pos < L->n && isspace((unsigned char)L->s[L->pos]))
            L->line += L->s[L->pos++] == '\n';
        if (L->pos >= L->n) {
            ty__jinja_seterr(L->err, begin_line, "unclosed tag opened at line %d", begin_line);
            return TY_EPARSE;
        }
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        char mark = 0;
        if (depth == 0 && left >= 3 && (p[0] == '-' || p[0] == '+') && p[1] == end && p[2] == '}')
            mark = p[0], p++, left--;
        if (depth == 0 && left >= 2 && p[0] == end && p[1] == '}') {
            L->pos = (size_t)(p + 2 - L->s);
            L->strip_next = mark == '-';
            L->trim_next = end == '%' && mark == 0;
            struct jtok tk = {.kind = end == '%' ? JT_BLOCK_END : JT_VAR_END, .line = L->line};
            return lx_push(L, tk);
        }
        struct jtok tk = {.line = L->line};
        char ch = *p;
        if (isalpha((unsigned char)ch) || ch == '_') {
            size_t b = L->pos;
            while (L->pos < L->n && (isalnum((unsigned char)L->s[L->pos]) || L->s[L->pos] == '_'))
                L->pos++;
            tk.kind = JT_NAME;
            tk.p = L->s + b;
            tk.n = L->pos - b;
        } else if (isdigit((unsigned char)ch)) {
            rc = lx_number(L, &tk);
            if (rc)
                return rc;
        } else if (ch == '\'' || ch == '"') {
            rc = lx_string(L, &tk);
            if (rc)
                return rc;
        } else {
            rc = lx_op(L, &tk);
            if (rc)
                return rc;
            depth += (tk.op == '(' || tk.op == '[' || tk.op == '{');
            depth -= (tk.op == ')' || tk.op == ']' || tk.op == '}') && depth > 0;
        }
        if ((rc = lx_push(L, tk)))
            return rc;
    }
}

/* `{% raw %}` at L->pos (just after the opening `{%` and its mark): emit the verbatim body. */
static bool lx_try_raw(struct lexer *L)
{
    size_t i = L->pos;
    while (i < L->n && isspace((unsigned char)L->s[i]))
        i++;
    if (L->n - i < 3 || memcmp(L->s + i, "raw", 3) != 0)
        return false;
    i += 3;
    while (i < L->n && isspace((unsigned char)L->s[i]))
        i++;
    char mark = 0;
    if (i < L->n && (L->s[i] == '-' || L->s[i] == '+'))
        mark = L->s[i++];
    if (L->n - i < 2 || L->s[i] != '%' || L->s[i + 1] != '}')
        return false;
    size_t body = i + 2;
    for (size_t k = body; k + 1 < L->n; k++) {
        if (L->s[k] != '{' || L->s[k + 1] != '%')
            continue;
        size_t j = k + 2;
        char m2 = 0;
        if (j < L->n && (L->s[j] == '-' || L->s[j] == '+'))
            m2 = L->s[j++];
        while (j < L->n && isspace((unsigned char)L->s[j]))
            j++;
        if (L->n - j < 6 || memcmp(L->s + j, "endraw", 6) != 0)
            continue;
        j += 6;
        while (j < L->n && isspace((unsigned char)L->s[j]))
            j++;
        char m3 = 0;
        if (j < L->n && (L->s[j] == '-' || L->s[j] == '+'))
            m3 = L->s[j++];
        if (L->n - j < 2 || L->s[j] != '%' || L->s[j + 1] != '}')
            continue;
        L->strip_next = mark == '-';
        L->trim_next = mark == 0;
        if (lx_text(L, body, k, '%', m2))
            return false;
        L->line = lx_line_of(L, L->pos, j + 2, L->line);
        L->pos = j + 2;
        L->strip_next = m3 == '-';
        L->trim_next = m3 == 0;
        return true;
    }
    return false;
}

static int lx_tag(struct lexer *L, size_t k)
{
    char tc = L->s[k + 1];
    size_t after = k + 2;
    char mark = after < L->n && (L->s[after] == '-' || L->s[after] == '+') ? L->s[after] : 0;
    int rc = lx_text(L, L->pos, k, tc, mark);
    if (rc)
        return rc;
    L->line = lx_line_of(L, L->pos, k, L->line);
    int begin_line = L->line;
    L->pos = after + (mark ? 1 : 0);
    if (tc == '#') {
        const char *e = NULL;
        for (size_t i = L->pos; i + 1 < L->n; i++)
            if (L->s[i] == '#' && L->s[i + 1] == '}') {
                e = L->s + i;
                break;
            }
        if (!e) {
            ty__jinja_seterr(L->err, begin_line, "unclosed comment at line %d", begin_line);
            return TY_EPARSE;
        }
        size_t ep = (size_t)(e - L->s);
        char m = ep > L->pos ? L->s[ep - 1] : 0;
        L->line = lx_line_of(L, L->pos, ep + 2, L->line);
        L->pos = ep + 2;
        L->strip_next = m == '-';
        L->trim_next = m != '-' && m != '+';
        return 0;
    }
    if (tc == '%' && lx_try_raw(L))
        return 0;
    struct jtok tk = {.kind = tc == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, .line = begin_line};
    if ((rc = lx_push(L, tk)))
        return rc;
    return lx_expr(L, tc == '%' ? '%' : '}', begin_line);
}

/* Newlines normalized to \n, and one trailing newline dropped (keep_trailing_newline=False). */
static char *lx_normalize(struct jj_arena *a, const char *src, size_t len, size_t *n)
{
    char *s = ty__jinja_alloc(a, len + 1);
    size_t o = 0;
    if (!s)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[o++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[o++] = src[i];
        }
    }
    if (o && s[o - 1] == '\n')
        o--;
    *n = o;
    return s;
}

int ty__jinja_lex(struct jj_arena *a, const char *src, size_t len, struct jtok **toks,
                  size_t *ntoks, struct ty_jinja_error *err)
{
    struct lexer L = {.a = a, .line = 1, .err = err};
    L.s = lx_normalize(a, src, len, &L.n);
    if (!L.s)
        return TY_ENOMEM;
    int rc;
    for (;;) {
        size_t k = L.pos;
        while (k + 1 < L.n &&
               !(L.s[k] == '{' && (L.s[k + 1] == '{' || L.s[k + 1] == '%' || L.s[k + 1] == '#')))
            k++;
        if (k + 1 >= L.n) {
            if ((rc = lx_text(&L, L.pos, L.n, '{', 0)))
                return rc;
            break;
        }
        if ((rc = lx_tag(&L, k)))
            return rc;
    }
    struct jtok eof = {.kind = JT_EOF, .line = L.line};
    if ((rc = lx_push(&L, eof)))
        return rc;
    *toks = L.t;
    *ntoks = L.nt;
    return 0;
}
