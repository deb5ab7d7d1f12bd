/* The strict pull reader of json_reader.h: whitespace, punctuation,
 * strings (escapes, surrogate pairs, UTF-8 checked), numbers in the JSON
 * grammar, literals, and skipping a value with a depth limit. */
#include "format/json_reader.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/text.h"

void ls_jr_init(ls_jr *r, const char *text, size_t len) {
    memset(r, 0, sizeof *r);
    r->start = r->p = text;
    r->end = text + len;
}

bool ls_jr_fail(ls_jr *r, const char *what) {
    if (!r->failed) {
        r->failed = true;
        r->at = (size_t)(r->p - r->start);
        snprintf(r->message, sizeof r->message, "%s", what);
    }
    return false;
}

bool ls_jr_fail_oom(ls_jr *r) {
    bool first = !r->failed;
    ls_jr_fail(r, "out of memory");
    if (first) r->oom = true;
    return false;
}

static void ls_jr_ws(ls_jr *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

char ls_jr_peek(ls_jr *r) {
    if (r->failed) return 0;
    ls_jr_ws(r);
    return r->p < r->end ? *r->p : 0;
}

bool ls_jr_punct(ls_jr *r, char c) {
    if (ls_jr_peek(r) != c) {
        char what[40];
        snprintf(what, sizeof what, "'%c' expected", c);
        return ls_jr_fail(r, what);
    }
    r->p++;
    return true;
}

bool ls_jr_at_end(ls_jr *r) {
    if (r->failed) return false;
    ls_jr_ws(r);
    return r->p == r->end;
}

/* Appends code point cp as UTF-8 to buf (cut at cap - 1 bytes). */
static void ls_jr_put(char *buf, size_t cap, size_t *n, uint32_t cp) {
    char u[4];
    int k;
    if (cp < 0x80) u[0] = (char)cp, k = 1;
    else if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 0x3F)), u[2] = (char)(0x80 | (cp & 0x3F)), k = 3;
    else
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 0x3F)), u[2] = (char)(0x80 | (cp >> 6 & 0x3F)),
        u[3] = (char)(0x80 | (cp & 0x3F)), k = 4;
    for (int i = 0; i < k; i++, (*n)++)
        if (buf && *n + 1 < cap) buf[*n] = u[i];
}

static int ls_jr_hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Length of the UTF-8 sequence at p (within end), 0 when invalid:
 * overlong forms, surrogates and code points past U+10FFFF are refused. */
