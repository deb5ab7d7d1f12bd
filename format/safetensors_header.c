/* The safetensors header read and checked from its text (format/json_reader.h),
 * never as a tree of JSON values: a 90 MB header of small entries held as
 * a jansson tree took 1.6 GB. A first pass checks the JSON as jansson
 * with JSON_REJECT_DUPLICATES would (every object, every number) and
 * counts the entries; a second reads each entry into its few fields and
 * checks them, and then the tiling of the data section. The rules are
 * docs/safetensors.md's. */
#include "format/safetensors_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/json_reader.h"

#define LS_ST_META "__metadata__"

void ls_st_violation(ls_error *err, const char *tensor, int axis, int64_t expected, int64_t got, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (tensor)
        ls_error_add(err, LS_SAFETENSORS_INVALID, LS_NA, tensor, axis, expected, got, NULL,
                     "safetensors: tensor \"%.96s\": %s", tensor, what);
    else
        ls_error_add(err, LS_SAFETENSORS_INVALID, LS_NA, NULL, axis, expected, got, NULL, "safetensors: %s", what);
}

void ls_st_entries_free(ls_st_entry *ents, size_t n) {
    for (size_t i = 0; ents && i < n; i++) free(ents[i].name);
    free(ents);
}

/* safetensors spells dtypes in upper case only; ls_dtype_parse is lenient
 * for the JSON API, so the spelling is compared exactly here. */
static bool ls_st_dtype_parse(const char *s, ls_dtype *dt) {
    return ls_dtype_parse(s, dt) && strcmp(s, ls_dtype_name(*dt)) == 0;
}

/* ---- values as the checks see them ---------------------------------------- */

/* One value: its kind in ls_json_kind's words, an integer's value, the
 * first bytes of a string (len: its whole length), and for an array its
 * count and its first elements' kinds and integers. */
typedef struct {
    const char *kind; /* NULL: absent */
    long long ival;
    char str[40];
    size_t len;
    size_t count;
    const char *elem[LS_MAX_DIMS];
    long long ielem[LS_MAX_DIMS];
} ls_st_value;

/* Reads (a scalar) or skips (a container) the value at r into its kind,
 * an integer's value and a string's first cap - 1 bytes. The text passed
 * the first pass, so only memory can fail here. */
static bool ls_st_scalar(ls_jr *r, const char **kind, long long *ival, char *str, size_t cap, size_t *len) {
    const char c = ls_jr_peek(r);
    char w;
    double d;
    bool is_int = false;
    switch (c) {
    case '{': *kind = "an object"; return ls_jr_skip(r);
    case '[': *kind = "an array"; return ls_jr_skip(r);
    case '"': *kind = "a string"; return ls_jr_string(r, str, cap, len);
    case 't':
    case 'f': *kind = "a boolean"; return ls_jr_literal(r, &w);
    case 'n': *kind = "null"; return ls_jr_literal(r, &w);
    default:
        if (!ls_jr_number_strict(r, &d, &is_int, ival)) return false;
        *kind = is_int ? "an integer" : "a real number";
        return true;
    }
}

