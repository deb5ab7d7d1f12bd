/* The state directory's writing side: opening it and holding its lock,
 * the bound on what reading takes, files written atomically (temporary
 * file, fsync, rename, fsync of the directory), records encoded as
 * safetensors, and the save and the delete, each ordered so that a step
 * the disk refuses leaves the disk saying what the caller is told
 * (docs/reliability.md has the table). Reading back and the restore scan
 * are lora/state_restore.c's. */
#include "lora/state.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/file.h"
#include "common/log.h"
#include "common/text.h"
#include "format/safetensors.h"
#include "lora/state_internal.h"

bool ls_state_file_name(char *out, size_t len, const char *name, const char *suffix) {
    /* The name rule is what keeps every file inside the directory (no
     * leading '.', so no "..", no hidden or temporary name): it is
     * enforced here, where every state file name is made, whatever the
     * caller checked. A tenant's TENANT/NAME is the file TENANT@NAME: no
     * name has an '@', so the two never meet. */
    const bool valid = name && ls_adapter_pool_name_valid(name);
    int n = valid ? snprintf(out, len, "%s%s", name, suffix) : -1;
    if (n < 0 || (size_t)n >= len) {
        if (len) out[0] = '\0';
        return false;
    }
    char *slash = strchr(out, '/');
    if (slash) *slash = LS_STATE_TENANT_SEP;
    return true;
}

ls_status ls_state_fail(ls_error *err, const char *what, const char *file) {
    char ebuf[128];
    /* A full disk or quota is the operator's to fix, and a client may
     * retry once it is: not a bug of ours (500). */
    const int e = errno;
    if (e == ENOSPC || e == EDQUOT)
        return ls_error_set(err, LS_INSUFFICIENT_STORAGE, NULL, "state directory: %s %s: %s", what, file,
                            strerror_r(e, ebuf, sizeof ebuf));
    /* Short of descriptors or memory: the disk is fine. */
    const char *hint = ls_file_errno_transient(e) && e != EIO
                           ? "the server is short of a resource now; retry, and check its limits (ulimit -n)"
                           : "check the disk of --state-dir (permissions, a read-only mount, errors in the kernel log)";
    return ls_error_set(err, LS_INTERNAL, hint, "state directory: %s %s: %s", what, file,
                        strerror_r(e, ebuf, sizeof ebuf));
}

/* ---- opening and the lock -------------------------------------------------- */

/* The pid a holder of DIR/.lock wrote there, as text ("" when none). */
static void ls_state_lock_holder(int fd, char *pid, size_t len) {
    char text[32];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    size_t k = 0;
    for (ssize_t i = 0; i < n && k + 1 < len && text[i] >= '0' && text[i] <= '9'; i++) pid[k++] = text[i];
    pid[k] = '\0';
}

/* Takes DIR/.lock for the state's life. Two servers on one directory
 * would each write what the other does not know of: one's delete takes
 * the other's acknowledged adapter at the next start. flock, so the lock
 * goes with the process however it ends; the pid in the file only names
 * the holder in the refusal. */
