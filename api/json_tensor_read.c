/* JSON tensors read from the text of the body (format/json_reader.h), for
 * uploads too large to hold as a tree of JSON values: nested arrays go
 * number by number into their floats, a base64 object is decoded from
 * the body's own bytes. The tensor and the first problem, with its
 * status and message, are those ls_json_tensor_parse gives for the same
 * value parsed by jansson: its checks run in the order of its walk (the
 * shape from the first element at every depth, then every array and
 * number depth first), which a one-pass read recovers by letting a
 * ragged array's error replace the errors found inside it. */
#include "api/json_tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/base64.h"

/* A nested array being read: its shape as far as known, its numbers. */
typedef struct {
    const char *what;
    int nd;                      /* from the chain of first elements */
    int64_t shape[LS_MAX_DIMS];  /* shape[d] once the first array at depth d has closed */
    bool known[LS_MAX_DIMS];
    float *v;
    size_t count, cap;
    ls_error *err; /* the first problem (code set once there is one) */
} ls_jt_nested;

static bool ls_jt_number_start(char c) { return c == '-' || (c >= '0' && c <= '9'); }

static bool ls_jt_push(ls_jt_nested *nt, float f) {
    if (nt->count == nt->cap) {
        size_t cap = nt->cap ? nt->cap * 2 : 1024;
        float *v = realloc(nt->v, cap * sizeof *v);
        if (!v) return false;
        nt->v = v, nt->cap = cap;
    }
    nt->v[nt->count++] = f;
    return true;
}

/* The ragged-array problem of an element at depth that is not an array
 * of shape[depth] (got -1: not an array). */
static void ls_jt_ragged(ls_jt_nested *nt, int depth, int64_t got) {
    ls_error_set(nt->err, LS_INVALID_SHAPE, "every row of a nested array must have the same length",
                 "%s: ragged array: axis %d has %lld elements in the first row but %lld elsewhere", nt->what, depth,
                 (long long)nt->shape[depth], (long long)got);
}

/* A value at depth nd, where a number belongs. */
static bool ls_jt_leaf(ls_jr *r, ls_jt_nested *nt) {
    char c = ls_jr_peek(r);
    if (!ls_jt_number_start(c)) {
        ls_error_set(nt->err, LS_INVALID_REQUEST, "tensor values must be JSON numbers",
                     "%s: expected a number at depth %d, found a JSON %s", nt->what, nt->nd,
                     c == '['   ? "array (the array is deeper than its first element)"
                     : c == '"' ? "string"
                     : c == 'n' ? "null"
                                : "value");
        return ls_jr_skip_strict(r);
    }
    double v;
    bool is_int;
    long long iv;
    if (!ls_jr_number_strict(r, &v, &is_int, &iv)) return false;
    /* What rounds to a finite float fits (as ls_json_tensor_parse). */
    float f = (float)v;
    if (!isfinite(f)) ls_error_set(nt->err, LS_INVALID_REQUEST, NULL, "%s: %g does not fit in float32", nt->what, v);
    if (nt->err->code == LS_OK && !ls_jt_push(nt, f)) return ls_jr_fail_oom(r);
    return true;
}

/* The array at r, at depth (< nd). Its size is checked when it closes:
 * its mismatch is the problem unless one was found before it began (the
 * jansson walk checks an array before its elements). */
