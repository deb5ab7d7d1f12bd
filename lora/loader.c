/* Adapter sources to normalised adapters: paths opened beneath the
 * adapter directory's descriptor, PEFT directories and .safetensors files
 * checked from their size and header and then read whole, failures of a
 * file remembered by its identity, the merge of stated over own
 * parameters, normalisation. */
#include "lora/loader.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/file.h"
#include "format/safetensors.h"
#include "lora/adapter_config.h"
#include "lora/loader_absent.h"
#include "common/hub.h"
#include "common/text.h"
#include "lora/loader_memo.h"

/* adapter_config.json is small; anything larger is not one. */
#define LS_LOADER_CONFIG_MAX (1u << 20)

/* An absolute dir without repeated or final slashes into out ("" when
 * relative or too long): clients send paths under the directory as the
 * operator named it, which through a link or a mount is not its real
 * path. The open stays beneath the directory's descriptor either way. */
static void ls_loader_spelled(const char *dir, char *out, size_t len) {
    out[0] = '\0';
    if (dir[0] != '/' || strlen(dir) >= len) return;
    size_t n = 0;
    for (const char *c = dir; *c; c++)
        if (!(*c == '/' && n && out[n - 1] == '/')) out[n++] = *c;
    while (n > 1 && out[n - 1] == '/') n--;
    out[n] = '\0';
}

/* The part of path beneath prefix (a directory, no final slash), or NULL
 * when path is not beneath it. */
static const char *ls_loader_beneath(const char *path, const char *prefix) {
    if (!prefix[0]) return NULL;
    if (!strcmp(prefix, "/")) return path + 1;
    size_t pl = strlen(prefix);
    if (strncmp(path, prefix, pl) || (path[pl] != '/' && path[pl] != '\0')) return NULL;
    return path + pl;
}

ls_status ls_loader_open(ls_loader *ld, const char *adapter_dir, const ls_dims *dims, const ls_pool_dims *pool,
                         ls_error *err) {
    memset(ld, 0, sizeof *ld);
    ld->dirfd = -1;
    ld->dims = *dims;
    ld->pool = *pool;
    const char *dir = adapter_dir && *adapter_dir ? adapter_dir : ".";
    char ebuf[128];
    int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return ls_error_set(err, LS_INVALID_REQUEST, "give --adapter-dir an existing directory",
                            "the adapter directory %s cannot be opened: %s", ls_text_tail(dir).s,
                            strerror_r(errno, ebuf, sizeof ebuf));
    char real[PATH_MAX];
    if (!realpath(dir, real) || strlen(real) >= sizeof ld->root) {
        close(fd);
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "the adapter directory %s cannot be resolved", ls_text_tail(dir).s);
    }
    /* Clients name files beneath it: at / that is every file of the
     * machine (a server started from / without --adapter-dir). */
    if (!strcmp(real, "/")) {
        close(fd);
        return ls_error_set(err, LS_INVALID_REQUEST,
                            "give --adapter-dir the directory that holds the adapters (an empty one when every "
                            "upload sends its tensors)",
                            "the adapter directory is / (%s): a client's path could name any file of the machine",
                            adapter_dir && *adapter_dir ? "--adapter-dir" : "the working directory, as --adapter-dir "
                                                                            "was not given");
    }
    snprintf(ld->root, sizeof ld->root, "%s", real);
    ls_loader_spelled(dir, ld->given, sizeof ld->given);
    if (!(ld->memo = ls_loader_memo_create())) {
        close(fd);
        return ls_error_set(err, LS_INTERNAL, NULL, "out of memory opening the adapter directory");
    }
    ld->dirfd = fd;
    ld->max_file_bytes = (size_t)LS_LOADER_MAX_FILE_MB_DEFAULT << 20;
    ld->memo_settle_ms = LS_LOADER_MEMO_SETTLE_MS;
    return LS_OK;
}

void ls_loader_close(ls_loader *ld) {
    if (ld->dirfd >= 0) close(ld->dirfd);
    ld->dirfd = -1;
    ls_loader_memo_free(ld->memo);
    ld->memo = NULL;
}

unsigned long long ls_loader_file_reads(const ls_loader *ld) { return ld->memo ? ls_loader_memo_reads(ld->memo) : 0; }

ls_status ls_loader_relative(const ls_loader *ld, const char *path, char *out, size_t out_len, ls_error *err) {
    const char *rel = path;
    if (path[0] == '/') {
        rel = ls_loader_beneath(path, ld->root);
        if (!rel) rel = ls_loader_beneath(path, ld->given);
        if (!rel)
            return ls_error_set(err, LS_INVALID_REQUEST, "paths are taken relative to --adapter-dir",
                                "path \"%s\" is not beneath the adapter directory", ls_text_tail(path).s);
        while (*rel == '/') rel++;
    }
    if (!*path || strlen(rel) >= out_len)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "the adapter path must be 1 to %zu bytes", out_len - 1);
    snprintf(out, out_len, "%s", *rel ? rel : ".");
    return LS_OK;
}