static ls_status ls_state_lock(ls_state *s, ls_error *err) {
    static const char hint[] = "give each server a --state-dir of its own, or stop the other one first";
    char ebuf[128];
    int fd = openat(s->dirfd, ".lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600);
    struct stat sb;
    /* -1: not a regular file (a FIFO, a directory: O_NONBLOCK kept the
     * open from waiting on a FIFO). */
    const int e = fd < 0 || fstat(fd, &sb) != 0 ? errno : S_ISREG(sb.st_mode) ? 0 : -1;
    if (e) {
        if (fd >= 0) close(fd);
        return ls_error_set(err, LS_INVALID_REQUEST, "give --state-dir a directory the server may write",
                            "cannot take the lock of the state directory %.200s: %s/.lock: %s", s->dir, s->dir,
                            e < 0 ? "not a regular file" : strerror_r(e, ebuf, sizeof ebuf));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        char pid[24];
        ls_state_lock_holder(fd, pid, sizeof pid);
        close(fd);
        if (e == EWOULDBLOCK)
            return ls_error_set(err, LS_INVALID_REQUEST, hint,
                                "the state directory %.200s is in use by another lorasink server (%s%s, which "
                                "holds %.200s/.lock); two servers on one state directory would undo each other's "
                                "changes",
                                s->dir, pid[0] ? "pid " : "pid unknown", pid, s->dir);
        return ls_error_set(err, LS_INVALID_REQUEST, "put --state-dir on a file system that supports flock",
                            "cannot lock the state directory %.200s (%s/.lock): %s", s->dir, s->dir,
                            strerror_r(e, ebuf, sizeof ebuf));
    }
    /* Only a name for the refusal above: a full disk must not stop a
     * start (a DELETE is what frees space). */
    char text[32];
    int n = snprintf(text, sizeof text, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n)
        ls_log_warn("state directory %s: cannot write this server's pid into .lock: %s (the lock holds)", s->dir,
                    strerror_r(errno, ebuf, sizeof ebuf));
    s->lockfd = fd;
    return LS_OK;
}

ls_status ls_state_open(const char *dir, ls_state **out, ls_error *err) {
    *out = NULL;
    char ebuf[128];
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return ls_error_set(err, LS_INVALID_REQUEST, "give --state-dir a directory the server may write",
                            "cannot create the state directory %.200s: %s", dir, strerror_r(errno, ebuf, sizeof ebuf));
    ls_state *s = calloc(1, sizeof *s);
    if (!s) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    s->lockfd = -1;
    s->corrupt_fd = -1;
    s->max_record = SIZE_MAX;
    s->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->dirfd < 0) {
        free(s);
        return ls_error_set(err, LS_INVALID_REQUEST, "give --state-dir a directory the server may write",
                            "cannot open the state directory %.200s: %s", dir, strerror_r(errno, ebuf, sizeof ebuf));
    }
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    ls_status st = ls_state_lock(s, err);
    if (st != LS_OK) {
        ls_state_close(s);
        return st;
    }
    *out = s;
    return LS_OK;
}

void ls_state_close(ls_state *s) {
    if (!s) return;
    if (s->corrupt_fd >= 0) close(s->corrupt_fd);
    if (s->lockfd >= 0) close(s->lockfd); /* lets the lock go; the file stays, so no two servers race on it */
    close(s->dirfd);
    free(s);
}

void ls_state_fit(ls_state *s, const ls_dims *d, const ls_pool_dims *pd) {
    const size_t L = (size_t)d->L, lf = ls_pool_layout(d, pd).total;
    /* factors (f32) and layer_present (u8) per layer; the header may be
     * as long as any safetensors header; 64 bytes of padding. */
    const size_t fixed = 8 + (size_t)LS_SAFETENSORS_MAX_HEADER + 64;
    s->fitted = true;
    s->dims = *d;
    s->dims.layer_ids = NULL;
    s->pd = *pd;
    s->max_record = SIZE_MAX;
    if (lf <= (SIZE_MAX - fixed) / 8 && (L == 0 || lf * 4 + 1 <= (SIZE_MAX - fixed) / L))
        s->max_record = fixed + L * (lf * 4 + 1);
}

/* ---- writing ------------------------------------------------------------- */

/* A step happened (file is done: "in place", "removed") and only the
 * sync of the directory after it failed: as far as anyone can read the
 * disk, the step stands. */
static ls_status ls_state_fail_unsynced(ls_error *err, const char *file, const char *done) {
    char ebuf[128];
    return ls_error_set(err, LS_INTERNAL, "check the disk of --state-dir",
                        "state directory: %s is %s, but the directory could not be synced after it: %s", file, done,
                        strerror_r(errno, ebuf, sizeof ebuf));
}

static bool ls_state_write_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = ENOSPC;
            return false;
        }
        p += w, len -= (size_t)w;
    }
    return true;
}

ls_status ls_state_stage(ls_state *s, const char *file, const void *data, size_t len, ls_state_staged *t,
                         ls_error *err) {
    snprintf(t->file, sizeof t->file, "%s", file);
    snprintf(t->tmp, sizeof t->tmp, ".tmp.%lu.%s", ++s->tmp_seq, file);
    int fd = openat(s->dirfd, t->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        const ls_status st = ls_state_fail(err, "cannot create", t->tmp);
        t->tmp[0] = '\0';
        return st;
    }
    /* Each failure sets err from errno at once, before the clean-up
     * changes it. */
    ls_status st = LS_OK;
    if (!ls_state_write_all(fd, data, len)) st = ls_state_fail(err, "cannot write", t->tmp);
    if (st == LS_OK && fsync(fd) != 0) st = ls_state_fail(err, "cannot sync", t->tmp);
    if (close(fd) != 0 && st == LS_OK) st = ls_state_fail(err, "cannot close", t->tmp);
    if (st != LS_OK) ls_state_unstage(s, t);
    return st;
}

