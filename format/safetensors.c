/* safetensors read and write. The reader treats every byte as hostile: the
 * header length, each offset and each shape product is checked against the
 * buffer (with overflow-checked arithmetic) before anything relies on it.
 * The rules are listed in docs/safetensors.md. */
#include "format/safetensors.h"

#include "format/json.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LS_ST_LEN_FIELD 8
#define LS_ST_META "__metadata__"

/* One header entry once its fields have been checked; name is borrowed
 * from the JSON tree. */
typedef struct {
    const char *name;
    ls_dtype dtype;
    int ndim;
    int64_t shape[LS_MAX_DIMS];
    int64_t begin, end;
} ls_st_entry;

static void ls_st_violation(ls_error *err, const char *tensor, int axis, int64_t expected, int64_t got,
                            const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Appends one LS_SAFETENSORS_INVALID violation, prefixed with the tensor's
 * name when the problem belongs to one. */
static void ls_st_violation(ls_error *err, const char *tensor, int axis, int64_t expected, int64_t got,
                            const char *fmt, ...) {
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

/* safetensors spells dtypes in upper case only; ls_dtype_parse is lenient
 * for the JSON API, so the spelling is compared exactly here. */
static bool ls_st_dtype_parse(const char *s, ls_dtype *dt) {
    return ls_dtype_parse(s, dt) && strcmp(s, ls_dtype_name(*dt)) == 0;
}

/* __metadata__ must be an object of string to string. */
static bool ls_st_check_meta(const json_t *meta, ls_error *err) {
    if (!json_is_object(meta)) {
        ls_st_violation(err, NULL, LS_NA, LS_NA, LS_NA, "__metadata__ is %s, expected an object of strings",
                        ls_json_kind(meta));
        return false;
    }
    bool ok = true;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)meta, key, v) {
        if (!json_is_string(v)) {
            ls_st_violation(err, NULL, LS_NA, LS_NA, LS_NA, "__metadata__ value of \"%.64s\" is %s, expected a string",
                            key, ls_json_kind(v));
            ok = false;
        }
    }
    return ok;
}

/* Reads a JSON integer that must be >= 0 into *out. */
static bool ls_st_nonneg_int(const json_t *v, int64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (int64_t)json_integer_value(v);
    return true;
}

/* Checks one tensor entry on its own (fields, dtype, shape, offsets, byte
 * count, end within the data section) and fills *e. Reports every problem
 * of the entry; returns false when there was any. */
static bool ls_st_check_entry(const char *name, const json_t *v, size_t body_len, ls_st_entry *e, ls_error *err) {
    if (!json_is_object(v)) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA,
                        "entry is %s, expected an object with dtype, shape and data_offsets", ls_json_kind(v));
        return false;
    }
    bool ok = true;
    const char *key;
    json_t *field;
    json_object_foreach((json_t *)v, key, field) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets")) {
            ls_st_violation(err, name, LS_NA, LS_NA, LS_NA,
                            "unknown field \"%.64s\" (an entry holds exactly dtype, shape and data_offsets)", key);
            ok = false;
        }
    }

    e->name = name;
    const json_t *jd = json_object_get(v, "dtype");
    if (!jd) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "missing dtype");
        ok = false;
    } else if (!json_is_string(jd)) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "dtype is %s, expected a string such as \"F32\"",
                        ls_json_kind(jd));
        ok = false;
    } else if (!ls_st_dtype_parse(json_string_value(jd), &e->dtype)) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA,
                        "unknown dtype \"%.32s\" (expected F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, "
                        "U8, BOOL, F8_E4M3 or F8_E5M2)",
                        json_string_value(jd));
        ok = false;
    }

    const json_t *js = json_object_get(v, "shape");
    if (!js) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "missing shape");
        ok = false;
    } else if (!json_is_array(js)) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "shape is %s, expected an array of integers",
                        ls_json_kind(js));
        ok = false;
    } else if (json_array_size(js) > LS_MAX_DIMS) {
        ls_st_violation(err, name, LS_NA, LS_MAX_DIMS, (int64_t)json_array_size(js),
                        "shape has %zu dimensions, at most %d are supported", json_array_size(js), LS_MAX_DIMS);
        ok = false;
    } else {
        e->ndim = (int)json_array_size(js);
        for (int i = 0; i < e->ndim; i++) {
            const json_t *d = json_array_get(js, (size_t)i);
            if (!ls_st_nonneg_int(d, &e->shape[i])) {
                if (json_is_integer(d))
                    ls_st_violation(err, name, i, LS_NA, (int64_t)json_integer_value(d), "shape axis %d is %lld, "
                                    "expected a non-negative integer", i, (long long)json_integer_value(d));
                else
                    ls_st_violation(err, name, i, LS_NA, LS_NA,
                                    "shape axis %d is %s, expected a non-negative integer", i, ls_json_kind(d));
                ok = false;
            }
        }
    }

    const json_t *jo = json_object_get(v, "data_offsets");
    if (!jo) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA, "missing data_offsets");
        ok = false;
    } else if (!json_is_array(jo) || json_array_size(jo) != 2 || !ls_st_nonneg_int(json_array_get(jo, 0), &e->begin) ||
               !ls_st_nonneg_int(json_array_get(jo, 1), &e->end)) {
        ls_st_violation(err, name, LS_NA, LS_NA, LS_NA,
                        "data_offsets must be an array of two non-negative integers [begin, end]");
        ok = false;
    } else if (e->end < e->begin) {
        ls_st_violation(err, name, LS_NA, e->begin, e->end, "data_offsets [%lld, %lld] end before they begin",
                        (long long)e->begin, (long long)e->end);
        ok = false;
    } else if ((uint64_t)e->end > (uint64_t)body_len) {
        ls_st_violation(err, name, LS_NA, (int64_t)body_len, e->end,
                        "data_offsets [%lld, %lld] run past the %zu-byte data section", (long long)e->begin,
                        (long long)e->end, body_len);
        ok = false;
    }
    if (!ok) return false;

    /* Everything parsed: now the byte count, each product checked. */
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

