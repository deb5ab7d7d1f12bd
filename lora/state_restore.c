/* The state directory's reading side: a record decoded and checked as an
 * upload is (name rule, finite scale, versions that cannot wrap, its
 * digest), read back for the host tier, and the restore scan, which opens
 * nothing in a way that can block or follow a link, reads nothing larger
 * than a record could be, and moves what it cannot read aside instead of
 * stopping (keeping the versions it held). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/file.h"
#include "common/log.h"
#include "common/text.h"
#include "format/safetensors.h"
#include "lora/state_internal.h"

/* A file name as a log line may show it: bytes outside printable ASCII
 * as \xHH, so a name from the disk cannot split or paint a log line. */
static const char *ls_state_shown(const char *in, char *out, size_t len) {
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && k + 5 < len; p++) {
        if (*p >= 0x21 && *p <= 0x7e && *p != '\\') out[k++] = (char)*p;
        else k += (size_t)snprintf(out + k, len - k, "\\x%02x", *p);
    }
    out[k] = '\0';
    return out;
}

static bool ls_state_meta_u64(const ls_tensor_set *set, const char *key, uint64_t *out) {
    return ls_state_u64_text(ls_tensor_set_meta(set, key), out);
}

/* What reading a record gave: the record, a file that is not one, one
 * larger than any record this pool could hold (never read), or no memory
 * to tell, or a file that could not be read now (the disk failed, a
 * permission, no descriptor left); the last two say nothing about the
 * file: it must not be set aside for them. */
typedef enum { LS_DECODED, LS_DECODE_BAD, LS_DECODE_HUGE, LS_DECODE_NOMEM, LS_DECODE_IO } ls_state_decoded;

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
    /* Records written before gate_up_order (or the per-module rules)
     * existed lack their keys: they were loaded with the only order there
     * was, and without rules. */
    const char *format = NULL, *order = "gate_up", *peft = "";
    int r = 0, has_alpha = 0, has_rslora = 0, use_rslora = 0, has_scale = 0, strict = 0, whole = 0, has_order = 0;
    int has_peft = 0;
    double alpha = 0, scale = 0;
    ls_state_decoded d = LS_DECODED;
    if (json_unpack_ex(j, &jerr, 0, "{s:s, s:i, s:b, s:F, s:b, s:b, s:b, s:F, s:b, s:b, s?b, s?s, s?b, s?s}", "format",
                       &format, "r", &r, "has_alpha", &has_alpha, "lora_alpha", &alpha, "has_rslora", &has_rslora,
                       "use_rslora", &use_rslora, "has_scale", &has_scale, "scale", &scale, "strict", &strict,
                       "whole_config", &whole, "has_order", &has_order, "gate_up_order", &order, "has_peft",
                       &has_peft, "peft", &peft))
        d = json_error_code(&jerr) == json_error_out_of_memory ? LS_DECODE_NOMEM : LS_DECODE_BAD;
    else if (!ls_adapter_format_parse(format, &p->format) || !ls_gate_up_order_parse(order, &p->gate_up_order) ||
             !isfinite(alpha) || !isfinite(scale) || strlen(peft) >= sizeof p->peft)
        d = LS_DECODE_BAD;
    if (d == LS_DECODED) {
        p->r = r, p->has_alpha = has_alpha, p->lora_alpha = alpha, p->has_rslora = has_rslora;
        p->use_rslora = use_rslora, p->has_scale = has_scale, p->scale = scale, p->strict = strict;
        p->whole_config = whole, p->has_order = has_order, p->has_peft = has_peft;
        memcpy(p->peft, peft, strlen(peft) + 1);
    }
    json_decref(j);
    return d;
}

/* file read whole into *bytes (the caller frees) and *len when it is a
 * regular file no larger than a record of this pool could be; else why
 * (a short phrase for the log line) says what it is. */
