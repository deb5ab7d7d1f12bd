/* See text.h. */
#include "common/text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each literal correctly rounded by the compiler. */
const double ls_pow10_table[121] = {
    1e-60, 1e-59, 1e-58, 1e-57, 1e-56, 1e-55, 1e-54, 1e-53, 1e-52, 1e-51, 1e-50, 1e-49, 1e-48, 1e-47, 1e-46,
    1e-45, 1e-44, 1e-43, 1e-42, 1e-41, 1e-40, 1e-39, 1e-38, 1e-37, 1e-36, 1e-35, 1e-34, 1e-33, 1e-32, 1e-31,
    1e-30, 1e-29, 1e-28, 1e-27, 1e-26, 1e-25, 1e-24, 1e-23, 1e-22, 1e-21, 1e-20, 1e-19, 1e-18, 1e-17, 1e-16,
    1e-15, 1e-14, 1e-13, 1e-12, 1e-11, 1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1e0, 1e1,
    1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22, 1e23, 1e24, 1e25, 1e26, 1e27, 1e28, 1e29, 1e30, 1e31, 1e32, 1e33, 1e34, 1e35, 1e36, 1e37, 1e38,
    1e39, 1e40, 1e41, 1e42, 1e43, 1e44, 1e45, 1e46, 1e47, 1e48, 1e49, 1e50, 1e51, 1e52, 1e53, 1e54, 1e55, 1e56,
    1e57, 1e58, 1e59, 1e60};

bool ls_text_bool(const char *text, bool *out) {
    if (!strcmp(text, "true") || !strcmp(text, "1")) *out = true;
    else if (!strcmp(text, "false") || !strcmp(text, "0")) *out = false;
    else return false;
    return true;
}

bool ls_text_bool_py(const char *text, bool *out) {
    if (!strcmp(text, "True")) *out = true;
    else if (!strcmp(text, "False")) *out = false;
    else return ls_text_bool(text, out);
    return true;
}

bool ls_text_int(const char *text, long long min, long long max, long long *out) {
    const char *d = text[0] == '-' ? text + 1 : text;
    if (!*d) return false;
    for (const char *c = d; *c; c++)
        if (*c < '0' || *c > '9') return false;
    errno = 0;
    long long v = strtoll(text, NULL, 10);
    if (errno == ERANGE || v < min || v > max) return false;
    *out = v;
    return true;
}

void ls_text_log_field(const char *text, bool keep_spaces, char *out, size_t len) {
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && o + 4 < len; p++) {
        if ((*p > ' ' || (*p == ' ' && keep_spaces)) && *p < 0x7f && *p != '%') out[o++] = (char)*p;
        else o += (size_t)snprintf(out + o, len - o, "%%%02X", *p);
    }
    if (len) out[o < len ? o : len - 1] = '\0';
}

ls_text_cut ls_text_tail(const char *s) {
    ls_text_cut c;
    size_t n = strlen(s);
    if (n <= LS_TEXT_TAIL) {
        memcpy(c.s, s, n + 1);
        return c;
    }
    const char *end = s + n - (LS_TEXT_TAIL - 3);
    while (*end && ((unsigned char)*end & 0xC0) == 0x80) end++; /* not inside a UTF-8 sequence */
    snprintf(c.s, sizeof c.s, "...%s", end);
    return c;
}

/* Length of the well-formed UTF-8 sequence at p (RFC 3629, table 3-7),
 * 0 when there is none. */
static size_t ls_utf8_len(const unsigned char *p) {
    const unsigned char c = p[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xC0) != 0x80) return 0; /* also stops at the NUL */
    return n;
}

void ls_text_utf8_repair(char *s) {
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        const size_t n = ls_utf8_len(p);
        if (n) p += n;
        else *p++ = '?';
    }
}

size_t ls_text_utf8_cut(const char *s, size_t n) {
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    return n;
}

bool ls_adapter_name_valid(const char *name) {
    size_t n = strlen(name);
    if (n < 1 || n > 128 || name[0] == '.') return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    }
    return true;
}

bool ls_tenant_name_valid(const char *name) {
    const size_t n = strlen(name);
    if (n < 1 || n > 32 || name[0] == '-' || name[0] == '_') return false;
    for (size_t i = 0; i < n; i++) {
        const char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
    }
    return true;
}

bool ls_adapter_pool_name_valid(const char *name) {
    const char *slash = strchr(name, '/');
    if (!slash) return ls_adapter_name_valid(name);
    const size_t tl = (size_t)(slash - name);
    char tenant[33];
    if (tl == 0 || tl >= sizeof tenant || strlen(name) > 128) return false;
    memcpy(tenant, name, tl);
    tenant[tl] = '\0';
    return ls_tenant_name_valid(tenant) && ls_adapter_name_valid(slash + 1);
}

/* Optimal string alignment over two rows of the matrix and the one before
 * them; names longer than 128 bytes are never near anything. */
int ls_text_distance(const char *a, const char *b, int cap) {
    const size_t la = strlen(a), lb = strlen(b);
    if (la > 128 || lb > 128) return cap + 1;
    if ((la > lb ? la - lb : lb - la) > (size_t)cap) return cap + 1;
    int rows[3][130], *pp = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        int low = cur[0];
        for (size_t j = 1; j <= lb; j++) {
            const int cost = a[i - 1] != b[j - 1];
            int d = prev[j] + 1;
            if (cur[j - 1] + 1 < d) d = cur[j - 1] + 1;
            if (prev[j - 1] + cost < d) d = prev[j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && pp[j - 2] + 1 < d) d = pp[j - 2] + 1;
            cur[j] = d;
            if (d < low) low = d;
        }
        if (low > cap) return cap + 1;
        int *t = pp;
        pp = prev, prev = cur, cur = t;
    }
    return prev[lb] > cap ? cap + 1 : prev[lb];
}

void ls_text_near_init(ls_text_near *n, const char *word) {
    n->word = word;
    n->best[0] = '\0';
    /* Short words allow one edit, longer ones two: "slot" is not a typo
     * of "port". */
    n->dist = strlen(word) <= 4 ? 2 : 3;
}

void ls_text_near_offer(ls_text_near *n, const char *candidate) {
    if (!strcmp(candidate, n->word) || strlen(candidate) >= sizeof n->best) return;
    int d = ls_text_distance(n->word, candidate, n->dist - 1);
    if (d < n->dist) {
        n->dist = d;
        memcpy(n->best, candidate, strlen(candidate) + 1);
    }
}

const char *ls_text_near_clause(const ls_text_near *n, const char *prefix, const char *suffix, char *buf,
                                size_t len) {
    if (!len) return buf;
    if (n->best[0]) snprintf(buf, len, "%s%s%s", prefix, n->best, suffix);
    else buf[0] = '\0';
    return buf;
}

const char *ls_text_unknown_key(const char *key, const char *const *known, char *hint, size_t hint_len, char *near,
                                size_t near_len) {
    ls_text_near n;
    ls_text_near_init(&n, key);
    if (hint_len) snprintf(hint, hint_len, "known keys:");
    for (size_t i = 0; known[i]; i++) {
        size_t l = strlen(hint);
        if (l < hint_len) snprintf(hint + l, hint_len - l, "%s %s", i ? "," : "", known[i]);
        ls_text_near_offer(&n, known[i]);
    }
    return ls_text_near_clause(&n, "; did you mean \"", "\"?", near, near_len);
}