/* Byte order of the data section: by begin, then end, so a zero-size
 * tensor sits before a tensor that starts at the same offset. */
static int ls_st_cmp(const void *a, const void *b) {
    const ls_st_entry *x = *(const ls_st_entry *const *)a, *y = *(const ls_st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* The tensors, sorted by offset, must tile the data section exactly: the
 * first starts at 0, each starts where the previous ended, the last ends at
 * the end of the buffer. */
static ls_status ls_st_check_layout(ls_st_entry *ents, size_t n, size_t body_len, ls_error *err) {
    if (n == 0) {
        if (body_len == 0) return LS_OK;
        ls_st_violation(err, NULL, LS_NA, 0, (int64_t)body_len,
                        "no tensors, yet %zu bytes follow the header (trailing bytes)", body_len);
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
    if ((uint64_t)at != (uint64_t)body_len) {
        ls_st_violation(err, NULL, LS_NA, at, (int64_t)body_len,
                        "the tensors end at byte %lld of a %zu-byte data section (%lld trailing bytes)", (long long)at,
                        body_len, (long long)((int64_t)body_len - at));
        ok = false;
    }
    free(order);
    return ok ? LS_OK : LS_SAFETENSORS_INVALID;
}

/* Checks the 8-byte length field (in buf) against a file of file_len
 * bytes; on success *n is the header's length. */
static bool ls_st_header_length(const uint8_t *buf, uint64_t file_len, uint64_t *n_out, ls_error *err) {
    if (file_len < LS_ST_LEN_FIELD) {
        ls_st_violation(err, NULL, LS_NA, LS_ST_LEN_FIELD, (int64_t)file_len,
                        "the file is %llu bytes, shorter than the 8-byte header length field",
                        (unsigned long long)file_len);
        return false;
    }
    uint64_t n = 0;
    for (int i = 0; i < LS_ST_LEN_FIELD; i++) n |= (uint64_t)buf[i] << (8 * i);
    uint64_t avail = file_len - LS_ST_LEN_FIELD;
    /* The messages below never carry the field's value nor any other
     * byte of the input: a file read by path is not the client's to see. */
    if (n > LS_SAFETENSORS_MAX_HEADER) {
        ls_st_violation(err, NULL, LS_NA, LS_SAFETENSORS_MAX_HEADER, LS_NA,
                        "the header length field exceeds the limit of %u bytes", LS_SAFETENSORS_MAX_HEADER);
        return false;
    }
    if (n > avail) {
        ls_st_violation(err, NULL, LS_NA, (int64_t)avail, LS_NA,
                        "the header length field runs past the end of the file (%llu bytes follow it)",
                        (unsigned long long)avail);
        return false;
    }
    if (n == 0) {
        ls_st_violation(err, NULL, LS_NA, LS_NA, 0, "header length is 0; the header must be a JSON object");
        return false;
    }
    *n_out = n;
    return true;
}

/* Checks the header's n bytes at h (already bounded by the file) and
 * parses them; on success *root is a new reference to the header object
 * (caller decrefs). */
static bool ls_st_header_json(const char *h, size_t n, json_t **root, ls_error *err) {
    *root = NULL;
    if (h[0] != '{') {
        ls_st_violation(err, NULL, LS_NA, LS_NA, LS_NA, "the header does not start with '{'");
        return false;
    }
    const char *nul = memchr(h, '\0', n);
    if (nul) {
        ls_st_violation(err, NULL, LS_NA, LS_NA, LS_NA, "the header holds a NUL byte at offset %zu",
                        (size_t)(nul - h));
        return false;
    }
    json_error_t je;
    json_t *j = json_loadb(h, n, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        char why[160];
        ls_st_violation(err, NULL, LS_NA, LS_NA, LS_NA, "the header is not valid JSON: %s (at byte %d)",
                        ls_json_error_reason(&je, why, sizeof why), je.position);
        return false;
    }
    if (!json_is_object(j)) {
        ls_st_violation(err, NULL, LS_NA, LS_NA, LS_NA, "the header is %s, expected a JSON object",
                        ls_json_kind(j));
        json_decref(j);
        return false;
    }
    *root = j;
    return true;
}

/* Every entry of root checked on its own and then the layout of the data
 * section (body_len bytes). On success *ents (caller frees; names
 * borrowed from root) holds *n entries and *meta the borrowed
 * __metadata__ object or NULL. */
static ls_status ls_st_collect(json_t *root, uint64_t body_len, ls_st_entry **ents_out, size_t *n_out,
                               const json_t **meta_out, ls_error *err) {
    *ents_out = NULL;
    *n_out = 0;
    *meta_out = NULL;
    /* Bounded by the header's size, which the file already holds. */
    size_t cap = json_object_size(root);
    ls_st_entry *ents = calloc(cap ? cap : 1, sizeof *ents);
    if (!ents) return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory for %zu header entries", cap);
    size_t n = 0;
    bool ok = true;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, LS_ST_META)) {
            *meta_out = v;
            ok &= ls_st_check_meta(v, err);
        } else if (ls_st_check_entry(key, v, body_len, &ents[n], err)) {
            n++;
        } else {
            ok = false;
        }
    }
    /* The layout is only meaningful once every entry is sound. */
    ls_status st = ok ? ls_st_check_layout(ents, n, body_len, err) : LS_SAFETENSORS_INVALID;
    if (st != LS_OK) {
        free(ents);
        *meta_out = NULL;
        return st;
    }
    *ents_out = ents;
    *n_out = n;
    return LS_OK;
}

