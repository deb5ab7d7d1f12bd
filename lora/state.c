/* The state directory: adapter records as safetensors files written
 * atomically (temporary file, fsync, rename, fsync of the directory),
 * the floor of each name's versions, tombstones of deleted names, reading
 * one back, and the restore scan that moves what it cannot read aside
 * instead of stopping (keeping the versions it held). */
#include "lora/state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/file.h"
#include "common/log.h"
#include "format/safetensors.h"

#define LS_STATE_FORMAT "1"
#define LS_STATE_MAX_NAME 128

struct ls_state {
    int dirfd;
    char dir[PATH_MAX];
    unsigned long tmp_seq; /* names of temporary files; callers serialise writes */
};

ls_status ls_state_open(const char *dir, ls_state **out, ls_error *err) {
    *out = NULL;
    char ebuf[128];
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return ls_error_set(err, LS_INVALID_REQUEST, "give --state-dir a directory the server may write",
                            "cannot create the state directory %.200s: %s", dir, strerror_r(errno, ebuf, sizeof ebuf));
    ls_state *s = calloc(1, sizeof *s);
    if (!s) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    s->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->dirfd < 0) {
        free(s);
        return ls_error_set(err, LS_INVALID_REQUEST, "give --state-dir a directory the server may write",
                            "cannot open the state directory %.200s: %s", dir, strerror_r(errno, ebuf, sizeof ebuf));
    }
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    *out = s;
    return LS_OK;
}

void ls_state_close(ls_state *s) {
    if (!s) return;
    close(s->dirfd);
    free(s);
}

/* ---- writing ------------------------------------------------------------- */

static ls_status ls_state_fail(ls_error *err, const char *what, const char *file) {
    char ebuf[128];
    return ls_error_set(err, LS_INTERNAL, "check the disk of --state-dir (space, permissions)",
                        "state directory: %s %s: %s", what, file, strerror_r(errno, ebuf, sizeof ebuf));
}

static ls_status ls_state_sync_dir(ls_state *s, ls_error *err) {
    if (fsync(s->dirfd) != 0) return ls_state_fail(err, "cannot sync the directory of", s->dir);
    return LS_OK;
}

/* data[len] becomes file in one step, durable when this returns LS_OK. */
static ls_status ls_state_write_atomic(ls_state *s, const char *file, const void *data, size_t len, ls_error *err) {
    char tmp[LS_STATE_MAX_NAME + 64];
    snprintf(tmp, sizeof tmp, ".tmp.%lu.%s", ++s->tmp_seq, file);
    int fd = openat(s->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return ls_state_fail(err, "cannot create", tmp);
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            ls_state_fail(err, "cannot write", tmp);
            close(fd);
            unlinkat(s->dirfd, tmp, 0);
            return LS_INTERNAL;
        }
        p += w, left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        ls_state_fail(err, "cannot sync", tmp);
        unlinkat(s->dirfd, tmp, 0);
        return LS_INTERNAL;
    }
    if (renameat(s->dirfd, tmp, s->dirfd, file) != 0) {
        ls_state_fail(err, "cannot rename into place", file);
        unlinkat(s->dirfd, tmp, 0);
        return LS_INTERNAL;
    }
    return ls_state_sync_dir(s, err);
}

/* version as the text of file (a tombstone or a floor: decimal digits
 * and a newline), durable when this returns LS_OK. */
static ls_status ls_state_write_version(ls_state *s, const char *file, uint64_t version, ls_error *err) {
    char text[32];
    int n = snprintf(text, sizeof text, "%" PRIu64 "\n", version);
    return ls_state_write_atomic(s, file, text, (size_t)n, err);
}

/* Removes file if it is there; durable when this returns LS_OK. */
static ls_status ls_state_remove(ls_state *s, const char *file, ls_error *err) {
    if (unlinkat(s->dirfd, file, 0) != 0) {
        if (errno == ENOENT) return LS_OK;
        return ls_state_fail(err, "cannot remove", file);
    }
    return ls_state_sync_dir(s, err);
}