static ls_state_decoded ls_state_read_record(const ls_state *s, const char *file, uint8_t **bytes, size_t *len,
                                             char *why, size_t why_len) {
    *bytes = NULL;
    *len = 0;
    char ebuf[128];
    struct stat sb;
    int fd = ls_state_open_file(s, file, &sb);
    const int e = fd < 0 ? errno : 0;
    if (fd < 0 && !e) snprintf(why, why_len, "is %s, not a record", ls_file_kind(sb.st_mode));
    else if (fd < 0) snprintf(why, why_len, "cannot be opened (%s)", strerror_r(e, ebuf, sizeof ebuf));
    /* Gone, or a link swapped in: not a record. Anything else is the
     * disk's or the process's, not the file's. */
    if (fd < 0) return !e || e == ENOENT || e == ELOOP ? LS_DECODE_BAD : LS_DECODE_IO;
    ls_state_decoded d = LS_DECODED;
    if ((uint64_t)sb.st_size > s->max_record) {
        snprintf(why, why_len, "is %lld bytes, more than any record this pool could hold (%zu)", (long long)sb.st_size,
                 s->max_record);
        d = LS_DECODE_HUGE;
    } else {
        ls_error err;
        ls_error_init(&err);
        ls_status st = ls_file_read_fd(fd, s->max_record, bytes, len, file, LS_INVALID_REQUEST, &err);
        const int read_errno = errno; /* with LS_INTERNAL, ENOMEM: a malloc failed; else the read's */
        ls_error_free(&err);
        if (st == LS_INTERNAL) snprintf(why, why_len, "cannot be read (%s)", strerror_r(read_errno, ebuf, sizeof ebuf));
        else snprintf(why, why_len, "cannot be read");
        d = st == LS_OK ? LS_DECODED
            : st != LS_INTERNAL ? LS_DECODE_BAD
            : read_errno == ENOMEM ? LS_DECODE_NOMEM
                                   : LS_DECODE_IO;
    }
    close(fd);
    return d;
}

/* The record's own checks beyond its framing: what an upload of it would
 * have had to pass (the name rule, a finite scale) and a version that
 * can go on. */
static bool ls_state_meta_ok(const ls_tensor_set *set, const char *want_name, size_t name_len, size_t source_len,
                             uint64_t *version, uint64_t *rank, uint64_t *outer, double *scale) {
    const char *nm = ls_tensor_set_meta(set, "name"), *sha = ls_tensor_set_meta(set, "sha256");
    const char *src = ls_tensor_set_meta(set, "source"), *sc = ls_tensor_set_meta(set, "scale");
    const char *fmt = ls_tensor_set_meta(set, "lorasink_state");
    /* Absent from no record this server wrote; 1 keeps the old reading. */
    char *end = NULL;
    *scale = sc ? strtod(sc, &end) : 1.0;
    return fmt && !strcmp(fmt, LS_STATE_FORMAT) && nm && strlen(nm) < name_len && ls_adapter_pool_name_valid(nm) &&
           (!want_name || !strcmp(nm, want_name)) && ls_state_meta_u64(set, "version", version) && *version >= 1 &&
           *version <= LS_STATE_VERSION_MAX && ls_state_meta_u64(set, "rank", rank) &&
           ls_state_meta_u64(set, "outer", outer) && *rank >= 1 && *rank <= INT32_MAX && *outer >= 1 &&
           *outer <= INT32_MAX && sha && strlen(sha) == 64 && src && strlen(src) < source_len &&
           (!sc || (end != sc && !*end)) && isfinite(*scale);
}

/* The adapter of a parsed record into *a (zeroed first): its factors
 * copied out of set, its ignored names, and its digest checked. */