/* See safetensors.h. out borrows from buf; on failure out is freed (empty)
 * and err holds every violation found. */
ls_status ls_safetensors_parse(const uint8_t *buf, size_t len, ls_tensor_set *out, ls_error *err) {
    json_t *root = NULL;
    uint64_t hlen = 0;
    if (!ls_st_header_length(buf, len, &hlen, err) ||
        !ls_st_header_json((const char *)buf + LS_ST_LEN_FIELD, (size_t)hlen, &root, err)) {
        ls_tensor_set_free(out);
        return LS_SAFETENSORS_INVALID;
    }
    const size_t body_off = LS_ST_LEN_FIELD + (size_t)hlen;
    const uint8_t *body = buf + body_off;
    ls_st_entry *ents;
    size_t n;
    const json_t *meta;
    ls_status st = ls_st_collect(root, len - body_off, &ents, &n, &meta, err);
    const char *key;
    json_t *v;
    if (st == LS_OK && meta) {
        json_object_foreach((json_t *)meta, key, v) {
            if (!ls_tensor_set_add_meta(out, key, json_string_value(v))) {
                st = ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory for metadata");
                break;
            }
        }
    }
    for (size_t i = 0; st == LS_OK && i < n; i++) {
        const ls_st_entry *e = &ents[i];
        ls_tensor t = {0};
        t.dtype = e->dtype;
        t.ndim = e->ndim;
        memcpy(t.shape, e->shape, sizeof t.shape);
        t.data = (void *)(body + e->begin); /* borrowed: the caller keeps buf alive */
        t.nbytes = (size_t)(e->end - e->begin);
        t.owned = false;
        if (!ls_tensor_set_add(out, e->name, &t))
            st = ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory for tensor \"%.96s\"", e->name);
    }
    free(ents);
    json_decref(root);
    if (st != LS_OK) ls_tensor_set_free(out);
    return st;
}