/* j as compact text, NULL when out of memory. jansson 2.14's json_dumps
 * drops an object key it cannot append when memory runs out and still
 * returns the text (akheron/jansson#655), which would make the record
 * unreadable at the next start: the text is only kept once it reads
 * back as j. */
static char *ls_state_dump(const json_t *j) {
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_t *back = text ? json_loads(text, 0, NULL) : NULL;
    if (!back || !json_equal(j, back)) {
        free(text);
        text = NULL;
    }
    json_decref(back);
    return text;
}

static json_t *ls_state_params_json(const ls_adapter_params *p) {
    return json_pack("{s:s, s:i, s:b, s:f, s:b, s:b, s:b, s:f, s:b, s:b, s:b, s:s}", "format",
                     ls_adapter_format_name(p->format), "r", p->r, "has_alpha", p->has_alpha, "lora_alpha",
                     p->lora_alpha, "has_rslora", p->has_rslora, "use_rslora", p->use_rslora, "has_scale",
                     p->has_scale, "scale", p->scale, "strict", p->strict, "whole_config", p->whole_config,
                     "has_order", p->has_order, "gate_up_order", ls_gate_up_order_name(p->gate_up_order));
}

ls_status ls_state_save(ls_state *s, const ls_state_record *rec, ls_error *err) {
    const ls_adapter *a = rec->a;
    const int64_t L = a->layers, lf = (int64_t)a->layer_floats;
    uint8_t *present = malloc((size_t)L ? (size_t)L : 1);
    json_t *params = ls_state_params_json(&rec->params), *ignored = json_array();
    for (size_t i = 0; ignored && i < a->meta.n_ignored; i++)
        if (json_array_append_new(ignored, json_string(a->ignored[i]))) { /* out of memory: no list, no record */
            json_decref(ignored);
            ignored = NULL;
        }
    char *params_text = ls_state_dump(params);
    char *ignored_text = ls_state_dump(ignored);
    json_decref(params);
    json_decref(ignored);
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    ls_status st = LS_OK;
    if (!present || !params_text || !ignored_text) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    if (st == LS_OK) {
        for (int64_t l = 0; l < L; l++) present[l] = a->layer_present[l] ? 1 : 0;
        ls_tensor factors = {.dtype = LS_DTYPE_F32, .ndim = 2, .shape = {L, lf}, .data = a->data,
                             .nbytes = (size_t)(L * lf) * sizeof(float)};
        ls_tensor flags = {.dtype = LS_DTYPE_U8, .ndim = 1, .shape = {L}, .data = present, .nbytes = (size_t)L};
        char version[32], rank[16], outer[16], scale[40];
        snprintf(version, sizeof version, "%" PRIu64, rec->version);
        snprintf(rank, sizeof rank, "%d", a->meta.rank);
        snprintf(outer, sizeof outer, "%d", a->meta.outer);
        snprintf(scale, sizeof scale, "%.17g", a->meta.scale);
        bool ok = ls_tensor_set_add(&set, "factors", &factors) && ls_tensor_set_add(&set, "layer_present", &flags) &&
                  ls_tensor_set_add_meta(&set, "lorasink_state", LS_STATE_FORMAT) &&
                  ls_tensor_set_add_meta(&set, "name", rec->name) && ls_tensor_set_add_meta(&set, "version", version) &&
                  ls_tensor_set_add_meta(&set, "pinned", rec->pinned ? "true" : "false") &&
                  ls_tensor_set_add_meta(&set, "auto_loaded", rec->auto_loaded ? "true" : "false") &&
                  ls_tensor_set_add_meta(&set, "format", ls_adapter_format_name(a->meta.format)) &&
                  ls_tensor_set_add_meta(&set, "rank", rank) && ls_tensor_set_add_meta(&set, "outer", outer) &&
                  ls_tensor_set_add_meta(&set, "scale", scale) &&
                  ls_tensor_set_add_meta(&set, "sha256", a->meta.sha256) &&
                  ls_tensor_set_add_meta(&set, "source", rec->source_path ? rec->source_path : "") &&
                  ls_tensor_set_add_meta(&set, "params", params_text) &&
                  ls_tensor_set_add_meta(&set, "ignored", ignored_text);
        if (!ok) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    }
    uint8_t *bytes = NULL;
    size_t len = 0;
    if (st == LS_OK) st = ls_safetensors_write(&set, &bytes, &len, err);
    char file[LS_STATE_MAX_NAME + 16];
    /* The name's floor before its record: once a record of this version
     * is on disk, so is a file that knows the version, whatever later
     * becomes of the record (a restore that cannot read even the
     * record's header reads the floor). A floor left ahead of its record
     * (the record's write failed or a crash came between) only bounds
     * the name's versions from below: it costs nothing. */
    snprintf(file, sizeof file, "%s.floor", rec->name);
    if (st == LS_OK) st = ls_state_write_version(s, file, rec->version, err);
    snprintf(file, sizeof file, "%s.adapter", rec->name);
    if (st == LS_OK) st = ls_state_write_atomic(s, file, bytes, len, err);
    snprintf(file, sizeof file, "%s.deleted", rec->name);
    if (st == LS_OK) st = ls_state_remove(s, file, err);
    free(bytes);
    ls_tensor_set_free(&set);
    free(present);
    free(params_text);
    free(ignored_text);
    return st;
}