static ls_state_decoded ls_state_fill(const ls_state *s, const ls_tensor_set *set, const json_t *ignored,
                                      uint64_t rank, uint64_t outer, double scale, ls_adapter *a) {
    const ls_tensor *factors = ls_tensor_set_find(set, "factors"), *flags = ls_tensor_set_find(set, "layer_present");
    const size_t L = (size_t)factors->shape[0], lf = (size_t)factors->shape[1], n_ign = json_array_size(ignored);
    a->layers = (int)L;
    a->layer_floats = lf;
    a->meta.rank = (int)rank;
    a->meta.outer = (int)outer;
    a->meta.scale = scale;
    /* H floats past the factor layout: the gate's delta (a gated model's). */
    a->meta.gate = s->dims.gate && rank <= INT32_MAX && outer <= INT32_MAX &&
                   lf == ls_adapter_layer_floats(&s->dims, (int)outer, (int)rank, true);
    a->data = malloc(L * lf * sizeof(float));
    a->layer_present = calloc(L, sizeof(bool));
    a->ignored = calloc(n_ign ? n_ign : 1, sizeof(char *));
    if (!a->data || !a->layer_present || !a->ignored) return LS_DECODE_NOMEM;
    memcpy(a->data, factors->data, L * lf * sizeof(float));
    for (size_t l = 0; l < L; l++) a->layer_present[l] = ((const uint8_t *)flags->data)[l] != 0;
    for (size_t i = 0; i < n_ign; i++) {
        const char *v = json_string_value(json_array_get(ignored, i));
        if (!v) return LS_DECODE_BAD;
        if (!(a->ignored[a->meta.n_ignored] = strdup(v))) return LS_DECODE_NOMEM;
        a->meta.n_ignored++;
    }
    /* A record whose factors do not give its digest is corrupt. */
    ls_adapter_digest(a->data, L * lf, a->meta.sha256);
    if (strcmp(a->meta.sha256, ls_tensor_set_meta(set, "sha256"))) return LS_DECODE_BAD;
    a->meta.bytes = ls_adapter_host_bytes(a);
    return LS_DECODED;
}

/* The load's warnings a record keeps (a JSON array of their texts;
 * absent from records written before they were kept: none). They are
 * only shown: whatever of them cannot be read (more than this version
 * has kinds, a non-string, bad JSON) is left out, never the adapter. */
static ls_state_decoded ls_state_warnings(const char *text, ls_adapter *a) {
    json_error_t jerr;
    json_t *w = text ? json_loads(text, 0, &jerr) : NULL;
    if (text && !w && ls_state_json_nomem(&jerr)) return LS_DECODE_NOMEM;
    int k = 0;
    for (size_t i = 0; json_is_array(w) && i < json_array_size(w) && k < LS_ADAPTER_WARNINGS; i++) {
        const char *v = json_string_value(json_array_get(w, i));
        if (v && v[0]) snprintf(a->warnings[k++], sizeof a->warnings[0], "%s", v);
    }
    for (int j = 0; j < k; j++) ls_text_utf8_repair(a->warnings[j]); /* a cut string of a long one */
    json_decref(w);
    return LS_DECODED;
}

/* A record of file (NAME.adapter) into rec and *a (the caller's), with
 * rec's strings in name and source. Unless LS_DECODED, nothing is
 * allocated, and why says what the file is. */
