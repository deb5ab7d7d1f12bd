/* safetensors read and write. The reader treats every byte as hostile: the
 * header length, each offset and each shape product is checked against the
 * buffer (with overflow-checked arithmetic) before anything relies on it.
 * The rules are listed in docs/safetensors.md. */
#include "format/safetensors.h"

#include "format/json.h"
#include "format/safetensors_internal.h"

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

/* What a file given for safetensors often is instead, from its first 8
 * bytes, with the fix: PyTorch's own formats (adapter_model.bin,
 * pytorch_model.bin: torch.save writes a zip archive from PyTorch 1.6 on,
 * a bare pickle before), or the Git LFS pointer left by a clone without
 * git-lfs. false for anything else. */
static bool ls_st_foreign_kind(const uint8_t *buf, const char **what, const char **hint) {
    static const char *const resave = "save it again in safetensors (PEFT's save_pretrained writes "
                                      "adapter_model.safetensors unless safe_serialization=False), or convert it "
                                      "with safetensors.torch.save_file";
    if (!memcmp(buf, "PK\x03\x04", 4)) {
        *what = "a zip archive, as torch.save writes (a pickled PyTorch file); this server never reads pickles "
                "(loading one can run code)";
        *hint = resave;
    } else if (buf[0] == 0x80 && buf[1] >= 2 && buf[1] <= 5) {
        *what = "a pickle, as older torch.save writes; this server never reads pickles (loading one can run code)";
        *hint = resave;
    } else if (!memcmp(buf, "version ", 8)) {
        *what = "a Git LFS pointer, not the file it points to: the repository was cloned without git-lfs";
        *hint = "fetch the file itself: git lfs install && git lfs pull in the clone, or huggingface-cli download";
    } else {
        return false;
    }
    return true;
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
     * byte of the input (a file read by path is not the client's to see),
     * only what the file is instead when the length is past any header:
     * a real header of 640 bytes also begins 0x80 0x02, and a file of it
     * cut short is a cut file, not a pickle. */
    const char *what, *hint;
    if (n > LS_SAFETENSORS_MAX_HEADER && ls_st_foreign_kind(buf, &what, &hint)) {
        ls_error_add(err, LS_SAFETENSORS_INVALID, LS_NA, NULL, LS_NA, LS_NA, LS_NA, hint,
                     "safetensors: the file is %s", what);
        return false;
    }
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

/* See safetensors.h. out borrows from buf; on failure out is freed (empty)
 * and err holds every violation found. */
ls_status ls_safetensors_parse(const uint8_t *buf, size_t len, ls_tensor_set *out, ls_error *err) {
    return ls_safetensors_parse_max(buf, len, SIZE_MAX, out, err);
}

ls_status ls_safetensors_parse_max(const uint8_t *buf, size_t len, size_t max_tensors, ls_tensor_set *out,
                                   ls_error *err) {
    uint64_t hlen = 0;
    if (!ls_st_header_length(buf, len, &hlen, err)) {
        ls_tensor_set_free(out);
        return LS_SAFETENSORS_INVALID;
    }
    const size_t body_off = LS_ST_LEN_FIELD + (size_t)hlen;
    const uint8_t *body = buf + body_off;
    ls_st_entry *ents;
    size_t n;
    ls_status st = ls_st_collect((const char *)buf + LS_ST_LEN_FIELD, (size_t)hlen, len - body_off, max_tensors, &ents,
                                 &n, out, err);
    if (st == LS_OK && !ls_tensor_set_reserve(out, n))
        st = ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory for %zu tensors", n);
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
        /* Each name once: the set holds its own copy now. */
        free(ents[i].name);
        ents[i].name = NULL;
    }
    ls_st_entries_free(ents, n);
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

ls_status ls_safetensors_check_header(const uint8_t *head, size_t head_len, uint64_t file_len, size_t max_tensors,
                                      ls_error *err) {
    uint64_t n = 0;
    if (!ls_st_header_length(head, file_len, &n, err)) return LS_SAFETENSORS_INVALID;
    if (head_len < LS_ST_LEN_FIELD + n)
        return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: %zu header bytes given, %llu needed", head_len,
                            (unsigned long long)(LS_ST_LEN_FIELD + n));
    ls_st_entry *ents = NULL;
    size_t count = 0;
    ls_status st = ls_st_collect((const char *)head + LS_ST_LEN_FIELD, (size_t)n, file_len - LS_ST_LEN_FIELD - n,
                                 max_tensors, &ents, &count, NULL, err);
    ls_st_entries_free(ents, count);
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

/* Fills out from the entries, taking their names. */
static ls_status ls_st_header_fill(ls_st_header *out, ls_st_entry *ents, size_t n, uint64_t body_off, ls_error *err) {
    out->items = calloc(n ? n : 1, sizeof *out->items);
    if (!out->items) return ls_error_set(err, LS_INTERNAL, NULL, "safetensors: out of memory for %zu entries", n);
    for (size_t i = 0; i < n; i++) {
        ls_st_info *t = &out->items[out->n];
        t->name = ents[i].name;
        ents[i].name = NULL;
        t->dtype = ents[i].dtype;
        t->ndim = ents[i].ndim;
        memcpy(t->shape, ents[i].shape, sizeof t->shape);
        t->offset = body_off + (uint64_t)ents[i].begin;
        t->nbytes = (size_t)(ents[i].end - ents[i].begin);
        out->n++;
    }
    return LS_OK;
}

/* See safetensors.h: 8 + N bytes read, nothing of the data section. */
/* A file the server reads itself (a checkpoint's shard) is named in the
 * message, which the header's checks leave out: there may be many. */
static ls_status ls_st_name_file(ls_error *err, const char *what) {
    char msg[sizeof err->message + 320];
    const char *m = !strncmp(err->message, "safetensors: ", 13) ? err->message + 13 : err->message;
    /* A long path keeps its end: the shard's own name is what tells. */
    const size_t len = strlen(what), keep = 200;
    snprintf(msg, sizeof msg, "safetensors: %s%s: %s", len > keep ? "..." : "", len > keep ? what + len - keep : what,
             m);
    memcpy(err->message, msg, sizeof err->message - 1);
    err->message[sizeof err->message - 1] = '\0';
    return LS_SAFETENSORS_INVALID;
}

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
    if (!ls_st_header_length(len8, file_len, &hlen, err)) return ls_st_name_file(err, what);
    char *h = malloc((size_t)hlen); /* bounded: at most the limit, and within the file */
    if (!h) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory for the header of %s", what);
    r = ls_st_pread_all(fd, h, (size_t)hlen, LS_ST_LEN_FIELD);
    if (r < 0 || (uint64_t)r != hlen) {
        int saved = r < 0 ? errno : EIO;
        free(h);
        return ls_st_read_failed(what, saved, err);
    }
    ls_st_entry *ents = NULL;
    size_t n = 0;
    const uint64_t body_off = LS_ST_LEN_FIELD + hlen;
    ls_status st = ls_st_collect(h, (size_t)hlen, file_len - body_off, SIZE_MAX, &ents, &n, &out->meta, err);
    free(h);
    if (st == LS_SAFETENSORS_INVALID) ls_st_name_file(err, what);
    if (st == LS_OK) st = ls_st_header_fill(out, ents, n, body_off, err);
    ls_st_entries_free(ents, n);
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
/* The header text of s (owned, *h) unpadded (*hlen), its padded length
 * (*padded) and the data's (*data_len); LS_INTERNAL with err set when it
 * cannot be made. */
static ls_status ls_st_header_text(const ls_tensor_set *s, char **h, size_t *hlen, size_t *padded, uint64_t *data_len,
                                   ls_error *err) {
    *h = NULL;
    json_t *root = ls_st_build_header(s, data_len, err);
    if (!root) return LS_INTERNAL;
    char *text = json_dumps(root, JSON_COMPACT);
    /* jansson 2.14's json_dumps drops an object key whose bytes it cannot
     * append when memory runs out and still returns the text
     * (akheron/jansson#655): a header is only written once it reads back
     * as the one built. */
    json_t *back = text ? json_loads(text, 0, NULL) : NULL;
    const bool same = back && json_equal(root, back);
    json_decref(back);
    json_decref(root);
    if (!same) {
        free(text);
        return ls_error_set(err, LS_INTERNAL, NULL, "safetensors write: cannot serialise the header (out of memory)");
    }
    /* Spaces pad the header so the data section starts 8-byte aligned,
     * as the safetensors library does. */
    *hlen = strlen(text);
    *padded = (*hlen + 7) & ~(size_t)7;
    if (*padded > LS_SAFETENSORS_MAX_HEADER || *data_len > SIZE_MAX - LS_ST_LEN_FIELD - *padded) {
        free(text);
        return ls_error_set(err, LS_INTERNAL, NULL, "safetensors write: the header or data is too large");
    }
    *h = text;
    return LS_OK;
}

/* The length field and the padded header into b; frees h. */
static void ls_st_put_header(uint8_t *b, char *h, size_t hlen, size_t padded) {
    for (int i = 0; i < LS_ST_LEN_FIELD; i++) b[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(b + LS_ST_LEN_FIELD, h, hlen);
    memset(b + LS_ST_LEN_FIELD + hlen, ' ', padded - hlen);
    free(h);
}

ls_status ls_safetensors_write(const ls_tensor_set *s, uint8_t **out, size_t *len, ls_error *err) {
    *out = NULL;
    *len = 0;
    uint64_t data_len = 0;
    char *h;
    size_t hlen, padded;
    ls_status st = ls_st_header_text(s, &h, &hlen, &padded, &data_len, err);
    if (st != LS_OK) return st;
    size_t total = LS_ST_LEN_FIELD + padded + (size_t)data_len;
    uint8_t *b = malloc(total);
    if (!b) {
        free(h);
        return ls_error_set(err, LS_INTERNAL, NULL, "safetensors write: out of memory for %zu bytes", total);
    }
    ls_st_put_header(b, h, hlen, padded);
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

ls_status ls_safetensors_write_before(const ls_tensor_set *s, uint8_t *buf, size_t room, size_t *start, size_t *len,
                                      ls_error *err) {
    size_t at = room;
    for (size_t i = 0; i < s->n; i++) {
        if ((const uint8_t *)s->items[i].t.data != buf + at)
            return ls_error_set(err, LS_INTERNAL, NULL, "safetensors write: tensor \"%.96s\" is not where the data "
                                                        "section holds it", s->items[i].name);
        at += s->items[i].t.nbytes;
    }
    uint64_t data_len = 0;
    char *h;
    size_t hlen, padded;
    ls_status st = ls_st_header_text(s, &h, &hlen, &padded, &data_len, err);
    if (st != LS_OK) return st;
    if (LS_ST_LEN_FIELD + padded > room) {
        free(h);
        return ls_error_set(err, LS_INTERNAL, NULL, "safetensors write: a %zu-byte header does not fit in %zu bytes",
                            padded, room);
    }
    *start = room - LS_ST_LEN_FIELD - padded;
    ls_st_put_header(buf + *start, h, hlen, padded);
    *len = LS_ST_LEN_FIELD + padded + (size_t)data_len;
    return LS_OK;
}