/* The hint for a link that leads out of the adapter directory. A Hugging
 * Face hub cache snapshot's files are links to ../../blobs/<hash>: with
 * the snapshot itself as --adapter-dir they always lead out. Only a name
 * within dirfd (no '/') is read: a client's path never leads the server
 * to read a link outside the adapter directory. */
static const char *ls_loader_out_hint(int dirfd, const char *name) {
    char target[64];
    ssize_t n = dirfd >= 0 && name && *name && !strchr(name, '/') ? readlinkat(dirfd, name, target, sizeof target - 1)
                                                                  : -1;
    if (n > 0) target[n] = '\0';
    if (n > 0 && !strncmp(target, "../../blobs/", 12))
        return "this is a Hugging Face hub cache snapshot, whose files link to ../../blobs: give --adapter-dir the "
               "hub cache (e.g. ~/.cache/huggingface/hub) or a directory above it, or download with --local-dir";
    return "adapters must live under --adapter-dir (no '..' above it, no links out; a link within a path stays in "
           "its top-level directory)";
}

/* Sets err for a failed open of name in dirfd (errno as the open left
 * it), naming the client's path (shown), never the server's; *absent
 * (when given) is set when it does not exist. Returns -1. */
static int ls_loader_open_fail(int dirfd, const char *name, const char *shown, bool *absent, ls_error *err) {
    char ebuf[128];
    if (errno == EXDEV || errno == ELOOP)
        ls_error_set(err, LS_INVALID_REQUEST, ls_loader_out_hint(dirfd, name),
                     "path \"%s\" leads out of the adapter directory", ls_text_tail(shown).s);
    else if (errno == ESTALE)
        /* A rename raced the open (or an NFS handle went stale): the
         * request is right and a retry may pass, so neither 400 nor a
         * failure to remember. */
        ls_error_set(err, LS_INTERNAL, "retry once the directory stays put",
                     "path \"%s\" was moved or replaced while it was opened", ls_text_tail(shown).s);
    else if (errno == ENOENT || errno == ENOTDIR) {
        if (absent) *absent = true;
        ls_error_set(err, LS_INVALID_REQUEST,
                     ls_hub_repo_id(shown) ? "paths are taken relative to --adapter-dir; a Hugging Face repo "
                                             "id is found there only in a hub cache (models--ORG--NAME), never "
                                             "downloaded"
                                           : "paths are taken relative to --adapter-dir",
                     "path \"%s\" does not exist in the adapter directory", ls_text_tail(shown).s);
    } else if (errno == EAGAIN || errno == EINTR)
        /* The kernel asked for a retry (a rename or mount raced the
         * lookup) more times than the open tried. */
        ls_error_set(err, LS_INTERNAL, "retry: the adapter directory was changing while the path was resolved",
                     "path \"%s\" cannot be opened now: %s", ls_text_tail(shown).s,
                     strerror_r(errno, ebuf, sizeof ebuf));
    else if (ls_file_errno_transient(errno))
        /* The server ran short (descriptors, memory) or the disk failed:
         * nothing the client can fix in its path, and nothing to remember
         * against the file. */
        ls_error_set(err, LS_INTERNAL, "the server is short of a resource now; retry, and check its limits (ulimit -n)",
                     "path \"%s\" cannot be opened now: %s", ls_text_tail(shown).s,
                     strerror_r(errno, ebuf, sizeof ebuf));
    else if (errno == EACCES || errno == EPERM) {
        /* Nothing in the request is wrong: the file's owner or mode
         * keeps the server out (files fetched as root in a container). */
        const int e = errno;
        char hint[256];
        snprintf(hint, sizeof hint,
                 "the server runs as uid %u, which may not read it: give that user read access to the file and "
                 "search (x) access to every directory above it",
                 (unsigned)geteuid());
        ls_error_set(err, LS_INVALID_REQUEST, hint, "path \"%s\" cannot be opened: %s", ls_text_tail(shown).s,
                     strerror_r(e, ebuf, sizeof ebuf));
    } else
        ls_error_set(err, LS_INVALID_REQUEST, NULL, "path \"%s\" cannot be opened: %s", ls_text_tail(shown).s,
                     strerror_r(errno, ebuf, sizeof ebuf));
    return -1;
}

/* The open flags of a file of the adapter tree: never a controlling
 * terminal, never a wait on a FIFO; O_PATH alone as openat2 takes it
 * (it refuses O_PATH with other open flags). */
static int ls_loader_flags(int flags) { return flags & O_PATH ? flags : flags | O_NOCTTY | O_NONBLOCK; }

/* Opens rel beneath dirfd (a directory of the adapter tree), or -1 with
 * err set as ls_loader_open_fail says. */