/* The value at r into v, an array's elements one by one. */
static bool ls_st_value_read(ls_jr *r, ls_st_value *v) {
    memset(v, 0, sizeof *v);
    char scratch[2];
    size_t slen;
    if (ls_jr_peek(r) != '[') return ls_st_scalar(r, &v->kind, &v->ival, v->str, sizeof v->str, &v->len);
    v->kind = "an array";
    if (!ls_jr_punct(r, '[')) return false;
    if (ls_jr_peek(r) == ']') return ls_jr_punct(r, ']');
    do {
        const char *kind;
        long long iv = 0;
        if (!ls_st_scalar(r, &kind, &iv, scratch, sizeof scratch, &slen)) return false;
        if (v->count < LS_MAX_DIMS) v->elem[v->count] = kind, v->ielem[v->count] = iv;
        v->count++;
    } while (ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    return ls_jr_punct(r, ']');
}

static bool ls_st_is_nonneg_int(const char *kind, long long v) { return kind && !strcmp(kind, "an integer") && v >= 0; }

/* ---- one entry ------------------------------------------------------------ */

/* dtype and shape of an entry into e; false (violations added) when bad. */
static bool ls_st_check_type(const char *name, const ls_st_value *dt, const ls_st_value *sh, ls_st_entry *e,
                             ls_error *err) {
    bool ok = true;
    if (!dt->kind) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "missing dtype");
        ok = false;
    } else if (strcmp(dt->kind, "a string")) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "dtype is %s, expected a string such as \"F32\"", dt->kind);
        ok = false;
    } else if (dt->len >= sizeof dt->str || !ls_st_dtype_parse(dt->str, &e->dtype)) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA,
                        "unknown dtype \"%.32s\" (expected F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, "
                        "U8, BOOL, F8_E4M3 or F8_E5M2)",
                        dt->str);
        ok = false;
    }
    if (!sh->kind) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "missing shape");
        return false;
    }
    if (strcmp(sh->kind, "an array")) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "shape is %s, expected an array of integers", sh->kind);
        return false;
    }
    if (sh->count > LS_MAX_DIMS) {
        ls_st_violation(err, name, LS_NA, LS_MAX_DIMS, (int64_t)sh->count,
                        "shape has %zu dimensions, at most %d are supported", sh->count, LS_MAX_DIMS);
        return false;
    }
    e->ndim = (int)sh->count;
    for (int i = 0; i < e->ndim; i++) {
        e->shape[i] = sh->ielem[i];
        if (ls_st_is_nonneg_int(sh->elem[i], sh->ielem[i])) continue;
        if (!strcmp(sh->elem[i], "an integer"))
            ls_st_violation(err, name, i, LS_NA, (int64_t)sh->ielem[i],
                            "shape axis %d is %lld, expected a non-negative integer", i, sh->ielem[i]);
        else
            ls_st_violation(err, name, i, LS_NA, LS_NA, "shape axis %d is %s, expected a non-negative integer", i,
                            sh->elem[i]);
        ok = false;
    }
    return ok;
}

/* data_offsets of an entry into e, against a data section of body_len. */
static bool ls_st_check_offsets(const char *name, const ls_st_value *of, uint64_t body_len, ls_st_entry *e,
                                ls_error *err) {
    if (!of->kind) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "missing data_offsets");
        return false;
    }
    if (strcmp(of->kind, "an array") || of->count != 2 || !ls_st_is_nonneg_int(of->elem[0], of->ielem[0]) ||
        !ls_st_is_nonneg_int(of->elem[1], of->ielem[1])) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA,
                        "data_offsets must be an array of two non-negative integers [begin, end]");
        return false;
    }
    e->begin = of->ielem[0];
    e->end = of->ielem[1];
    if (e->end < e->begin) {
        ls_st_violation(err, name, LS_NA, e->begin, e->end, "data_offsets [%lld, %lld] end before they begin",
                        (long long)e->begin, (long long)e->end);
        return false;
    }
    if ((uint64_t)e->end > body_len) {
        ls_st_violation(err, name, LS_NA, (int64_t)body_len, e->end,
                        "data_offsets [%lld, %lld] run past the %llu-byte data section", (long long)e->begin,
                        (long long)e->end, (unsigned long long)body_len);
        return false;
    }
    return true;
}

/* The byte count the shape and dtype need against the one the offsets
 * hold, each product checked. */