static ls_state_decoded ls_state_decode(const ls_state *s, const char *file, const char *want_name,
                                        ls_state_record *rec, ls_adapter *a, char *source, size_t source_len,
                                        char *name, size_t name_len, char *why, size_t why_len) {
    memset(a, 0, sizeof *a);
    uint8_t *bytes = NULL;
    size_t len = 0;
    ls_state_decoded d = ls_state_read_record(s, file, &bytes, &len, why, why_len);
    if (d != LS_DECODED) return d;
    snprintf(why, why_len, "is truncated or corrupt");
    ls_error err;
    ls_error_init(&err);
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    /* LS_INTERNAL from the parser means out of memory. A record holds
     * two tensors: a header of more is refused from its count, before a
     * hostile one's entries take memory. */
    ls_status st = ls_safetensors_parse_max(bytes, len, 2, &set, &err);
    ls_error_free(&err);
    d = st == LS_OK ? LS_DECODED : st == LS_INTERNAL ? LS_DECODE_NOMEM : LS_DECODE_BAD;
    const ls_tensor *factors = ls_tensor_set_find(&set, "factors"), *flags = ls_tensor_set_find(&set, "layer_present");
    uint64_t version = 0, rank = 0, outer = 0;
    double scale = 0;
    const char *format = ls_tensor_set_meta(&set, "format");
    if (d == LS_DECODED &&
        !(factors && flags && factors->dtype == LS_DTYPE_F32 && factors->ndim == 2 && flags->dtype == LS_DTYPE_U8 &&
          flags->ndim == 1 && flags->shape[0] == factors->shape[0] && factors->shape[0] >= 1 &&
          factors->shape[0] <= INT32_MAX && factors->shape[1] >= 1 &&
          ls_state_meta_ok(&set, want_name, name_len, source_len, &version, &rank, &outer, &scale) &&
          ls_adapter_format_parse(format ? format : "", &a->meta.format)))
        d = LS_DECODE_BAD;
    if (d == LS_DECODED) d = ls_state_params_parse(ls_tensor_set_meta(&set, "params"), &rec->params);
    json_error_t jerr;
    json_t *ignored = d == LS_DECODED ? json_loads(ls_tensor_set_meta(&set, "ignored"), 0, &jerr) : NULL;
    if (d == LS_DECODED && !ignored) d = ls_state_json_nomem(&jerr) ? LS_DECODE_NOMEM : LS_DECODE_BAD;
    if (d == LS_DECODED && !json_is_array(ignored)) d = LS_DECODE_BAD;
    if (d == LS_DECODED) d = ls_state_fill(s, &set, ignored, rank, outer, scale, a);
    if (d == LS_DECODED) d = ls_state_warnings(ls_tensor_set_meta(&set, "warnings"), a);
    if (d == LS_DECODED) {
        const char *pinned = ls_tensor_set_meta(&set, "pinned");
        rec->pinned = pinned && !strcmp(pinned, "true");
        /* Absent from records written before --auto-load existed. */
        const char *auto_loaded = ls_tensor_set_meta(&set, "auto_loaded");
        rec->auto_loaded = auto_loaded && !strcmp(auto_loaded, "true");
        rec->version = version;
        snprintf(name, name_len, "%s", ls_tensor_set_meta(&set, "name"));
        snprintf(source, source_len, "%s", ls_tensor_set_meta(&set, "source"));
        rec->name = name;
        rec->source_path = *source ? source : NULL;
    }
    json_decref(ignored);
    ls_tensor_set_free(&set);
    free(bytes);
    if (d != LS_DECODED) ls_adapter_free(a);
    return d;
}

ls_status ls_state_read(ls_state *s, const char *name, uint64_t version, ls_adapter *out, ls_error *err) {
    char file[LS_STATE_MAX_NAME + 16], source[4096], nm[LS_STATE_MAX_NAME + 1], why[160];
    if (!ls_adapter_pool_name_valid(name) || !ls_state_file_name(file, sizeof file, name, ".adapter"))
        return ls_error_set(err, LS_INTERNAL, NULL, "state directory: no record can be named by that adapter name");
    ls_state_record rec = {0};
    ls_state_decoded d =
        ls_state_decode(s, file, name, &rec, out, source, sizeof source, nm, sizeof nm, why, sizeof why);
    if (d == LS_DECODE_NOMEM)
        return ls_error_set(err, LS_INTERNAL, NULL, "state directory: out of memory reading %s back", file);
    if (d == LS_DECODE_IO)
        return ls_error_set(err, LS_INTERNAL,
                            "retry; check the disk of --state-dir (errors in the kernel log) and the server's limits "
                            "(ulimit -n)",
                            "state directory: %s cannot be read back now: it %s", file, why);
    if (d != LS_DECODED)
        return ls_error_set(err, LS_INTERNAL, "the state directory was changed behind the server",
                            "state directory: %s cannot be read back: it %s", file, why);
    if (rec.version != version) {
        ls_adapter_free(out);
        return ls_error_set(err, LS_INTERNAL, "the state directory was changed behind the server",
                            "state directory: %s holds version %" PRIu64 ", not %" PRIu64, file, rec.version, version);
    }
    return LS_OK;
}

/* ---- restore -------------------------------------------------------------- */

/* DIR/corrupt, made if needed and opened once, never through a link: -1
 * when it is not a directory (a link, a file): then nothing is moved,
 * and one log line says why. */