static int ls_loader_open_at(int dirfd, const char *rel, const char *shown, int flags, bool *absent, ls_error *err) {
    int fd = ls_file_open_beneath(dirfd, rel, ls_loader_flags(flags));
    return fd >= 0 ? fd : ls_loader_open_fail(dirfd, rel, shown, absent, err);
}

/* The top-level directory a path lies in: its first component, opened
 * beneath the adapter directory without following a link. A link the
 * loader follows itself (below) never leads out of it, so it never
 * leads into another top-level directory (another tenant's); with
 * ld->scoped the whole path resolves beneath it. fd is -1 for a path of
 * one component (or one whose first component cannot be opened so). */
typedef struct {
    int fd;
    const char *name; /* its name in the path (after any leading "./"), first bytes long */
    size_t first;    /* bytes of its name, the path's first component */
    size_t len;      /* bytes of the path it takes, its '/' included */
    const char *rel; /* the rest of the path: beneath fd */
    int why;         /* with fd -1 for a path of more components: ENOENT, or EXDEV (a link, "..") */
} ls_loader_top;

static ls_loader_top ls_loader_top_open(const ls_loader *ld, const char *rel) {
    ls_loader_top t = {.fd = -1, .name = rel, .first = 0, .len = 0, .rel = rel, .why = 0};
    const char *start = rel; /* "./a/b" is "a/b" */
    while (start[0] == '.' && start[1] == '/') {
        start += 2;
        while (*start == '/') start++;
    }
    const char *slash = strchr(start, '/');
    if (!slash) return t;
    t.why = EXDEV;
    if (slash == start || slash - start >= 256) return t;
    char first[256];
    snprintf(first, sizeof first, "%.*s", (int)(slash - start), start);
    if (!strcmp(first, "..")) return t;
    /* Scoped, the directory itself may not be a link (a tenant's
     * TENANT/ pointing at another's); else a link to a directory beneath
     * the adapter directory is that directory, as the open below takes it. */
    t.fd = ld->scoped ? ls_file_open_beneath_nolinks(ld->dirfd, first, O_PATH | O_DIRECTORY)
                      : ls_file_open_beneath(ld->dirfd, first, O_PATH | O_DIRECTORY);
    if (t.fd < 0) {
        t.why = errno == ENOENT || errno == ENOTDIR ? errno : EXDEV;
        return t;
    }
    t.why = 0;
    t.name = start;
    t.first = (size_t)(slash - start);
    t.len = (size_t)(slash - rel) + 1;
    while (rel[t.len] == '/') t.len++;
    t.rel = rel + t.len;
    return t;
}

static void ls_loader_top_close(ls_loader_top *t) {
    if (t->fd >= 0) close(t->fd);
    t->fd = -1;
}