ls_status ls_safetensors_header_len(const uint8_t *first, uint64_t file_len, size_t *header_len, ls_error *err) {
    *header_len = 0;
    uint64_t n = 0;
    if (!ls_st_header_length(first, file_len, &n, err)) return LS_SAFETENSORS_INVALID;
    *header_len = (size_t)n;
    return LS_OK;
}

ls_status ls_safetensors_check_header(const uint8_t *head, size_t head_len, uint64_t file_len, ls_error *err) {
    uint64_t n = 0;
    if (!ls_st_header_length(head, file_len, &n, err)) return LS_SAFETENSORS_INVALID;
    if (head_len < LS_ST_LEN_FIELD + n)
        return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: %zu header bytes given, %llu needed", head_len,
                            (unsigned long long)(LS_ST_LEN_FIELD + n));
    json_t *root = NULL;
    if (!ls_st_header_json((const char *)head + LS_ST_LEN_FIELD, (size_t)n, &root, err)) return LS_SAFETENSORS_INVALID;
    ls_st_entry *ents = NULL;
    size_t count = 0;
    const json_t *meta = NULL;
    ls_status st = ls_st_collect(root, file_len - LS_ST_LEN_FIELD - n, &ents, &count, &meta, err);
    free(ents);
    json_decref(root);
    return st;
}

/* ---- reading from a file: the header, then only the ranges wanted ---- */

/* pread of exactly len bytes at off, retried on EINTR and short reads;
 * -1 on an error (errno set), else the bytes read (< len: the file ended). */
static ssize_t ls_st_pread_all(int fd, void *dst, size_t len, uint64_t off) {
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)dst + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static ls_status ls_st_read_failed(const char *what, int saved, ls_error *err) {
    char ebuf[128];
    return ls_error_set(err, LS_INVALID_REQUEST, NULL, "cannot read %s: %s", what,
                        strerror_r(saved, ebuf, sizeof ebuf));
}

/* Fills out from the entries (names copied) and the metadata. */
static ls_status ls_st_header_fill(ls_st_header *out, const ls_st_entry *ents, size_t n, const json_t *meta,
                                   uint64_t body_off, ls_error *err) {
    out->items = calloc(n ? n : 1, sizeof *out->items);
    if (!out->items) return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory for %zu entries", n);
    for (size_t i = 0; i < n; i++) {
        ls_st_info *t = &out->items[out->n];
        if (!(t->name = strdup(ents[i].name)))
            return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory for tensor names");
        t->dtype = ents[i].dtype;
        t->ndim = ents[i].ndim;
        memcpy(t->shape, ents[i].shape, sizeof t->shape);
        t->offset = body_off + (uint64_t)ents[i].begin;
        t->nbytes = (size_t)(ents[i].end - ents[i].begin);
        out->n++;
    }
    const char *key;
    json_t *v;
    if (!meta) return LS_OK;
    json_object_foreach((json_t *)meta, key, v) {
        if (!ls_tensor_set_add_meta(&out->meta, key, json_string_value(v)))
            return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory for metadata");
    }
    return LS_OK;
}