ls_status ls_state_forget(ls_state *s, const char *name, uint64_t version, ls_error *err) {
    char file[LS_STATE_MAX_NAME + 16];
    snprintf(file, sizeof file, "%s.deleted", name);
    ls_status st = ls_state_write_version(s, file, version, err);
    snprintf(file, sizeof file, "%s.adapter", name);
    if (st == LS_OK) st = ls_state_remove(s, file, err);
    return st;
}

/* ---- reading ------------------------------------------------------------- */

/* v, a decimal number and nothing else, into *out. */
static bool ls_state_u64_text(const char *v, uint64_t *out) {
    /* Digits only: strtoull would take "-1" as 2^64 - 1. */
    if (!v || *v < '0' || *v > '9') return false;
    char *end;
    errno = 0;
    unsigned long long u = strtoull(v, &end, 10);
    if (errno || *end) return false;
    *out = u;
    return true;
}

static bool ls_state_meta_u64(const ls_tensor_set *set, const char *key, uint64_t *out) {
    return ls_state_u64_text(ls_tensor_set_meta(set, key), out);
}

/* What reading a record gave: the record, a file that is not one, or no
 * memory to tell (which says nothing about the file: it must not be set
 * aside for it). */
typedef enum { LS_DECODED, LS_DECODE_BAD, LS_DECODE_NOMEM } ls_state_decoded;

/* jansson's out of memory where it says so: json_unpack's error code, or
 * a parse that failed before it could name a reason (its buffer could not
 * be made). */
static bool ls_state_json_nomem(const json_error_t *e) {
    return !e->text[0] || json_error_code(e) == json_error_out_of_memory;
}

