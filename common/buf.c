/* ls_buf: doubling growth, always NUL-terminated. */
#include "common/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ls_buf_init(ls_buf *b) { memset(b, 0, sizeof *b); }

void ls_buf_free(ls_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

static bool ls_buf_reserve(ls_buf *b, size_t extra) {
    if (b->failed) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = true;
        return false;
    }
    b->data = d;
    b->cap = cap;
    return true;
}

char *ls_buf_extend(ls_buf *b, size_t len) {
    if (!ls_buf_reserve(b, len)) return NULL;
    char *at = b->data + b->len;
    b->len += len;
    b->data[b->len] = '\0';
    return at;
}

bool ls_buf_append(ls_buf *b, const void *data, size_t len) {
    char *at = ls_buf_extend(b, len);
    if (at) memcpy(at, data, len);
    return at != NULL;
}

bool ls_buf_printf(ls_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !ls_buf_reserve(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

char *ls_buf_take(ls_buf *b, size_t *len) {
    if (b->failed) {
        ls_buf_free(b);
        return NULL;
    }
    if (!b->data && !ls_buf_reserve(b, 0)) return NULL;
    b->data[b->len] = '\0';
    char *d = b->data;
    if (len) *len = b->len;
    memset(b, 0, sizeof *b);
    return d;
}