static int ls_jr_utf8(const unsigned char *p, const unsigned char *end, uint32_t *cp) {
    unsigned char c = p[0];
    int k;
    uint32_t v, min;
    if (c < 0x80) return *cp = c, 1;
    if (c >= 0xC2 && c <= 0xDF) k = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) k = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) k = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if (end - p < k) return 0;
    for (int i = 1; i < k; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (p[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return k;
}

bool ls_jr_string(ls_jr *r, char *buf, size_t cap, size_t *len) {
    if (ls_jr_peek(r) != '"') return ls_jr_fail(r, "string expected");
    r->p++;
    size_t n = 0;
    for (;;) {
        /* A run of printable ASCII without quote or backslash is copied
         * as is: most strings are nothing else (base64 data is tens of
         * kilobytes of it). */
        const char *q = r->p;
        while (q < r->end && (unsigned char)*q >= 0x20 && (unsigned char)*q < 0x80 && *q != '"' && *q != '\\') q++;
        if (q > r->p) {
            size_t k = (size_t)(q - r->p);
            if (buf && n + 1 < cap) memcpy(buf + n, r->p, k < cap - 1 - n ? k : cap - 1 - n);
            n += k;
            r->p = q;
        }
        if (r->p >= r->end) return ls_jr_fail(r, "unterminated string");
        unsigned char c = (unsigned char)*r->p;
        if (c == '"') {
            r->p++;
            break;
        }
        if (c < 0x20) return ls_jr_fail(r, "control character in a string");
        if (c == '\\') {
            if (r->end - r->p < 2) return ls_jr_fail(r, "unterminated string");
            char e = r->p[1];
            r->p += 2;
            uint32_t cp;
            switch (e) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u': {
                int hi = r->end - r->p >= 4 ? ls_jr_hex4(r->p) : -1;
                if (hi < 0) return ls_jr_fail(r, "invalid \\u escape");
                r->p += 4;
                cp = (uint32_t)hi;
                if (hi >= 0xD800 && hi <= 0xDBFF) {
                    int lo = r->end - r->p >= 6 && r->p[0] == '\\' && r->p[1] == 'u' ? ls_jr_hex4(r->p + 2) : -1;
                    if (lo < 0xDC00 || lo > 0xDFFF) return ls_jr_fail(r, "invalid Unicode surrogate pair");
                    r->p += 6;
                    cp = 0x10000 + (((uint32_t)hi - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
                } else if (hi >= 0xDC00 && hi <= 0xDFFF) {
                    return ls_jr_fail(r, "invalid Unicode surrogate pair");
                }
                if (cp == 0) return ls_jr_fail(r, "\\u0000 is not allowed in a string");
                break;
            }
            default: return ls_jr_fail(r, "invalid escape");
            }
            ls_jr_put(buf, cap, &n, cp);
            continue;
        }
        uint32_t cp;
        int k = ls_jr_utf8((const unsigned char *)r->p, (const unsigned char *)r->end, &cp);
        if (!k) return ls_jr_fail(r, "invalid UTF-8 in a string");
        for (int i = 0; i < k; i++, n++)
            if (buf && n + 1 < cap) buf[n] = r->p[i];
        r->p += k;
    }
    if (buf && cap) buf[n < cap ? n : cap - 1] = '\0';
    if (len) *len = n;
    return true;
}

/* A decimal being scanned: up to 19 significant digits in m, and the
 * power of ten they are scaled by. */
typedef struct {
    uint64_t m;
    int digits, e;
    bool slow; /* beyond the fast path: strtod reads it */
} ls_jr_dec;

static inline void ls_jr_dec_digit(ls_jr_dec *d, char c) {
    if (d->m == 0 && c == '0') return; /* leading zeros are not significant */
    if (++d->digits > 19) d->slow = true;
    else d->m = d->m * 10 + (uint64_t)(c - '0');
}

/* One pass over the number: checks its syntax and gathers its digits. A
 * number m * 10^e with m <= 2^53 and |e| <= 22 (what clients send for
 * float32 values: 9 significant digits) is then one correctly rounded
 * multiply or divide of two exact doubles, the bits strtod gives
 * (Clinger's fast path): strtod costs about 150 ns a number and took a
 * tenth of a batched server's CPU. Other numbers go to strtod. */
bool ls_jr_number(ls_jr *r, double *val, bool *is_int, long long *ival) {
    char c = ls_jr_peek(r);
    if (c != '-' && !(c >= '0' && c <= '9')) return ls_jr_fail(r, "number expected");
    const char *s = r->p, *q = s, *end = r->end;
    const bool neg = *q == '-';
    ls_jr_dec dec = {0};
    if (neg) q++;
    if (q >= end) return ls_jr_fail(r, "invalid number");
    if (*q == '0') q++;
    else if (*q >= '1' && *q <= '9')
        while (q < end && *q >= '0' && *q <= '9') ls_jr_dec_digit(&dec, *q++);
    else return ls_jr_fail(r, "invalid number");
    bool integral = true;
    if (q < end && *q == '.') {
        integral = false;
        q++;
        if (q >= end || !(*q >= '0' && *q <= '9')) return ls_jr_fail(r, "invalid number");
        while (q < end && *q >= '0' && *q <= '9') {
            dec.e--;
            ls_jr_dec_digit(&dec, *q++);
        }
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        integral = false;
        q++;
        bool eneg = false;
        if (q < end && (*q == '+' || *q == '-')) eneg = *q++ == '-';
        if (q >= end || !(*q >= '0' && *q <= '9')) return ls_jr_fail(r, "invalid number");
        int x = 0;
        for (; q < end && *q >= '0' && *q <= '9'; q++)
            if (x <= 9999) x = x * 10 + (*q - '0');
        if (x > 9999) dec.slow = true; /* far out of the fast range */
        dec.e += eneg ? -x : x;
    }
    /* strtod needs a terminated copy: numbers are short; a longer one is
     * not a number anyone means. */
    char tmp[512];
    size_t n = (size_t)(q - s);
    if (n >= sizeof tmp) return ls_jr_fail(r, "number too long");
    if (!dec.slow && dec.m <= (UINT64_C(1) << 53) && (dec.m == 0 || (dec.e >= -22 && dec.e <= 22))) {
        double d = dec.m == 0 ? 0.0
                   : dec.e >= 0 ? (double)dec.m * ls_pow10(dec.e)
                                : (double)dec.m / ls_pow10(-dec.e);
        *val = neg ? -d : d;
        /* an integral number's exact value, as strtoll gives it */
        *is_int = integral;
        if (integral) *ival = neg ? -(long long)dec.m : (long long)dec.m;
        r->p = q;
        return true;
    }
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    errno = 0;
    double d = strtod(tmp, NULL);
    if (errno == ERANGE && isinf(d)) return ls_jr_fail(r, "real number overflow");
    *val = d;
    *is_int = false;
    if (integral) {
        errno = 0;
        long long v = strtoll(tmp, NULL, 10);
        if (errno != ERANGE) *is_int = true, *ival = v;
    }
    r->p = q;
    return true;
}

bool ls_jr_literal(ls_jr *r, char *which) {
    char c = ls_jr_peek(r);
    const char *word = c == 't' ? "true" : c == 'f' ? "false" : c == 'n' ? "null" : NULL;
    size_t n = word ? strlen(word) : 0;
    if (!word || (size_t)(r->end - r->p) < n || memcmp(r->p, word, n)) return ls_jr_fail(r, "invalid token");
    r->p += n;
    *which = c;
    return true;
}

/* A string, literal or number starting with c, skipped; strict reads the
 * number as ls_jr_number_strict does. */
static bool ls_jr_skip_scalar(ls_jr *r, char c, bool strict) {
    if (c == '"') return ls_jr_string(r, NULL, 0, NULL);
    if (c == 't' || c == 'f' || c == 'n') {
        char w;
        return ls_jr_literal(r, &w);
    }
    double d;
    bool is_int;
    long long v;
    return strict ? ls_jr_number_strict(r, &d, &is_int, &v) : ls_jr_number(r, &d, &is_int, &v);
}

static bool ls_jr_skip_depth(ls_jr *r, int depth) {
    if (depth > LS_JR_MAX_DEPTH) return ls_jr_fail(r, "maximum parsing depth reached");
    char c = ls_jr_peek(r);
    if (c == '{' || c == '[') {
        const char close = c == '{' ? '}' : ']';
        r->p++;
        if (ls_jr_peek(r) == close) return ls_jr_punct(r, close);
        do {
            if (c == '{' && !(ls_jr_string(r, NULL, 0, NULL) && ls_jr_punct(r, ':'))) return false;
            if (!ls_jr_skip_depth(r, depth + 1)) return false;
        } while (ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
        return ls_jr_punct(r, close);
    }
    return ls_jr_skip_scalar(r, c, false);
}

bool ls_jr_skip(ls_jr *r) { return ls_jr_skip_depth(r, r->depth + 1); }

bool ls_jr_number_strict(ls_jr *r, double *val, bool *is_int, long long *ival) {
    ls_jr_peek(r);
    const char *from = r->p;
    if (!ls_jr_number(r, val, is_int, ival)) return false;
    bool integral = true;
    for (const char *q = from; q < r->p; q++)
        if (*q == '.' || *q == 'e' || *q == 'E') integral = false;
    if (integral && !*is_int) {
        r->p = from;
        return ls_jr_fail(r, "too big integer");
    }
    if (*is_int) *val = (double)*ival;
    return true;
}

void ls_jr_keys_init(ls_jr_keys *k) { memset(k, 0, sizeof *k); }

void ls_jr_keys_free(ls_jr_keys *k) {
    for (size_t i = 0; i < k->cap; i++) free(k->keys[i]);
    free(k->keys);
    free(k->lens);
    memset(k, 0, sizeof *k);
}

/* FNV-1a of key[len] from a start drawn once per process, so that a
 * client cannot pick keys that all fall in one chain. */
static uint64_t ls_jr_keys_hash(const char *key, size_t len) {
    static _Atomic uint64_t seed;
    uint64_t h = atomic_load(&seed);
    if (!h) {
        /* The first caller's draw wins, so every set sees one start. */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)&seed;
        uint64_t none = 0;
        atomic_compare_exchange_strong(&seed, &none, ls_splitmix64(&s) | 1);
        h = atomic_load(&seed);
    }
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)key[i]) * 1099511628211ull;
    return h;
}