static bool ls_loader_same_inode(int a_fd, int b_fd) {
    struct stat a, b;
    return fstat(a_fd, &a) == 0 && fstat(b_fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Whether the file fd, opened as path beneath top.fd by following the
 * link name in dir_fd (which read target), is what that link names now:
 * the link reads the same, dir_fd is still what dir names beneath
 * top.fd, and path still resolves to fd's file. Nothing outside the
 * top-level directory is looked at (the kernel never follows the link
 * itself here). */
static bool ls_loader_link_stays(const ls_loader_top *top, int dir_fd, const char *dir, const char *name,
                                 const char *target, const char *path, int fd) {
    char again[LS_LOADER_PATH_MAX];
    const ssize_t n = readlinkat(dir_fd, name, again, sizeof again);
    if (n < 0 || (size_t)n != strlen(target) || memcmp(again, target, (size_t)n)) return false;
    int at = ls_file_open_beneath(top->fd, dir, O_PATH | O_DIRECTORY);
    int now = ls_file_open_beneath(top->fd, path, O_PATH);
    const bool same = at >= 0 && now >= 0 && ls_loader_same_inode(at, dir_fd) && ls_loader_same_inode(now, fd);
    if (at >= 0) close(at);
    if (now >= 0) close(now);
    return same;
}

/* name, a link in the directory dir_fd (dir: its path beneath top.fd)
 * that leads out of dir_fd, followed when it stays in the top-level
 * directory: a hub cache snapshot's files link to the repository's
 * ../../blobs. The target is opened as dir/target beneath top.fd (an
 * absolute one made relative when it lies in the same top-level
 * directory), then must be the file the held directory's link names now,
 * so a rename meanwhile cannot pair this directory with another's file.
 * -1 with errno (EXDEV: not in it; ESTALE: replaced) otherwise. */
static int ls_loader_open_link(const ls_loader *ld, const ls_loader_top *top, int dir_fd, const char *dir,
                               const char *name, int flags, char *resolved, size_t resolved_len) {
    char target[LS_LOADER_PATH_MAX], path[2 * LS_LOADER_PATH_MAX + 2];
    ssize_t n = top->fd >= 0 ? readlinkat(dir_fd, name, target, sizeof target) : -1;
    if (n <= 0 || (size_t)n >= sizeof target) {
        errno = EXDEV;
        return -1;
    }
    target[n] = '\0';
    if (target[0] == '/') {
        const char *inside = ls_loader_beneath(target, ld->root);
        if (!inside) inside = ls_loader_beneath(target, ld->given);
        while (inside && *inside == '/') inside++;
        /* The same top-level directory as the path: its first component. */
        if (!inside || strncmp(inside, top->name, top->first) || inside[top->first] != '/') {
            errno = EXDEV;
            return -1;
        }
        inside += top->first;
        while (*inside == '/') inside++;
        snprintf(path, sizeof path, "%s", *inside ? inside : ".");
    } else {
        snprintf(path, sizeof path, "%s/%s", dir, target);
    }
    int fd = ls_file_open_beneath(top->fd, path, ls_loader_flags(flags));
    if (fd < 0) return -1;
    if (resolved && resolved_len) { /* a longer one opened no file: the kernel's limit is shorter */
        size_t n = strlen(path) < resolved_len ? strlen(path) : resolved_len - 1;
        memcpy(resolved, path, n);
        resolved[n] = '\0';
    }
    if (!ls_loader_link_stays(top, dir_fd, dir, name, target, path, fd)) {
        close(fd);
        errno = ESTALE;
        return -1;
    }
    return fd;
}

/* The part of path (a directory of the path rel) beneath top.fd: "."
 * for the top-level directory itself. */
static const char *ls_loader_in_top(const ls_loader_top *top, const char *dir) {
    return strlen(dir) > top->len ? dir + top->len : ".";
}

/* Opens name, a file of the PEFT directory dir_fd (dir: where it is
 * beneath top.fd), following a link out of dir_fd that stays in the
 * top-level directory; -1 with err set otherwise. */
static int ls_loader_open_in(const ls_loader *ld, const ls_loader_top *top, int dir_fd, const char *dir,
                             const char *name, const char *shown, bool *absent, ls_error *err) {
    int fd = ls_file_open_beneath(dir_fd, name, ls_loader_flags(O_RDONLY));
    if (fd < 0 && (errno == EXDEV || errno == ELOOP) && top->fd >= 0)
        fd = ls_loader_open_link(ld, top, dir_fd, dir, name, O_RDONLY, NULL, 0);
    return fd >= 0 ? fd : ls_loader_open_fail(dir_fd, name, shown, absent, err);
}

/* Opens rel (a PEFT directory or a file) with flags (O_RDONLY or
 * O_PATH) beneath the adapter directory, or with ld->scoped beneath its
 * top-level directory; a final link with an absolute target in the same
 * top-level directory is followed as well (the kernel refuses those
 * beneath a directory), read from its parent opened beneath it. in_top
 * gets the path beneath top.fd; -1 with errno otherwise. */
static int ls_loader_resolve(const ls_loader *ld, const ls_loader_top *top, const char *rel, int flags, char *in_top,
                             size_t in_top_len) {
    snprintf(in_top, in_top_len, "%s", top->fd >= 0 && *top->rel ? top->rel : ".");
    const bool scoped = ld->scoped && top->fd >= 0;
    if (ld->scoped && top->why) { /* its top-level directory is a link, "..", or none */
        errno = top->why;
        return -1;
    }
    int fd = ls_file_open_beneath(scoped ? top->fd : ld->dirfd, scoped ? top->rel : rel, ls_loader_flags(flags));
    if (fd < 0 && (errno == EXDEV || errno == ELOOP) && top->fd >= 0) {
        char parent[LS_LOADER_PATH_MAX];
        const char *slash = strrchr(top->rel, '/');
        snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - top->rel) : 1, slash ? top->rel : ".");
        int pfd = ls_file_open_beneath(top->fd, parent, O_PATH | O_DIRECTORY);
        if (pfd >= 0) {
            fd = ls_loader_open_link(ld, top, pfd, parent, slash ? slash + 1 : top->rel, flags, in_top, in_top_len);
            const int saved = errno;
            close(pfd);
            errno = saved;
        } else {
            errno = EXDEV;
        }
    }
    return fd;
}

/* ls_loader_resolve for reading, -1 with err set. */
static int ls_loader_open_path(const ls_loader *ld, const ls_loader_top *top, const char *rel, char *in_top,
                               size_t in_top_len, bool *absent, ls_error *err) {
    int fd = ls_loader_resolve(ld, top, rel, O_RDONLY, in_top, in_top_len);
    if (fd >= 0) return fd;
    /* A one-component path's own link may be read for its hint (a path
     * with a top-level directory has a '/': no link read). */
    return ls_loader_open_fail(strchr(rel, '/') ? -1 : ld->dirfd, rel, rel, absent, err);
}