static ls_state_decoded ls_state_params_parse(const char *text, ls_adapter_params *p) {
    json_error_t jerr;
    json_t *j = text ? json_loads(text, 0, &jerr) : NULL;
    if (!j) return text && ls_state_json_nomem(&jerr) ? LS_DECODE_NOMEM : LS_DECODE_BAD;
    /* Records written before gate_up_order existed lack its keys: they
     * were loaded with the only order there was. */
    const char *format = NULL, *order = "gate_up";
    int r = 0, has_alpha = 0, has_rslora = 0, use_rslora = 0, has_scale = 0, strict = 0, whole = 0, has_order = 0;
    double alpha = 0, scale = 0;
    ls_state_decoded d = LS_DECODED;
    if (json_unpack_ex(j, &jerr, 0, "{s:s, s:i, s:b, s:F, s:b, s:b, s:b, s:F, s:b, s:b, s?b, s?s}", "format", &format,
                       "r", &r, "has_alpha", &has_alpha, "lora_alpha", &alpha, "has_rslora", &has_rslora, "use_rslora",
                       &use_rslora, "has_scale", &has_scale, "scale", &scale, "strict", &strict, "whole_config",
                       &whole, "has_order", &has_order, "gate_up_order", &order))
        d = json_error_code(&jerr) == json_error_out_of_memory ? LS_DECODE_NOMEM : LS_DECODE_BAD;
    else if (!ls_adapter_format_parse(format, &p->format) || !ls_gate_up_order_parse(order, &p->gate_up_order))
        d = LS_DECODE_BAD;
    if (d == LS_DECODED) {
        p->r = r, p->has_alpha = has_alpha, p->lora_alpha = alpha, p->has_rslora = has_rslora;
        p->use_rslora = use_rslora, p->has_scale = has_scale, p->scale = scale, p->strict = strict;
        p->whole_config = whole, p->has_order = has_order;
    }
    json_decref(j);
    return d;
}

/* A record of file (NAME.adapter) into rec and *a (the caller's). Unless
 * LS_DECODED, nothing is allocated. */
/* file read whole into *bytes (the caller frees) and *len. LS_INTERNAL
 * means out of memory; any other failure (cannot open, cannot read) is
 * LS_INVALID_REQUEST, and *bytes is NULL. */