/* See safetensors.h: 8 + N bytes read, nothing of the data section. */
ls_status ls_safetensors_read_header(int fd, const char *what, ls_st_header *out, ls_error *err) {
    memset(out, 0, sizeof *out);
    ls_tensor_set_init(&out->meta);
    struct stat sb;
    if (fstat(fd, &sb) != 0) return ls_st_read_failed(what, errno, err);
    const uint64_t file_len = (uint64_t)sb.st_size;
    uint8_t len8[LS_ST_LEN_FIELD] = {0};
    ssize_t r = ls_st_pread_all(fd, len8, file_len < LS_ST_LEN_FIELD ? (size_t)file_len : LS_ST_LEN_FIELD, 0);
    if (r < 0) return ls_st_read_failed(what, errno, err);
    uint64_t hlen = 0;
    if (!ls_st_header_length(len8, file_len, &hlen, err)) return LS_SAFETENSORS_INVALID;
    char *h = malloc((size_t)hlen); /* bounded: at most the limit, and within the file */
    if (!h) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory for the header of %s", what);
    r = ls_st_pread_all(fd, h, (size_t)hlen, LS_ST_LEN_FIELD);
    if (r < 0 || (uint64_t)r != hlen) {
        int saved = r < 0 ? errno : EIO;
        free(h);
        return ls_st_read_failed(what, saved, err);
    }
    json_t *root = NULL;
    ls_status st = ls_st_header_json(h, (size_t)hlen, &root, err) ? LS_OK : LS_SAFETENSORS_INVALID;
    free(h);
    ls_st_entry *ents = NULL;
    size_t n = 0;
    const json_t *meta = NULL;
    const uint64_t body_off = LS_ST_LEN_FIELD + hlen;
    if (st == LS_OK) st = ls_st_collect(root, file_len - body_off, &ents, &n, &meta, err);
    if (st == LS_OK) st = ls_st_header_fill(out, ents, n, meta, body_off, err);
    free(ents);
    json_decref(root);
    if (st == LS_OK) out->file_len = file_len;
    else ls_st_header_free(out);
    return st;
}

void ls_st_header_free(ls_st_header *h) {
    for (size_t i = 0; h->items && i < h->n; i++) free(h->items[i].name);
    free(h->items);
    ls_tensor_set_free(&h->meta);
    memset(h, 0, sizeof *h);
}

const ls_st_info *ls_st_header_find(const ls_st_header *h, const char *name) {
    for (size_t i = 0; i < h->n; i++)
        if (!strcmp(h->items[i].name, name)) return &h->items[i];
    return NULL;
}

ls_status ls_safetensors_read_range(int fd, const char *what, const ls_st_info *t, void *dst, ls_error *err) {
    ssize_t r = ls_st_pread_all(fd, dst, t->nbytes, t->offset);
    if (r < 0) return ls_st_read_failed(what, errno, err);
    if ((size_t)r != t->nbytes)
        return ls_error_add(err, LS_SAFETENSORS_INVALID, LS_NA, t->name, LS_NA, (int64_t)t->nbytes, (int64_t)r,
                            "the file changed or was cut short after its header was read",
                            "%s ends %zu bytes into tensor %s, which needs %zu", what, (size_t)r, t->name,
                            t->nbytes);
    return LS_OK;
}

/* Builds the header object: __metadata__ first, then each tensor with
 * consecutive offsets. Returns NULL with err set on a malformed set. */