static bool ls_st_check_size(const char *name, const ls_st_entry *e, ls_error *err) {
    char sbuf[LS_MAX_DIMS * 24 + 4];
    ls_shape_str(e->shape, e->ndim, sbuf, sizeof sbuf);
    int64_t numel = ls_shape_numel(e->shape, e->ndim);
    int64_t size = (int64_t)ls_dtype_size(e->dtype);
    if (numel < 0) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "shape %s has more elements than int64 can count", sbuf);
        return false;
    }
    if (numel > INT64_MAX / size) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "shape %s of %s needs more bytes than int64 can count", sbuf,
                        ls_dtype_name(e->dtype));
        return false;
    }
    int64_t need = numel * size, held = e->end - e->begin;
    if (need != held) {
        ls_st_violation(err, name, LS_NA, need, held,
                        "data_offsets [%lld, %lld] hold %lld bytes, shape %s of %s needs %lld", (long long)e->begin,
                        (long long)e->end, (long long)held, sbuf, ls_dtype_name(e->dtype), (long long)need);
        return false;
    }
    return true;
}

/* The entry at r, named name, read and checked into *e: every problem of
 * it reported (unknown fields first, in their order), false when any. */
static bool ls_st_entry_read(ls_jr *r, const char *name, uint64_t body_len, ls_st_entry *e, ls_error *err) {
    ls_st_value f[3]; /* dtype, shape, data_offsets */
    memset(f, 0, sizeof f);
    if (ls_jr_peek(r) != '{') {
        ls_st_value v;
        if (!ls_st_value_read(r, &v)) return false;
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA,
                        "entry is %s, expected an object with dtype, shape and data_offsets", v.kind);
        return false;
    }
    bool ok = ls_jr_punct(r, '{'), fields_ok = true;
    if (ok && ls_jr_peek(r) != '}') do {
            char key[80];
            size_t len = 0;
            ok = ls_jr_string(r, key, sizeof key, &len) && ls_jr_punct(r, ':');
            int which = !ok || len >= sizeof key ? -1
                        : !strcmp(key, "dtype")  ? 0
                        : !strcmp(key, "shape")  ? 1
                        : !strcmp(key, "data_offsets") ? 2 : -1;
            if (ok && which < 0) {
                ls_st_violation(err, name, LS_NA, LS_NA, LS_NA,
                                "unknown field \"%.64s\" (an entry holds exactly dtype, shape and data_offsets)", key);
                fields_ok = false;
            }
            ls_st_value skipped;
            if (ok) ok = ls_st_value_read(r, which < 0 ? &skipped : &f[which]);
        } while (ok && ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    if (!(ok && ls_jr_punct(r, '}'))) return false;
    e->dtype = LS_DTYPE_U8;
    bool good = ls_st_check_type(name, &f[0], &f[1], e, err);
    good &= ls_st_check_offsets(name, &f[2], body_len, e, err);
    return fields_ok && good && ls_st_check_size(name, e, err);
}