int ls_loader_stat(const ls_loader *ld, const char *rel, struct stat *st) {
    ls_loader_top top = ls_loader_top_open(ld, rel);
    char in_top[LS_LOADER_PATH_MAX];
    int fd = ls_loader_resolve(ld, &top, rel, O_PATH, in_top, sizeof in_top);
    int rc = fd >= 0 ? fstat(fd, st) : -1;
    const int saved = errno;
    if (fd >= 0) close(fd);
    ls_loader_top_close(&top);
    errno = saved;
    return rc;
}

/* Opens name (a file of the PEFT directory dir_fd, dir where it is
 * beneath top.fd) and fstats it into sb. */
static int ls_loader_open_file(const ls_loader *ld, const ls_loader_top *top, int dir_fd, const char *dir,
                               const char *name, const char *shown, struct stat *sb, ls_error *err) {
    int fd = ls_loader_open_in(ld, top, dir_fd, dir, name, shown, NULL, err);
    if (fd >= 0 && fstat(fd, sb) != 0) {
        close(fd);
        ls_error_set(err, LS_INVALID_REQUEST, NULL, "path \"%s\" cannot be read", ls_text_tail(shown).s);
        return -1;
    }
    return fd;
}

/* Reads a PEFT directory's adapter_config.json (fd) into own. */
static ls_status ls_loader_read_config(int fd, const char *shown, ls_adapter_params *own, ls_error *err) {
    uint8_t *text = NULL;
    size_t tlen = 0;
    ls_status st = ls_file_read_fd(fd, LS_LOADER_CONFIG_MAX, &text, &tlen, shown, LS_ADAPTER_CONFIG_INVALID, err);
    if (st != LS_OK) return st;
    char *nul = realloc(text, tlen + 1); /* as text: NUL-terminated */
    if (nul) {
        nul[tlen] = '\0';
        text = (uint8_t *)nul;
        st = ls_adapter_config_parse_text(nul, own, err);
    } else {
        st = ls_error_set(err, LS_INTERNAL, NULL, "out of memory reading %s", shown);
    }
    free(text);
    return st;
}

/* Reads exactly len bytes of fd at off into buf; false on a short read
 * (the file was cut meanwhile) or an error, with err set. */
static bool ls_loader_pread(int fd, uint8_t *buf, size_t len, off_t off, const char *shown, ls_error *err) {
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, buf + got, len - got, off + (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            /* The disk failed: nothing to fix in the file's name, nothing
             * to remember against it. */
            char ebuf[128];
            ls_error_set(err, LS_INTERNAL, "the adapter file could not be read now; retry, and check the disk",
                         "cannot read %s: %s", shown, strerror_r(errno, ebuf, sizeof ebuf));
            return false;
        }
        if (r == 0) {
            ls_error_set(err, LS_INVALID_REQUEST, NULL, "cannot read %s: it was cut short while read", shown);
            return false;
        }
        got += (size_t)r;
    }
    return true;
}

/* A safetensors file checked before its data is read: its size against
 * the cap (from fstat, before any read), then its header (length field,
 * JSON, offsets against the size). A file that fails either is never read
 * whole. */
static ls_status ls_loader_check_file(const ls_loader *ld, int fd, const struct stat *sb, const char *shown,
                                      ls_error *err) {
    if (!S_ISREG(sb->st_mode)) return ls_error_set(err, LS_INVALID_REQUEST, NULL, "%s is not a regular file", shown);
    const uint64_t size = (uint64_t)sb->st_size;
    if (size > ld->max_file_bytes)
        return ls_error_set(err, LS_PAYLOAD_TOO_LARGE,
                            "raise --max-adapter-mb, or give an adapter that holds fewer factors",
                            "adapter file %s is %.1f MiB, over the limit of %zu MiB (--max-adapter-mb)", ls_text_tail(shown).s,
                            (double)size / 1048576.0, ld->max_file_bytes >> 20);
    ls_loader_memo_count_read(ld->memo);
    uint8_t first[8];
    const size_t n_first = size < sizeof first ? (size_t)size : sizeof first;
    size_t n = 0;
    if (!ls_loader_pread(fd, first, n_first, 0, shown, err)) return err->code;
    ls_status st = ls_safetensors_header_len(first, size, &n, err);
    if (st != LS_OK) return st;
    uint8_t *head = malloc(8 + n);
    if (!head) return ls_error_set(err, LS_INTERNAL, NULL, "out of memory for the %zu-byte header of %s", n, shown);
    if (ls_loader_pread(fd, head, 8 + n, 0, shown, err)) st = ls_safetensors_check_header(head, 8 + n, size, LS_LOADER_MAX_TENSORS, err);
    else st = err->code;
    free(head);
    return st;
}