static int ls_state_corrupt_dir(ls_state *s) {
    if (s->corrupt_fd != -1) return s->corrupt_fd;
    if (mkdirat(s->dirfd, "corrupt", 0700) == 0) fsync(s->dirfd);
    int fd = openat(s->dirfd, "corrupt", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        char ebuf[128];
        const int e = errno;
        ls_log_error("state directory: %s/corrupt is not a directory (%s): files that cannot be read stay where "
                     "they are; move it away so that the next start can set them aside",
                     s->dir,
                     e == ELOOP || e == ENOTDIR ? "a symbolic link or a file" : strerror_r(e, ebuf, sizeof ebuf));
        s->corrupt_fd = -2;
    } else {
        s->corrupt_fd = fd;
    }
    return s->corrupt_fd;
}

/* Moves file to DIR/corrupt/ (never deleted: an operator may want it).
 * False when it could not be moved (it stays, and is skipped). The
 * sequence number keeps two files of one name set aside in the same
 * second apart. */
static bool ls_state_set_aside(ls_state *s, const char *file, const char *why) {
    const int cfd = ls_state_corrupt_dir(s);
    char dest[300], shown[4 * 256 + 8];
    snprintf(dest, sizeof dest, "%s.%lld.%lu", file, (long long)time(NULL), ++s->tmp_seq);
    ls_state_shown(file, shown, sizeof shown);
    if (cfd >= 0 && renameat(s->dirfd, file, cfd, dest) == 0) {
        fsync(cfd);
        fsync(s->dirfd);
        char shown_dest[4 * 300 + 8];
        ls_log_error("state directory: %s %s; moved to %s/corrupt/%s", shown, why, s->dir,
                     ls_state_shown(dest, shown_dest, sizeof shown_dest));
        return true;
    }
    ls_log_error("state directory: %s %s and cannot be moved aside; skipped", shown, why);
    return false;
}

/* After a record of version was restored, what a crash in its save
 * (or a disk that refused a step of it) left untidy, best effort: a
 * tombstone older than the record is removed (a leftover one is
 * harmless), and a floor behind it (the crash came between the record
 * and its floor, or the record is from before floors) is moved up, so
 * the versions outlive the record however it ends. */
static void ls_state_tidy(ls_state *s, const char *name, uint64_t version) {
    char file[LS_STATE_MAX_NAME + 16];
    ls_error err;
    ls_error_init(&err);
    uint64_t v = 0;
    bool placed;
    ls_state_file_name(file, sizeof file, name, ".deleted");
    if (ls_state_version_read(s, file, &v) && v < version && ls_state_remove(s, file, &err) != LS_OK)
        ls_log_warn("%s", err.message);
    ls_error_clear(&err);
    ls_state_file_name(file, sizeof file, name, ".floor");
    if ((!ls_state_version_read(s, file, &v) || v < version) &&
        ls_state_write_version(s, file, version, &placed, &err) != LS_OK)
        ls_log_warn("%s", err.message);
    ls_error_free(&err);
}

/* What the header of a record file still says. */
typedef struct {
    uint64_t version;             /* 0: none (not a record of the name) */
    int64_t layers, layer_floats; /* the shape of its factors (0: none) */
    uint64_t rank, outer;
} ls_state_header;

/* Whether a record of this header's shape is one the pool could hold
 * (its check of an adapter's shape): then a file larger than any such
 * record is not one of another shape but a damaged one. */
static bool ls_state_fits(const ls_state *s, const ls_state_header *h) {
    const ls_dims *d = &s->dims;
    if (!s->fitted || h->layers != d->L || h->rank < 1 || h->rank > (uint64_t)s->pd.max_rank) return false;
    const bool outer_ok = h->outer == 1 || (h->outer == (uint64_t)d->n && s->pd.layout == LS_LORA_PER_EXPERT);
    const uint64_t lf = (uint64_t)h->layer_floats;
    return outer_ok && (lf == ls_adapter_layer_floats(d, (int)h->outer, (int)h->rank, false) ||
                        (d->gate && lf == ls_adapter_layer_floats(d, (int)h->outer, (int)h->rank, true)));
}

/* The header alone of file (a regular file): its length, then at most
 * LS_SAFETENSORS_MAX_HEADER bytes, never the data after it; *json NULL
 * when it does not frame as safetensors. LS_DECODE_NOMEM when memory
 * ran out before it could tell. */