/* The slot of key in a table of cap (a power of two) slots: where it is,
 * or the empty one where it would go. */
static size_t ls_jr_keys_slot(char **keys, const size_t *lens, size_t cap, const char *key, size_t len) {
    size_t i = (size_t)ls_jr_keys_hash(key, len) & (cap - 1);
    while (keys[i] && !(lens[i] == len && !memcmp(keys[i], key, len))) i = (i + 1) & (cap - 1);
    return i;
}

/* Doubles the table (at most half full after). False when out of memory. */
static bool ls_jr_keys_grow(ls_jr_keys *k) {
    size_t cap = k->cap ? k->cap * 2 : 16;
    char **keys = calloc(cap, sizeof *keys);
    size_t *lens = calloc(cap, sizeof *lens);
    if (!keys || !lens) {
        free(keys);
        free(lens);
        return false;
    }
    for (size_t i = 0; i < k->cap; i++) {
        if (!k->keys[i]) continue;
        size_t j = ls_jr_keys_slot(keys, lens, cap, k->keys[i], k->lens[i]);
        keys[j] = k->keys[i];
        lens[j] = k->lens[i];
    }
    free(k->keys);
    free(k->lens);
    k->keys = keys, k->lens = lens, k->cap = cap;
    return true;
}

int ls_jr_keys_add(ls_jr_keys *k, const char *key, size_t len) {
    if ((k->n + 1) * 2 > k->cap && !ls_jr_keys_grow(k)) return -1;
    size_t i = ls_jr_keys_slot(k->keys, k->lens, k->cap, key, len);
    if (k->keys[i]) return 0;
    char *copy = malloc(len + 1);
    if (!copy) return -1;
    memcpy(copy, key, len);
    copy[len] = '\0';
    k->keys[i] = copy;
    k->lens[i] = len;
    k->n++;
    return 1;
}