/* A path opened: the descriptors of its safetensors file and (PEFT
 * directory) of its config, and what identifies them. */
typedef struct {
    int dir_fd, model_fd, config_fd;
    bool peft_dir;
    struct stat model_sb;
    ls_loader_print print;
    char shown[LS_LOADER_PATH_MAX + 64]; /* the safetensors file, as messages name it */
    ls_loader_top top;                   /* the path's top-level directory (owned) */
    char in_top[LS_LOADER_PATH_MAX];     /* where the opened path is beneath top.fd (a link followed: its target) */
} ls_loader_files;

static void ls_loader_files_close(ls_loader_files *f) {
    if (f->model_fd >= 0 && f->model_fd != f->dir_fd) close(f->model_fd);
    if (f->config_fd >= 0) close(f->config_fd);
    if (f->dir_fd >= 0) close(f->dir_fd);
    f->dir_fd = f->model_fd = f->config_fd = -1;
    ls_loader_top_close(&f->top);
}

/* A file named adapter_model.safetensors beside an adapter_config.json
 * is a PEFT directory's model named by its file: that config is read as
 * the directory's would be (the file's own __metadata__ then is not), so
 * the path to the file and the path to its directory load the same
 * adapter. Without a config beside it, it is a bare file. */
static ls_status ls_loader_sibling_config(const ls_loader *ld, const char *rel, ls_loader_files *f,
                                          ls_adapter_params *own, ls_error *err) {
    const char *slash = strrchr(rel, '/');
    if (strcmp(slash ? slash + 1 : rel, "adapter_model.safetensors")) return LS_OK;
    char parent[LS_LOADER_PATH_MAX], cfg_shown[LS_LOADER_PATH_MAX + 64];
    snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - rel) : 1, slash ? rel : ".");
    snprintf(cfg_shown, sizeof cfg_shown, "%s/adapter_config.json", slash ? parent : ".");
    /* The config is opened beneath the directory the model was opened
     * in: once that directory is open it is checked to hold that model,
     * so a rename meanwhile cannot pair the model with another config. */
    const bool scoped = ld->scoped && f->top.fd >= 0;
    const int at = scoped ? f->top.fd : ld->dirfd;
    const char *in_top = ls_loader_in_top(&f->top, parent);
    int dir = ls_loader_open_at(at, scoped ? in_top : parent, parent, O_RDONLY | O_DIRECTORY, NULL, err);
    if (dir < 0) return err->code;
    /* Once dir is open, the path resolves again as the model was opened
     * (links followed as far as that open followed them), and the parent
     * again to dir: a rename meanwhile leads to another file. */
    char again[LS_LOADER_PATH_MAX];
    int model = ls_loader_resolve(ld, &f->top, rel, O_PATH, again, sizeof again);
    int dir_now = ls_file_open_beneath(at, scoped ? in_top : parent, O_PATH | O_DIRECTORY);
    struct stat now;
    const bool same = model >= 0 && dir_now >= 0 && fstat(model, &now) == 0 && now.st_dev == f->model_sb.st_dev &&
                      now.st_ino == f->model_sb.st_ino && ls_loader_same_inode(dir_now, dir);
    if (model >= 0) close(model);
    if (dir_now >= 0) close(dir_now);
    if (!same) {
        close(dir);
        return ls_error_set(err, LS_INTERNAL, "retry once the directory stays put",
                            "path \"%s\" was moved or replaced while it was opened", ls_text_tail(rel).s);
    }
    bool absent = false;
    ls_error quiet;
    ls_error_init(&quiet);
    int fd = ls_loader_open_in(ld, &f->top, dir, in_top, "adapter_config.json", cfg_shown, &absent, &quiet);
    if (fd < 0 && !absent) ls_error_set(err, quiet.code, quiet.hint, "%s", quiet.message);
    ls_error_free(&quiet);
    if (fd < 0) {
        close(dir);
        return absent ? LS_OK : err->code;
    }
    close(dir);
    struct stat cfg_sb;
    if (fstat(fd, &cfg_sb) != 0) {
        close(fd);
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "path \"%s\" cannot be read", ls_text_tail(cfg_shown).s);
    }
    f->config_fd = fd;
    f->peft_dir = true; /* the config wins over the file's __metadata__ */
    ls_loader_print_set(&f->print, 1, &cfg_sb);
    ls_status st = ls_loader_read_config(fd, cfg_shown, own, err);
    own->format = LS_ADAPTER_FORMAT_PEFT;
    return st;
}

/* Opens rel beneath the adapter directory: a bare file, or a PEFT
 * directory whose two files are opened beneath the directory just opened
 * (so a directory swapped after that cannot redirect them). The config
 * is read here, before the safetensors file is opened, so a bad config
 * is named first as it always was. */