static ls_state_decoded ls_state_header_json(const ls_state *s, const char *file, json_t **json) {
    *json = NULL;
    struct stat sb;
    int fd = ls_state_open_file(s, file, &sb);
    if (fd < 0) return LS_DECODE_BAD;
    uint8_t head[8];
    uint64_t n = 0;
    const bool sized = sb.st_size >= 8 && pread(fd, head, 8, 0) == 8;
    for (int i = 0; sized && i < 8; i++) n |= (uint64_t)head[i] << (8 * i);
    const bool framed = sized && n >= 1 && n <= LS_SAFETENSORS_MAX_HEADER && n <= (uint64_t)sb.st_size - 8;
    char *text = framed ? malloc((size_t)n) : NULL;
    size_t got = 0;
    while (text && got < n) {
        ssize_t r = pread(fd, text + got, (size_t)n - got, (off_t)(8 + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (framed && !text) return LS_DECODE_NOMEM;
    json_error_t jerr;
    *json = text && got == n ? json_loadb(text, (size_t)n, 0, &jerr) : NULL;
    const bool nomem = text && got == n && !*json && ls_state_json_nomem(&jerr);
    free(text);
    return nomem ? LS_DECODE_NOMEM : LS_DECODED;
}

/* What the header of file (NAME.adapter) gives, where it still reads as
 * a record of name. What breaks in a record is mostly its factors (a
 * digest that does not match, a file cut short), and the header before
 * them still says which version it was. */
static ls_state_decoded ls_state_header_read(const ls_state *s, const char *file, const char *name,
                                             ls_state_header *h) {
    memset(h, 0, sizeof *h);
    json_t *header = NULL;
    ls_state_decoded d = ls_state_header_json(s, file, &header);
    const json_t *m = json_object_get(header, "__metadata__");
    const char *fmt = json_string_value(json_object_get(m, "lorasink_state"));
    const char *nm = json_string_value(json_object_get(m, "name"));
    uint64_t u = 0;
    if (fmt && !strcmp(fmt, LS_STATE_FORMAT) && nm && !strcmp(nm, name) &&
        ls_state_u64_text(json_string_value(json_object_get(m, "version")), &u) && u >= 1 &&
        u <= LS_STATE_VERSION_MAX) {
        h->version = u;
        if (!ls_state_u64_text(json_string_value(json_object_get(m, "rank")), &h->rank)) h->rank = 0;
        if (!ls_state_u64_text(json_string_value(json_object_get(m, "outer")), &h->outer)) h->outer = 0;
        const json_t *shape = json_object_get(json_object_get(header, "factors"), "shape");
        if (json_array_size(shape) == 2) {
            h->layers = json_integer_value(json_array_get(shape, 0));
            h->layer_floats = json_integer_value(json_array_get(shape, 1));
        }
    }
    json_decref(header);
    return d;
}

/* Puts back the tombstone a set-aside wrote (prev 0: none was there), for
 * a record that stays: a tombstone at its version would make a later
 * start that reads it cleanly finish it as a delete. Best effort. */
static void ls_state_tomb_back(ls_state *s, const char *name, uint64_t prev) {
    char file[LS_STATE_MAX_NAME + 16];
    ls_state_file_name(file, sizeof file, name, ".deleted");
    ls_error why;
    ls_error_init(&why);
    bool placed;
    ls_status st = prev ? ls_state_write_version(s, file, prev, &placed, &why) : ls_state_remove(s, file, &why);
    if (st != LS_OK) ls_log_warn("%s", why.message);
    ls_error_free(&why);
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
    ls_state_file_name(file, sizeof file, name, ".floor");
    uint64_t floor = 0, last = 0;
    *wrote = false;
    *prev = 0;
    if (ls_state_version_read(s, file, &floor) && floor > *lost) *lost = floor;
    if (!*lost) return true;
    ls_state_file_name(file, sizeof file, name, ".deleted");
    if (ls_state_version_read(s, file, &last) && last >= *lost) return true; /* tomb heard of it first */
    *prev = last;
    ls_error err;
    ls_error_init(&err);
    bool placed = false;
    const bool kept = ls_state_write_version(s, file, *lost, &placed, &err) == LS_OK;
    *wrote = kept;
    if (!kept) ls_log_error("%s; %s.adapter, unreadable, is left in place", err.message, name);
    ls_error_free(&err);
    if (!kept && placed) ls_state_tomb_back(s, name, last);
    tomb(ctx, name, *lost);
    return kept;
}

static int ls_state_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The NAME of NAME.suffix (any bytes: the name rule is checked apart)
 * when file ends in suffix and NAME fits name[len], else false; a
 * tenant's file TENANT@NAME is the name TENANT/NAME. */
static bool ls_state_name_of(const char *file, const char *suffix, char *name, size_t len) {
    size_t fl = strlen(file), sl = strlen(suffix);
    if (fl <= sl || strcmp(file + fl - sl, suffix) || fl - sl >= len) return false;
    memcpy(name, file, fl - sl);
    name[fl - sl] = '\0';
    char *sep = strchr(name, LS_STATE_TENANT_SEP);
    if (sep) *sep = '/';
    return true;
}

static bool ls_state_listed(char *const *files, size_t n, const char *file) {
    return n && bsearch(&file, files, n, sizeof *files, ls_state_cmp);
}

/* The directory's entries in name order (*files and its strings the
 * caller's), without dot files (.lock) and corrupt/; temporary files a
 * crash cut short are removed. */
static ls_status ls_state_list(ls_state *s, char ***files, size_t *count, ls_error *err) {
    *files = NULL;
    *count = 0;
    int fd = dup(s->dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return ls_state_fail(err, "cannot list", s->dir);
    }
    rewinddir(d);
    char **v = NULL;
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
            char **grown = realloc(v, cap * sizeof *grown);
            if (!grown) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
            else v = grown;
        }
        if (st == LS_OK && !(v[n++] = strdup(e->d_name))) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    }
    closedir(d);
    if (st == LS_OK && n) qsort(v, n, sizeof *v, ls_state_cmp); /* an empty directory: v is NULL */
    if (st == LS_OK) {
        *files = v;
        *count = n;
        return LS_OK;
    }
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
    return st;
}

/* Every NAME.deleted and NAME.floor: the versions of deleted names. A
 * floor counts for a name without a record (a delete removes the record
 * and keeps the floor); beside a record it is read only when the record
 * cannot be. Tombstones come before records: a record they outdate (a
 * crash between an old server's tombstone and its removal of the record)
 * is the delete's to finish. */
static void ls_state_restore_versions(ls_state *s, char *const *files, size_t n, ls_state_tomb_fn tomb, void *ctx) {
    for (size_t i = 0; i < n; i++) {
        char name[256];
        const bool is_tomb = ls_state_name_of(files[i], ".deleted", name, sizeof name);
        if (!is_tomb && !ls_state_name_of(files[i], ".floor", name, sizeof name)) continue;
        uint64_t v = 0, t = 0;
        if (!ls_adapter_pool_name_valid(name)) {
            ls_state_set_aside(s, files[i], "is not named by the adapter name rule");
        } else if (!ls_state_version_read(s, files[i], &v)) {
            ls_state_set_aside(s, files[i], is_tomb ? "is not a tombstone" : "is not a floor");
        } else if (is_tomb) {
            tomb(ctx, name, v);
        } else {
            char record[LS_STATE_MAX_NAME + 16], tomb_file[LS_STATE_MAX_NAME + 16];
            ls_state_file_name(record, sizeof record, name, ".adapter");
            ls_state_file_name(tomb_file, sizeof tomb_file, name, ".deleted");
            if (!ls_state_listed(files, n, record) && (!ls_state_version_read(s, tomb_file, &t) || t < v))
                tomb(ctx, name, v);
        }
    }
}

/* A record that did not decode (d, why): kept in place when it is one of
 * another shape too large to read, else set aside with its versions. */
static ls_status ls_state_set_aside_record(ls_state *s, const char *file, const char *name, ls_state_decoded d,
                                           const char *why, ls_state_tomb_fn tomb, void *ctx, ls_error *err) {
    ls_state_header h;
    if (ls_state_header_read(s, file, name, &h) == LS_DECODE_NOMEM)
        return ls_error_set(err, LS_INTERNAL, NULL, "state directory: out of memory reading %s", file);
    if (d == LS_DECODE_HUGE && h.version && !ls_state_fits(s, &h)) {
        /* Saved for another model or pool shape (a larger --max-rank, say):
         * kept on disk for a server that fits it and skipped here, its
         * version taken, as ls_pool_restore does with one that reads. */
        ls_log_error("state directory: %s %s: version %" PRIu64 " for another model or pool shape (factors [%" PRId64
                     ", %" PRId64 "]); kept for a server that fits it, not restored",
                     file, why, h.version, h.layers, h.layer_floats);
        tomb(ctx, name, h.version);
        return LS_OK;
    }
    uint64_t lost = h.version, prev;
    bool wrote;
    if (!ls_state_keep_versions(s, name, &lost, tomb, ctx, &wrote, &prev)) return LS_OK;
    char text[LS_STATE_MAX_NAME + 320];
    if (lost)
        snprintf(text, sizeof text, "%s (the name's versions go on after %" PRIu64 ")", why, lost);
    else
        snprintf(text, sizeof text,
                 "%s, and neither it nor %s.floor gives its version (the name's next version may repeat one given "
                 "before)",
                 why, name);
    if (!ls_state_set_aside(s, file, text) && wrote) ls_state_tomb_back(s, name, prev);
    return LS_OK;
}

/* One NAME.adapter: to fn when it reads, else set aside (or kept). */
static ls_status ls_state_restore_record(ls_state *s, const char *file, const char *name, ls_state_restore_fn fn,
                                         ls_state_tomb_fn tomb, void *ctx, ls_error *err) {
    if (!ls_adapter_pool_name_valid(name)) {
        /* No upload can use the name: there are no versions to keep. */
        s->unrestored++;
        ls_state_set_aside(s, file, "is not named by the adapter name rule");
        return LS_OK;
    }
    ls_state_record rec = {0};
    ls_adapter a;
    char source[4096], nm[LS_STATE_MAX_NAME + 1], why[160];
    ls_state_decoded d =
        ls_state_decode(s, file, name, &rec, &a, source, sizeof source, nm, sizeof nm, why, sizeof why);
    if (d == LS_DECODE_NOMEM)
        return ls_error_set(err, LS_INTERNAL, NULL, "state directory: out of memory reading %s", file);
    if (d == LS_DECODE_IO)
        /* Setting it aside would drop an acknowledged adapter for a
         * failure of the disk or the process, not of the file. */
        return ls_error_set(err, LS_INTERNAL,
                            "check the disk of --state-dir (errors in the kernel log), its permissions and the "
                            "server's limits (ulimit -n); to start without this adapter, move the file out of the "
                            "directory",
                            "state directory: %s %s", file, why);
    if (d != LS_DECODED) {
        s->unrestored++;
        return ls_state_set_aside_record(s, file, name, d, why, tomb, ctx, err);
    }
    rec.a = &a;
    ls_status st = fn(ctx, &rec, &a, err);
    ls_adapter_free(&a);
    if (st == LS_OK) ls_state_tidy(s, name, rec.version);
    return st;
}

int ls_state_unrestored(const ls_state *s) { return s ? s->unrestored : 0; }

void ls_state_note_unrestored(ls_state *s) { s->unrestored++; }

ls_status ls_state_restore(ls_state *s, ls_state_restore_fn fn, ls_state_tomb_fn tomb, void *ctx, ls_error *err) {
    char **files = NULL;
    size_t n = 0;
    ls_status st = ls_state_list(s, &files, &n, err);
    if (st == LS_OK) ls_state_restore_versions(s, files, n, tomb, ctx);
    for (size_t i = 0; st == LS_OK && i < n; i++) {
        char name[256];
        if (ls_state_name_of(files[i], ".adapter", name, sizeof name))
            st = ls_state_restore_record(s, files[i], name, fn, tomb, ctx, err);
    }
    for (size_t i = 0; i < n; i++) free(files[i]);
    free(files);
    /* corrupt/ is only written at restore. */
    if (s->corrupt_fd >= 0) close(s->corrupt_fd);
    s->corrupt_fd = -1;
    return st;
}