void ls_state_unstage(ls_state *s, ls_state_staged *t) {
    if (t->tmp[0]) unlinkat(s->dirfd, t->tmp, 0);
    t->tmp[0] = '\0';
}

ls_status ls_state_place(ls_state *s, ls_state_staged *t, bool *placed, ls_error *err) {
    *placed = false;
    if (renameat(s->dirfd, t->tmp, s->dirfd, t->file) != 0) {
        const ls_status st = ls_state_fail(err, "cannot rename into place", t->file);
        ls_state_unstage(s, t);
        return st;
    }
    t->tmp[0] = '\0';
    *placed = true;
    if (fsync(s->dirfd) != 0) return ls_state_fail_unsynced(err, t->file, "in place");
    return LS_OK;
}

ls_status ls_state_write_atomic(ls_state *s, const char *file, const void *data, size_t len, bool *placed,
                                ls_error *err) {
    *placed = false;
    ls_state_staged t;
    ls_status st = ls_state_stage(s, file, data, len, &t, err);
    return st == LS_OK ? ls_state_place(s, &t, placed, err) : st;
}

ls_status ls_state_write_version(ls_state *s, const char *file, uint64_t version, bool *placed, ls_error *err) {
    char text[32];
    int n = snprintf(text, sizeof text, "%" PRIu64 "\n", version);
    return ls_state_write_atomic(s, file, text, (size_t)n, placed, err);
}

ls_status ls_state_remove(ls_state *s, const char *file, ls_error *err) {
    if (unlinkat(s->dirfd, file, 0) != 0) {
        if (errno == ENOENT) return LS_OK;
        return ls_state_fail(err, "cannot remove", file);
    }
    if (fsync(s->dirfd) != 0) return ls_state_fail(err, "cannot sync the directory after removing", file);
    return LS_OK;
}

int ls_state_open_file(const ls_state *s, const char *file, struct stat *sb) {
    /* What is not a regular file is not even opened (opening a device can
     * act on it); the fstat after the open catches one swapped in
     * between, and O_NONBLOCK keeps that open from waiting on a FIFO. */
    if (fstatat(s->dirfd, file, sb, AT_SYMLINK_NOFOLLOW) != 0) return -1;
    if (!S_ISREG(sb->st_mode)) {
        errno = 0;
        return -1;
    }
    int fd = openat(s->dirfd, file, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return -1;
    const int st = fstat(fd, sb), e = errno;
    if (st == 0 && S_ISREG(sb->st_mode)) return fd;
    close(fd);
    errno = st == 0 ? 0 : e;
    return -1;
}

bool ls_state_u64_text(const char *v, uint64_t *out) {
    /* Digits only: strtoull would take "-1" as 2^64 - 1. */
    if (!v || *v < '0' || *v > '9') return false;
    char *end;
    errno = 0;
    unsigned long long u = strtoull(v, &end, 10);
    if (errno || *end) return false;
    *out = u;
    return true;
}

/* Reads into a buffer of its own: nothing to allocate, so nothing to run
 * out of. */
bool ls_state_version_read(const ls_state *s, const char *file, uint64_t *version) {
    char text[LS_STATE_VERSION_FILE_MAX + 2];
    struct stat sb;
    int fd = ls_state_open_file(s, file, &sb);
    if (fd < 0) return false;
    size_t len = 0;
    if (sb.st_size <= LS_STATE_VERSION_FILE_MAX)
        for (ssize_t n; len < sizeof text - 1 && (n = read(fd, text + len, sizeof text - 1 - len)) != 0;) {
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) break;
            len += (size_t)n;
        }
    close(fd);
    if (len == 0 || len > LS_STATE_VERSION_FILE_MAX) return false;
    text[len] = '\0';
    /* The first line, digits only and no overflow: strtoull would take
     * "-1" (and any number past 2^64 - 1) as 2^64 - 1. */
    char *nl = memchr(text, '\n', len);
    if (nl) *nl = '\0';
    uint64_t v = 0;
    if (!ls_state_u64_text(text, &v) || v < 1 || v > LS_STATE_VERSION_MAX) return false;
    *version = v;
    return true;
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
    /* The per-module rules too: a reload from the source with the
     * parameters alone would lose rank_pattern and alpha_pattern. */
    return json_pack("{s:s, s:i, s:b, s:f, s:b, s:b, s:b, s:f, s:b, s:b, s:b, s:s, s:b, s:s}", "format",
                     ls_adapter_format_name(p->format), "r", p->r, "has_alpha", p->has_alpha, "lora_alpha",
                     p->lora_alpha, "has_rslora", p->has_rslora, "use_rslora", p->use_rslora, "has_scale",
                     p->has_scale, "scale", p->scale, "strict", p->strict, "whole_config", p->whole_config,
                     "has_order", p->has_order, "gate_up_order", ls_gate_up_order_name(p->gate_up_order),
                     "has_peft", p->has_peft, "peft", p->peft);
}