/* __metadata__ at r: an object of strings, each into meta (when given). */
static bool ls_st_meta_read(ls_jr *r, ls_tensor_set *meta, bool *good, ls_error *err) {
    if (ls_jr_peek(r) != '{') {
        ls_st_value v;
        if (!ls_st_value_read(r, &v)) return false;
        ls_st_violation(err, NULL, LS_NA, LS_NA, LS_NA, "__metadata__ is %s, expected an object of strings", v.kind);
        *good = false;
        return true;
    }
    bool ok = ls_jr_punct(r, '{');
    if (ok && ls_jr_peek(r) != '}') do {
            size_t klen, vlen;
            char *key = ls_jr_string_dup(r, &klen), *value = NULL;
            ok = key && ls_jr_punct(r, ':');
            if (ok && ls_jr_peek(r) == '"') {
                ok = (value = ls_jr_string_dup(r, &vlen)) != NULL;
                if (ok && meta && !ls_tensor_set_add_meta(meta, key, value)) ok = ls_jr_fail_oom(r);
            } else if (ok) {
                ls_st_value v;
                ok = ls_st_value_read(r, &v);
                if (ok)
                    ls_st_violation(err, NULL, LS_NA, LS_NA, LS_NA,
                                    "__metadata__ value of \"%.64s\" is %s, expected a string", key, v.kind);
                *good = false;
            }
            free(key);
            free(value);
        } while (ok && ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    return ok && ls_jr_punct(r, '}');
}

/* ---- the whole header ----------------------------------------------------- */

/* The first pass: the JSON checked as jansson reads it (duplicate keys in
 * any object, integers past 64 bits, depth) and the entries counted; it
 * stops at the entry past max (true, *count max + 1), so that the names
 * it holds to catch one given twice are bounded too. */
static bool ls_st_syntax(const char *h, size_t n, size_t max, size_t *count, ls_jr *r) {
    ls_jr_init(r, h, n);
    ls_jr_keys keys;
    ls_jr_keys_init(&keys);
    *count = 0;
    bool ok = ls_jr_punct(r, '{');
    if (ok && ls_jr_peek(r) != '}') do {
            size_t len;
            char *key = ls_jr_string_dup(r, &len);
            int added = key ? ls_jr_keys_add(&keys, key, len) : 1;
            const bool meta = key && !strcmp(key, LS_ST_META);
            free(key);
            if (!key || !ls_jr_punct(r, ':')) ok = false;
            else if (added < 0) ok = ls_jr_fail_oom(r);
            else if (added == 0) ok = ls_jr_fail(r, "duplicate object key");
            r->depth = 1; /* the value is inside the header's object */
            if (ok) ok = ls_jr_skip_strict(r);
            r->depth = 0;
            if (ok && !meta) (*count)++;
        } while (ok && *count <= max && ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    ls_jr_keys_free(&keys);
    if (ok && *count > max) return true;
    if (ok) ok = ls_jr_punct(r, '}');
    if (ok && !ls_jr_at_end(r)) ok = ls_jr_fail(r, "end of text expected");
    return ok;
}

/* The tensors, sorted by offset, must tile the data section exactly: the
 * first starts at 0, each starts where the previous ended, the last ends at
 * the end of the buffer. Byte order: by begin, then end, so a zero-size
 * tensor sits before a tensor that starts at the same offset. */
static int ls_st_cmp(const void *a, const void *b) {
    const ls_st_entry *x = *(const ls_st_entry *const *)a, *y = *(const ls_st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static ls_status ls_st_check_layout(ls_st_entry *ents, size_t n, uint64_t body_len, ls_error *err) {
    if (n == 0) {
        if (body_len == 0) return LS_OK;
        ls_st_violation(err, NULL, LS_NA, 0, (int64_t)body_len,
                        "no tensors, yet %llu bytes follow the header (trailing bytes)", (unsigned long long)body_len);
        return LS_SAFETENSORS_INVALID;
    }
    ls_st_entry **order = malloc(n * sizeof *order);
    if (!order) return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory sorting %zu tensors", n);
    for (size_t i = 0; i < n; i++) order[i] = &ents[i];
    qsort(order, n, sizeof *order, ls_st_cmp);
    bool ok = true;
    const ls_st_entry *prev = NULL;
    int64_t at = 0; /* where the next tensor must begin */
    for (size_t i = 0; i < n; i++) {
        const ls_st_entry *e = order[i];
        if (e->begin > at) {
            if (prev)
                ls_st_violation(err, e->name, LS_NA, at, e->begin,
                                "data_offsets begin at %lld, leaving a gap of %lld bytes after tensor \"%.64s\" "
                                "(which ends at %lld)",
                                (long long)e->begin, (long long)(e->begin - at), prev->name, (long long)at);
            else
                ls_st_violation(err, e->name, LS_NA, 0, e->begin,
                                "the first tensor of the data section begins at %lld, not 0", (long long)e->begin);
            ok = false;
        } else if (e->begin < at) {
            ls_st_violation(err, e->name, LS_NA, at, e->begin,
                            "data_offsets [%lld, %lld] overlap tensor \"%.64s\" (which ends at %lld)",
                            (long long)e->begin, (long long)e->end, prev->name, (long long)at);
            ok = false;
        }
        if (e->end >= at) {
            at = e->end;
            prev = e;
        }
    }
    /* Every end was checked against body_len, so at <= body_len here. */
    if ((uint64_t)at != body_len) {
        ls_st_violation(err, NULL, LS_NA, at, (int64_t)body_len,
                        "the tensors end at byte %lld of a %llu-byte data section (%lld trailing bytes)",
                        (long long)at, (unsigned long long)body_len, (long long)((int64_t)body_len - at));
        ok = false;
    }
    free(order);
    return ok ? LS_OK : LS_SAFETENSORS_INVALID;
}

/* The second pass: every entry read and checked into ents (count of them
 * at most), the metadata into meta. *n_out the entries kept; *good false
 * when any broke a rule. False only when memory ran out (r says so). */
static bool ls_st_entries_read(ls_jr *r, uint64_t body_len, ls_st_entry *ents, size_t count, size_t *n_out,
                               ls_tensor_set *meta, bool *good, ls_error *err) {
    size_t k = 0;
    bool ok = ls_jr_punct(r, '{');
    if (ok && ls_jr_peek(r) != '}') do {
            size_t len;
            char *name = ls_jr_string_dup(r, &len);
            ok = name && ls_jr_punct(r, ':');
            if (ok && !strcmp(name, LS_ST_META)) {
                ok = ls_st_meta_read(r, meta, good, err);
            } else if (ok && k < count) {
                if (ls_st_entry_read(r, name, body_len, &ents[k], err)) {
                    ents[k++].name = name;
                    name = NULL;
                } else {
                    /* A broken entry has its violations; the read goes on
                     * unless the reader itself stopped (memory). */
                    ok = !r->failed;
                    *good = false;
                }
            } else if (ok) {
                ok = ls_jr_skip(r); /* the first pass counted it: not met */
            }
            free(name);
        } while (ok && ls_jr_peek(r) == ',' && ls_jr_punct(r, ','));
    *n_out = k;
    return ok;
}

ls_status ls_st_collect(const char *h, size_t n, uint64_t body_len, size_t max_tensors, ls_st_entry **ents_out,
                        size_t *n_out, ls_tensor_set *meta, ls_error *err) {
    *ents_out = NULL;
    *n_out = 0;
    if (h[0] != '{') {
        ls_st_violation(err, NULL, LS_NA, LS_NA, LS_NA, "the header does not start with '{'");
        return LS_SAFETENSORS_INVALID;
    }
    const char *nul = memchr(h, '\0', n);
    if (nul) {
        ls_st_violation(err, NULL, LS_NA, LS_NA, LS_NA, "the header holds a NUL byte at offset %zu",
                        (size_t)(nul - h));
        return LS_SAFETENSORS_INVALID;
    }
    ls_jr r;
    size_t count = 0;
    if (!ls_st_syntax(h, n, max_tensors, &count, &r)) {
        if (r.oom) return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory reading the header");
        ls_st_violation(err, NULL, LS_NA, LS_NA, LS_NA, "the header is not valid JSON: %s (at byte %zu)", r.message,
                        r.at);
        return LS_SAFETENSORS_INVALID;
    }
    if (count > max_tensors)
        return ls_error_set(err, LS_PAYLOAD_TOO_LARGE, "give a file that holds fewer tensors",
                            "safetensors: the header names more than the limit of %zu tensors", max_tensors);
    ls_st_entry *ents = calloc(count ? count : 1, sizeof *ents);
    if (!ents) return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory for %zu header entries", count);
    size_t k = 0;
    bool good = true;
    ls_jr_init(&r, h, n);
    if (!ls_st_entries_read(&r, body_len, ents, count, &k, meta, &good, err)) {
        ls_st_entries_free(ents, k);
        if (r.oom) return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory reading the header");
        /* The first pass took this text: nothing else can fail here. */
        return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: the header read twice gave two answers (%s)",
                            r.message);
    }
    /* The layout is only meaningful once every entry is sound. */
    ls_status st = good ? ls_st_check_layout(ents, k, body_len, err) : LS_SAFETENSORS_INVALID;
    if (st != LS_OK) {
        ls_st_entries_free(ents, k);
        return st;
    }
    *ents_out = ents;
    *n_out = k;
    return LS_OK;
}