static ls_status ls_loader_open_files(const ls_loader *ld, const char *rel, ls_loader_files *f,
                                      ls_adapter_params *own, bool *absent, ls_error *err) {
    memset(f, 0, sizeof *f);
    f->dir_fd = f->model_fd = f->config_fd = -1;
    f->top = ls_loader_top_open(ld, rel);
    f->dir_fd = ls_loader_open_path(ld, &f->top, rel, f->in_top, sizeof f->in_top, absent, err);
    if (f->dir_fd < 0) return err->code;
    struct stat sb;
    if (fstat(f->dir_fd, &sb) != 0)
        return ls_error_set(err, LS_INVALID_REQUEST, NULL, "path \"%s\" cannot be read", ls_text_tail(rel).s);
    f->peft_dir = S_ISDIR(sb.st_mode);
    const char *slash = strrchr(rel, '/'), *base = slash ? slash + 1 : rel;
    if (!f->peft_dir && !strcmp(base, "adapter_config.json")) {
        /* Read as safetensors it would fail on its "header length". */
        char hint[512];
        snprintf(hint, sizeof hint, "give the path of its directory%s%.*s%s: the loader reads both files from there",
                 slash ? ", \"" : "", slash ? (int)(slash - rel) : 0, rel, slash ? "\"" : "");
        return ls_error_set(err, LS_INVALID_REQUEST, hint,
                            "path \"%s\" is a PEFT directory's adapter_config.json, not an adapter file",
                            ls_text_tail(rel).s);
    }
    if (!f->peft_dir) {
        snprintf(f->shown, sizeof f->shown, "%s", rel);
        f->model_fd = f->dir_fd;
        f->model_sb = sb;
        ls_loader_print_set(&f->print, 0, &sb);
        return ls_loader_sibling_config(ld, rel, f, own, err);
    }
    char cfg_shown[LS_LOADER_PATH_MAX + 64];
    snprintf(cfg_shown, sizeof cfg_shown, "%s/adapter_config.json", rel);
    struct stat cfg_sb;
    if (ls_loader_explain_no_config(f->dir_fd, rel, err)) return err->code;
    f->config_fd = ls_loader_open_file(ld, &f->top, f->dir_fd, f->in_top, "adapter_config.json", cfg_shown, &cfg_sb, err);
    if (f->config_fd < 0) return err->code;
    ls_status st = ls_loader_read_config(f->config_fd, cfg_shown, own, err);
    own->format = LS_ADAPTER_FORMAT_PEFT;
    if (st != LS_OK) return st;
    snprintf(f->shown, sizeof f->shown, "%s/adapter_model.safetensors", rel);
    if (ls_loader_explain_no_model(f->dir_fd, rel, err)) return err->code;
    f->model_fd = ls_loader_open_file(ld, &f->top, f->dir_fd, f->in_top, "adapter_model.safetensors", f->shown,
                                      &f->model_sb, err);
    if (f->model_fd < 0) return err->code;
    ls_loader_print_set(&f->print, 0, &f->model_sb);
    ls_loader_print_set(&f->print, 1, &cfg_sb);
    return LS_OK;
}

/* Reads the opened safetensors file (checked first: size, header) whole
 * into *bytes and parses it into tensors (borrowing from *bytes, the
 * caller's to free after them), with what a bare file says of itself. */
static ls_status ls_loader_read(const ls_loader *ld, ls_loader_files *f, ls_adapter_params *own,
                                ls_tensor_set *tensors, uint8_t **bytes, ls_error *err) {
    *bytes = NULL;
    size_t len = 0;
    ls_status st = ls_loader_check_file(ld, f->model_fd, &f->model_sb, f->shown, err);
    if (st == LS_OK) st = ls_file_read_fd(f->model_fd, ld->max_file_bytes, bytes, &len, f->shown, LS_INVALID_REQUEST, err);
    if (st == LS_OK) st = ls_safetensors_parse_max(*bytes, len, LS_LOADER_MAX_TENSORS, tensors, err);
    /* A PEFT directory's config wins; a bare file carries its own. */
    if (st == LS_OK && !f->peft_dir) {
        ls_adapter_text_params t = ls_adapter_text_params_meta(tensors, "the file's __metadata__");
        st = ls_adapter_params_from_text(&t, own, err);
        if (st == LS_OK) st = ls_adapter_params_rules_from_meta(tensors, "the file's __metadata__", own, err);
    }
    if (st != LS_OK) {
        ls_tensor_set_free(tensors);
        free(*bytes);
        *bytes = NULL;
    }
    return st;
}

/* Whether a failure is the file's own, to be answered again without
 * reading the file until it changes: what it holds, its size or what
 * it is (ls_status_is_input), and only when its files were the same
 * after the read as before it and had not changed for a while. A file
 * written now (as cp writes over one) may be read half written, and a
 * write within the clock tick of the last one leaves its times as they
 * were: that failure is not the file's. A server short of memory or
 * descriptors may pass. */