static bool ls_jt_array(ls_jr *r, ls_jt_nested *nt, int depth) {
    const bool before = nt->err->code != LS_OK;
    if (!ls_jr_punct(r, '[')) return false;
    r->depth++;
    int64_t count = 0;
    if (ls_jr_peek(r) != ']') {
        do {
            bool ok;
            if (depth + 1 == nt->nd) ok = ls_jt_leaf(r, nt);
            else if (ls_jr_peek(r) == '[') ok = ls_jt_array(r, nt, depth + 1);
            else {
                if (nt->err->code == LS_OK) ls_jt_ragged(nt, depth + 1, -1);
                ok = ls_jr_skip_strict(r);
            }
            if (!ok) return false;
            count++;
        } while (ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    }
    if (!ls_jr_punct(r, ']')) return false;
    r->depth--;
    if (!nt->known[depth]) {
        nt->shape[depth] = count;
        nt->known[depth] = true;
    } else if (count != nt->shape[depth] && !before) {
        ls_error_clear(nt->err);
        ls_jt_ragged(nt, depth, count);
    }
    return true;
}

/* Nested arrays: their depth from the chain of first elements (looked
 * at ahead), then one pass. */
static bool ls_jt_nested_read(ls_jr *r, const char *what, ls_tensor *out, ls_error *err) {
    ls_jt_nested nt = {.what = what, .err = err};
    ls_jr look = *r;
    while (ls_jr_peek(&look) == '[' && nt.nd <= LS_MAX_DIMS) {
        look.p++;
        nt.nd++;
    }
    if (nt.nd > LS_MAX_DIMS) {
        ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s: more than %d nested levels", what, LS_MAX_DIMS);
        return ls_jr_skip_strict(r);
    }
    bool ok = ls_jt_array(r, &nt, 0);
    if (ok && err->code == LS_OK) {
        /* Every array matched the shape, so its product is the count. */
        float *v = nt.count ? realloc(nt.v, nt.count * sizeof *v) : calloc(1, sizeof *v);
        if (!v) {
            ok = ls_jr_fail_oom(r);
        } else {
            if (!nt.count) free(nt.v);
            nt.v = NULL;
            *out = (ls_tensor){.dtype = LS_DTYPE_F32, .ndim = nt.nd, .data = v, .nbytes = nt.count * 4, .owned = true};
            memcpy(out->shape, nt.shape, (size_t)nt.nd * sizeof *nt.shape);
        }
    }
    free(nt.v);
    return ok;
}

/* What a base64 tensor object held, as read. */
typedef struct {
    int keys;
    bool dtype_str, shape_arr, data_str;
    char dtype[512];
    size_t nd;
    int64_t shape[LS_MAX_DIMS];
    long bad_axis;    /* the first shape element that is not a non-negative integer; -1 none */
    const char *data; /* the data string's bytes in the body, as written */
    size_t data_raw, slen; /* its written length, its decoded length */
    bool escaped;
} ls_jt_b64;

/* "shape": [...] of a base64 object. */
static bool ls_jt_b64_shape(ls_jr *r, ls_jt_b64 *b) {
    b->shape_arr = true;
    r->p++;
    r->depth++;
    if (ls_jr_peek(r) != ']') {
        do {
            const size_t i = b->nd++;
            double v;
            bool is_int = false;
            long long iv = 0;
            bool ok = ls_jt_number_start(ls_jr_peek(r)) ? ls_jr_number_strict(r, &v, &is_int, &iv)
                                                        : ls_jr_skip_strict(r);
            if (!ok) return false;
            if ((!is_int || iv < 0) && b->bad_axis < 0) b->bad_axis = (long)i;
            if (i < LS_MAX_DIMS) b->shape[i] = iv;
        } while (ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    }
    r->depth--;
    return ls_jr_punct(r, ']');
}

/* One key of a base64 object and its value. */
static bool ls_jt_b64_member(ls_jr *r, const char *key, ls_jt_b64 *b) {
    const char c = ls_jr_peek(r);
    b->keys++;
    if (!strcmp(key, "dtype") && c == '"') {
        b->dtype_str = true;
        return ls_jr_string(r, b->dtype, sizeof b->dtype, NULL);
    }
    if (!strcmp(key, "shape") && c == '[') return ls_jt_b64_shape(r, b);
    if (!strcmp(key, "data") && c == '"') {
        const char *q = r->p;
        if (!ls_jr_string(r, NULL, 0, &b->slen)) return false;
        b->data_str = true;
        b->data = q + 1;
        b->data_raw = (size_t)(r->p - 1 - b->data);
        b->escaped = memchr(b->data, '\\', b->data_raw) != NULL;
        return true;
    }
    /* Another type for a known key counts as that key not being right. */
    return ls_jr_skip_strict(r);
}

/* The data string of b unescaped, as base64, into dst (decoded_max of
 * its length): chunk by chunk, a '=' allowed only in the last one, so
 * the result is ls_base64_decode's of the whole decoded string. A code
 * point outside ASCII is no base64 character: it stands as 0x80. */
static bool ls_jt_b64_unescape_decode(const ls_jt_b64 *b, uint8_t *dst, size_t *got) {
    char chunk[4096];
    size_t n = 0, out = 0;
    const char *p = b->data, *end = b->data + b->data_raw;
    while (p < end) {
        unsigned char c = (unsigned char)*p++;
        if (c == '\\') {
            char e = *p++;
            if (e == 'u') {
                unsigned v = (unsigned)strtoul((char[5]){p[0], p[1], p[2], p[3], 0}, NULL, 16);
                p += 4;
                if (v >= 0xD800 && v <= 0xDBFF) p += 6; /* the low half of a pair checked by the reader */
                c = v < 0x80 ? (unsigned char)v : 0x80;
            } else {
                c = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t'
                                                                                               : (unsigned char)e;
            }
        }
        chunk[n++] = (char)c;
        if (n == sizeof chunk && p < end) {
            size_t k;
            if (memchr(chunk, '=', n) || !ls_base64_decode(chunk, n, dst + out, &k)) return false;
            out += k;
            n = 0;
        }
    }
    size_t k = 0;
    if (n && !ls_base64_decode(chunk, n, dst + out, &k)) return false;
    *got = out + k;
    return true;
}

/* Checks what a base64 object held, in ls_json_tensor_parse's order,
 * and decodes its data into out. */
static bool ls_jt_b64_finish(ls_jr *r, const ls_jt_b64 *b, const char *what, ls_tensor *out, ls_error *err) {
    if (!b->dtype_str || !b->shape_arr || !b->data_str || b->keys != 3) {
        ls_error_set(err, LS_INVALID_REQUEST, "send {\"dtype\", \"shape\", \"data\"} and nothing else",
                     "%s: a tensor object needs exactly \"dtype\" (string), \"shape\" (array) and \"data\" (base64 "
                     "string)",
                     what);
        return true;
    }
    ls_dtype dt;
    if (!ls_dtype_parse(b->dtype, &dt)) {
        ls_error_set(err, LS_INVALID_REQUEST, "dtype is one of f32, f16, bf16", "%s: unknown dtype \"%s\"", what,
                     b->dtype);
        return true;
    }
    if (b->nd > LS_MAX_DIMS) {
        ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s: shape has %zu axes, at most %d", what, b->nd, LS_MAX_DIMS);
        return true;
    }
    if (b->bad_axis >= 0) {
        ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s: shape[%ld] is not a non-negative integer", what, b->bad_axis);
        return true;
    }
    const int64_t numel = ls_shape_numel(b->shape, (int)b->nd);
    const size_t esize = ls_dtype_size(dt), slen = b->slen;
    if (numel < 0 || (uint64_t)numel > SIZE_MAX / esize) {
        ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s: shape is too large", what);
        return true;
    }
    const size_t want = (size_t)numel * esize;
    /* The declared size against the text, before anything is allocated. */
    if (slen % 4 || ls_base64_decoded_max(slen) < want || slen / 4 * 3 > want + 2) {
        ls_error_set(err, LS_INVALID_SHAPE, NULL,
                     "%s: %zu base64 characters cannot hold %zu bytes (shape of %lld %s values)", what, slen, want,
                     (long long)numel, ls_dtype_name(dt));
        return true;
    }
    uint8_t *data = malloc(ls_base64_decoded_max(slen));
    if (!data) return ls_jr_fail_oom(r);
    size_t got = 0;
    const bool valid = b->escaped ? ls_jt_b64_unescape_decode(b, data, &got)
                                  : ls_base64_decode(b->data, slen, data, &got);
    if (!valid || got != want) {
        free(data);
        if (!valid)
            ls_error_set(err, LS_INVALID_REQUEST, "data is standard base64 with padding, no whitespace",
                         "%s: data is not valid base64", what);
        else
            ls_error_set(err, LS_INVALID_SHAPE, NULL, "%s: data holds %zu bytes, shape needs %zu", what, got, want);
        return true;
    }
    *out = (ls_tensor){.dtype = dt, .ndim = (int)b->nd, .data = data, .nbytes = want, .owned = true};
    memcpy(out->shape, b->shape, b->nd * sizeof *b->shape);
    return true;
}

/* {"dtype", "shape", "data"}: read key by key (any order, a key given
 * twice refused as jansson refuses it), then checked. */
static bool ls_jt_b64_read(ls_jr *r, const char *what, ls_tensor *out, ls_error *err) {
    ls_jt_b64 b = {.bad_axis = -1};
    ls_jr_keys keys;
    ls_jr_keys_init(&keys);
    bool ok = ls_jr_punct(r, '{');
    r->depth++;
    if (ok && ls_jr_peek(r) != '}') {
        do {
            size_t len;
            char *key = ls_jr_string_dup(r, &len);
            int added = key ? ls_jr_keys_add(&keys, key, len) : 1;
            if (!key || !ls_jr_punct(r, ':')) ok = false;
            else if (added < 0) ok = ls_jr_fail_oom(r);
            else if (added == 0) ok = ls_jr_fail(r, "duplicate object key");
            else ok = ls_jt_b64_member(r, key, &b);
            free(key);
        } while (ok && ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    }
    ls_jr_keys_free(&keys);
    r->depth--;
    if (!ok || !ls_jr_punct(r, '}')) return false;
    return ls_jt_b64_finish(r, &b, what, out, err);
}

bool ls_json_tensor_read(ls_jr *r, const char *what, ls_tensor *out, ls_error *err) {
    memset(out, 0, sizeof *out);
    const char c = ls_jr_peek(r);
    if (c == '[') return ls_jt_nested_read(r, what, out, err);
    if (c == '{') return ls_jt_b64_read(r, what, out, err);
    ls_error_set(err, LS_INVALID_REQUEST, "send nested arrays or {\"dtype\", \"shape\", \"data\"}",
                 "%s: a tensor must be an array or an object", what);
    return ls_jr_skip_strict(r);
}