/* rec as the bytes of its NAME.adapter: *bytes (the caller frees) of *len. */
static ls_status ls_state_encode(const ls_state_record *rec, uint8_t **bytes, size_t *len, ls_error *err) {

    const ls_adapter *a = rec->a;
    const int64_t L = a->layers, lf = (int64_t)a->layer_floats;
    uint8_t *present = malloc((size_t)L ? (size_t)L : 1);
    json_t *params = ls_state_params_json(&rec->params), *ignored = json_array(), *warnings = json_array();
    for (size_t i = 0; ignored && i < a->meta.n_ignored; i++)
        if (json_array_append_new(ignored, json_string(a->ignored[i]))) { /* out of memory: no list, no record */
            json_decref(ignored);
            ignored = NULL;
        }
    /* The load's warnings, for GET after a restart. Only shown, never
     * read for meaning: one JSON cannot carry is left out, not the record. */
    for (int k = 0; warnings && k < LS_ADAPTER_WARNINGS; k++) {
        json_t *w = a->warnings[k][0] ? json_string(a->warnings[k]) : NULL;
        if (w && json_array_append_new(warnings, w)) {
            json_decref(warnings);
            warnings = NULL;
        }
    }
    char *params_text = ls_state_dump(params);
    char *ignored_text = ls_state_dump(ignored);
    char *warnings_text = ls_state_dump(warnings);
    json_decref(params);
    json_decref(ignored);
    json_decref(warnings);
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    ls_status st = LS_OK;
    if (!present || !params_text || !ignored_text || !warnings_text)
        st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
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
                  ls_tensor_set_add_meta(&set, "ignored", ignored_text) &&
                  ls_tensor_set_add_meta(&set, "warnings", warnings_text);
        if (!ok) st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory");
    }
    *bytes = NULL;
    *len = 0;
    if (st == LS_OK) st = ls_safetensors_write(&set, bytes, len, err);
    ls_tensor_set_free(&set);
    free(present);
    free(params_text);
    free(ignored_text);
    free(warnings_text);
    return st;
}

/* The three files of a name (which the name rule keeps short enough). */
typedef struct {
    char record[LS_STATE_MAX_NAME + 16], floor[LS_STATE_MAX_NAME + 16], tomb[LS_STATE_MAX_NAME + 16];
} ls_state_files;

/* False when name breaks the name rule (the files are then empty). */
static bool ls_state_files_of(const char *name, ls_state_files *f) {
    bool ok = ls_state_file_name(f->record, sizeof f->record, name, ".adapter");
    ok = ls_state_file_name(f->floor, sizeof f->floor, name, ".floor") && ok;
    return ls_state_file_name(f->tomb, sizeof f->tomb, name, ".deleted") && ok;
}

/* Names the files of name, or refuses a name that breaks the name rule
 * (the files would not stay inside the directory). */