static ls_status ls_state_read_whole(ls_state *s, const char *file, uint8_t **bytes, size_t *len) {
    *bytes = NULL;
    *len = 0;
    int fd = openat(s->dirfd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return LS_INVALID_REQUEST;
    ls_error err;
    ls_error_init(&err);
    ls_status st = ls_file_read_fd(fd, SIZE_MAX, bytes, len, file, LS_INVALID_REQUEST, &err);
    close(fd);
    ls_error_free(&err);
    return st;
}

static ls_state_decoded ls_state_decode(ls_state *s, const char *file, const char *want_name, ls_state_record *rec,
                                        ls_adapter *a, char *source, size_t source_len, char *name,
                                        size_t name_len) {
    memset(a, 0, sizeof *a);
    uint8_t *bytes = NULL;
    size_t len = 0;
    ls_error err;
    ls_error_init(&err);
    /* LS_INTERNAL from the reader and the parser means out of memory. */
    ls_status st = ls_state_read_whole(s, file, &bytes, &len);
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    if (st == LS_OK) st = ls_safetensors_parse(bytes, len, &set, &err);
    bool nomem = st == LS_INTERNAL, ok = st == LS_OK;
    ls_error_free(&err);
    const ls_tensor *factors = ok ? ls_tensor_set_find(&set, "factors") : NULL;
    const ls_tensor *flags = ok ? ls_tensor_set_find(&set, "layer_present") : NULL;
    const char *fmt = ok ? ls_tensor_set_meta(&set, "lorasink_state") : NULL, *nm = NULL, *sha = NULL, *src = NULL;
    uint64_t version = 0, rank = 0, outer = 0;
    ls_state_decoded params = LS_DECODE_BAD;
    ok = ok && factors && flags && fmt && !strcmp(fmt, LS_STATE_FORMAT) && factors->dtype == LS_DTYPE_F32 &&
         factors->ndim == 2 && flags->dtype == LS_DTYPE_U8 && flags->ndim == 1 && flags->shape[0] == factors->shape[0] &&
         factors->shape[0] >= 1 && factors->shape[1] >= 1 && (nm = ls_tensor_set_meta(&set, "name")) &&
         strlen(nm) < name_len && (!want_name || !strcmp(nm, want_name)) &&
         ls_state_meta_u64(&set, "version", &version) && version >= 1 && ls_state_meta_u64(&set, "rank", &rank) &&
         ls_state_meta_u64(&set, "outer", &outer) && rank >= 1 && rank <= INT32_MAX && outer >= 1 &&
         outer <= INT32_MAX && (sha = ls_tensor_set_meta(&set, "sha256")) && strlen(sha) == 64 &&
         (src = ls_tensor_set_meta(&set, "source")) && strlen(src) < source_len &&
         (params = ls_state_params_parse(ls_tensor_set_meta(&set, "params"), &rec->params)) == LS_DECODED &&
         ls_adapter_format_parse(ls_tensor_set_meta(&set, "format") ? ls_tensor_set_meta(&set, "format") : "",
                                 &a->meta.format);
    nomem |= params == LS_DECODE_NOMEM;
    json_error_t jerr;
    json_t *ignored = ok ? json_loads(ls_tensor_set_meta(&set, "ignored"), 0, &jerr) : NULL;
    nomem |= ok && !ignored && ls_state_json_nomem(&jerr);
    ok = ok && json_is_array(ignored);
    if (ok) {
        const size_t L = (size_t)factors->shape[0], lf = (size_t)factors->shape[1], n_ign = json_array_size(ignored);
        a->layers = (int)L;
        a->layer_floats = lf;
        a->meta.rank = (int)rank;
        a->meta.outer = (int)outer;
        const char *scale = ls_tensor_set_meta(&set, "scale");
        a->meta.scale = scale ? strtod(scale, NULL) : 1.0;
        a->data = malloc(L * lf * sizeof(float));
        a->layer_present = calloc(L, sizeof(bool));
        a->ignored = calloc(n_ign ? n_ign : 1, sizeof(char *));
        ok = a->data && a->layer_present && a->ignored;
        nomem = !ok;
        if (ok) {
            memcpy(a->data, factors->data, L * lf * sizeof(float));
            for (size_t l = 0; l < L; l++) a->layer_present[l] = ((const uint8_t *)flags->data)[l] != 0;
            for (size_t i = 0; ok && i < n_ign; i++) {
                const char *v = json_string_value(json_array_get(ignored, i));
                ok = v && (a->ignored[a->meta.n_ignored] = strdup(v));
                nomem = v && !ok;
                if (ok) a->meta.n_ignored++;
            }
        }
        if (ok) {
            /* A record whose factors do not give its digest is corrupt. */
            ls_adapter_digest(a->data, L * lf, a->meta.sha256);
            ok = !strcmp(a->meta.sha256, sha);
            a->meta.bytes = ls_adapter_host_bytes(a);
        }
        if (ok) {
            const char *pinned = ls_tensor_set_meta(&set, "pinned");
            rec->pinned = pinned && !strcmp(pinned, "true");
            /* Absent from records written before --auto-load existed. */
            const char *auto_loaded = ls_tensor_set_meta(&set, "auto_loaded");
            rec->auto_loaded = auto_loaded && !strcmp(auto_loaded, "true");
            rec->version = version;
            snprintf(name, name_len, "%s", nm);
            snprintf(source, source_len, "%s", src);
            rec->name = name;
            rec->source_path = *source ? source : NULL;
        }
    }
    json_decref(ignored);
    ls_tensor_set_free(&set);
    free(bytes);
    if (!ok) ls_adapter_free(a);
    return ok ? LS_DECODED : nomem ? LS_DECODE_NOMEM : LS_DECODE_BAD;
}

ls_status ls_state_read(ls_state *s, const char *name, uint64_t version, ls_adapter *out, ls_error *err) {
    char file[LS_STATE_MAX_NAME + 16], source[4096], nm[LS_STATE_MAX_NAME + 1];
    snprintf(file, sizeof file, "%s.adapter", name);
    ls_state_record rec = {0};
    ls_state_decoded d = ls_state_decode(s, file, name, &rec, out, source, sizeof source, nm, sizeof nm);
    if (d == LS_DECODE_NOMEM)
        return ls_error_set(err, LS_INTERNAL, NULL, "state directory: out of memory reading %s back", file);
    if (d != LS_DECODED)
        return ls_error_set(err, LS_INTERNAL, "the state directory was changed behind the server",
                            "state directory: %s cannot be read back", file);
    if (rec.version != version) {
        ls_adapter_free(out);
        return ls_error_set(err, LS_INTERNAL, NULL, "state directory: %s holds version %" PRIu64 ", not %" PRIu64,
                            file, rec.version, version);
    }
    return LS_OK;
}

/* ---- restore -------------------------------------------------------------- */

/* Moves file to DIR/corrupt/ (never deleted: an operator may want it). */
/* False when it could not be moved (it stays, and is skipped). The
 * sequence number keeps two files of one name set aside in the same
 * second apart. */
static bool ls_state_set_aside(ls_state *s, const char *file, const char *why) {
    mkdirat(s->dirfd, "corrupt", 0700);
    char dest[LS_STATE_MAX_NAME + 96];
    snprintf(dest, sizeof dest, "corrupt/%s.%lld.%lu", file, (long long)time(NULL), ++s->tmp_seq);
    if (renameat(s->dirfd, file, s->dirfd, dest) == 0) {
        fsync(s->dirfd);
        ls_log_error("state directory: %s %s; moved to %s/%s", file, why, s->dir, dest);
        return true;
    }
    ls_log_error("state directory: %s %s and cannot be moved aside; skipped", file, why);
    return false;
}

/* The version a tombstone or a floor file holds (a decimal >= 1 ending
 * the file or its first line, the file 64 bytes at most); false when it
 * is missing or holds no version. Reads into a buffer of its own:
 * nothing to allocate, so nothing to run out of. */
static bool ls_state_version_read(ls_state *s, const char *file, uint64_t *version) {
    char text[66];
    int fd = openat(s->dirfd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return false;
    size_t len = 0;
    for (ssize_t n; len < sizeof text - 1 && (n = read(fd, text + len, sizeof text - 1 - len)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        len += (size_t)n;
    }
    close(fd);
    if (len == 0 || len > 64) return false;
    text[len] = '\0';
    /* Digits only, and no overflow: strtoull would take "-1" (and any
     * number past 2^64 - 1) as 2^64 - 1, a version no name could go on
     * from. */
    if (text[0] < '0' || text[0] > '9') return false;
    char *end = NULL;
    errno = 0;
    uint64_t v = strtoull(text, &end, 10);
    if (errno || v < 1 || !end || (*end != '\n' && *end)) return false;
    *version = v;
    return true;
}

/* A crash between writing a new version of a deleted name and dropping
 * its tombstone leaves both: a tombstone older than the record restored
 * is removed (best effort: a leftover one is harmless, only untidy). */
static void ls_state_drop_outdated_tomb(ls_state *s, const char *name, uint64_t version) {
    char file[LS_STATE_MAX_NAME + 16];
    snprintf(file, sizeof file, "%s.deleted", name);
    uint64_t tomb = 0;
    if (!ls_state_version_read(s, file, &tomb) || tomb >= version) return;
    ls_error err;
    ls_error_init(&err);
    if (ls_state_remove(s, file, &err) != LS_OK) ls_log_warn("%s", err.message);
    ls_error_free(&err);
}

/* The version the header of file (NAME.adapter) gives, where it still
 * reads as a record of name; 0 when it does not. What breaks in a record
 * is mostly its factors (a digest that does not match, a file cut
 * short), and the header before them still says which version it was.
 * The file is read whole again, as the decode read it: only records that
 * failed to decode come here, rarely enough not to need a reader of
 * their own. LS_DECODE_NOMEM when memory ran out before it could tell
 * (which says nothing about the file). */
static ls_state_decoded ls_state_header_version(ls_state *s, const char *file, const char *name,
                                                uint64_t *version) {
    *version = 0;
    uint8_t *bytes = NULL;
    size_t len = 0;
    ls_status st = ls_state_read_whole(s, file, &bytes, &len);
    if (st != LS_OK) return st == LS_INTERNAL ? LS_DECODE_NOMEM : LS_DECODE_BAD;
    /* safetensors: the header's length (8 bytes, little-endian), then
     * the header, a JSON object whose __metadata__ holds what
     * ls_state_save put there. */
    uint64_t n = 0;
    for (int i = 0; len >= 8 && i < 8; i++) n |= (uint64_t)bytes[i] << (8 * i);
    const bool framed = len >= 8 && n >= 1 && n <= len - 8;
    json_error_t jerr;
    json_t *header = framed ? json_loadb((const char *)bytes + 8, (size_t)n, 0, &jerr) : NULL;
    const bool nomem = framed && !header && ls_state_json_nomem(&jerr);
    free(bytes);
    const json_t *m = json_object_get(header, "__metadata__");
    const char *fmt = json_string_value(json_object_get(m, "lorasink_state"));
    const char *nm = json_string_value(json_object_get(m, "name"));
    const char *v = json_string_value(json_object_get(m, "version"));
    uint64_t u = 0;
    if (fmt && !strcmp(fmt, LS_STATE_FORMAT) && nm && !strcmp(nm, name) && ls_state_u64_text(v, &u) && u >= 1)
        *version = u;
    json_decref(header);
    return nomem ? LS_DECODE_NOMEM : LS_DECODED;
}

/* A record set aside would take its name's versions with it: the next
 * upload of the name would start again at 1 (or after an older
 * tombstone). *lost comes in as the version its header gives (0: none)
 * and leaves as the highest version the record could have held, that or
 * the name's floor (0 when neither tells). That version becomes the
 * name's tombstone, which every later start reads as the name's lower
 * bound as it does a delete's, unless a tombstone says as much already;
 * tomb hears of it now. False when the disk refuses the tombstone: the
 * record then stays where it is, for the next start to try again. *wrote
 * says whether this call wrote the tombstone, *prev the one it replaced
 * (0: none), for the caller to put back if the record cannot be moved. */
static bool ls_state_keep_versions(ls_state *s, const char *name, uint64_t *lost, ls_state_tomb_fn tomb,
                                   void *ctx, bool *wrote, uint64_t *prev) {
    char file[LS_STATE_MAX_NAME + 16];
    snprintf(file, sizeof file, "%s.floor", name);
    uint64_t floor = 0, last = 0;
    *wrote = false;
    *prev = 0;
    if (ls_state_version_read(s, file, &floor) && floor > *lost) *lost = floor;
    if (!*lost) return true;
    snprintf(file, sizeof file, "%s.deleted", name);
    if (ls_state_version_read(s, file, &last) && last >= *lost) return true; /* tomb heard of it first */
    *prev = last;
    ls_error err;
    ls_error_init(&err);
    const bool kept = ls_state_write_version(s, file, *lost, &err) == LS_OK;
    *wrote = kept;
    if (!kept) ls_log_error("%s; %s.adapter, unreadable, is left in place", err.message, name);
    ls_error_free(&err);
    tomb(ctx, name, *lost);
    return kept;
}

static int ls_state_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The NAME of NAME.suffix when file is exactly that, else false. */
static bool ls_state_name_of(const char *file, const char *suffix, char *name, size_t len) {
    size_t fl = strlen(file), sl = strlen(suffix);
    if (fl <= sl || strcmp(file + fl - sl, suffix) || fl - sl > LS_STATE_MAX_NAME || fl - sl >= len) return false;
    memcpy(name, file, fl - sl);
    name[fl - sl] = '\0';
    return name[0] != '.';
}

ls_status ls_state_restore(ls_state *s, ls_state_restore_fn fn, ls_state_tomb_fn tomb, void *ctx, ls_error *err) {
    int fd = dup(s->dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return ls_state_fail(err, "cannot list", s->dir);
    }
    rewinddir(d);
    char **files = NULL;
    size_t n = 0, cap = 0;
    ls_status st = LS_OK;
    for (struct dirent *e; st == LS_OK && (e = readdir(d));) {
        if (!strncmp(e->d_name, ".tmp.", 5)) { /* a write a crash cut short */
            unlinkat(s->dirfd, e->d_name, 0);
            continue;
        }
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "corrupt")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **f = realloc(files, cap * sizeof *f);
            if (!f) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
            else files = f;
        }
        if (st == LS_OK && !(files[n++] = strdup(e->d_name))) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    }
    closedir(d);
    if (st == LS_OK && n) qsort(files, n, sizeof *files, ls_state_cmp); /* an empty directory: files is NULL */
    char name[LS_STATE_MAX_NAME + 1];
    /* Tombstones first: a record they outdate (a crash between the
     * tombstone and the removal) is the delete's to finish. */
    for (size_t i = 0; st == LS_OK && i < n; i++) {
        if (!ls_state_name_of(files[i], ".deleted", name, sizeof name)) continue;
        uint64_t v = 0;
        if (ls_state_version_read(s, files[i], &v)) tomb(ctx, name, v);
        else ls_state_set_aside(s, files[i], "is not a tombstone");
    }
    for (size_t i = 0; st == LS_OK && i < n; i++) {
        if (!ls_state_name_of(files[i], ".adapter", name, sizeof name)) continue;
        ls_state_record rec = {0};
        ls_adapter a;
        char source[4096], nm[LS_STATE_MAX_NAME + 1];
        ls_state_decoded d = ls_state_decode(s, files[i], name, &rec, &a, source, sizeof source, nm, sizeof nm);
        if (d == LS_DECODE_NOMEM) {
            st = ls_error_set(err, LS_INTERNAL, NULL, "state directory: out of memory reading %s", files[i]);
            break;
        }
        if (d != LS_DECODED) {
            /* Set aside, but not with its name's versions. */
            uint64_t lost = 0;
            if (ls_state_header_version(s, files[i], name, &lost) == LS_DECODE_NOMEM) {
                st = ls_error_set(err, LS_INTERNAL, NULL, "state directory: out of memory reading %s", files[i]);
                break;
            }
            bool wrote;
            uint64_t prev;
            if (!ls_state_keep_versions(s, name, &lost, tomb, ctx, &wrote, &prev)) continue;
            char why[LS_STATE_MAX_NAME + 128];
            if (lost)
                snprintf(why, sizeof why, "is truncated or corrupt (the name's versions go on after %" PRIu64 ")",
                         lost);
            else
                snprintf(why, sizeof why,
                         "is truncated or corrupt, and neither it nor %s.floor gives its version (the name's next "
                         "version may repeat one given before)",
                         name);
            if (!ls_state_set_aside(s, files[i], why) && wrote) {
                /* The record stays: a tombstone at its version would make
                 * a later start that reads it cleanly finish it as a
                 * delete. Put back what was there (best effort). */
                char tomb_file[LS_STATE_MAX_NAME + 16];
                snprintf(tomb_file, sizeof tomb_file, "%s.deleted", name);
                ls_error why_not;
                ls_error_init(&why_not);
                ls_status back = prev ? ls_state_write_version(s, tomb_file, prev, &why_not)
                                      : ls_state_remove(s, tomb_file, &why_not);
                if (back != LS_OK) ls_log_warn("%s", why_not.message);
                ls_error_free(&why_not);
            }
            continue;
        }
        rec.a = &a;
        st = fn(ctx, &rec, &a, err);
        ls_adapter_free(&a);
        if (st == LS_OK) ls_state_drop_outdated_tomb(s, name, rec.version);
    }
    for (size_t i = 0; i < n; i++) free(files[i]);
    free(files);
    return st;
}