static json_t *ls_st_build_header(const ls_tensor_set *s, uint64_t *data_len, ls_error *err) {
    json_t *root = json_object();
    if (!root) goto oom;
    if (s->n_meta) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, LS_ST_META, m)) goto oom;
        for (size_t i = 0; i < s->n_meta; i++) {
            if (json_object_get(m, s->meta[i].key)) {
                ls_error_set(err, LS_INTERNAL, NULL, "safetensors write: metadata key \"%.64s\" appears twice",
                             s->meta[i].key);
                goto fail;
            }
            json_t *val = json_string(s->meta[i].value);
            if (!val || json_object_set_new(m, s->meta[i].key, val)) {
                ls_error_set(err, LS_INTERNAL, NULL,
                             "safetensors write: metadata \"%.64s\" is not valid UTF-8 (or memory ran out)",
                             s->meta[i].key);
                goto fail;
            }
        }
    }
    uint64_t off = 0;
    for (size_t i = 0; i < s->n; i++) {
        const char *name = s->items[i].name;
        const ls_tensor *t = &s->items[i].t;
        if (!strcmp(name, LS_ST_META) || json_object_get(root, name)) {
            ls_error_set(err, LS_INTERNAL, NULL, "safetensors write: tensor name \"%.96s\" is reserved or repeated",
                         name);
            goto fail;
        }
        int64_t numel = (unsigned)t->dtype < LS_DTYPE_COUNT && t->ndim >= 0 && t->ndim <= LS_MAX_DIMS
                            ? ls_shape_numel(t->shape, t->ndim)
                            : -1;
        size_t size = ls_dtype_size(t->dtype);
        if (numel < 0 || (uint64_t)numel > INT64_MAX / size || (size_t)numel * size != t->nbytes ||
            (t->nbytes && !t->data) || t->nbytes > INT64_MAX - off) {
            ls_error_set(err, LS_INTERNAL, NULL,
                         "safetensors write: tensor \"%.96s\" has an inconsistent dtype, shape or byte count", name);
            goto fail;
        }
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        if (!e || !shape || !offs) {
            json_decref(e);
            json_decref(shape);
            json_decref(offs);
            goto oom;
        }
        /* Each set takes its value even when it fails: all three run, or
         * a failed first one would leak the arrays. */
        bool bad = json_object_set_new(e, "dtype", json_string(ls_dtype_name(t->dtype)));
        bad |= json_object_set_new(e, "shape", shape) != 0;
        bad |= json_object_set_new(e, "data_offsets", offs) != 0;
        for (int d = 0; !bad && d < t->ndim; d++) bad = json_array_append_new(shape, json_integer(t->shape[d]));
        bad = bad || json_array_append_new(offs, json_integer((json_int_t)off)) ||
              json_array_append_new(offs, json_integer((json_int_t)(off + t->nbytes)));
        if (bad) {
            json_decref(e);
            goto oom;
        }
        if (json_object_set_new(root, name, e)) {
            ls_error_set(err, LS_INTERNAL, NULL,
                         "safetensors write: tensor name \"%.96s\" is not valid UTF-8 (or memory ran out)", name);
            goto fail;
        }
        off += t->nbytes;
    }
    *data_len = off;
    return root;
oom:
    ls_error_set(err, LS_INTERNAL, NULL, "safetensors write: out of memory building the header");
fail:
    json_decref(root);
    return NULL;
}

/* See safetensors.h. *out is malloc'd and owned by the caller; on failure
 * it is NULL and *len 0. */
ls_status ls_safetensors_write(const ls_tensor_set *s, uint8_t **out, size_t *len, ls_error *err) {
    *out = NULL;
    *len = 0;
    uint64_t data_len = 0;
    json_t *root = ls_st_build_header(s, &data_len, err);
    if (!root) return LS_INTERNAL;
    char *h = json_dumps(root, JSON_COMPACT);
    /* jansson 2.14's json_dumps drops an object key whose bytes it cannot
     * append when memory runs out and still returns the text
     * (akheron/jansson#655): a header is only written once it reads back
     * as the one built. */
    json_t *back = h ? json_loads(h, 0, NULL) : NULL;
    const bool same = back && json_equal(root, back);
    json_decref(back);
    json_decref(root);
    if (!same) {
        free(h);
        return ls_error_set(err, LS_INTERNAL, NULL, "safetensors write: cannot serialise the header (out of memory)");
    }

    /* Spaces pad the header so the data section starts 8-byte aligned,
     * as the safetensors library does. */
    size_t hlen = strlen(h);
    size_t padded = (hlen + 7) & ~(size_t)7;
    if (padded > LS_SAFETENSORS_MAX_HEADER || data_len > SIZE_MAX - LS_ST_LEN_FIELD - padded) {
        free(h);
        return ls_error_set(err, LS_INTERNAL, NULL, "safetensors write: the header or data is too large");
    }
    size_t total = LS_ST_LEN_FIELD + padded + (size_t)data_len;
    uint8_t *b = malloc(total);
    if (!b) {
        free(h);
        return ls_error_set(err, LS_INTERNAL, NULL, "safetensors write: out of memory for %zu bytes", total);
    }
    for (int i = 0; i < LS_ST_LEN_FIELD; i++) b[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(b + LS_ST_LEN_FIELD, h, hlen);
    memset(b + LS_ST_LEN_FIELD + hlen, ' ', padded - hlen);
    free(h);
    size_t at = LS_ST_LEN_FIELD + padded;
    for (size_t i = 0; i < s->n; i++) {
        const ls_tensor *t = &s->items[i].t;
        if (t->nbytes) memcpy(b + at, t->data, t->nbytes);
        at += t->nbytes;
    }
    *out = b;
    *len = total;
    return LS_OK;
}