static ls_status ls_state_name_files(const char *name, ls_state_files *f, ls_error *err) {
    if (ls_state_files_of(name, f)) return LS_OK;
    /* Not echoed: it may hold anything, a newline included. */
    return ls_error_set(err, LS_INVALID_REQUEST, NULL,
                        "state directory: an adapter name must be 1-128 letters, digits, '.', '_' or '-', not "
                        "starting with '.' (or TENANT/NAME), to name its files");
}

ls_status ls_state_save(ls_state *s, const ls_state_record *rec, bool *made, ls_error *err) {
    *made = false;
    ls_state_files f;
    ls_status st = ls_state_name_files(rec->name, &f, err);
    if (st != LS_OK) return st;
    if (rec->version < 1 || rec->version > LS_STATE_VERSION_MAX)
        return ls_error_set(err, LS_INTERNAL, NULL, "state directory: version %" PRIu64 " of '%s' is out of range",
                            rec->version, rec->name);
    uint8_t *bytes = NULL;
    size_t len = 0;
    st = ls_state_encode(rec, &bytes, &len, err);
    /* Every file the save writes is staged before the first rename, so
     * that a full disk fails it with nothing changed and no file left:
     * the record, and the floor unless it holds this version already. */
    uint64_t floor = 0;
    const bool floor_due = !ls_state_version_read(s, f.floor, &floor) || floor < rec->version;
    ls_state_staged rt = {0}, ft = {0};
    char text[32];
    const int n = snprintf(text, sizeof text, "%" PRIu64 "\n", rec->version);
    if (st == LS_OK) st = ls_state_stage(s, f.record, bytes, len, &rt, err);
    free(bytes);
    if (st == LS_OK && floor_due) st = ls_state_stage(s, f.floor, text, (size_t)n, &ft, err);
    /* The record's rename is the save. */
    if (st == LS_OK) st = ls_state_place(s, &rt, made, err);
    if (!*made) {
        ls_state_unstage(s, &rt);
        ls_state_unstage(s, &ft);
        return st;
    }
    /* The floor after the record, so that a crash between leaves it
     * behind (the record gives the version; the next start moves the
     * floor up), never ahead of a save that did not happen. */
    ls_error why;
    ls_error_init(&why);
    bool placed;
    if (floor_due && ls_state_place(s, &ft, &placed, &why) != LS_OK && !placed)
        ls_log_warn("%s (%s stays behind %s until the next start)", why.message, f.floor, f.record);
    ls_error_clear(&why);
    /* A tombstone of an older delete: the restore goes by the record
     * (newer), so one the disk keeps is only untidy. */
    if (st == LS_OK && ls_state_remove(s, f.tomb, &why) != LS_OK)
        ls_log_warn("%s (older than %s, which a restore goes by)", why.message, f.record);
    ls_error_free(&why);
    return st;
}

ls_status ls_state_forget(ls_state *s, const char *name, uint64_t version, bool *made, ls_error *err) {
    *made = false;
    ls_state_files f;
    ls_status st = ls_state_name_files(name, &f, err);
    if (st != LS_OK) return st;
    /* The floor keeps the name's versions once its record is gone. Every
     * save writes it after its record, and every start moves up one left
     * behind; only a crash between the two since the last start (or a
     * record saved before floors existed) leaves one to write now, the
     * one write of a delete that takes space. A floor at or above the
     * version deletes nothing, so a failure here changed nothing. */
    uint64_t floor = 0;
    bool placed;
    if (!ls_state_version_read(s, f.floor, &floor) || floor < version) {
        st = ls_state_write_version(s, f.floor, version, &placed, err);
        if (st != LS_OK) return st;
    }
    /* Removing the record is the delete, and it frees space: a full disk
     * can still delete. */
    if (unlinkat(s->dirfd, f.record, 0) != 0 && errno != ENOENT) return ls_state_fail(err, "cannot remove", f.record);
    *made = true;
    if (fsync(s->dirfd) != 0) return ls_state_fail_unsynced(err, f.record, "removed");
    /* The tombstone says what the floor says, for a server from before
     * floors kept a deleted name's versions (a downgrade); the removal
     * made room for it. */
    ls_error why;
    ls_error_init(&why);
    if (ls_state_write_version(s, f.tomb, version, &placed, &why) != LS_OK)
        ls_log_warn("%s (the delete holds: %s keeps the name's versions)", why.message, f.floor);
    ls_error_free(&why);
    return LS_OK;
}