static bool ls_loader_memorable(const ls_loader *ld, const ls_loader_files *f, ls_status st) {
    if (!ls_status_is_input(st)) return false;
    ls_loader_print after;
    memset(&after, 0, sizeof after);
    struct stat sb;
    if (fstat(f->model_fd, &sb) != 0) return false;
    ls_loader_print_set(&after, 0, &sb);
    if (f->config_fd >= 0) {
        if (fstat(f->config_fd, &sb) != 0) return false;
        ls_loader_print_set(&after, 1, &sb);
    }
    if (memcmp(&after, &f->print, sizeof after)) return false;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < (f->config_fd >= 0 ? 2 : 1); i++) {
        const struct timespec c = after.f[i].stamp.ctime;
        const long long age_ms = ((long long)now.tv_sec - c.tv_sec) * 1000 + (now.tv_nsec - c.tv_nsec) / 1000000;
        if (age_ms < ld->memo_settle_ms) return false;
    }
    return true;
}

/* Reads rel and normalises it into out with *used: given merged over what
 * the file says (merge), or given as it is (a reload: given already holds
 * what the file said when it was loaded). A failure of the file itself is
 * remembered against its identity and these parameters. */
static ls_status ls_loader_from_path(const ls_loader *ld, const char *rel, const ls_adapter_params *given, bool merge,
                                     ls_adapter_params *used, ls_adapter *out, bool *absent, ls_error *err) {
    ls_adapter_params own = {0};
    ls_tensor_set set;
    ls_tensor_set_init(&set);
    ls_loader_files f;
    ls_status st = ls_loader_open_files(ld, rel, &f, &own, absent, err);
    if (st == LS_OK && !ls_loader_memo_find(ld->memo, rel, &f.print, given, merge, &st, err)) {
        uint8_t *bytes = NULL;
        st = ls_loader_read(ld, &f, &own, &set, &bytes, err);
        if (st == LS_OK) {
            *used = merge ? ls_adapter_params_merge(&own, given) : *given;
            st = ls_adapter_normalise(&set, used, &ld->dims, &ld->pool, out, err);
            ls_tensor_set_free(&set);
            free(bytes);
        }
        if (st != LS_OK && ls_loader_memorable(ld, &f, st))
            ls_loader_memo_put(ld->memo, rel, &f.print, given, merge, err);
    }
    ls_loader_files_close(&f);
    return st;
}

ls_status ls_loader_load(const ls_loader *ld, const ls_adapter_source *src, ls_adapter *out, ls_adapter_origin *origin,
                         ls_error *err) {
    memset(out, 0, sizeof *out);
    memset(origin, 0, sizeof *origin);
    if (!src->path) {
        /* A raw body's per-module rules travel in its __metadata__ (inline
         * JSON tensors have none): read here, beside its other keys. */
        ls_adapter_params own = src->own;
        ls_status st = ls_adapter_params_rules_from_meta(src->tensors, "the body's __metadata__", &own, err);
        if (st != LS_OK) return st;
        origin->params = ls_adapter_params_merge(&own, &src->given);
        return ls_adapter_normalise(src->tensors, &origin->params, &ld->dims, &ld->pool, out, err);
    }
    ls_status st = ls_loader_relative(ld, src->path, origin->path, sizeof origin->path, err);
    char snapshot[LS_LOADER_PATH_MAX];
    /* A tenant's "TENANT/NAME" is a path in its directory, never a repo
     * id to look up at the top of the adapter directory. */
    snapshot[0] = '\0';
    if (st == LS_OK && !src->tenant) st = ls_hub_snapshot(ld->dirfd, origin->path, snapshot, sizeof snapshot, err);
    /* The snapshot, not the repo id, is the source kept: a reload after
     * the cache's refs/main moved still reads what was loaded. */
    if (st == LS_OK && snapshot[0]) snprintf(origin->path, sizeof origin->path, "%s", snapshot);
    if (st == LS_OK)
        st = ls_loader_from_path(ld, origin->path, &src->given, true, &origin->params, out, &origin->absent, err);
    /* A tenant's path lies in its own directory, where no repo id is
     * looked up: the hint for a missing one says so. */
    if (st != LS_OK && src->tenant && origin->absent)
        snprintf(err->hint, sizeof err->hint, "a tenant key's paths are relative to its tenant's own directory of "
                                              "--adapter-dir (named as the tenant)");
    if (st != LS_OK) origin->path[0] = '\0';
    return st;
}

ls_status ls_loader_reload(void *ctx, const char *path, const ls_adapter_params *params, ls_adapter *out,
                           ls_error *err) {
    ls_adapter_params used;
    memset(out, 0, sizeof *out);
    return ls_loader_from_path(ctx, path, params, false, &used, out, NULL, err);
}