char *ls_jr_string_dup(ls_jr *r, size_t *len) {
    ls_jr_peek(r);
    const char *at = r->p;
    if (!ls_jr_string(r, NULL, 0, len)) return NULL;
    char *s = malloc(*len + 1);
    if (!s) {
        ls_jr_fail_oom(r);
        return NULL;
    }
    r->p = at;
    ls_jr_string(r, s, *len + 1, NULL);
    return s;
}

static bool ls_jr_skip_strict_depth(ls_jr *r, int depth) {
    char c = ls_jr_peek(r);
    if (c == '{' || c == '[') {
        if (depth > LS_JR_MAX_DEPTH) return ls_jr_fail(r, "maximum parsing depth reached");
        const char close = c == '{' ? '}' : ']';
        r->p++;
        if (ls_jr_peek(r) == close) return ls_jr_punct(r, close);
        ls_jr_keys keys;
        ls_jr_keys_init(&keys);
        bool ok = true;
        do {
            if (c == '{') {
                size_t len;
                char *key = ls_jr_string_dup(r, &len);
                int added = key ? ls_jr_keys_add(&keys, key, len) : 1;
                free(key);
                if (!key || !ls_jr_punct(r, ':')) ok = false;
                else if (added < 0) ok = ls_jr_fail_oom(r);
                else if (added == 0) ok = ls_jr_fail(r, "duplicate object key");
            }
            if (ok) ok = ls_jr_skip_strict_depth(r, depth + 1);
        } while (ok && ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
        ls_jr_keys_free(&keys);
        return ok && ls_jr_punct(r, close);
    }
    return ls_jr_skip_scalar(r, c, true);
}

bool ls_jr_skip_strict(ls_jr *r) { return ls_jr_skip_strict_depth(r, r->depth + 1); }
